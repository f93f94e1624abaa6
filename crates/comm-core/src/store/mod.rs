//! The rendezvous store: a small TCP key-value server that rank 0 runs and every rank talks to, the
//! job PyTorch's c10d `TCPStore` does. Ranks use it to find each other (peer addresses, NCCL's
//! unique Id) and to wait for each other (barrier). It knows nothing of collectives.
//!
//! Every wait has a timeout whose error names the key and which ranks had reached the store.
//!
//! It speaks c10d's TCPStore protocol (`wire.rs`): our ranks join torchrun's agent store as they
//! join rank 0's, and Python's `torch.distributed.TCPStore` reads and writes ours. On top of the
//! protocol's commands, each rank joining checks that it belongs to the job (run id, world size,
//! one process per rank: `membership.rs`), and a watcher per rank hears at once when another rank
//! ends the job or the store goes away (`client.rs`). Our server bounds what any connection can
//! make it hold (see [`StoreLimits`] and `server.rs`). That guards against accidents on a shared
//! node, not against attackers: the store trusts its network, as PyTorch's does.

mod client;
pub(crate) mod membership;
mod scoped;
mod server;
mod wire;

pub use client::{wire_key, Membership, Store};
pub use scoped::Scoped;
pub use server::{StoreLimits, StoreServer};
pub use wire::MAX_VALUE_BYTES;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
