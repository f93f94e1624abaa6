//! The watchdog: how a rank waits for NCCL without ever hanging, and without sleeping.
//!
//! The rank's own thread enforces `--timeout` on the work it waits for: it looks at the call's
//! completion (spinning briefly, then yielding the core: a sleep would be in every timing) and,
//! past the deadline, aborts the communicator itself. It must be the rank's own thread: on a
//! blocking communicator `ncclCommAbort` frees the communicator at once, so calling it from
//! another thread while the rank is inside NCCL would free memory NCCL is still using. The
//! watchdog never aborts.
//!
//! What the rank cannot see is itself stuck inside a blocking NCCL call (connecting to a peer
//! that died, a group end, a finalize, an abort). For that there is one thread per
//! communicator: if the call shown to it is still in flight `grace` after its deadline, it
//! writes the rank's failure and ends the process, as PyTorch's heartbeat monitor does; nothing
//! else can free a thread that NCCL holds.
//!
//! Showing a call costs a few atomic stores and nothing else: the call's number, deadline and
//! name sit in atomics (a sequence lock), and the watchdog thread looks at them every
//! [`LOOK_EVERY`] on its own. No lock, no allocation and no wake-up per call (a mutex and two
//! condition-variable notifications cost about a microsecond a call: `benches/watchdog.rs`).

use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::deadline::Deadline;

use cudarc::nccl::{result, sys};

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

/// What the watchdog does when the rank is stuck `grace` past a call's deadline: ends the
/// process. It is given the call's name and how long the call was allowed before its deadline.
pub(super) type OnStuck = Box<dyn FnMut(&'static str, Duration) + Send>;

/// How often the watchdog thread looks at the call in flight: a stuck rank is ended at most this
/// late past `grace` (which is seconds), and an idle communicator's thread wakes 10 times a
/// second, for a few atomic loads.
pub(super) const LOOK_EVERY: Duration = Duration::from_millis(100);

/// A deadline that never comes: no call is shown.
const NEVER: u64 = u64::MAX;

/// The call shown to the watchdog, as a sequence lock: the rank's thread (the only writer) makes
/// `seq` odd, writes the fields, makes it even again; a look that saw the same even `seq` before
/// and after reading the fields read one call's fields, never two calls' halves.
struct Shown {
    seq: AtomicU64,
    /// Nanoseconds from `base` to the call's deadline; [`NEVER`] when no call is shown.
    deadline_ns: AtomicU64,
    /// How long the call was allowed, in nanoseconds (for the failure's words).
    allowed_ns: AtomicU64,
    /// The call's name, a `&'static str` taken apart.
    name_ptr: AtomicPtr<u8>,
    name_len: AtomicUsize,
    stopping: AtomicBool,
    base: Instant,
}

/// One consistent read of [`Shown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Call {
    deadline_ns: u64,
    allowed: Duration,
    name: &'static str,
}

impl Shown {
    fn new() -> Shown {
        Shown {
            seq: AtomicU64::new(0),
            deadline_ns: AtomicU64::new(NEVER),
            allowed_ns: AtomicU64::new(0),
            name_ptr: AtomicPtr::new(std::ptr::null_mut()),
            name_len: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            base: Instant::now(),
        }
    }

    /// Nanoseconds from `base` to `at` (0 before it, saturating far ahead).
    fn ns(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(NEVER - 1)
    }

    /// Nanoseconds from `base` to `deadline`; one that never comes is as far as can be shown.
    fn deadline_ns(&self, deadline: Deadline) -> u64 {
        deadline.at().map_or(NEVER - 1, |at| self.ns(at))
    }

    /// Shows `name` until `deadline` (on the rank's thread only); returns the call's number.
    fn show(&self, name: &'static str, allowed: Duration, deadline: Deadline) -> u64 {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        self.deadline_ns
            .store(self.deadline_ns(deadline), Ordering::Relaxed);
        let allowed = u64::try_from(allowed.as_nanos()).unwrap_or(u64::MAX);
        self.allowed_ns.store(allowed, Ordering::Relaxed);
        self.name_ptr
            .store(name.as_ptr().cast_mut(), Ordering::Relaxed);
        self.name_len.store(name.len(), Ordering::Relaxed);
        self.seq.store(seq + 2, Ordering::Release);
        seq + 2
    }

