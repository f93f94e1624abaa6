//! One rank of a check: the life every program's rank lives (`launch::rank_life`: rendezvous,
//! the work, finish or abort), the work being a job the checker named: the lab's cases on this
//! rank count, the watched case (`--steps`, `--trace`), or the timing. Its output and reports go
//! to the checker's folder ([`crate::report`]).

use std::path::Path;

use comm_core::launch;
use comm_core::{BackendChoice, Named, Result, Settings, Topology};

use crate::catalog::Lab;
use crate::code::Code;
use crate::report::{self, Verdict};
use crate::{compare, ddp, deadlock, groups, panics, pingpong, timing};

/// What a job of ranks does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// The lab's cases on this rank count.
    Cases,
    /// The cases `--steps` and `--trace` show.
    Watch,
    /// The timing, after every case was right.
    Timing,
}

impl Named for Work {
    const ALL: &'static [Work] = &[Work::Cases, Work::Watch, Work::Timing];
    fn name(self) -> &'static str {
        match self {
            Work::Cases => "cases",
            Work::Watch => "watch",
            Work::Timing => "timing",
        }
    }
}

/// The rank counts checked: `-n`'s, or every one of the lab's.
pub fn rank_counts(lab: Lab, only: Option<usize>) -> Vec<usize> {
    only.map_or_else(|| lab.rank_counts().to_vec(), |n| vec![n])
}

/// The cases of `lab` on `ranks` ranks.
pub fn case_count(lab: Lab, ranks: usize) -> usize {
    match lab {
        Lab::PingPong => pingpong::count(),
        Lab::Broadcast | Lab::AllReduce | Lab::Rings => crate::cases::cases(lab, ranks).len(),
        Lab::Ddp | Lab::Zero => ddp::check::Variant::of(lab).len(),
        Lab::Deadlock => deadlock::count(),
        Lab::Groups => groups::layouts(ranks).len(),
    }
}

/// Cases on fewer ranks than `ranks` of those checked, and cases in all.
fn numbering(lab: Lab, ranks: usize, only: Option<usize>) -> (usize, usize) {
    let counts = rank_counts(lab, only);
    let count = |n: usize| case_count(lab, n);
    let before = counts
        .iter()
        .filter(|&&n| n < ranks)
        .map(|&n| count(n))
        .sum();
    (before, counts.iter().map(|&n| count(n)).sum())
}

/// This rank's life in a job of `work`; its exit code.
pub fn main<C: Code>(
    lab: Lab,
    work: Work,
    dir: &Path,
    only: Option<usize>,
    settings: &Settings,
    topology: Topology,
) -> i32 {
    report::init(dir, topology.rank);
    panics::install();
    launch::rank_life(settings, topology, |job| {
        let mut comm = job.communicator(BackendChoice::Cpu)?;
        if lab == Lab::Groups {
            // Lab 8's code has no steps of its own: --steps would show only the checker's calls.
            comm = comm.with_steps(false);
        }
        if work == Work::Timing {
            // The library runs the algorithm the student wrote, unless --algo said otherwise.
            comm = comm.with_algo(settings.algo.or(Some(lab.algo())));
        }
        let done = run::<C>(lab, work, only, &comm, job);
        match done {
            Ok(Some(verdict)) if comm.rank() == 0 => report::verdict(verdict),
            Ok(_) => {}
            Err(_) => {
                report::failed();
                // A job that fails writes no trace; this rank's part, up to the failure, is what
                // the student reads a hang from (the checker merges the parts).
                if let Some(file) = &settings.trace {
                    let _ = comm_core::trace::write_part(file);
                }
            }
        }
        done?;
        comm.close()
    })
}

fn run<C: Code>(
    lab: Lab,
    work: Work,
    only: Option<usize>,
    comm: &comm_core::Communicator,
    job: &comm_core::Job,
) -> Result<Option<Verdict>> {
    let (before, total) = numbering(lab, comm.world_size(), only);
    match (lab, work) {
        (Lab::PingPong, Work::Timing) => pingpong::timing::<C>(comm).map(|()| None),
        (Lab::PingPong, _) => pingpong::cases::<C>(comm, before, total).map(Some),
        (Lab::Ddp | Lab::Zero, Work::Timing) => {
            ddp::timing::run::<C>(lab, comm, job).map(|()| None)
        }
        (Lab::Ddp | Lab::Zero, _) => {
            ddp::check::cases::<C>(lab, comm, job, before, total).map(Some)
        }
        (Lab::Deadlock | Lab::Groups, Work::Timing) => Ok(None),
        (Lab::Deadlock, _) => deadlock::cases::<C>(comm, before, total).map(Some),
        (Lab::Groups, _) => groups::cases::<C>(comm, before, total).map(Some),
        (_, Work::Cases) => compare::cases::<C>(lab, comm, before, total).map(Some),
        (_, Work::Watch) => {
            let quiet = job.communicator(BackendChoice::Cpu)?.with_steps(false);
            compare::watch::<C>(lab, comm, &quiet).map(Some)
        }
        (_, Work::Timing) => timing::run::<C>(lab, comm).map(|()| None),
    }
}
