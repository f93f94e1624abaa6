//! The critical path of each algorithm the α–β fit is fitted through (the structures of Thakur,
//! Rabenseifner and Gropp): messages one after another, bytes through one rank's link, bytes
//! reduced, for the algorithm the CPU backend runs at each size. Each count is the algorithm's
//! own description, kept beside it in comm-core (`comm_core::backend::cpu::Schedule`, chosen by
//! `cpu::schedule`); the buffers' shapes come from comm-core's collective table. A collective
//! with no described algorithm has no path.

use comm_core::backend::cpu::{registered_schedule, schedule, schedules, Algo};
use comm_core::collective::Span;
use comm_core::Collective;

/// Whether the model has a path for `collective`: whether comm-core describes any of its
/// algorithms. `comm-bench model` names the others when it skips a series of one.
pub fn modelled(collective: Collective) -> bool {
    !schedules(collective).is_empty()
}

/// The critical path of one call: messages one after another, bytes through one rank's link,
/// and bytes it reduces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Path {
    /// The algorithm, as `--algo` names it.
    pub algo: &'static str,
    /// How its counts go, in words (`ring: 2(n−1) steps of s/n`).
    pub words: &'static str,
    pub steps: f64,
    pub bytes: f64,
    pub reduced: f64,
}

/// The critical path of `collective` on `bytes` (the table's size) over `n` ranks, with the
/// algorithm the CPU backend runs there (`asked`: `--algo`); `None` for one rank and for a
/// collective that is not [`modelled`].
pub fn path(collective: Collective, bytes: u64, n: usize, asked: Option<Algo>) -> Option<Path> {
    if n < 2 {
        return None;
    }
    let schedule = schedule(collective, bytes as usize, n, asked)?;
    Some(Path {
        algo: schedule.name(),
        words: schedule.words(),
        steps: schedule.steps(bytes as usize, n) as f64,
        bytes: schedule.link_bytes(bytes as f64, n),
        reduced: schedule.reduced_bytes(bytes as f64, n),
    })
}

/// The critical path of `collective` on registered buffers (`--copy registered`, or auto on
/// one host): each rank reads its peers' buffers where they lie, in the steps of comm-core's
/// registered algorithm. `None` for one rank and for a collective that has none.
pub fn registered_path(collective: Collective, bytes: u64, n: usize) -> Option<Path> {
    if n < 2 {
        return None;
    }
    let schedule = registered_schedule(collective)?;
    Some(Path {
        algo: schedule.name(),
        words: schedule.words(),
        steps: schedule.steps(bytes as usize, n) as f64,
        bytes: schedule.link_bytes(bytes as f64, n),
        reduced: schedule.reduced_bytes(bytes as f64, n),
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
    fn a_collective_has_a_path_iff_it_is_modelled() {
        for c in Collective::ALL {
            let has_path = path(c, 1 << 20, 4, None).is_some();
            assert_eq!(has_path, modelled(c), "{}", c.name());
        }
        assert!(!modelled(Collective::AllToAll) && modelled(Collective::AllGather));
    }

    /// The counts as the lesson's table gives them (docs/src/curve.md), on 4 ranks.
    #[test]
    fn the_paths_count_as_the_lesson_does() {
        let (s, n) = (1u64 << 20, 4);
        let at = |c, asked| path(c, s, n, Some(asked)).unwrap();
        let sf = s as f64;
        let ring = at(Collective::AllReduce, Algo::Ring);
        assert_eq!((ring.bytes, ring.reduced), (1.5 * sf, 0.75 * sf));
        let direct = at(Collective::AllReduce, Algo::Direct);
        assert_eq!((direct.bytes, direct.reduced), (4.0 * sf, 3.0 * sf));
        let rs = path(Collective::ReduceScatter, s, n, None).unwrap();
        assert_eq!(
            (rs.steps, rs.bytes, rs.reduced),
            (3.0, 0.75 * sf, 0.75 * sf)
        );
        let tree = at(Collective::Broadcast, Algo::Tree);
        assert_eq!((tree.steps, tree.bytes, tree.reduced), (2.0, 2.0 * sf, 0.0));
        // One 1 MiB segment: n−1 steps, and the buffer plus n−2 segments through a link.
        let chain = at(Collective::Broadcast, Algo::Chain);
        assert_eq!((chain.steps, chain.bytes), (3.0, 3.0 * sf));
        let words: Vec<&str> = [ring, direct, rs, tree, chain].map(|p| p.words).to_vec();
        assert_eq!(
            words,
            [
                "ring: 2(n−1) steps of s/n",
                "direct: n−1 steps of s",
                "ring: n−1 steps of s/n",
                "tree: ⌈log2 n⌉ steps of s",
                "chain: n−2+k steps of a 1 MiB segment, k segments"
            ]
        );
    }

    #[test]
    fn registered_paths_read_each_peers_block_once() {
        let s = 1u64 << 20;
        let sf = s as f64;
        let all_reduce = registered_path(Collective::AllReduce, s, 4).unwrap();
        assert_eq!((all_reduce.algo, all_reduce.steps), ("registered", 2.0));
        assert_eq!(
            (all_reduce.bytes, all_reduce.reduced),
            (1.5 * sf, 0.75 * sf)
        );
        let small = registered_path(Collective::AllReduce, 1024, 4).unwrap();
        assert_eq!(small.steps, 1.0);
        let gather = registered_path(Collective::AllGather, s, 4).unwrap();
        assert_eq!((gather.steps, gather.bytes), (1.0, 0.75 * sf));
        let broadcast = registered_path(Collective::Broadcast, s, 4).unwrap();
        assert_eq!(broadcast.bytes, sf);
        assert!(registered_path(Collective::AllToAll, s, 4).is_none());
        assert!(registered_path(Collective::AllReduce, s, 1).is_none());
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
