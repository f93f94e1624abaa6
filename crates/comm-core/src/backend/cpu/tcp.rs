//! Processes as ranks: one TCP connection per pair of ranks, on one machine or across nodes.
//! Each rank listens on an ephemeral port of the address it reaches the store from, publishes
//! `host:port` in the store, connects to every lower rank and accepts every higher one.
//!
//! The handshake: the connecting rank sends a hello, `NCW2`, its rank and the world size (u32
//! little-endian each), then its run id (u16 little-endian length, UTF-8 bytes; length 0 when it
//! has none). The accepting rank answers with its own hello and a verdict: one byte (0 accepted,
//! 1 refused), then a u16 length and the reason in UTF-8. A connection from another run (when
//! both have a run id), a job of another size, or a rank that is taken is refused, and the
//! accepting rank fails with [`CommError::ForeignPeer`] at once. A connection that is not one of
//! ours (another magic, or nothing within `HELLO_GRACE`, 2 s) is dropped without a word; hellos are
//! read side by side, so one silent connection never holds up the real peers.
//!
//! After the handshake the timeout is one deadline per collective call (see
//! [`super::transport`]): each blocking read or write waits at most the time left, so bytes that
//! trickle in cannot stretch it. The first failure on any link shuts every link of the rank, so
//! no other thread of the call waits out the deadline too, and every later operation fails at
//! once with that first error.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::context::Context;
use super::transport::{size_mismatch, Deadline, Transport};
use crate::error::{CommError, Result};
use crate::store::Scoped;

/// The first bytes of a peer hello (version 2: rank, world size and run id).
const MAGIC: &[u8; 4] = b"NCW2";
/// The hello before its run id: magic, rank, world size, run id length.
const HELLO_HEAD: usize = 4 + 4 + 4 + 2;
/// Longest run id a hello may carry; a longer one is not one of ours.
const MAX_RUN_ID: usize = 1024;
/// How long a new connection to the peer port may take to say its hello before it is dropped.
const HELLO_GRACE: Duration = Duration::from_secs(2);
/// Connections whose hello is still awaited; past this many the oldest is dropped.
const MAX_PENDING: usize = 64;
/// Below this, header and payload go out in one write (one packet instead of two).
const COALESCE: usize = 64 << 10;
/// The longest a single blocking read or write waits before the deadline is checked again.
const WAKE: Duration = Duration::from_secs(1);

/// Who is on the other end of a peer connection.
#[derive(Debug, Clone, PartialEq)]
struct Hello {
    rank: usize,
    world_size: usize,
    run_id: Option<String>,
}

/// How far a hello read so far has come.
enum Parsed {
    /// This many more bytes are needed.
    Need(usize),
    /// Complete.
    Done(Hello),
    /// Not a hello of ours.
    NotOurs,
}

impl Hello {
    fn encode(&self) -> Vec<u8> {
        let run = self.run_id.as_deref().unwrap_or("").as_bytes();
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&(self.rank as u32).to_le_bytes());
        out.extend_from_slice(&(self.world_size as u32).to_le_bytes());
        out.extend_from_slice(&(run.len() as u16).to_le_bytes());
        out.extend_from_slice(run);
        out
    }

    fn parse(buf: &[u8]) -> Parsed {
        let magic = buf.len().min(MAGIC.len());
        if buf[..magic] != MAGIC[..magic] {
            return Parsed::NotOurs;
        }
        if buf.len() < HELLO_HEAD {
            return Parsed::Need(HELLO_HEAD - buf.len());
        }
        let u32_at = |i: usize| u32::from_le_bytes(buf[i..i + 4].try_into().unwrap()) as usize;
        let run_len = u16::from_le_bytes([buf[12], buf[13]]) as usize;
        if run_len > MAX_RUN_ID {
            return Parsed::NotOurs;
        }
        let total = HELLO_HEAD + run_len;
        if buf.len() < total {
            return Parsed::Need(total - buf.len());
        }
        let Ok(run) = std::str::from_utf8(&buf[HELLO_HEAD..total]) else {
            return Parsed::NotOurs;
        };
        let hello = Hello {
            rank: u32_at(4),
            world_size: u32_at(8),
            run_id: (!run.is_empty()).then(|| run.to_string()),
        };
        Parsed::Done(hello)
    }

    /// Whether `theirs`, connecting from `from`, may be a higher rank of this job, `taken`
    /// telling which ranks are connected already: the error to fail with if not.
    fn refuse(
        &self,
        theirs: &Hello,
        from: &str,
        taken: impl Fn(usize) -> bool,
    ) -> Option<CommError> {
        let runs_differ = matches!(
            (&theirs.run_id, &self.run_id),
            (Some(a), Some(b)) if a != b
        );
        let claimed = theirs.rank;
        let bad = runs_differ
            || theirs.world_size != self.world_size
            || claimed >= self.world_size
            || claimed <= self.rank
            || taken(claimed);
        bad.then(|| CommError::ForeignPeer {
            rank: self.rank,
            from: from.to_string(),
            claimed,
            their_run: theirs.run_id.clone(),
            our_run: self.run_id.clone(),
            their_world: theirs.world_size,
            our_world: self.world_size,
        })
    }
}

