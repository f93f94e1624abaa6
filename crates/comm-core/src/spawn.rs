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
//! [`ErrorRecord`]s they wrote there, not from their stderr.
//!
//! A launcher may add to one start of the ranks ([`run_with`] and its [`Extras`]): variables of
//! its own, and where each rank's stdout and stderr go (the console, a log file, both, or
//! neither; torchrun's `--redirects`, `--tee` and `--local-ranks-filter`). Restarting is the
//! launcher's: it calls [`run_with`] again, unless [`interrupted`] says a Ctrl-C came.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};
use crate::failure_record::{unix_us, ErrorRecord, ERROR_FILE_ENV};
use crate::topology::{Launcher, Topology};

/// How many of a failed rank's last stderr lines the summary shows.
const KEPT_LINES: usize = 10;

/// The most of one relayed line that is shown; the rest, up to its newline, is discarded (never
/// buffered) and a marker says how many bytes were cut.
pub const LINE_CAP: usize = 64 * 1024;

/// The most of one line kept for the summary's stderr tail (10 lines per rank, for every rank
/// of the node until the job ends).
const TAIL_LINE_CAP: usize = 2 * 1024;

// The job's bounds live with the job's shape, in topology (which spawn builds on).
pub use crate::topology::{MAX_LOCAL_RANKS, MAX_WORLD_SIZE};

/// Ranks per CPU core beyond which starting them earns a warning: they will mostly wait for a
/// core, and time out under load.
pub const RANKS_PER_CORE_WARNING: usize = 8;

/// Checks `nproc_per_node` ranks on each of `nnodes` nodes against [`MAX_LOCAL_RANKS`] and
/// [`MAX_WORLD_SIZE`], before anything starts; `flag` names what the user typed (e.g.
/// `--nproc-per-node`). Returns the world size.
pub fn check_ranks(flag: &str, nproc_per_node: usize, nnodes: usize) -> Result<usize> {
    if nproc_per_node == 0 || nnodes == 0 {
        return Err(CommError::Usage(format!(
            "{flag}: a job needs at least one rank on at least one node"
        )));
    }
    if nproc_per_node > MAX_LOCAL_RANKS {
        return Err(CommError::Usage(format!(
            "{flag} {nproc_per_node}: at most {MAX_LOCAL_RANKS} ranks on one node (this one has \
             {} CPU cores); each rank is a process with its own threads and sockets, so that many \
             would exhaust the node before the job starts",
            cores()
        )));
    }
    match nproc_per_node.checked_mul(nnodes) {
        Some(world) if world <= MAX_WORLD_SIZE => Ok(world),
        _ => Err(CommError::Usage(format!(
            "{flag}: {nproc_per_node} ranks on each of {nnodes} nodes is more than \
             {MAX_WORLD_SIZE} ranks, the most one job may have"
        ))),
    }
}

/// A warning, when `nproc_per_node` ranks are far more than this node's cores, else None.
pub fn oversubscription_warning(nproc_per_node: usize) -> Option<String> {
    let cores = cores();
    (nproc_per_node > RANKS_PER_CORE_WARNING * cores).then(|| {
        format!(
            "warning: {nproc_per_node} ranks on {cores} CPU core{}: more than \
             {RANKS_PER_CORE_WARNING} per core, they will mostly wait for a core (and may time out)",
            if cores == 1 { "" } else { "s" }
        )
    })
}

/// The CPU cores this process may use.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// What to start and how.
#[derive(Debug, Clone)]
pub struct SpawnPlan {
    /// The program every rank runs (this one, when it spawns itself).
    pub program: PathBuf,
    /// Arguments every rank gets, unchanged.
    pub args: Vec<OsString>,
    /// Ranks to start on this node.
    pub nproc_per_node: usize,
    /// Nodes in the job: the world size is nnodes × nproc_per_node.
    pub nnodes: usize,
    /// This node's index; its ranks are node_rank × nproc_per_node onwards.
    pub node_rank: usize,
    /// The host rank 0 serves the rendezvous store on, passed to the ranks as MASTER_ADDR.
    pub master_addr: String,
    /// The store's port, passed to the ranks as MASTER_PORT.
    pub master_port: u16,
    /// Prefix each relayed line with `[rank]: ` (commrun's default). Without it the ranks'
    /// stdout is this process's own, so lines keep the order the ranks wrote them in.
    pub prefix_output: bool,
    /// Time between SIGTERM and SIGKILL when stopping ranks.
    pub grace: Duration,
    /// The run the ranks belong to, passed as TORCHELASTIC_RUN_ID (None: ranks started by hand).
    pub run_id: Option<String>,
}

