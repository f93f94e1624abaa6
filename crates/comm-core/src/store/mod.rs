//! The rendezvous store: a small TCP key-value server that rank 0 runs and every rank talks to, the
//! job PyTorch's c10d `TCPStore` does. Ranks use it to find each other (peer addresses, NCCL's
//! unique Id) and to wait for each other (barrier). It knows nothing of collectives.
//!
//! Every wait has a timeout whose error names the key and which ranks had reached the store.
//!
//! Each connection begins with a hello naming the job (run id, world size) and the rank; the
//! server refuses ranks of another run, duplicate ranks and disagreeing world sizes at once, and
//! bounds what any connection can make it hold (see [`StoreLimits`] and `server.rs`). That guards
//! against accidents on a shared node, not against attackers: the store trusts its network.

mod client;
mod frame;
mod server;

pub use client::Store;
pub use server::{StoreLimits, StoreServer};

/// Largest frame either side accepts; anything bigger is a broken or hostile peer.
pub const MAX_FRAME: usize = 16 << 20;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
