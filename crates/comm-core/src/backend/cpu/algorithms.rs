//! The classic collective algorithms, CPU-mediated as Gloo runs them, over any [`Transport`].
//! Each works in place on one host slice, or out of place reading `send` and writing `recv`
//! directly (`_into`), never copying the whole input to a scratch buffer first.
//!
//! - broadcast: a binomial tree for small messages (⌈log2 n⌉ rounds, farthest first: the root
//!   sends half the world away, then every holder half as far each round), a pipelined chain
//!   for large ones (each rank forwards a segment while receiving the next, so time ≈ bytes /
//!   bandwidth).
//! - all_reduce: small messages go straight to every peer and each rank reduces all n buffers in
//!   rank order (one round, identical bits everywhere); large ones take the ring: reduce-scatter,
//!   then all-gather, each n-1 steps moving 1/n of the buffer, so every link carries
//!   2(n-1)/n × bytes — the factor in nccl-tests' busbw.
//! - reduce_scatter and all_gather: the two halves of that ring.
//! - reduce: a binomial tree for small messages; ring reduce-scatter then a gather for large.
//! - all_to_all: a pairwise exchange: in step s every rank sends to rank+s while it receives
//!   from rank-s, so each link carries one block at a time and no rank waits on a busy peer.
//!
//! Each public function is one call with one deadline ([`CallScope`]): all its steps together
//! must finish within the transport's timeout.

use std::ops::Range;

use bytemuck::{cast_slice, cast_slice_mut};

use super::transport::{CallScope, Transport, PIECE_BYTES};
use crate::collective::{Call, Checked, Collective};
use crate::dtype::{self, finish, reduce_pair, Element, ReduceOp};
use crate::error::{CommError, Result};
use crate::steps;
use crate::streaming::{copy, Stores};
use crate::trace;

/// Up to this many bytes, latency matters more than bandwidth.
const SMALL_BYTES: usize = 64 << 10;
/// The all_reduce direct exchange sends the whole buffer to each peer; up to this many bytes in all.
const DIRECT_ALL_REDUCE_BYTES: usize = 256 << 10;
/// Pipeline piece: large enough to amortize a message, small enough to overlap reduce and transfer.
const SEGMENT_BYTES: usize = PIECE_BYTES;

/// Block `i` of `n` nearly equal blocks of `len` elements (sizes differ by at most one).
pub fn block(len: usize, n: usize, i: usize) -> Range<usize> {
    i * len / n..(i + 1) * len / n
}

/// `(&buf[a], &mut buf[b])` for two ranges that do not overlap.
fn split_pair<T>(buf: &mut [T], a: Range<usize>, b: Range<usize>) -> (&[T], &mut [T]) {
    let (a, b) = split_pair_mut(buf, a, b);
    (a, b)
}

/// `(&mut buf[a], &mut buf[b])` for two ranges that do not overlap.
fn split_pair_mut<T>(buf: &mut [T], a: Range<usize>, b: Range<usize>) -> (&mut [T], &mut [T]) {
    if a.start >= b.end {
        let (low, high) = buf.split_at_mut(a.start);
        (&mut high[..a.len()], &mut low[b])
    } else {
        assert!(a.end <= b.start, "overlapping blocks {a:?} and {b:?}");
        let (low, high) = buf.split_at_mut(b.start);
        (&mut low[a], &mut high[..b.len()])
    }
}

fn thread_panicked() -> CommError {
    CommError::Peer("a communication thread panicked".into())
}

/// Rank relative to the root, and back.
fn relative(rank: usize, root: usize, n: usize) -> usize {
    (rank + n - root) % n
}
fn absolute(vrank: usize, root: usize, n: usize) -> usize {
    (vrank + root) % n
}

/// A CPU algorithm chosen by name (`--algo`), as `NCCL_ALGO` chooses NCCL's. A collective that
/// has no algorithm of that name, or no choice given, picks by size as it always does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Algo {
    /// all_reduce: a reduce-scatter then an all-gather around the ring, 2(n-1) steps each
    /// moving 1/n of the buffer (chosen above 256 KiB).
    Ring,
    /// all_reduce: every rank sends its whole buffer to every other and reduces all n, one step
    /// (chosen up to 256 KiB).
    Direct,
    /// broadcast: a binomial tree, log2(n) rounds of whole buffers (chosen up to 64 KiB).
    Tree,
    /// broadcast: a pipelined chain, each rank forwarding a segment while the next arrives
    /// (chosen above 64 KiB).
    Chain,
}

