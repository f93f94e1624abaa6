//! A rank's life, one way for every program: [`run`] spawns the ranks when nobody else did, or,
//! inside a rank, lives [`rank_life`]: rendezvous, the selection line, the body, then finish (or
//! abort), with the [`Settings`] the flags decided. [`run`] hands the body one communicator;
//! [`run_job`] hands it the [`Job`], to build several (example 03). comm-bench, which starts one
//! set of ranks per backend and world size, uses the same pieces: [`role`], [`start_ranks`] and
//! [`rank_life`]. The library never ends the process: every entry returns the exit code.

use std::ffi::OsString;
use std::process::ExitCode;

use crate::backend::{self, Selection};
use crate::collective::Collective;
use crate::comm::Communicator;
use crate::error::{CommError, Result};
use crate::job::Job;
use crate::settings::{LaunchArgs, Settings};
use crate::spawn::{self, Extras, Outcome, SpawnPlan};
use crate::topology::Topology;

/// Ranks started on a machine without GPUs when `-n` is not given.
pub const DEFAULT_CPU_RANKS: usize = 4;

/// Ranks a program starts by itself when not told how many: one per GPU where NCCL runs, else
/// [`DEFAULT_CPU_RANKS`]. The examples' `-n` and comm-bench's `--world-sizes` default to it.
pub fn default_ranks(selection: &Selection) -> usize {
    match selection.gpus {
        0 => DEFAULT_CPU_RANKS,
        gpus => gpus,
    }
}

/// Runs `body` on every rank with a ready communicator of the `--backend` the flags chose, and
/// returns `main`'s exit code. `runs` names the collectives the program runs, so that an
/// `--algo` none of them has is refused before any rank starts.
///
/// Started by a launcher (srun, torchrun, commrun), this process is one rank. Started plainly,
/// it re-executes itself once per rank and waits for them.
pub fn run(
    flags: &LaunchArgs,
    runs: &[Collective],
    body: impl FnOnce(&Communicator) -> Result<()>,
) -> ExitCode {
    match flags.settings(runs) {
        Ok(settings) => exit_code(run_settings(&settings, body)),
        Err(e) => usage_error(&e),
    }
}

/// Like [`run`], but hands the body the [`Job`], from which it builds its communicators
/// (several backends over the same ranks, as example 03 does). `given` is a rank's place from
/// flags (the course's `--rank` and `--world-size`) instead of the environment.
pub fn run_job(
    flags: &LaunchArgs,
    runs: &[Collective],
    given: Option<Topology>,
    body: impl FnOnce(&Job) -> Result<()>,
) -> ExitCode {
    match flags.settings(runs) {
        Ok(settings) => exit_code(run_job_settings(&settings, given, body)),
        Err(e) => usage_error(&e),
    }
}

/// [`run`] with settings made already (tests and benches build them by hand); returns the
/// exit code.
pub fn run_settings(settings: &Settings, body: impl FnOnce(&Communicator) -> Result<()>) -> i32 {
    run_job_settings(settings, None, |job| {
        let comm = announced(job.communicator(settings.backend)?);
        body(&comm)?;
        // Every rank is done with it: NCCL's clean end (barrier, finalize, destroy).
        comm.close()
    })
}

/// [`run_job`] with settings made already; returns the exit code.
pub fn run_job_settings(
    settings: &Settings,
    given: Option<Topology>,
    body: impl FnOnce(&Job) -> Result<()>,
) -> i32 {
    match role(settings, given) {
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
        Ok(Role::Parent) => spawn_ranks(settings),
        Ok(Role::Rank(topology)) => rank_life(settings, topology, body),
    }
}

/// What this process is in a launch.
#[derive(Debug)]
pub enum Role {
    /// No launcher started it: it starts the ranks ([`start_ranks`]).
    Parent,
    /// One rank, at this place.
    Rank(Topology),
}

