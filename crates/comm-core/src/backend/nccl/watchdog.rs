//! The watchdog, as in PyTorch's ProcessGroupNCCL: one thread per communicator that watches the
//! call in flight and, when it outlives the timeout (a peer died or is stuck), aborts the
//! communicator from the side, so that the waiting rank gets an error instead of hanging.
//!
//! The rank's own thread never sleeps while it waits for a call (sleeps would be in the timings):
//! it looks at the call's completion, spinning briefly, then yielding the core, and at the
//! watchdog's verdict. The watchdog thread sleeps until the deadline of the call it was shown,
//! costs nothing while calls finish in time, and is the same thread for every call: no thread is
//! started per call.
//!
//! If the rank is still stuck inside NCCL `grace` after the abort, the watchdog ends the process
//! saying why, as PyTorch's heartbeat monitor does: nothing else can free a thread that NCCL holds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

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

/// What the watchdog does when a call outlives its deadline, from its own thread.
pub(super) type OnExpiry = Box<dyn FnMut() + Send>;
/// What it does when the rank is still stuck `grace` after that: ends the process.
pub(super) type OnStuck = Box<dyn FnMut(&str) + Send>;

/// The call in flight.
#[derive(Debug, Clone)]
struct Armed {
    id: u64,
    what: String,
    deadline: Instant,
}

struct State {
    armed: Option<Armed>,
    next_id: u64,
    stopping: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Set by the watchdog when a call outlived its deadline: the communicator is aborted.
    fired: AtomicBool,
}

/// One communicator's watchdog thread.
pub(super) struct Watchdog {
    shared: Arc<Shared>,
    timeout: Duration,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the thread: every call shown to it ([`Watchdog::arm`]) may take `timeout`; past it
    /// `on_expiry` runs (aborting the communicator), and if the call is still in flight `grace`
    /// later, `on_stuck`.
    pub(super) fn start(
        timeout: Duration,
        grace: Duration,
        mut on_expiry: OnExpiry,
        mut on_stuck: OnStuck,
    ) -> std::io::Result<Watchdog> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                armed: None,
                next_id: 0,
                stopping: false,
            }),
            changed: Condvar::new(),
            fired: AtomicBool::new(false),
        });
        let watching = shared.clone();
        let thread = std::thread::Builder::new()
            .name("nccl-watchdog".into())
            .spawn(move || watch(&watching, grace, &mut on_expiry, &mut on_stuck))?;
        Ok(Watchdog {
            shared,
            timeout,
            thread: Some(thread),
        })
    }

    /// Shows the watchdog the call `what`, from now until the returned guard drops.
    pub(super) fn arm(&self, what: &str) -> Arming<'_> {
        let mut state = self.shared.state.lock().unwrap();
        let id = state.next_id;
        state.next_id += 1;
        state.armed = Some(Armed {
            id,
            what: what.to_string(),
            deadline: far(self.timeout),
        });
        self.shared.changed.notify_all();
        Arming { dog: self, id }
    }

    /// Whether a call outlived its deadline (the communicator is aborted since).
    pub(super) fn fired(&self) -> bool {
        self.shared.fired.load(Ordering::SeqCst)
    }

    /// How long a call may take.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap().stopping = true;
        self.shared.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A call shown to the watchdog; dropping it says the call is over.
pub(super) struct Arming<'a> {
    dog: &'a Watchdog,
    id: u64,
}

impl Drop for Arming<'_> {
    fn drop(&mut self) {
        let mut state = self.dog.shared.state.lock().unwrap();
        if state.armed.as_ref().is_some_and(|a| a.id == self.id) {
            state.armed = None;
            self.dog.shared.changed.notify_all();
        }
    }
}

/// The watchdog thread: sleeps until the armed call's deadline (or a change), aborts on expiry,
/// and gives the rank `grace` to come out before `on_stuck`.
fn watch(shared: &Shared, grace: Duration, on_expiry: &mut OnExpiry, on_stuck: &mut OnStuck) {
    // ANCHOR: watchdog
    let mut state = shared.state.lock().unwrap();
    loop {
        if state.stopping {
            return;
        }
        let Some(armed) = state.armed.clone() else {
            state = shared.changed.wait(state).unwrap();
            continue;
        };
        let now = Instant::now();
        if now < armed.deadline {
            state = shared
                .changed
                .wait_timeout(state, armed.deadline - now)
                .unwrap()
                .0;
            continue;
        }
        // The call outlived its deadline: abort, outside the lock (the rank may be disarming).
        shared.fired.store(true, Ordering::SeqCst);
        drop(state);
        on_expiry();
        state = shared.state.lock().unwrap();
        let until = Instant::now() + grace;
        while !state.stopping && state.armed.as_ref().is_some_and(|a| a.id == armed.id) {
            let now = Instant::now();
            if now >= until {
                drop(state);
                on_stuck(&armed.what);
                return;
            }
            state = shared.changed.wait_timeout(state, until - now).unwrap().0;
        }
    }
    // ANCHOR_END: watchdog
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

/// `timeout` from now, or a year from now where that cannot be represented.
fn far(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A watchdog whose expiry and stuck actions report on channels.
    fn dog(
        timeout_ms: u64,
        grace_ms: u64,
    ) -> (Watchdog, mpsc::Receiver<()>, mpsc::Receiver<String>) {
        let (expired, expiries) = mpsc::channel();
        let (stuck, stucks) = mpsc::channel();
        let dog = Watchdog::start(
            Duration::from_millis(timeout_ms),
            Duration::from_millis(grace_ms),
            Box::new(move || expired.send(()).unwrap()),
            Box::new(move |what| stuck.send(what.to_string()).unwrap()),
        )
        .unwrap();
        (dog, expiries, stucks)
    }

    #[test]
    fn calls_that_end_in_time_cost_no_abort() {
        let (dog, expiries, stucks) = dog(200, 100);
        for i in 0..1000 {
            let _call = dog.arm(&format!("call {i}"));
        }
        std::thread::sleep(Duration::from_millis(300));
        assert!(!dog.fired());
        assert!(expiries.try_recv().is_err() && stucks.try_recv().is_err());
    }

    #[test]
    fn a_call_past_its_deadline_is_aborted_once_and_the_rank_sees_it() {
        let (dog, expiries, stucks) = dog(50, 2000);
        let started = Instant::now();
        {
            let _call = dog.arm("NCCL ncclAllReduce on rank 1 to complete");
            // The rank's own loop: look, and see the verdict.
            while !dog.fired() {
                take(pause(started.elapsed()));
            }
        }
        assert!(started.elapsed() >= Duration::from_millis(50));
        expiries.recv_timeout(Duration::from_secs(5)).unwrap();
        // The rank came out of its call within the grace: the process goes on.
        std::thread::sleep(Duration::from_millis(100));
        assert!(expiries.try_recv().is_err(), "aborted once");
        assert!(stucks.try_recv().is_err());
    }

    #[test]
    fn a_rank_still_stuck_after_the_grace_is_ended_naming_the_call() {
        let (dog, expiries, stucks) = dog(20, 50);
        let _stuck_call = dog.arm("NCCL ncclAllGather on rank 3 to complete");
        expiries.recv_timeout(Duration::from_secs(5)).unwrap();
        let what = stucks.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(what, "NCCL ncclAllGather on rank 3 to complete");
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
        let (dog, expiries, _) = dog(u64::MAX, 0);
        let _call = dog.arm("x");
        std::thread::sleep(Duration::from_millis(50));
        assert!(!dog.fired() && expiries.try_recv().is_err());
    }
}