/// Where one output stream of a rank goes: the console, a log file, both, or neither. Its
/// stderr's last lines reach the failure summary wherever it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Shown on this process's own stdout or stderr (labelled `[rank]: ` if the plan says so).
    pub console: bool,
    /// Written to this file too, line by line without the label (created, or emptied).
    pub file: Option<PathBuf>,
}

impl Default for Route {
    /// The console only, as [`run`] shows every rank.
    fn default() -> Route {
        Route {
            console: true,
            file: None,
        }
    }
}

/// Where a rank's stdout and stderr go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RankOutput {
    /// Its stdout's way.
    pub stdout: Route,
    /// Its stderr's way.
    pub stderr: Route,
}

/// What a launcher adds to a [`SpawnPlan`] for one start of the ranks. The default adds
/// nothing: [`run`].
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// Variables every rank gets besides torchrun's (e.g. `TORCHELASTIC_RESTART_COUNT`).
    pub env: Vec<(String, String)>,
    /// Where each rank's output goes, by local rank; a rank past the end: the console.
    pub outputs: Vec<RankOutput>,
}

/// How a rank ended, for the summary.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The rank blamed as the root cause among those that failed together, as the job numbers
    /// ranks.
    pub rank: usize,
    /// How its process ended: an exit code or a signal.
    pub status: ExitStatus,
    /// Its last lines of stderr (up to 10, each cut to 2 KiB), for the summary.
    pub last_stderr: Vec<String>,
    /// How many other ranks of this node failed too (with it, or reporting an error of their
    /// own while being stopped): counted, not listed, so a large job ends with one line.
    pub others_failed: usize,
    /// What the rank wrote at `TORCHELASTIC_ERROR_FILE` when it failed; None when it wrote
    /// nothing (killed by a signal, or a program that does not report through this library).
    pub record: Option<ErrorRecord>,
}

impl Failure {
    /// The exit code a launcher passes on: the rank's own, or 128 + signal as a shell reports it.
    pub fn exit_code(&self) -> i32 {
        exit_code(self.status)
    }

    /// One line for the summary: the rank and its exit code, or the signal that killed it.
    pub fn describe(&self) -> String {
        match (self.status.code(), self.status.signal()) {
            (Some(code), _) => format!("rank {} exited with code {code}", self.rank),
            (None, Some(libc::SIGPIPE)) => format!(
                "rank {} stopped: its output was closed (SIGPIPE; the reader of a pipe such as \
                 `| head` ended before the program did)",
                self.rank
            ),
            (None, Some(sig)) => format!(
                "rank {} was killed by signal {sig} ({})",
                self.rank,
                signal_name(sig)
            ),
            _ => format!("rank {} ended with {:?}", self.rank, self.status),
        }
    }

    /// ` (N other ranks also failed)`, or nothing when it failed alone: ends a summary line.
    pub fn others(&self) -> String {
        match self.others_failed {
            0 => String::new(),
            1 => " (1 other rank also failed)".into(),
            n => format!(" ({n} other ranks also failed)"),
        }
    }
}

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
}

impl Outcome {
    /// The code the launcher exits with: 0, the failed rank's, or 128 + the signal.
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Success => 0,
            Outcome::Failed(f) => f.exit_code(),
            Outcome::Interrupted(sig) => 128 + sig,
        }
    }
}

/// A status as a shell reports it: the exit code, or 128 + the signal that ended it.
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        _ => "signal",
    }
}

/// A signal caught and not yet passed on to the ranks.
static RECEIVED_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// The last signal caught, kept: see [`interrupted`].
static INTERRUPTED_BY: AtomicI32 = AtomicI32::new(0);

extern "C" fn remember_signal(sig: libc::c_int) {
    RECEIVED_SIGNAL.store(sig, Ordering::SeqCst);
    INTERRUPTED_BY.store(sig, Ordering::SeqCst);
}

