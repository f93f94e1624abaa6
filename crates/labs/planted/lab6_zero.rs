//! Lab 6 with a bug planted on purpose, to show that the checker catches it and says where: each
//! rank steps the shard one past its own (an off-by-one shard), so the all-gathered parameters
//! are every shard's neighbour's.

use comm_core::{Communicator, ReduceOp, Result};

use crate::ddp::Sgd;

/// The solution, but the shard stepped and sent is rank+1's.
pub fn zero1_step(
    comm: &Communicator,
    params: &mut [f32],
    grads: &[f32],
    momentum: &mut [f32],
    sgd: Sgd,
) -> Result<()> {
    let (n, rank, shard) = (comm.world_size(), comm.rank(), momentum.len());
    let mut padded = grads.to_vec();
    padded.resize(n * shard, 0.0);
    let mut sums = comm.zeros::<f32>(shard)?;
    comm.reduce_scatter_into(&comm.buffer(&padded)?, &mut sums, ReduceOp::Sum)?;
    let mut mine = params.to_vec();
    mine.resize(n * shard, 0.0);
    let next = (rank + 1) % n;
    let mine = &mut mine[next * shard..(next + 1) * shard];
    for ((p, m), sum) in mine
        .iter_mut()
        .zip(momentum.iter_mut())
        .zip(comm.to_host(&sums)?)
    {
        *m = sgd.momentum * *m + sum / n as f32;
        *p -= sgd.lr * *m;
    }
    let mut all = comm.zeros::<f32>(n * shard)?;
    comm.all_gather_into(&comm.buffer(mine)?, &mut all)?;
    params.copy_from_slice(&comm.to_host(&all)?[..params.len()]);
    Ok(())
}
