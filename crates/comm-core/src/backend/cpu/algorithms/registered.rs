//! Collectives on registered buffers: where every rank shares one host and its buffers lie in
//! registered memory, a rank reads its peers' buffers where they lie (the transport's
//! [`Window`]) instead of exchanging messages. Every byte a rank receives is copied once, by
//! the rank that receives it; a reduction reads the peers' blocks in place. What Open MPI and
//! MPICH do over XPMEM, and NCCL over registered buffers (`ncclCommRegister`).
//!
//! Each call is a few phases between barriers, which the [`Schedule`]s below count as steps:
//! - all_gather: each rank copies every peer's block into its own buffer (1 step);
//! - broadcast: each rank copies the root's buffer (1 step);
//! - reduce_scatter: each rank reduces its own block, reading every rank's copy of it (1 step);
//! - all_reduce, large: that reduce-scatter, a barrier, then each copies every peer's reduced
//!   block (2 steps); small (up to [`WHOLE_BYTES`] in all): each rank reduces the whole buffer
//!   from every rank's (1 step; in place into scratch, copied back once no peer reads it).
//!
//! A phase writes only bytes no peer reads in it: in an in-place all-reduce, rank r writes its
//! block r while its peers read the other blocks of its buffer, and in the next phase writes
//! the other blocks while they read block r.

use bytemuck::{cast_slice, cast_slice_mut};

use super::blocks::{equal_blocks, nearly_equal_blocks};
use super::schedule::{nothing, Schedule};
use super::scratch::with_scratch;
use crate::backend::cpu::transport::{CallScope, Signature, Transport, WindowCall};
use crate::collective::{Checked, Collective};
use crate::dtype::{finish, reduce_into, reduce_pair, Element, ReduceOp};
use crate::error::Result;
use crate::streaming::{copy, Stores};
use crate::trace;

/// An all-reduce of up to this many bytes times the ranks has every rank reduce the whole
/// buffer itself (one phase); above it, each reduces its block (two phases, the reduction split
/// n ways). Measured: see [`choose`].
pub const WHOLE_BYTES: usize = 256 << 10;

/// Reductions go through a piece of scratch this long, which stays in the core's first cache.
const PIECE_BYTES: usize = 16 << 10;

// ANCHOR: schedules
/// The registered all-reduce of a large buffer: each rank reduces its block from every rank's
/// buffer, then copies every peer's reduced block.
pub const REGISTERED_ALL_REDUCE: Schedule = Schedule {
    collective: Collective::AllReduce,
    algo: None,
    words: "registered: 2 steps, reading (n−1)s/n twice",
    steps: |bytes, n| if bytes * n <= WHOLE_BYTES { 1 } else { 2 },
    link_bytes: |s, n| 2.0 * (n - 1.0) * s / n,
    reduced_bytes: |s, n| (n - 1.0) * s / n,
};

/// The registered all-gather: each rank copies the n−1 blocks of its peers.
pub const REGISTERED_ALL_GATHER: Schedule = Schedule {
    collective: Collective::AllGather,
    algo: None,
    words: "registered: 1 step, reading (n−1)s/n",
    steps: |_, _| 1,
    link_bytes: |s, n| (n - 1.0) * s / n,
    reduced_bytes: nothing,
};

/// The registered reduce-scatter: each rank reduces its block, reading the n−1 peers' copies.
pub const REGISTERED_REDUCE_SCATTER: Schedule = Schedule {
    collective: Collective::ReduceScatter,
    algo: None,
    words: "registered: 1 step, reading (n−1)s/n",
    steps: |_, _| 1,
    link_bytes: |s, n| (n - 1.0) * s / n,
    reduced_bytes: |s, n| (n - 1.0) * s / n,
};

/// The registered broadcast: every rank but the root copies the root's buffer.
pub const REGISTERED_BROADCAST: Schedule = Schedule {
    collective: Collective::Broadcast,
    algo: None,
    words: "registered: 1 step, reading s",
    steps: |_, _| 1,
    link_bytes: |s, _| s,
    reduced_bytes: nothing,
};
// ANCHOR_END: schedules

/// The registered algorithm of `collective`, if it has one. No `_`: a new collective does not
/// build until it is placed here.
pub(super) fn registered(collective: Collective) -> Option<&'static Schedule> {
    match collective {
        Collective::AllReduce => Some(&REGISTERED_ALL_REDUCE),
        Collective::AllGather => Some(&REGISTERED_ALL_GATHER),
        Collective::ReduceScatter => Some(&REGISTERED_REDUCE_SCATTER),
        Collective::Broadcast => Some(&REGISTERED_BROADCAST),
        Collective::Reduce
        | Collective::SendRecv
        | Collective::AllToAll
        | Collective::Gather
        | Collective::Scatter => None,
    }
}