/// One direction of a link, with the socket timeout it has installed.
struct Half {
    stream: TcpStream,
    /// The SO_RCVTIMEO or SO_SNDTIMEO in force: a blocking call may last this long.
    installed: Duration,
}

struct Link {
    reader: Mutex<Half>,
    writer: Mutex<Half>,
    /// A handle to shut the link down while another thread blocks on it.
    control: TcpStream,
}

/// One process's TCP connections to every other rank, set up through the rendezvous store.
pub struct TcpTransport {
    /// The rank, the call's deadline and the first failure, shared with a transport that
    /// carries some pairs over shared memory: a failure shuts every link.
    ctx: Arc<Context>,
    links: Vec<Option<Link>>,
}

/// Why connecting stopped: an error, or the other half of the rendezvous failed first.
type Setup<T> = std::result::Result<T, Option<CommError>>;

impl TcpTransport {
    /// Connects every pair of ranks, exchanging addresses through the store in `scope`.
    /// `run_id` names the run (torchrun's `--rdzv-id`, Slurm's job and step, self-spawn's own):
    /// a peer of another run is refused. Ranks started by hand have none, and then run ids are
    /// not compared. Everything must be connected within `timeout` (the job's `--timeout`),
    /// which then bounds each collective call.
    pub fn connect(
        scope: &Scoped,
        rank: usize,
        world_size: usize,
        run_id: Option<&str>,
        timeout: Duration,
    ) -> Result<Self> {
        let ip = scope.store().local_ip();
        Self::connect_on(scope, rank, world_size, run_id, ip, timeout)
    }

    /// [`connect`](Self::connect), listening for peers on `ip` (an interface's address, as
    /// `GLOO_SOCKET_IFNAME` names it) instead of the address the store is reached from.
    pub fn connect_on(
        scope: &Scoped,
        rank: usize,
        world_size: usize,
        run_id: Option<&str>,
        ip: std::net::IpAddr,
        timeout: Duration,
    ) -> Result<Self> {
        let deadline = Deadline::after(timeout);
        let listener = TcpListener::bind((ip, 0))
            .map_err(|e| CommError::io(format!("rank {rank} cannot listen for peers"), e))?;
        let me = listener
            .local_addr()
            .map_err(|e| CommError::io("peer listener", e))?;
        scope.set_at("addr", rank, me.to_string().as_bytes())?;
        let ours = Hello {
            rank,
            world_size,
            run_id: run_id.map(str::to_string),
        };

        // Accepting the higher ranks goes on beside connecting to the lower ones; whichever
        // fails first stops the other.
        let failed = AtomicBool::new(false);
        let (accepted, connected) = std::thread::scope(|s| {
            let acceptor = s.spawn(|| {
                let accepted = accept_peers(&listener, &ours, deadline, timeout, &failed);
                if accepted.is_err() {
                    failed.store(true, Ordering::SeqCst);
                }
                accepted
            });
            let connected = connect_lower(scope, &ours, deadline, &failed);
            if connected.is_err() {
                failed.store(true, Ordering::SeqCst);
            }
            let accepted = acceptor.join().unwrap_or_else(|_| {
                Err(Some(CommError::Peer(
                    "the thread accepting peers panicked".into(),
                )))
            });
            (accepted, connected)
        });
        let (accepted, connected) = match (accepted, connected) {
            (Ok(a), Ok(c)) => (a, c),
            (Err(Some(e)), _) | (_, Err(Some(e))) => return Err(e),
            _ => return Err(CommError::Peer("connecting the peers stopped".into())),
        };

        let mut links: Vec<Option<Link>> = (0..world_size).map(|_| None).collect();
        let mut controls = Vec::new();
        for (peer, stream) in connected.into_iter().chain(accepted) {
            let link = Link::new(stream)?;
            controls.push(
                link.control
                    .try_clone()
                    .map_err(|e| CommError::io("peer link", e))?,
            );
            links[peer] = Some(link);
        }
        let ctx = Context::new(rank, world_size, timeout);
        // The first failure shuts every link, so no other thread of this rank waits on one.
        ctx.on_failure(move || {
            for control in &controls {
                let _ = control.shutdown(std::net::Shutdown::Both);
            }
        });
        Ok(TcpTransport { ctx, links })
    }

