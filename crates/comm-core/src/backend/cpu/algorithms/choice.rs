//! Which algorithm runs: `--algo`'s names and the sizes that choose when none is named.

use crate::backend::cpu::transport::PIECE_BYTES;
use crate::collective::Collective;
use crate::named::Named;

/// Up to this many bytes, latency matters more than bandwidth.
pub(super) const SMALL_BYTES: usize = 64 << 10;
/// The all_reduce direct exchange sends the whole buffer to each peer; up to this many bytes in all.
const DIRECT_ALL_REDUCE_BYTES: usize = 256 << 10;
/// The direct exchange links every rank to every other (n - 1 links each, opened on the first
/// call), where the ring links each to two; past this many ranks the ring runs at every size.
/// Measured on this book's 2-core VM, 02-allreduce start to finish (4 floats), direct against
/// ring: 8 ranks 0.05 against 0.04 s, 16 ranks 0.13 against 0.07, 32 0.31 against 0.18, 64 0.95
/// against 0.54, 256 11.0 against 4.2.
const DIRECT_MAX_RANKS: usize = 8;
/// Pipeline piece: large enough to amortize a message, small enough to overlap reduce and transfer.
pub(super) const SEGMENT_BYTES: usize = PIECE_BYTES;

/// A CPU algorithm chosen by name (`--algo`), as `NCCL_ALGO` chooses NCCL's. A collective that
/// has no algorithm of that name, or no choice given, picks by size as it always does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    /// all_reduce: a reduce-scatter then an all-gather around the ring, 2(n-1) steps each
    /// moving 1/n of the buffer (chosen above 256 KiB, or on more than 8 ranks).
    Ring,
    /// all_reduce: every rank sends its whole buffer to every other and reduces all n, one step
    /// (chosen up to 256 KiB on up to 8 ranks).
    Direct,
    /// broadcast: a binomial tree, log2(n) rounds of whole buffers (chosen up to 4 MiB).
    Tree,
    /// broadcast: a pipelined chain, each rank forwarding a segment while the next arrives
    /// (chosen above 4 MiB).
    Chain,
}

impl Named for Algo {
    const ALL: &'static [Self] = &[Self::Ring, Self::Direct, Self::Tree, Self::Chain];

    /// The name `--algo` takes.
    fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Direct => "direct",
            Algo::Tree => "tree",
            Algo::Chain => "chain",
        }
    }
}

/// The algorithm the CPU backend runs for `collective` on `bytes` (the call's size, as the
/// table counts it) and `n` ranks, given `--algo` (`asked`): the same rule the calls follow.
/// `None` where a collective has no named algorithm. No `_`: a new collective does not build
/// until it is placed here.
pub fn chosen(collective: Collective, bytes: usize, n: usize, asked: Option<Algo>) -> Option<Algo> {
    match collective {
        Collective::AllReduce => Some(all_reduce_algo(asked, bytes, n.max(1))),
        Collective::Broadcast => Some(broadcast_algo(asked, bytes)),
        Collective::AllGather | Collective::ReduceScatter => Some(Algo::Ring),
        Collective::Reduce
        | Collective::SendRecv
        | Collective::AllToAll
        | Collective::Gather
        | Collective::Scatter => None,
    }
}

/// The pipelined chain's segment: a chain broadcast moves in pieces this long.
pub const CHAIN_SEGMENT_BYTES: usize = SEGMENT_BYTES;

