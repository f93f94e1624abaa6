//! One description per collective, in the spirit of nccl-tests' `testColl`: its name, its bus
//! factor, the element counts for a size and world size, whether it has a root, a reduction and
//! an in-place form, what every rank must hold afterwards, and the call itself.
//!
//! Everything that runs collectives generically reads this table: the correctness checks
//! ([`crate::check`], `collective-check`, the GPU check script), the collective tests, and
//! comm-bench's plan and measurement. Adding a collective is one [`Collective`] variant, its
//! [`Collective::describe`] and [`Collective::call`] arms here, and its backend implementations
//! (the CPU algorithm and the NCCL call) behind a [`Communicator`] method.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use crate::comm::{Buffer, Communicator};
use crate::dtype::{Element, ReduceOp};
use crate::error::{CommError, Result};

/// The collectives, named as nccl-tests names its programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank ends with the reduction of every rank's buffer.
    AllReduce,
    /// Every rank ends with every rank's block, in rank order.
    AllGather,
    /// Block `rank` of the reduction lands on rank `rank`.
    ReduceScatter,
    /// The root's buffer reaches every rank.
    Broadcast,
    /// The root ends with the reduction.
    Reduce,
    /// Every rank sends to the next and receives from the previous, both at once.
    SendRecv,
    /// Block `j` of rank `i`'s send buffer lands in block `i` of rank `j`'s receive buffer.
    AllToAll,
}

/// How long one of a call's buffers is, in units of the call's `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// `count` elements.
    Count,
    /// `world_size` blocks of `count` elements.
    WorldBlocks,
}

/// One collective as the table describes it.
#[derive(Debug, Clone, Copy)]
pub struct Description {
    /// Which collective this is.
    pub collective: Collective,
    /// nccl-tests' name (`all_reduce`, `alltoall`, ...): tables, CSV rows, `--collectives`.
    pub name: &'static str,
    /// The name in CamelCase (`AllReduce`), as PyTorch's profiler and the course print it.
    pub title: &'static str,
    /// busbw / algbw for a world of `n` ranks (nccl-tests' PERFORMANCE.md): what each link
    /// carries relative to the whole buffer, so busbw compares with a link's speed.
    pub bus_factor: fn(n: f64) -> f64,
    /// The same factor as a reader writes it (`2(n-1)/n`), for reports.
    pub bus_rule: &'static str,
    /// Takes a root rank (`-r`).
    pub rooted: bool,
    /// Takes a reduction (`-o`).
    pub reduces: bool,
    /// Has an in-place form (the result overwrites the input in one buffer).
    pub in_place: bool,
    /// The fewest ranks it runs on (sendrecv needs a peer).
    pub min_ranks: usize,
    /// The send buffer's length...
    pub send: Span,
    /// ...and the receive buffer's.
    pub recv: Span,
    /// What rank `rank` holds afterwards, stretch by stretch (see [`Piece`]).
    pub result: fn(&Place) -> Vec<Piece>,
}

/// A rank's place in one call: what its expected result depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// This rank.
    pub rank: usize,
    /// Ranks in the communicator.
    pub world_size: usize,
    /// The root, for rooted collectives.
    pub root: usize,
    /// The call's element count (NCCL's `count`: per block for blocked buffers).
    pub count: usize,
}

/// Where the elements of one stretch of a rank's result come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The reduction, in rank order, of every rank's input from `src` on.
    Reduced,
    /// This rank's input from `src` on.
    Rank(usize),
    /// Whatever the receive buffer held before the call: the call must not write it.
    Unchanged,
}

/// Result elements `dst` come from `origin`, starting at element `src` of the inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Elements of the result (the receive buffer, or the result's place in an in-place buffer).
    pub dst: Range<usize>,
    /// Where they come from.
    pub origin: Origin,
    /// The first input element they come from.
    pub src: usize,
}

