//! Lab 3 with a bug planted on purpose, to show that the checker catches it and says where: the
//! reduce-scatter stops one step short (a missing step), so each rank's finished block lacks one
//! rank's share.

use comm_core::{Buffer, Communicator, Element, ReduceOp, Result};

/// The solution, but for the reduce-scatter's last step.
pub fn ring_all_reduce<T: Element>(comm: &Communicator, data: &mut Buffer<T>) -> Result<()> {
    let (n, rank, len) = (comm.world_size(), comm.rank(), data.len());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let block = |b: usize| (b % n) * len / n..(b % n + 1) * len / n;
    let mut incoming = comm.zeros::<T>(len.div_ceil(n))?;
    for s in 1..n - 1 {
        let (out, into) = (block(rank + n - s), block(rank + 2 * n - s - 1));
        let arrived = ..into.len();
        comm.send_recv(data.part(out)?, next, incoming.part_mut(arrived)?, prev)?;
        comm.reduce_local(data.part_mut(into)?, incoming.part(arrived)?, ReduceOp::Sum)?;
    }
    for s in 1..n {
        // The all-gather as in the solution: which block is finished depends on n-1 steps.
        let (out, into) = data.parts(block(rank + 1 + n - s), block(rank + n - s))?;
        comm.send_recv(out, next, into, prev)?;
    }
    Ok(())
}
