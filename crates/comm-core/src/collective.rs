//! One description per collective, in the spirit of nccl-tests' `testColl`: its name, its bus
//! factor, the element counts for a size and world size, whether it has a root, a reduction and
//! an in-place form, and what every rank must hold afterwards. A [`Call`] is one use of an entry
//! (with its reduction, root or peers), and [`Call::check`] is the one place buffer lengths are
//! checked against it.
//!
//! Everything that runs collectives reads this table: [`Communicator::collective`](crate::comm::Communicator::collective), which checks
//! a call here and hands it to a backend; the correctness checks ([`crate::check`],
//! `collective-check`, the GPU check script); the collective tests; comm-bench's plan, measurement
//! and report.
//!
//! Adding a collective touches these files, and after its variant the compiler names each of
//! them in turn: no `match` on a collective has a `_` arm, so one left out does not build rather
//! than silently get a default (`crates/comm-core/tests/new_collective.rs` adds a variant to a
//! scratch copy of the workspace, follows the errors, and holds this list to the files they
//! name):
//!
//! - `crates/comm-core/src/collective.rs`: its variant in `collectives!` and its entry in
//!   `TABLE` (as long as [`Collective::ALL`], so a missing entry does not build);
//! - `crates/comm-core/src/backend/cpu/algorithms/mod.rs`: its arm in `run`, the CPU dispatch,
//!   which calls its CPU algorithm, and its named algorithms in `schedules` (none: `&[]`)...
//! - `crates/comm-core/src/backend/cpu/algorithms/<family>.rs`: ...the algorithm, which you
//!   write in the family's file it belongs to (or a new one), each named one with its `Schedule`
//!   beside it: its steps and bytes, which the algorithm, `--steps` and comm-bench's model read;
//! - `crates/comm-core/src/backend/cpu/algorithms/choice.rs`: the rule in `chosen` that picks
//!   among its named algorithms (none: `None`);
//! - `crates/comm-core/src/backend/cpu/algorithms/registered.rs`: its arm in `registered`, the
//!   algorithm that reads the peers' registered buffers in place with its `Schedule` (none:
//!   `None`, and its calls take the messages);
//! - `crates/comm-core/src/backend/cpu/shm/window.rs`: its arm in `registered_from`, the size
//!   from which `--copy auto` takes that algorithm (none: 0);
//! - `crates/comm-core/src/backend/nccl/collectives.rs`: its NCCL name and its `ncclX` call (or
//!   group of sends and receives);
//! - `crates/comm-bench/src/model/nccl.rs`: whether NCCL's cost model (tuning.cc) has a cost for
//!   it (`func`), which `comm-bench predict` offers.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use crate::dtype::ReduceOp;
use crate::error::{CommError, Result};

