//! Lab 1: ping-pong, and the α–β model fitted by hand. The page: docs/src/lab1-ping-pong.md. Check it
//! with `cargo lab 1`.

use comm_core::{Buffer, Communicator, Result};

/// `round_trips` round trips of `buf` between ranks 0 and 1: rank 0 sends its `buf` to rank 1,
/// which receives it into its own `buf` and sends it straight back; rank 0 receives it into
/// `buf`. The other ranks do nothing. Afterwards ranks 0 and 1 both hold what rank 0 held.
///
/// Use only `comm.rank()`, `comm.send(&*buf, peer)?` (the whole buffer; `&*buf` lends your
/// `&mut` buffer for reading) and `comm.recv(&mut *buf, peer)?`. The checker times your
/// function: half a round trip is the time of one message.
pub fn ping_pong(comm: &Communicator, buf: &mut Buffer<f32>, round_trips: usize) -> Result<()> {
    todo!("lab 1: write the ping-pong")
}

/// The least-squares line through `points`, each `(s, t)`: a message of `s` bytes took `t`
/// seconds. Returns `(α, β)` such that `t ≈ α + β·s`: α, the latency, in seconds; β, the time
/// of one byte, in seconds (1/β is the bandwidth, in bytes a second). With `s̄` and `t̄` the
/// means: `β = Σ (s − s̄)(t − t̄) / Σ (s − s̄)²` and `α = t̄ − β·s̄`.
pub fn fit_alpha_beta(points: &[(f64, f64)]) -> (f64, f64) {
    todo!("lab 1: write the least-squares fit")
}
