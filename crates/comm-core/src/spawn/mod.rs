//! Self-spawn: start one process per local rank, as torch.multiprocessing.spawn and torchrun do.
//! Each child is this same program with torchrun's variables set. The parent relays their stderr
//! (and, when lines are labelled `[rank]: `, their stdout) line by line, never a torn line;
//! unlabelled stdout is shared, so it keeps the order the ranks wrote in. It forwards Ctrl-C, and
//! when one rank fails stops the others (SIGTERM, then SIGKILL after a grace period) and exits
//! with that rank's status.
//!
//! Each rank leads a process group of its own, as torchrun's workers do: stopping a rank (on a
//! failure, or passing on Ctrl-C) signals its whole group, so the processes a rank started go
//! with it, and whatever is left in the groups once the ranks have exited is killed too.
//!
//! Like torchrun, it gives each rank its own `TORCHELASTIC_ERROR_FILE` (in a temporary directory
//! it owns and removes), and picks the root cause among ranks that failed together from the
//! [`ErrorRecord`](crate::failure_record::ErrorRecord)s they wrote there, not from their stderr.
//!
//! A launcher may add to one start of the ranks ([`run_with`] and its [`Extras`]): variables of
//! its own, and where each rank's stdout and stderr go (the console, a log file, both, or
//! neither; torchrun's `--redirects`, `--tee` and `--local-ranks-filter`). Restarting is the
//! launcher's: it calls [`run_with`] again, unless [`interrupted`] says a Ctrl-C came.
//!
//! Its rooms: [`plan`](SpawnPlan) (what to start, checked first), `signals` (process groups,
//! passing signals on, SIGTERM then SIGKILL, reaping), `relay` (each rank's lines to the console
//! and log files) and `root_cause` (which failed rank to blame, from the records). This file
//! ties them together: [`run_with`] starts the ranks, supervises them, and cleans up.

mod plan;
mod relay;
mod root_cause;
mod signals;

use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use plan::{
    check_ranks, free_port, oversubscription_warning, Extras, SpawnPlan, MAX_LOCAL_RANKS,
    MAX_WORLD_SIZE, RANKS_PER_CORE_WARNING,
};
pub use relay::{RankOutput, Route, LINE_CAP};
pub use root_cause::{exit_code, Failure};
pub use signals::interrupted;

use crate::error::{CommError, Result};
use crate::failure_record::{unix_us, ERROR_FILE_ENV};
use relay::{LogFiles, Tail};
use root_cause::{ErrorDir, Exit};

/// How the whole launch ended.
// One per launch, so its size does not matter; boxing `Failure` would only burden every match.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Outcome {
    /// Every rank exited with status 0.
    Success,
    /// The first rank to fail; the others were stopped.
    Failed(Failure),
    /// A signal (Ctrl-C) came from outside and was passed on.
    Interrupted(i32),
    /// The launcher stopped the ranks, for this reason ([`Extras::stop`]).
    Stopped(String),
}

impl Outcome {
    /// The code the launcher exits with: 0, the failed rank's, or 128 + the signal.
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Success => 0,
            Outcome::Failed(f) => f.exit_code(),
            Outcome::Interrupted(sig) => 128 + sig,
            Outcome::Stopped(_) => 1,
        }
    }
}

/// Starts the ranks of this node and waits for them. Returns how they ended.
///
/// Refuses (a usage error, nothing started) more than [`MAX_LOCAL_RANKS`] ranks on this node or
/// [`MAX_WORLD_SIZE`] in all, and warns on stderr when the ranks far outnumber the cores.
pub fn run(plan: &SpawnPlan) -> Result<Outcome> {
    run_with(plan, &Extras::default())
}

/// [`run`], with a launcher's [`Extras`]: more variables for every rank, and where each rank's
/// output goes. The log files are created before any rank starts; one that cannot be is an
/// error, and nothing starts.
pub fn run_with(plan: &SpawnPlan, extras: &Extras) -> Result<Outcome> {
    let world_size = plan::check(plan)?;
    signals::catch_signals();
    let records = ErrorDir::create();
    let started = start_ranks(plan, extras, world_size, records.as_ref())?;
    let outcome = supervise(plan, &started, records.as_ref(), extras.stop.as_ref());
    // The ranks are zombies still: their groups' ids are ours, leftovers and all.
    signals::reap(&started.pids);
    drop(started.release);
    relay::wait_for(started.relays, Duration::from_secs(2));
    outcome
}

