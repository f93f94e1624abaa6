//! Lab 4's solution: all-gather and reduce-scatter as rings, in place and out of place.

use comm_core::{Buffer, Communicator, Element, ReduceOp, Result};

/// Block `b` (taken around the ring: any b) of n blocks of `count` elements.
fn block(b: usize, n: usize, count: usize) -> std::ops::Range<usize> {
    (b % n) * count..(b % n + 1) * count
}

/// In place: block `rank` holds this rank's data; afterwards block b holds rank b's.
pub fn all_gather<T: Element>(comm: &Communicator, buf: &mut Buffer<T>) -> Result<()> {
    let (n, rank) = (comm.world_size(), comm.rank());
    let (next, prev, count) = ((rank + 1) % n, (rank + n - 1) % n, buf.len() / n);
    for s in 0..n - 1 {
        // Step s: pass on block rank-s (this rank's own first, then the one that just came),
        // while block rank-s-1 arrives into its place.
        let out = block(rank + n - s, n, count);
        let into = block(rank + 2 * n - s - 1, n, count);
        let (out, into) = buf.parts(out, into)?;
        comm.send_recv(out, next, into, prev)?;
        comm.show_step(&format!("all-gather, step {} of {}", s + 1, n - 1), buf)?;
    }
    Ok(())
}

/// Out of place: this rank's block in its place in `recv`, then the in-place ring.
pub fn all_gather_into<T: Element>(
    comm: &Communicator,
    send: &Buffer<T>,
    recv: &mut Buffer<T>,
) -> Result<()> {
    let (n, rank) = (comm.world_size(), comm.rank());
    comm.copy_local(send, recv.part_mut(block(rank, n, send.len()))?)?;
    all_gather(comm, recv)
}

/// In place: afterwards block `rank` holds the sum of block `rank` over all ranks.
pub fn reduce_scatter<T: Element>(comm: &Communicator, buf: &mut Buffer<T>) -> Result<()> {
    let (n, rank) = (comm.world_size(), comm.rank());
    let (next, prev, count) = ((rank + 1) % n, (rank + n - 1) % n, buf.len() / n);
    let mut incoming = comm.zeros::<T>(count)?;
    for s in 1..n {
        // Step s: send the partial sum of block rank-s, add the arriving partial sum of block
        // rank-s-1 into ours. Block b's sum starts at rank b+1 and ends, whole, at rank b.
        let out = block(rank + n - s, n, count);
        let into = block(rank + 2 * n - s - 1, n, count);
        comm.send_recv(buf.part(out)?, next, &mut incoming, prev)?;
        comm.reduce_local(buf.part_mut(into)?, &incoming, ReduceOp::Sum)?;
        comm.show_step(&format!("reduce-scatter, step {s} of {}", n - 1), buf)?;
    }
    Ok(())
}

/// Out of place: the ring on a copy of `send`, then this rank's block into `recv`.
pub fn reduce_scatter_into<T: Element>(
    comm: &Communicator,
    send: &Buffer<T>,
    recv: &mut Buffer<T>,
) -> Result<()> {
    let (n, rank) = (comm.world_size(), comm.rank());
    let mut sums = comm.zeros::<T>(send.len())?;
    comm.copy_local(send, &mut sums)?;
    reduce_scatter(comm, &mut sums)?;
    comm.copy_local(sums.part(block(rank, n, recv.len()))?, recv)
}
