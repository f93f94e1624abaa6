//! How long a collective takes: a loop modelled on nccl-tests' (its `BenchTime` in
//! `src/common.cu`) with its flags, but not the same program. Exactly:
//!
//! - warm-up iterations first, untimed, each after a barrier (nccl-tests runs its warm-up back to
//!   back, once per size and type before the sweep); then, even with no warm-up (`-w 0`), one
//!   more untimed call, waited for, as nccl-tests' `BenchTime` starts with one ("Sync":
//!   `startColl` + `completeColl`) so that NCCL's lazy connection setup of the first call is never
//!   timed; then a barrier, so every rank starts the timed loop together; then `iters`
//!   iterations of `aggregate` calls (one group when several), waited for as `-z` says
//!   ([`Waiting`]: nccl-tests' 0, 1 and 3; its 2, each call waited for with no barrier, is not
//!   offered);
//! - every barrier goes through the communicator itself (on NCCL an all-reduce of one int32, a
//!   kernel on the rank's stream; on the CPU a dissemination barrier over its transport), where
//!   nccl-tests' is MPI's or its threads' on the host;
//! - **a rank's time** is the host clock's (nccl-tests' `timer`, a steady clock), per call: the
//!   loop's time over iterations × calls, from the launch of the first call to the end of the
//!   last one's work (the GPU's work on NCCL, which is waited for); with `-z 3` only the time
//!   from each iteration's launch to the end of its work counts, not the barriers between them;
//! - **the time reported** combines the ranks' times as nccl-tests' `-a` says ([`Average`]): by
//!   default the mean over ranks of each rank's mean over iterations;
//! - **per iteration** (nccl-tests' `-I 1`), each iteration's time is read between marks on the
//!   rank's own clock of its work ([`Stopwatch`]: CUDA events on the rank's stream on NCCL,
//!   `cuEventElapsedTime`; the host clock on the CPU backend, whose calls are done when they
//!   return), and the slowest rank's is kept for each iteration, as nccl-tests' per-iteration
//!   report does; the median, min and max are over those. With `-z 3` the closing mark of each
//!   iteration is made after the wait for its work, as nccl-tests records its stop event after
//!   `testStreamSynchronize`. Without marks the iterations are timed on the host clock where the
//!   loop waits for each (`-z 1`, `-z 3`).
//!
//! Which buffers each call uses is the caller's: nccl-tests shifts its buffers every iteration
//! (`startColl`'s `shift`), and comm-bench turns through several buffer sets on NCCL the same way
//! (comm-bench's `measure.rs`).
//!
//! The ranks' times travel once, after the loop (outside the timed region): one all-reduce with
//! `Max` of a vector holding every rank's time at its own index (zeros elsewhere) and the
//! iteration times. Bandwidths use nccl-tests' formulas: algbw = bytes / time, busbw = algbw × a
//! factor that makes the number comparable to a link's speed whatever the world size (the
//! collective table's [`Collective::bus_factor`]).

use std::time::{Duration, Instant};

use crate::collective::Collective;
use crate::comm::Communicator;
use crate::dtype::ReduceOp;
use crate::error::Result;
pub use crate::stopwatch::{Clock, Stopwatch};

/// GB/s (10^9 bytes per second, as nccl-tests reports) for `bytes` in `seconds`.
pub fn algbw(bytes: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / seconds / 1e9
    } else {
        0.0
    }
}

/// algbw × the collective's bus factor: comparable to a link's speed whatever the world size.
pub fn busbw(collective: Collective, world_size: usize, bytes: usize, seconds: f64) -> f64 {
    algbw(bytes, seconds) * collective.bus_factor(world_size)
}

/// How the ranks' times become one: nccl-tests' `-a` (its `Allreduce(…, average)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Average {
    /// `-a 0`: rank 0's time.
    Rank0,
    /// `-a 1`, nccl-tests' default: the mean over ranks (of each rank's mean over iterations).
    #[default]
    Mean,
    /// `-a 2`: the fastest rank's.
    Min,
    /// `-a 3`: the slowest rank's.
    Max,
}

