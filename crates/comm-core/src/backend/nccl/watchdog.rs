//! The watchdog: how a rank waits for NCCL without ever hanging, and without sleeping.
//!
//! The rank's own thread enforces `--timeout` on the work it waits for: it looks at the call's
//! completion (spinning briefly, then yielding the core: a sleep would be in every timing) and,
//! past the deadline, aborts the communicator itself. It must be the rank's own thread: on a
//! blocking communicator `ncclCommAbort` frees the communicator at once, so calling it from
//! another thread while the rank is inside NCCL would free memory NCCL is still using.
//!
//! What the rank cannot see is itself stuck inside a blocking NCCL call (connecting to a peer
//! that died, a group end, a finalize). For that there is one thread per communicator, shown
//! every call: if a call is still in flight `grace` after its deadline, it writes the rank's
//! failure and ends the process, as PyTorch's heartbeat monitor does; nothing else can free a
//! thread that NCCL holds. It sleeps until that moment and costs nothing while calls end in time;
//! no thread is started per call.

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

/// What the watchdog does when the rank is stuck `grace` past a call's deadline: ends the process.
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
}

/// One communicator's watchdog thread.
pub(super) struct Watchdog {
    shared: Arc<Shared>,
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
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                armed: None,
                next_id: 0,
                stopping: false,
            }),
            changed: Condvar::new(),
        });
        let watching = shared.clone();
        let thread = std::thread::Builder::new()
            .name("nccl-watchdog".into())
            .spawn(move || watch(&watching, grace, &mut on_stuck))?;
        Ok(Watchdog {
            shared,
            timeout,
            thread: Some(thread),
        })
    }

    /// Shows the watchdog the call `what`, from now until the returned guard drops; the guard
    /// says when the call's time is up.
    pub(super) fn arm(&self, what: &str) -> Arming<'_> {
        let mut state = self.shared.state.lock().unwrap();
        let id = state.next_id;
        state.next_id += 1;
        let deadline = crate::deadline::after(self.timeout);
        state.armed = Some(Armed {
            id,
            what: what.to_string(),
            deadline,
        });
        self.shared.changed.notify_all();
        Arming {
            dog: self,
            id,
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
    deadline: Instant,
}

impl Arming<'_> {
    /// Whether the call has outlived its timeout: the rank must abort it now.
    pub(super) fn expired(&self) -> bool {
        Instant::now() >= self.deadline
    }
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

/// The watchdog thread: sleeps until `grace` past the armed call's deadline (or a change), and
/// if that call is still in flight then, the rank is stuck inside NCCL: `on_stuck`.
fn watch(shared: &Shared, grace: Duration, on_stuck: &mut OnStuck) {
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
        let stuck_at = armed.deadline.checked_add(grace).unwrap_or(armed.deadline);
        let now = Instant::now();
        if now < stuck_at {
            state = shared
                .changed
                .wait_timeout(state, stuck_at - now)
                .unwrap()
                .0;
            continue;
        }
        drop(state);
        on_stuck(&armed.what);
        return;
    }
    // ANCHOR_END: watchdog
}

/// What `benches/watchdog.rs` measures, without a GPU: `calls` NCCL calls' worth of arming and
/// disarming a running watchdog, as [`super::NcclBackend`] does around every call; the time taken.
pub fn cost_of_watching(calls: u64) -> Duration {
    let dog = Watchdog::start(
        Duration::from_secs(3600),
        Duration::from_secs(3600),
        Box::new(|_| {}),
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
    fn dog(timeout_ms: u64, grace_ms: u64) -> (Watchdog, mpsc::Receiver<String>) {
        let (stuck, stucks) = mpsc::channel();
        let dog = Watchdog::start(
            Duration::from_millis(timeout_ms),
            Duration::from_millis(grace_ms),
            Box::new(move |what| stuck.send(what.to_string()).unwrap()),
        )
        .unwrap();
        (dog, stucks)
    }

    #[test]
    fn calls_that_end_in_time_leave_the_watchdog_asleep() {
        let (dog, stucks) = dog(100, 50);
        for i in 0..1000 {
            let call = dog.arm(&format!("call {i}"));
            assert!(!call.expired());
        }
        std::thread::sleep(Duration::from_millis(300));
        assert!(stucks.try_recv().is_err());
    }

    #[test]
    fn a_call_past_its_deadline_is_the_ranks_to_abort_and_then_nothing_happens() {
        let (dog, stucks) = dog(50, 300);
        let started = Instant::now();
        {
            // The rank's own loop: look, and notice the deadline itself (then it aborts and
            // returns, dropping the guard).
            let call = dog.arm("NCCL ncclAllReduce on rank 1 to complete");
            while !call.expired() {
                take(pause(started.elapsed()));
            }
        }
        assert!(started.elapsed() >= Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(500));
        assert!(stucks.try_recv().is_err(), "the rank came out in time");
    }

    #[test]
    fn a_rank_stuck_inside_a_call_past_the_grace_is_ended_naming_the_call() {
        let (dog, stucks) = dog(20, 50);
        let started = Instant::now();
        let _stuck_call = dog.arm("NCCL ncclAllGather on rank 3 to complete");
        let what = stucks.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(what, "NCCL ncclAllGather on rank 3 to complete");
        assert!(
            started.elapsed() >= Duration::from_millis(70),
            "{:?}",
            started.elapsed()
        );
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
        std::thread::sleep(Duration::from_millis(50));
        assert!(!call.expired() && stucks.try_recv().is_err());
    }
}
