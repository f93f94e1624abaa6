//! The direct all-reduce: every rank sends its whole buffer to every other, and its
//! [`Schedule`].

use bytemuck::{cast_slice, cast_slice_mut};

use super::blocks::split_pair;
use super::choice::Algo;
use super::schedule::Schedule;
use super::scratch::with_scratch;
use crate::backend::cpu::transport::Transport;
use crate::collective::Collective;
use crate::dtype::{self, finish, Element, ReduceOp};
use crate::error::Result;
use crate::steps;
use crate::trace;

/// The direct all-reduce: n−1 exchanges of the whole buffer (to rank+1 while from rank−1, then
/// +2 and −2, …), its two local copies (into the scratch and out, each counted as half a
/// transfer: a copy in and a copy out), n−1 reductions of it. `--steps` shows the exchange as one
/// step: the buffers arrive in scratch, and the sum appears at the end.
pub const DIRECT_ALL_REDUCE: Schedule = Schedule {
    collective: Collective::AllReduce,
    algo: Some(Algo::Direct),
    words: "direct: n−1 steps of s",
    steps: |_, n| n.saturating_sub(1),
    link_bytes: |s, n| (n - 1.0) * s + s,
    reduced_bytes: |s, n| (n - 1.0) * s,
};

/// Every rank sends its input (`send`, or in place `recv`) to every other, then reduces all n in
/// rank order into `recv` (identical bits everywhere). The n inputs sit in the thread's scratch:
/// no allocation per call, whose pages the allocator would hand back and fault in again.
pub(super) fn direct_all_reduce<T: Element>(
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
        for step in 1..=DIRECT_ALL_REDUCE.steps(std::mem::size_of_val(recv), n) {
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
