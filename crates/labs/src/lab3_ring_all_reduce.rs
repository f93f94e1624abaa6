//! Lab 3: the ring all-reduce, from `send_recv`. The page: docs/src/lab3-ring-all-reduce.md. Check it with
//! `cargo lab 3`.

use comm_core::{Buffer, Communicator, Element, ReduceOp, Result};

/// Sums `data` over all ranks, in place, as a ring does. Cut it into n blocks (n ranks; block
/// b is elements `b * len / n .. (b + 1) * len / n`, so some are empty when `data` is shorter
/// than n). Then n-1 steps of reduce-scatter: each rank sends one block to the next rank while
/// the block before it arrives from the previous rank, and adds it in. After them each rank
/// holds the whole sum of one block. Then n-1 steps of all-gather pass the finished blocks on.
/// Any rank count, any length.
///
/// Use only:
/// - `comm.rank()`, `comm.world_size()`, `data.len()`;
/// - `comm.send_recv(send, to, recv, from)?`, whose sides are parts of buffers, sent and
///   received where they lie: `data.part(range)?`, `incoming.part_mut(range)?`, or two parts of
///   one buffer at once, `data.parts(send_range, recv_range)?`;
/// - `comm.zeros::<T>(len)?`, a buffer of your own to receive into;
/// - `comm.reduce_local(into, from, ReduceOp::Sum)?`, which adds part `from` into part `into`;
/// - `comm.show_step("reduce-scatter, step 1", data)?` after each step (on every rank), to see
///   your steps with `cargo lab 3 --steps`.
pub fn ring_all_reduce<T: Element>(comm: &Communicator, data: &mut Buffer<T>) -> Result<()> {
    todo!("lab 3: write the ring all-reduce")
}