/// What one rank runs a registered call on.
struct Registered<'a, T> {
    call: Box<dyn WindowCall + 'a>,
    rank: usize,
    n: usize,
    send: Option<&'a [T]>,
}

impl<T: Element> Registered<'_, T> {
    /// Rank `peer`'s input (its send buffer, or in place its one buffer), as elements.
    fn input(&self, peer: usize) -> &[T] {
        cast_slice(self.call.input(peer))
    }

    /// Rank `peer`'s receive buffer, as elements.
    fn output(&self, peer: usize) -> &[T] {
        cast_slice(self.call.output(peer))
    }

    /// The peers, each starting with the next rank (so that not every rank reads rank 0 first).
    fn peers(&self) -> impl Iterator<Item = usize> {
        let (rank, n) = (self.rank, self.n);
        (1..n).map(move |k| (rank + k) % n)
    }
}

/// Runs `checked` on this rank's `send` (`None` in place) and `recv` by reading the peers'
/// registered buffers, where the transport has a window on them and every rank's buffers are
/// registered: whether it did (`false`: nothing happened, and every rank takes the messages).
pub(super) fn run<T: Element>(
    t: &dyn Transport,
    checked: &Checked,
    send: Option<&[T]>,
    recv: &mut [T],
) -> Result<bool> {
    let collective = checked.call.collective;
    if registered(collective).is_none() {
        return Ok(false);
    }
    let Some(window) = t.window() else {
        return Ok(false);
    };
    let _call = CallScope::new(t);
    let signature = Signature::of::<T>(&checked.call, std::mem::size_of_val(recv));
    let Some(call) = window.open(signature, send.map(cast_slice), cast_slice(recv))? else {
        return Ok(false);
    };
    let on = Registered {
        call,
        rank: t.rank(),
        n: t.world_size(),
        send,
    };
    let (op, root) = (checked.call.op, checked.call.root);
    match collective {
        Collective::AllReduce => all_reduce(on, recv, op),
        Collective::AllGather => all_gather(on, recv),
        Collective::ReduceScatter => reduce_scatter(on, recv, op),
        Collective::Broadcast => broadcast(on, recv, root),
        Collective::Reduce
        | Collective::SendRecv
        | Collective::AllToAll
        | Collective::Gather
        | Collective::Scatter => unreachable!("{collective} has no registered algorithm"),
    }?;
    Ok(true)
}

/// Copies `from` (rank `peer`'s) into `to`, a "read" slice when tracing: the one copy.
fn read<T: Element>(stores: Stores, to: &mut [T], from: &[T]) {
    trace::timed(
        "read",
        "read a peer's buffer",
        std::mem::size_of_val(to),
        || copy(stores, cast_slice_mut(to), cast_slice(from)),
    )
}

/// `out = own op others[0] op others[1] …` (`own` `None`: `out` holds this rank's values
/// already), a piece at a time through scratch that stays in cache, so that every input is
/// read once and `out` written once, with `stores`.
fn reduce_all<T: Element>(
    op: ReduceOp,
    stores: Stores,
    out: &mut [T],
    own: Option<&[T]>,
    others: &[&[T]],
) {
    let _span = trace::Span::slice("reduce", "reduce the peers' blocks in place")
        .with_args(trace::Args::bytes(std::mem::size_of_val(out)));
    let piece = (PIECE_BYTES / std::mem::size_of::<T>()).max(1);
    let mut scratch = [0u64; PIECE_BYTES / 8];
    let scratch: &mut [T] = cast_slice_mut(&mut scratch[..]);
    let mut at = 0;
    while at < out.len() {
        let range = at..(at + piece).min(out.len());
        let acc = &mut scratch[..range.len()];
        let mine = own.map_or(&out[range.clone()], |own| &own[range.clone()]);
        reduce_pair(op, Stores::Cached, acc, mine, &others[0][range.clone()]);
        for other in &others[1..] {
            reduce_into(op, acc, &other[range.clone()]);
        }
        copy(
            stores,
            cast_slice_mut(&mut out[range.clone()]),
            cast_slice(acc),
        );
        at = range.end;
    }
}

