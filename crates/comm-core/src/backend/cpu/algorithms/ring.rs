//! The ring: all_reduce (the direct exchange while little data moves), reduce_scatter and
//! all_gather, and the ring steps a large reduce reuses; each ring's [`Schedule`] above it.

use std::ops::Range;

use bytemuck::{cast_slice, cast_slice_mut};

use super::blocks::{equal_blocks, nearly_equal_blocks, split_pair, split_pair_mut};
use super::choice::{all_reduce_algo, Algo};
use super::direct::direct_all_reduce;
use super::schedule::{nothing, Schedule};
use super::scratch::with_scratch;
use crate::backend::cpu::transport::{CallScope, Transport};
use crate::collective::Collective;
use crate::dtype::{self, finish, reduce_pair, Element, ReduceOp};
use crate::error::Result;
use crate::steps;
use crate::streaming::{copy, Stores};
use crate::trace;

// ANCHOR: schedules
/// The ring all-reduce: a ring reduce-scatter, then a ring all-gather of the reduced blocks.
pub const RING_ALL_REDUCE: Schedule = Schedule {
    collective: Collective::AllReduce,
    algo: Some(Algo::Ring),
    words: "ring: 2(n−1) steps of s/n",
    steps: |bytes, n| RING_REDUCE_SCATTER.steps(bytes, n) + RING_ALL_GATHER.steps(bytes, n),
    link_bytes: |s, n| (RING_REDUCE_SCATTER.link_bytes)(s, n) + (RING_ALL_GATHER.link_bytes)(s, n),
    reduced_bytes: |s, n| (RING_REDUCE_SCATTER.reduced_bytes)(s, n),
};

/// The ring reduce-scatter: n−1 steps, in each of which every rank sends one block (s/n) to the
/// next rank and reduces the block that arrives from the previous one.
pub const RING_REDUCE_SCATTER: Schedule = Schedule {
    collective: Collective::ReduceScatter,
    algo: Some(Algo::Ring),
    words: "ring: n−1 steps of s/n",
    steps: |_, n| n.saturating_sub(1),
    link_bytes: |s, n| (n - 1.0) * (s / n),
    reduced_bytes: |s, n| (n - 1.0) * (s / n),
};

/// The ring all-gather: n−1 steps, in each of which every rank passes one block (s/n) on to
/// the next rank.
pub const RING_ALL_GATHER: Schedule = Schedule {
    collective: Collective::AllGather,
    algo: Some(Algo::Ring),
    words: "ring: n−1 steps of s/n",
    steps: |_, n| n.saturating_sub(1),
    link_bytes: |s, n| (n - 1.0) * (s / n),
    reduced_bytes: nothing,
};
// ANCHOR_END: schedules

/// Every rank ends with the reduction of all ranks' `buf`: the direct exchange while little
/// data moves, else ring reduce-scatter then ring all-gather ([`RING_ALL_REDUCE`]).
pub fn all_reduce<T: Element>(
    t: &dyn Transport,
    buf: &mut [T],
    op: ReduceOp,
    algo: Option<Algo>,
) -> Result<()> {
    let _call = CallScope::new(t);
    let n = t.world_size();
    if n == 1 {
        finish(op, buf, 1);
        return Ok(());
    }
    if all_reduce_algo(algo, std::mem::size_of_val(buf), n) == Algo::Direct {
        return direct_all_reduce(t, None, buf, op);
    }
    let blocks = nearly_equal_blocks(buf.len(), n);
    ring_reduce_scatter(t, Partials::InPlace(buf), op, &blocks)?;
    finish(op, &mut buf[blocks[t.rank()].clone()], n);
    ring_all_gather(t, buf, &blocks)
}

/// [`all_reduce`] reading `send` and writing `recv`: the ring keeps its partial sums in `recv`.
pub fn all_reduce_into<T: Element>(
    t: &dyn Transport,
    send: &[T],
    recv: &mut [T],
    op: ReduceOp,
    algo: Option<Algo>,
) -> Result<()> {
    let _call = CallScope::new(t);
    let n = t.world_size();
    if n == 1 {
        recv.copy_from_slice(send);
        return all_reduce(t, recv, op, algo);
    }
    if all_reduce_algo(algo, std::mem::size_of_val(send), n) == Algo::Direct {
        return direct_all_reduce(t, Some(send), recv, op);
    }
    let blocks = nearly_equal_blocks(send.len(), n);
    let partials = Partials::Beside {
        input: send,
        out: &mut *recv,
    };
    ring_reduce_scatter(t, partials, op, &blocks)?;
    finish(op, &mut recv[blocks[t.rank()].clone()], n);
    ring_all_gather(t, recv, &blocks)
}

