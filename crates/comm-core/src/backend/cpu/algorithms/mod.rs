//! The classic collective algorithms, CPU-mediated as Gloo runs them, over any
//! [`Transport`](super::Transport). Each works in place on one host slice, or out of place
//! reading `send` and writing `recv` directly (`_into`), never copying the whole input to a
//! scratch buffer first.
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
//! Each public function is one call with one deadline ([`CallScope`](super::CallScope)): all its
//! steps together must finish within the transport's timeout.
//!
//! One file per family, as Gloo keeps one per algorithm: [`ring`] (all_reduce's ring,
//! reduce_scatter, all_gather), [`direct`] (all_reduce's one-step exchange), [`tree`] (broadcast's
//! tree and chain, the small reduce's tree), [`rooted`] (reduce, gather, scatter), [`all_to_all`],
//! [`barrier`]. Beside a named algorithm's function, its [`Schedule`]: its steps and bytes, which
//! the function, `--steps` and comm-bench's model read; [`schedules`] lists each collective's.
//! [`choice`] picks by name or size, [`blocks`] and [`scratch`] serve them all.

mod all_to_all;
mod barrier;
mod blocks;
mod choice;
mod direct;
mod registered;
mod ring;
mod rooted;
mod schedule;
mod scratch;
mod tree;

use std::sync::OnceLock;

use bytemuck::{cast_slice, cast_slice_mut};

pub use all_to_all::all_to_all;
pub use barrier::barrier;
pub use blocks::block;
pub use choice::{chosen, Algo, CHAIN_SEGMENT_BYTES};
pub use registered::WHOLE_BYTES;
pub use ring::{
    all_gather, all_gather_into, all_reduce, all_reduce_into, reduce_scatter, reduce_scatter_into,
    ring_all_gather, ring_reduce_scatter, Partials,
};
pub use rooted::{gather, reduce, reduce_into, scatter};
pub use schedule::Schedule;
pub use tree::{broadcast, broadcast_into};

use direct::DIRECT_ALL_REDUCE;
use ring::{RING_ALL_GATHER, RING_ALL_REDUCE, RING_REDUCE_SCATTER};
use tree::{CHAIN_BROADCAST, TREE_BROADCAST};

use crate::backend::cpu::transport::Transport;
use crate::collective::{Call, Checked, Collective};
use crate::dtype::Element;
use crate::error::{CommError, Result};

/// Runs one checked call of the collective table on this rank's host slices (`send` `None`: in
/// place, `recv` is the one buffer), with the algorithm `algo` names where it names one of the
/// collective's: the CPU backend's one dispatch. No `_`: a new collective does not build until
/// it has an arm here.
pub fn run<T: Element>(
    t: &dyn Transport,
    checked: &Checked,
    send: Option<&[T]>,
    recv: &mut [T],
    algo: Option<Algo>,
) -> Result<()> {
    // Registered buffers on one host: the peers' buffers read where they lie, unless an
    // algorithm was named or the steps are shown (both the same on every rank).
    if algo.is_none() && !crate::steps::watched() && registered::run(t, checked, send, recv)? {
        return Ok(());
    }
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
        // `Call::check` lets no in-place call of these through; said again rather than trusted.
        (c @ (Collective::SendRecv | Collective::AllToAll), None) => {
            Err(CommError::Usage(format!("{c} has no in-place form")))
        }
    }
}

/// `collective`'s named algorithms, each described ([`Schedule`]) beside the function that runs
/// it: the algorithms `--algo` can name for it and comm-bench's model counts, in the order a
/// refused `--algo` lists them. No `_`: a new collective does not build until it is placed here.
pub fn schedules(collective: Collective) -> &'static [Schedule] {
    match collective {
        Collective::AllReduce => &[RING_ALL_REDUCE, DIRECT_ALL_REDUCE],
        Collective::AllGather => &[RING_ALL_GATHER],
        Collective::ReduceScatter => &[RING_REDUCE_SCATTER],
        Collective::Broadcast => &[TREE_BROADCAST, CHAIN_BROADCAST],
        // Each runs as its function says, with no name to choose by and no description yet:
        // `comm-bench model` skips them.
        Collective::Reduce
        | Collective::SendRecv
        | Collective::AllToAll
        | Collective::Gather
        | Collective::Scatter => &[],
    }
}

/// The algorithms `--algo` can name for `collective`: its [`schedules`]' names. A program
/// refuses any other at launch (`settings::algo_flag`).
pub fn algos_of(collective: Collective) -> &'static [Algo] {
    // Kept for the program's life, so that a caller holds a slice as `schedules` gives one.
    static NAMES: OnceLock<Vec<Vec<Algo>>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        let names_of = |c: Collective| schedules(c).iter().filter_map(|s| s.algo).collect();
        Collective::ALL.into_iter().map(names_of).collect()
    });
    &names[collective as usize]
}

/// The description of the algorithm [`chosen`] runs: what explains a call's time (comm-bench's
/// model). `None` where a collective has no named algorithm.
pub fn schedule(
    collective: Collective,
    bytes: usize,
    n: usize,
    asked: Option<Algo>,
) -> Option<&'static Schedule> {
    let algo = chosen(collective, bytes, n, asked)?;
    schedules(collective).iter().find(|s| s.algo == Some(algo))
}

/// The description of `collective`'s algorithm on registered buffers, which runs in place of
/// [`schedule`]'s where every rank shares a host and its buffers are registered (`--copy auto`
/// or `registered`): what explains such a call's time. `None` where it has none.
pub fn registered_schedule(collective: Collective) -> Option<&'static Schedule> {
    registered::registered(collective)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::named::Named;

    /// `algos_of` lists exactly the algorithms that asking for runs at every size: the same
    /// rule as the dispatch, so `--algo` is refused only where it would be ignored; and what runs
    /// is described, as its own collective's.
    #[test]
    fn a_collectives_algorithms_are_those_the_dispatch_obeys() {
        for c in Collective::ALL {
            for &a in Algo::ALL {
                let obeyed = [0, 1 << 30]
                    .iter()
                    .all(|&b| chosen(c, b, 4, Some(a)) == Some(a));
                assert_eq!(algos_of(c).contains(&a), obeyed, "{c} {}", a.name());
            }
            for bytes in [0, 1 << 10, 1 << 20, 1 << 30] {
                let described =
                    schedule(c, bytes, 4, None).and_then(|s| Some((s.collective, s.algo?)));
                let runs = chosen(c, bytes, 4, None).map(|a| (c, a));
                assert_eq!(described, runs, "{c} at {bytes} bytes");
            }
        }
    }
}
