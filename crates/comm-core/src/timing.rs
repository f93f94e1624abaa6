//! How long a collective takes, measured the way nccl-tests does: warm-up iterations first, then
//! either back to back with one wait at the end (nccl-tests' default) or each call waited for,
//! every rank starting each iteration together (a barrier, `-z 1`); a time is the slowest rank's.
//! Waits are for the device's work (NCCL's calls are waited for on the GPU), so the wall-clock
//! time includes the device time. Bandwidths use nccl-tests' formulas:
//! algbw = bytes / time, busbw = algbw × a factor that makes the number comparable to a link's
//! speed whatever the world size (the collective table's [`Collective::bus_factor`]).

use std::time::Instant;

use crate::collective::Collective;
use crate::comm::Communicator;
use crate::dtype::ReduceOp;
use crate::error::Result;

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

/// Per-iteration times in seconds, each the slowest rank's, the same on every rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    /// One entry per timed iteration, in the order they ran.
    pub seconds: Vec<f64>,
}

impl Timing {
    fn sorted(&self) -> Vec<f64> {
        let mut s = self.seconds.clone();
        s.sort_by(f64::total_cmp);
        s
    }

    /// The middle time (the lower middle for an even count).
    pub fn median(&self) -> f64 {
        let s = self.sorted();
        s.get((s.len().max(1) - 1) / 2).copied().unwrap_or(0.0)
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

/// How a timed loop waits for its collectives: nccl-tests' `-z`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// nccl-tests' default (`-z 0`): the iterations are enqueued back to back and waited for
    /// once at the end; an iteration's time is the total over the number of iterations, so the
    /// launch of one call hides behind the previous one's work.
    BackToBack,
    /// `-z 1`: every iteration starts after a barrier and is waited for before the next; its time
    /// runs from the call to the end of its work (the barrier is not counted), and the loop's time
    /// is the median: the latency of one collective on its own.
    EachCall,
}

/// A timed loop: `warmup` untimed iterations, then `iters` timed ones, each of `aggregate`
/// calls in one group (nccl-tests' `-m`), waited for as `waiting` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loop {
    /// Untimed iterations first.
    pub warmup: usize,
    /// Timed iterations.
    pub iters: usize,
    /// Calls per iteration, enqueued as one group (1: no group).
    pub aggregate: usize,
    /// How the calls are waited for.
    pub waiting: Waiting,
}

/// Runs `op` `warmup` times untimed, then `iters` times timed. Every iteration starts after a
/// barrier; its time is the slowest rank's (an all-reduce of the ranks' times with Max, outside
/// the timed region). The loop of [`Waiting::EachCall`], one call per iteration.
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
    };
    time_loop(comm, &each_call, op)
}

/// Times `op` as `plan` says. Every rank must call it. The times are per call (an aggregated
/// iteration's time over its calls) and the slowest rank's: [`Waiting::EachCall`] gives one per
/// iteration, [`Waiting::BackToBack`] one for the whole loop.
pub fn time_loop(
    comm: &Communicator,
    plan: &Loop,
    mut op: impl FnMut() -> Result<()>,
) -> Result<Timing> {
    let aggregate = plan.aggregate.max(1);
    // One iteration: `aggregate` calls, grouped when there are several, as nccl-tests does.
    let mut iteration = || -> Result<()> {
        match aggregate {
            1 => op(),
            n => comm.group(|| (0..n).try_for_each(|_| op())),
        }
    };
    let warming = crate::profile::range(|| format!("warm-up x{}", plan.warmup));
    for _ in 0..plan.warmup {
        comm.barrier()?;
        iteration()?;
    }
    drop(warming);
    let _timed = crate::profile::range(|| format!("timed loop x{}", plan.iters));
    let calls = aggregate as f64;
    let mine = match plan.waiting {
        Waiting::EachCall => {
            let mut mine = Vec::with_capacity(plan.iters);
            for _ in 0..plan.iters {
                comm.barrier()?;
                let start = Instant::now();
                iteration()?;
                mine.push(start.elapsed().as_secs_f64() / calls);
            }
            mine
        }
        Waiting::BackToBack => {
            comm.barrier()?;
            let start = Instant::now();
            comm.batch(|| (0..plan.iters).try_for_each(|_| iteration()))?;
            let total = start.elapsed().as_secs_f64();
            vec![total / (plan.iters.max(1) as f64 * calls)]
        }
    };
    let mut slowest = comm.buffer(&mine)?;
    comm.all_reduce(&mut slowest, ReduceOp::Max)?;
    Ok(Timing {
        seconds: comm.to_host(&slowest)?,
    })
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

    #[test]
    fn statistics() {
        let t = Timing {
            seconds: vec![3.0, 1.0, 2.0, 10.0],
        };
        assert_eq!((t.median(), t.min(), t.max()), (2.0, 1.0, 10.0));
        let t = Timing { seconds: vec![] };
        assert_eq!(t.median(), 0.0);
    }
}
