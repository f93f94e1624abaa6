//! Lab 5: data-parallel training by hand, three ways, on the training crate's model and data
//! (the one example 06 trains). The page: docs/src/lab5-ddp.md. Check them with `cargo lab 5`:
//! each must give the library's DDP loss, and the checker prints the four step times side by side.
//!
//! Every rank has run forward and backward on its own share of the batch; its gradients are its
//! own. Your job: make them the mean over all ranks, on every rank, so that every rank takes the
//! same optimizer step (the checker does that step, as DDP's SGD does).

use std::ops::Range;

use comm_core::{AsyncComm, Communicator, ReduceOp, Result, Work};

use crate::ddp::{gather, scatter, Backward, Bucket};

/// Naive: one all-reduce per parameter tensor. `grads` holds this rank's gradients, tensor `p`
/// at `grads[tensors[p].clone()]` (7 tensors: the embedding, then each layer's weights and
/// biases). Sum each over the ranks, then divide by the number of ranks.
///
/// Use `comm.world_size()`, `comm.buffer(&values)?` (a buffer holding a copy of `values`),
/// `comm.all_reduce(&mut buf, ReduceOp::Sum)?` and `comm.to_host(&buf)?` (its values back).
pub fn naive(comm: &Communicator, grads: &mut [f32], tensors: &[Range<usize>]) -> Result<()> {
    todo!("lab 5: write naive DDP")
}

/// Flattened: the same, with one all-reduce of all the gradients at once.
pub fn flattened(comm: &Communicator, grads: &mut [f32]) -> Result<()> {
    todo!("lab 5: write flattened DDP")
}

/// Bucketed and overlapped, as PyTorch's DDP: run backward yourself, and start each bucket's
/// all-reduce as soon as backward has finished every tensor in it, while backward goes on.
///
/// `backward.run(|done, grads| …)` runs backward a layer at a time, last layer first, calling
/// you after each with the tensors it just finished (`done`, indices into `tensors`) and the
/// gradients so far. `buckets[k].params` lists bucket k's tensors. `gather(bucket, tensors,
/// grads)` copies a bucket's gradients into one vector; `comm.all_reduce(what, values,
/// ReduceOp::Sum)` starts its all-reduce on the communication thread and returns at once with a
/// `Work`, whose `wait()?` gives the sums. After backward, wait for every bucket, divide by the
/// number of ranks, and put the means back with `scatter(bucket, tensors, &values,
/// backward.grads())`.
pub fn bucketed(
    comm: &AsyncComm,
    backward: &mut Backward<'_>,
    buckets: &[Bucket],
    tensors: &[Range<usize>],
) -> Result<()> {
    todo!("lab 5: write bucketed, overlapped DDP")
}
