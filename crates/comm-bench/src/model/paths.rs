//! The critical path of each algorithm the α–β fit is fitted through (the structures of Thakur,
//! Rabenseifner and Gropp): messages one after another, bytes through one rank's link, bytes
//! reduced, for the algorithm the CPU backend runs at each size (`comm_core::backend::cpu::chosen`).
//! The buffers' shapes come from comm-core's collective table; which collectives have a path at
//! all is [`NOT_MODELLED`]'s to say.

use comm_core::backend::cpu::{chosen, Algo, CHAIN_SEGMENT_BYTES};
use comm_core::collective::Span;
use comm_core::{Collective, Named};

/// The collectives this model has no step structure for (yet). `comm-bench model` names them when
/// it skips a series of one; a test holds every collective of the table either here or modelled.
pub const NOT_MODELLED: [Collective; 5] = [
    Collective::Reduce,
    Collective::SendRecv,
    Collective::AllToAll,
    Collective::Gather,
    Collective::Scatter,
];

/// Whether the model has a path for `collective`.
pub fn modelled(collective: Collective) -> bool {
    !NOT_MODELLED.contains(&collective)
}

/// The critical path of one call: messages one after another, bytes through one rank's link,
/// and bytes it reduces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Path {
    /// The algorithm, as `--algo` names it.
    pub algo: &'static str,
    pub steps: f64,
    pub bytes: f64,
    pub reduced: f64,
}

/// The critical path of `collective` on `bytes` (the table's size) over `n` ranks, with the
/// algorithm the CPU backend runs there (`asked`: `--algo`); `None` for one rank and for the
/// collectives of [`NOT_MODELLED`].
pub fn path(collective: Collective, bytes: u64, n: usize, asked: Option<Algo>) -> Option<Path> {
    let (s, k) = (bytes as f64, n.saturating_sub(1) as f64);
    if n < 2 {
        return None;
    }
    let algo = chosen(collective, bytes as usize, n, asked)?;
    let block = s / n as f64;
    let (steps, through, reduced) = match (collective, algo) {
        // n−1 exchanges of the whole buffer, its two local copies (into the scratch and out, each
        // half a transfer's copy in and copy out), n−1 reductions of it.
        (Collective::AllReduce, Algo::Direct) => (k, k * s + s, k * s),
        (Collective::AllReduce, _) => (2.0 * k, 2.0 * k * block, k * block),
        (Collective::AllGather, _) => (k, k * block, 0.0),
        (Collective::ReduceScatter, _) => (k, k * block, k * block),
        (Collective::Broadcast, Algo::Tree) => {
            let rounds = (n as f64).log2().ceil();
            (rounds, rounds * s, 0.0)
        }
        (Collective::Broadcast, _) => {
            let segment = (CHAIN_SEGMENT_BYTES as f64).min(s.max(1.0));
            let segments = (s / segment).ceil().max(1.0);
            (segments + k - 1.0, s + (k - 1.0) * segment, 0.0)
        }
        // No `_`: a new collective does not build until it is placed, here and in NOT_MODELLED.
        (
            Collective::Reduce
            | Collective::SendRecv
            | Collective::AllToAll
            | Collective::Gather
            | Collective::Scatter,
            _,
        ) => return None,
    };
    Some(Path {
        algo: algo.name(),
        steps,
        bytes: through,
        reduced,
    })
}

/// Bytes the ranks' buffers of one call take on a host: what a cache must hold. Each buffer's
/// length is the table's (a block, or the world's blocks), relative to the size column's buffer,
/// the larger; in place the one buffer holds both.
pub fn working_set(collective: Collective, bytes: u64, n: usize, in_place: bool) -> f64 {
    let d = collective.describe();
    let blocks = |span: Span| match span {
        Span::Count => 1.0,
        Span::WorldBlocks => n as f64,
    };
    let (send, recv) = (blocks(d.send), blocks(d.recv));
    let whole = send.max(recv);
    let per_rank = match in_place {
        true => 1.0,
        false => send / whole + recv / whole,
    };
    bytes as f64 * per_rank * n as f64
}

/// How each algorithm's path is counted, for the reader of a fit.
pub fn structure_text(collective: Collective, algos: &[&str]) -> String {
    let one = |algo: &str| match (collective, algo) {
        (Collective::AllReduce, "direct") => "direct: n−1 steps of s",
        (Collective::AllReduce, _) => "ring: 2(n−1) steps of s/n",
        (Collective::Broadcast, "tree") => "tree: ⌈log2 n⌉ steps of s",
        (Collective::Broadcast, _) => "chain: n−2+k steps of a 1 MiB segment, k segments",
        _ => "ring: n−1 steps of s/n",
    };
    algos.iter().map(|a| one(a)).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paths_follow_the_algorithms_steps() {
        let ring = path(Collective::AllReduce, 64 << 20, 4, None).unwrap();
        assert_eq!((ring.algo, ring.steps), ("ring", 6.0));
        assert_eq!(ring.bytes, 2.0 * 3.0 / 4.0 * (64 << 20) as f64);
        let direct = path(Collective::AllReduce, 1024, 4, None).unwrap();
        assert_eq!((direct.algo, direct.steps), ("direct", 3.0));
        let gather = path(Collective::AllGather, 4096, 4, None).unwrap();
        assert_eq!(
            (gather.steps, gather.bytes, gather.reduced),
            (3.0, 3072.0, 0.0)
        );
        let tree = path(Collective::Broadcast, 1024, 5, None).unwrap();
        assert_eq!((tree.algo, tree.steps), ("tree", 3.0));
        let chain = path(Collective::Broadcast, 8 << 20, 4, None).unwrap();
        assert_eq!((chain.algo, chain.steps), ("chain", 8.0 + 2.0));
        assert!(path(Collective::AllToAll, 1024, 4, None).is_none());
        assert!(path(Collective::AllReduce, 1024, 1, None).is_none());
    }

    #[test]
    fn every_collective_is_modelled_or_listed_as_not() {
        for c in Collective::ALL {
            let has_path = path(c, 1 << 20, 4, None).is_some();
            assert_eq!(
                has_path,
                modelled(c),
                "{}: a path iff not in NOT_MODELLED",
                c.name()
            );
        }
    }

    #[test]
    fn the_working_set_follows_the_tables_buffers() {
        let (s, n) = (1 << 20, 4);
        let ws = |c, in_place| working_set(c, s, n, in_place) / (s * n as u64) as f64;
        assert_eq!(ws(Collective::AllReduce, false), 2.0);
        assert_eq!(ws(Collective::AllGather, false), 1.25);
        assert_eq!(ws(Collective::ReduceScatter, false), 1.25);
        assert_eq!(ws(Collective::Broadcast, false), 2.0);
        assert_eq!(ws(Collective::AllToAll, false), 2.0);
        assert!(Collective::ALL.iter().all(|&c| ws(c, true) == 1.0));
    }
}
