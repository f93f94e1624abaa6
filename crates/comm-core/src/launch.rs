//! One call that turns `main` into a distributed program: [`run`] spawns the ranks when nobody
//! else did, or, inside a rank, meets the others and hands the body a communicator
//! ([`run_job`] hands it the [`Job`] instead, to build several).

use std::process::ExitCode;
use std::time::Duration;

use crate::backend::cpu::{Algo, TransportChoice};
use crate::backend::{self, BackendChoice};
use crate::comm::Communicator;
use crate::error::{CommError, Result};
use crate::job::Job;
use crate::spawn::{self, Outcome, SpawnPlan};
use crate::topology::Topology;

/// Ranks started on a machine without GPUs when `-n` is not given.
pub const DEFAULT_CPU_RANKS: usize = 4;

/// The flags every example shares.
#[derive(Debug, Clone, clap::Args)]
pub struct LaunchArgs {
    /// Ranks to start on this machine [default: one per GPU, or 4 on the CPU backend].
    /// Ignored when a launcher (srun, torchrun, commrun) already started the ranks.
    #[arg(short = 'n', long, value_name = "N")]
    pub nproc_per_node: Option<usize>,

    /// Which backend runs the collectives: NCCL on GPUs, or the CPU.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,

    /// How CPU ranks move bytes: shared memory within a host and TCP between hosts (auto), or
    /// one of them for every pair. NCCL picks its own.
    #[arg(long, value_enum, default_value_t = TransportChoice::Auto)]
    pub transport: TransportChoice,

    /// Seconds any wait may take (rendezvous, a collective) before the job fails.
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0)]
    pub timeout: f64,

    /// The CPU backend's algorithm, where a collective has one of that name (all_reduce: ring or
    /// direct; broadcast: tree or chain), as NCCL_ALGO chooses NCCL's [default: by size].
    #[arg(long, value_enum, value_name = "NAME")]
    pub algo: Option<Algo>,

    /// Show every rank's buffer after each step of the algorithm, as grids (CPU backend; NCCL
    /// runs the steps inside one kernel, so only before and after show).
    #[arg(long)]
    pub steps: bool,

    /// Record what every rank does into FILE, a Chrome trace (open it in ui.perfetto.dev, or
    /// draw it with `comm-bench timeline FILE`): a track per rank, a slice per collective call
    /// and, on the CPU backend, per send and receive, with arrows from sends to receives.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<std::path::PathBuf>,
}

impl Default for LaunchArgs {
    /// What the flags default to.
    fn default() -> LaunchArgs {
        LaunchArgs {
            nproc_per_node: None,
            backend: BackendChoice::Auto,
            transport: TransportChoice::Auto,
            timeout: 300.0,
            algo: None,
            steps: false,
            trace: None,
        }
    }
}

/// The longest `--timeout` honoured (about 31 years): longer ones wait this long, which is
/// forever in practice, so that every deadline computed from it stays representable.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(1_000_000_000);

/// Where rank 0 serves the rendezvous store, as the course's scripts and torchrun take it
/// (`--master-addr`/`--master-port`, or their underscore spellings). Unset, a program that starts
/// its own ranks picks 127.0.0.1 and a free port, and a rank started by a launcher reads
/// `MASTER_ADDR`/`MASTER_PORT` (or Slurm's host list and job id).
///
/// Apart from [`LaunchArgs`] so that code building a `LaunchArgs` by hand is unaffected.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct MasterArgs {
    /// Host where rank 0 serves the rendezvous store. With a launcher's MASTER_ADDR too, this
    /// flag wins, as torchrun's own flags win over its environment.
    #[arg(long, visible_alias = "master_addr", value_name = "HOST")]
    pub master_addr: Option<String>,

    /// Port of the rendezvous store [default: a free port when the program starts its own
    /// ranks; else MASTER_PORT, or 20000 + Slurm job id mod 20000]. Wins over MASTER_PORT.
    #[arg(long, visible_alias = "master_port", value_name = "PORT",
          value_parser = clap::value_parser!(u16).range(1..))]
    pub master_port: Option<u16>,
}

