//! Shared memory between the ranks of a host, TCP between hosts: what NCCL's SHM transport and
//! MPI's shared-memory layer do for ranks that share a machine. A message to a rank of the same
//! host is copied into a slot of a ring in that rank's segment and out again on the other side:
//! two memory copies and no system call, where TCP's loopback takes two copies plus the kernel's
//! work for every packet. Ranks on other hosts keep their TCP links.
//!
//! Setting up: over the store, every rank names its host and makes its *inbox* ([`ring`]), a
//! segment sparse and nameless ([`segment`]), so nothing is left in /dev/shm however the job
//! ends; whether every pair of a host may read each other's memory is agreed by the whole job.
//! Nothing more happens per peer until a pair first talks: then, over the TCP link that opens
//! (and stays as the way a dead or failed peer is noticed), each side reserves the ring the
//! other writes, maps the other's inbox and checks its stamp (`pairing.rs`). A pair uses shared
//! memory when both sides could; a rank's memory grows with the peers it talks to.
//!
//! Large messages go by one copy instead ([`cma`], `--copy`): the sender posts its buffer's
//! address and length through the ring, the receiver reads the buffer itself with
//! `process_vm_readv` and says when it is done, and only then does the sender return. Whether
//! every pair of every host can read each other's memory is tested while connecting and agreed
//! by the whole job; where one cannot, all take the rings.
//!
//! The rooms: `wiring.rs` sets up what the host shares over the store (with `inboxes.rs`
//! making the inboxes and `cma.rs` checking who may read whose memory), `pairing.rs` arms a
//! `pair.rs` as it first talks, and `data_path.rs` moves a message through it (with `ring.rs`'s
//! slots and doorbells).
//!
//! Waiting: a rank spins briefly, yields, then sleeps on its doorbell; while it sleeps it wakes
//! every few milliseconds to check the deadline and whether the peer's TCP link has closed (the
//! peer died or failed), so a dead peer is an error within milliseconds and a stopped one a
//! timeout.

mod board;
mod cma;
mod data_path;
mod inboxes;
mod pair;
mod pairing;
mod pool;
mod ring;
mod segment;
mod waiting;
mod window;
mod wiring;

pub use data_path::ShmTcpTransport;
pub use pool::Region;
pub use segment::leftovers;
pub(super) use wiring::connect;

/// Unlinks the segments this process created and has not unlinked yet, and those of processes
/// that died before unlinking theirs (a rank 0 killed with -9): for a rank about to exit because
/// the job ended under it.
pub fn remove_own_segments() {
    segment::remove_own();
    segment::sweep_stale();
}
