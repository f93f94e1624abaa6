//! The watchdog: how a rank waits for NCCL without ever hanging. It looks at the call in flight
//! until it is done, fails, or outlives the timeout, and aborts the communicator on the way out.

use std::time::{Duration, Instant};

use cudarc::nccl::{result, sys};

use crate::error::{CommError, Result};

/// What one look at an NCCL call in flight finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Look {
    Busy,
    Done,
}

/// The communicator's progress as NCCL reports it: busy (`ncclInProgress`), done, or an error.
pub(super) fn async_state(comm: sys::ncclComm_t) -> std::result::Result<Look, result::NcclError> {
    let mut state = sys::ncclResult_t::ncclSuccess;
    // SAFETY: comm is a live communicator; state is a valid out-pointer.
    unsafe { sys::ncclCommGetAsyncError(comm, &mut state) }.result()?;
    match state.result()? {
        result::NcclStatus::InProgress => Ok(Look::Busy),
        _ => Ok(Look::Done),
    }
}

/// The watchdog, as in PyTorch: looks at a call until it is done, fails, or outlives `timeout`.
/// On failure or timeout `abort` runs first, so no rank is left inside NCCL, then the error
/// says what was waited for. Paced by [`Pacing::NCCL`] on the real clock.
pub(super) fn watch(
    what: &str,
    detail: &str,
    timeout: Duration,
    look: &mut dyn FnMut() -> Result<Look>,
    abort: impl FnOnce(),
) -> Result<()> {
    watch_on(
        &mut RealClock(Instant::now()),
        Pacing::NCCL,
        what,
        detail,
        timeout,
        look,
        abort,
    )
}

/// [`watch`] on any clock and pacing: the tests' fake clock counts how it paused.
pub(super) fn watch_on(
    clock: &mut impl Clock,
    pacing: Pacing,
    what: &str,
    detail: &str,
    timeout: Duration,
    look: &mut dyn FnMut() -> Result<Look>,
    abort: impl FnOnce(),
) -> Result<()> {
    // ANCHOR: watchdog
    let mut sleep = pacing.first_sleep;
    loop {
        match look() {
            Ok(Look::Done) => return Ok(()),
            Ok(Look::Busy) => {}
            Err(e) => {
                abort();
                return Err(e);
            }
        }
        let waited = clock.elapsed();
        if waited > timeout {
            abort();
            return Err(CommError::Timeout {
                what: what.into(),
                timeout,
                detail: detail.into(),
                missing: Vec::new(),
            });
        }
        // Look again at once while the call is likely to end soon (a small collective takes
        // microseconds; a thread sleep costs ~50 µs), and sleep only once it has run long.
        let pause = pacing.pause(waited, &mut sleep);
        clock.pause(pause);
    }
    // ANCHOR_END: watchdog
}

/// How the watchdog waits between two looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pause {
    /// A busy-wait hint to the CPU (`std::hint::spin_loop`): nanoseconds.
    Spin,
    /// Gives the core to another thread if one is ready (`std::thread::yield_now`): the CPU
    /// stays usable, and the look comes back within microseconds when nobody else runs.
    Yield,
    /// A real sleep: the core is free, the look comes back late (a sleep costs ~50 µs or more).
    Sleep(Duration),
}

/// When the watchdog spins, yields or sleeps, by how long it has waited so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pacing {
    /// Spin until the wait is this old.
    pub spin_for: Duration,
    /// Then yield until it is this old.
    pub yield_until: Duration,
    /// Then sleep this long, doubling each time...
    pub first_sleep: Duration,
    /// ...up to this.
    pub longest_sleep: Duration,
}

impl Pacing {
    /// The backend's: spin 5 µs, yield to 2 ms, then sleep 50 µs doubling to 1 ms.
    pub const NCCL: Pacing = Pacing {
        spin_for: Duration::from_micros(5),
        yield_until: Duration::from_millis(2),
        first_sleep: Duration::from_micros(50),
        longest_sleep: Duration::from_millis(1),
    };

    /// The pause after a busy look `waited` into the wait; `sleep` is the next sleep's length.
    pub fn pause(&self, waited: Duration, sleep: &mut Duration) -> Pause {
        if waited < self.spin_for {
            Pause::Spin
        } else if waited < self.yield_until {
            Pause::Yield
        } else {
            let this = *sleep;
            *sleep = (this * 2).min(self.longest_sleep);
            Pause::Sleep(this)
        }
    }
}

/// Where the watchdog reads the time and takes its pauses.
pub(super) trait Clock {
    /// Time since the wait began.
    fn elapsed(&self) -> Duration;
    /// Waits as told.
    fn pause(&mut self, pause: Pause);
}

/// The real clock, from the wait's start.
struct RealClock(Instant);