impl Average {
    /// Every value, in flag order.
    pub const ALL: [Average; 4] = [Average::Rank0, Average::Mean, Average::Min, Average::Max];

    /// nccl-tests' number for it.
    pub fn flag(self) -> u8 {
        self as u8
    }

    /// From nccl-tests' number; None for anything but 0 to 3.
    pub fn from_flag(a: u8) -> Option<Average> {
        Average::ALL.get(usize::from(a)).copied()
    }

    /// Which time over the ranks is reported, in words ("the mean").
    pub fn describe(self) -> &'static str {
        match self {
            Average::Rank0 => "rank 0's",
            Average::Mean => "the mean",
            Average::Min => "the fastest rank's",
            Average::Max => "the slowest rank's",
        }
    }
}

/// What a timed loop measured, the same on every rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    /// Each rank's time per call over the timed loop, on the host clock (nccl-tests' `deltaSec`
    /// before its `-a`), by rank.
    pub ranks: Vec<f64>,
    /// Per timed iteration, in the order they ran, per call: the slowest rank's time, from
    /// `clock`. One entry, the slowest rank's loop time per call, when the loop had no marks and
    /// did not wait for each iteration (`-z 0` without per-iteration timing).
    pub iterations: Vec<f64>,
    /// Where `iterations` come from.
    pub clock: Clock,
}

impl Timing {
    /// The time reported, nccl-tests' time column: the ranks' times combined as `average`
    /// says. 0 when there are none.
    pub fn time(&self, average: Average) -> f64 {
        let r = &self.ranks;
        if r.is_empty() {
            return 0.0;
        }
        match average {
            Average::Rank0 => r[0],
            Average::Mean => r.iter().sum::<f64>() / r.len() as f64,
            Average::Min => r.iter().copied().fold(f64::INFINITY, f64::min),
            Average::Max => r.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }

    fn sorted(&self) -> Vec<f64> {
        let mut s = self.iterations.clone();
        s.sort_by(f64::total_cmp);
        s
    }

    /// The middle iteration time ([`median`]). 0 when there are none.
    pub fn median(&self) -> f64 {
        median(self.iterations.iter().copied())
    }

    /// The fastest iteration.
    pub fn min(&self) -> f64 {
        self.sorted().first().copied().unwrap_or(0.0)
    }

    /// The slowest iteration.
    pub fn max(&self) -> f64 {
        self.sorted().last().copied().unwrap_or(0.0)
    }
}

/// Where the median sits among `len` values sorted ascending: the upper middle of an even count
/// (`sorted[len / 2]`), as nccl-tests' per-iteration p50. The workspace's one median convention:
/// a Timing's iterations, comm-bench's rows of one size and its fits all use it, so the same
/// values give the same median whichever file takes it.
pub fn median_index(len: usize) -> usize {
    len / 2
}

/// The median of `values` at [`median_index`]; 0 when there are none.
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut sorted: Vec<f64> = values.into_iter().collect();
    sorted.sort_by(f64::total_cmp);
    sorted
        .get(median_index(sorted.len()))
        .copied()
        .unwrap_or(0.0)
}

/// How a timed loop waits for its collectives: nccl-tests' `-z` (0, 1 and 3; its 2, each call
/// waited for with no barrier, is not offered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// `-z 0`, nccl-tests' default: the iterations are enqueued back to back and waited for once
    /// at the end; a rank's time runs from the first launch to the end of the last call's work,
    /// over the number of calls, so the launch of one call hides behind the previous one's work.
    BackToBack,
    /// `-z 1`: each iteration is waited for, then the ranks meet at a barrier before the next;
    /// the rank's clock runs through the whole loop, barriers included, over the number of calls.
    BarrierEach,
    /// `-z 3`: each iteration is waited for and timed alone, from its launch to the end of its
    /// work; the barrier between iterations is not timed. A rank's time is the sum over the
    /// number of calls: the latency of one collective on its own.
    EachCall,
}

impl Waiting {
    /// Every value, in flag order.
    pub const ALL: [Waiting; 3] = [Waiting::BackToBack, Waiting::BarrierEach, Waiting::EachCall];

