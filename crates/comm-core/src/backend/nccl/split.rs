//! A communicator split off this one by NCCL itself: `ncclCommSplit(comm, color, key, &new,
//! NULL)` (NCCL 2.18 and later), a call every rank of the parent makes. Ranks of one color form
//! a new communicator, ordered by key then by their rank in the parent; `NCCL_SPLIT_NOCOLOR`
//! (-1) takes part and gets none. The child inherits the parent's config (blocking, as ours is)
//! and gets a stream of its own on the same GPU, so its calls and the parent's are ordered
//! independently. Which ranks split how was agreed through the store first (`crate::group`),
//! so no rank enters this collective call unless every rank will.

use cudarc::nccl::sys;

use super::calls::NcclBackend;
use super::errors::{cuda, nccl};
use super::probe::dotted_version;
use crate::error::{CommError, Result};

/// The first NCCL with `ncclCommSplit`.
const SPLIT_SINCE: i32 = 21800;

impl NcclBackend {
    /// This rank's communicator of its `color`, ranked by `key` (`None` for NCCL_SPLIT_NOCOLOR,
    /// -1), with the parent's timeout: ncclCommSplit under the watchdog. `seat` is where the
    /// ranks agreed this one goes (rank, size); NCCL placing it elsewhere is an error.
    pub(crate) fn split(
        &self,
        color: i32,
        key: i32,
        seat: (usize, usize),
    ) -> Result<Option<NcclBackend>> {
        self.check_usable()?;
        let version = cudarc::nccl::result::get_nccl_version().map_err(nccl("ncclGetVersion"))?;
        if version < SPLIT_SINCE {
            return Err(CommError::Backend(format!(
                "splitting a communicator needs ncclCommSplit, which came in NCCL 2.18; this \
                 is NCCL {}: load a newer libnccl (LD_LIBRARY_PATH, or pip's nvidia-nccl-cu12)",
                dotted_version(version)
            )));
        }
        let mut child: sys::ncclComm_t = std::ptr::null_mut();
        {
            let _watched = self.watchdog.arm("ncclCommSplit");
            // SAFETY: self.comm is live (check_usable) and used by this thread only; `child`
            // is an out-pointer NCCL writes; a null config makes the child inherit the
            // parent's; ncclCommSplit exists from SPLIT_SINCE, checked above.
            unsafe {
                sys::ncclCommSplit(self.comm, color, key, &mut child, std::ptr::null_mut())
                    .result()
                    .map_err(nccl("ncclCommSplit"))?;
            }
        }
        if child.is_null() {
            return Ok(None);
        }
        let free = |e: CommError| {
            // SAFETY: the child NCCL just made, never used and not yet adopted; freed once.
            let _ = unsafe { cudarc::nccl::result::comm_abort(child) };
            e
        };
        // SAFETY: `child` is the live communicator NCCL just handed out.
        let (rank, size) = unsafe {
            let rank = cudarc::nccl::result::comm_user_rank(child);
            let size = cudarc::nccl::result::comm_count(child);
            (rank, size)
        };
        let rank = rank.map_err(nccl("ncclCommUserRank")).map_err(free)? as usize;
        let size = size.map_err(nccl("ncclCommCount")).map_err(free)? as usize;
        if (rank, size) != seat {
            return Err(free(CommError::Backend(format!(
                "ncclCommSplit made this rank {rank} of {size} where the ranks agreed on {} of {}",
                seat.0, seat.1
            ))));
        }
        let stream = self.stream.context().new_stream();
        let stream = stream
            .map_err(cuda("creating the group's stream"))
            .map_err(free)?;
        let timeout = self.watchdog.timeout();
        NcclBackend::adopt(stream, child, rank, size, timeout).map(Some)
    }
}
