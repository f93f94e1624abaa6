//! Lab 4 with a bug planted on purpose, to show that the checker catches it and says where: the
//! in-place all-gather stores each arriving block one place off (an off-by-one block); on 2
//! ranks "one off" is the right place, so it fails from 3 ranks on. Reduce-scatter is the
//! solution's.

use comm_core::{Buffer, Communicator, Element, Result};

pub use crate::solutions::lab4_rings::{reduce_scatter, reduce_scatter_into};

fn block(b: usize, n: usize, count: usize) -> std::ops::Range<usize> {
    (b % n) * count..(b % n + 1) * count
}

/// The solution, but the arriving block lands in block rank-s+1 instead of rank-s-1.
pub fn all_gather<T: Element>(comm: &Communicator, buf: &mut Buffer<T>) -> Result<()> {
    let (n, rank) = (comm.world_size(), comm.rank());
    let (next, prev, count) = ((rank + 1) % n, (rank + n - 1) % n, buf.len() / n);
    for s in 0..n - 1 {
        let out = block(rank + n - s, n, count);
        let into = block(rank + n - s + 1, n, count);
        let (out, into) = buf.parts(out, into)?;
        comm.send_recv(out, next, into, prev)?;
    }
    Ok(())
}

/// As the solution, around this file's all-gather.
pub fn all_gather_into<T: Element>(
    comm: &Communicator,
    send: &Buffer<T>,
    recv: &mut Buffer<T>,
) -> Result<()> {
    let (n, rank) = (comm.world_size(), comm.rank());
    comm.copy_local(send, recv.part_mut(block(rank, n, send.len()))?)?;
    all_gather(comm, recv)
}
