//! `comm-bench store-load`: the rendezvous of N ranks played against a store, ours or PyTorch's
//! TCPStore (its libuv server, the default since PyTorch 2.4), by one driver for both: the wire
//! protocol is the same (comm-core's `store::wire`). Each simulated rank does what one of our
//! ranks does as a job starts ([`Script`]): opens its two connections (requests and the
//! watcher), validates and pings each, parks the watcher in a WAIT for the abort key, joins
//! (two COMPARE_SETs and a CHECK in one write), passes a barrier (SET confirmed by a PING, ADD,
//! the last one SETs the done key, WAIT), then reads rank 0's value (rank 0 SETs it; the others
//! WAIT for it and GET it). The time until every rank has its value is the rendezvous'.
//!
//! Thousands of ranks come from a few threads: each drives its share of the ranks' sockets,
//! non-blocking, through one epoll set. The server runs in a process of its own, so that its
//! CPU time and peak memory are read from /proc, apart from the driver's.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Cursor, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};

use comm_core::epoll::{self, Epoll};
use comm_core::store::{Answer, Command, Shape, VALIDATION_MAGIC};

use crate::error::BenchError;

/// Which store a run meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// comm-core's `StoreServer`, in a child `comm-bench store-load --serve N`.
    Ours,
    /// `torch.distributed.TCPStore(..., is_master=True, use_libuv=True)` in a child python.
    Torch,
}

impl Server {
    pub fn name(self) -> &'static str {
        match self {
            Server::Ours => "ours",
            Server::Torch => "torch",
        }
    }
}

/// One rendezvous measured: how long, and what the server spent.
#[derive(Debug, Clone)]
pub struct Measured {
    pub server: Server,
    pub ranks: usize,
    /// From the first connect to the last rank holding rank 0's value.
    pub elapsed: Duration,
    /// The server process's user + system CPU time over the run.
    pub server_cpu: Duration,
    /// The server process's peak resident memory (VmHWM), KiB.
    pub server_peak_kib: u64,
}

/// The server of one run, its address and its process.
struct Running {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `server` for a job of `ranks` ranks and reads the port it prints.
fn start(server: Server, ranks: usize, python: &str) -> Result<Running, BenchError> {
    let mut process = match server {
        Server::Ours => {
            let me = std::env::current_exe()
                .map_err(|e| BenchError::Store(format!("cannot find comm-bench: {e}")))?;
            let mut p = Process::new(me);
            p.args(["store-load", "--serve", &ranks.to_string()]);
            p
        }
        Server::Torch => {
            let mut p = Process::new(python);
            p.args(["-c", TORCH_SERVER, &ranks.to_string()]);
            p
        }
    };
    let mut child = process
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| BenchError::Store(format!("cannot start {} store: {e}", server.name())))?;
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped");
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| BenchError::Store(format!("{} store: {e}", server.name())))?;
    let port: u16 = line.trim().parse().map_err(|_| {
        let _ = child.kill();
        BenchError::Store(format!(
            "the {} store printed {line:?} instead of its port",
            server.name()
        ))
    })?;
    Ok(Running {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
    })
}

/// PyTorch's server, as a rank 0 of torchrun's workers starts it (its client is kept idle).
const TORCH_SERVER: &str = "\
import sys
from datetime import timedelta
from torch.distributed import TCPStore
s = TCPStore('127.0.0.1', 0, int(sys.argv[1]), True, timedelta(seconds=300),
             wait_for_workers=False, use_libuv=True)
print(s.port, flush=True)
sys.stdin.read()
";

/// `--serve N`: our store for a job of N ranks on a free port of 127.0.0.1; prints the port and
/// serves until stdin closes.
pub fn serve(ranks: usize) -> Result<(), BenchError> {
    let server = comm_core::store::StoreServer::bind_job("127.0.0.1", 0, ranks, None)
        .map_err(|e| BenchError::Store(e.to_string()))?;
    println!("{}", server.port());
    std::io::stdout().flush().ok();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    Ok(())
}