/// The SIGINT or SIGTERM this process last received since [`run`] (or [`run_with`]) first
/// started ranks, if any. It was passed on to the ranks; a launcher that restarts
/// failed ranks asks this first, as an interrupt (Ctrl-C, a cancelled job) never restarts.
pub fn interrupted() -> Option<i32> {
    match INTERRUPTED_BY.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// Catches SIGINT and SIGTERM so the parent can pass them on instead of dying first.
fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(sig, remember_signal as *const () as libc::sighandler_t);
        }
    }
}

/// Sends `sig` to the process group rank `pid` leads: the rank and every process it started
/// (that did not leave the group). Should the rank have left its group, it gets `sig` too.
fn signal_group(pid: u32, sig: i32) {
    let pid = pid as libc::pid_t;
    // SAFETY: kill(2) and getpgid(2) on a group and a pid we started; at worst they are gone
    // (ESRCH) and nothing happens.
    unsafe {
        let group = libc::kill(-pid, sig) == 0;
        if !group || libc::getpgid(pid) != pid {
            libc::kill(pid, sig);
        }
    }
}

/// Whether any process is left in the group `pid` led.
fn group_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the group exists and may be signalled.
    unsafe { libc::kill(-(pid as libc::pid_t), 0) == 0 }
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
    let world_size = check_ranks("--nproc-per-node", plan.nproc_per_node, plan.nnodes)?;
    if plan.node_rank >= plan.nnodes {
        return Err(CommError::Usage(format!(
            "node rank {} but {} nodes: node ranks go from 0 to {}",
            plan.node_rank,
            plan.nnodes,
            plan.nnodes - 1
        )));
    }
    if let Some(warning) = oversubscription_warning(plan.nproc_per_node) {
        eprintln!("{warning}");
    }
    catch_signals();
    let out_lock = Arc::new(Mutex::new(()));
    let (exits, exited) =
        crossbeam_channel::unbounded::<(usize, std::io::Result<ExitStatus>, u64)>();
    let records = ErrorDir::create();
    let mut log_files = open_log_files(extras, plan.nproc_per_node)?.into_iter();
    let mut pids = Vec::new();
    let mut relays = Vec::new();
    let mut stderr_tails = Vec::new();

    for local_rank in 0..plan.nproc_per_node {
        let topology = Topology {
            rank: plan.node_rank * plan.nproc_per_node + local_rank,
            world_size,
            local_rank,
            local_world_size: plan.nproc_per_node,
            node_rank: plan.node_rank,
            master_addr: plan.master_addr.clone(),
            master_port: plan.master_port,
            launcher: Launcher::Torchrun,
            run_id: plan.run_id.clone(),
            // A worker reads GLOO_SOCKET_IFNAME itself, from the environment it inherits.
            socket_ifname: None,
            store: crate::topology::StoreHost::RankZero,
        };
        let rank = topology.rank;
        let output = extras.outputs.get(local_rank).cloned().unwrap_or_default();
        let (stdout_file, stderr_file) = log_files.next().unwrap_or_default();
        let mut command = Command::new(&plan.program);
        command
            .args(&plan.args)
            .envs(topology.worker_env())
            .envs(extras.env.iter().map(|(k, v)| (k, v)))
            .env_remove(ERROR_FILE_ENV)
            .stdin(Stdio::null())
            .stdout(stdout_mode(plan, &output.stdout))
            .stderr(Stdio::piped());
        if let Some(records) = &records {
            command.env(ERROR_FILE_ENV, records.file(rank));
        }
        // SAFETY: setpgid and prctl are async-signal-safe. The rank leads a process group of
        // its own, which is what gets signalled: what the rank starts goes with it. If this
        // parent dies, even by SIGKILL, the kernel kills the rank: no orphan keeps running.
        // (Out of the terminal's foreground group, the rank no longer gets Ctrl-C itself: the
        // parent catches it and passes it on to the group.)
        unsafe {
            command.pre_exec(|| {
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child: Child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                for &pid in &pids {
                    signal_group(pid, libc::SIGKILL);
                }
                return Err(CommError::io(
                    format!("cannot start rank {rank} ({})", plan.program.display()),
                    e,
                ));
            }
        };
        pids.push(child.id());
        let prefix = plan.prefix_output.then(|| format!("[{rank}]: "));
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(stdout) = child.stdout.take() {
            let sink = Sink {
                console: output.stdout.console.then_some(Console::Stdout),
                prefix: prefix.clone(),
                file: stdout_file,
            };
            relays.push(relay(stdout, sink, out_lock.clone(), None));
        }
        let sink = Sink {
            console: output.stderr.console.then_some(Console::Stderr),
            prefix,
            file: stderr_file,
        };
        let stderr = child.stderr.take().unwrap();
        relays.push(relay(stderr, sink, out_lock.clone(), Some(tail.clone())));
        stderr_tails.push(tail);
        let exits = exits.clone();
        std::thread::spawn(move || {
            let status = child.wait();
            let _ = exits.send((local_rank, status, unix_us()));
        });
    }
    drop(exits);

    let mut running = vec![true; plan.nproc_per_node];
    let mut outcome = Outcome::Success;
    let mut kill_at: Option<Instant> = None;
    let stop_all = |running: &[bool], sig: i32| {
        for (i, &alive) in running.iter().enumerate() {
            if alive {
                signal_group(pids[i], sig);
            }
        }
    };
    while running.iter().any(|&r| r) {
        match exited.recv_timeout(Duration::from_millis(20)) {
            Ok((local_rank, status, exited_us)) => {
                running[local_rank] = false;
                let status = status.map_err(|e| CommError::io("waiting for a rank", e))?;
                if let Outcome::Failed(failure) = &mut outcome {
                    // A rank stopped after the failure counts as failed too when it reported an
                    // error of its own (not when our signal ended it).
                    let rank = plan.node_rank * plan.nproc_per_node + local_rank;
                    if !status.success()
                        && records
                            .as_ref()
                            .is_some_and(|r| ErrorRecord::read(&r.file(rank)).is_some())
                    {
                        failure.others_failed += 1;
                    }
                }
                if !status.success() && matches!(outcome, Outcome::Success) {
                    // Give the relay a moment to pass on the rank's last words, and the ranks
                    // that failed because of this one (or this one because of them) time to
                    // report: the order waiter threads report in is not the order ranks died.
                    std::thread::sleep(Duration::from_millis(50));
                    let first_rank = plan.node_rank * plan.nproc_per_node;
                    let failed_rank = |local_rank: usize, status, exited_us| FailedRank {
                        rank: first_rank + local_rank,
                        status,
                        exited_us,
                        record: records
                            .as_ref()
                            .and_then(|r| ErrorRecord::read(&r.file(first_rank + local_rank))),
                    };
                    let mut failed = vec![failed_rank(local_rank, status, exited_us)];
                    while let Ok((other, status, exited_us)) = exited.try_recv() {
                        running[other] = false;
                        match status {
                            Ok(status) if !status.success() => {
                                failed.push(failed_rank(other, status, exited_us))
                            }
                            _ => {}
                        }
                    }
                    let root = failed.swap_remove(root_cause(&failed));
                    let last_stderr = stderr_tails[root.rank - first_rank]
                        .lock()
                        .unwrap()
                        .iter()
                        .cloned()
                        .collect();
                    outcome = Outcome::Failed(Failure {
                        rank: root.rank,
                        status: root.status,
                        last_stderr,
                        others_failed: failed.len(),
                        record: root.record,
                    });
                    stop_all(&running, libc::SIGTERM);
                    kill_at = Some(Instant::now() + plan.grace);
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        }
        let sig = RECEIVED_SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            if !matches!(outcome, Outcome::Failed(_)) {
                outcome = Outcome::Interrupted(sig);
            }
            stop_all(&running, sig);
            kill_at.get_or_insert(Instant::now() + plan.grace);
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            stop_all(&running, libc::SIGKILL);
            kill_at = None;
        }
    }
    // Whatever the ranks started and left behind is still in their groups: it goes with them.
    for &pid in &pids {
        if group_alive(pid) {
            signal_group(pid, libc::SIGKILL);
        }
    }
    // The pipes close when the ranks exit; a process that left its group holding one open must
    // not hang us.
    let deadline = Instant::now() + Duration::from_secs(2);
    for relay in relays {
        while !relay.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    Ok(outcome)
}

/// A rank that failed, as the root-cause choice sees it.
struct FailedRank {
    rank: usize,
    status: ExitStatus,
    /// When its waiter thread saw it exit, in microseconds since the Unix epoch.
    exited_us: u64,
    record: Option<ErrorRecord>,
}

impl FailedRank {
    /// When it failed: when it reported the failure if it wrote a record, else when it exited.
    fn failed_us(&self) -> u64 {
        self.record
            .as_ref()
            .and_then(ErrorRecord::at_us)
            .unwrap_or(self.exited_us)
    }

    /// The ranks its record says it failed because of: the one it blames, then those it waited
    /// for in vain.
    fn blames(&self) -> impl Iterator<Item = usize> + '_ {
        self.record.iter().flat_map(|r| {
            r.blamed_rank
                .into_iter()
                .chain(r.missing_ranks.iter().copied())
        })
    }
}

/// Among ranks that failed together, the index of the root cause: start from the earliest
/// failure (a record's time, or the exit time of a rank that wrote none, so with no records at
/// all this is the exit order), then follow the blame in the records to a rank that failed too.
/// A rank that blames a rank that did not fail (yet) stays the root; so does the earliest
/// failure when the blame goes round in a circle.
fn root_cause(failed: &[FailedRank]) -> usize {
    let Some(start) = (0..failed.len()).min_by_key(|&i| (failed[i].failed_us(), i)) else {
        return 0;
    };
    let mut chain = vec![start];
    let mut current = start;
    loop {
        let next = failed[current]
            .blames()
            .filter_map(|rank| failed.iter().position(|f| f.rank == rank))
            .find(|&i| i != current);
        match next {
            None => return current,
            Some(i) if chain.contains(&i) => return start,
            Some(i) => {
                chain.push(i);
                current = i;
            }
        }
    }
}

/// The directory of this launch's error records, one file per rank; removed when dropped.
struct ErrorDir(PathBuf);

impl ErrorDir {
    /// A fresh private directory under the system's temporary directory; None if none can be
    /// made (the ranks then write no records and the root cause falls back to the exit order).
    fn create() -> Option<ErrorDir> {
        use std::os::unix::fs::DirBuilderExt;
        for attempt in 0..16 {
            let path = std::env::temp_dir().join(format!(
                "comm-core-errors-{}-{}-{attempt}",
                std::process::id(),
                unix_us()
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Some(ErrorDir(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(_) => return None,
            }
        }
        None
    }

    /// Where `rank` writes its record.
    fn file(&self, rank: usize) -> PathBuf {
        self.path().join(format!("rank-{rank}.json"))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ErrorDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How a rank's stdout is connected: straight to ours when only the console shows it unlabelled,
/// to nothing when nothing shows it, else to a pipe that a relay reads.
fn stdout_mode(plan: &SpawnPlan, route: &Route) -> Stdio {
    match (route.console, &route.file) {
        (false, None) => Stdio::null(),
        // Unlabelled, the ranks write straight to our stdout: one file, so the kernel keeps
        // their lines in the order they were written, and a rank's line printed before it sent
        // its row comes before rank 0's grid. (Through a relay per rank that order is lost.) A
        // line longer than a pipe's atomic write (4 KiB) could interleave with another rank's;
        // the course's lines are short.
        (true, None) if !plan.prefix_output => Stdio::inherit(),
        _ => Stdio::piped(),
    }
}

/// The log files of every local rank (stdout's, stderr's), created or emptied before any rank
/// starts.
fn open_log_files(extras: &Extras, nproc: usize) -> Result<Vec<(Option<File>, Option<File>)>> {
    let open = |route: &Route| -> Result<Option<File>> {
        let Some(path) = &route.file else {
            return Ok(None);
        };
        File::create(path)
            .map(Some)
            .map_err(|e| CommError::io(format!("cannot create log file {}", path.display()), e))
    };
    let outputs = extras.outputs.iter().take(nproc);
    outputs
        .map(|o| Ok((open(&o.stdout)?, open(&o.stderr)?)))
        .collect()
}

/// Which of our own streams a relayed stream is shown on.
#[derive(Clone, Copy)]
enum Console {
    Stdout,
    Stderr,
}

/// Where a relay copies one stream of one rank: our console (labelled or not), a log file,
/// both, or neither.
struct Sink {
    console: Option<Console>,
    prefix: Option<String>,
    file: Option<File>,
}

impl Sink {
    /// Writes one whole line. Fails only when the console is closed (the relay then stops); a
    /// log file that cannot be written is said once on stderr and then left out.
    fn write(&mut self, line: &[u8], lock: &Mutex<()>) -> std::io::Result<()> {
        if let Some(file) = &mut self.file {
            if let Err(e) = file.write_all(line) {
                eprintln!("warning: a log file could not be written ({e}); its lines are lost");
                self.file = None;
            }
        }
        let Some(console) = self.console else {
            return Ok(());
        };
        let prefix = self.prefix.as_deref();
        let _guard = lock.lock().unwrap();
        match console {
            Console::Stdout => write_line(&mut std::io::stdout().lock(), prefix, line),
            Console::Stderr => write_line(&mut std::io::stderr().lock(), prefix, line),
        }
    }
}

/// Copies a child's output to its [`Sink`] a whole line at a time, optionally keeping the last
/// lines.
///
/// A line longer than [`LINE_CAP`] is shown cut, with a marker saying how many bytes were cut;
/// the rest is read and dropped as it comes, so a line of any length costs at most the cap.
fn relay(
    source: impl Read + Send + 'static,
    mut sink: Sink,
    lock: Arc<Mutex<()>>,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(source);
        let mut line = Vec::new();
        let mut cut = 0u64;
        loop {
            let complete = match read_capped_line(&mut reader, &mut line, &mut cut) {
                Ok(0) | Err(_) => return,
                Ok(_) => line.ends_with(b"\n"),
            };
            if !complete {
                line.push(b'\n');
            }
            if cut > 0 {
                line.pop();
                line.extend_from_slice(format!(" \u{2026} [{cut} bytes cut]\n").as_bytes());
            }
            if let Some(tail) = &tail {
                let mut tail = tail.lock().unwrap();
                if tail.len() == KEPT_LINES {
                    tail.pop_front();
                }
                tail.push_back(tail_line(&line));
            }
            if sink.write(&line, &lock).is_err() {
                return;
            }
        }
    })
}

/// Reads one line into `line` (cleared first), keeping at most [`LINE_CAP`] bytes of it, then
/// its newline if it had one, and counting the bytes dropped in `cut`. Returns the bytes read
/// (0 at the end). A cut line ends on a whole UTF-8 character.
fn read_capped_line(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    cut: &mut u64,
) -> std::io::Result<usize> {
    line.clear();
    *cut = 0;
    let mut read = 0;
    let mut newline = false;
    while !newline {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            break;
        }
        let (used, content) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                newline = true;
                (i + 1, &buf[..i])
            }
            None => (buf.len(), buf),
        };
        let take = content.len().min(LINE_CAP - line.len());
        line.extend_from_slice(&content[..take]);
        *cut += (content.len() - take) as u64;
        reader.consume(used);
        read += used;
    }
    if *cut > 0 {
        // Do not end a cut line in the middle of a character.
        if let Err(e) = std::str::from_utf8(line) {
            if e.error_len().is_none() {
                *cut += (line.len() - e.valid_up_to()) as u64;
                line.truncate(e.valid_up_to());
            }
        }
    }
    if newline {
        line.push(b'\n');
    }
    Ok(read)
}

/// A relayed line as the summary keeps it: without its newline, at most [`TAIL_LINE_CAP`]
/// bytes (on a character boundary).
fn tail_line(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end();
    if text.len() <= TAIL_LINE_CAP {
        return text.to_string();
    }
    let mut end = TAIL_LINE_CAP;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} \u{2026} [{} bytes cut]", &text[..end], text.len() - end)
}

