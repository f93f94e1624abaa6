//! How long a collective takes, measured the way nccl-tests does: warm-up iterations first, every
//! rank starts each iteration together (a barrier), and an iteration's time is the slowest rank's.
//! Collectives return only when their work is done (NCCL's are waited for on the device), so the
//! wall-clock time includes the device time. Bandwidths use nccl-tests' formulas:
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

/// Runs `op` `warmup` times untimed, then `iters` times timed. Every iteration starts after a
/// barrier; its time is the slowest rank's (an all-reduce of the ranks' times with Max, outside
/// the timed region).
pub fn time_iterations(
    comm: &Communicator,
    warmup: usize,
    iters: usize,
    mut op: impl FnMut() -> Result<()>,
) -> Result<Timing> {
    let warming = crate::profile::range(|| format!("warm-up x{warmup}"));
    for _ in 0..warmup {
        comm.barrier()?;
        op()?;
    }
    drop(warming);
    let _timed = crate::profile::range(|| format!("timed loop x{iters}"));
    let mut mine = Vec::with_capacity(iters);
    for _ in 0..iters {
        comm.barrier()?;
        let start = Instant::now();
        op()?;
        mine.push(start.elapsed().as_secs_f64());
    }
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