/// Plays `ranks` ranks' rendezvous against `server` from `threads` threads.
pub fn measure(
    server: Server,
    ranks: usize,
    threads: usize,
    python: &str,
    timeout: Duration,
) -> Result<Measured, BenchError> {
    let running = start(server, ranks, python)?;
    let pid = running.child.id();
    let cpu_before = cpu_time(pid)?;
    let began = Instant::now();
    let deadline = began + timeout;
    let addr = running.addr;
    let threads = threads.clamp(1, ranks.max(1));
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let drivers: Vec<_> = (0..threads)
            .map(|t| {
                let mine: Vec<usize> = (t..ranks).step_by(threads).collect();
                s.spawn(move || drive(addr, ranks, &mine, deadline))
            })
            .collect();
        drivers
            .into_iter()
            .map(|d| d.join().unwrap_or_else(|_| Err("a driver panicked".into())))
            .collect()
    });
    let elapsed = began.elapsed();
    if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
        return Err(BenchError::Store(format!(
            "{} store, {ranks} ranks: {e}",
            server.name()
        )));
    }
    Ok(Measured {
        server,
        ranks,
        elapsed,
        server_cpu: cpu_time(pid)?.saturating_sub(cpu_before),
        server_peak_kib: peak_kib(pid)?,
    })
}

/// A process's user + system time so far (/proc/PID/stat, in clock ticks).
fn cpu_time(pid: u32) -> Result<Duration, BenchError> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| BenchError::Store(format!("reading the store's /proc/{pid}/stat: {e}")))?;
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = after
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_secs_f64(ticks as f64 / hz as f64))
}

/// A process's peak resident memory, KiB (VmHWM).
fn peak_kib(pid: u32) -> Result<u64, BenchError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| BenchError::Store(format!("reading the store's /proc/{pid}/status: {e}")))?;
    Ok(status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0))
}

/// The steps of one rank's rendezvous, in order (see the module's comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Script {
    /// Both connections validated and pinged; waiting for the two nonces.
    Hello,
    /// The join's two COMPARE_SETs and CHECK.
    Join,
    /// Rank 0 sets its value (confirmed by a PING).
    SetValue,
    /// SET of this rank's barrier key, confirmed.
    BarrierArrive,
    /// ADD to the barrier's count.
    BarrierCount,
    /// The last rank SETs the done key, confirmed.
    BarrierDone,
    /// WAIT for the done key.
    BarrierWait,
    /// WAIT for rank 0's value...
    ValueWait,
    /// ...and GET it.
    ValueGet,
    /// Holding rank 0's value.
    Done,
}

/// One connection: bytes to send, bytes received, and the shapes of the answers still due.
struct Conn {
    stream: TcpStream,
    out: Vec<u8>,
    inbox: Vec<u8>,
    due: VecDeque<Shape>,
}

impl Conn {
    fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = connect_nonblocking(addr)?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            out: Vec::new(),
            inbox: Vec::new(),
            due: VecDeque::new(),
        })
    }

    fn queue(&mut self, commands: &[Command]) {
        for c in commands {
            c.encode_into(&mut self.out);
            if let Some(shape) = c.answer() {
                self.due.push_back(shape);
            }
        }
    }

    /// Writes what it can; a connect still in progress answers WouldBlock.
    fn flush(&mut self) -> std::io::Result<()> {
        while !self.out.is_empty() {
            match self.stream.write(&self.out) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => drop(self.out.drain(..n)),
                Err(e) if would_block(&e) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads what is there and returns the answers now complete.
    fn answers(&mut self) -> std::io::Result<Vec<Answer>> {
        let mut chunk = [0u8; 4096];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.inbox.extend_from_slice(&chunk[..n]),
                Err(e) if would_block(&e) => break,
                Err(e) => return Err(e),
            }
        }
        let mut answers = Vec::new();
        while let Some(&shape) = self.due.front() {
            let mut cursor = Cursor::new(&self.inbox[..]);
            match Answer::read(&mut cursor, shape) {
                Ok(answer) => {
                    let used = cursor.position() as usize;
                    self.inbox.drain(..used);
                    self.due.pop_front();
                    answers.push(answer);
                }
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(e),
            }
        }
        Ok(answers)
    }
}

