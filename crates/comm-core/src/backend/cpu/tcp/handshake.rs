//! Opening a TCP link (gloo's listener and connect), when its pair first talks: every rank
//! listens on an ephemeral port and publishes `host:port` in the store as its transport is made;
//! a rank that needs a link to a peer dials the peer's address ([`dial`]), and each rank's
//! acceptor thread ([`Acceptor`]) takes the dials of its peers, whatever the rank itself is
//! doing. A hello each way (`hello.rs`) says who is on each end; `peers.rs` decides which dial
//! is the link when both sides dial at once. A link that carries shared memory's agreement too
//! runs it right after the hellos ([`PairSetup`]).
//!
//! A connection from another run (when both have a run id), a job of another size, or a second
//! process with a rank that is linked already is refused, and the accepting rank fails with
//! [`CommError::ForeignPeer`]. A connection that is not one of ours (another magic, or nothing
//! within `HELLO_GRACE`, 2 s) is dropped without a word; hellos are read side by side, so one
//! silent connection never holds up the real peers.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::hello::{Hello, Parsed, Verdict, VERDICT_HEAD};
use super::link::Link;
use super::peers::{Answer, Peers};
use crate::backend::cpu::context::Context;
use crate::deadline::Deadline;
use crate::epoll::{self, Epoll};
use crate::error::{CommError, Result};
use crate::heartbeat::{went_silent, Heartbeat};

/// How long a new connection to the peer port may take to say its hello before it is dropped.
const HELLO_GRACE: Duration = Duration::from_secs(2);
/// Connections whose hello is still awaited; past this many the oldest is dropped.
const MAX_PENDING: usize = 64;

/// What else two ranks agree on over their new link before it carries messages: shared
/// memory, where both run on one host (`shm/pairing.rs`). Both sides run it, the dialler from
/// the thread that needed the link and the other from its acceptor, each writing before it
/// reads, so neither waits for the other rank's own code to come to this pair.
pub(crate) trait PairSetup: Send + Sync {
    /// Agrees with `peer` over `stream` by `deadline`.
    fn agree(&self, peer: usize, stream: &mut TcpStream, deadline: Deadline) -> Result<()>;
}

/// What every link of a rank is opened with.
pub(super) struct Opening {
    /// This rank's hello.
    pub(super) ours: Hello,
    /// Every rank's published peer address, by rank, once all are read (links are dialled only
    /// after that; the acceptor takes dials before).
    pub(super) addrs: OnceLock<Vec<SocketAddr>>,
    /// How each link is probed once open.
    pub(super) beat: Heartbeat,
    /// The job's `--timeout`, for what the acceptor waits for.
    pub(super) timeout: Duration,
    /// What else a pair agrees on, once the transport built on these links says
    /// ([`Opening::seal`]): a peer may dial before this rank's shared memory is wired.
    setup: Mutex<Option<Option<Arc<dyn PairSetup>>>>,
    sealed: Condvar,
}

impl Opening {
    pub(super) fn new(ours: Hello, beat: Heartbeat, timeout: Duration) -> Opening {
        Opening {
            ours,
            addrs: OnceLock::new(),
            beat,
            timeout,
            setup: Mutex::new(None),
            sealed: Condvar::new(),
        }
    }

    /// Says what else each pair agrees on (`None`: nothing); the first word stands.
    pub(super) fn seal(&self, setup: Option<Arc<dyn PairSetup>>) {
        let mut sealed = self.setup.lock().unwrap();
        if sealed.is_none() {
            *sealed = Some(setup);
            self.sealed.notify_all();
        }
    }

    /// Probes `stream` and runs the pair's setup with `peer` on it, once sealed.
    fn finish(&self, peer: usize, stream: &mut TcpStream, deadline: Deadline) -> Result<()> {
        let setting_up = |e| CommError::io(format!("setting up the link to rank {peer}"), e);
        stream.set_nonblocking(false).map_err(setting_up)?;
        self.beat.apply(stream).map_err(setting_up)?;
        let mut sealed = self.setup.lock().unwrap();
        while sealed.is_none() {
            let Some(wait) = deadline.wait_at_most(Duration::from_millis(100)) else {
                return Err(CommError::Peer(format!(
                    "rank {} never finished wiring its transport for rank {peer}'s link",
                    self.ours.rank
                )));
            };
            sealed = self.sealed.wait_timeout(sealed, wait).unwrap().0;
        }
        let setup = sealed.clone().flatten();
        drop(sealed);
        match setup {
            Some(setup) => setup.agree(peer, stream, deadline),
            None => Ok(()),
        }
    }
}