/// The ranks of this node, once started.
struct Started {
    /// Each rank's pid, which is also its process group's id; by local rank.
    pids: Vec<u32>,
    /// The threads relaying the ranks' output.
    relays: Vec<JoinHandle<()>>,
    /// The last lines of each rank's stderr, by local rank.
    stderr_tails: Vec<Tail>,
    /// Each rank's [`Exit`], as it happens.
    exited: crossbeam_channel::Receiver<Exit>,
    /// Dropped once the ranks' groups are cleaned up: only then do the waiter threads reap the
    /// ranks. Until a rank is reaped its pid, the id of its group, cannot be reused, so no signal
    /// this launcher sends to a rank's group can reach a stranger's process that got the number.
    release: crossbeam_channel::Sender<()>,
}

/// Starts every rank of this node, each with its relays and a thread that waits for it. If one
/// cannot be started, those already started are killed and the error names the rank.
fn start_ranks(
    plan: &SpawnPlan,
    extras: &Extras,
    world_size: usize,
    records: Option<&ErrorDir>,
) -> Result<Started> {
    let out_lock = Arc::new(Mutex::new(()));
    let (exits, exited) = crossbeam_channel::unbounded::<Exit>();
    let (release, released) = crossbeam_channel::bounded::<()>(0);
    let mut log_files = relay::open_log_files(&extras.outputs, plan.nproc_per_node)?.into_iter();
    let mut started = Started {
        pids: Vec::new(),
        relays: Vec::new(),
        stderr_tails: Vec::new(),
        exited,
        release,
    };
    // Every rank is started before any thread that serves one: a fork copies the launcher's
    // mappings, and each thread's stack is one, so forking among thousands of relay threads
    // costs a thousand ranks seconds (a cost that grows with the square of the ranks).
    let mut children = Vec::with_capacity(plan.nproc_per_node);
    for local_rank in 0..plan.nproc_per_node {
        let output = extras.outputs.get(local_rank).cloned().unwrap_or_default();
        let mut command = rank_command(plan, extras, world_size, local_rank, &output, records);
        match command.spawn() {
            Ok(child) => {
                started.pids.push(child.id());
                children.push((child, output));
            }
            Err(e) => {
                signals::kill_all(&started.pids);
                return Err(CommError::io(
                    format!(
                        "cannot start rank {} ({})",
                        plan.rank(local_rank),
                        plan.program.display()
                    ),
                    e,
                ));
            }
        }
    }
    for (local_rank, (mut child, output)) in children.into_iter().enumerate() {
        let prefix = plan
            .prefix_output
            .then(|| format!("[{}]: ", plan.rank(local_rank)));
        let files: LogFiles = log_files.next().unwrap_or_default();
        let (relays, tail) = relay::attach(&mut child, prefix, &output, files, &out_lock);
        started.relays.extend(relays);
        started.stderr_tails.push(tail);
        let (exits, released) = (exits.clone(), released.clone());
        std::thread::spawn(move || {
            // The rank is left a zombie (its pid still ours) until the launcher is done
            // signalling its group; then reaped.
            let status = signals::wait_leaving_zombie(child.id());
            let _ = exits.send((local_rank, status, unix_us()));
            let _ = released.recv();
            let _ = child.wait();
        });
    }
    Ok(started)
}

/// The command that starts local rank `local_rank`: the plan's program and arguments,
/// torchrun's variables and the launcher's, its own error file, its output's connections, and
/// a process group of its own.
fn rank_command(
    plan: &SpawnPlan,
    extras: &Extras,
    world_size: usize,
    local_rank: usize,
    output: &RankOutput,
    records: Option<&ErrorDir>,
) -> Command {
    let topology = plan.topology(world_size, local_rank);
    let mut command = Command::new(&plan.program);
    command
        .args(&plan.args)
        .envs(topology.worker_env())
        .envs(extras.env.iter().map(|(k, v)| (k, v)))
        .env_remove(ERROR_FILE_ENV)
        .stdin(Stdio::null())
        .stdout(relay::stdout_mode(plan.prefix_output, &output.stdout))
        .stderr(Stdio::piped());
    if let Some(records) = records {
        command.env(ERROR_FILE_ENV, records.file(topology.rank));
    }
    signals::lead_own_group(&mut command);
    command
}

