//! Which sizes fit in memory, before any is allocated: a size that does not is skipped with a
//! `#` line saying why, instead of ending the run in an allocation failure (on NCCL,
//! `CUDA_ERROR_OUT_OF_MEMORY` aborts every rank). Two budgets, each rank's smallest over the job
//! (so every rank skips the same sizes):
//!
//! - **host memory**: 3/4 of MemAvailable shared by the node's ranks; a rank needs about 3× the
//!   size there (send and receive buffers, or a CPU algorithm's scratch copy; for the check the
//!   result, the reference and one rank's input);
//! - **GPU memory** (NCCL): 9/10 of the GPU's free memory (`cuMemGetInfo`, read once the
//!   communicator exists, so NCCL's own buffers are already counted; the tenth left over is for
//!   what NCCL allocates later, at the first call that connects a pair of ranks); one GPU per
//!   rank, so not shared. A rank needs 2× the size there: its send and receive buffers (the
//!   timed loop's rotation stays within the largest size that fits, see [`largest_fitting`]);
//!   the check's reference lives on the host.
//!
//! Everything here is arithmetic, tested without a GPU; `driver.rs` reads the numbers.

use comm_core::Collective;

/// What each rank may use, the smallest over the job's ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Host bytes per rank.
    pub host: u64,
    /// GPU bytes per rank; None on the CPU backend.
    pub device: Option<u64>,
    /// Ranks per node, sharing the host's memory.
    pub local_ranks: usize,
}

/// Why a size does not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Host memory: a rank needs `need` bytes and has `have`.
    Host { need: u64, have: u64 },
    /// GPU memory: a rank needs `need` bytes and has `have`.
    Device { need: u64, have: u64 },
}

/// Host memory one rank needs for `bytes`: send and receive buffers (or a CPU algorithm's
/// scratch copy), and for the check the result, the reference and one rank's input.
pub fn host_footprint(bytes: u64) -> u64 {
    bytes.saturating_mul(3)
}

/// GPU memory one rank needs for `bytes`: its send and receive buffers.
pub fn device_footprint(bytes: u64) -> u64 {
    bytes.saturating_mul(2)
}

/// A rank's share of the host: 3/4 of `available` (MemAvailable) over the node's ranks.
pub fn host_share(available: u64, local_ranks: usize) -> u64 {
    available / 4 * 3 / local_ranks.max(1) as u64
}

/// A rank's share of its GPU: 9/10 of its free memory.
pub fn device_share(free: u64) -> u64 {
    free / 10 * 9
}

impl Budget {
    /// Why `bytes` does not fit, or None when it does. GPU memory is checked first: it is the
    /// smaller of the two on most GPU nodes, and the one an oversized NCCL run fails on.
    pub fn refusal(&self, bytes: u64) -> Option<Refusal> {
        if let Some(have) = self.device {
            let need = device_footprint(bytes);
            if need > have {
                return Some(Refusal::Device { need, have });
            }
        }
        let need = host_footprint(bytes);
        (need > self.host).then_some(Refusal::Host {
            need,
            have: self.host,
        })
    }

    /// The largest of `sizes` that fits, if any: how far the timed loop's buffer rotation may
    /// reach (nccl-tests' rotates within -e, the size it allocated for; ours within the largest
    /// size it could allocate).
    pub fn largest_fitting(&self, sizes: &[u64]) -> Option<u64> {
        largest_fitting(self, sizes)
    }
}

/// See [`Budget::largest_fitting`].
pub fn largest_fitting(budget: &Budget, sizes: &[u64]) -> Option<u64> {
    sizes
        .iter()
        .copied()
        .filter(|&s| budget.refusal(s).is_none())
        .max()
}

/// The `#` line for a size skipped for `refusal`.
pub fn note(collective: Collective, bytes: u64, refusal: Refusal, local_ranks: usize) -> String {
    let gb = |b: u64| b as f64 / 1e9;
    match refusal {
        Refusal::Host { need, have } => format!(
            "skipped {collective} at {bytes} B: each of the {local_ranks} ranks on a node needs \
             about {:.1} GB of host memory (buffers, then the check), and 3/4 of MemAvailable \
             leaves {:.1} GB per rank",
            gb(need),
            gb(have)
        ),
        Refusal::Device { need, have } => format!(
            "skipped {collective} at {bytes} B: each rank needs about {:.1} GB of GPU memory \
             (send and receive buffers), and 9/10 of its GPU's free memory (cuMemGetInfo, after \
             NCCL's init) leaves {:.1} GB",
            gb(need),
            gb(have)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    /// An H100 with 79 GB free and a host of 2 TB shared by 4 ranks: -e 64G is refused for GPU
    /// memory (128 GB of buffers), 16G fits, and the note says which memory and how much.
    #[test]
    fn a_size_too_large_for_the_gpu_is_refused_with_the_reason() {
        let budget = Budget {
            host: host_share(2000 * GB, 4),
            device: Some(device_share(79 * GB)),
            local_ranks: 4,
        };
        assert_eq!(budget.host, 375 * GB);
        let have = device_share(79 * GB);
        assert_eq!(have, 71_100_000_000);
        assert_eq!(budget.refusal(16 * GB), None);
        assert_eq!(
            budget.refusal(64 * GB),
            Some(Refusal::Device {
                need: 128 * GB,
                have
            })
        );
        let note = note(
            Collective::AllReduce,
            64 * GB,
            budget.refusal(64 * GB).unwrap(),
            4,
        );
        assert_eq!(
            note,
            "skipped all_reduce at 64000000000 B: each rank needs about 128.0 GB of GPU memory \
             (send and receive buffers), and 9/10 of its GPU's free memory (cuMemGetInfo, after \
             NCCL's init) leaves 71.1 GB"
        );
        // The rotation reaches as far as the largest size that fits.
        let sizes = [GB, 16 * GB, 32 * GB, 64 * GB];
        assert_eq!(budget.largest_fitting(&sizes), Some(32 * GB));
    }

    #[test]
    fn the_host_budget_refuses_what_the_gpu_would_take_and_the_cpu_has_no_gpu_budget() {
        // Plenty of GPU memory, little host memory: the host refuses.
        let budget = Budget {
            host: host_share(16 * GB, 8),
            device: Some(device_share(139 * GB)),
            local_ranks: 8,
        };
        assert_eq!(budget.host, 1_500_000_000);
        assert_eq!(
            budget.refusal(GB),
            Some(Refusal::Host {
                need: 3 * GB,
                have: 1_500_000_000
            })
        );
        assert!(
            note(Collective::AllGather, GB, budget.refusal(GB).unwrap(), 8)
                .contains("each of the 8 ranks on a node needs about 3.0 GB of host memory")
        );
        let cpu = Budget {
            device: None,
            ..budget
        };
        assert_eq!(cpu.refusal(GB / 4), None);
        assert_eq!(cpu.largest_fitting(&[GB, 2 * GB]), None);
        // Sizes beyond u64 arithmetic saturate instead of wrapping into a fit.
        assert!(cpu.refusal(u64::MAX / 2).is_some());
    }
}