    /// Stops showing call `number`, unless a later call replaced it (on the rank's thread only).
    /// One store: a look sees the deadline or [`NEVER`], either way one call's.
    fn hide(&self, number: u64) {
        if self.seq.load(Ordering::Relaxed) == number {
            self.deadline_ns.store(NEVER, Ordering::Release);
        }
    }

    /// The call shown now, if any, read consistently (retried while the rank writes).
    fn look(&self) -> Option<Call> {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                // The rank is writing (or was descheduled mid-write): let it finish.
                std::thread::yield_now();
                continue;
            }
            let deadline_ns = self.deadline_ns.load(Ordering::Relaxed);
            let allowed_ns = self.allowed_ns.load(Ordering::Relaxed);
            let ptr = self.name_ptr.load(Ordering::Relaxed);
            let len = self.name_len.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) != before {
                continue;
            }
            if deadline_ns == NEVER || ptr.is_null() {
                return None;
            }
            // SAFETY: `seq` was the same even number before and after the loads, so `ptr` and
            // `len` were written together by one `show`, from one `&'static str`: valid UTF-8
            // that lives for the whole program.
            let name = unsafe {
                std::str::from_utf8_unchecked(std::slice::from_raw_parts(ptr.cast_const(), len))
            };
            return Some(Call {
                deadline_ns,
                allowed: Duration::from_nanos(allowed_ns),
                name,
            });
        }
    }
}

/// One communicator's watchdog thread.
pub(super) struct Watchdog {
    shown: Arc<Shown>,
    timeout: Duration,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the thread: every call shown to it ([`Watchdog::arm`]) may take `timeout`; if it
    /// is still in flight `grace` after that, `on_stuck` runs.
    pub(super) fn start(
        timeout: Duration,
        grace: Duration,
        mut on_stuck: OnStuck,
    ) -> std::io::Result<Watchdog> {
        let shown = Arc::new(Shown::new());
        let watching = shown.clone();
        let thread = std::thread::Builder::new()
            .name("nccl-watchdog".into())
            .spawn(move || watch(&watching, grace, &mut on_stuck))?;
        Ok(Watchdog {
            shown,
            timeout,
            thread: Some(thread),
        })
    }

    /// Shows the watchdog the call `what`, from now until the returned guard drops (or a later
    /// call is shown); the guard says when the call's time is up.
    pub(super) fn arm(&self, what: &'static str) -> Arming<'_> {
        self.arm_for(what, self.timeout)
    }

    /// [`arm`](Self::arm) for a call allowed `allowed` instead of the timeout. It replaces the
    /// call shown before: that one is no longer watched, even while its guard lives.
    pub(super) fn arm_for(&self, what: &'static str, allowed: Duration) -> Arming<'_> {
        let deadline = Deadline::after(allowed);
        let number = self.shown.show(what, allowed, deadline);
        Arming {
            dog: self,
            number,
            deadline,
        }
    }

    /// How long a call may take.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shown.stopping.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// A call shown to the watchdog; dropping it says the call is over.
pub(super) struct Arming<'a> {
    dog: &'a Watchdog,
    number: u64,
    deadline: Deadline,
}

impl Arming<'_> {
    /// Whether the call has outlived its timeout: the rank must abort it now.
    pub(super) fn expired(&self) -> bool {
        self.deadline.passed()
    }
}

impl Drop for Arming<'_> {
    fn drop(&mut self) {
        self.dog.shown.hide(self.number);
    }
}

/// Whether a call due at `deadline_ns` is stuck at `now_ns`: `grace` past its deadline.
fn stuck_at(deadline_ns: u64, grace: Duration, now_ns: u64) -> bool {
    let grace = u64::try_from(grace.as_nanos()).unwrap_or(u64::MAX);
    now_ns >= deadline_ns.saturating_add(grace)
}