    /// nccl-tests' `-z` number.
    pub fn flag(self) -> u8 {
        match self {
            Waiting::BackToBack => 0,
            Waiting::BarrierEach => 1,
            Waiting::EachCall => 3,
        }
    }

    /// From nccl-tests' `-z` number; None for 2 and anything above 3.
    pub fn from_flag(z: u8) -> Option<Waiting> {
        Waiting::ALL.into_iter().find(|w| w.flag() == z)
    }

    /// What a rank's clock covers, in words.
    pub fn describe(self) -> &'static str {
        match self {
            Waiting::BackToBack => {
                "from a barrier to the end of the last call's work, calls enqueued back to back and \
                 waited for once"
            }
            Waiting::BarrierEach => {
                "over the whole loop, each iteration waited for and followed by a barrier (counted)"
            }
            Waiting::EachCall => {
                "from each iteration's launch to the end of its work, summed; the barrier between \
                 iterations not counted"
            }
        }
    }

    /// Marks a loop of `iters` iterations makes: one before each iteration and one after the
    /// last (shared boundaries), or with `-z 3` a pair around each iteration, as nccl-tests'
    /// `getEventCount`.
    pub fn marks(self, iters: usize) -> usize {
        match self {
            Waiting::EachCall => 2 * iters,
            _ => iters + 1,
        }
    }

    /// The marks that bound iteration `j`.
    fn bounds(self, j: usize) -> (usize, usize) {
        match self {
            Waiting::EachCall => (2 * j, 2 * j + 1),
            _ => (j, j + 1),
        }
    }
}

/// A timed loop: `warmup` untimed iterations and one untimed call (nccl-tests' "Sync"), then
/// `iters` timed ones, each of `aggregate` calls in one group (nccl-tests' `-m`), waited for as
/// `waiting` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loop {
    /// Untimed iterations first (one untimed call follows them even when this is 0).
    pub warmup: usize,
    /// Timed iterations.
    pub iters: usize,
    /// Calls per iteration, enqueued as one group (1: no group).
    pub aggregate: usize,
    /// How the calls are waited for.
    pub waiting: Waiting,
    /// nccl-tests' `-I 1`: time each iteration between marks of a [`Stopwatch`] (CUDA events on
    /// NCCL). The marks cost a `cuEventRecord` each inside the timed region, as in nccl-tests.
    pub per_iteration: bool,
}

/// Runs `op` `warmup` times untimed (and once more, as every loop does), then `iters` times
/// timed, each call waited for and timed alone on the host clock, the barrier between calls not
/// timed: the loop of [`Waiting::EachCall`] (`-z 3`), one call per iteration; [`Timing::median`] is the median of the slowest rank's
/// iteration times.
pub fn time_iterations(
    comm: &Communicator,
    warmup: usize,
    iters: usize,
    op: impl FnMut() -> Result<()>,
) -> Result<Timing> {
    let each_call = Loop {
        warmup,
        iters,
        aggregate: 1,
        waiting: Waiting::EachCall,
        per_iteration: false,
    };
    time_loop(comm, &each_call, op)
}

/// Times `op` as `plan` says, with a stopwatch of its own (see [`time_loop_with`]).
pub fn time_loop(
    comm: &Communicator,
    plan: &Loop,
    op: impl FnMut() -> Result<()>,
) -> Result<Timing> {
    let mut stopwatch = comm.stopwatch();
    time_loop_with(comm, plan, &mut stopwatch, op)
}

