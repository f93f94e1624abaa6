//! Collectives with a root: reduce (a tree when small, the ring's reduce-scatter then a gather
//! when large), gather and scatter, each block straight to or from the root as Gloo does.

use bytemuck::{cast_slice, cast_slice_mut};

use super::blocks::nearly_equal_blocks;
use super::choice::SMALL_BYTES;
use super::ring::{ring_reduce_scatter, Partials};
use super::scratch::with_scratch;
use super::tree::tree_reduce;
use crate::backend::cpu::transport::{CallScope, Transport};
use crate::dtype::{finish, Element, ReduceOp};
use crate::error::Result;
use crate::trace;

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