impl MasterArgs {
    /// `topology` with the flags applied: a flag wins over what the environment said, and
    /// rank 0 says so on stderr when they differ. Under torchrun's agent store the store is the
    /// agent's, at MASTER_ADDR:MASTER_PORT, so a flag that points elsewhere is an error.
    pub fn apply(&self, mut topology: Topology) -> Result<Topology> {
        let mut notes = Vec::new();
        if let Some(addr) = self.master_addr.as_deref().map(str::trim) {
            if addr.is_empty() {
                return Err(CommError::Usage("--master-addr is empty".into()));
            }
            if addr != topology.master_addr {
                notes.push(format!(
                    "--master-addr {addr} wins over MASTER_ADDR={}",
                    topology.master_addr
                ));
                topology.master_addr = addr.to_string();
            }
        }
        if let Some(port) = self.master_port {
            if port != topology.master_port {
                notes.push(format!(
                    "--master-port {port} wins over the environment's port {} (MASTER_PORT, or \
                     Slurm's job id)",
                    topology.master_port
                ));
                topology.master_port = port;
            }
        }
        if notes.is_empty() {
            return Ok(topology);
        }
        if matches!(topology.store, crate::topology::StoreHost::Agent { .. }) {
            return Err(CommError::Usage(format!(
                "{}: but torchrun's agent serves this job's store at MASTER_ADDR:MASTER_PORT and \
                 every worker must join it; give torchrun --master_addr/--master_port instead",
                notes.join("; ")
            )));
        }
        if topology.rank == 0 {
            eprintln!(
                "note: {} (the flag wins, as torchrun's flags win over its environment)",
                notes.join("; ")
            );
        }
        Ok(topology)
    }

    /// For ranks this program starts itself: the flags' host and port, checked now so that a
    /// busy port or a foreign host is one clear error instead of a rank's failure (or a wait).
    /// Unset, 127.0.0.1 and no port (the plan picks a free one).
    fn for_own_ranks(&self) -> Result<(String, Option<u16>)> {
        let addr = self.master_addr.as_deref().map_or("127.0.0.1", str::trim);
        if addr.is_empty() {
            return Err(CommError::Usage("--master-addr is empty".into()));
        }
        let ip = std::net::ToSocketAddrs::to_socket_addrs(&(addr, 0))
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                CommError::Usage(format!(
                    "--master-addr {addr}: no such host (it does not resolve)"
                ))
            })?
            .ip();
        // Rank 0 runs here, so the store's host must be this machine.
        std::net::TcpListener::bind((ip, 0)).map_err(|e| {
            CommError::Usage(format!(
                "--master-addr {addr} ({ip}) is not an address of this machine ({e}); the ranks \
                 start here and rank 0 serves the store here"
            ))
        })?;
        if let Some(port) = self.master_port {
            std::net::TcpListener::bind(("0.0.0.0", port)).map_err(|e| {
                CommError::Usage(format!(
                    "--master-port {port} is taken on this machine ({e}): pick another, or \
                     leave the flag out and a free port is picked"
                ))
            })?;
        }
        Ok((addr.to_string(), self.master_port))
    }
}

impl LaunchArgs {
    /// `--timeout` as a duration, at most [`MAX_TIMEOUT`]; zero, negative, infinite and NaN
    /// values are usage errors.
    pub fn timeout(&self) -> Result<Duration> {
        Duration::try_from_secs_f64(self.timeout.min(MAX_TIMEOUT.as_secs_f64()))
            .ok()
            .filter(|d| !d.is_zero() && self.timeout.is_finite())
            .ok_or_else(|| {
                CommError::Usage(format!(
                    "--timeout {}: give a positive, finite number of seconds",
                    self.timeout
                ))
            })
    }
}

/// Runs `body` on every rank with a ready communicator, and returns the process's exit code.
///
/// Started by a launcher (srun, torchrun, commrun), this process is one rank. Started plainly,
/// it re-executes itself once per rank and waits for them.
pub fn run(args: &LaunchArgs, body: impl FnOnce(&Communicator) -> Result<()>) -> ExitCode {
    ExitCode::from(run_to_code(args, body).clamp(0, 255) as u8)
}

/// [`run`], returning the exit code as a number.
pub fn run_to_code(args: &LaunchArgs, body: impl FnOnce(&Communicator) -> Result<()>) -> i32 {
    run_as(args, None, body)
}