// ANCHOR: ring
/// Where a ring reduce-scatter reads each rank's input and keeps its partial sums.
pub enum Partials<'a, T> {
    /// `buf` is the input and holds the partial sums: block by block it is overwritten.
    InPlace(&'a mut [T]),
    /// The partial sum of block b goes to block b of `out` (an out-of-place all-reduce).
    Beside {
        /// This rank's input, only read.
        input: &'a [T],
        /// As long as `input`.
        out: &'a mut [T],
    },
    /// Partial sums take turns between `out` and `spare`, so that the last one, this rank's
    /// block, lands in `out`.
    Alternating {
        /// This rank's input, only read.
        input: &'a [T],
        /// As long as the longest block.
        out: &'a mut [T],
        /// As long as the longest block.
        spare: &'a mut [T],
    },
}

impl<T: Element> Partials<'_, T> {
    /// The buffer the partial sums are in.
    fn sums(&self) -> &[T] {
        match self {
            Partials::InPlace(buf) => buf,
            Partials::Beside { out, .. } | Partials::Alternating { out, .. } => out,
        }
    }
}

/// Ring reduce-scatter over `blocks`: afterwards this rank's block (block `rank` of the buffer,
/// or the start of `out`) holds the reduction of every rank's block (without Avg's division).
/// Step s sends the block reduced at step s-1 to the next rank while the previous rank's block
/// arrives and is reduced in, piece by piece, as it comes.
pub fn ring_reduce_scatter<T: Element>(
    t: &dyn Transport,
    mut partials: Partials<'_, T>,
    op: ReduceOp,
    blocks: &[Range<usize>],
) -> Result<()> {
    let _call = CallScope::new(t);
    let (n, rank) = (t.world_size(), t.rank());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let whole = blocks.last().map_or(0, |b| b.end) * std::mem::size_of::<T>();
    let stores = Stores::for_destination(whole);
    let total = RING_REDUCE_SCATTER.steps(whole, n);
    for step in 0..total {
        let send_block = blocks[(rank + 2 * n - step - 1) % n].clone();
        let recv_block = blocks[(rank + 2 * n - step - 2) % n].clone();
        match &mut partials {
            Partials::InPlace(buf) => {
                let (outgoing, acc) = split_pair(buf, send_block, recv_block);
                reduce_step(t, (next, outgoing), prev, None, acc, (op, stores))?;
            }
            Partials::Beside { input, out } => {
                let own = &input[recv_block.clone()];
                let (outgoing, acc) = match step {
                    0 => (&input[send_block], &mut out[recv_block]),
                    _ => split_pair(out, send_block, recv_block),
                };
                reduce_step(t, (next, outgoing), prev, Some(own), acc, (op, stores))?;
            }
            Partials::Alternating { input, out, spare } => {
                let own = &input[recv_block.clone()];
                // The last step (n - 2) writes `out`; each earlier one the other buffer.
                let (last, acc) = match (n - 2 - step) % 2 {
                    0 => (&**spare, &mut **out),
                    _ => (&**out, &mut **spare),
                };
                let outgoing = match step {
                    0 => &input[send_block],
                    _ => &last[..send_block.len()],
                };
                let acc = &mut acc[..recv_block.len()];
                reduce_step(t, (next, outgoing), prev, Some(own), acc, (op, stores))?;
            }
        }
        let title = || {
            format!(
                "reduce-scatter, step {} of {total}: each rank sent one block to the next and \
                 added the block it got",
                step + 1,
            )
        };
        steps::after(title, cast_slice(partials.sums()))?;
    }
    Ok(())
}

/// One ring step: `outgoing` goes to the next rank while a block as long as `acc` arrives from
/// `prev`; each arriving piece is reduced into `acc` (with `own`, this rank's input, when
/// `acc` does not hold it already, written with `stores`).
fn reduce_step<T: Element>(
    t: &dyn Transport,
    (next, outgoing): (usize, &[T]),
    prev: usize,
    own: Option<&[T]>,
    acc: &mut [T],
    (op, stores): (ReduceOp, Stores),
) -> Result<()> {
    let size = std::mem::size_of::<T>();
    let len = std::mem::size_of_val(acc);
    t.send_recv_with(
        next,
        cast_slice(outgoing),
        prev,
        len,
        &mut |offset, piece| {
            let args = crate::trace::Args::bytes(piece.len());
            let _reduce = crate::trace::Span::slice("reduce", "reduce a piece").with_args(args);
            let piece: &[T] = cast_slice(piece);
            let at = offset / size..offset / size + piece.len();
            match own {
                Some(own) => reduce_pair(op, stores, &mut acc[at.clone()], &own[at], piece),
                None => dtype::reduce_into(op, &mut acc[at], piece),
            }
        },
    )
}

/// Ring all-gather over `blocks`, block `rank` being this rank's: in n-1 steps every block goes
/// once around the ring.
pub fn ring_all_gather<T: Element>(
    t: &dyn Transport,
    buf: &mut [T],
    blocks: &[Range<usize>],
) -> Result<()> {
    let _call = CallScope::new(t);
    ring_all_gather_steps(t, buf, blocks, 0)
}