/// Times `op` as `plan` says; every rank must call it. `stopwatch` (from
/// [`Communicator::stopwatch`], reused from loop to loop) marks the iterations when
/// `plan.per_iteration`. The times are per call (an aggregated iteration's over its calls).
pub fn time_loop_with(
    comm: &Communicator,
    plan: &Loop,
    stopwatch: &mut Stopwatch,
    mut op: impl FnMut() -> Result<()>,
) -> Result<Timing> {
    let aggregate = plan.aggregate.max(1);
    let iters = plan.iters;
    // One iteration: `aggregate` calls, grouped when there are several, as nccl-tests does.
    let iteration = |op: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        match aggregate {
            1 => op(),
            n => comm.group(|| (0..n).try_for_each(|_| op())),
        }
    };
    let warming = crate::trace::Span::range(|| format!("warm-up x{}", plan.warmup));
    for _ in 0..plan.warmup {
        comm.barrier()?;
        iteration(&mut op)?;
    }
    // nccl-tests' "Sync" at the start of `BenchTime`: one call, waited for (outside a batch a
    // call returns once its work is done), whatever -w says; NCCL connects a pair of ranks
    // lazily, at the first call that needs them, and that call is never a timed one.
    op()?;
    drop(warming);
    let mut iteration = || iteration(&mut op);
    let marking = plan.per_iteration;
    stopwatch.reset();
    if marking {
        stopwatch.reserve(plan.waiting.marks(iters))?;
    }
    let mut mark = || match marking {
        true => stopwatch.mark(),
        false => Ok(()),
    };
    // Every rank starts the timed loop together, as after nccl-tests' Barrier.
    comm.barrier()?;
    let timed = crate::trace::Span::range(|| format!("timed loop x{iters}"));
    let (total, host) = run_timed(comm, plan.waiting, iters, &mut mark, &mut iteration)?;
    drop(timed);
    let calls = (iters.max(1) * aggregate) as f64;
    let per_call = |d: Duration| d.as_secs_f64() / aggregate as f64;
    let (iterations, clock) = if marking {
        let times = (0..iters)
            .map(|j| {
                let (from, to) = plan.waiting.bounds(j);
                Ok(stopwatch.seconds(from, to)? / aggregate as f64)
            })
            .collect::<Result<Vec<f64>>>()?;
        (times, stopwatch.clock())
    } else if plan.waiting == Waiting::BackToBack {
        (vec![total.as_secs_f64() / calls], Clock::Host)
    } else {
        (host.into_iter().map(per_call).collect(), Clock::Host)
    };
    let (ranks, iterations) = gather(comm, total.as_secs_f64() / calls, &iterations)?;
    Ok(Timing {
        ranks,
        iterations,
        clock,
    })
}

/// The timed loop itself, as `waiting` says: its total time, and each iteration's on the host
/// clock where the loop waits for each. `mark` marks the stopwatch (or does nothing).
fn run_timed(
    comm: &Communicator,
    waiting: Waiting,
    iters: usize,
    mark: &mut dyn FnMut() -> Result<()>,
    iteration: &mut dyn FnMut() -> Result<()>,
) -> Result<(Duration, Vec<Duration>)> {
    let mut host = Vec::with_capacity(iters);
    let total = match waiting {
        Waiting::BackToBack => {
            let start = Instant::now();
            comm.batch(|| {
                for _ in 0..iters {
                    mark()?;
                    iteration()?;
                }
                mark()
            })?;
            start.elapsed()
        }
        Waiting::BarrierEach => {
            let start = Instant::now();
            let mut last = start;
            for _ in 0..iters {
                mark()?;
                iteration()?;
                comm.barrier()?;
                let now = Instant::now();
                host.push(now - last);
                last = now;
            }
            mark()?;
            last - start
        }
        Waiting::EachCall => {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                // As nccl-tests' -z 3: the opening mark and the calls, then the wait for them
                // (the batch's end), then the closing mark, recorded after the wait (its
                // `recordEvents(…, 1)` follows `testStreamSynchronize`) and inside the host time.
                comm.batch(|| {
                    mark()?;
                    iteration()
                })?;
                mark()?;
                let took = start.elapsed();
                host.push(took);
                total += took;
                comm.barrier()?;
            }
            total
        }
    };
    Ok((total, host))
}

