//! The communicator comes up: `ncclCommInitRankConfig` with `blocking = 1`, on a thread of its
//! own, while the rank waits for it at most the timeout.
//!
//! Why blocking: nonblocking communicators came in NCCL 2.14, and what a group end of theirs does
//! (each collective is an implicit group) depends on the version (`src/group.cc`,
//! `ncclGroupEndInternal`). In 2.14 to 2.22 it starts a thread only when the group holds a
//! connection to set up (a preconnect) or an asynchronous job (an init, a finalize), and launches
//! on the caller's thread otherwise; from 2.23 every group end of a nonblocking communicator runs
//! on a new thread and answers `ncclInProgress`, so every call pays a thread's start and join. A
//! blocking communicator launches on the caller's thread in every version. The backend relies on
//! neither behaviour: it asks for `blocking = 1` outright (below), refuses an
//! `NCCL_COMM_BLOCKING` other than 1, and takes `ncclInProgress` from any call as an error
//! (`calls.rs`, `enqueued`): a call that returns has enqueued its work, whatever the version.
//!
//! A blocking communicator's init cannot be aborted from outside (the handle arrives
//! only when it returns), so it runs on a thread of its own, once: if it outlives the timeout (a
//! rank never came), the rank writes its failure and ends with `_exit`, taking the thread stuck
//! in NCCL with it (`exit` would run libnccl's and libcuda's destructors under that thread).

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaContext;
use cudarc::nccl::{result, sys};

use super::errors::nccl;
use crate::error::{CommError, Result};
use crate::failure_record::end_process;

/// The first NCCL with communicator configs (`ncclCommInitRankConfig`).
const CONFIG_SINCE: i32 = 21400;

/// NCCL's variable that overrides a config's `blocking`.
const BLOCKING_VAR: &str = crate::topology::NCCL_COMM_BLOCKING_VAR;

/// NCCL_CONFIG_INITIALIZER with `blocking = 1` said outright. (NCCL_COMM_BLOCKING in the
/// environment would still override it: [`init_rank`] refuses a value other than 1.)
fn blocking_config() -> sys::ncclConfig_t {
    const UNDEF: i32 = i32::MIN; // NCCL_CONFIG_UNDEF_INT: "NCCL's default"
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafebeef,
        // The layout of cudarc's bindings (NCCL 2.30's header): NCCL copies `size` bytes at most
        // and takes fields newer than `version` as defaults, so older libraries read a prefix.
        version: 23000,
        blocking: 1,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
        graphUsageMode: UNDEF,
        numRmaCtx: UNDEF,
        maxP2pPeers: UNDEF,
    }
}

/// NCCL_COMM_BLOCKING (`value`, as set) overrides a config's `blocking` (NCCL's `init.cc`,
/// `envConfigOverride`): refused unless unset or 1, so the communicator is blocking whatever the
/// environment says.
fn blocking_as_asked(value: Option<std::ffi::OsString>) -> Result<()> {
    match value.filter(|v| v.to_str() != Some("1")) {
        None => Ok(()),
        Some(value) => Err(CommError::env(
            BLOCKING_VAR,
            format!(
                "{BLOCKING_VAR}={} would make NCCL's communicator nonblocking, which this backend \
                 does not drive (its calls would return before they are enqueued); unset it",
                value.to_string_lossy()
            ),
        )),
    }
}