impl Algo {
    /// The name `--algo` takes.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Direct => "direct",
            Algo::Tree => "tree",
            Algo::Chain => "chain",
        }
    }
}

/// The algorithm the CPU backend runs for `collective` on `bytes` (the call's size, as the
/// table counts it) and `n` ranks, given `--algo` (`asked`): the same rule the calls follow,
/// for what explains their times (comm-bench's model). `None` where a collective has no named
/// algorithm.
pub fn chosen(collective: Collective, bytes: usize, n: usize, asked: Option<Algo>) -> Option<Algo> {
    match collective {
        Collective::AllReduce => Some(all_reduce_algo(asked, bytes, n.max(1))),
        Collective::Broadcast => Some(broadcast_algo(asked, bytes)),
        Collective::AllGather | Collective::ReduceScatter => Some(Algo::Ring),
        _ => None,
    }
}

/// The pipelined chain's segment: a broadcast above [`SMALL_BYTES`] moves in pieces this long.
pub const CHAIN_SEGMENT_BYTES: usize = SEGMENT_BYTES;

/// Runs one checked call of the collective table on this rank's host slices (`send` `None`: in
/// place, `recv` is the one buffer), with the algorithm `algo` names where it names one of the
/// collective's: the CPU backend's one dispatch.
pub fn run<T: Element>(
    t: &dyn Transport,
    checked: &Checked,
    send: Option<&[T]>,
    recv: &mut [T],
    algo: Option<Algo>,
) -> Result<()> {
    let Call { op, root, .. } = checked.call;
    let count = checked.counts.count;
    match (checked.call.collective, send) {
        (Collective::AllReduce, None) => all_reduce(t, recv, op, algo),
        (Collective::AllReduce, Some(send)) => all_reduce_into(t, send, recv, op, algo),
        (Collective::AllGather, None) => all_gather(t, recv),
        (Collective::AllGather, Some(send)) => all_gather_into(t, send, recv),
        (Collective::ReduceScatter, None) => reduce_scatter(t, recv, op),
        (Collective::ReduceScatter, Some(send)) => reduce_scatter_into(t, send, recv, op),
        (Collective::Broadcast, None) => broadcast(t, recv, root, algo),
        (Collective::Broadcast, Some(send)) => broadcast_into(t, send, recv, root, algo),
        (Collective::Reduce, None) => reduce(t, recv, op, root),
        (Collective::Reduce, Some(send)) => reduce_into(t, send, recv, op, root),
        (Collective::SendRecv, Some(send)) => {
            let (to, from) = checked.call.exchange_peers(t.rank(), t.world_size());
            t.send_recv(to, cast_slice(send), from, cast_slice_mut(recv))
        }
        (Collective::AllToAll, Some(send)) => all_to_all(t, send, recv, count),
        (Collective::Gather, send) => gather(t, send, recv, root, count),
        (Collective::Scatter, send) => scatter(t, send, recv, root, count),
        (c, None) => Err(CommError::Usage(format!("{c} has no in-place form"))),
    }
}

/// Copies the root's `buf` to every rank: a binomial tree for small messages, a pipelined
/// chain for large ones, or the one `algo` names.
pub fn broadcast<T: Element>(
    t: &dyn Transport,
    buf: &mut [T],
    root: usize,
    algo: Option<Algo>,
) -> Result<()> {
    let _call = CallScope::new(t);
    let bytes: &mut [u8] = cast_slice_mut(buf);
    match (t.world_size(), broadcast_algo(algo, bytes.len())) {
        (1, _) => Ok(()),
        (_, Algo::Tree) => tree_broadcast(t, bytes, root),
        _ if steps::watched() => chain_broadcast_in_rounds(t, bytes, root),
        _ => chain_broadcast(t, bytes, root),
    }
}

/// The broadcast algorithm that runs: `algo` if it is one, else by size.
fn broadcast_algo(algo: Option<Algo>, bytes: usize) -> Algo {
    match algo {
        Some(chosen @ (Algo::Tree | Algo::Chain)) => chosen,
        _ if bytes <= SMALL_BYTES => Algo::Tree,
        _ => Algo::Chain,
    }
}