/// The watchdog thread: every [`LOOK_EVERY`], a look at the call shown; if it is `grace` past
/// its deadline, the rank is stuck inside NCCL: `on_stuck`.
fn watch(shown: &Shown, grace: Duration, on_stuck: &mut OnStuck) {
    // ANCHOR: watchdog
    while !shown.stopping.load(Ordering::Acquire) {
        if let Some(call) = shown.look() {
            if stuck_at(call.deadline_ns, grace, shown.ns(Instant::now())) {
                on_stuck(call.name, call.allowed);
                return;
            }
        }
        // Woken early only by the watchdog's drop.
        std::thread::park_timeout(LOOK_EVERY);
    }
    // ANCHOR_END: watchdog
}

/// What `benches/watchdog.rs` measures, without a GPU: `calls` NCCL calls' worth of arming and
/// disarming a running watchdog, as [`super::NcclBackend`] does around every call; the time taken.
pub fn cost_of_watching(calls: u64) -> Duration {
    let dog = Watchdog::start(
        Duration::from_secs(3600),
        Duration::from_secs(3600),
        Box::new(|_, _| {}),
    )
    .expect("starting a watchdog thread");
    let started = Instant::now();
    for _ in 0..calls {
        let call = dog.arm("ncclAllReduce");
        std::hint::black_box(call.expired());
    }
    started.elapsed()
}

/// How the rank's thread waits between two looks at a call: never a sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pause {
    /// A busy-wait hint to the CPU (`std::hint::spin_loop`): nanoseconds.
    Spin,
    /// Gives the core to another thread if one is ready (`std::thread::yield_now`): the CPU
    /// stays usable, and the look comes back within microseconds when nobody else runs.
    Yield,
}

/// Spin while the wait is younger than this, then yield: a small collective takes microseconds.
pub(super) const SPIN_FOR: Duration = Duration::from_micros(5);

/// The pause after a busy look `waited` into the wait.
pub(super) fn pause(waited: Duration) -> Pause {
    if waited < SPIN_FOR {
        Pause::Spin
    } else {
        Pause::Yield
    }
}