/// [`ring_all_gather`] from step `first` on.
fn ring_all_gather_steps<T: Element>(
    t: &dyn Transport,
    buf: &mut [T],
    blocks: &[Range<usize>],
    first: usize,
) -> Result<()> {
    let (n, rank) = (t.world_size(), t.rank());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let total = RING_ALL_GATHER.steps(std::mem::size_of_val(buf), n);
    for step in first..total {
        let send_block = blocks[(rank + n - step) % n].clone();
        let recv_block = blocks[(rank + 2 * n - step - 1) % n].clone();
        let (outgoing, incoming) = split_pair(buf, send_block, recv_block);
        t.send_recv(next, cast_slice(outgoing), prev, cast_slice_mut(incoming))?;
        // Step 1 sends the rank's own block (in an all-reduce, the one it finished summing);
        // every later step passes on the block that arrived in the step before.
        let title = || match step {
            0 => format!("all-gather, step 1 of {total}: each rank sent its own block to the next"),
            _ => format!(
                "all-gather, step {} of {total}: each rank sent the block it got in step {step} \
                 to the next",
                step + 1,
            ),
        };
        steps::after(title, cast_slice(buf))?;
    }
    Ok(())
}
// ANCHOR_END: ring

/// `buf` holds n equal blocks; afterwards block `rank` holds their reduction over all ranks.
pub fn reduce_scatter<T: Element>(t: &dyn Transport, buf: &mut [T], op: ReduceOp) -> Result<()> {
    let _call = CallScope::new(t);
    let n = t.world_size();
    let blocks = equal_blocks(buf.len(), n);
    if n > 1 {
        ring_reduce_scatter(t, Partials::InPlace(buf), op, &blocks)?;
    }
    finish(op, &mut buf[blocks[t.rank()].clone()], n);
    Ok(())
}

/// `send` holds n blocks as long as `recv`; their reduction over all ranks of block `rank`
/// lands in `recv`. Partial sums take turns between `recv` and one block of scratch.
pub fn reduce_scatter_into<T: Element>(
    t: &dyn Transport,
    send: &[T],
    recv: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    let _call = CallScope::new(t);
    let (n, rank) = (t.world_size(), t.rank());
    let blocks = equal_blocks(send.len(), n);
    if n == 1 {
        recv.copy_from_slice(send);
    } else if steps::watched() {
        // Watched, the partial sums build up in a whole copy of `send`, each step shown.
        let mut sums = send.to_vec();
        ring_reduce_scatter(t, Partials::InPlace(&mut sums), op, &blocks)?;
        recv.copy_from_slice(&sums[blocks[rank].clone()]);
    } else {
        // Two ranks take one step, straight into `recv`: no partial sum needs a spare.
        let spare_len = if n > 2 { recv.len() } else { 0 };
        with_scratch(spare_len, |spare: &mut [T]| {
            let partials = Partials::Alternating {
                input: send,
                out: &mut *recv,
                spare,
            };
            ring_reduce_scatter(t, partials, op, &blocks)
        })?;
    }
    debug_assert_eq!(blocks[rank].len(), recv.len());
    finish(op, recv, n);
    Ok(())
}

/// `buf` holds n equal blocks, this rank's at block `rank`; afterwards every block is filled.
pub fn all_gather<T: Element>(t: &dyn Transport, buf: &mut [T]) -> Result<()> {
    let _call = CallScope::new(t);
    let n = t.world_size();
    let blocks = equal_blocks(buf.len(), n);
    if n > 1 {
        ring_all_gather(t, buf, &blocks)?;
    }
    Ok(())
}

/// `recv` (n blocks as long as `send`) gets every rank's `send`, in rank order. The ring's first
/// step sends `send` itself, and as each piece of the previous rank's block arrives it copies
/// the same piece of `send` into this rank's block, just after sending it (still in cache):
/// one read of `send` instead of a copy first and a second read to send it.
pub fn all_gather_into<T: Element>(t: &dyn Transport, send: &[T], recv: &mut [T]) -> Result<()> {
    let _call = CallScope::new(t);
    let (n, rank) = (t.world_size(), t.rank());
    let blocks = equal_blocks(recv.len(), n);
    assert_eq!(
        blocks[rank].len(),
        send.len(),
        "all_gather_into: recv is not n sends"
    );
    let stores = Stores::for_destination(std::mem::size_of_val(recv));
    if n == 1 || steps::watched() {
        // Watched, the first step is shown like the others: the copy comes first.
        copy(
            stores,
            cast_slice_mut(&mut recv[blocks[rank].clone()]),
            cast_slice(send),
        );
        return ring_all_gather_steps(t, recv, &blocks, 0);
    }
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let (own, incoming) = split_pair_mut(recv, blocks[rank].clone(), blocks[prev].clone());
    let (own, incoming): (&mut [u8], &mut [u8]) = (cast_slice_mut(own), cast_slice_mut(incoming));
    let send_bytes: &[u8] = cast_slice(send);
    t.send_recv_with(next, send_bytes, prev, incoming.len(), &mut |at, piece| {
        let range = at..at + piece.len();
        copy(stores, &mut incoming[range.clone()], piece);
        trace::copying(range.len(), || {
            copy(stores, &mut own[range.clone()], &send_bytes[range])
        });
    })?;
    ring_all_gather_steps(t, recv, &blocks, 1)
}