/// How a dial ended.
pub(super) enum Dialed {
    /// The peer accepted: the link's stream, and the peer's hello.
    Link(TcpStream, Hello),
    /// The peer dialled too and its dial is the link: wait for it.
    Tie,
}

/// Dials `peer` at its published address by `deadline`, says this rank's hello and reads the
/// verdict; once accepted, runs the pair's setup.
pub(super) fn dial(open: &Opening, peer: usize, deadline: Deadline) -> Result<Dialed> {
    let rank = open.ours.rank;
    let addr = open.addrs.get().expect("addresses read before any dial")[peer];
    let mut stream = connect_retrying(addr, deadline, open.beat).map_err(|e| match e {
        Unanswered::Closed => CommError::PeerClosed {
            rank,
            peer,
            doing: "connecting to",
        },
        Unanswered::Silent(silence) => CommError::PeerSilent {
            rank,
            peer,
            host: addr.ip().to_string(),
            doing: "connecting to",
            silence,
            phase: crate::phase::now(),
        },
        Unanswered::Failed(source) => CommError::PeerUnreachable {
            rank,
            peer,
            addr: addr.to_string(),
            source,
        },
    })?;
    let greeting = |e| CommError::io(format!("greeting rank {peer} at {addr}"), e);
    send_hello(&mut stream, &open.ours.encode(), deadline).map_err(greeting)?;
    let answer = read_answer(&mut stream, deadline).map_err(|e| match e.kind() {
        // A peer that is stopped (SIGSTOP) or stuck: its kernel took the connection, and
        // nothing more comes.
        _ if waited(&e) => CommError::Timeout {
            what: format!("rank {peer} to answer rank {rank}'s hello at {addr}"),
            timeout: open.timeout,
            detail: " (is that rank stuck?)".into(),
            missing: vec![peer],
        },
        _ => CommError::io(
            format!("waiting for rank {peer} at {addr} to answer rank {rank}'s hello"),
            e,
        ),
    })?;
    let Some((theirs, verdict)) = answer else {
        return Err(CommError::Peer(format!(
            "rank {rank} connected to {addr}, published as rank {peer}'s, and something else \
             answered: a program that is not a rank of this job took that port (a stale address?)"
        )));
    };
    // The peer's reason first: it says what this rank got wrong in its eyes.
    if let Verdict::Refused(reason) = &verdict {
        return Err(CommError::Peer(format!(
            "rank {peer} at {addr} refused rank {rank}'s connection: {reason}"
        )));
    }
    if let Some(e) = open.ours.mismatch(&theirs, peer, &addr.to_string()) {
        return Err(e);
    }
    match verdict {
        Verdict::Refused(_) => unreachable!("answered above"),
        Verdict::Tie => Ok(Dialed::Tie),
        Verdict::Accepted => {
            open.finish(peer, &mut stream, deadline)?;
            Ok(Dialed::Link(stream, theirs))
        }
    }
}

/// Why a peer's address gave no connection.
enum Unanswered {
    /// Refused: nothing listens there any more, so the peer has exited or dropped its links.
    Closed,
    /// No answer at all for the heartbeat's whole bound: its node is down or cut off.
    Silent(Duration),
    /// Anything else, until the deadline.
    Failed(std::io::Error),
}

