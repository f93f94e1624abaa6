//! Lab 6's solution: ZeRO-1's sharded optimizer step.

use comm_core::{Communicator, ReduceOp, Result};

use crate::ddp::Sgd;

/// SGD with momentum, the momentum sharded over the ranks.
pub fn zero1_step(
    comm: &Communicator,
    params: &mut [f32],
    grads: &[f32],
    momentum: &mut [f32],
    sgd: Sgd,
) -> Result<()> {
    let (n, rank, shard) = (comm.world_size(), comm.rank(), momentum.len());
    // The gradients, padded to n whole shards; each rank gets the sum of its own shard.
    let mut padded = grads.to_vec();
    padded.resize(n * shard, 0.0);
    let mut sums = comm.zeros::<f32>(shard)?;
    comm.reduce_scatter_into(&comm.buffer(&padded)?, &mut sums, ReduceOp::Sum)?;
    // This rank's shard of the parameters takes its step.
    let mut mine = params.to_vec();
    mine.resize(n * shard, 0.0);
    let mine = &mut mine[rank * shard..(rank + 1) * shard];
    for ((p, m), sum) in mine
        .iter_mut()
        .zip(momentum.iter_mut())
        .zip(comm.to_host(&sums)?)
    {
        *m = sgd.momentum * *m + sum / n as f32;
        *p -= sgd.lr * *m;
    }
    // Every rank's shard, to every rank.
    let mut all = comm.zeros::<f32>(n * shard)?;
    comm.all_gather_into(&comm.buffer(mine)?, &mut all)?;
    params.copy_from_slice(&comm.to_host(&all)?[..params.len()]);
    Ok(())
}
