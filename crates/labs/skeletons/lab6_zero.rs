//! Lab 6: ZeRO-1, the optimizer's state sharded across the ranks. The page: docs/src/lab6-zero.md.
//! Check it with `cargo lab 6`: it must give DDP's loss, with 1/n of DDP's optimizer state on
//! each rank.

use comm_core::{Communicator, ReduceOp, Result};

use crate::ddp::Sgd;

/// One optimizer step of SGD with momentum, as `torch.optim.SGD(lr, momentum)` takes it
/// (`m = momentum·m + g`, then `p -= lr·m`, with `g` the mean gradient over the ranks), but with
/// the momentum sharded: think of the parameters as n shards of `shard = momentum.len()`
/// elements each (the last one padded with zeros); this rank keeps only shard `rank`'s momentum.
///
/// `params`: the parameters, the same on every rank; afterwards, the new ones, on every rank.
/// `grads`: this rank's own gradients (not yet averaged). So: reduce-scatter the gradients (each
/// rank gets the sum of its shard), step your shard of the parameters with your shard of the
/// momentum, then all-gather the parameters' shards.
///
/// Use `comm.rank()`, `comm.world_size()`, `comm.buffer(&values)?`, `comm.zeros::<f32>(len)?`,
/// `comm.reduce_scatter_into(&send, &mut recv, ReduceOp::Sum)?`, `comm.all_gather_into(&send,
/// &mut recv)?` and `comm.to_host(&buf)?`.
pub fn zero1_step(
    comm: &Communicator,
    params: &mut [f32],
    grads: &[f32],
    momentum: &mut [f32],
    sgd: Sgd,
) -> Result<()> {
    todo!("lab 6: write the sharded optimizer step")
}