/// [`run`] with the store's place from flags ([`MasterArgs`]), as the examples take it.
pub fn run_at(
    args: &LaunchArgs,
    master: &MasterArgs,
    body: impl FnOnce(&Communicator) -> Result<()>,
) -> ExitCode {
    let code = run_job_at(args, master, None, |job| {
        let comm = announced(job.communicator(args.backend)?);
        body(&comm)?;
        comm.close()
    });
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// [`run_to_code`] for a rank whose place is given (flags such as the course's `--rank` and
/// `--world-size`) instead of read from the environment.
pub fn run_as(
    args: &LaunchArgs,
    given: Option<Topology>,
    body: impl FnOnce(&Communicator) -> Result<()>,
) -> i32 {
    run_job(args, given, |job| {
        let comm = announced(job.communicator(args.backend)?);
        body(&comm)?;
        // Every rank is done with it: NCCL's clean end (barrier, finalize, destroy).
        comm.close()
    })
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

/// Like [`run_as`], but hands the body the [`Job`], from which it builds its communicators
/// (several backends over the same ranks, as example 03 and comm-bench do).
///
/// First of all, in the parent that spawns ranks and in a rank alike, [`backend::prepare`]
/// links pip's `libnccl.so.2` and restarts the program if it must: before any socket or rank
/// exists, never in the middle of the job.
pub fn run_job(
    args: &LaunchArgs,
    given: Option<Topology>,
    body: impl FnOnce(&Job) -> Result<()>,
) -> i32 {
    run_job_at(args, &MasterArgs::default(), given, body)
}

/// [`run_job`] with the store's place from flags ([`MasterArgs`]): they win over the
/// environment, and pick the host and port of the ranks this program starts itself.
pub fn run_job_at(
    args: &LaunchArgs,
    master: &MasterArgs,
    given: Option<Topology>,
    body: impl FnOnce(&Job) -> Result<()>,
) -> i32 {
    // A failure here is not fatal (a CPU job runs on): `select` gives it as NCCL's reason.
    let _ = backend::prepare();
    let topology = given
        .map_or_else(Topology::from_env, |t| Ok(Some(t)))
        .and_then(|t| t.map(|t| master.apply(t)).transpose());
    let topology = match topology {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    match topology {
        None => spawn_ranks(args, master),
        Some(topology) => {
            end_on_closed_output();
            let rank = topology.rank;
            let job = args
                .timeout()
                .and_then(|timeout| Job::rendezvous(&topology, args.backend, timeout))
                .and_then(|job| job.with_trace(args.trace.clone()));
            let job = match job {
                Ok(job) => job
                    .with_transport(args.transport)
                    .with_algo(args.algo)
                    .with_steps(args.steps),
                Err(e) => return crate::failure_record::report_failure(rank, &e),
            };
            if rank == 0 {
                println!("{}", job.selection());
            }
            match body(&job) {
                Ok(()) => match job.finish() {
                    Ok(()) => {
                        announce_trace(rank, args.trace.as_deref());
                        0
                    }
                    Err(e) => crate::failure_record::report_failure(rank, &e),
                },
                Err(e) => {
                    let code = crate::failure_record::report_failure(rank, &e);
                    job.abort(&e);
                    job.linger();
                    code
                }
            }
        }
    }
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
fn spawn_ranks(args: &LaunchArgs, master: &MasterArgs) -> i32 {
    let plan = (|| -> Result<SpawnPlan> {
        args.timeout()?;
        if let Some(n) = args.nproc_per_node.filter(|&n| n > 0) {
            // Before looking for GPUs: an absurd count is refused at once.
            spawn::check_ranks("-n/--nproc-per-node", n, 1)?;
        }
        let selection = backend::select(args.backend)?;
        let nproc = match args.nproc_per_node {
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
        let (master_addr, master_port) = master.for_own_ranks()?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::StoreHost;

    fn launched(store: StoreHost) -> Topology {
        let mut t = Topology::by_hand(1, 2, "node0", 29500).unwrap();
        t.store = store;
        t
    }

    #[test]
    fn a_master_flag_wins_over_the_environment() {
        let flags = MasterArgs {
            master_addr: Some("node1".into()),
            master_port: Some(29502),
        };
        let t = flags.apply(launched(StoreHost::RankZero)).unwrap();
        assert_eq!((t.master_addr.as_str(), t.master_port), ("node1", 29502));
        // No flags, or flags that agree: the environment's place, unchanged.
        let same = MasterArgs {
            master_addr: Some("node0".into()),
            master_port: Some(29500),
        };
        for flags in [MasterArgs::default(), same] {
            let t = flags.apply(launched(StoreHost::RankZero)).unwrap();
            assert_eq!((t.master_addr.as_str(), t.master_port), ("node0", 29500));
        }
    }

    #[test]
    fn under_torchruns_agent_store_a_contradicting_flag_is_an_error() {
        let flags = MasterArgs {
            master_addr: None,
            master_port: Some(29502),
        };
        let e = flags
            .apply(launched(StoreHost::Agent { attempt: 0 }))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--master-port 29502") && e.contains("torchrun's agent"),
            "{e}"
        );
        let agreeing = MasterArgs {
            master_addr: None,
            master_port: Some(29500),
        };
        assert!(agreeing
            .apply(launched(StoreHost::Agent { attempt: 0 }))
            .is_ok());
    }

    #[test]
    fn own_ranks_refuse_a_busy_port_and_a_foreign_host() {
        let busy = std::net::TcpListener::bind(("0.0.0.0", 0)).unwrap();
        let port = busy.local_addr().unwrap().port();
        let flags = MasterArgs {
            master_addr: None,
            master_port: Some(port),
        };
        let e = flags.for_own_ranks().unwrap_err().to_string();
        assert!(e.contains(&format!("--master-port {port} is taken")), "{e}");
        // 192.0.2.1 (TEST-NET-1) is no address of this machine.
        let foreign = MasterArgs {
            master_addr: Some("192.0.2.1".into()),
            master_port: None,
        };
        let e = foreign.for_own_ranks().unwrap_err().to_string();
        assert!(e.contains("not an address of this machine"), "{e}");
        let fine = MasterArgs::default().for_own_ranks().unwrap();
        assert_eq!(fine, ("127.0.0.1".to_string(), None));
    }
}
