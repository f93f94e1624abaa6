//! Self-spawn: start one process per local rank, as torch.multiprocessing.spawn and torchrun do.
//! Each child is this same program with torchrun's variables set. The parent relays their
//! output line by line (never a torn line), forwards Ctrl-C, and when one rank fails stops the
//! others (SIGTERM, then SIGKILL after a grace period) and exits with that rank's status.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};
use crate::topology::{Launcher, Topology};

/// How many of a failed rank's last stderr lines the summary shows.
const KEPT_LINES: usize = 10;

/// What to start and how.
#[derive(Debug, Clone)]
pub struct SpawnPlan {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub nproc_per_node: usize,
    pub nnodes: usize,
    pub node_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// Prefix each relayed line with `[rank]: `.
    pub prefix_output: bool,
    /// Time between SIGTERM and SIGKILL when stopping ranks.
    pub grace: Duration,
}

/// How a rank ended, for the summary.
#[derive(Debug, Clone)]
pub struct Failure {
    pub rank: usize,
    pub status: ExitStatus,
    pub last_stderr: Vec<String>,
}

impl Failure {
    /// The exit code a launcher passes on: the rank's own, or 128 + signal as a shell reports it.
    pub fn exit_code(&self) -> i32 {
        exit_code(self.status)
    }

    pub fn describe(&self) -> String {
        match (self.status.code(), self.status.signal()) {
            (Some(code), _) => format!("rank {} exited with code {code}", self.rank),
            (None, Some(sig)) => format!(
                "rank {} was killed by signal {sig} ({})",
                self.rank,
                signal_name(sig)
            ),
            _ => format!("rank {} ended with {:?}", self.rank, self.status),
        }
    }
}

/// How the whole launch ended.
#[derive(Debug)]
pub enum Outcome {
    Success,
    /// The first rank to fail; the others were stopped.
    Failed(Failure),
    /// A signal (Ctrl-C) came from outside and was passed on.
    Interrupted(i32),
}

impl Outcome {
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Success => 0,
            Outcome::Failed(f) => f.exit_code(),
            Outcome::Interrupted(sig) => 128 + sig,
        }
    }
}

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