/// [`broadcast`] from the root's `send` into every rank's `recv`. The root of a long buffer
/// copies each segment into its own `recv` just after sending it, while the segment is still in
/// cache, instead of copying the whole buffer first.
pub fn broadcast_into<T: Element>(
    t: &dyn Transport,
    send: &[T],
    recv: &mut [T],
    root: usize,
    algo: Option<Algo>,
) -> Result<()> {
    let _call = CallScope::new(t);
    let n = t.world_size();
    if t.rank() != root {
        return broadcast(t, recv, root, algo);
    }
    let tree = broadcast_algo(algo, std::mem::size_of_val(send)) == Algo::Tree;
    if n == 1 || tree || steps::watched() {
        trace::copying(std::mem::size_of_val(send), || recv.copy_from_slice(send));
        return broadcast(t, recv, root, algo);
    }
    let segment = (SEGMENT_BYTES / std::mem::size_of::<T>()).max(1);
    let next = absolute(1, root, n);
    let stores = Stores::for_destination(std::mem::size_of_val(recv));
    for (from, to) in send.chunks(segment).zip(recv.chunks_mut(segment)) {
        t.send(next, cast_slice(from))?;
        trace::copying(std::mem::size_of_val(from), || {
            copy(stores, cast_slice_mut(to), cast_slice(from))
        });
    }
    Ok(())
}

/// Binomial tree, in ⌈log2 n⌉ rounds: in each, every rank that holds the buffer sends it half
/// as far as in the round before (the root first to the rank half the world away), so the ranks
/// that hold it double every round.
fn tree_broadcast(t: &dyn Transport, bytes: &mut [u8], root: usize) -> Result<()> {
    let (n, vr) = (t.world_size(), relative(t.rank(), root, t.world_size()));
    let rounds = n.next_power_of_two().trailing_zeros() as usize;
    for round in 0..rounds {
        let far = 1 << (rounds - 1 - round);
        // Ranks at multiples of 2·far hold the buffer; those at an odd multiple of far get it.
        match vr % (2 * far) {
            0 if vr + far < n => t.send(absolute(vr + far, root, n), bytes)?,
            r if r == far => t.recv(absolute(vr - far, root, n), bytes)?,
            _ => {}
        }
        steps::after(
            || {
                format!(
                    "tree broadcast, round {} of {rounds}: every rank that held the buffer sent \
                     it {far} rank{} further",
                    round + 1,
                    if far == 1 { "" } else { "s" }
                )
            },
            bytes,
        )?;
    }
    Ok(())
}

/// [`chain_broadcast`] in lock-step rounds, for watching it: in round r rank k passes segment
/// r-k to rank k+1 while segment r-k+1 arrives from rank k-1, the pipeline the chain runs, one
/// round at a time.
fn chain_broadcast_in_rounds(t: &dyn Transport, bytes: &mut [u8], root: usize) -> Result<()> {
    let (n, vr) = (t.world_size(), relative(t.rank(), root, t.world_size()));
    let segments = bytes.len().div_ceil(SEGMENT_BYTES).max(1);
    let len = bytes.len();
    let segment = |k: usize| k * SEGMENT_BYTES..((k + 1) * SEGMENT_BYTES).min(len);
    let (next, prev) = (absolute(vr + 1, root, n), absolute(vr + n - 1, root, n));
    let rounds = segments + n - 2;
    for round in 0..rounds {
        let outgoing = round
            .checked_sub(vr)
            .filter(|&k| k < segments && vr + 1 < n);
        let incoming = (round + 1)
            .checked_sub(vr)
            .filter(|&k| k < segments && vr > 0);
        match (outgoing, incoming) {
            (Some(out), Some(inc)) => {
                let (data, into) = split_pair(bytes, segment(out), segment(inc));
                t.send_recv(next, data, prev, into)?
            }
            (Some(out), None) => t.send(next, &bytes[segment(out)])?,
            (None, Some(inc)) => t.recv(prev, &mut bytes[segment(inc)])?,
            (None, None) => {}
        }
        steps::after(
            || {
                format!(
                    "chain broadcast, round {} of {rounds}: each rank passed the segment it had \
                     to the next",
                    round + 1
                )
            },
            bytes,
        )?;
    }
    Ok(())
}

