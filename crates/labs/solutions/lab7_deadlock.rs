//! Lab 7's solution: every rank calls the collectives in the same order.

use comm_core::{Buffer, Communicator, ReduceOp, Result};

/// The end of a training step: the reduce to rank 1, then its broadcast, on every rank alike.
/// (Rank 0 may print the rate with its loss once both are done.)
pub fn end_of_step(
    comm: &Communicator,
    stats: &mut Buffer<f32>,
    lr: &mut Buffer<f32>,
) -> Result<()> {
    comm.reduce(stats, ReduceOp::Sum, 1)?;
    comm.broadcast(lr, 1)
}
