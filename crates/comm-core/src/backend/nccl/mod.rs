//! The NCCL backend: real GPUs through cudarc (loaded at run time, so the workspace builds and
//! runs where there is no CUDA). One rank per GPU, `cuda:{local_rank % gpus}`.
//!
//! How a communicator comes up, as in PyTorch: rank 0 asks NCCL for a unique Id (128 bytes),
//! publishes it through the rendezvous store, the others wait for it there, and every rank calls
//! `ncclCommInitRank(world_size, id, rank)`. From then on NCCL talks GPU to GPU by itself (NVLink,
//! PCIe, InfiniBand or TCP sockets; `NCCL_DEBUG=INFO` shows which).
//!
//! Every collective is enqueued on the rank's stream and then waited for. While waiting, a
//! watchdog (like PyTorch's) polls NCCL for asynchronous errors and aborts the communicator when
//! the call outlives the timeout, e.g. because a peer died: an error, never a hang.
//!
//! The rooms, one concept each: `probe` (can NCCL run here?), `id` (the unique Id), `errors`
//! (NCCL's and CUDA's errors as ours), `watchdog` (waiting without hanging), `init` (the
//! communicator comes up), `calls` (the collectives, [`NcclBackend`]), `batch` (when calls are waited for) and [`library`] (finding
//! libnccl).

mod batch;
mod calls;
mod errors;
mod id;
mod init;
pub mod library;
mod probe;
mod watchdog;

pub use calls::NcclBackend;
pub use errors::nccl_error;
pub use id::{bootstrap_address, id_from_bytes, id_to_bytes, new_unique_id};
pub use probe::{probe, Machine, Probe, ThisMachine};

use crate::error::{CommError, Result};

/// The GPU for a rank: `local_rank % gpus`, one rank per GPU.
pub fn device_for(local_rank: usize, local_world_size: usize, gpus: usize) -> Result<usize> {
    if gpus == 0 {
        return Err(CommError::Backend("no GPU visible to this rank".into()));
    }
    if local_world_size > gpus {
        return Err(CommError::Backend(format!(
            "{local_world_size} ranks on this node but only {gpus} GPU{}: NCCL needs one GPU per rank \
             (two ranks on one GPU fail with ncclInvalidUsage); start at most {gpus} per node (-n {gpus})",
            if gpus == 1 { "" } else { "s" }
        )));
    }
    Ok(local_rank % gpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rank_per_gpu() {
        assert_eq!(device_for(0, 4, 4).unwrap(), 0);
        assert_eq!(device_for(3, 4, 4).unwrap(), 3);
        assert_eq!(device_for(1, 2, 4).unwrap(), 1);
        let err = device_for(2, 3, 2).unwrap_err().to_string();
        assert!(
            err.contains("3 ranks on this node but only 2 GPUs"),
            "{err}"
        );
        assert!(err.contains("-n 2"), "{err}");
        assert!(device_for(0, 1, 0).is_err());
    }
}
