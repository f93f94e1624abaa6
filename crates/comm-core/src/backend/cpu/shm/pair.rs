//! A pair of ranks of one host, as shared memory joins them: the ring each writes into the
//! other's inbox, the other's doorbell and process. `pairing.rs` makes one as the pair first
//! talks; `data_path.rs` moves messages through it.

use std::sync::Mutex;

use super::ring::{Doorbell, Ring};

/// The two rings between this rank and one peer of its host.
pub(super) struct Pair {
    /// Ours to write, in the peer's inbox.
    pub(super) outgoing: Mutex<Ring>,
    /// Ours to read, in our inbox.
    pub(super) incoming: Mutex<Ring>,
    /// The peer's doorbell: rung after writing to it or freeing a slot it writes.
    pub(super) bell: Doorbell,
    /// The peer's process, whose memory the one-copy path reads.
    pub(super) pid: libc::pid_t,
    /// Where pieces read from the peer's buffer for a sink wait for it (one-copy path).
    pub(super) staging: Mutex<Vec<u64>>,
}

impl Pair {
    /// The pair that writes into `outgoing` (in the peer's inbox), reads from `incoming` (in
    /// ours), rings `bell` (the peer's) and reads by one copy from process `pid` (0 where the
    /// job sends no message by one copy).
    pub(super) fn new(outgoing: Ring, incoming: Ring, bell: Doorbell, pid: libc::pid_t) -> Pair {
        Pair {
            outgoing: Mutex::new(outgoing),
            incoming: Mutex::new(incoming),
            bell,
            pid,
            staging: Mutex::new(Vec::new()),
        }
    }
}