    /// What this rank's transports share (see [`Context`]).
    pub(crate) fn context(&self) -> Arc<Context> {
        self.ctx.clone()
    }

    fn link(&self, peer: usize) -> &Link {
        self.links[peer]
            .as_ref()
            .unwrap_or_else(|| panic!("rank {} has no link to rank {peer}", self.ctx.rank()))
    }

    /// Whether `peer`'s end of the link has closed (it exited, was killed, or failed and shut
    /// its links). For links that carry no data (pairs on shared memory) this is how a dead
    /// peer shows; it does not block.
    pub(crate) fn peer_closed(&self, peer: usize) -> bool {
        use std::os::fd::AsRawFd;
        let mut poll = libc::pollfd {
            fd: self.link(peer).control.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd, and a zero timeout: poll only reports.
        if unsafe { libc::poll(&mut poll, 1, 0) } != 1 {
            return false;
        }
        if poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            return true;
        }
        // Readable: data (not expected on an idle link) or the end of the stream.
        let mut byte = [0u8; 1];
        matches!(self.link(peer).control.peek(&mut byte), Ok(0))
    }

    fn failure(&self, peer: usize, doing: &'static str, e: std::io::Error) -> CommError {
        let e = match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => CommError::Timeout {
                what: format!("rank {peer} while rank {} was {doing} it", self.ctx.rank()),
                timeout: self.ctx.timeout(),
                detail: " (is that rank stuck, or did the ranks call different collectives?)"
                    .into(),
                missing: vec![peer],
            },
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::BrokenPipe
            | ErrorKind::ConnectionAborted
            | ErrorKind::WriteZero => CommError::PeerClosed {
                rank: self.ctx.rank(),
                peer,
                doing,
            },
            _ => CommError::io(format!("rank {} {doing} rank {peer}", self.ctx.rank()), e),
        };
        self.ctx.fail(e)
    }
}

impl Link {
    fn new(stream: TcpStream) -> Result<Link> {
        let setup = |e| CommError::io("setting up a peer socket", e);
        stream.set_nonblocking(false).map_err(setup)?;
        stream.set_nodelay(true).map_err(setup)?;
        stream.set_read_timeout(Some(WAKE)).map_err(setup)?;
        stream.set_write_timeout(Some(WAKE)).map_err(setup)?;
        let writer = stream.try_clone().map_err(setup)?;
        let control = stream.try_clone().map_err(setup)?;
        Ok(Link {
            reader: Mutex::new(Half {
                stream,
                installed: WAKE,
            }),
            writer: Mutex::new(Half {
                stream: writer,
                installed: WAKE,
            }),
            control,
        })
    }
}

impl Half {
    /// Makes the next blocking call end by `deadline` (waking at least every [`WAKE`]); an
    /// error of kind `TimedOut` once it has passed.
    fn limit(&mut self, deadline: Deadline, write: bool) -> std::io::Result<()> {
        let wait = deadline
            .wait_at_most(WAKE)
            .ok_or_else(|| std::io::Error::new(ErrorKind::TimedOut, "deadline passed"))?;
        // Too long would overshoot the deadline; much shorter would wake for nothing.
        if self.installed > wait || self.installed < wait / 2 {
            match write {
                true => self.stream.set_write_timeout(Some(wait))?,
                false => self.stream.set_read_timeout(Some(wait))?,
            }
            self.installed = wait;
        }
        Ok(())
    }