/// Chain root → root+1 → …: each rank forwards segment k while it receives segment k+1.
fn chain_broadcast(t: &dyn Transport, bytes: &mut [u8], root: usize) -> Result<()> {
    let (n, vr) = (t.world_size(), relative(t.rank(), root, t.world_size()));
    let next = (vr + 1 < n).then(|| absolute(vr + 1, root, n));
    if vr == 0 {
        for segment in bytes.chunks(SEGMENT_BYTES) {
            t.send(next.unwrap(), segment)?;
        }
        return Ok(());
    }
    let prev = absolute(vr - 1, root, n);
    let Some(next) = next else {
        for segment in bytes.chunks_mut(SEGMENT_BYTES) {
            t.recv(prev, segment)?;
        }
        return Ok(());
    };
    std::thread::scope(|s| {
        let (ready, arrived) = crossbeam_channel::unbounded::<&[u8]>();
        let forwarder = s.spawn(move || -> Result<()> {
            for segment in arrived {
                t.send(next, segment)?;
            }
            Ok(())
        });
        let mut received = Ok(());
        for segment in bytes.chunks_mut(SEGMENT_BYTES) {
            received = t.recv(prev, segment);
            // A failed forwarder drops its end; its error is reported below.
            if received.is_err() || ready.send(&*segment).is_err() {
                break;
            }
        }
        drop(ready);
        let forwarded = forwarder.join().map_err(|_| thread_panicked())?;
        received.and(forwarded)
    })
}

/// Every rank ends with the reduction of all ranks' `buf`: the direct exchange while little
/// data moves, else ring reduce-scatter then ring all-gather.
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

/// The all_reduce algorithm that runs on `n` ranks: `algo` if it is one, else by size.
fn all_reduce_algo(algo: Option<Algo>, bytes: usize, n: usize) -> Algo {
    match algo {
        Some(chosen @ (Algo::Ring | Algo::Direct)) => chosen,
        _ if bytes * (n - 1) <= DIRECT_ALL_REDUCE_BYTES => Algo::Direct,
        _ => Algo::Ring,
    }
}

