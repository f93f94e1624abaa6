//! Lab 5's solution: data-parallel training's gradient averaging three ways.

use std::ops::Range;

use comm_core::{AsyncComm, Communicator, ReduceOp, Result, Work};

use crate::ddp::{gather, scatter, Backward, Bucket};

/// Naive: one all-reduce per parameter tensor.
pub fn naive(comm: &Communicator, grads: &mut [f32], tensors: &[Range<usize>]) -> Result<()> {
    let n = comm.world_size() as f32;
    for tensor in tensors {
        let mut buf = comm.buffer(&grads[tensor.clone()])?;
        comm.all_reduce(&mut buf, ReduceOp::Sum)?;
        let sums = comm.to_host(&buf)?;
        for (g, sum) in grads[tensor.clone()].iter_mut().zip(sums) {
            *g = sum / n;
        }
    }
    Ok(())
}

/// Flattened: one all-reduce of every gradient.
pub fn flattened(comm: &Communicator, grads: &mut [f32]) -> Result<()> {
    let n = comm.world_size() as f32;
    let mut buf = comm.buffer(grads)?;
    comm.all_reduce(&mut buf, ReduceOp::Sum)?;
    for (g, sum) in grads.iter_mut().zip(comm.to_host(&buf)?) {
        *g = sum / n;
    }
    Ok(())
}

/// Bucketed and overlapped: each bucket's all-reduce starts as soon as backward finished it.
pub fn bucketed(
    comm: &AsyncComm,
    backward: &mut Backward<'_>,
    buckets: &[Bucket],
    tensors: &[Range<usize>],
) -> Result<()> {
    let mut finished = vec![false; tensors.len()];
    let mut started: Vec<Option<Work<Vec<f32>>>> = buckets.iter().map(|_| None).collect();
    backward.run(|done, grads| {
        done.iter().for_each(|&p| finished[p] = true);
        for (k, bucket) in buckets.iter().enumerate() {
            if started[k].is_none() && bucket.params.iter().all(|&p| finished[p]) {
                let values = gather(bucket, tensors, grads);
                started[k] = Some(comm.all_reduce(format!("bucket {k}"), values, ReduceOp::Sum));
            }
        }
    });
    let n = comm.world_size() as f32;
    for (bucket, work) in buckets.iter().zip(started) {
        let work = work.expect("backward finishes every tensor, so every bucket started");
        let means: Vec<f32> = work.wait()?.into_iter().map(|sum| sum / n).collect();
        scatter(bucket, tensors, &means, backward.grads());
    }
    Ok(())
}