fn would_block(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted)
}

/// A TCP connect that returns at once; the connection completes when the socket is writable.
fn connect_nonblocking(addr: SocketAddr) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    // SAFETY: a new socket; the fd is owned by the TcpStream made from it below, or closed here.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket that nothing else owns.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let SocketAddr::V4(v4) = addr else {
        return Err(ErrorKind::Unsupported.into());
    };
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(v4.ip().octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `sin` is a valid sockaddr_in for the length given.
    let rc = unsafe {
        libc::connect(
            fd,
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    let e = std::io::Error::last_os_error();
    if rc < 0 && e.raw_os_error() != Some(libc::EINPROGRESS) {
        return Err(e);
    }
    Ok(stream)
}

/// One simulated rank: its two connections and where it is in the script.
struct Rank {
    rank: usize,
    world: usize,
    request: Conn,
    watcher: Conn,
    step: Script,
    /// Nonces still to come back in `Hello`.
    hellos: usize,
}

const BARRIER: &str = "/barrier/store-load/0";
const RANK0_VALUE: &str = "/rank0/value";

impl Rank {
    fn new(addr: SocketAddr, rank: usize, world: usize) -> std::io::Result<Rank> {
        let mut r = Rank {
            rank,
            world,
            request: Conn::open(addr)?,
            watcher: Conn::open(addr)?,
            step: Script::Hello,
            hellos: 2,
        };
        let hello = [
            Command::Validate {
                magic: VALIDATION_MAGIC,
            },
            Command::Ping { nonce: 1 },
        ];
        r.request.queue(&hello);
        r.watcher.queue(&hello);
        Ok(r)
    }

    fn set_confirmed(&mut self, key: String, value: &[u8]) {
        let set = Command::Set {
            key,
            value: value.to_vec(),
        };
        self.request.queue(&[set, Command::Ping { nonce: 2 }]);
    }

    /// Moves the script on for `answer`, from the watcher or the request connection.
    fn on_answer(&mut self, from_watcher: bool, answer: Answer) -> Result<(), String> {
        use Script::*;
        let key = |k: &str| k.to_string();
        match (self.step, answer) {
            (Hello, Answer::Nonce(_)) => {
                self.hellos -= 1;
                if from_watcher {
                    let abort = key("/job/abort");
                    self.watcher.queue(&[Command::Wait { keys: vec![abort] }]);
                }
                if self.hellos == 0 {
                    self.step = Join;
                    let me = format!("simulated rank {}", self.rank);
                    self.request.queue(&[
                        Command::CompareSet {
                            key: key("/job/world_size"),
                            expected: Vec::new(),
                            desired: self.world.to_string().into_bytes(),
                        },
                        Command::CompareSet {
                            key: format!("/job/rank/{}", self.rank),
                            expected: Vec::new(),
                            desired: me.into_bytes(),
                        },
                        Command::Check {
                            keys: vec![key("/job/abort")],
                        },
                    ]);
                }
            }
            (Join, Answer::Value(_)) => {}
            (Join, Answer::Ready(_)) if self.rank == 0 => {
                self.step = SetValue;
                self.set_confirmed(key(RANK0_VALUE), b"10.0.0.1:29500");
            }
            (Join, Answer::Ready(_)) | (SetValue, Answer::Nonce(_)) => {
                self.step = BarrierArrive;
                self.set_confirmed(format!("{BARRIER}/rank/{}", self.rank), b"here");
            }
            (BarrierArrive, Answer::Nonce(_)) => {
                self.step = BarrierCount;
                let count = format!("{BARRIER}/count");
                self.request.queue(&[Command::Add {
                    key: count,
                    delta: 1,
                }]);
            }
            (BarrierCount, Answer::Number(n)) if n as usize == self.world => {
                self.step = BarrierDone;
                self.set_confirmed(format!("{BARRIER}/done"), b"");
            }
            (BarrierCount, Answer::Number(_)) | (BarrierDone, Answer::Nonce(_)) => {
                self.step = BarrierWait;
                let done = format!("{BARRIER}/done");
                self.request.queue(&[Command::Wait { keys: vec![done] }]);
            }
            (BarrierWait, Answer::StopWaiting) => {
                self.step = ValueWait;
                let value = key(RANK0_VALUE);
                self.request.queue(&[Command::Wait { keys: vec![value] }]);
            }
            (ValueWait, Answer::StopWaiting) => {
                self.step = ValueGet;
                let value = key(RANK0_VALUE);
                self.request.queue(&[Command::Get { key: value }]);
            }
            (ValueGet, Answer::Value(v)) if !v.is_empty() => self.step = Done,
            (step, answer) => {
                return Err(format!(
                    "rank {}: at {step:?} the store answered {answer:?}",
                    self.rank
                ))
            }
        }
        Ok(())
    }
}

/// Drives `mine` (ranks of a world of `world`) through their scripts on one epoll set.
fn drive(addr: SocketAddr, world: usize, mine: &[usize], deadline: Instant) -> Result<(), String> {
    let mut poll = Epoll::new(1024).map_err(|e| format!("epoll: {e}"))?;
    let watch = epoll::READ | epoll::WRITE | epoll::EDGE;
    let mut ranks = Vec::with_capacity(mine.len());
    for (i, &rank) in mine.iter().enumerate() {
        let r = Rank::new(addr, rank, world).map_err(|e| format!("rank {rank} connect: {e}"))?;
        // Token: index * 2, +1 for the watcher.
        poll.add(r.request.stream.as_raw_fd(), 2 * i as u64, watch)
            .and_then(|_| poll.add(r.watcher.stream.as_raw_fd(), 2 * i as u64 + 1, watch))
            .map_err(|e| format!("epoll_ctl: {e}"))?;
        ranks.push(r);
    }
    let mut left = ranks.len();
    while left > 0 {
        let wait = deadline.saturating_duration_since(Instant::now());
        if wait.is_zero() {
            let stuck = ranks.iter().find(|r| r.step != Script::Done);
            return Err(format!(
                "timed out with {left} ranks unfinished (rank {:?} at {:?})",
                stuck.map(|r| r.rank),
                stuck.map(|r| r.step)
            ));
        }
        let ready = poll
            .wait(Some(wait.min(Duration::from_millis(500))))
            .map_err(|e| format!("epoll_wait: {e}"))?;
        for event in ready {
            let (index, from_watcher) = ((event.token / 2) as usize, event.token % 2 == 1);
            let rank = &mut ranks[index];
            let was_done = rank.step == Script::Done;
            let conn = match from_watcher {
                true => &mut rank.watcher,
                false => &mut rank.request,
            };
            let id = rank.rank;
            let answers = conn
                .flush()
                .and_then(|_| conn.answers())
                .map_err(|e| format!("rank {id}: {e}"))?;
            for answer in answers {
                rank.on_answer(from_watcher, answer)?;
            }
            // New requests go out at once; what does not fit waits for EPOLLOUT.
            for conn in [&mut rank.request, &mut rank.watcher] {
                conn.flush().map_err(|e| format!("rank {id}: {e}"))?;
            }
            if !was_done && rank.step == Script::Done {
                left -= 1;
            }
        }
    }
    Ok(())
}

/// `comm-bench store-load`: every store asked for at every rank count, best of the rounds, as a
/// table with ours against torch's.
pub fn run(args: &crate::cli::StoreLoadArgs) -> Result<(), BenchError> {
    if let Some(ranks) = args.serve {
        return serve(ranks);
    }
    let servers: &[Server] = match args.store.as_str() {
        "ours" => &[Server::Ours],
        "torch" => &[Server::Torch],
        _ => &[Server::Ours, Server::Torch],
    };
    let python = match &args.python {
        Some(p) => p.display().to_string(),
        None => torch_python(),
    };
    let timeout = Duration::try_from_secs_f64(args.timeout)
        .map_err(|_| BenchError::Store(format!("--timeout {}: give seconds", args.timeout)))?;
    check_descriptors(&args.ranks)?;
    println!(
        "# {} simulated ranks' rendezvous from {} threads: 2 connections each, join, barrier, \
         rank 0's value; best of {} rounds",
        args.ranks
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        args.threads,
        args.rounds.max(1)
    );
    println!(
        "{:>6}  {:<6} {:>10} {:>12} {:>12}  ours / torch",
        "ranks", "store", "time (s)", "server CPU s", "server MiB"
    );
    for &ranks in &args.ranks {
        // Rounds alternate between the stores, so that a machine growing busier or quieter
        // weighs on both alike; each store's best round is reported. A round that fails is
        // counted and said; ours failing every round fails the run, torch's is only reported.
        let mut rounds: Vec<Rounds> = servers.iter().map(|&s| Rounds::new(s)).collect();
        for _ in 0..args.rounds.max(1) {
            for store in rounds.iter_mut() {
                store.add(measure(store.server, ranks, args.threads, &python, timeout));
            }
        }
        let ours = rounds
            .iter()
            .find(|r| r.server == Server::Ours)
            .and_then(|r| r.best.as_ref());
        for store in &rounds {
            println!("{}", store.row(ranks, ours));
        }
        if let Some(ours) = rounds.iter().find(|r| r.server == Server::Ours) {
            if ours.best.is_none() {
                let why = ours.failed.last().cloned().unwrap_or_default();
                return Err(BenchError::Store(why));
            }
        }
    }
    Ok(())
}

/// One store's rounds at one rank count: its best, and why the failed ones failed.
struct Rounds {
    server: Server,
    best: Option<Measured>,
    failed: Vec<String>,
    tried: usize,
}

impl Rounds {
    fn new(server: Server) -> Rounds {
        Rounds {
            server,
            best: None,
            failed: Vec::new(),
            tried: 0,
        }
    }

    /// Its line of the table: the best round, torch's time against `ours`, the failed rounds.
    fn row(&self, ranks: usize, ours: Option<&Measured>) -> String {
        let name = self.server.name();
        let Some(m) = &self.best else {
            let why = self.failed.last().map_or("", String::as_str);
            return format!("{ranks:>6}  {name:<6} every round failed: {why}");
        };
        let ratio = match (m.server, ours) {
            (Server::Torch, Some(o)) => format!(
                "{:.2}x the time",
                o.elapsed.as_secs_f64() / m.elapsed.as_secs_f64()
            ),
            _ => String::new(),
        };
        let failures = match self.failed.last() {
            Some(why) => format!(
                "  ({} of {} rounds failed: {why})",
                self.failed.len(),
                self.tried
            ),
            None => String::new(),
        };
        format!(
            "{ranks:>6}  {name:<6} {:>10.3} {:>12.3} {:>12.1}  {ratio}{failures}",
            m.elapsed.as_secs_f64(),
            m.server_cpu.as_secs_f64(),
            m.server_peak_kib as f64 / 1024.0
        )
    }

    fn add(&mut self, round: Result<Measured, BenchError>) {
        self.tried += 1;
        match round {
            Ok(m) if self.best.as_ref().is_none_or(|b| m.elapsed < b.elapsed) => {
                self.best = Some(m)
            }
            Ok(_) => {}
            Err(e) => self.failed.push(e.to_string()),
        }
    }
}

/// The torch environment's python (scripts/torch-env.sh's folder).
fn torch_python() -> String {
    let venv = std::env::var_os("NCCL_WORKSHOP_TORCH_VENV")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| std::path::Path::new(&h).join(".cache/nccl-workshop/torch-venv"))
        })
        .unwrap_or_default();
    venv.join("bin/python").display().to_string()
}

/// The driver holds two sockets per simulated rank (and our server, its child, two per rank):
/// more than `ulimit -n` allows is refused now, with the number, rather than failing halfway.
fn check_descriptors(ranks: &[usize]) -> Result<(), BenchError> {
    let most = ranks.iter().max().copied().unwrap_or(0);
    let need = most as u64 * 2 + 64;
    let who = format!("store-load's driver of {most} simulated ranks (2 connections each)");
    comm_core::descriptors::ensure(need, &who).map_err(|e| BenchError::Store(e.to_string()))
}