/// Declares [`Collective`] and [`Collective::ALL`] from one list, so that no variant can be
/// missing from `ALL` (and so from `TABLE`, whose length is `ALL`'s).
macro_rules! collectives {
    ($($(#[doc = $doc:literal])* $variant:ident,)*) => {
        /// The collectives, named as nccl-tests names its programs.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Collective {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Collective {
            /// Every collective, in the order tables list them (the order declared).
            pub const ALL: [Collective; [$(Collective::$variant),*].len()] =
                [$(Collective::$variant),*];
        }
    };
}

collectives! {
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
    /// The root's receive buffer gets every rank's block, in rank order.
    Gather,
    /// Block `rank` of the root's send buffer lands on rank `rank`.
    Scatter,
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

/// What an entry says unless it says otherwise.
const BASE: Description = Description {
    collective: Collective::AllReduce,
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

/// The table, in [`Collective`]'s order (entry `c as usize` describes `c`).
const TABLE: [Description; Collective::ALL.len()] = [
    Description {
        collective: Collective::AllReduce,
        name: "all_reduce",
        title: "AllReduce",
        bus_factor: ring,
        bus_rule: "2(n-1)/n",
        reduces: true,
        result: |p| vec![piece(0..p.count, Origin::Reduced, 0)],
        ..BASE
    },
    Description {
        collective: Collective::AllGather,
        name: "all_gather",
        title: "AllGather",
        bus_factor: all_but_own,
        bus_rule: "(n-1)/n",
        recv: Span::WorldBlocks,
        result: |p| {
            let each = |r| piece(block(r, p.count), Origin::Rank(r), 0);
            (0..p.world_size).map(each).collect()
        },
        ..BASE
    },
    Description {
        collective: Collective::ReduceScatter,
        name: "reduce_scatter",
        title: "ReduceScatter",
        bus_factor: all_but_own,
        bus_rule: "(n-1)/n",
        reduces: true,
        send: Span::WorldBlocks,
        result: |p| vec![piece(0..p.count, Origin::Reduced, p.rank * p.count)],
        ..BASE
    },
    Description {
        collective: Collective::Broadcast,
        name: "broadcast",
        title: "Broadcast",
        rooted: true,
        result: |p| vec![piece(0..p.count, Origin::Rank(p.root), 0)],
        ..BASE
    },
    Description {
        collective: Collective::Reduce,
        name: "reduce",
        title: "Reduce",
        rooted: true,
        reduces: true,
        result: |p| match p.rank == p.root {
            true => vec![piece(0..p.count, Origin::Reduced, 0)],
            false => vec![piece(0..p.count, Origin::Unchanged, 0)],
        },
        ..BASE
    },
    Description {
        collective: Collective::SendRecv,
        name: "sendrecv",
        title: "SendRecv",
        in_place: false,
        min_ranks: 2,
        result: |p| {
            let prev = (p.rank + p.world_size - 1) % p.world_size;
            vec![piece(0..p.count, Origin::Rank(prev), 0)]
        },
        ..BASE
    },
    // ANCHOR: alltoall
    // Sending from and receiving into one buffer at once would race: out of place only,
    // as nccl-tests checks it.
    Description {
        collective: Collective::AllToAll,
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
        ..BASE
    },
    // ANCHOR_END: alltoall
    // NCCL before 2.28 has no gather: nccl-tests builds it from one group of sends to the root and,
    // on the root, a receive from every rank. Every rank holds a receive buffer of n
    // blocks, as nccl-tests allocates it; only the root's is written.
    Description {
        collective: Collective::Gather,
        name: "gather",
        title: "Gather",
        bus_factor: all_but_own,
        bus_rule: "(n-1)/n",
        rooted: true,
        recv: Span::WorldBlocks,
        result: |p| match p.rank == p.root {
            true => {
                let each = |r| piece(block(r, p.count), Origin::Rank(r), 0);
                (0..p.world_size).map(each).collect()
            }
            false => vec![piece(0..p.world_size * p.count, Origin::Unchanged, 0)],
        },
        ..BASE
    },
    // Gather's mirror image, from nccl-tests too: the root sends block j to rank j.
    Description {
        collective: Collective::Scatter,
        name: "scatter",
        title: "Scatter",
        bus_factor: all_but_own,
        bus_rule: "(n-1)/n",
        rooted: true,
        send: Span::WorldBlocks,
        result: |p| vec![piece(0..p.count, Origin::Rank(p.root), p.rank * p.count)],
        ..BASE
    },
];

// The table is in the enum's order: entry `c as usize` describes `c`.
const _: () = {
    let mut i = 0;
    while i < TABLE.len() {
        assert!(
            TABLE[i].collective as usize == i,
            "TABLE is not in Collective's order"
        );
        i += 1;
    }
};

impl Collective {
    /// The table entry.
    pub fn describe(self) -> Description {
        TABLE[self as usize]
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

/// One call of a collective: its table entry and what it takes besides the buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// Which collective.
    pub collective: Collective,
    /// The reduction, for collectives that reduce.
    pub op: ReduceOp,
    /// The root, for rooted collectives.
    pub root: usize,
    /// sendrecv's peers (to, from); `None` for nccl-tests' ring: to rank+1, from rank-1.
    pub peers: Option<(usize, usize)>,
}

impl Call {
    /// A call of `collective` with a sum, root 0 and the ring's peers.
    pub fn new(collective: Collective) -> Call {
        Call {
            collective,
            op: ReduceOp::Sum,
            root: 0,
            peers: None,
        }
    }

    /// With reduction `op`.
    pub fn op(self, op: ReduceOp) -> Call {
        Call { op, ..self }
    }

    /// With root `root`.
    pub fn root(self, root: usize) -> Call {
        Call { root, ..self }
    }

    /// Sending to `to` while receiving from `from` (sendrecv).
    pub fn peers(self, to: usize, from: usize) -> Call {
        Call {
            peers: Some((to, from)),
            ..self
        }
    }

    /// sendrecv's (to, from) for `rank` of `world_size`.
    pub fn exchange_peers(&self, rank: usize, world_size: usize) -> (usize, usize) {
        let ring = (
            (rank + 1) % world_size,
            (rank + world_size - 1) % world_size,
        );
        self.peers.unwrap_or(ring)
    }

    /// Checks the call's arguments, and the lengths of its buffers against the table, on `rank`
    /// of `world_size`: `send` is the send buffer's length (`None` in place, where `recv` is the
    /// one buffer's). The only way to a [`Checked`] call, which the backends take; a usage error
    /// names what is wrong.
    pub fn check(
        &self,
        send: Option<usize>,
        recv: usize,
        rank: usize,
        world_size: usize,
    ) -> Result<Checked> {
        let d = self.collective.describe();
        let usage = |what: String| Err(CommError::Usage(format!("{}: {what}", d.name)));
        if world_size < d.min_ranks {
            return usage(format!(
                "needs at least {} ranks (world size {world_size})",
                d.min_ranks
            ));
        }
        if d.rooted && self.root >= world_size {
            return usage(format!(
                "root {} is not a rank (world size {world_size})",
                self.root
            ));
        }
        for peer in self.peers.iter().flat_map(|&(to, from)| [to, from]) {
            another_rank(d.name, peer, rank, world_size)?;
        }
        if send.is_none() && !d.in_place {
            return usage("has no in-place form: give a send and a receive buffer".into());
        }
        let count = self.count_of(send, recv, world_size)?;
        if count.checked_mul(world_size).is_none() {
            return usage(format!("count {count} × world size {world_size} overflows"));
        }
        let counts = self.collective.counts(count, world_size, rank);
        let wants = match send {
            None => [("buffer", recv, counts.whole())].to_vec(),
            Some(send) => [("send", send, counts.send), ("recv", recv, counts.recv)].to_vec(),
        };
        if let Some((side, len, want)) = wants.into_iter().find(|(_, len, want)| len != want) {
            return usage(format!(
                "{side} has {len} elements but must have {want} (count {count}, world size \
                 {world_size})"
            ));
        }
        Ok(Checked {
            call: *self,
            counts,
            in_place: send.is_none(),
            rank,
            world_size,
        })
    }

    /// The call's count, from the side the table sizes by it (or from whole blocks).
    fn count_of(&self, send: Option<usize>, recv: usize, world_size: usize) -> Result<usize> {
        let d = self.collective.describe();
        let blocks = |len: usize| match len.is_multiple_of(world_size) {
            true => Ok(len / world_size),
            false => Err(CommError::Usage(format!(
                "{}: a buffer of {len} elements does not split into {world_size} equal blocks",
                d.name
            ))),
        };
        match (send, d.send, d.recv) {
            (None, Span::Count, Span::Count) => Ok(recv),
            (None, _, _) => blocks(recv),
            (Some(_), _, Span::Count) => Ok(recv),
            (Some(send), Span::Count, _) => Ok(send),
            (Some(send), _, _) => blocks(send),
        }
    }
}

/// `peer` is a rank of `world_size` other than `rank`, or a usage error for `what` says it is
/// not: the point-to-point calls and sendrecv's peers.
pub(crate) fn another_rank(what: &str, peer: usize, rank: usize, world_size: usize) -> Result<()> {
    if peer >= world_size || peer == rank {
        return Err(CommError::Usage(format!(
            "{what}: peer {peer} is not another rank (rank {rank}, world size {world_size})"
        )));
    }
    Ok(())
}

/// A call whose buffer lengths [`Call::check`] found right for its rank and world size: what a
/// backend runs. Only `check` makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// The call.
    pub call: Call,
    /// Its buffers' lengths and in-place offsets.
    pub counts: Counts,
    /// One buffer (of `counts.whole()` elements) rather than two.
    pub in_place: bool,
    rank: usize,
    world_size: usize,
}

impl Checked {
    /// The rank it was checked for.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The world size it was checked for.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Whether buffers of these lengths are the ones checked, on `world_size` ranks: what a
    /// backend that hands raw pointers on asserts before it does.
    pub fn fits(&self, send: Option<usize>, recv: usize, world_size: usize) -> bool {
        let lengths = match send {
            None => self.in_place && recv == self.counts.whole(),
            Some(send) => !self.in_place && send == self.counts.send && recv == self.counts.recv,
        };
        lengths && world_size == self.world_size
    }
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
        assert_eq!(Collective::Gather.bus_factor(4), 0.75);
        assert_eq!(Collective::Scatter.bus_factor(8), 0.875);
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
        assert!("gatherv"
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

    fn usage(checked: Result<Checked>) -> String {
        match checked {
            Err(CommError::Usage(text)) => text,
            other => panic!("not a usage error: {other:?}"),
        }
    }

    fn call(c: Collective) -> Call {
        Call::new(c)
    }

    #[test]
    fn same_length_collectives_want_count_on_both_sides() {
        use Collective::*;
        for c in [AllReduce, Broadcast, Reduce] {
            let checked = call(c).check(Some(5), 5, 1, 4).unwrap();
            assert_eq!((checked.counts.count, checked.in_place), (5, false));
            assert_eq!(call(c).check(None, 5, 1, 4).unwrap().counts.whole(), 5);
            let err = usage(call(c).check(Some(3), 5, 1, 4));
            assert!(
                err.starts_with(c.name()) && err.contains("send has 3 elements but must have 5"),
                "{err}"
            );
        }
    }

    #[test]
    fn all_gather_wants_count_in_and_world_size_blocks_out() {
        let ag = call(Collective::AllGather);
        assert_eq!(ag.check(Some(2), 8, 0, 4).unwrap().counts.count, 2);
        let in_place = ag.check(None, 8, 2, 4).unwrap();
        // NCCL's in-place convention: the input is this rank's block of the one buffer.
        assert_eq!(in_place.counts.in_place_send_offset, 4);
        let err = usage(ag.check(Some(2), 6, 0, 4));
        assert_eq!(
            err,
            "all_gather: recv has 6 elements but must have 8 (count 2, world size 4)"
        );
        let err = usage(ag.check(None, 6, 0, 4));
        assert!(
            err.contains("6 elements does not split into 4 equal blocks"),
            "{err}"
        );
    }

    #[test]
    fn reduce_scatter_wants_world_size_blocks_in_and_count_out() {
        let rs = call(Collective::ReduceScatter);
        assert_eq!(rs.check(Some(8), 2, 0, 4).unwrap().counts.count, 2);
        let in_place = rs.check(None, 8, 3, 4).unwrap();
        assert_eq!(in_place.counts.in_place_recv_offset, 6);
        let err = usage(rs.check(Some(6), 2, 0, 4));
        assert!(err.contains("send has 6 elements but must have 8"), "{err}");
        usage(rs.check(Some(8), 8, 0, 4));
        usage(rs.check(None, 2, 0, 4));
    }

    #[test]
    fn all_to_all_is_out_of_place_with_world_size_blocks_on_both_sides() {
        let a2a = call(Collective::AllToAll);
        assert_eq!(a2a.check(Some(6), 6, 0, 3).unwrap().counts.count, 2);
        usage(a2a.check(Some(6), 4, 0, 3));
        usage(a2a.check(Some(4), 4, 0, 3));
        let err = usage(a2a.check(None, 6, 0, 3));
        assert!(err.contains("has no in-place form"), "{err}");
    }

    #[test]
    fn roots_and_peers_must_be_ranks() {
        let err = usage(call(Collective::Broadcast).root(4).check(None, 1, 0, 4));
        assert_eq!(err, "broadcast: root 4 is not a rank (world size 4)");
        let exchange = call(Collective::SendRecv);
        assert_eq!(exchange.exchange_peers(0, 4), (1, 3));
        assert_eq!(exchange.peers(2, 2).exchange_peers(0, 4), (2, 2));
        let err = usage(exchange.peers(1, 0).check(Some(3), 3, 0, 2));
        assert!(
            err.contains("sendrecv: peer 0 is not another rank"),
            "{err}"
        );
        let err = usage(exchange.check(Some(3), 3, 0, 1));
        assert!(err.contains("needs at least 2 ranks"), "{err}");
    }

    #[test]
    fn a_count_that_overflows_is_refused() {
        let err = usage(call(Collective::AllGather).check(Some(usize::MAX), 1, 0, 2));
        assert!(err.contains("overflows"), "{err}");
    }

    #[test]
    fn checked_calls_fit_only_their_own_buffers() {
        let checked = call(Collective::AllGather).check(Some(2), 8, 0, 4).unwrap();
        assert!(checked.fits(Some(2), 8, 4));
        assert!(!checked.fits(None, 8, 4));
        assert!(!checked.fits(Some(2), 8, 2));
        assert!(!checked.fits(Some(2), 9, 4));
    }
}
