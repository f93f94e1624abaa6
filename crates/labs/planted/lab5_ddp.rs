//! Lab 5 with a bug planted on purpose, to show that the checker catches it and says where: the
//! naive variant sums the gradients and never divides by the number of ranks (a missing step).
//! The other two are the solution's.

use std::ops::Range;

use comm_core::{Communicator, ReduceOp, Result};

pub use crate::solutions::lab5_ddp::{bucketed, flattened};

/// The solution, but the sums stay sums.
pub fn naive(comm: &Communicator, grads: &mut [f32], tensors: &[Range<usize>]) -> Result<()> {
    for tensor in tensors {
        let mut buf = comm.buffer(&grads[tensor.clone()])?;
        comm.all_reduce(&mut buf, ReduceOp::Sum)?;
        grads[tensor.clone()].copy_from_slice(&comm.to_host(&buf)?);
    }
    Ok(())
}
