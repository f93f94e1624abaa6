//! The NCCL backend: real GPUs through cudarc (loaded at run time, so the workspace builds and
//! runs where there is no CUDA). One rank per GPU, `cuda:{local_rank % gpus}`.
//!
//! How a communicator comes up, as in PyTorch: rank 0 asks NCCL for a unique Id (128 bytes),
//! publishes it through the rendezvous store, the others wait for it there, and every rank calls
//! `ncclCommInitRank(world_size, id, rank)`. From then on NCCL talks GPU to GPU by itself (NVLink,
//! PCIe, InfiniBand or TCP sockets; `NCCL_DEBUG=INFO` shows which).
//!
//! The communicator is a blocking one: every collective is enqueued on the rank's own thread and
//! stream, then waited for on the GPU without sleeping; a call that outlives the timeout (a peer
//! died) is aborted by that thread: an error, never a hang. A watchdog thread (like PyTorch's
//! heartbeat monitor) is shown each call and ends the process only when the rank is stuck inside
//! NCCL past it. Buffers dropped and aborts wanted inside a group wait for its end.
//!
//! The rooms, one concept each: `probe` (can NCCL run here?), [`library`] (finding libnccl's
//! files and reading them), [`relink`] (the start-time restart with a `libnccl.so` link), `id`
//! (the unique Id), `errors` (NCCL's and CUDA's errors as ours, cudarc's panics as reasons),
//! `watchdog` (waiting without hanging), `init` (the communicator comes up), `calls`
//! ([`NcclBackend`]: how a call is enqueued and waited for, and the communicator's end),
//! `collectives` (which NCCL function each call of the collective table is), `batch` (when calls
//! are waited for), `group_safe` (NCCL's groups, per thread, and no buffer freed inside one),
//! `events` (marks on the stream that time its work), `gpu_trace` (`--trace`'s slices of the
//! GPU's own times), `device` (which GPU a rank uses, and that no two ranks share one) and
//! `split` (ncclCommSplit: a group's communicator). The library is the bottom: the probe and
//! the relink ask it, it asks neither.

mod batch;
mod calls;
mod collectives;
mod device;
mod errors;
mod events;
mod gpu_trace;
mod group_safe;
mod id;
mod init;
pub mod library;
mod probe;
pub mod relink;
mod split;
mod watchdog;

pub use calls::NcclBackend;
pub use collectives::own_call_since_2_28;
pub use device::{bus_id, check_one_gpu_per_rank, device_for, shared_gpu, GpuSeat, SharedGpu};
pub use errors::nccl_error;
pub(crate) use events::Events;
pub use group_safe::GroupSafe;
pub use id::{bootstrap_address, id_from_bytes, id_to_bytes, new_unique_id};
pub use probe::{dotted_version, probe, Machine, Probe, ThisMachine};
#[doc(hidden)]
pub use watchdog::cost_of_watching;
