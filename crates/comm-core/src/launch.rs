//! A rank's life, one way for every program: [`run`] spawns the ranks when nobody else did, or,
//! inside a rank, lives [`rank_life`]: rendezvous, the selection line, the body, then finish (or
//! abort), with the [`Settings`] the flags decided. [`run`] hands the body one communicator;
//! [`run_job`] hands it the [`Job`], to build several (example 03); comm-bench, which spawns its
//! ranks itself, calls [`rank_life`] in each.

use std::process::ExitCode;

use crate::backend;
use crate::comm::Communicator;
use crate::error::{CommError, Result};
use crate::job::Job;
use crate::settings::Settings;
use crate::spawn::{self, Outcome, SpawnPlan};
use crate::topology::Topology;

/// Ranks started on a machine without GPUs when `-n` is not given.
pub const DEFAULT_CPU_RANKS: usize = 4;

/// Runs `body` on every rank with a ready communicator of `settings.backend`, and returns the
/// process's exit code ([`exit_code`] makes it `main`'s).
///
/// Started by a launcher (srun, torchrun, commrun), this process is one rank. Started plainly,
/// it re-executes itself once per rank and waits for them.
pub fn run(settings: &Settings, body: impl FnOnce(&Communicator) -> Result<()>) -> i32 {
    run_job(settings, None, |job| {
        let comm = announced(job.communicator(settings.backend)?);
        body(&comm)?;
        // Every rank is done with it: NCCL's clean end (barrier, finalize, destroy).
        comm.close()
    })
}

/// Like [`run`], but hands the body the [`Job`], from which it builds its communicators
/// (several backends over the same ranks, as example 03 does). `given` is a rank's place from
/// flags (the course's `--rank` and `--world-size`) instead of the environment.
///
/// First of all, in the parent that spawns ranks and in a rank alike, [`backend::prepare`]
/// links pip's `libnccl.so.2` and restarts the program if it must: before any socket or rank
/// exists, never in the middle of the job.
pub fn run_job(
    settings: &Settings,
    given: Option<Topology>,
    body: impl FnOnce(&Job) -> Result<()>,
) -> i32 {
    // A failure here is not fatal (a CPU job runs on): `select` gives it as NCCL's reason.
    let _ = backend::prepare();
    let topology = given
        .map_or_else(Topology::from_env, |t| Ok(Some(t)))
        .and_then(|t| t.map(|t| settings.master.apply(t)).transpose());
    match topology {
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
        Ok(None) => spawn_ranks(settings),
        Ok(Some(topology)) => rank_life(settings, topology, body),
    }
}

/// One rank's life from rendezvous to finish, the same for every program: meets the others
/// ([`Job::rendezvous`]), rank 0 prints the backend line, runs `body`, then finishes with every
/// rank (and says where the trace is), or, if anything failed, reports it, ends the job for the
/// others and returns the exit code.
pub fn rank_life(
    settings: &Settings,
    topology: Topology,
    body: impl FnOnce(&Job) -> Result<()>,
) -> i32 {
    end_on_closed_output();
    let rank = topology.rank;
    let job = match Job::rendezvous(&topology, settings) {
        Ok(job) => job,
        Err(e) => return report(rank, &e),
    };
    if rank == 0 {
        println!("{}", job.selection());
    }
    match body(&job) {
        Ok(()) => match job.finish() {
            Ok(()) => {
                announce_trace(rank, settings.trace.as_deref());
                0
            }
            Err(e) => report(rank, &e),
        },
        Err(e) => {
            let code = report(rank, &e);
            job.abort(&e);
            job.linger();
            code
        }
    }
}

/// Reports this rank's failure `e`. A lost store is often the news of the job ending under this
/// rank arriving by the wrong door: rank 0 stopped because another rank failed or vanished, and
/// the reason is on its way to this rank's watcher (`job/abort`). The watcher gets a moment to
/// report that cause first (it then ends the process); only then is the lost store reported.
fn report(rank: usize, e: &CommError) -> i32 {
    if matches!(e, CommError::StoreLost { .. }) {
        let until = std::time::Instant::now() + WATCHER_GRACE;
        while !crate::failure_record::reported() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    crate::failure_record::report_failure(rank, e)
}

/// How long a rank that lost the store waits for its watcher's news of why (see [`report`]).
const WATCHER_GRACE: std::time::Duration = std::time::Duration::from_millis(300);

/// `main`'s exit code from [`run`]'s.
pub fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// Rank 0's line saying where the job's trace is, once the job has finished and written it.
pub fn announce_trace(rank: usize, file: Option<&std::path::Path>) {
    if let (0, Some(file)) = (rank, file) {
        println!("trace: {} (open it in ui.perfetto.dev)", file.display());
    }
}

/// `comm`, once rank 0 has printed its transport line (CPU communicators): what a program
/// prints after the backend line, before its own output.
pub fn announced(comm: Communicator) -> Communicator {
    if let (0, Some(line)) = (comm.rank(), comm.transport_line()) {
        println!("{line}");
    }
    comm
}

/// A process whose output is closed (`| head` has read enough) ends as any Unix program does, by
/// SIGPIPE (a rank's launcher says so), instead of panicking in the middle of a print. Rust
/// ignores SIGPIPE by default; sockets are unaffected (Rust sends with MSG_NOSIGNAL). Every rank
/// calls it; a launcher that prints may too, as its ranks die with it (spawn's PDEATHSIG).
pub fn end_on_closed_output() {
    // SAFETY: restoring a signal's default disposition has no preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// The parent's job: choose how many ranks, start them, report how they ended.
fn spawn_ranks(settings: &Settings) -> i32 {
    let plan = (|| -> Result<SpawnPlan> {
        if let Some(n) = settings.ranks.filter(|&n| n > 0) {
            // Before looking for GPUs: an absurd count is refused at once.
            spawn::check_ranks("-n/--nproc-per-node", n, 1)?;
        }
        let selection = backend::select(settings.backend)?;
        let nproc = match settings.ranks {
            Some(0) => {
                return Err(CommError::Usage(
                    "--nproc-per-node 0: start at least one rank".into(),
                ))
            }
            Some(n) => n,
            None if selection.gpus > 0 => selection.gpus,
            None => DEFAULT_CPU_RANKS,
        };
        let program = std::env::current_exe()
            .map_err(|e| CommError::io("cannot find this program to start its ranks", e))?;
        let (master_addr, master_port) = settings.master.for_own_ranks()?;
        let mut plan = SpawnPlan::local(program, std::env::args_os().skip(1).collect(), nproc)?;
        plan.master_addr = master_addr;
        plan.master_port = master_port.unwrap_or(plan.master_port);
        Ok(plan)
    })();
    let plan = match plan {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    match spawn::run(&plan) {
        Ok(Outcome::Success) => 0,
        Ok(outcome @ Outcome::Failed(_)) => {
            if let Outcome::Failed(failure) = &outcome {
                eprintln!(
                    "error: {}; the other ranks were stopped{}",
                    failure.describe(),
                    failure.others()
                );
            }
            outcome.exit_code()
        }
        Ok(outcome @ Outcome::Interrupted(_)) => {
            eprintln!("interrupted: the ranks were stopped");
            outcome.exit_code()
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}
