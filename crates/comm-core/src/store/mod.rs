//! The rendezvous store: a small TCP key-value server that rank 0 runs and every rank talks to, the
//! job PyTorch's c10d `TCPStore` does. Ranks use it to find each other (peer addresses, NCCL's
//! unique Id) and to wait for each other (barrier). It knows nothing of collectives.
//!
//! Every wait has a timeout whose error names the key and which ranks had reached the store.
//!
//! It speaks c10d's TCPStore protocol: our ranks join torchrun's agent store as they join rank
//! 0's, and Python's `torch.distributed.TCPStore` reads and writes ours. A rank's side is three
//! layers, as mini-redis's frame, connection and commands, each using only the ones below it:
//!
//! - `wire.rs`: requests and answers, encoded and decoded; the only place that knows bytes.
//! - `connection.rs`: one connection (handshake, confirmed requests, a WAIT withdrawn) and
//!   `client.rs`: TCPStore's commands on it, under a namespace, knowing nothing of jobs.
//! - `session.rs` ([`Store`]): the job's session on the client. Joining checks that the rank
//!   belongs to the job (run id, world size, one process per rank: `membership.rs`), a watcher
//!   hears at once when another rank ends the job or the store goes away (`watcher.rs`); barriers,
//!   rank 0's value, aborting and leaving.
//!
//! A node's launcher (commrun) attends the store while its ranks start (`presence.rs`), so that
//! a node is not invisible before its first rank joins.
//!
//! Our server speaks through `wire` too, in two rooms: `server.rs`, the poll loop that moves a
//! connection's bytes, and `table.rs`, the keys, values and waits every request reads and
//! changes (mini-redis's connection loop and `db.rs`). It bounds what any connection can make it
//! hold (see [`StoreLimits`]). That guards against accidents on a shared node, not against
//! attackers: the store trusts its network, as PyTorch's does.

mod client;
mod connection;
mod membership;
pub mod presence;
mod scoped;
mod server;
mod session;
mod table;
mod watcher;
mod wire;

pub use membership::Membership;
pub use scoped::Scoped;
pub use server::{StoreLimits, StoreServer};
pub use session::Store;
pub use wire::{wire_key, Answer, Command, Shape, MAX_VALUE_BYTES, VALIDATION_MAGIC};

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
