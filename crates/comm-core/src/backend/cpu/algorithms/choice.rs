//! Which algorithm runs: `--algo`'s names and the sizes that choose when none is named.

use crate::backend::cpu::transport::PIECE_BYTES;
use crate::collective::Collective;

/// Up to this many bytes, latency matters more than bandwidth.
pub(super) const SMALL_BYTES: usize = 64 << 10;
/// The all_reduce direct exchange sends the whole buffer to each peer; up to this many bytes in all.
const DIRECT_ALL_REDUCE_BYTES: usize = 256 << 10;
/// Pipeline piece: large enough to amortize a message, small enough to overlap reduce and transfer.
pub(super) const SEGMENT_BYTES: usize = PIECE_BYTES;

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

/// The broadcast algorithm that runs: `algo` if it is one, else by size.
pub(super) fn broadcast_algo(algo: Option<Algo>, bytes: usize) -> Algo {
    match algo {
        Some(chosen @ (Algo::Tree | Algo::Chain)) => chosen,
        _ if bytes <= SMALL_BYTES => Algo::Tree,
        _ => Algo::Chain,
    }
}

/// The all_reduce algorithm that runs on `n` ranks: `algo` if it is one, else by size.
pub(super) fn all_reduce_algo(algo: Option<Algo>, bytes: usize, n: usize) -> Algo {
    match algo {
        Some(chosen @ (Algo::Ring | Algo::Direct)) => chosen,
        _ if bytes * (n - 1) <= DIRECT_ALL_REDUCE_BYTES => Algo::Direct,
        _ => Algo::Ring,
    }
}