/// Every rank's `mine` by rank, and the slowest rank's value of each of `each`: one all-reduce
/// with `Max` (times are never negative, so a rank's zeros in the others' slots change nothing).
fn gather(comm: &Communicator, mine: f64, each: &[f64]) -> Result<(Vec<f64>, Vec<f64>)> {
    let n = comm.world_size();
    let mut values = vec![0.0f64; n];
    values[comm.rank()] = mine;
    values.extend_from_slice(each);
    let mut buf = comm.buffer(&values)?;
    comm.all_reduce(&mut buf, ReduceOp::Max)?;
    let mut all = comm.to_host(&buf)?;
    let each = all.split_off(n);
    Ok((all, each))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidths() {
        // 100 MB all_reduce in 100 ms on 4 ranks: algbw 1.0 GB/s, busbw 1.5 GB/s.
        assert!((algbw(100_000_000, 0.1) - 1.0).abs() < 1e-12);
        assert!((busbw(Collective::AllReduce, 4, 100_000_000, 0.1) - 1.5).abs() < 1e-12);
        assert_eq!(algbw(1, 0.0), 0.0);
    }

    /// nccl-tests' -a on known times: 4 ranks, each rank's time its mean over iterations.
    #[test]
    fn average_flags_combine_the_ranks_as_nccl_tests_does() {
        // Per rank, per iteration (seconds); a rank's time is its mean over iterations.
        let per_iteration = [
            [4.0, 6.0, 5.0], // rank 0: 5
            [1.0, 2.0, 3.0], // rank 1: 2
            [9.0, 9.0, 9.0], // rank 2: 9
            [8.0, 7.0, 9.0], // rank 3: 8
        ];
        let ranks: Vec<f64> = per_iteration
            .iter()
            .map(|it| it.iter().sum::<f64>() / it.len() as f64)
            .collect();
        let t = Timing {
            ranks,
            iterations: vec![],
            clock: Clock::Host,
        };
        let by_flag: Vec<f64> = (0..4)
            .map(|a| t.time(Average::from_flag(a).unwrap()))
            .collect();
        assert_eq!(by_flag, vec![5.0, 6.0, 2.0, 9.0]);
        assert_eq!(Average::default(), Average::Mean);
        assert_eq!(Average::from_flag(4), None);
        for a in Average::ALL {
            assert_eq!(Average::from_flag(a.flag()), Some(a));
        }
        let none = Timing { ranks: vec![], ..t };
        assert_eq!(none.time(Average::Mean), 0.0);
    }

    #[test]
    fn iteration_statistics_are_nccl_tests_per_iteration_ones() {
        let t = Timing {
            ranks: vec![1.0],
            iterations: vec![3.0, 1.0, 2.0, 10.0],
            clock: Clock::Host,
        };
        // p50 = sorted[n / 2], the upper middle for an even count, as nccl-tests' -I report.
        assert_eq!((t.median(), t.min(), t.max()), (3.0, 1.0, 10.0));
        let odd = Timing {
            iterations: vec![5.0, 1.0, 3.0],
            ..t.clone()
        };
        assert_eq!(odd.median(), 3.0);
        let t = Timing {
            iterations: vec![],
            ..t
        };
        assert_eq!((t.median(), t.min(), t.max()), (0.0, 0.0, 0.0));
    }

    #[test]
    fn blocking_flags_are_nccl_tests_but_two() {
        assert_eq!(Waiting::ALL.map(Waiting::flag), [0, 1, 3], "-z 0, 1 and 3");
        for w in Waiting::ALL {
            assert_eq!(Waiting::from_flag(w.flag()), Some(w));
        }
        assert_eq!(Waiting::from_flag(2), None);
        assert_eq!(Waiting::from_flag(4), None);
    }

    /// -z modes' arithmetic: which marks bound an iteration (nccl-tests' startEvent/stopEvent),
    /// and how many a loop makes (its getEventCount).
    #[test]
    fn marks_bound_iterations_as_nccl_tests_events_do() {
        // Boundary events shared: iteration j runs from mark j to mark j + 1.
        assert_eq!(Waiting::BackToBack.marks(20), 21);
        assert_eq!(Waiting::BarrierEach.marks(20), 21);
        assert_eq!(Waiting::BackToBack.bounds(3), (3, 4));
        assert_eq!(Waiting::BarrierEach.bounds(0), (0, 1));
        // -z 3: a pair around each iteration, the barrier between pairs outside them.
        assert_eq!(Waiting::EachCall.marks(20), 40);
        assert_eq!(Waiting::EachCall.bounds(3), (6, 7));
    }
}