/// The init call itself, on the init thread (its CUDA context bound): what went wrong, if
/// anything, in words.
fn init_blocking(
    comm: &mut sys::ncclComm_t,
    version: i32,
    world_size: usize,
    id: sys::ncclUniqueId,
    rank: usize,
) -> std::result::Result<(), String> {
    let (n, r) = (world_size as i32, rank as i32);
    // SAFETY: comm is an out-pointer NCCL writes; the Id came from ncclGetUniqueId; config
    // outlives the call (NCCL copies it); the config API exists from CONFIG_SINCE.
    let (name, made) = unsafe {
        match version < CONFIG_SINCE {
            true => ("ncclCommInitRank", result::comm_init_rank(comm, n, id, r)),
            false => {
                let mut config = blocking_config();
                let made = result::comm_init_rank_config(comm, n, id, r, &mut config);
                ("ncclCommInitRankConfig", made)
            }
        }
    };
    match made {
        Ok(result::NcclStatus::InProgress) => Err(format!(
            "{name} answered ncclInProgress: the communicator is not a blocking one"
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(nccl(name)(e).to_string()),
    }
}

/// A communicator handle on its way from the init thread.
struct Handle(sys::ncclComm_t);
// SAFETY: an NCCL communicator may be used from any thread, one at a time; the init thread hands
// it over and never touches it again.
unsafe impl Send for Handle {}

/// Brings the communicator up on `ctx`'s GPU, within `timeout`. A failed init frees what it made
/// (NCCL may hand out a communicator in an error state).
pub(super) fn init_rank(
    ctx: &Arc<CudaContext>,
    world_size: usize,
    id: sys::ncclUniqueId,
    rank: usize,
    timeout: Duration,
) -> Result<sys::ncclComm_t> {
    blocking_as_asked(crate::topology::nccl_comm_blocking())?;
    let version = result::get_nccl_version().map_err(nccl("ncclGetVersion"))?;
    let (done, outcome) = mpsc::channel();
    let ctx = ctx.clone();
    std::thread::Builder::new()
        .name("nccl-init".into())
        .spawn(move || {
            let mut comm: sys::ncclComm_t = std::ptr::null_mut();
            let made = match ctx.bind_to_thread() {
                Ok(()) => init_blocking(&mut comm, version, world_size, id, rank),
                Err(e) => Err(e.to_string()),
            };
            let _ = done.send((made, Handle(comm)));
        })
        .map_err(|e| CommError::io("starting NCCL's init thread", e))?;
    let timed_out = |stuck: bool| CommError::Timeout {
        what: format!("NCCL's communicator on rank {rank} of {world_size} to come up"),
        timeout,
        detail: match stuck {
            true => {
                " (did every rank start? NCCL_DEBUG=INFO shows who connected); NCCL's init \
                     is still running on its thread, so this rank ends at once"
            }
            false => " (did every rank start? NCCL_DEBUG=INFO shows who connected)",
        }
        .into(),
        missing: Vec::new(),
    };
    let free = |Handle(comm): Handle| {
        if !comm.is_null() {
            // SAFETY: the communicator init handed out, never used; aborted once.
            let _ = unsafe { result::comm_abort(comm) };
        }
    };
    match came(&outcome, timeout) {
        Came::InTime((Ok(()), Handle(comm))) => Ok(comm),
        Came::InTime((Err(why), handle)) => {
            free(handle);
            Err(CommError::Backend(why))
        }
        // Out of NCCL just after the deadline: nothing is left inside it.
        Came::Late((_, handle)) => {
            free(handle);
            Err(timed_out(false))
        }
        Came::Never => Err(CommError::Backend(
            "NCCL's init thread ended without an answer".into(),
        )),
        Came::Stuck => end_process(rank, &timed_out(true)),
    }
}

/// What the init thread's answer did within the timeout.
#[derive(Debug, PartialEq, Eq)]
enum Came<T> {
    /// It came in time.
    InTime(T),
    /// It came, but after the timeout.
    Late(T),
    /// The thread ended without one (it panicked): it is not inside NCCL.
    Never,
    /// None yet: the thread is still inside NCCL's init, which nothing can interrupt; only the
    /// process's end (`_exit`) frees it.
    Stuck,
}

/// Waits at most `timeout` for the init thread's answer on `outcome`.
fn came<T>(outcome: &mpsc::Receiver<T>, timeout: Duration) -> Came<T> {
    match outcome.recv_timeout(timeout) {
        Ok(answer) => Came::InTime(answer),
        Err(mpsc::RecvTimeoutError::Disconnected) => Came::Never,
        Err(mpsc::RecvTimeoutError::Timeout) => match outcome.try_recv() {
            Ok(answer) => Came::Late(answer),
            Err(mpsc::TryRecvError::Disconnected) => Came::Never,
            Err(mpsc::TryRecvError::Empty) => Came::Stuck,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_init_still_running_at_the_timeout_is_stuck_and_one_that_answered_is_not() {
        let (tx, rx) = mpsc::channel::<u8>();
        assert_eq!(came(&rx, Duration::from_millis(10)), Came::Stuck);
        tx.send(1).unwrap();
        drop(tx);
        assert_eq!(came(&rx, Duration::from_millis(10)), Came::InTime(1));
        assert_eq!(came(&rx, Duration::from_millis(10)), Came::Never);
    }

    #[test]
    fn a_thread_that_ended_without_answering_is_not_stuck() {
        let (tx, rx) = mpsc::channel::<u8>();
        std::thread::spawn(move || drop(tx)).join().unwrap();
        assert_eq!(came(&rx, Duration::from_secs(5)), Came::Never);
    }

    #[test]
    fn only_a_blocking_communicator_is_made_whatever_the_environment_says() {
        assert!(blocking_as_asked(None).is_ok());
        assert!(blocking_as_asked(Some("1".into())).is_ok());
        for value in ["0", "", "yes"] {
            let refused = blocking_as_asked(Some(value.into()))
                .unwrap_err()
                .to_string();
            assert!(
                refused.contains(&format!("NCCL_COMM_BLOCKING={value} would make")),
                "{refused}"
            );
        }
    }

    #[test]
    fn the_config_is_nccls_initializer_with_blocking_said_outright() {
        let config = blocking_config();
        assert_eq!(config.size, std::mem::size_of::<sys::ncclConfig_t>());
        assert_eq!((config.magic, config.blocking), (0xcafebeef, 1));
        assert!(config.version as i32 >= CONFIG_SINCE);
        assert_eq!((config.minCTAs, config.splitShare), (i32::MIN, i32::MIN));
        assert!(config.netName.is_null() && config.commName.is_null());
    }
}