impl Clock for RealClock {
    fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
    fn pause(&mut self, pause: Pause) {
        match pause {
            Pause::Spin => std::hint::spin_loop(),
            Pause::Yield => std::thread::yield_now(),
            Pause::Sleep(d) => std::thread::sleep(d),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_waits_for_done() {
        let mut looks = [Look::Busy, Look::Busy, Look::Done].into_iter();
        let mut aborted = false;
        watch(
            "x",
            "",
            Duration::from_secs(5),
            &mut || Ok(looks.next().unwrap()),
            || aborted = true,
        )
        .unwrap();
        assert!(!aborted);
        assert_eq!(looks.next(), None, "it looked until done and no more");
    }

    #[test]
    fn the_watchdog_aborts_on_an_error_and_at_the_timeout() {
        let mut aborts = 0;
        let err = watch(
            "x",
            "",
            Duration::from_secs(5),
            &mut || Err(CommError::Backend("ncclRemoteError".into())),
            || aborts += 1,
        )
        .unwrap_err();
        assert_eq!(
            (aborts, err.to_string().contains("ncclRemoteError")),
            (1, true)
        );

        let err = watch(
            "NCCL ncclAllReduce on rank 1 to complete",
            " (a peer died or is stuck?)",
            Duration::from_millis(50),
            &mut || Ok(Look::Busy),
            || aborts += 1,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(aborts, 2);
        assert!(
            err.contains("NCCL ncclAllReduce on rank 1 to complete") && err.contains("peer died"),
            "{err}"
        );
    }

    /// A clock that moves only when the watchdog pauses: a spin takes 100 ns, a yield 1 µs,
    /// a sleep its length. It counts each kind and notes when the first sleep came.
    #[derive(Default)]
    struct FakeClock {
        now: Duration,
        spins: usize,
        yields: usize,
        sleeps: Vec<Duration>,
        first_sleep_at: Option<Duration>,
    }

    impl Clock for FakeClock {
        fn elapsed(&self) -> Duration {
            self.now
        }
        fn pause(&mut self, pause: Pause) {
            match pause {
                Pause::Spin => {
                    self.spins += 1;
                    self.now += Duration::from_nanos(100);
                }
                Pause::Yield => {
                    self.yields += 1;
                    self.now += Duration::from_micros(1);
                }
                Pause::Sleep(d) => {
                    self.first_sleep_at.get_or_insert(self.now);
                    self.sleeps.push(d);
                    self.now += d;
                }
            }
        }
    }

    /// Busy for `busy` looks, then done.
    fn busy_then_done(busy: usize) -> impl FnMut() -> Result<Look> {
        let mut looks = 0;
        move || {
            looks += 1;
            Ok(if looks > busy { Look::Done } else { Look::Busy })
        }
    }

    #[test]
    fn a_short_wait_spins_then_yields_and_never_sleeps() {
        // 1,900 busy looks: about 1.9 ms on the fake clock, all of it inside the yield window.
        let mut clock = FakeClock::default();
        let mut aborts = 0;
        let mut look = busy_then_done(1900);
        let timeout = Duration::from_secs(5);
        watch_on(
            &mut clock,
            Pacing::NCCL,
            "x",
            "",
            timeout,
            &mut look,
            || aborts += 1,
        )
        .unwrap();
        assert_eq!(aborts, 0);
        assert!(clock.sleeps.is_empty(), "slept {:?}", clock.sleeps);
        assert_eq!(clock.spins, 50, "5 µs of 100 ns spins");
        assert_eq!(clock.spins + clock.yields, 1900);
        assert!(clock.now < Pacing::NCCL.yield_until);
    }

    #[test]
    fn a_long_wait_sleeps_after_2_ms_doubling_to_1_ms() {
        let mut clock = FakeClock::default();
        let mut look = busy_then_done(5000);
        let timeout = Duration::from_secs(5);
        watch_on(&mut clock, Pacing::NCCL, "x", "", timeout, &mut look, || {}).unwrap();
        let first = clock.first_sleep_at.expect("it slept");
        assert!(
            first >= Pacing::NCCL.yield_until,
            "first sleep at {first:?}"
        );
        let us = |n| Duration::from_micros(n);
        assert_eq!(
            clock.sleeps[..6],
            [us(50), us(100), us(200), us(400), us(800), us(1000)]
        );
        assert!(clock.sleeps[6..].iter().all(|&d| d == us(1000)));
    }

    #[test]
    fn a_wait_that_never_ends_times_out_and_aborts_once() {
        let mut clock = FakeClock::default();
        let mut aborts = 0;
        let err = watch_on(
            &mut clock,
            Pacing::NCCL,
            "NCCL ncclAllGather on rank 3 to complete",
            " (a peer died or is stuck?)",
            Duration::from_millis(20),
            &mut || Ok(Look::Busy),
            || aborts += 1,
        )
        .unwrap_err();
        assert_eq!(aborts, 1);
        assert!(matches!(err, CommError::Timeout { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("ncclAllGather on rank 3") && text.contains("peer died"),
            "{text}"
        );
        // 20 ms of waiting took about 18 sleeps, not thousands of looks.
        assert!(clock.sleeps.len() < 25, "{} sleeps", clock.sleeps.len());
        assert!(clock.now > Duration::from_millis(20));
    }

    #[test]
    fn an_error_aborts_at_once_without_pausing() {
        let mut clock = FakeClock::default();
        let mut aborts = 0;
        let mut look = {
            let mut busy = busy_then_done(3);
            move || match busy()? {
                Look::Busy => Ok(Look::Busy),
                Look::Done => Err(CommError::Backend("ncclRemoteError".into())),
            }
        };
        let err = watch_on(
            &mut clock,
            Pacing::NCCL,
            "x",
            "",
            Duration::from_secs(5),
            &mut look,
            || aborts += 1,
        )
        .unwrap_err();
        assert_eq!((aborts, clock.spins, clock.yields), (1, 3, 0));
        assert!(err.to_string().contains("ncclRemoteError"), "{err}");
    }
}