/// Every rank sends its input (`send`, or in place `recv`) to every other, then reduces all n in
/// rank order into `recv` (identical bits everywhere). The n inputs sit in the thread's scratch:
/// no allocation per call, whose pages the allocator would hand back and fault in again.
fn direct_all_reduce<T: Element>(
    t: &dyn Transport,
    send: Option<&[T]>,
    recv: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    let (n, rank, len) = (t.world_size(), t.rank(), recv.len());
    with_scratch(n * len, |all: &mut [T]| {
        let block = |r: usize| r * len..(r + 1) * len;
        trace::copying(std::mem::size_of_val(recv), || {
            all[block(rank)].copy_from_slice(send.unwrap_or(recv))
        });
        for step in 1..n {
            let (to, from) = ((rank + step) % n, (rank + n - step) % n);
            let (mine, theirs) = split_pair(all, block(rank), block(from));
            t.send_recv(to, cast_slice(mine), from, cast_slice_mut(theirs))?;
        }
        trace::copying(std::mem::size_of_val(recv), || {
            recv.copy_from_slice(&all[block(0)])
        });
        for r in 1..n {
            dtype::reduce_into(op, recv, &all[block(r)]);
        }
        finish(op, recv, n);
        steps::after(
            || {
                "direct all-reduce, step 1 of 1: every rank sent its whole buffer to every other \
                 and reduced all of them"
                    .into()
            },
            cast_slice(recv),
        )
    })
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
    for step in 0..n - 1 {
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
                "reduce-scatter, step {} of {}: each rank sent one block to the next and added \
                 the block it got",
                step + 1,
                n - 1
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
    let traced = crate::trace::on();
    t.send_recv_with(
        next,
        cast_slice(outgoing),
        prev,
        len,
        &mut |offset, piece| {
            let started = traced.then(crate::trace::now);
            let bytes = piece.len();
            let piece: &[T] = cast_slice(piece);
            let at = offset / size..offset / size + piece.len();
            match own {
                Some(own) => reduce_pair(op, stores, &mut acc[at.clone()], &own[at], piece),
                None => dtype::reduce_into(op, &mut acc[at], piece),
            }
            if let Some(start) = started {
                let args = crate::trace::Args::bytes(bytes);
                crate::trace::slice("reduce", "reduce a piece", start, args);
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
    for step in first..n - 1 {
        let send_block = blocks[(rank + n - step) % n].clone();
        let recv_block = blocks[(rank + 2 * n - step - 1) % n].clone();
        let (outgoing, incoming) = split_pair(buf, send_block, recv_block);
        t.send_recv(next, cast_slice(outgoing), prev, cast_slice_mut(incoming))?;
        let title = || {
            format!(
                "all-gather, step {} of {}: each rank sent the last block it completed to the next",
                step + 1,
                n - 1
            )
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

/// The n nearly equal [`block`]s of `len` elements.
fn nearly_equal_blocks(len: usize, n: usize) -> Vec<Range<usize>> {
    (0..n).map(|i| block(len, n, i)).collect()
}

/// n blocks of `len / n` elements.
fn equal_blocks(len: usize, n: usize) -> Vec<Range<usize>> {
    let count = len / n;
    (0..n).map(|i| i * count..(i + 1) * count).collect()
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

/// Reduces every rank's `buf` into the root's; other ranks' buffers are left as they were.
pub fn reduce<T: Element>(
    t: &dyn Transport,
    buf: &mut [T],
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    match t.rank() == root {
        true => reduce_at_root(t, ReduceInput::InPlace(buf), op),
        false => reduce_off_root(t, buf, op, root),
    }
}

/// [`reduce`] reading `send`; only the root's `recv` is written.
pub fn reduce_into<T: Element>(
    t: &dyn Transport,
    send: &[T],
    recv: &mut [T],
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    match t.rank() == root {
        true => reduce_at_root(t, ReduceInput::Beside { send, recv }, op),
        false => reduce_off_root(t, send, op, root),
    }
}

/// The root's buffers in a reduce.
enum ReduceInput<'a, T> {
    InPlace(&'a mut [T]),
    Beside { send: &'a [T], recv: &'a mut [T] },
}

/// The root's part: a binomial tree for small messages; for large ones ring reduce-scatter, then
/// every other rank hands the root its finished block.
fn reduce_at_root<T: Element>(
    t: &dyn Transport,
    input: ReduceInput<'_, T>,
    op: ReduceOp,
) -> Result<()> {
    let _call = CallScope::new(t);
    let (n, root) = (t.world_size(), t.rank());
    let (partials, acc) = match input {
        ReduceInput::InPlace(buf) => (None, buf),
        ReduceInput::Beside { send, recv } => (Some(send), recv),
    };
    if n == 1 || std::mem::size_of_val(acc) <= SMALL_BYTES {
        if let Some(send) = partials {
            acc.copy_from_slice(send);
        }
        tree_reduce(t, acc, op, root)?;
    } else {
        let blocks = nearly_equal_blocks(acc.len(), n);
        let ring = match partials {
            None => Partials::InPlace(&mut *acc),
            Some(send) => Partials::Beside {
                input: send,
                out: &mut *acc,
            },
        };
        ring_reduce_scatter(t, ring, op, &blocks)?;
        for (peer, range) in blocks.iter().enumerate().filter(|(p, _)| *p != root) {
            t.recv(peer, cast_slice_mut(&mut acc[range.clone()]))?;
        }
    }
    finish(op, acc, n);
    Ok(())
}

/// Every other rank's part: its input is only read. Small messages copy it for the tree; large
/// ones keep the ring's partial sums in two blocks of scratch.
fn reduce_off_root<T: Element>(
    t: &dyn Transport,
    input: &[T],
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    let _call = CallScope::new(t);
    let (n, rank) = (t.world_size(), t.rank());
    if std::mem::size_of_val(input) <= SMALL_BYTES {
        return tree_reduce(t, &mut input.to_vec(), op, root);
    }
    let blocks = nearly_equal_blocks(input.len(), n);
    let longest = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    with_scratch(2 * longest, |scratch: &mut [T]| {
        let (out, spare) = scratch.split_at_mut(longest);
        let partials = Partials::Alternating {
            input,
            out: &mut *out,
            spare,
        };
        ring_reduce_scatter(t, partials, op, &blocks)?;
        t.send(root, cast_slice(&out[..blocks[rank].len()]))
    })
}

thread_local! {
    /// Scratch kept between calls: a fresh buffer of a block's size per call would cost its
    /// page faults every time (tens of milliseconds for 50 MB), more than the reduction itself.
    static SCRATCH: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `body` with `len` elements of scratch (contents unspecified), reused by later calls on
/// this thread.
fn with_scratch<T: Element, R>(len: usize, body: impl FnOnce(&mut [T]) -> R) -> R {
    SCRATCH.with(|cell| {
        let mut words = cell.borrow_mut();
        let needed = (len * std::mem::size_of::<T>()).div_ceil(8);
        if words.len() < needed {
            words.resize(needed, 0);
        }
        let bytes: &mut [u8] = cast_slice_mut(&mut words[..needed]);
        let result = body(&mut cast_slice_mut(bytes)[..len]);
        // Kept up to a bound: a 1 GB call should not pin its scratch for the process's life.
        if words.len() * 8 > SCRATCH_KEPT_BYTES {
            *words = Vec::new();
        }
        result
    })
}

/// The most scratch kept between calls.
const SCRATCH_KEPT_BYTES: usize = 256 << 20;

/// Binomial tree towards the root: in round k, ranks with bit k set hand their partial result to
/// the rank 2^k below and drop out.
fn tree_reduce<T: Element>(
    t: &dyn Transport,
    acc: &mut [T],
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    let (n, vr) = (t.world_size(), relative(t.rank(), root, t.world_size()));
    let mut incoming = vec![T::default(); acc.len()];
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            return t.send(absolute(vr - mask, root, n), cast_slice(acc));
        }
        if vr + mask < n {
            t.recv(absolute(vr + mask, root, n), cast_slice_mut(&mut incoming))?;
            dtype::reduce_into(op, acc, &incoming);
        }
        mask <<= 1;
    }
    Ok(())
}

// ANCHOR: all_to_all
/// `send` and `recv` hold n blocks of `count`: block `j` of `send` goes to rank `j`, and block
/// `i` of `recv` comes from rank `i`.
pub fn all_to_all<T: Element>(
    t: &dyn Transport,
    send: &[T],
    recv: &mut [T],
    count: usize,
) -> Result<()> {
    let _call = CallScope::new(t);
    let (n, rank) = (t.world_size(), t.rank());
    let block = |i: usize| i * count..(i + 1) * count;
    trace::copying(std::mem::size_of_val(&send[block(rank)]), || {
        recv[block(rank)].copy_from_slice(&send[block(rank)])
    });
    for step in 1..n {
        let (to, from) = ((rank + step) % n, (rank + n - step) % n);
        t.send_recv(
            to,
            cast_slice(&send[block(to)]),
            from,
            cast_slice_mut(&mut recv[block(from)]),
        )?;
    }
    Ok(())
}
// ANCHOR_END: all_to_all

// ANCHOR: gather
/// The root's `recv` (n blocks of `count`) gets every rank's block in rank order: each rank sends its
/// block to the root, which receives them one after another, as Gloo's gather does. In place
/// (`send` `None`) a rank's block already sits at block `rank` of `recv`. Other ranks' `recv`
/// is left as it was.
pub fn gather<T: Element>(
    t: &dyn Transport,
    send: Option<&[T]>,
    recv: &mut [T],
    root: usize,
    count: usize,
) -> Result<()> {
    let _call = CallScope::new(t);
    let (n, rank) = (t.world_size(), t.rank());
    let block = |i: usize| i * count..(i + 1) * count;
    if rank != root {
        let mine = send.unwrap_or(&recv[block(rank)]);
        return t.send(root, cast_slice(mine));
    }
    if let Some(send) = send {
        trace::copying(std::mem::size_of_val(send), || {
            recv[block(rank)].copy_from_slice(send)
        });
    }
    for from in (0..n).filter(|&r| r != root) {
        t.recv(from, cast_slice_mut(&mut recv[block(from)]))?;
    }
    Ok(())
}
// ANCHOR_END: gather

/// Block `j` of the root's `send` (n blocks of `count`) lands in rank `j`'s `recv`: the root sends
/// them one after another, as Gloo's scatter does. In place (`send` `None`) `recv` is n blocks,
/// the root's input, and each rank's block lands at block `rank`.
pub fn scatter<T: Element>(
    t: &dyn Transport,
    send: Option<&[T]>,
    recv: &mut [T],
    root: usize,
    count: usize,
) -> Result<()> {
    let _call = CallScope::new(t);
    let (n, rank) = (t.world_size(), t.rank());
    let block = |i: usize| i * count..(i + 1) * count;
    if rank != root {
        let mine = match send {
            Some(_) => recv,
            None => &mut recv[block(rank)],
        };
        return t.recv(root, cast_slice_mut(mine));
    }
    let blocks: &[T] = send.unwrap_or(recv);
    for to in (0..n).filter(|&r| r != root) {
        t.send(to, cast_slice(&blocks[block(to)]))?;
    }
    if let Some(send) = send {
        trace::copying(std::mem::size_of_val(recv), || {
            recv.copy_from_slice(&send[block(rank)])
        });
    }
    Ok(())
}

/// Dissemination barrier: in round k each rank signals rank+2^k and hears from rank-2^k.
pub fn barrier(t: &dyn Transport) -> Result<()> {
    let _call = CallScope::new(t);
    let (n, rank) = (t.world_size(), t.rank());
    let mut distance = 1;
    while distance < n {
        t.send_recv(
            (rank + distance) % n,
            &[1],
            (rank + n - distance) % n,
            &mut [0],
        )?;
        distance <<= 1;
    }
    Ok(())
}
