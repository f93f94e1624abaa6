//! Lab 7: a deadlock to find. The page: docs/src/lab7-deadlock.md. This program is written, and it
//! hangs: `cargo lab 7` runs it with a short `--timeout` and shows what each rank waited for.
//! Find why, and fix it here.

use comm_core::{Buffer, Communicator, ReduceOp, Result};

/// The end of a training step. Every rank adds its `stats` (its loss and its token count) into
/// rank 1's, which logs them (a reduce to root 1); then rank 1 sends every rank the learning
/// rate it chose for the next step, `lr` (a broadcast from root 1).
///
/// You may use the collectives: `comm.reduce`, `comm.broadcast`, and any other.
pub fn end_of_step(
    comm: &Communicator,
    stats: &mut Buffer<f32>,
    lr: &mut Buffer<f32>,
) -> Result<()> {
    if comm.rank() == 0 {
        // Rank 0 prints the learning rate with its own loss, so it wants the rate first.
        comm.broadcast(lr, 1)?;
        comm.reduce(stats, ReduceOp::Sum, 1)?;
    } else {
        comm.reduce(stats, ReduceOp::Sum, 1)?;
        comm.broadcast(lr, 1)?;
    }
    Ok(())
}
