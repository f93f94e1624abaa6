//! A rank's own clock of its work: marks between which iterations are timed, CUDA events on
//! the rank's stream on NCCL, the host clock on the CPU backend. Its own room, so that the
//! communicator can hand one out ([`crate::comm::Communicator::stopwatch`]) and the timed loops
//! (`timing.rs`) read it, without the two importing each other.

use std::time::Instant;

use crate::error::Result;

/// Where per-iteration times come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// The host's steady clock (`Instant`).
    Host,
    /// CUDA events on the rank's stream (`cuEventElapsedTime`).
    CudaEvents,
}

impl Clock {
    /// "host clock" or "CUDA events", as rows and headers say it.
    pub fn name(self) -> &'static str {
        match self {
            Clock::Host => "host clock",
            Clock::CudaEvents => "CUDA events",
        }
    }
}

/// Marks on a rank's own clock of its work, to time iterations between them: CUDA events
/// recorded on the rank's stream on NCCL (the GPU's clock, behind the work enqueued before each
/// mark), the host clock on the CPU backend (whose calls are done when they return). Made by
/// [`Communicator::stopwatch`]; its events are made ahead ([`reserve`](Self::reserve)) and reused
/// from one loop to the next ([`reset`](Self::reset)), never made inside a timed region.
pub struct Stopwatch {
    marks: Marks,
}

enum Marks {
    Host(Vec<Instant>),
    Events(crate::backend::nccl::Events),
}

impl Stopwatch {
    /// Marks on the host clock.
    pub fn host() -> Stopwatch {
        Stopwatch {
            marks: Marks::Host(Vec::new()),
        }
    }

    /// Marks as CUDA events on an NCCL rank's stream.
    pub(crate) fn events(events: crate::backend::nccl::Events) -> Stopwatch {
        Stopwatch {
            marks: Marks::Events(events),
        }
    }

    /// Which clock the marks read.
    pub fn clock(&self) -> Clock {
        match self.marks {
            Marks::Host(_) => Clock::Host,
            Marks::Events(_) => Clock::CudaEvents,
        }
    }

    /// Makes room for `marks` marks (the events, on NCCL), so that marking costs no allocation.
    pub fn reserve(&mut self, marks: usize) -> Result<()> {
        match &mut self.marks {
            Marks::Host(m) => {
                m.reserve(marks.saturating_sub(m.len()));
                Ok(())
            }
            Marks::Events(e) => e.reserve(marks),
        }
    }

    /// Forgets the marks made (keeping the events for the next ones).
    pub fn reset(&mut self) {
        match &mut self.marks {
            Marks::Host(m) => m.clear(),
            Marks::Events(e) => e.reset(),
        }
    }

    /// Marks made since the last reset.
    pub fn len(&self) -> usize {
        match &self.marks {
            Marks::Host(m) => m.len(),
            Marks::Events(e) => e.len(),
        }
    }

    /// Whether no mark was made since the last reset.
    pub fn is_empty(&self) -> bool {
        match &self.marks {
            Marks::Host(m) => m.is_empty(),
            Marks::Events(e) => e.is_empty(),
        }
    }

    /// The next mark: now on the host, or an event behind the work enqueued on the stream.
    pub fn mark(&mut self) -> Result<()> {
        match &mut self.marks {
            Marks::Host(m) => {
                m.push(Instant::now());
                Ok(())
            }
            Marks::Events(e) => e.mark(),
        }
    }

    /// Seconds from mark `from` to mark `to`. On NCCL, read it after the work before `to` was
    /// waited for; the events are then polled (never slept on) until they complete, which takes
    /// microseconds.
    pub fn seconds(&self, from: usize, to: usize) -> Result<f64> {
        match &self.marks {
            Marks::Host(m) => match (m.get(from), m.get(to)) {
                (Some(a), Some(b)) => Ok(b.saturating_duration_since(*a).as_secs_f64()),
                _ => Err(crate::error::CommError::Usage(format!(
                    "timing marks {from} and {to}: only {} were made",
                    m.len()
                ))),
            },
            Marks::Events(e) => e.seconds(from, to),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_host_stopwatch_reads_the_time_between_marks() {
        let mut s = Stopwatch::host();
        assert_eq!(s.clock(), Clock::Host);
        s.reserve(3).unwrap();
        s.mark().unwrap();
        std::thread::sleep(Duration::from_millis(2));
        s.mark().unwrap();
        assert_eq!(s.len(), 2);
        let t = s.seconds(0, 1).unwrap();
        assert!(t >= 0.002, "{t}");
        assert_eq!(s.seconds(1, 0).unwrap(), 0.0, "never negative");
        assert!(s.seconds(0, 2).is_err(), "no third mark");
        s.reset();
        assert!(s.is_empty());
    }
}