static RECEIVED_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn remember_signal(sig: libc::c_int) {
    RECEIVED_SIGNAL.store(sig, Ordering::SeqCst);
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

fn signal_child(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a child's pid; at worst the child is already gone.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Starts the ranks of this node and waits for them. Returns how they ended.
pub fn run(plan: &SpawnPlan) -> Result<Outcome> {
    catch_signals();
    let world_size = plan.nproc_per_node * plan.nnodes;
    let out_lock = Arc::new(Mutex::new(()));
    let (exits, exited) = crossbeam_channel::unbounded::<(usize, std::io::Result<ExitStatus>)>();
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
        };
        let rank = topology.rank;
        let mut command = Command::new(&plan.program);
        command
            .args(&plan.args)
            .envs(topology.worker_env())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe. If this parent dies, even by SIGKILL, the kernel
        // kills the child: no orphan keeps running.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child: Child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                for &pid in &pids {
                    signal_child(pid, libc::SIGKILL);
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
        relays.push(relay(
            child.stdout.take().unwrap(),
            prefix.clone(),
            false,
            out_lock.clone(),
            None,
        ));
        relays.push(relay(
            child.stderr.take().unwrap(),
            prefix,
            true,
            out_lock.clone(),
            Some(tail.clone()),
        ));
        stderr_tails.push(tail);
        let exits = exits.clone();
        std::thread::spawn(move || {
            let status = child.wait();
            let _ = exits.send((local_rank, status));
        });
    }
    drop(exits);

    let mut running = vec![true; plan.nproc_per_node];
    let mut outcome = Outcome::Success;
    let mut kill_at: Option<Instant> = None;
    let stop_all = |running: &[bool], sig: i32| {
        for (i, &alive) in running.iter().enumerate() {
            if alive {
                signal_child(pids[i], sig);
            }
        }
    };
    while running.iter().any(|&r| r) {
        match exited.recv_timeout(Duration::from_millis(20)) {
            Ok((local_rank, status)) => {
                running[local_rank] = false;
                let status = status.map_err(|e| CommError::io("waiting for a rank", e))?;
                if !status.success() && matches!(outcome, Outcome::Success) {
                    // Give the relay a moment to pass on the rank's last words, and the ranks
                    // that failed because of this one (or this one because of them) time to
                    // report: the order waiter threads report in is not the order ranks died.
                    std::thread::sleep(Duration::from_millis(50));
                    let mut failed = vec![(local_rank, status)];
                    while let Ok((other, status)) = exited.try_recv() {
                        running[other] = false;
                        match status {
                            Ok(status) if !status.success() => failed.push((other, status)),
                            _ => {}
                        }
                    }
                    let tail = |local: usize| -> Vec<String> {
                        stderr_tails[local]
                            .lock()
                            .unwrap()
                            .iter()
                            .cloned()
                            .collect()
                    };
                    let (local_rank, status) =
                        root_cause(&failed, plan.node_rank * plan.nproc_per_node, &tail);
                    outcome = Outcome::Failed(Failure {
                        rank: plan.node_rank * plan.nproc_per_node + local_rank,
                        status,
                        last_stderr: tail(local_rank),
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
    // The pipes close when the ranks exit; a grandchild holding one open must not hang us.
    let deadline = Instant::now() + Duration::from_secs(2);
    for relay in relays {
        while !relay.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    Ok(outcome)
}

/// Among ranks that failed together, the one the others blame: a rank whose last words say
/// "rank K closed its connection" failed because K did, so follow that to K when K failed too.
fn root_cause(
    failed: &[(usize, ExitStatus)],
    first_rank: usize,
    tail: &impl Fn(usize) -> Vec<String>,
) -> (usize, ExitStatus) {
    let mut current = 0;
    for _ in 0..failed.len() {
        let blamed = tail(failed[current].0).iter().rev().find_map(|line| {
            // "error: rank 2: rank 1 closed its connection …" blames rank 1.
            let before = &line[..line.find(" closed its connection")?];
            let (head, number) = before.rsplit_once(' ')?;
            head.ends_with("rank")
                .then(|| number.parse::<usize>().ok())
                .flatten()
        });
        match blamed.and_then(|rank| failed.iter().position(|(l, _)| l + first_rank == rank)) {
            Some(next) if next != current => current = next,
            _ => break,
        }
    }
    failed[current]
}

/// Copies a child's output to ours a whole line at a time, optionally keeping the last lines.
fn relay(
    source: impl Read + Send + 'static,
    prefix: Option<String>,
    to_stderr: bool,
    lock: Arc<Mutex<()>>,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(source);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            if let Some(tail) = &tail {
                let mut tail = tail.lock().unwrap();
                if tail.len() == KEPT_LINES {
                    tail.pop_front();
                }
                tail.push_back(String::from_utf8_lossy(&line).trim_end().to_string());
            }
            let _guard = lock.lock().unwrap();
            let written = if to_stderr {
                write_line(&mut std::io::stderr().lock(), prefix.as_deref(), &line)
            } else {
                write_line(&mut std::io::stdout().lock(), prefix.as_deref(), &line)
            };
            if written.is_err() {
                return;
            }
        }
    })
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

    #[test]
    fn the_rank_others_blame_is_the_root_cause() {
        let code = |c: i32| ExitStatus::from_raw(c << 8);
        let tails = |local: usize| -> Vec<String> {
            match local {
                0 => vec!["error: rank 0: rank 2 closed its connection while rank 0 was receiving from it".into()],
                2 => vec!["error: rank 2: rank 1 closed its connection while rank 2 was receiving from it".into()],
                _ => vec!["rank 1 is leaving on purpose".into()],
            }
        };
        // Reported in the wrong order: 2, then 0, then 1 (the one that left first).
        let failed = [(2, code(1)), (0, code(1)), (1, code(3))];
        assert_eq!(root_cause(&failed, 0, &tails).0, 1);
        // The blamed rank did not fail (yet): the first report stands.
        assert_eq!(root_cause(&failed[..2], 0, &tails).0, 2);
    }
}