    /// Reads exactly `out.len()` bytes by `deadline`, however they trickle in.
    fn read_by(&mut self, mut out: &mut [u8], deadline: Deadline) -> std::io::Result<()> {
        while !out.is_empty() {
            self.limit(deadline, false)?;
            match self.stream.read(out) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => out = &mut out[n..],
                Err(e) if is_wait(&e) || e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes all of `data` by `deadline`.
    fn write_by(&mut self, mut data: &[u8], deadline: Deadline) -> std::io::Result<()> {
        while !data.is_empty() {
            self.limit(deadline, true)?;
            match self.stream.write(data) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => data = &data[n..],
                Err(e) if is_wait(&e) || e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// A socket timeout ran out (the deadline is checked by the caller).
fn is_wait(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Connects to every lower rank, says hello and reads its answer: the streams, by rank.
fn connect_lower(
    scope: &Scoped,
    ours: &Hello,
    deadline: Deadline,
    failed: &AtomicBool,
) -> Setup<Vec<(usize, TcpStream)>> {
    let rank = ours.rank;
    let mut streams = Vec::with_capacity(rank);
    let addrs = scope.get_at("addr", 0..rank)?;
    for (peer, addr) in addrs.into_iter().enumerate() {
        let addr = String::from_utf8_lossy(&addr).into_owned();
        let addr: SocketAddr = addr.parse().map_err(|_| {
            CommError::Peer(format!("rank {peer} published a bad address {addr:?}"))
        })?;
        let stream = connect_retrying(addr, deadline, failed).map_err(|source| {
            match failed.load(Ordering::SeqCst) {
                true => None,
                false => Some(CommError::PeerUnreachable {
                    rank,
                    peer,
                    addr: addr.to_string(),
                    source,
                }),
            }
        })?;
        let greeting = |e| CommError::io(format!("greeting rank {peer} at {addr}"), e);
        let mut half = Half {
            stream,
            installed: Duration::MAX,
        };
        half.write_by(&ours.encode(), deadline).map_err(greeting)?;
        let theirs = read_answer(&mut half, deadline, failed).map_err(|e| {
            e.map(|e| {
                CommError::io(
                    format!("waiting for rank {peer} at {addr} to answer rank {rank}'s hello"),
                    e,
                )
            })
        })?;
        let (theirs, refusal) = match theirs {
            Some(answer) => answer,
            None => {
                return Err(Some(CommError::Peer(format!(
                    "rank {rank} connected to {addr}, published as rank {peer}'s, \
                     and something else answered: a program that is not a rank of this job \
                     took that port (a stale address?)"
                ))))
            }
        };
        if let Some(reason) = refusal {
            return Err(Some(CommError::Peer(format!(
                "rank {peer} at {addr} refused rank {rank}'s connection: {reason}"
            ))));
        }
        let runs_differ = matches!(
            (&theirs.run_id, &ours.run_id),
            (Some(a), Some(b)) if a != b
        );
        if runs_differ || theirs.world_size != ours.world_size || theirs.rank != peer {
            return Err(Some(CommError::ForeignPeer {
                rank,
                from: addr.to_string(),
                claimed: theirs.rank,
                their_run: theirs.run_id,
                our_run: ours.run_id.clone(),
                their_world: theirs.world_size,
                our_world: ours.world_size,
            }));
        }
        streams.push((peer, half.stream));
    }
    Ok(streams)
}

/// Reads the accepting rank's answer: its hello and, if it refused, why. `Ok(None)` when the
/// answer is not one of ours; `Err(None)` when the other half of the rendezvous failed.
#[allow(clippy::type_complexity)]
fn read_answer(
    half: &mut Half,
    deadline: Deadline,
    failed: &AtomicBool,
) -> std::result::Result<Option<(Hello, Option<String>)>, Option<std::io::Error>> {
    // Short waits, so a failure of the acceptor is noticed.
    let step =
        |half: &mut Half, out: &mut [u8]| -> std::result::Result<(), Option<std::io::Error>> {
            let mut filled = 0;
            while filled < out.len() {
                if failed.load(Ordering::SeqCst) {
                    return Err(None);
                }
                let wait = deadline
                    .wait_at_most(Duration::from_millis(100))
                    .ok_or_else(|| {
                        Some(std::io::Error::new(
                            ErrorKind::TimedOut,
                            "no answer in time",
                        ))
                    })?;
                half.stream.set_read_timeout(Some(wait)).map_err(Some)?;
                match half.stream.read(&mut out[filled..]) {
                    Ok(0) => return Err(Some(ErrorKind::UnexpectedEof.into())),
                    Ok(n) => filled += n,
                    Err(e) if is_wait(&e) || e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(Some(e)),
                }
            }
            Ok(())
        };
    let mut buf = Vec::new();
    let hello = loop {
        match Hello::parse(&buf) {
            Parsed::NotOurs => return Ok(None),
            Parsed::Done(hello) => break hello,
            Parsed::Need(n) => {
                let start = buf.len();
                buf.resize(start + n, 0);
                step(half, &mut buf[start..])?;
            }
        }
    };
    let mut verdict = [0u8; 3];
    step(half, &mut verdict)?;
    let refusal = match verdict[0] {
        0 => None,
        _ => {
            let mut reason = vec![0u8; u16::from_le_bytes([verdict[1], verdict[2]]) as usize];
            step(half, &mut reason)?;
            Some(String::from_utf8_lossy(&reason).into_owned())
        }
    };
    Ok(Some((hello, refusal)))
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

    /// Answers with our hello and the verdict (best effort: a refused peer may be gone).
    fn answer(&mut self, ours: &Hello, refusal: Option<&str>) -> std::io::Result<()> {
        let mut answer = ours.encode();
        match refusal {
            None => answer.extend_from_slice(&[0, 0, 0]),
            Some(reason) => {
                let reason = &reason.as_bytes()[..reason.len().min(u16::MAX as usize)];
                answer.push(1);
                answer.extend_from_slice(&(reason.len() as u16).to_le_bytes());
                answer.extend_from_slice(reason);
            }
        }
        self.stream.set_nonblocking(false)?;
        self.stream
            .set_write_timeout(Some(Duration::from_secs(1)))?;
        self.stream.write_all(&answer)
    }
}

/// Moves every connection waiting in the listener's backlog to `pending` (the oldest dropped
/// past [`MAX_PENDING`]); whether there was any.
fn take_new_connections(listener: &TcpListener, pending: &mut Vec<Pending>) -> bool {
    let mut took = false;
    // Until nobody else waits; an error (the connection went away before it was accepted, or the
    // process is out of descriptors while strangers hold them until their grace ends) leaves
    // real peers in the backlog, and the deadline bounds the wait.
    while let Ok((stream, from)) = listener.accept() {
        took = true;
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        if pending.len() >= MAX_PENDING {
            pending.remove(0);
        }
        pending.push(Pending {
            stream,
            from,
            since: Instant::now(),
            buf: Vec::new(),
        });
    }
    took
}

/// The timeout of a rank whose higher ranks did not all connect, naming those that did not.
fn never_connected(rank: usize, accepted: &[Option<TcpStream>], timeout: Duration) -> CommError {
    let waiting: Vec<usize> = (rank + 1..accepted.len())
        .filter(|&p| accepted[p].is_none())
        .collect();
    CommError::Timeout {
        what: format!(
            "{} {} to connect to rank {rank}",
            if waiting.len() == 1 { "rank" } else { "ranks" },
            crate::error::rank_list(waiting.iter().copied())
        ),
        timeout,
        detail: String::new(),
        missing: waiting,
    }
}

/// Accepts every higher rank, reading hellos side by side: the streams, by rank.
fn accept_peers(
    listener: &TcpListener,
    ours: &Hello,
    deadline: Deadline,
    timeout: Duration,
    failed: &AtomicBool,
) -> Setup<Vec<(usize, TcpStream)>> {
    let (rank, world_size) = (ours.rank, ours.world_size);
    listener
        .set_nonblocking(true)
        .map_err(|e| CommError::io("peer listener", e))?;
    let mut accepted: Vec<Option<TcpStream>> = (0..world_size).map(|_| None).collect();
    let mut pending: Vec<Pending> = Vec::new();
    let mut missing = world_size - rank - 1;
    while missing > 0 {
        if failed.load(Ordering::SeqCst) {
            return Err(None);
        }
        let mut busy = take_new_connections(listener, &mut pending);
        let mut i = 0;
        while i < pending.len() {
            match pending[i].poll() {
                Progress::Waiting if pending[i].since.elapsed() < HELLO_GRACE => i += 1,
                // Silent for too long, or not ours: dropped without a word.
                Progress::Waiting | Progress::Drop => drop(pending.swap_remove(i)),
                Progress::Hello(theirs) => {
                    busy = true;
                    let mut peer = pending.swap_remove(i);
                    let from = peer.from.to_string();
                    if let Some(refusal) = ours.refuse(&theirs, &from, |r| accepted[r].is_some()) {
                        let _ = peer.answer(ours, Some(&refusal.to_string()));
                        return Err(Some(refusal));
                    }
                    // A peer that cannot take our answer is gone already: not one to wait for.
                    if peer.answer(ours, None).is_ok() {
                        accepted[theirs.rank] = Some(peer.stream);
                        missing -= 1;
                    }
                }
            }
        }
        if missing > 0 && deadline.passed() {
            return Err(Some(never_connected(rank, &accepted, timeout)));
        }
        if !busy {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(accepted
        .into_iter()
        .enumerate()
        .filter_map(|(peer, stream)| stream.map(|s| (peer, s)))
        .collect())
}

/// Connects to `addr` by `deadline`, retrying while the peer is not listening yet.
fn connect_retrying(
    addr: SocketAddr,
    deadline: Deadline,
    failed: &AtomicBool,
) -> std::io::Result<TcpStream> {
    loop {
        if failed.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("the rendezvous failed elsewhere"));
        }
        let Some(wait) = deadline.wait_at_most(Duration::from_secs(5)) else {
            return Err(std::io::Error::new(
                ErrorKind::TimedOut,
                "no listener answered",
            ));
        };
        match TcpStream::connect_timeout(&addr, wait) {
            // With no listener left on a local ephemeral port, the kernel can connect a socket
            // to itself; that is not the peer.
            Ok(s) if s.local_addr().ok() == Some(addr) => {}
            Ok(s) => return Ok(s),
            Err(e) if deadline.passed() => return Err(e),
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.ctx.rank()
    }

    fn world_size(&self) -> usize {
        self.ctx.world_size()
    }

    fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        let deadline = self.ctx.deadline();
        self.ctx.check()?;
        let mut half = self.link(peer).writer.lock().unwrap();
        let header = (data.len() as u64).to_le_bytes();
        let written = if data.len() <= COALESCE {
            let mut message = Vec::with_capacity(8 + data.len());
            message.extend_from_slice(&header);
            message.extend_from_slice(data);
            half.write_by(&message, deadline)
        } else {
            half.write_by(&header, deadline)
                .and_then(|_| half.write_by(data, deadline))
        };
        written.map_err(|e| self.failure(peer, "sending to", e))
    }

    fn recv(&self, peer: usize, out: &mut [u8]) -> Result<()> {
        let deadline = self.ctx.deadline();
        self.ctx.check()?;
        let mut half = self.link(peer).reader.lock().unwrap();
        let mut header = [0u8; 8];
        half.read_by(&mut header, deadline)
            .map_err(|e| self.failure(peer, "receiving from", e))?;
        let len = u64::from_le_bytes(header) as usize;
        if len != out.len() {
            // The rest of that message is still on the wire: the link is out of step for good.
            let e = size_mismatch(self.ctx.rank(), peer, len, out.len());
            return Err(self.ctx.fail(e));
        }
        half.read_by(out, deadline)
            .map_err(|e| self.failure(peer, "receiving from", e))
    }

    fn begin_call(&self) -> bool {
        self.ctx.begin_call()
    }

    fn end_call(&self) {
        self.ctx.end_call()
    }

    fn name(&self) -> &'static str {
        match self.ctx.world_size() {
            1 => "none",
            _ => "tcp",
        }
    }
}