/// Where a launch stands while its ranks run.
struct Supervision {
    /// Which local ranks have not exited yet.
    running: Vec<bool>,
    /// How it ends, as far as known.
    outcome: Outcome,
    /// When the ranks still running get SIGKILL, once they were told to stop.
    kill_at: Option<Instant>,
}

/// Waits for the ranks to exit. The first failure picks the root cause and stops the others; a
/// signal from outside is passed on; ranks told to stop get SIGKILL after the plan's grace.
fn supervise(
    plan: &SpawnPlan,
    started: &Started,
    records: Option<&ErrorDir>,
    stop: Option<&crossbeam_channel::Receiver<String>>,
) -> Result<Outcome> {
    let mut state = Supervision {
        running: vec![true; plan.nproc_per_node],
        outcome: Outcome::Success,
        kill_at: None,
    };
    while state.running.iter().any(|&r| r) {
        match started.exited.recv_timeout(Duration::from_millis(20)) {
            Ok((local_rank, status, exited_us)) => {
                state.running[local_rank] = false;
                let status = status.map_err(|e| CommError::io("waiting for a rank", e))?;
                state.rank_exited(plan, started, records, (local_rank, status, exited_us));
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        }
        state.pass_on_signal(plan, &started.pids);
        if let Some(reason) = stop.and_then(|s| s.try_recv().ok()) {
            state.stop(plan, &started.pids, reason);
        }
        state.escalate(&started.pids);
    }
    Ok(state.outcome)
}

impl Supervision {
    /// A rank exited: the first failure becomes the outcome (and the others are told to stop);
    /// a rank stopped after it counts as failed too when it reported an error of its own (not
    /// when our signal ended it).
    fn rank_exited(
        &mut self,
        plan: &SpawnPlan,
        started: &Started,
        records: Option<&ErrorDir>,
        (local_rank, status, exited_us): (usize, ExitStatus, u64),
    ) {
        if status.success() {
            return;
        }
        match &mut self.outcome {
            Outcome::Failed(failure) => {
                if records.is_some_and(|r| r.read(plan.rank(local_rank)).is_some()) {
                    failure.others_failed += 1;
                }
            }
            Outcome::Success => {
                let failure = root_cause::gather(
                    plan.rank(0),
                    (local_rank, status, exited_us),
                    &started.exited,
                    &mut self.running,
                    records,
                    &started.stderr_tails,
                );
                self.outcome = Outcome::Failed(failure);
                signals::stop(&started.pids, &self.running, libc::SIGTERM);
                self.kill_at = Some(Instant::now() + plan.grace);
            }
            Outcome::Interrupted(_) | Outcome::Stopped(_) => {}
        }
    }

    /// Passes a caught SIGINT or SIGTERM on to the ranks still running; unless a rank failed
    /// first, the launch ends as interrupted.
    fn pass_on_signal(&mut self, plan: &SpawnPlan, pids: &[u32]) {
        if let Some(sig) = signals::take_signal() {
            if !matches!(self.outcome, Outcome::Failed(_)) {
                self.outcome = Outcome::Interrupted(sig);
            }
            signals::stop(pids, &self.running, sig);
            self.kill_at.get_or_insert(Instant::now() + plan.grace);
        }
    }

    /// The launcher asked to stop the ranks: unless one failed or a signal came first, the
    /// launch ends as stopped, for `reason`.
    fn stop(&mut self, plan: &SpawnPlan, pids: &[u32], reason: String) {
        if !matches!(self.outcome, Outcome::Success) {
            return;
        }
        self.outcome = Outcome::Stopped(reason);
        signals::stop(pids, &self.running, libc::SIGTERM);
        self.kill_at.get_or_insert(Instant::now() + plan.grace);
    }

    /// SIGKILL for the ranks still running once the grace after a stop has passed.
    fn escalate(&mut self, pids: &[u32]) {
        if self.kill_at.is_some_and(|t| Instant::now() >= t) {
            signals::stop(pids, &self.running, libc::SIGKILL);
            self.kill_at = None;
        }
    }
}
