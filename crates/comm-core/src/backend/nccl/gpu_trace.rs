//! `--trace` on NCCL: a slice per call on the rank's GPU track, timed by CUDA events, as
//! nccl-tests times its iterations. The host's slice of a call shows when it was enqueued and
//! waited for; this one shows when the GPU ran it.
//!
//! Events have no wall-clock time, only the time between two of them (`cuEventElapsedTime`).
//! So an anchor event is recorded on the idle stream and waited for, between two readings of the
//! host's clock: the GPU reached it between them, so its host time is their midpoint, within
//! half the gap (a few microseconds). A call's start is then the anchor's host time plus the
//! GPU's time from the anchor to the call's first event.
//!
//! Precision: `cuEventElapsedTime` resolves about 0.5 µs, and answers a float (f32) of
//! milliseconds, whose step grows with the value: 0.12 µs below 2 s, 0.5 µs below 8 s, 3.9 µs
//! after a minute. So the anchor is renewed once it is [`RENEW_ANCHOR_AFTER`] old, when the stream
//! is idle anyway (every traced call read): starts stay within about 0.5 µs of the anchor's
//! time; a slice's args say its precision (`precision_us`).
//!
//! Events are reused (a small pool): a traced call costs two records and no event's creation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaEvent, CudaStream};

use super::errors::cuda;
use crate::error::Result;
use crate::trace;

/// How old the anchor may grow before it is renewed (at the next idle moment): the f32 step of
/// a time under 2 s is 0.12 µs, under the timer's own 0.5 µs. A renewal costs the traced call
/// that meets it one wait for an event on the idle stream (microseconds), once a second.
pub(super) const RENEW_ANCHOR_AFTER: Duration = Duration::from_secs(1);

/// `cuEventElapsedTime`'s own resolution, µs (CUDA's documentation: "around 0.5 microseconds").
const TIMER_RESOLUTION_US: f64 = 0.5;

/// One call's two events, recorded before and after it on the stream.
pub(super) struct Pending {
    name: &'static str,
    start: CudaEvent,
    end: CudaEvent,
}

/// The anchor, and the calls whose events have not been read yet.
pub(super) struct GpuTrace {
    stream: Arc<CudaStream>,
    anchor: CudaEvent,
    /// The anchor's time on rank 0's clock ([`trace::now`]), in microseconds.
    anchor_us: f64,
    within_us: f64,
    /// When the anchor was taken, on this host.
    anchored_at: Instant,
    pending: Vec<Pending>,
    /// Events read and free to record again.
    free: Vec<CudaEvent>,
}

impl GpuTrace {
    /// Waits for the stream, then records and waits for the anchor between two host readings.
    pub(super) fn anchored(stream: Arc<CudaStream>) -> Result<GpuTrace> {
        let anchor = timing_event(&stream)?;
        let mut trace = GpuTrace {
            stream,
            anchor,
            anchor_us: 0.0,
            within_us: 0.0,
            anchored_at: Instant::now(),
            pending: Vec::new(),
            free: Vec::new(),
        };
        trace.anchor()?;
        Ok(trace)
    }

    /// (Re)takes the anchor: waits for the stream (idle when called after the calls were waited
    /// for: microseconds), records the anchor and waits for it between two host readings.
    fn anchor(&mut self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(cuda("waiting for the stream"))?;
        let before = trace::now();
        self.anchor
            .record(&self.stream)
            .map_err(cuda("recording the trace's anchor"))?;
        self.anchor
            .synchronize()
            .map_err(cuda("waiting for the trace's anchor"))?;
        let after = trace::now();
        self.anchor_us = (before + after) / 2.0;
        self.within_us = (after - before) / 2.0;
        self.anchored_at = Instant::now();
        Ok(())
    }

    /// An event recorded now on the stream, behind the work enqueued so far: a free one, or a
    /// new one while the pool is empty.
    pub(super) fn mark(&mut self) -> Result<CudaEvent> {
        let event = match self.free.pop() {
            Some(event) => event,
            None => timing_event(&self.stream)?,
        };
        event
            .record(&self.stream)
            .map_err(cuda("recording a trace event"))?;
        Ok(event)
    }

