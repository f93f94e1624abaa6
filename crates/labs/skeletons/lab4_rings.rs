//! Lab 4: all-gather and reduce-scatter as rings, in place and out of place, blocks in rank
//! order. The page: docs/src/lab4-rings.md. Check them with `cargo lab 4`.

use comm_core::{Buffer, Communicator, Element, ReduceOp, Result};

/// In place, as NCCL's in-place all-gather: `buf` holds n blocks of `buf.len() / n` elements,
/// this rank's own data in block `rank`. Afterwards every block `b` holds rank b's data, on
/// every rank. A ring: in each of n-1 steps, send a block to the next rank while the previous
/// rank's arrives, straight into its place (`buf.parts(send_range, recv_range)?`).
///
/// Use only `comm.rank()`, `comm.world_size()`, `comm.send_recv(..)?` with parts
/// (`buf.part(..)?`, `buf.part_mut(..)?`, `buf.parts(..)?`), `comm.zeros::<T>(len)?`,
/// `comm.copy_local(from, into)?`, `comm.reduce_local(into, from, ReduceOp::Sum)?` and
/// `comm.show_step(title, buf)?`.
pub fn all_gather<T: Element>(comm: &Communicator, buf: &mut Buffer<T>) -> Result<()> {
    todo!("lab 4: write the in-place all-gather")
}

/// Out of place: `send` holds this rank's block, `recv` room for n of them; afterwards `recv`
/// holds every rank's block in rank order, and `send` is unchanged. (Put your own block in its
/// place, and the in-place ring does the rest.)
pub fn all_gather_into<T: Element>(
    comm: &Communicator,
    send: &Buffer<T>,
    recv: &mut Buffer<T>,
) -> Result<()> {
    todo!("lab 4: write the out-of-place all-gather")
}

/// In place, as NCCL's in-place reduce-scatter: `buf` holds n blocks; afterwards block `rank`
/// holds the sum of block `rank` over all ranks (the other blocks may hold anything). A ring:
/// in each of n-1 steps, send a block's partial sum to the next rank while the previous rank's
/// arrives, and add it into your own partial sum of that block.
pub fn reduce_scatter<T: Element>(comm: &Communicator, buf: &mut Buffer<T>) -> Result<()> {
    todo!("lab 4: write the in-place reduce-scatter")
}

/// Out of place: `send` holds n blocks, `recv` room for one; afterwards `recv` holds the sum of
/// block `rank` over all ranks, and `send` is unchanged.
pub fn reduce_scatter_into<T: Element>(
    comm: &Communicator,
    send: &Buffer<T>,
    recv: &mut Buffer<T>,
) -> Result<()> {
    todo!("lab 4: write the out-of-place reduce-scatter")
}