/// Whether this process starts the ranks or is one, from the environment (or `given`, a place
/// from flags), with `--master-addr`/`--master-port` applied.
///
/// First of all, in the parent that spawns ranks and in a rank alike, [`backend::prepare`]
/// links pip's `libnccl.so.2` and restarts the program if it must: before any socket or rank
/// exists, never in the middle of the job.
pub fn role(settings: &Settings, given: Option<Topology>) -> Result<Role> {
    // A failure here is not fatal (a CPU job runs on): `select` gives it as NCCL's reason.
    let _ = backend::prepare();
    let topology = given.map_or_else(Topology::from_env, |t| Ok(Some(t)))?;
    match topology {
        None => Ok(Role::Parent),
        Some(t) => Ok(Role::Rank(settings.master.apply(t)?)),
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

/// Reports this rank's failure `e`. A lost store, or a peer's link closing, is often the news of
/// the job ending under this rank arriving by the wrong door: rank 0 stopped, or the neighbour
/// shut its links, because another rank failed or vanished, and the reason is on its way to this
/// rank's watcher (`job/abort`: the store heard of a vanished rank as the neighbour did). The
/// watcher gets a moment to report that cause first (it then ends the process); only then is
/// the lost store or the closed link reported. Without that moment a survivor of a rank killed
/// mid-collective sometimes blamed the neighbour that failed first (`rank 0 closed its
/// connection`) instead of the rank that died.
fn report(rank: usize, e: &CommError) -> i32 {
    if matches!(
        e,
        CommError::StoreLost { .. } | CommError::PeerClosed { .. }
    ) {
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

/// The parent's job: starts `settings.ranks` ranks of this program (or [`default_ranks`]) on
/// this machine, each given this process's arguments and then `extra_args`, and waits for them.
/// Refused before any rank starts ([`plan_ranks`]): a rank count of 0 or one too large, a
/// backend that cannot run, a `--master-addr` not of this machine or a busy `--master-port`.
pub fn start_ranks(settings: &Settings, extra_args: &[OsString]) -> Result<Outcome> {
    start_ranks_with(settings, extra_args, &Extras::default())
}

/// [`start_ranks`], with where each rank's output goes and more variables ([`Extras`]): a
/// program that reads its ranks' output before showing it (the labs' checker).
pub fn start_ranks_with(
    settings: &Settings,
    extra_args: &[OsString],
    extras: &Extras,
) -> Result<Outcome> {
    spawn::run_with(&plan_ranks(settings, extra_args)?, extras)
}

/// The ranks [`start_ranks`] would start, or why none can: everything it refuses, it refuses
/// here, before any rank exists.
pub fn plan_ranks(settings: &Settings, extra_args: &[OsString]) -> Result<SpawnPlan> {
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
        None => default_ranks(&selection),
    };
    let program = std::env::current_exe()
        .map_err(|e| CommError::io("cannot find this program to start its ranks", e))?;
    let (master_addr, master_port) = settings.master.for_own_ranks()?;
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    args.extend(extra_args.iter().cloned());
    let mut plan = SpawnPlan::local(program, args, nproc)?;
    plan.master_addr = master_addr;
    plan.master_port = master_port.unwrap_or(plan.master_port);
    Ok(plan)
}

/// A usage error found before any rank starts: said on stderr, exit code 2.
fn usage_error(e: &CommError) -> ExitCode {
    eprintln!("error: {e}");
    exit_code(e.exit_code())
}

/// [`start_ranks`] for a program with nothing to add: says how the ranks ended. A refusal
/// before any rank starts (a backend that cannot run here, a bad rank count or address) exits
/// with 2, as a flag clap refuses does.
fn spawn_ranks(settings: &Settings) -> i32 {
    let plan = match plan_ranks(settings, &[]) {
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
        Ok(Outcome::Stopped(reason)) => {
            eprintln!("error: {reason}; the ranks were stopped");
            1
        }
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}
