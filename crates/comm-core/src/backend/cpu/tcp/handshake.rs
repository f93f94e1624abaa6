//! Opening the TCP links (gloo's listener): every rank listens on an ephemeral port, publishes
//! `host:port` in the store, connects to every lower rank and accepts every higher one, both at
//! once, each link opened by a hello each way (`hello.rs`).
//!
//! A connection from another run (when both have a run id), a job of another size, or a rank
//! that is taken is refused, and the accepting rank fails with [`CommError::ForeignPeer`] at
//! once. A connection that is not one of ours (another magic, or nothing within `HELLO_GRACE`,
//! 2 s) is dropped without a word; hellos are read side by side, so one silent connection never
//! holds up the real peers.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::hello::{Hello, Parsed, VERDICT_HEAD};
use crate::deadline::Deadline;
use crate::error::{CommError, Result};
use crate::store::Scoped;

/// How long a new connection to the peer port may take to say its hello before it is dropped.
const HELLO_GRACE: Duration = Duration::from_secs(2);
/// Connections whose hello is still awaited; past this many the oldest is dropped.
const MAX_PENDING: usize = 64;

/// Why connecting stopped: an error, or the other half of the rendezvous failed first.
type Setup<T> = std::result::Result<T, Option<CommError>>;

/// A peer's connection, its hello exchanged: the peer's rank and the stream.
pub(super) type Opened = (usize, TcpStream);

/// Opens a connection to every other rank: publishes `listener`'s address in `scope` under
/// `addr/<rank>`, then accepts the higher ranks beside connecting to the lower ones, each within
/// `deadline` (`timeout` says how long that was, for the error). Whichever fails first stops
/// the other.
pub(super) fn open_all(
    scope: &Scoped,
    listener: &TcpListener,
    ours: &Hello,
    deadline: Deadline,
    timeout: Duration,
) -> Result<Vec<Opened>> {
    let me = listener
        .local_addr()
        .map_err(|e| CommError::io("peer listener", e))?;
    scope.set_at("addr", ours.rank, me.to_string().as_bytes())?;
    let failed = AtomicBool::new(false);
    let (accepted, connected) = std::thread::scope(|s| {
        let acceptor = s.spawn(|| {
            let accepted = accept_peers(listener, ours, deadline, timeout, &failed);
            if accepted.is_err() {
                failed.store(true, Ordering::SeqCst);
            }
            accepted
        });
        let connected = connect_lower(scope, ours, deadline, &failed);
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
    match (accepted, connected) {
        (Ok(a), Ok(c)) => Ok(c.into_iter().chain(a).collect()),
        (Err(Some(e)), _) | (_, Err(Some(e))) => Err(e),
        _ => Err(CommError::Peer("connecting the peers stopped".into())),
    }
}

/// Connects to every lower rank, says hello and reads its answer: the streams, by rank.
fn connect_lower(
    scope: &Scoped,
    ours: &Hello,
    deadline: Deadline,
    failed: &AtomicBool,
) -> Setup<Vec<Opened>> {
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
        streams.push((peer, greet(stream, ours, peer, addr, deadline, failed)?));
    }
    Ok(streams)
}

/// Says this rank's hello on `stream`, connected to rank `peer` at `addr`, and checks the
/// answer: the stream, once `peer` accepted it.
fn greet(
    mut stream: TcpStream,
    ours: &Hello,
    peer: usize,
    addr: SocketAddr,
    deadline: Deadline,
    failed: &AtomicBool,
) -> Setup<TcpStream> {
    let rank = ours.rank;
    let greeting = |e| CommError::io(format!("greeting rank {peer} at {addr}"), e);
    send_hello(&mut stream, &ours.encode(), deadline).map_err(greeting)?;
    let answer = read_answer(&mut stream, deadline, failed).map_err(|e| {
        e.map(|e| {
            CommError::io(
                format!("waiting for rank {peer} at {addr} to answer rank {rank}'s hello"),
                e,
            )
        })
    })?;
    let Some((theirs, refusal)) = answer else {
        return Err(Some(CommError::Peer(format!(
            "rank {rank} connected to {addr}, published as rank {peer}'s, \
             and something else answered: a program that is not a rank of this job \
             took that port (a stale address?)"
        ))));
    };
    if let Some(reason) = refusal {
        return Err(Some(CommError::Peer(format!(
            "rank {peer} at {addr} refused rank {rank}'s connection: {reason}"
        ))));
    }
    match ours.mismatch(&theirs, peer, &addr.to_string()) {
        Some(e) => Err(Some(e)),
        None => Ok(stream),
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

/// Reads the accepting rank's answer: its hello and, if it refused, why. `Ok(None)` when the
/// answer is not one of ours; `Err(None)` when the other half of the rendezvous failed.
#[allow(clippy::type_complexity)]
fn read_answer(
    stream: &mut TcpStream,
    deadline: Deadline,
    failed: &AtomicBool,
) -> std::result::Result<Option<(Hello, Option<String>)>, Option<std::io::Error>> {
    // Short waits, so a failure of the acceptor is noticed.
    let step = |stream: &mut TcpStream,
                out: &mut [u8]|
     -> std::result::Result<(), Option<std::io::Error>> {
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
            stream.set_read_timeout(Some(wait)).map_err(Some)?;
            match stream.read(&mut out[filled..]) {
                Ok(0) => return Err(Some(ErrorKind::UnexpectedEof.into())),
                Ok(n) => filled += n,
                Err(e) if waited(&e) => {}
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
                step(stream, &mut buf[start..])?;
            }
        }
    };
    let mut verdict = [0u8; VERDICT_HEAD];
    step(stream, &mut verdict)?;
    let refusal = match verdict[0] {
        0 => None,
        _ => {
            let mut reason = vec![0u8; u16::from_le_bytes([verdict[1], verdict[2]]) as usize];
            step(stream, &mut reason)?;
            Some(String::from_utf8_lossy(&reason).into_owned())
        }
    };
    Ok(Some((hello, refusal)))
}

/// A read that ended for a timeout or a signal: try again (the deadline is checked by the
/// caller).
fn waited(e: &std::io::Error) -> bool {
    matches!(
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

    /// Answers with our hello and the verdict (best effort: a refused peer may be gone).
    fn answer(&mut self, ours: &Hello, refusal: Option<&str>) -> std::io::Result<()> {
        self.stream.set_nonblocking(false)?;
        self.stream
            .set_write_timeout(Some(Duration::from_secs(1)))?;
        self.stream.write_all(&ours.answer(refusal))
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
) -> Setup<Vec<Opened>> {
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
