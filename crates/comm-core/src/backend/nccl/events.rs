//! Timing events: marks on the rank's stream, read with `cuEventElapsedTime`, as nccl-tests
//! times each iteration with `-I 1` (its `recordEvents` and `getElapsedTimes`). A mark is a CUDA
//! event recorded on the stream: its time is when the GPU reaches it, after the work enqueued
//! before it, so the time between two marks is the GPU's, whatever the host did meanwhile
//! (waiting, a barrier, the watchdog's look).
//!
//! The events are made with timing on (`CU_EVENT_DEFAULT`; cudarc's own default disables it) and
//! kept: [`Events::reserve`] makes what a timed loop needs before it starts, and
//! [`Events::reset`] lets the next loop record them again, so no event is made or destroyed
//! inside a timed region or per call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaEvent, CudaStream};

use super::errors::cuda;
use crate::error::{CommError, Result};

/// How long a mark recorded after its work was waited for may take to complete: the GPU has
/// nothing before it, so microseconds; past this something is wrong with the device.
const SETTLE: Duration = Duration::from_secs(10);

/// Reusable timing events on one rank's stream.
pub struct Events {
    stream: Arc<CudaStream>,
    events: Vec<CudaEvent>,
    /// Events recorded since the last reset: the marks, in order.
    used: usize,
}

impl Events {
    /// No events yet, on `stream` (the rank's one stream, where its NCCL calls go).
    pub(crate) fn on(stream: Arc<CudaStream>) -> Events {
        Events {
            stream,
            events: Vec::new(),
            used: 0,
        }
    }

    /// Makes events until `marks` of them exist (none is made again for a later loop).
    pub fn reserve(&mut self, marks: usize) -> Result<()> {
        while self.events.len() < marks {
            let event = self
                .stream
                .context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(cuda("creating a timing event"))?;
            self.events.push(event);
        }
        Ok(())
    }

    /// Forgets the marks; the events are recorded again from the first.
    pub fn reset(&mut self) {
        self.used = 0;
    }

    /// Marks made since the last reset.
    pub fn len(&self) -> usize {
        self.used
    }

    /// Whether no mark was made since the last reset.
    pub fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// Records the next event on the stream, behind the work enqueued so far (an NCCL call has
    /// been enqueued when it returns, inside a batch or group too once the group ended).
    pub fn mark(&mut self) -> Result<()> {
        self.reserve(self.used + 1)?;
        self.events[self.used]
            .record(&self.stream)
            .map_err(cuda("recording a timing event"))?;
        self.used += 1;
        Ok(())
    }

    /// Seconds from mark `from` to mark `to` on the GPU's clock (`cuEventElapsedTime`: about
    /// half a microsecond of resolution, in f32 milliseconds, whose steps pass 0.5 µs beyond 8 s
    /// and reach 4 µs at a minute: fine for a loop, whose time is divided by its iterations). Read after the work before `to` was waited for (under
    /// the watchdog): the marks then complete within microseconds, and are polled until they do,
    /// never slept on and never waited for without a bound.
    pub fn seconds(&self, from: usize, to: usize) -> Result<f64> {
        if from >= self.used || to >= self.used {
            return Err(CommError::Usage(format!(
                "timing marks {from} and {to}: only {} were made",
                self.used
            )));
        }
        let (start, end) = (&self.events[from], &self.events[to]);
        let began = Instant::now();
        for event in [start, end] {
            while !event
                .try_is_complete()
                .map_err(cuda("reading a timing event"))?
            {
                if began.elapsed() > SETTLE {
                    return Err(CommError::Backend(format!(
                        "a timing event did not complete within {} s after the work before it was \
                         waited for",
                        SETTLE.as_secs()
                    )));
                }
                std::hint::spin_loop();
                std::thread::yield_now();
            }
        }
        // Both complete: cudarc's synchronize inside returns at once.
        let ms = start
            .elapsed_ms(end)
            .map_err(cuda("cuEventElapsedTime on two timing events"))?;
        Ok(f64::from(ms) / 1e3)
    }
}