/// Connects to `addr` by `deadline`, retrying while its backlog is full; a peer that does not
/// answer for `beat`'s bound is silent.
fn connect_retrying(
    addr: SocketAddr,
    deadline: Deadline,
    beat: Heartbeat,
) -> std::result::Result<TcpStream, Unanswered> {
    let started = Instant::now();
    loop {
        let Some(wait) = deadline.wait_at_most(beat.interval) else {
            return Err(Unanswered::Failed(ErrorKind::TimedOut.into()));
        };
        match TcpStream::connect_timeout(&addr, wait) {
            // With no listener left on a local ephemeral port, the kernel can connect a socket
            // to itself; that is not the peer.
            Ok(s) if s.local_addr().ok() == Some(addr) => return Err(Unanswered::Closed),
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => return Err(Unanswered::Closed),
            Err(_) if started.elapsed() >= beat.silence() => {
                return Err(Unanswered::Silent(beat.silence()))
            }
            Err(e) if deadline.passed() => return Err(Unanswered::Failed(e)),
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes `hello` on a fresh connection by `deadline` (its socket buffer is empty: the write
/// does not wait unless the peer's machine is stuck).
fn send_hello(stream: &mut TcpStream, hello: &[u8], deadline: Deadline) -> std::io::Result<()> {
    let wait = deadline
        .wait_at_most(Duration::from_secs(1))
        .ok_or_else(|| std::io::Error::new(ErrorKind::TimedOut, "deadline passed"))?;
    stream.set_write_timeout(Some(wait))?;
    stream.write_all(hello)
}

/// Reads exactly `out.len()` bytes by `deadline`.
fn read_by(stream: &mut TcpStream, out: &mut [u8], deadline: Deadline) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < out.len() {
        let wait = deadline
            .wait_at_most(Duration::from_secs(1))
            .ok_or_else(|| std::io::Error::new(ErrorKind::TimedOut, "no answer in time"))?;
        stream.set_read_timeout(Some(wait))?;
        match stream.read(&mut out[filled..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if waited(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads the accepting rank's answer: its hello and its verdict. `Ok(None)` when the answer is
/// not one of ours.
fn read_answer(
    stream: &mut TcpStream,
    deadline: Deadline,
) -> std::io::Result<Option<(Hello, Verdict)>> {
    let mut buf = Vec::new();
    let hello = loop {
        match Hello::parse(&buf) {
            Parsed::NotOurs => return Ok(None),
            Parsed::Done(hello) => break hello,
            Parsed::Need(n) => {
                let start = buf.len();
                buf.resize(start + n, 0);
                read_by(stream, &mut buf[start..], deadline)?;
            }
        }
    };
    let mut head = [0u8; VERDICT_HEAD];
    read_by(stream, &mut head, deadline)?;
    let mut reason = vec![0u8; u16::from_le_bytes([head[1], head[2]]) as usize];
    read_by(stream, &mut reason, deadline)?;
    let reason = String::from_utf8_lossy(&reason).into_owned();
    Ok(Hello::verdict(head[0], reason).map(|verdict| (hello, verdict)))
}

/// A read that ended for a timeout or a signal: try again (the deadline is checked by the
/// caller). A silent peer's `ETIMEDOUT` is no such wait.
fn waited(e: &std::io::Error) -> bool {
    !went_silent(e)
        && matches!(
            e.kind(),
            ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
        )
}

/// A connection to the peer port whose hello is still being read.
struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    since: Instant,
    buf: Vec<u8>,
}

/// What reading a pending connection gave.
enum Progress {
    Waiting,
    Hello(Hello),
    Drop,
}

impl Pending {
    /// Reads what has arrived, never blocking.
    fn poll(&mut self) -> Progress {
        loop {
            let need = match Hello::parse(&self.buf) {
                Parsed::NotOurs => return Progress::Drop,
                Parsed::Done(hello) => return Progress::Hello(hello),
                Parsed::Need(n) => n,
            };
            let start = self.buf.len();
            self.buf.resize(start + need, 0);
            match self.stream.read(&mut self.buf[start..]) {
                Ok(0) => return Progress::Drop,
                Ok(n) => self.buf.truncate(start + n),
                Err(e) => {
                    self.buf.truncate(start);
                    return match e.kind() {
                        ErrorKind::WouldBlock | ErrorKind::Interrupted => Progress::Waiting,
                        _ => Progress::Drop,
                    };
                }
            }
        }
    }

    /// Answers with our hello and `verdict` (best effort: a refused peer may be gone).
    fn answer(&mut self, ours: &Hello, verdict: &Verdict) -> std::io::Result<()> {
        self.stream.set_nonblocking(false)?;
        self.stream
            .set_write_timeout(Some(Duration::from_secs(1)))?;
        self.stream.write_all(&ours.answer(verdict))
    }
}

/// The epoll tokens of the acceptor's wake-up pipe and listener; pending connections follow.
const STOP_TOKEN: u64 = 0;
const LISTENER_TOKEN: u64 = 1;

/// A rank's acceptor: a thread that takes its peers' dials for as long as the transport lives,
/// sleeping in epoll while nobody dials. Dropping it stops the thread.
pub(super) struct Acceptor {
    /// Writing to it (or dropping it) wakes the thread to stop.
    stop: UnixStream,
    thread: Option<JoinHandle<()>>,
}

/// What the acceptor thread works with.
pub(super) struct Accepting {
    pub(super) listener: TcpListener,
    pub(super) open: Arc<Opening>,
    pub(super) peers: Arc<Peers>,
    pub(super) ctx: Arc<Context>,
}

impl Acceptor {
    /// Starts taking dials on `with.listener`.
    pub(super) fn start(with: Accepting) -> Result<Acceptor> {
        let acceptor = |e| CommError::io("starting the thread that accepts peers", e);
        let (stop, stopped) = UnixStream::pair().map_err(acceptor)?;
        with.listener.set_nonblocking(true).map_err(acceptor)?;
        let mut poll = Epoll::new(64).map_err(acceptor)?;
        poll.add(stopped.as_raw_fd(), STOP_TOKEN, epoll::READ)
            .and_then(|_| poll.add(with.listener.as_raw_fd(), LISTENER_TOKEN, epoll::READ))
            .map_err(acceptor)?;
        let thread = std::thread::Builder::new()
            .name("peer-acceptor".into())
            .spawn(move || {
                let _stopped = stopped;
                accept_until_stopped(&with, &mut poll);
            })
            .map_err(acceptor)?;
        Ok(Acceptor {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        let _ = (&self.stop).write_all(b"x");
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The acceptor's loop: new connections join the epoll set, their hellos are read as they come,
/// and silent ones are dropped after [`HELLO_GRACE`].
fn accept_until_stopped(with: &Accepting, poll: &mut Epoll) {
    let mut pending: HashMap<u64, Pending> = HashMap::new();
    let mut next = LISTENER_TOKEN + 1;
    loop {
        let oldest = pending.values().map(|p| p.since).min();
        let timeout = oldest.map(|at| (at + HELLO_GRACE).saturating_duration_since(Instant::now()));
        let Ok(ready) = poll.wait(timeout) else {
            return;
        };
        for event in ready {
            match event.token {
                STOP_TOKEN => return,
                LISTENER_TOKEN => take_new(&with.listener, poll, &mut pending, &mut next),
                token => {
                    let Some(conn) = pending.get_mut(&token) else {
                        continue;
                    };
                    match conn.poll() {
                        Progress::Waiting => {}
                        Progress::Drop => drop(pending.remove(&token)),
                        Progress::Hello(theirs) => {
                            let conn = pending.remove(&token).expect("present");
                            let _ = poll.remove(conn.stream.as_raw_fd());
                            take_dial(with, conn, theirs);
                        }
                    }
                }
            }
        }
        // Silent for too long, or not ours: dropped without a word.
        pending.retain(|_, p| p.since.elapsed() < HELLO_GRACE);
    }
}

/// Moves every connection waiting in the listener's backlog to `pending` (the oldest dropped
/// past [`MAX_PENDING`]).
fn take_new(
    listener: &TcpListener,
    poll: &Epoll,
    pending: &mut HashMap<u64, Pending>,
    next: &mut u64,
) {
    // Until nobody else waits; an error (the connection went away before it was accepted, or
    // the process is out of descriptors) leaves real peers in the backlog for the next wake.
    while let Ok((stream, from)) = listener.accept() {
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        if pending.len() >= MAX_PENDING {
            if let Some(&oldest) = pending.iter().min_by_key(|(_, p)| p.since).map(|(t, _)| t) {
                pending.remove(&oldest);
            }
        }
        if poll.add(stream.as_raw_fd(), *next, epoll::READ).is_err() {
            continue;
        }
        let conn = Pending {
            stream,
            from,
            since: Instant::now(),
            buf: Vec::new(),
        };
        pending.insert(*next, conn);
        *next += 1;
    }
}

/// Answers a peer's hello: refused (a stranger, another run or size, a rank linked already:
/// this rank then fails), a tie, or accepted, and then set up and installed as the pair's link.
fn take_dial(with: &Accepting, mut conn: Pending, theirs: Hello) {
    let (ours, me, peer) = (&with.open.ours, with.open.ours.rank, theirs.rank);
    let from = conn.from.to_string();
    // This rank fails before the refused one hears why, so it knows by then.
    if let Some(refusal) = ours.refuse(&theirs, &from) {
        let verdict = Verdict::Refused(refusal.to_string());
        with.ctx.fail(refusal);
        let _ = conn.answer(ours, &verdict);
        return;
    }
    let answer = with.peers.decide(me, peer);
    if answer == Answer::Duplicate {
        with.ctx.fail(ours.foreign(&theirs, &from));
    }
    let verdict = answer.wire(|| ours.foreign(&theirs, &from).to_string());
    let answered = conn.answer(ours, &verdict);
    match answer {
        Answer::Tie | Answer::Duplicate => {}
        // A peer that cannot take our answer is gone already: anyone may dial again.
        Answer::Accept if answered.is_err() => with.peers.give_up(peer),
        Answer::Accept => {
            let deadline = Deadline::after(with.open.timeout);
            let opened = with
                .open
                .finish(peer, &mut conn.stream, deadline)
                .and_then(|()| Link::new(conn.stream, theirs.host));
            match opened {
                Ok(link) => {
                    let link = with.peers.install(peer, link, false);
                    if with.ctx.check().is_err() {
                        link.shut();
                    }
                }
                Err(e) => {
                    with.peers.give_up(peer);
                    with.ctx.fail(e);
                }
            }
        }
    }
}
