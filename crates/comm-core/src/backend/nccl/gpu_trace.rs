//! `--trace` on NCCL: a slice per call on the rank's GPU track, timed by CUDA events, as
//! nccl-tests times its iterations. The host's slice of a call shows when it was enqueued and
//! waited for; this one shows when the GPU ran it.
//!
//! Events have no wall-clock time, only the time between two of them (`cuEventElapsedTime`).
//! So an anchor event is recorded on the idle stream and waited for once, between two readings
//! of the host's clock: the GPU reached it between them, so its host time is their midpoint,
//! within half the gap (a few microseconds). A call's start is then the anchor's host time plus
//! the GPU's time from the anchor to the call's first event (float milliseconds: still within a
//! microsecond after a minute of run).

use std::sync::Arc;

use cudarc::driver::{sys, CudaEvent, CudaStream};

use super::errors::cuda;
use crate::error::Result;
use crate::trace;

/// One call's two events, recorded before and after it on the stream.
struct Pending {
    name: String,
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
    pending: Vec<Pending>,
}

impl GpuTrace {
    /// Waits for the stream, then records and waits for the anchor between two host readings.
    pub(super) fn anchored(stream: Arc<CudaStream>) -> Result<GpuTrace> {
        stream
            .synchronize()
            .map_err(cuda("waiting for the stream"))?;
        let anchor = timing_event(&stream)?;
        let before = trace::now();
        anchor
            .record(&stream)
            .map_err(cuda("recording the trace's anchor"))?;
        anchor
            .synchronize()
            .map_err(cuda("waiting for the trace's anchor"))?;
        let after = trace::now();
        Ok(GpuTrace {
            stream,
            anchor,
            anchor_us: (before + after) / 2.0,
            within_us: (after - before) / 2.0,
            pending: Vec::new(),
        })
    }

    /// An event recorded now on the stream, behind the work enqueued so far.
    pub(super) fn mark(&self) -> Result<CudaEvent> {
        let event = timing_event(&self.stream)?;
        event
            .record(&self.stream)
            .map_err(cuda("recording a trace event"))?;
        Ok(event)
    }

    /// Keeps `name`'s events until the GPU has passed them.
    pub(super) fn called(&mut self, name: &str, start: CudaEvent, end: CudaEvent) {
        let name = name.to_string();
        self.pending.push(Pending { name, start, end });
    }

    /// Turns every call the GPU has finished into a slice; the others wait for a later look.
    pub(super) fn read_finished(&mut self) -> Result<()> {
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
            let ms = |from: &CudaEvent, to: &CudaEvent| {
                from.elapsed_ms(to)
                    .map(|ms| f64::from(ms) * 1e3)
                    .map_err(cuda("cuEventElapsedTime on trace events"))
            };
            let start = self.anchor_us + ms(&self.anchor, &call.start)?;
            let dur = ms(&call.start, &call.end)?;
            let args = trace::Args {
                anchor_within_us: Some(self.within_us),
                ..trace::Args::default()
            };
            trace::gpu_slice(call.name, start, dur, args);
        }
        self.pending = kept;
        Ok(())
    }
}

/// A CUDA event that keeps time (cudarc's default one does not).
fn timing_event(stream: &Arc<CudaStream>) -> Result<CudaEvent> {
    stream
        .context()
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(cuda("creating a trace event"))
}