    /// Keeps `name`'s events until the GPU has passed them.
    pub(super) fn called(&mut self, name: &'static str, start: CudaEvent, end: CudaEvent) {
        self.pending.push(Pending { name, start, end });
    }

    /// Turns every call the GPU has finished into a slice; the others wait for a later look.
    /// Called after the calls were waited for: with every call read, the stream is idle, and an
    /// old anchor is renewed then.
    pub(super) fn read_finished(&mut self) -> Result<()> {
        if !self.pending.is_empty() {
            // As cudarc's elapsed_ms does before cuEventElapsedTime (a no-op on the rank's thread,
            // where the context is current already).
            self.stream
                .context()
                .bind_to_thread()
                .map_err(cuda("binding the context"))?;
        }
        let mut kept = Vec::new();
        for call in std::mem::take(&mut self.pending) {
            if !call
                .end
                .try_is_complete()
                .map_err(cuda("reading a trace event"))?
            {
                kept.push(call);
                continue;
            }
            let from_anchor = elapsed_ms(&self.anchor, &call.start)?;
            let dur = elapsed_ms(&call.start, &call.end)?;
            let args = trace::Args {
                anchor_within_us: Some(self.within_us),
                precision_us: Some(precision_us(from_anchor.max(dur))),
                ..trace::Args::default()
            };
            let start = self.anchor_us + f64::from(from_anchor) * 1e3;
            trace::gpu_slice(call.name.to_string(), start, f64::from(dur) * 1e3, args);
            self.free.extend([call.start, call.end]);
        }
        self.pending = kept;
        if self.pending.is_empty() && self.anchored_at.elapsed() >= RENEW_ANCHOR_AFTER {
            self.anchor()?;
        }
        Ok(())
    }
}

/// Milliseconds on the GPU from `from` to `to`, both complete (`end` is recorded after `start`
/// and the anchor, on the one stream, and was found complete): no wait, unlike cudarc's
/// `elapsed_ms`, which synchronizes on both first.
fn elapsed_ms(from: &CudaEvent, to: &CudaEvent) -> Result<f32> {
    // SAFETY: both events are live (borrowed), made with timing on (`timing_event`), in the
    // same context, and recorded and complete, which cuEventElapsedTime requires (else it
    // answers an error, not undefined behaviour).
    unsafe { result::event::elapsed(from.cu_event(), to.cu_event()) }
        .map_err(cuda("cuEventElapsedTime on trace events"))
}

/// How precise a time read from `cuEventElapsedTime` as `ms` is, in µs: the timer's own
/// resolution, or the f32's step at that value where it is coarser (3.9 µs at a minute).
pub(super) fn precision_us(ms: f32) -> f64 {
    let ms = ms.abs();
    let step_us = f64::from(ms.next_up() - ms) * 1e3;
    step_us.max(TIMER_RESOLUTION_US)
}

/// A CUDA event that keeps time (cudarc's default one does not).
fn timing_event(stream: &Arc<CudaStream>) -> Result<CudaEvent> {
    stream
        .context()
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(cuda("creating a trace event"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_read_as_float_milliseconds_is_as_precise_as_its_step_and_the_timer() {
        assert_eq!(precision_us(0.011), TIMER_RESOLUTION_US);
        assert_eq!(precision_us(1000.0), TIMER_RESOLUTION_US);
        // A minute from the anchor: steps of 2^-8 ms.
        assert_eq!(precision_us(60_000.0), 1e3 / 256.0);
        assert_eq!(precision_us(-60_000.0), 1e3 / 256.0);
    }

    #[test]
    fn an_anchor_renewed_in_time_keeps_every_start_within_the_timer_resolution() {
        // A call starting up to the renewal age after the anchor, plus a long call's wait.
        let oldest_ms = (RENEW_ANCHOR_AFTER + Duration::from_secs(3)).as_secs_f32() * 1e3;
        assert_eq!(precision_us(oldest_ms), TIMER_RESOLUTION_US);
    }
}
