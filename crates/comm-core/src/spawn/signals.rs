//! Process groups and signals: each rank leads a group of its own and dies with this process
//! (`PR_SET_PDEATHSIG`); Ctrl-C and SIGTERM are caught here and passed on to the groups; a stop
//! is SIGTERM, then SIGKILL after the plan's grace; whatever a rank left in its group is killed
//! once the ranks are gone.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};

/// A signal's name, for the summary.
pub(super) fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        _ => "signal",
    }
}

/// A signal caught and not yet passed on to the ranks.
static RECEIVED_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// The last signal caught, kept: see [`interrupted`].
static INTERRUPTED_BY: AtomicI32 = AtomicI32::new(0);

extern "C" fn remember_signal(sig: libc::c_int) {
    RECEIVED_SIGNAL.store(sig, Ordering::SeqCst);
    INTERRUPTED_BY.store(sig, Ordering::SeqCst);
}

/// The SIGINT or SIGTERM this process last received since [`run`](super::run) (or
/// [`run_with`](super::run_with)) first
/// started ranks, if any. It was passed on to the ranks; a launcher that restarts
/// failed ranks asks this first, as an interrupt (Ctrl-C, a cancelled job) never restarts.
pub fn interrupted() -> Option<i32> {
    match INTERRUPTED_BY.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// Catches SIGINT and SIGTERM so the parent can pass them on instead of dying first.
pub(super) fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(sig, remember_signal as *const () as libc::sighandler_t);
        }
    }
}

/// Sends `sig` to the process group rank `pid` leads: the rank and every process it started
/// (that did not leave the group). Should the rank have left its group, it gets `sig` too.
fn signal_group(pid: u32, sig: i32) {
    let pid = pid as libc::pid_t;
    // SAFETY: kill(2) and getpgid(2) on a group and a pid we started; at worst they are gone
    // (ESRCH) and nothing happens.
    unsafe {
        let group = libc::kill(-pid, sig) == 0;
        if !group || libc::getpgid(pid) != pid {
            libc::kill(pid, sig);
        }
    }
}

/// Waits until the child `pid` has exited, and how, without reaping it: as a zombie it keeps its
/// pid, so its process group's id cannot go to another process while the launcher may still
/// signal the group. The caller reaps it afterwards (`Child::wait`).
pub(super) fn wait_leaving_zombie(pid: u32) -> std::io::Result<ExitStatus> {
    loop {
        // SAFETY: siginfo_t is plain data, zeroed is a valid value; waitid writes it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child with a valid out-pointer; WNOWAIT leaves it unreaped.
        let done = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if done == 0 {
            // SAFETY: waitid filled info for an exited child: si_status is valid.
            let status = unsafe { info.si_status() };
            // The wait(2) status word: an exit code in the second byte, or the signal.
            let raw = match info.si_code {
                libc::CLD_EXITED => (status & 0xff) << 8,
                libc::CLD_DUMPED => status | 0x80,
                _ => status,
            };
            return Ok(ExitStatus::from_raw(raw));
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Whether any process is left in the group `pid` led.
fn group_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the group exists and may be signalled.
    unsafe { libc::kill(-(pid as libc::pid_t), 0) == 0 }
}

/// Makes the rank `command` starts lead a process group of its own, and die with this process.
pub(super) fn lead_own_group(command: &mut Command) {
    // SAFETY: setpgid and prctl are async-signal-safe. The rank leads a process group of
    // its own, which is what gets signalled: what the rank starts goes with it. If this
    // parent dies, even by SIGKILL, the kernel kills the rank: no orphan keeps running.
    // (Out of the terminal's foreground group, the rank no longer gets Ctrl-C itself: the
    // parent catches it and passes it on to the group.)
    unsafe {
        command.pre_exec(|| {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// The signal caught since the last call, if any, to be passed on.
pub(super) fn take_signal() -> Option<i32> {
    match RECEIVED_SIGNAL.swap(0, Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// Sends `sig` to the group of every rank still running (`running[i]` for `pids[i]`). SIGTERM is
/// followed by SIGCONT, as systemd stops a service: a rank stopped with SIGSTOP (or Ctrl-Z) would
/// otherwise keep the SIGTERM pending, and the job would wait out the grace for its SIGKILL.
pub(super) fn stop(pids: &[u32], running: &[bool], sig: i32) {
    for (&pid, &alive) in pids.iter().zip(running) {
        if alive {
            signal_group(pid, sig);
            if sig == libc::SIGTERM {
                signal_group(pid, libc::SIGCONT);
            }
        }
    }
}

/// Kills every group these ranks led (a start that failed half way).
pub(super) fn kill_all(pids: &[u32]) {
    for &pid in pids {
        signal_group(pid, libc::SIGKILL);
    }
}

/// Once the ranks have exited: whatever they started and left behind is still in their groups,
/// and goes with them.
pub(super) fn reap(pids: &[u32]) {
    for &pid in pids {
        if group_alive(pid) {
            signal_group(pid, libc::SIGKILL);
        }
    }
}
