//! The communicator comes up: `ncclCommInitRank`, the nonblocking way where NCCL has it, under
//! the watchdog.

use std::time::Duration;

use cudarc::nccl::{result, sys};

use super::errors::nccl;
use super::watchdog::{async_state, watch};
use crate::error::Result;

/// The first NCCL with nonblocking communicators (`ncclCommInitRankConfig`, `blocking = 0`).
const NONBLOCKING_SINCE: i32 = 21400;

/// NCCL_CONFIG_INITIALIZER with `blocking = 0`: every call returns at once and reports its
/// progress through ncclCommGetAsyncError, so init, too, can be watched and aborted.
fn nonblocking_config() -> sys::ncclConfig_t {
    const UNDEF: i32 = i32::MIN; // NCCL_CONFIG_UNDEF_INT: "NCCL's default"
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafebeef,
        // The layout of cudarc's bindings (NCCL 2.30's header): NCCL copies `size` bytes at most
        // and takes fields newer than `version` as defaults, so older libraries read a prefix.
        version: 23000,
        blocking: 0,
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

/// `ncclCommInitRank` under the watchdog: a rank that never joins (it died after the store's
/// barrier) ends in a timeout and an abort, not a hang. NCCL older than 2.14 has no nonblocking
/// init and is called the blocking way.
pub(super) fn init_rank(
    world_size: usize,
    id: sys::ncclUniqueId,
    rank: usize,
    timeout: Duration,
) -> Result<sys::ncclComm_t> {
    let mut comm: sys::ncclComm_t = std::ptr::null_mut();
    let version = result::get_nccl_version().map_err(nccl("ncclGetVersion"))?;
    if version < NONBLOCKING_SINCE {
        // SAFETY: comm is written by NCCL on success; the Id came from ncclGetUniqueId.
        unsafe { result::comm_init_rank(&mut comm, world_size as i32, id, rank as i32) }
            .map_err(nccl("ncclCommInitRank"))?;
        return Ok(comm);
    }
    let mut config = nonblocking_config();
    // SAFETY: as above; config outlives the call (NCCL copies it).
    unsafe {
        result::comm_init_rank_config(&mut comm, world_size as i32, id, rank as i32, &mut config)
    }
    .map_err(nccl("ncclCommInitRankConfig"))?;
    let mut look = || async_state(comm).map_err(nccl("ncclCommInitRankConfig"));
    watch(
        &format!("NCCL's communicator on rank {rank} of {world_size} to come up"),
        " (did every rank start? NCCL_DEBUG=INFO shows who connected); it was aborted",
        timeout,
        &mut look,
        // SAFETY: a communicator NCCL handed out, aborted once and never used again.
        || unsafe {
            let _ = result::comm_abort(comm);
        },
    )?;
    Ok(comm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nonblocking_config_is_nccls_initializer_with_blocking_off() {
        let config = nonblocking_config();
        assert_eq!(config.size, std::mem::size_of::<sys::ncclConfig_t>());
        assert_eq!((config.magic, config.blocking), (0xcafebeef, 0));
        assert!(config.version as i32 >= NONBLOCKING_SINCE);
        assert_eq!((config.minCTAs, config.splitShare), (i32::MIN, i32::MIN));
        assert!(config.netName.is_null() && config.commName.is_null());
    }
}