/// The broadcast's tree carries up to this many bytes, the pipelined chain more: measured,
/// not guessed, on this book's 2-core EPYC VM (the same threshold over shm and over tcp).
///
/// `comm-bench --backend cpu --transport shm|tcp --world-sizes 4 --collectives broadcast
/// --algo tree|chain -z 3 -n 20`, sizes 256 KiB to 64 MiB, tree and chain alternating, 7–10
/// rounds on shm and 3–6 on tcp over three sweeps while other builds ran (one round's ratio can
/// move by ±0.5 on shm at 8–64 MiB, so only the median over rounds counts). Each algorithm's
/// median over rounds of its median iteration (the slowest rank's), in place; chain / tree:
///
/// | size | shm tree | shm chain | ratio | tcp tree | tcp chain | ratio |
/// |---|---|---|---|---|---|---|
/// | 256 KiB | 54 µs | 82 µs | 1.52 | 251 µs | 335 µs | 1.33 |
/// | 1 MiB | 218 µs | 345 µs | 1.59 | 928 µs | 1052 µs | 1.13 |
/// | 2 MiB | 415 µs | 494 µs | 1.19 | 1.72 ms | 2.02 ms | 1.17 |
/// | 4 MiB | 899 µs | 981 µs | 1.09 | 3.13 ms | 3.26 ms | 1.04 |
/// | 8 MiB | 2.84 ms | 2.25 ms | 0.79 | 6.64 ms | 6.06 ms | 0.91 |
/// | 16 MiB | 6.03 ms | 5.66 ms | 0.94 | 14.8 ms | 13.0 ms | 0.88 |
/// | 32 MiB | 17.2 ms | 15.9 ms | 0.92 | 35.2 ms | 23.4 ms | 0.66 |
/// | 64 MiB | 29.0 ms | 29.6 ms | 1.02 | 64.3 ms | 43.3 ms | 0.67 |
///
/// Out of place the same side wins at every size (shm 64 MiB: 0.94). On 2 ranks both are one
/// hop and within noise of each other (0.99–1.07 from 1 MiB up).
///
/// Why the chain pipelines so little here (the rule said 64 KiB before, and at 64 KiB the
/// chain took 65 µs against the tree's 18): the tree and the chain move the same bytes (n−1
/// messages' worth of the buffer, each copied into the transport and out of it), and on 2 cores
/// those copies, not a link, are the bottleneck; the tree's second round already runs two
/// messages at once. The chain adds, at 4 ranks, a forwarding thread on each of the 2 middle
/// ranks, spawned per call (about 45 µs: 58 µs against the tree's 14 µs at 1 KiB): 6 threads
/// on 2 cores, so a rank that waits for a core loses a scheduler slice (a trace of example 01
/// shows a 1 MiB segment's receive stalled 4 ms). What it gains is that its 1 MiB segments are
/// forwarded while still in cache and that all n−1 links carry data at once, which pays from
/// 8 MiB on: modestly between the ranks of one host, by a third over TCP at 32–64 MiB, where
/// the kernel's socket copies run while the ranks wait.
pub(super) const TREE_BROADCAST_BYTES: usize = 4 << 20;

/// The broadcast algorithm that runs: `algo` if it is one, else by size
/// ([`TREE_BROADCAST_BYTES`]).
pub(super) fn broadcast_algo(algo: Option<Algo>, bytes: usize) -> Algo {
    match algo {
        Some(chosen @ (Algo::Tree | Algo::Chain)) => chosen,
        _ if bytes <= TREE_BROADCAST_BYTES => Algo::Tree,
        _ => Algo::Chain,
    }
}

/// The all_reduce algorithm that runs on `n` ranks: `algo` if it is one, else by size.
pub(super) fn all_reduce_algo(algo: Option<Algo>, bytes: usize, n: usize) -> Algo {
    match algo {
        Some(chosen @ (Algo::Ring | Algo::Direct)) => chosen,
        _ if n <= DIRECT_MAX_RANKS && bytes * (n - 1) <= DIRECT_ALL_REDUCE_BYTES => Algo::Direct,
        _ => Algo::Ring,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The measured rule: the tree up to 4 MiB, the chain above, on any number of ranks;
    /// `--algo` wins over it.
    #[test]
    fn broadcast_takes_the_tree_up_to_4_mib_and_the_chain_above() {
        let threshold = TREE_BROADCAST_BYTES;
        assert_eq!(threshold, 4 << 20);
        for n in [2, 4, 8] {
            for (bytes, algo) in [
                (0, Algo::Tree),
                (64 << 10, Algo::Tree),
                ((64 << 10) + 1, Algo::Tree),
                (threshold - 1, Algo::Tree),
                (threshold, Algo::Tree),
                (threshold + 1, Algo::Chain),
                (8 << 20, Algo::Chain),
                (1 << 30, Algo::Chain),
            ] {
                let by_size = chosen(Collective::Broadcast, bytes, n, None);
                assert_eq!(by_size, Some(algo), "{bytes} bytes on {n} ranks");
                for asked in [Algo::Tree, Algo::Chain] {
                    let named = chosen(Collective::Broadcast, bytes, n, Some(asked));
                    assert_eq!(named, Some(asked), "{bytes} bytes, --algo {}", asked.name());
                }
            }
        }
    }

    /// Small all-reduces go direct on a few ranks; on many, the ring, whose rank talks to two
    /// peers where the direct exchange talks to all.
    #[test]
    fn all_reduce_goes_direct_when_small_on_few_ranks() {
        let all_reduce = |bytes, n| chosen(Collective::AllReduce, bytes, n, None);
        assert_eq!(all_reduce(16, 4), Some(Algo::Direct));
        assert_eq!(all_reduce(16, DIRECT_MAX_RANKS), Some(Algo::Direct));
        assert_eq!(all_reduce(16, DIRECT_MAX_RANKS + 1), Some(Algo::Ring));
        assert_eq!(all_reduce(1 << 20, 4), Some(Algo::Ring));
        let asked = chosen(Collective::AllReduce, 16, 256, Some(Algo::Direct));
        assert_eq!(asked, Some(Algo::Direct));
    }
}