/// Buffer lengths of one call on one rank, derived from the description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// The call's count (per block for blocked buffers).
    pub count: usize,
    /// Elements in the send buffer (out of place).
    pub send: usize,
    /// Elements in the receive buffer (out of place).
    pub recv: usize,
    /// In place, one buffer of `max(send, recv)` elements holds both: where the input starts...
    pub in_place_send_offset: usize,
    /// ...and where the result starts (as nccl-tests' `send/recvInplaceOffset`).
    pub in_place_recv_offset: usize,
}

impl Counts {
    /// The one buffer of an in-place call, and the size column of a benchmark (in elements).
    pub fn whole(&self) -> usize {
        self.send.max(self.recv)
    }
}

fn ring(n: f64) -> f64 {
    2.0 * (n - 1.0) / n
}
fn all_but_own(n: f64) -> f64 {
    (n - 1.0) / n
}
fn once(_: f64) -> f64 {
    1.0
}

/// Block `i` of `count`-element blocks.
fn block(i: usize, count: usize) -> Range<usize> {
    i * count..(i + 1) * count
}

impl Collective {
    /// Every collective, in the order tables list them.
    pub const ALL: [Collective; 7] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::SendRecv,
        Collective::AllToAll,
    ];

    /// The table entry.
    pub fn describe(self) -> Description {
        let base = Description {
            collective: self,
            name: "",
            title: "",
            bus_factor: once,
            bus_rule: "1",
            rooted: false,
            reduces: false,
            in_place: true,
            min_ranks: 1,
            send: Span::Count,
            recv: Span::Count,
            result: |_| Vec::new(),
        };
        match self {
            Collective::AllReduce => Description {
                name: "all_reduce",
                title: "AllReduce",
                bus_factor: ring,
                bus_rule: "2(n-1)/n",
                reduces: true,
                result: |p| vec![piece(0..p.count, Origin::Reduced, 0)],
                ..base
            },
            Collective::AllGather => Description {
                name: "all_gather",
                title: "AllGather",
                bus_factor: all_but_own,
                bus_rule: "(n-1)/n",
                recv: Span::WorldBlocks,
                result: |p| {
                    let each = |r| piece(block(r, p.count), Origin::Rank(r), 0);
                    (0..p.world_size).map(each).collect()
                },
                ..base
            },
            Collective::ReduceScatter => Description {
                name: "reduce_scatter",
                title: "ReduceScatter",
                bus_factor: all_but_own,
                bus_rule: "(n-1)/n",
                reduces: true,
                send: Span::WorldBlocks,
                result: |p| vec![piece(0..p.count, Origin::Reduced, p.rank * p.count)],
                ..base
            },
            Collective::Broadcast => Description {
                name: "broadcast",
                title: "Broadcast",
                rooted: true,
                result: |p| vec![piece(0..p.count, Origin::Rank(p.root), 0)],
                ..base
            },
            Collective::Reduce => Description {
                name: "reduce",
                title: "Reduce",
                rooted: true,
                reduces: true,
                result: |p| match p.rank == p.root {
                    true => vec![piece(0..p.count, Origin::Reduced, 0)],
                    false => vec![piece(0..p.count, Origin::Unchanged, 0)],
                },
                ..base
            },
            Collective::SendRecv => Description {
                name: "sendrecv",
                title: "SendRecv",
                in_place: false,
                min_ranks: 2,
                result: |p| {
                    let prev = (p.rank + p.world_size - 1) % p.world_size;
                    vec![piece(0..p.count, Origin::Rank(prev), 0)]
                },
                ..base
            },
            // ANCHOR: alltoall
            // Sending from and receiving into one buffer at once would race: out of place only,
            // as nccl-tests checks it.
            Collective::AllToAll => Description {
                name: "alltoall",
                title: "AllToAll",
                bus_factor: all_but_own,
                bus_rule: "(n-1)/n",
                in_place: false,
                send: Span::WorldBlocks,
                recv: Span::WorldBlocks,
                result: |p| {
                    let each = |r| piece(block(r, p.count), Origin::Rank(r), p.rank * p.count);
                    (0..p.world_size).map(each).collect()
                },
                ..base
            },
            // ANCHOR_END: alltoall
        }
    }

    /// Runs the collective on a rank's buffers (every rank must call it).
    pub fn call<T: Element>(
        self,
        comm: &Communicator,
        buffers: &mut Buffers<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        use Buffers::{InPlace, OutOfPlace};
        let (n, rank) = (comm.world_size(), comm.rank());
        match (self, buffers) {
            (Collective::AllReduce, InPlace(buf)) => comm.all_reduce(buf, op),
            (Collective::AllReduce, OutOfPlace { send, recv }) => {
                comm.all_reduce_into(send, recv, op)
            }
            (Collective::AllGather, InPlace(buf)) => comm.all_gather(buf),
            (Collective::AllGather, OutOfPlace { send, recv }) => comm.all_gather_into(send, recv),
            (Collective::ReduceScatter, InPlace(buf)) => comm.reduce_scatter(buf, op),
            (Collective::ReduceScatter, OutOfPlace { send, recv }) => {
                comm.reduce_scatter_into(send, recv, op)
            }
            (Collective::Broadcast, InPlace(buf)) => comm.broadcast(buf, root),
            (Collective::Broadcast, OutOfPlace { send, recv }) => {
                comm.broadcast_into(send, recv, root)
            }
            (Collective::Reduce, InPlace(buf)) => comm.reduce(buf, op, root),
            (Collective::Reduce, OutOfPlace { send, recv }) => {
                comm.reduce_into(send, recv, op, root)
            }
            // The ring exchange, as nccl-tests' sendrecv: to rank+1 while from rank-1.
            (Collective::SendRecv, OutOfPlace { send, recv }) => {
                comm.send_recv(send, (rank + 1) % n, recv, (rank + n - 1) % n)
            }
            (Collective::AllToAll, OutOfPlace { send, recv }) => comm.all_to_all(send, recv),
            (c, InPlace(_)) => Err(CommError::Usage(format!("{c} has no in-place form"))),
        }
    }

    /// nccl-tests' name.
    pub fn name(self) -> &'static str {
        self.describe().name
    }

    /// busbw / algbw on `world_size` ranks.
    pub fn bus_factor(self, world_size: usize) -> f64 {
        (self.describe().bus_factor)(world_size as f64)
    }

    /// The buffers of one call with `count` elements (per block for blocked buffers) on
    /// `world_size` ranks, for rank `rank`.
    pub fn counts(self, count: usize, world_size: usize, rank: usize) -> Counts {
        let d = self.describe();
        let len = |span| match span {
            Span::Count => count,
            Span::WorldBlocks => count * world_size,
        };
        let own_block = rank * count;
        Counts {
            count,
            send: len(d.send),
            recv: len(d.recv),
            in_place_send_offset: match (d.send, d.recv) {
                (Span::Count, Span::WorldBlocks) => own_block,
                _ => 0,
            },
            in_place_recv_offset: match (d.send, d.recv) {
                (Span::WorldBlocks, Span::Count) => own_block,
                _ => 0,
            },
        }
    }

    /// The call's count for a buffer of `elements` in all (the size a benchmark asks for),
    /// rounded down to whole blocks.
    pub fn count_for(self, elements: usize, world_size: usize) -> usize {
        let d = self.describe();
        match (d.send, d.recv) {
            (Span::Count, Span::Count) => elements,
            _ => elements / world_size.max(1),
        }
    }

    /// What rank `place.rank` holds afterwards.
    pub fn result(self, place: &Place) -> Vec<Piece> {
        (self.describe().result)(place)
    }
}

