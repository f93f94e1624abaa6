//! Tree and chain: broadcast as a binomial tree (small) or a pipelined chain (large), each with
//! its [`Schedule`], and the binomial tree a small reduce takes towards its root.

use bytemuck::{cast_slice, cast_slice_mut};

use super::blocks::{absolute, relative, split_pair};
use super::choice::{broadcast_algo, Algo, SEGMENT_BYTES};
use super::schedule::{nothing, Schedule};
use crate::backend::cpu::transport::{CallScope, Transport};
use crate::collective::Collective;
use crate::dtype::{self, Element, ReduceOp};
use crate::error::{CommError, Result};
use crate::steps;
use crate::streaming::{copy, Stores};
use crate::trace;

/// The binomial-tree broadcast: ⌈log2 n⌉ rounds, each sending the whole buffer on.
pub const TREE_BROADCAST: Schedule = Schedule {
    collective: Collective::Broadcast,
    algo: Some(Algo::Tree),
    words: "tree: ⌈log2 n⌉ steps of s",
    steps: |_, n| tree_rounds(n),
    link_bytes: |s, n| tree_rounds(n as usize) as f64 * s,
    reduced_bytes: nothing,
};

/// The pipelined chain: k segments (of [`SEGMENT_BYTES`], or the whole buffer if shorter) passed
/// down a line of n ranks, the first arriving at the end after n−1 steps and one more after each
/// further step: n−2+k steps; a middle rank's link carries the buffer once, and the last n−2
/// segments wait behind the one in flight.
pub const CHAIN_BROADCAST: Schedule = Schedule {
    collective: Collective::Broadcast,
    algo: Some(Algo::Chain),
    words: "chain: n−2+k steps of a 1 MiB segment, k segments",
    steps: |bytes, n| (chain_segments(bytes) + n).saturating_sub(2),
    link_bytes: |s, n| s + (n - 2.0) * s.max(1.0).min(SEGMENT_BYTES as f64),
    reduced_bytes: nothing,
};

/// The tree's rounds on `n` ranks: ⌈log2 n⌉, the holders doubling every round.
fn tree_rounds(n: usize) -> usize {
    n.next_power_of_two().trailing_zeros() as usize
}

/// The chain's segments for a buffer of `bytes`: at least one, even for no bytes.
fn chain_segments(bytes: usize) -> usize {
    bytes.div_ceil(SEGMENT_BYTES).max(1)
}

/// Copies the root's `buf` to every rank: a binomial tree up to 4 MiB, a pipelined chain above
/// (the rule and its measurements: `choice.rs`), or the one `algo` names.
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
    let rounds = TREE_BROADCAST.steps(bytes.len(), n);
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
    let (len, segments) = (bytes.len(), chain_segments(bytes.len()));
    let segment = |k: usize| k * SEGMENT_BYTES..((k + 1) * SEGMENT_BYTES).min(len);
    let (next, prev) = (absolute(vr + 1, root, n), absolute(vr + n - 1, root, n));
    let rounds = CHAIN_BROADCAST.steps(len, n);
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
            crate::trace::name_track("forwarding thread");
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

fn thread_panicked() -> CommError {
    CommError::Peer("a communication thread panicked".into())
}

/// Binomial tree towards the root: in round k, ranks with bit k set hand their partial result to
/// the rank 2^k below and drop out.
pub(super) fn tree_reduce<T: Element>(
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