fn write_line(out: &mut impl Write, prefix: Option<&str>, line: &[u8]) -> std::io::Result<()> {
    if let Some(prefix) = prefix {
        out.write_all(prefix.as_bytes())?;
    }
    out.write_all(line)?;
    out.flush()
}

/// A port that is free right now on this machine, for a job that picks its own.
///
/// Rank 0 binds it a moment later, so it is picked below the kernel's ephemeral range
/// (`ip_local_port_range`), where no outgoing connection or `bind(0)` can take it meanwhile.
pub fn free_port() -> Result<u16> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(10_001));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64)
        ^ ((std::process::id() as u64) << 32);
    for attempt in 0..64u64 {
        let mixed =
            (seed ^ attempt.wrapping_mul(0x9e3779b97f4a7c15)).wrapping_mul(0xbf58476d1ce4e5b9);
        let port = low + ((mixed >> 33) % u64::from(high - low)) as u16;
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return Ok(port);
        }
    }
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| CommError::io("finding a free port for the rendezvous store", e))
}

#[cfg(test)]
mod root_cause_tests {
    use super::*;
    use crate::error::CommError;

    fn code(c: i32) -> ExitStatus {
        ExitStatus::from_raw(c << 8)
    }

    /// A rank that failed with `error` (reported at `at_us`) and exited at `exited_us`.
    fn failed(rank: usize, error: Option<CommError>, at_us: u64, exited_us: u64) -> FailedRank {
        FailedRank {
            rank,
            status: code(1),
            exited_us,
            record: error.map(|e| ErrorRecord {
                at_unix_us: Some(at_us),
                ..ErrorRecord::new(rank, &e)
            }),
        }
    }