/// Takes the pause.
pub(super) fn take(pause: Pause) {
    match pause {
        Pause::Spin => std::hint::spin_loop(),
        Pause::Yield => std::thread::yield_now(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A watchdog whose stuck action reports on a channel instead of ending the process.
    fn dog(timeout_ms: u64, grace_ms: u64) -> (Watchdog, mpsc::Receiver<(String, Duration)>) {
        let (stuck, stucks) = mpsc::channel();
        let dog = Watchdog::start(
            Duration::from_millis(timeout_ms),
            Duration::from_millis(grace_ms),
            Box::new(move |what, allowed| stuck.send((what.to_string(), allowed)).unwrap()),
        )
        .unwrap();
        (dog, stucks)
    }

    /// Long enough for the watchdog to have looked a few times past any deadline of these tests.
    fn several_looks() -> Duration {
        LOOK_EVERY * 4
    }

    // The graces below are long against the tests' own steps, so that a test thread descheduled
    // for a while on a loaded machine is not taken for a stuck rank.

    #[test]
    fn calls_that_end_in_time_are_never_reported() {
        let (dog, stucks) = dog(10, 500);
        for _ in 0..1000 {
            let call = dog.arm("ncclAllReduce");
            assert!(!call.expired());
        }
        std::thread::sleep(Duration::from_millis(510) + several_looks());
        assert!(stucks.try_recv().is_err());
    }

    #[test]
    fn a_call_past_its_deadline_is_the_ranks_to_abort_and_then_nothing_happens() {
        let (dog, stucks) = dog(50, 500);
        let started = Instant::now();
        {
            // The rank's own loop: look, and notice the deadline itself (then it aborts and
            // returns, dropping the guard).
            let call = dog.arm("ncclAllReduce");
            while !call.expired() {
                take(pause(started.elapsed()));
            }
        }
        assert!(started.elapsed() >= Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(550) + several_looks());
        assert!(stucks.try_recv().is_err(), "the rank came out in time");
    }

    #[test]
    fn a_rank_stuck_inside_a_call_past_the_grace_is_ended_naming_the_call() {
        let (dog, stucks) = dog(20, 50);
        let started = Instant::now();
        let _stuck_call = dog.arm("ncclAllGather");
        let (what, allowed) = stucks.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(
            (what.as_str(), allowed),
            ("ncclAllGather", Duration::from_millis(20))
        );
        // Not before the deadline and the grace (a lower bound, not a speed).
        assert!(
            started.elapsed() >= Duration::from_millis(70),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_call_handed_to_the_abort_is_no_longer_watched_and_the_abort_is() {
        // The rank's wait passed its deadline and aborts, the call's guard still alive: the
        // abort's own showing replaces the call, so the watchdog does not end the process
        // while the abort runs, nor name the call; a stuck abort is named as the abort.
        let (dog, stucks) = dog(20, 500);
        let call = dog.arm("ncclAllReduce");
        while !call.expired() {
            std::hint::spin_loop();
        }
        {
            let _abort = dog.arm_for("ncclCommAbort", Duration::from_secs(3600));
            std::thread::sleep(Duration::from_millis(520) + several_looks());
            assert!(
                stucks.try_recv().is_err(),
                "the timed-out call is the rank's now"
            );
        }
        drop(call);
        let _stuck_abort = dog.arm_for("ncclCommAbort", Duration::from_millis(10));
        let (what, allowed) = stucks.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(
            (what.as_str(), allowed),
            ("ncclCommAbort", Duration::from_millis(10))
        );
    }

    #[test]
    fn an_earlier_guard_dropped_late_does_not_hide_the_call_shown_after_it() {
        let (dog, stucks) = dog(10, 10);
        let first = dog.arm_for("ncclAllReduce", Duration::from_secs(3600));
        let _second = dog.arm("ncclCommFinalize");
        drop(first);
        let (what, _) = stucks.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(what, "ncclCommFinalize");
    }

    #[test]
    fn a_look_reads_one_calls_name_and_deadline_never_halves_of_two() {
        let shown = Arc::new(Shown::new());
        let (a, b) = ("ncclAllReduce", "a much longer name of another call");
        let (a_at, b_at) = (
            Deadline::after(Duration::ZERO),
            Deadline::after(Duration::from_secs(7)),
        );
        let writer = {
            let shown = shown.clone();
            std::thread::spawn(move || {
                for i in 0..200_000 {
                    match i % 2 {
                        0 => shown.show(a, Duration::from_secs(1), a_at),
                        _ => shown.show(b, Duration::from_secs(2), b_at),
                    };
                }
            })
        };
        let (mut looks, a_ns, b_ns) = (0, shown.deadline_ns(a_at), shown.deadline_ns(b_at));
        while !writer.is_finished() || looks == 0 {
            if let Some(call) = shown.look() {
                let whole_a = (a, a_ns, Duration::from_secs(1));
                let whole_b = (b, b_ns, Duration::from_secs(2));
                let seen = (call.name, call.deadline_ns, call.allowed);
                assert!(seen == whole_a || seen == whole_b, "{seen:?}");
                looks += 1;
            }
        }
        writer.join().unwrap();
    }

    #[test]
    fn stuck_means_the_grace_past_the_deadline_and_never_for_no_call() {
        let grace = Duration::from_nanos(100);
        assert!(!stuck_at(1_000, grace, 1_099));
        assert!(stuck_at(1_000, grace, 1_100));
        assert!(!stuck_at(NEVER, grace, NEVER - 1));
        let shown = Shown::new();
        assert_eq!(shown.look(), None);
        let number = shown.show("x", Duration::ZERO, Deadline::after(Duration::ZERO));
        assert!(shown.look().is_some());
        shown.hide(number);
        assert_eq!(shown.look(), None);
    }

    #[test]
    fn the_waiting_thread_spins_briefly_then_yields_and_never_sleeps() {
        assert_eq!(pause(Duration::ZERO), Pause::Spin);
        assert_eq!(pause(Duration::from_micros(4)), Pause::Spin);
        assert_eq!(pause(Duration::from_micros(5)), Pause::Yield);
        assert_eq!(pause(Duration::from_secs(3600)), Pause::Yield);
    }

    #[test]
    fn a_timeout_too_far_to_represent_waits_for_good() {
        let (dog, stucks) = dog(u64::MAX, 0);
        let call = dog.arm("x");
        std::thread::sleep(several_looks());
        assert!(!call.expired() && stucks.try_recv().is_err());
    }
}