fn piece(dst: Range<usize>, origin: Origin, src: usize) -> Piece {
    Piece { dst, origin, src }
}

/// A rank's buffers for one call: one buffer in place, a send and a receive buffer out of place.
#[derive(Debug)]
pub enum Buffers<T: Element> {
    /// The result overwrites the input.
    InPlace(Buffer<T>),
    /// Separate buffers, as NCCL's out-of-place calls take them.
    OutOfPlace {
        /// Read by the call.
        send: Buffer<T>,
        /// Written by the call.
        recv: Buffer<T>,
    },
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Collective {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        // all_reduce, all-reduce and allreduce alike; all-to-all for alltoall.
        let plain = |name: &str| name.replace(['-', '_'], "");
        Collective::ALL
            .into_iter()
            .find(|c| plain(c.name()) == plain(s))
            .ok_or_else(|| {
                let names: Vec<_> = Collective::ALL.iter().map(|c| c.name()).collect();
                format!("unknown collective {s:?}: use one of {}", names.join(", "))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_tests_bus_factors() {
        assert_eq!(Collective::AllReduce.bus_factor(2), 1.0);
        assert_eq!(Collective::AllReduce.bus_factor(4), 1.5);
        assert_eq!(Collective::AllGather.bus_factor(4), 0.75);
        assert_eq!(Collective::ReduceScatter.bus_factor(8), 0.875);
        assert_eq!(Collective::AllToAll.bus_factor(4), 0.75);
        assert_eq!(Collective::Broadcast.bus_factor(8), 1.0);
        assert_eq!(Collective::AllReduce.bus_factor(1), 0.0);
    }

    #[test]
    fn names_round_trip() {
        for c in Collective::ALL {
            assert_eq!(c.name().parse::<Collective>().unwrap(), c);
            assert_eq!(c.describe().collective, c);
        }
        assert_eq!(
            "all-reduce".parse::<Collective>().unwrap(),
            Collective::AllReduce
        );
        assert_eq!(
            "allreduce".parse::<Collective>().unwrap(),
            Collective::AllReduce
        );
        assert_eq!(
            "all-to-all".parse::<Collective>().unwrap(),
            Collective::AllToAll
        );
        assert!("gather"
            .parse::<Collective>()
            .unwrap_err()
            .contains("use one of"));
    }

    #[test]
    fn counts_follow_nccl_tests() {
        // all_gather: send one block, receive n; in place the input sits in block `rank`.
        let c = Collective::AllGather.counts(5, 4, 2);
        assert_eq!((c.send, c.recv, c.whole()), (5, 20, 20));
        assert_eq!((c.in_place_send_offset, c.in_place_recv_offset), (10, 0));
        // reduce_scatter: the mirror image.
        let c = Collective::ReduceScatter.counts(5, 4, 2);
        assert_eq!((c.send, c.recv), (20, 5));
        assert_eq!((c.in_place_send_offset, c.in_place_recv_offset), (0, 10));
        let c = Collective::AllToAll.counts(5, 4, 3);
        assert_eq!((c.send, c.recv, c.in_place_send_offset), (20, 20, 0));
        assert_eq!(Collective::AllReduce.counts(7, 4, 1).whole(), 7);
        // A benchmark's size in elements, rounded to whole blocks.
        assert_eq!(Collective::AllToAll.count_for(250_000, 6), 41_666);
        assert_eq!(Collective::AllReduce.count_for(250_000, 6), 250_000);
    }

    #[test]
    fn results_cover_the_receive_buffer() {
        for c in Collective::ALL {
            for n in 1..6 {
                for rank in 0..n {
                    let place = Place {
                        rank,
                        world_size: n,
                        root: n - 1,
                        count: 3,
                    };
                    let counts = c.counts(3, n, rank);
                    let mut pieces = c.result(&place);
                    pieces.sort_by_key(|p| p.dst.start);
                    let mut end = 0;
                    for p in &pieces {
                        assert_eq!(p.dst.start, end, "{c} n={n} rank={rank}: {pieces:?}");
                        end = p.dst.end;
                    }
                    assert_eq!(end, counts.recv, "{c} n={n} rank={rank}");
                }
            }
        }
    }
}
