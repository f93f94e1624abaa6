//! Lab 7 with a wrong fix planted on purpose, to show that the checker catches it and says
//! where: the order is the same on every rank now, but the reduction became a maximum.

use comm_core::{Buffer, Communicator, ReduceOp, Result};

/// A fix that finishes, and sums nothing.
pub fn end_of_step(
    comm: &Communicator,
    stats: &mut Buffer<f32>,
    lr: &mut Buffer<f32>,
) -> Result<()> {
    comm.reduce(stats, ReduceOp::Max, 1)?;
    comm.broadcast(lr, 1)
}