    fn closed(rank: usize, peer: usize) -> Option<CommError> {
        Some(CommError::PeerClosed {
            rank,
            peer,
            doing: "receiving from",
        })
    }

    #[test]
    fn the_rank_others_blame_is_the_root_cause() {
        // Rank 1 left first (on purpose, no record); rank 2 blames 1, rank 0 blames 2.
        // Reported in the wrong order: 2, then 0, then 1.
        let ranks = [
            failed(2, closed(2, 1), 20, 21),
            failed(0, closed(0, 2), 30, 31),
            failed(1, None, 0, 15),
        ];
        assert_eq!(ranks[root_cause(&ranks)].rank, 1);
        // Even when the records' clocks say rank 0 was first, the blame leads to rank 1.
        let ranks = [
            failed(2, closed(2, 1), 20, 21),
            failed(0, closed(0, 2), 5, 31),
            failed(1, None, 0, 40),
        ];
        assert_eq!(ranks[root_cause(&ranks)].rank, 1);
        // The blamed rank did not fail (yet): the earliest failure stands.
        let ranks = [
            failed(2, closed(2, 1), 20, 21),
            failed(0, closed(0, 2), 30, 31),
        ];
        assert_eq!(ranks[root_cause(&ranks)].rank, 2);
    }

    #[test]
    fn the_earliest_record_wins_when_nobody_is_blamed() {
        let usage = || Some(CommError::Usage("bad".into()));
        let ranks = [failed(0, usage(), 50, 51), failed(3, usage(), 10, 60)];
        assert_eq!(ranks[root_cause(&ranks)].rank, 3);
    }

