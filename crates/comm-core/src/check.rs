//! Correctness checks any backend can run on itself: every collective, in place and out of
//! place, against a sequential reference. Used by the `collective-check` program (the GPU check
//! script runs it on NCCL) and by the test suite.
//!
//! Inputs are small whole numbers derived from (seed, rank), so every rank can compute every
//! other rank's input, and float sums and products are exact whatever order a ring adds in.

use crate::comm::Communicator;
use crate::dtype::{Element, ReduceOp};
use crate::error::Result;

/// Rank `rank`'s input: `len` small whole numbers (only ±1 and 2 for Prod, so products stay exact).
pub fn input<T: Element>(seed: u64, rank: usize, len: usize, op: ReduceOp) -> Vec<T> {
    let mut state = seed ^ (rank as u64 + 1).wrapping_mul(0x9e3779b97f4a7c15);
    (0..len)
        .map(|_| {
            // xorshift64*: cheap, deterministic, good enough for test data.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let r = state.wrapping_mul(0x2545f4914f6cdd1d) >> 33;
            match op {
                ReduceOp::Prod => T::from_i64([1, 2, -1][(r % 3) as usize]),
                _ => T::from_i64((r % 100) as i64 - 50),
            }
        })
        .collect()
}

/// The sequential reference: every rank's value folded in rank order, then Avg's division.
pub fn reference<T: Element>(inputs: &[Vec<T>], op: ReduceOp) -> Vec<T> {
    let mut acc = inputs[0].clone();
    for other in &inputs[1..] {
        for (a, &b) in acc.iter_mut().zip(other) {
            *a = T::combine(op, *a, b);
        }
    }
    crate::dtype::finish(op, &mut acc, inputs.len());
    acc
}

/// One check's verdict.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub name: String,
    /// Elements that differ from the reference on this rank.
    pub wrong: usize,
}

fn count_wrong<T: Element>(got: &[T], want: &[T]) -> usize {
    if got.len() != want.len() {
        return got.len().max(want.len());
    }
    got.iter().zip(want).filter(|(a, b)| a != b).count()
}

/// Runs every collective for element type `T` on `len` elements (per rank, or per block for
/// all_gather and reduce_scatter) and returns this rank's verdicts.
pub fn all_collectives<T: Element>(
    comm: &Communicator,
    len: usize,
    seed: u64,
) -> Result<Vec<Verdict>> {
    let (n, rank) = (comm.world_size(), comm.rank());
    let mut verdicts = Vec::new();
    let mut record = |name: String, wrong: usize| verdicts.push(Verdict { name, wrong });
    let dtype = T::DTYPE;
    let all = |op| {
        (0..n)
            .map(|r| input::<T>(seed, r, len, op))
            .collect::<Vec<_>>()
    };

    for op in ReduceOp::ALL {
        let inputs = all(op);
        let want = reference(&inputs, op);
        let mut buf = comm.buffer(&inputs[rank])?;
        comm.all_reduce(&mut buf, op)?;
        record(
            format!("all_reduce {op} {dtype} in-place"),
            count_wrong(&comm.to_host(&buf)?, &want),
        );
        let send = comm.buffer(&inputs[rank])?;
        let mut recv = comm.zeros::<T>(len)?;
        comm.all_reduce_into(&send, &mut recv, op)?;
        record(
            format!("all_reduce {op} {dtype} out-of-place"),
            count_wrong(&comm.to_host(&recv)?, &want),
        );

        let root = n - 1;
        let mut buf = comm.buffer(&inputs[rank])?;
        comm.reduce(&mut buf, op, root)?;
        let wrong = if rank == root {
            count_wrong(&comm.to_host(&buf)?, &want)
        } else {
            0
        };
        record(format!("reduce {op} {dtype} in-place"), wrong);
        let mut recv = comm.zeros::<T>(len)?;
        comm.reduce_into(&send, &mut recv, op, root)?;
        let wrong = if rank == root {
            count_wrong(&comm.to_host(&recv)?, &want)
        } else {
            0
        };
        record(format!("reduce {op} {dtype} out-of-place"), wrong);

        let blocks: Vec<Vec<T>> = (0..n)
            .map(|r| input::<T>(seed + 1, r, n * len, op))
            .collect();
        let want = reference(&blocks, op);
        let mine = &want[rank * len..(rank + 1) * len];
        let mut buf = comm.buffer(&blocks[rank])?;
        comm.reduce_scatter(&mut buf, op)?;
        let got = comm.to_host(&buf)?;
        record(
            format!("reduce_scatter {op} {dtype} in-place"),
            count_wrong(&got[rank * len..(rank + 1) * len], mine),
        );
        let send = comm.buffer(&blocks[rank])?;
        let mut recv = comm.zeros::<T>(len)?;
        comm.reduce_scatter_into(&send, &mut recv, op)?;
        record(
            format!("reduce_scatter {op} {dtype} out-of-place"),
            count_wrong(&comm.to_host(&recv)?, mine),
        );
    }

    let inputs = all(ReduceOp::Sum);
    let gathered: Vec<T> = inputs.concat();
    let mut staged = vec![T::default(); n * len];
    staged[rank * len..(rank + 1) * len].copy_from_slice(&inputs[rank]);
    let mut buf = comm.buffer(&staged)?;
    comm.all_gather(&mut buf)?;
    record(
        format!("all_gather {dtype} in-place"),
        count_wrong(&comm.to_host(&buf)?, &gathered),
    );
    let send = comm.buffer(&inputs[rank])?;
    let mut recv = comm.zeros::<T>(n * len)?;
    comm.all_gather_into(&send, &mut recv)?;
    record(
        format!("all_gather {dtype} out-of-place"),
        count_wrong(&comm.to_host(&recv)?, &gathered),
    );

    let root = 0;
    let mut buf = comm.buffer(&inputs[rank])?;
    comm.broadcast(&mut buf, root)?;
    record(
        format!("broadcast {dtype} in-place"),
        count_wrong(&comm.to_host(&buf)?, &inputs[root]),
    );
    let mut recv = comm.zeros::<T>(len)?;
    comm.broadcast_into(&send, &mut recv, root)?;
    record(
        format!("broadcast {dtype} out-of-place"),
        count_wrong(&comm.to_host(&recv)?, &inputs[root]),
    );

    if n > 1 {
        // Even ranks send first, odd ranks receive first: no cycle of waiting senders.
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        let mut recv = comm.zeros::<T>(len)?;
        if rank % 2 == 0 {
            comm.send(&send, next)?;
            comm.recv(&mut recv, prev)?;
        } else {
            comm.recv(&mut recv, prev)?;
            comm.send(&send, next)?;
        }
        record(
            format!("send/recv {dtype}"),
            count_wrong(&comm.to_host(&recv)?, &inputs[prev]),
        );
        // Both directions at once: every rank sends first, which only a grouped call allows.
        let mut recv = comm.zeros::<T>(len)?;
        comm.send_recv(&send, next, &mut recv, prev)?;
        record(
            format!("sendrecv {dtype}"),
            count_wrong(&comm.to_host(&recv)?, &inputs[prev]),
        );
    }
    comm.barrier()?;
    record(format!("barrier {dtype}"), 0);
    Ok(verdicts)
}
