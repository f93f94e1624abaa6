//! The ring all-reduce as a lesson: the idea on one page, written with the public API
//! ([`Communicator::send_recv`]) so that it runs on either backend. The CPU backend's own ring
//! (`backend/cpu/algorithms/ring.rs`, [`Communicator::all_reduce`]) is the same schedule with the
//! engineering added: pieces that overlap sending and adding, partial sums kept out of place,
//! reductions read straight from the transport's slots. `tests/ring_lesson.rs` checks that the
//! two give the same sums.

use crate::comm::Communicator;
use crate::error::Result;

// ANCHOR: ring_lesson
/// Sums `data` over all ranks, in place, as a ring does: cut it into n blocks; n-1 steps of
/// reduce-scatter (send one block to the next rank, add the block that arrives from the
/// previous one), after which rank r holds the whole sum of block r; then n-1 steps of
/// all-gather (pass the finished blocks on, keep the one that arrives). The blocks go where
/// `--steps` shows the CPU backend's ring putting them.
pub fn ring_all_reduce(comm: &Communicator, data: &mut [f32]) -> Result<()> {
    let (n, rank, len) = (comm.world_size(), comm.rank(), data.len());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    // Block b: `chunk` elements from b·chunk (the last ones shorter, or empty).
    let chunk = len.div_ceil(n);
    let block = |b: usize| ((b % n) * chunk).min(len)..((b % n + 1) * chunk).min(len);
    // One step: block `out` goes to the next rank while block `into` comes from the previous
    // one; every step moves `chunk` elements (send_recv's two sides have one length).
    let step = |data: &[f32], out: usize, into: usize| -> Result<Vec<f32>> {
        let mut outgoing = data[block(out)].to_vec();
        outgoing.resize(chunk, 0.0);
        let mut incoming = comm.buffer(&vec![0.0f32; chunk])?;
        comm.send_recv(&comm.buffer(&outgoing)?, next, &mut incoming, prev)?;
        let mut arrived = comm.to_host(&incoming)?;
        arrived.truncate(block(into).len());
        Ok(arrived)
    };
    for s in 1..n {
        // Reduce-scatter, step s: send block rank-s, add into block rank-s-1.
        let arrived = step(data, rank + n - s, rank + 2 * n - s - 1)?;
        for (mine, theirs) in data[block(rank + 2 * n - s - 1)].iter_mut().zip(arrived) {
            *mine += theirs;
        }
    }
    for s in 1..n {
        // All-gather, step s: send the finished block rank+1-s, keep block rank-s.
        let arrived = step(data, rank + 1 + n - s, rank + n - s)?;
        data[block(rank + n - s)].copy_from_slice(&arrived);
    }
    Ok(())
}
// ANCHOR_END: ring_lesson