    #[test]
    fn without_records_the_exit_order_decides() {
        let ranks = [failed(1, None, 0, 100), failed(0, None, 0, 90)];
        assert_eq!(ranks[root_cause(&ranks)].rank, 0);
        let ranks = [failed(1, None, 0, 100), failed(0, None, 0, 100)];
        assert_eq!(
            ranks[root_cause(&ranks)].rank,
            1,
            "a tie keeps the report order"
        );
    }

    #[test]
    fn a_timeout_leads_to_the_missing_rank_and_a_lost_store_to_rank_0() {
        let timeout = CommError::Timeout {
            what: "barrier 'b' on rank 1".into(),
            timeout: Duration::from_secs(1),
            detail: String::new(),
            missing: vec![2, 3],
        };
        // Rank 3 was killed (no record, exited later than rank 1 wrote its record).
        let ranks = [failed(1, Some(timeout), 10, 11), failed(3, None, 0, 20)];
        assert_eq!(ranks[root_cause(&ranks)].rank, 3);

        let lost = CommError::StoreLost {
            rank: 1,
            endpoint: "h:1".into(),
            key: "k".into(),
            source: std::io::ErrorKind::UnexpectedEof.into(),
        };
        let ranks = [
            failed(1, Some(lost), 10, 11),
            failed(0, Some(CommError::Usage("bad".into())), 12, 13),
        ];
        assert_eq!(ranks[root_cause(&ranks)].rank, 0);
    }

    #[test]
    fn blame_in_a_circle_keeps_the_earliest() {
        let ranks = [
            failed(0, closed(0, 1), 20, 21),
            failed(1, closed(1, 0), 10, 11),
        ];
        assert_eq!(ranks[root_cause(&ranks)].rank, 1);
    }

    #[test]
    fn the_error_dir_is_private_and_removed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = ErrorDir::create().unwrap();
        let path = dir.path().to_path_buf();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(dir.file(3), path.join("rank-3.json"));
        std::fs::write(dir.file(3), "{}").unwrap();
        drop(dir);
        assert!(!path.exists());
    }
}
