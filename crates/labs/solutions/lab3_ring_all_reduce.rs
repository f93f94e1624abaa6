//! Lab 3's solution: the ring all-reduce from `send_recv`, each block sent and received where
//! it lies. The CPU backend's own ring (`backend/cpu/algorithms/ring.rs`) is the same schedule
//! with the engineering added: pieces that overlap sending and adding, partial sums kept out of
//! place, reductions read straight from the transport's slots.

use comm_core::{Buffer, Communicator, Element, ReduceOp, Result};

// ANCHOR: ring
/// Sums `data` over all ranks, in place, as a ring does: n-1 steps of reduce-scatter (send one
/// block to the next rank, add the block that arrives from the previous one), after which rank
/// r holds the whole sum of block r, as `--steps` shows the CPU backend's ring; then n-1 steps of
/// all-gather (pass the finished blocks on, keep the one that arrives).
pub fn ring_all_reduce<T: Element>(comm: &Communicator, data: &mut Buffer<T>) -> Result<()> {
    let (n, rank, len) = (comm.world_size(), comm.rank(), data.len());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    // Block b of n nearly equal blocks (some empty when len < n).
    let block = |b: usize| (b % n) * len / n..(b % n + 1) * len / n;
    let mut incoming = comm.zeros::<T>(len.div_ceil(n))?;
    for s in 1..n {
        // Reduce-scatter, step s: send block rank-s, add the arriving block rank-s-1 into ours.
        let (out, into) = (block(rank + n - s), block(rank + 2 * n - s - 1));
        let arrived = ..into.len();
        comm.send_recv(data.part(out)?, next, incoming.part_mut(arrived)?, prev)?;
        comm.reduce_local(data.part_mut(into)?, incoming.part(arrived)?, ReduceOp::Sum)?;
        comm.show_step(&format!("reduce-scatter, step {s} of {}", n - 1), data)?;
    }
    for s in 1..n {
        // All-gather, step s: send the finished block rank+1-s, receive block rank-s in place.
        let (out, into) = data.parts(block(rank + 1 + n - s), block(rank + n - s))?;
        comm.send_recv(out, next, into, prev)?;
        comm.show_step(&format!("all-gather, step {s} of {}", n - 1), data)?;
    }
    Ok(())
}
// ANCHOR_END: ring