/// Each rank copies every peer's block (their send, or block `peer` of their buffer).
fn all_gather<T: Element>(on: Registered<'_, T>, recv: &mut [T]) -> Result<()> {
    let blocks = equal_blocks(recv.len(), on.n);
    let stores = Stores::for_destination(std::mem::size_of_val(recv));
    if let Some(send) = on.send {
        trace::copying(std::mem::size_of_val(send), || {
            copy(
                stores,
                cast_slice_mut(&mut recv[blocks[on.rank].clone()]),
                cast_slice(send),
            )
        });
    }
    for peer in on.peers() {
        let block = blocks[peer].clone();
        let theirs = match on.call.in_place(peer) {
            true => &on.input(peer)[block.clone()],
            false => on.input(peer),
        };
        read(stores, &mut recv[block], theirs);
    }
    on.call.close()
}

/// Every rank but the root copies the root's input.
fn broadcast<T: Element>(on: Registered<'_, T>, recv: &mut [T], root: usize) -> Result<()> {
    let stores = Stores::for_destination(std::mem::size_of_val(recv));
    match (on.rank == root, on.send) {
        (false, _) => read(stores, recv, on.input(root)),
        (true, Some(send)) => trace::copying(std::mem::size_of_val(send), || {
            copy(stores, cast_slice_mut(recv), cast_slice(send))
        }),
        (true, None) => {}
    }
    on.call.close()
}

/// This rank's block of the reduction: its own input's block `rank` with every peer's.
fn reduce_scatter<T: Element>(on: Registered<'_, T>, recv: &mut [T], op: ReduceOp) -> Result<()> {
    let whole = on.send.map_or(recv.len(), <[T]>::len);
    let mine = equal_blocks(whole, on.n)[on.rank].clone();
    let stores = Stores::for_destination(std::mem::size_of_val(recv));
    let others: Vec<&[T]> = on.peers().map(|p| &on.input(p)[mine.clone()]).collect();
    let out = match on.send {
        Some(_) => &mut *recv,
        None => &mut recv[mine.clone()],
    };
    reduce_all(op, stores, out, on.send.map(|s| &s[mine.clone()]), &others);
    finish(op, out, on.n);
    on.call.close()
}

/// Large: each rank reduces its block, then copies the peers' reduced blocks; small: each
/// reduces the whole buffer.
fn all_reduce<T: Element>(on: Registered<'_, T>, recv: &mut [T], op: ReduceOp) -> Result<()> {
    let n = on.n;
    let stores = Stores::for_destination(std::mem::size_of_val(recv));
    if std::mem::size_of_val(recv) * n <= WHOLE_BYTES {
        return all_reduce_whole(on, recv, op);
    }
    let blocks = nearly_equal_blocks(recv.len(), n);
    let mine = blocks[on.rank].clone();
    let others: Vec<&[T]> = on.peers().map(|p| &on.input(p)[mine.clone()]).collect();
    let own = on.send.map(|s| &s[mine.clone()]);
    reduce_all(op, stores, &mut recv[mine.clone()], own, &others);
    finish(op, &mut recv[mine], n);
    on.call.fence()?;
    for peer in on.peers() {
        let block = blocks[peer].clone();
        read(stores, &mut recv[block.clone()], &on.output(peer)[block]);
    }
    on.call.close()
}

/// Every rank reduces the whole buffer from every rank's, in rank order (0 op 1 op … on every
/// rank: floating-point sums depend on the order, and every rank must end with the same bits);
/// in place into scratch, copied into `recv` once no peer reads it any more.
fn all_reduce_whole<T: Element>(on: Registered<'_, T>, recv: &mut [T], op: ReduceOp) -> Result<()> {
    let n = on.n;
    if let Some(send) = on.send {
        let inputs: Vec<&[T]> = (0..n)
            .map(|r| if r == on.rank { send } else { on.input(r) })
            .collect();
        reduce_all(op, Stores::Cached, recv, Some(inputs[0]), &inputs[1..]);
        finish(op, recv, n);
        return on.call.close();
    }
    with_scratch(recv.len(), move |sums: &mut [T]| {
        let own: &[T] = recv;
        let inputs: Vec<&[T]> = (0..n)
            .map(|r| if r == on.rank { own } else { on.input(r) })
            .collect();
        reduce_all(op, Stores::Cached, sums, Some(inputs[0]), &inputs[1..]);
        drop(inputs);
        on.call.close()?;
        recv.copy_from_slice(sums);
        finish(op, recv, n);
        Ok(())
    })
}
