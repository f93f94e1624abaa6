//! The store's server side: rank 0 binds MASTER_PORT and answers every rank's requests in c10d's
//! TCPStore protocol (see `wire.rs`), from one thread that waits on an epoll set of every
//! connection, as PyTorch's libuv server does: a wake-up costs what is ready, not how many ranks
//! are connected. The loop only moves bytes: it accepts connections, holds them to the
//! protocol's handshake, decodes their requests and hands each to the key-value table
//! (`table.rs`, which keeps the values and the waits), and sends back what the table answers.
//! Nothing it does per wake-up walks every connection: silent hellos wait in a queue by
//! deadline, and a closed connection knows which rank's claim it made.
//!
//! A shared node is full of other jobs using the same default ports, so the server bounds what
//! anyone can make it hold, and drops what does not speak the protocol:
//!
//! - A connection must VALIDATE with TCPStore's magic number first, within
//!   [`StoreLimits::hello_timeout`]; anything else, or silence, closes it.
//! - Open connections, keys, value size and stored bytes are bounded ([`StoreLimits`]). A request
//!   over a bound changes nothing and closes its connection (TCPStore has no error answer; its own
//!   server closes connections likewise), and the server says which bound on stderr.
//! - Out of file descriptors, it stops accepting for a while (up to 100 ms) instead of spinning.
//!
//! Who belongs to the job (run id, world size, one process per rank) is checked on top of the
//! protocol's own commands, by every rank as it joins (`membership.rs`); the server only seeds
//! the job's run id and world size. None of this is security: the store trusts its network, as
//! PyTorch's TCPStore does.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::membership::{self, Claim};
use super::table::{Bounds, ConnId, Refused, Table};
use super::wire::{self, Answer, Command, Malformed, MAX_VALUE_BYTES};
use crate::epoll::{self, Epoll};
use crate::error::{CommError, Result};
use crate::heartbeat::{went_silent, Heartbeat};

/// The longest the server stops accepting after a failed accept (out of file descriptors).
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// The most one read takes from a connection (epoll reports it again while more is there).
const READ_BYTES: usize = 64 << 10;
/// A connection whose unsent answers reach this is not read until they drain.
const OUTPUT_BACKLOG: usize = 256 << 10;
/// At most this many lines a second about refused requests, however many a stranger sends.
const LOG_LINES_PER_SECOND: u32 = 10;

/// The store's bounds. The project's own use stays far below the defaults: an NCCL Id is 128 B, a
/// peer address a few dozen, a grid row small, a barrier a few keys per rank.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreLimits {
    /// Open connections at once, validated or not (each rank holds two).
    pub max_connections: usize,
    /// Keys stored at once.
    pub max_keys: usize,
    /// Bytes of one value (at most [`MAX_VALUE_BYTES`], PyTorch's own bound).
    pub max_value_bytes: usize,
    /// Bytes of all keys and values together (plus a small per-entry overhead).
    pub max_stored_bytes: usize,
    /// How long a new connection may take to VALIDATE before it is dropped.
    pub hello_timeout: Duration,
    /// How a silent connection is found: probed when quiet, and closed once unheard for the
    /// whole bound; a rank's then ends the job as a rank gone silent.
    pub heartbeat: Heartbeat,
}

impl StoreLimits {
    /// The defaults for a job of `world_size` ranks: 4 connections per rank + 32, 100,000 keys +
    /// 64 per rank, values up to [`MAX_VALUE_BYTES`] (8 MiB), 256 MiB in all, 2 s to validate.
    pub fn for_world(world_size: usize) -> StoreLimits {
        StoreLimits {
            max_connections: world_size.saturating_mul(4).saturating_add(32),
            max_keys: world_size.saturating_mul(64).saturating_add(100_000),
            max_value_bytes: MAX_VALUE_BYTES,
            max_stored_bytes: 256 << 20,
            hello_timeout: Duration::from_secs(2),
            heartbeat: Heartbeat::default(),
        }
    }
}

/// What other threads may ask of the running server.
#[derive(Default)]
struct Stats {
    /// The other end of each open connection.
    peers: HashMap<ConnId, SocketAddr>,
    stored_bytes: usize,
    /// Keys some connection waits for.
    awaited_keys: usize,
}

struct Shared {
    stats: Mutex<Stats>,
    changed: Condvar,
}

/// A running store server; dropping it stops it and closes every connection.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// Writing to it wakes the server's poll, which then sees `stop`.
    wake: UnixStream,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The address to listen on for a job whose ranks reach rank 0 at `master_addr`: that address
/// itself when it is a loopback one (a one-host job: nobody else on the network can reach the
/// store), every interface otherwise (rank 0 cannot know by which of its addresses the others
/// reach it).
fn listen_ip(master_addr: &str) -> IpAddr {
    let loopback = (master_addr, 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .map(|a| a.ip())
        .filter(IpAddr::is_loopback);
    loopback.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// A table within `limits`, holding what the job's store holds before anyone connects (its
/// world size and run id: see `membership.rs`).
fn seeded_table(limits: &StoreLimits, world_size: usize, run_id: Option<&str>) -> Table {
    let mut table = Table::new(Bounds {
        max_keys: limits.max_keys,
        max_value_bytes: limits.max_value_bytes,
        max_stored_bytes: limits.max_stored_bytes,
    });
    for (key, value) in membership::seed(world_size, run_id) {
        // A fresh store is far below every bound.
        let _ = table.set(key, value);
    }
    table
}

impl StoreServer {
    /// Serves on 127.0.0.1 at `port` (0 picks a free one), without a run id: for tests and
    /// one-host tools. A job serves through [`StoreServer::bind_job`].
    pub fn bind(port: u16, world_size: usize) -> Result<StoreServer> {
        Self::bind_job("127.0.0.1", port, world_size, None)
    }

    /// Serves the store of a job of `world_size` ranks whose ranks connect to `master_addr:port`
    /// (0 picks a free port): on 127.0.0.1 when `master_addr` is a loopback address (or
    /// `localhost`), on every interface otherwise. The job's `run_id` (see
    /// [`crate::topology::Topology::run_id`]) and world size are stored before anyone connects,
    /// so a rank of another run, or one that disagrees on the size, is refused as it joins.
    /// Bounds are [`StoreLimits::for_world`].
    pub fn bind_job(
        master_addr: &str,
        port: u16,
        world_size: usize,
        run_id: Option<&str>,
    ) -> Result<StoreServer> {
        let limits = StoreLimits::for_world(world_size);
        Self::bind_with(master_addr, port, world_size, run_id, limits)
    }

    /// [`StoreServer::bind_job`] with other bounds (tests use small ones).
    pub fn bind_with(
        master_addr: &str,
        port: u16,
        world_size: usize,
        run_id: Option<&str>,
        limits: StoreLimits,
    ) -> Result<StoreServer> {
        let ip = listen_ip(master_addr);
        let listener = TcpListener::bind((ip, port)).map_err(|e| {
            let hint = if e.kind() == ErrorKind::AddrInUse {
                format!(
                    "; another job or a leftover process holds port {port}: pick another with --master-port or MASTER_PORT"
                )
            } else {
                String::new()
            };
            CommError::io(
                format!(
                    "rank 0 cannot serve the rendezvous store on {}{hint}",
                    SocketAddr::new(ip, port)
                ),
                e,
            )
        })?;
        // Every rank connects at once as a job starts: std listens with a backlog of 128, and
        // connections past it are dropped and retried by the client's kernel a second later.
        // Listening again raises the backlog to the system's cap (net.core.somaxconn, 4096 by
        // default), as PyTorch's TCPStore does.
        // SAFETY: `listen` on the listener's own, open socket.
        unsafe { libc::listen(listener.as_raw_fd(), libc::SOMAXCONN) };
        // Every connection it accepts inherits the heartbeat: no five calls per connection.
        let _ = limits.heartbeat.apply(&listener);
        let addr = listener
            .local_addr()
            .map_err(|e| CommError::io("store listener address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| CommError::io("store listener", e))?;
        let (wake, woken) =
            UnixStream::pair().map_err(|e| CommError::io("store server wake-up pipe", e))?;
        woken
            .set_nonblocking(true)
            .map_err(|e| CommError::io("store server wake-up pipe", e))?;
        let mut limits = limits;
        limits.max_value_bytes = limits.max_value_bytes.min(MAX_VALUE_BYTES);
        let shared = Arc::new(Shared {
            stats: Mutex::new(Stats::default()),
            changed: Condvar::new(),
        });
        let table = seeded_table(&limits, world_size, run_id);
        let parts = Parts {
            listener,
            woken,
            addr,
        };
        let mut server = Server::new(parts, limits, shared.clone(), table)?;
        let thread = std::thread::Builder::new()
            .name("store-server".into())
            .spawn(move || server.run())
            .map_err(|e| CommError::io("starting the store server thread", e))?;
        Ok(StoreServer {
            addr,
            shared,
            wake,
            thread: Some(thread),
        })
    }

    /// The port it listens on (useful when bound to port 0).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address it listens on: 127.0.0.1 or 0.0.0.0 (see [`StoreServer::bind_job`]).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Bytes held in keys and values (with a small per-entry overhead): what
    /// [`StoreLimits::max_stored_bytes`] bounds.
    pub fn stored_bytes(&self) -> usize {
        self.shared.stats.lock().unwrap().stored_bytes
    }

    /// Keys some connection waits for now (the waiter lists hold only live waits).
    #[cfg(test)]
    pub(crate) fn awaited_keys(&self) -> usize {
        self.shared.stats.lock().unwrap().awaited_keys
    }

    /// Waits until every client has disconnected, so rank 0 does not take the store away while
    /// another rank still waits for an answer. Returns false if some were still connected at the
    /// timeout.
    pub fn wait_until_idle(&self, timeout: Duration) -> bool {
        self.wait_until_at_most(0, timeout)
    }

    /// Waits until no connection is open but those from `own` (this process's own client
    /// sockets: rank 0's, whichever of them are still open); false at the timeout. Counting
    /// them instead would be wrong: a rank that stops shuts its request socket and its watcher's
    /// closes, and the others' connections would then pass for its own.
    pub fn wait_until_only(&self, own: &[SocketAddr], timeout: Duration) -> bool {
        let others = |s: &Stats| s.peers.values().any(|p| !own.contains(p));
        let stats = self.shared.stats.lock().unwrap();
        let (stats, _) = self
            .shared
            .changed
            .wait_timeout_while(stats, timeout, |s| others(s))
            .unwrap();
        !others(&stats)
    }

    /// Waits until at most `open` connections remain; false at the timeout.
    pub fn wait_until_at_most(&self, open: usize, timeout: Duration) -> bool {
        let stats = self.shared.stats.lock().unwrap();
        let (stats, _) = self
            .shared
            .changed
            .wait_timeout_while(stats, timeout, |s| s.peers.len() > open)
            .unwrap();
        stats.peers.len() <= open
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        // The server thread ends when the other end of its wake-up pipe closes or writes.
        let _ = (&self.wake).write_all(b"x");
        let _ = self.wake.shutdown(std::net::Shutdown::Both);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The epoll token of the wake-up pipe; the listener's is next, and connections' ids follow.
const WAKE_TOKEN: u64 = 0;
const LISTENER_TOKEN: u64 = 1;
const FIRST_CONNECTION: ConnId = 2;
/// Ready descriptors one wait reports at most; more wait for the next.
const EVENTS_PER_WAIT: usize = 1024;

/// One client connection.
struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    /// Bytes received and not yet decoded.
    input: Vec<u8>,
    /// Answers not yet sent.
    output: Vec<u8>,
    /// Whether it has said TCPStore's VALIDATE (until then it may say nothing else).
    validated: bool,
    /// What epoll watches it for now.
    watching: u32,
    /// The rank or node whose membership claim it made (`membership.rs`): its closing or
    /// silence may be news of it.
    claimed: Option<membership::Claim>,
}

impl Connection {
    /// What to watch it for: reading unless its unsent answers are backed up, writing while
    /// there are some.
    fn wanted(&self) -> u32 {
        let mut events = 0;
        if self.output.len() < OUTPUT_BACKLOG {
            events |= epoll::READ;
        }
        if !self.output.is_empty() {
            events |= epoll::WRITE;
        }
        events
    }
}

/// Why the server closes a connection.
enum Close {
    /// It went away, or its socket failed.
    Gone,
    /// Nothing came from it, not even an answer to the heartbeat, for the heartbeat's bound.
    Silent,
    /// It broke the protocol or a bound: said on stderr.
    Refused(String),
}

/// Rate-limits the server's lines about refused requests.
#[derive(Default)]
struct LogBudget {
    second: Option<Instant>,
    lines: u32,
}

/// The server's sockets: the listener, the end of the wake-up pipe it watches, its address.
struct Parts {
    listener: TcpListener,
    woken: UnixStream,
    addr: SocketAddr,
}

/// The server's state, owned by its one thread.
struct Server {
    listener: TcpListener,
    /// Held open while epoll watches it: readable once [`StoreServer`] drops.
    _woken: UnixStream,
    addr: SocketAddr,
    limits: StoreLimits,
    shared: Arc<Shared>,
    /// The keys, values and waits.
    table: Table,
    /// Every descriptor above; a wait costs what is ready, not how many are open.
    poll: Epoll,
    connections: HashMap<ConnId, Connection>,
    next_id: ConnId,
    /// Connections still to validate, by when they must (oldest first: all get the same time).
    hello_deadlines: VecDeque<(Instant, ConnId)>,
    accept_paused_until: Option<Instant>,
    accept_backoff: Duration,
    log: LogBudget,
    /// Where each read lands before it joins its connection's input.
    read_buffer: Box<[u8]>,
}

impl Server {
    fn new(parts: Parts, limits: StoreLimits, shared: Arc<Shared>, table: Table) -> Result<Server> {
        let Parts {
            listener,
            woken,
            addr,
        } = parts;
        let poll = Epoll::new(EVENTS_PER_WAIT)
            .and_then(|p| p.add(woken.as_raw_fd(), WAKE_TOKEN, epoll::READ).map(|_| p))
            .and_then(|p| {
                p.add(listener.as_raw_fd(), LISTENER_TOKEN, epoll::READ)
                    .map(|_| p)
            })
            .map_err(|e| CommError::io("the store server's epoll set", e))?;
        Ok(Server {
            listener,
            _woken: woken,
            addr,
            limits,
            shared,
            table,
            poll,
            connections: HashMap::new(),
            next_id: FIRST_CONNECTION,
            hello_deadlines: VecDeque::new(),
            accept_paused_until: None,
            accept_backoff: Duration::ZERO,
            log: LogBudget::default(),
            read_buffer: vec![0; READ_BYTES].into_boxed_slice(),
        })
    }

    fn run(&mut self) {
        loop {
            let timeout = self.poll_timeout();
            let Ok(ready) = self.poll.wait(timeout) else {
                return;
            };
            // New connections first: as a large job starts, every rank connects at once, and
            // a full accept queue drops connections that the clients' kernels retry only a
            // second later.
            if ready.iter().any(|e| e.token == LISTENER_TOKEN) {
                self.accept();
            }
            for event in ready {
                match event.token {
                    WAKE_TOKEN => return, // StoreServer was dropped.
                    LISTENER_TOKEN => {}
                    id => {
                        if let Err(close) = self.service(id, event) {
                            self.close(id, close);
                        }
                    }
                }
            }
            self.resume_accepting();
            self.drop_silent();
            self.publish_stats();
        }
    }

    /// Polls the listener again once a back-off from a failed accept is over.
    fn resume_accepting(&mut self) {
        if self
            .accept_paused_until
            .is_some_and(|until| Instant::now() >= until)
        {
            self.accept_paused_until = None;
            let fd = self.listener.as_raw_fd();
            let _ = self.poll.modify(fd, LISTENER_TOKEN, epoll::READ);
        }
    }

    /// How long to wait: until the next deadline (a connection's hello, the end of a
    /// back-off), or for ever.
    fn poll_timeout(&self) -> Option<Duration> {
        let next = self
            .hello_deadlines
            .front()
            .map(|&(at, _)| at)
            .into_iter()
            .chain(self.accept_paused_until)
            .min()?;
        Some(next.saturating_duration_since(Instant::now()))
    }

    fn accept(&mut self) {
        loop {
            let (stream, peer) = match self.listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return self.pause_accepting(),
            };
            self.accept_backoff = Duration::ZERO;
            if self.connections.len() >= self.limits.max_connections {
                let max = self.limits.max_connections;
                self.say(format_args!(
                    "closed a connection from {peer}: over the bound of {max} open connections"
                ));
                continue;
            }
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let _ = stream.set_nodelay(true);
            let id = self.next_id;
            if self.poll.add(stream.as_raw_fd(), id, epoll::READ).is_err() {
                continue;
            }
            self.next_id += 1;
            let deadline = Instant::now() + self.limits.hello_timeout;
            self.hello_deadlines.push_back((deadline, id));
            self.shared.stats.lock().unwrap().peers.insert(id, peer);
            let conn = Connection {
                stream,
                peer,
                input: Vec::new(),
                output: Vec::new(),
                validated: false,
                watching: epoll::READ,
                claimed: None,
            };
            self.connections.insert(id, conn);
        }
    }

    /// EMFILE/ENFILE (out of file descriptors) leaves the connection queued, so an immediate
    /// retry fails again: stop watching the listener for a while.
    fn pause_accepting(&mut self) {
        self.accept_backoff = (self.accept_backoff * 2)
            .max(Duration::from_millis(1))
            .min(MAX_ACCEPT_BACKOFF);
        self.accept_paused_until = Some(Instant::now() + self.accept_backoff);
        let _ = self
            .poll
            .modify(self.listener.as_raw_fd(), LISTENER_TOKEN, 0);
    }

    /// Reads, answers and writes what one connection's readiness allows.
    fn service(&mut self, id: ConnId, event: epoll::Ready) -> std::result::Result<(), Close> {
        if !self.connections.contains_key(&id) {
            return Ok(()); // Closed earlier in this batch.
        }
        if event.readable() {
            self.receive(id)?;
        }
        // Requests held back while answers were backed up are answered as these drain.
        while self.answer_all(id)? {
            self.flush(id)?;
            let backed_up = self
                .connections
                .get(&id)
                .is_none_or(|c| c.output.len() >= OUTPUT_BACKLOG);
            if backed_up {
                return Ok(());
            }
        }
        self.flush(id)
    }

    /// Appends what has arrived to the connection's input (one read: epoll reports the
    /// connection again while more is there).
    fn receive(&mut self, id: ConnId) -> std::result::Result<(), Close> {
        let conn = self.connections.get_mut(&id).ok_or(Close::Gone)?;
        // One buffer for every read: a fresh 64 KiB one each time was zeroed each time, and
        // that memset was the server's largest cost at a job's start.
        let chunk = &mut self.read_buffer[..];
        match (&conn.stream).read(chunk) {
            Ok(0) => Err(Close::Gone),
            Ok(n) => {
                conn.input.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(()),
            Err(e) => Err(gone(&e)),
        }
    }

    /// Decodes and answers every whole request in the connection's input: true when it
    /// stopped with requests left because the connection's answers are backed up.
    fn answer_all(&mut self, id: ConnId) -> std::result::Result<bool, Close> {
        let mut used = 0;
        let result = loop {
            let conn = self.connections.get_mut(&id).ok_or(Close::Gone)?;
            let input = &conn.input[used..];
            if conn.output.len() >= OUTPUT_BACKLOG {
                break Ok(!input.is_empty());
            }
            // Before it validates, a connection may send nothing else: no partial request of
            // some other kind is ever buffered for it.
            if !conn.validated && input.first().is_some_and(|&c| c != 0) {
                break Err(Close::Refused(
                    "it did not start with TCPStore's VALIDATE (is it a TCPStore client?)".into(),
                ));
            }
            match wire::decode(input, self.limits.max_value_bytes) {
                Ok(None) => break Ok(false),
                Ok(Some((command, len))) => {
                    used += len;
                    if let Err(close) = self.execute(id, command) {
                        break Err(close);
                    }
                }
                Err(malformed) => break Err(Close::Refused(refusal(&malformed))),
            }
        };
        if let Some(conn) = self.connections.get_mut(&id) {
            conn.input.drain(..used);
        }
        result
    }

    /// Sends what it can of the connection's answers, and watches it for what it now needs.
    fn flush(&mut self, id: ConnId) -> std::result::Result<(), Close> {
        let Some(conn) = self.connections.get_mut(&id) else {
            return Ok(());
        };
        while !conn.output.is_empty() {
            match (&conn.stream).write(&conn.output) {
                Ok(0) => return Err(Close::Gone),
                Ok(n) => {
                    conn.output.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(gone(&e)),
            }
        }
        let wanted = conn.wanted();
        if wanted != conn.watching {
            self.poll
                .modify(conn.stream.as_raw_fd(), id, wanted)
                .map_err(|_| Close::Gone)?;
            conn.watching = wanted;
        }
        Ok(())
    }

    fn reply(&mut self, id: ConnId, answer: Answer) {
        if let Some(conn) = self.connections.get_mut(&id) {
            answer.encode_into(&mut conn.output);
        }
    }

    /// Carries out one request: the handshake here, everything else by the table, whose
    /// answer goes back after those of the WAITs the request completed.
    fn execute(&mut self, id: ConnId, command: Command) -> std::result::Result<(), Close> {
        if let Command::Validate { magic } = command {
            return self.validate(id, magic);
        }
        if let Command::CompareSet { key, .. } = &command {
            if let (Some(claim), Some(conn)) =
                (membership::claimed(key), self.connections.get_mut(&id))
            {
                conn.claimed = Some(claim);
            }
        }
        let answered = self.table.execute(id, command);
        self.answer_woken();
        let answer = answered.map_err(|Refused(why)| Close::Refused(why))?;
        if let Some(answer) = answer {
            self.reply(id, answer);
        }
        Ok(())
    }

    /// VALIDATE: TCPStore's magic number lets the connection in; any other closes it.
    fn validate(&mut self, id: ConnId, magic: u32) -> std::result::Result<(), Close> {
        if magic != wire::VALIDATION_MAGIC {
            return Err(Close::Refused(format!(
                "it validated with {magic:#x}, not TCPStore's magic number"
            )));
        }
        if let Some(conn) = self.connections.get_mut(&id) {
            conn.validated = true;
        }
        Ok(())
    }

    /// Tells every connection whose WAIT the table completed that it may stop waiting.
    fn answer_woken(&mut self) {
        for id in self.table.take_woken() {
            if let Some(conn) = self.connections.get_mut(&id) {
                Answer::StopWaiting.encode_into(&mut conn.output);
                // A failed one is closed when epoll reports it (this may be inside its own
                // service).
                let _ = self.flush(id);
            }
        }
    }

    fn close(&mut self, id: ConnId, why: Close) {
        self.table.forget(id);
        let Some(conn) = self.connections.remove(&id) else {
            return;
        };
        {
            let mut stats = self.shared.stats.lock().unwrap();
            stats.peers.remove(&id);
            self.shared.changed.notify_all();
        }
        match why {
            Close::Refused(reason) => {
                let peer = conn.peer;
                self.say(format_args!("closed the connection from {peer}: {reason}"));
            }
            // A rank's connection (or a node's launcher's) closed by the other end, or silent:
            // news if the rank did not say it was leaving, or the node's ranks never joined
            // (see `membership.rs`).
            Close::Gone | Close::Silent => {
                let silent = matches!(why, Close::Silent).then(|| self.limits.heartbeat.silence());
                let values = self.table.values();
                let news = match conn.claimed {
                    Some(Claim::Rank(rank)) => {
                        membership::vanished(values, rank, conn.peer, silent)
                    }
                    Some(Claim::Node(node)) => {
                        membership::node_lost(values, node, conn.peer, silent)
                    }
                    None => None,
                };
                if let Some((abort, why)) = news {
                    let _ = self.table.set(abort, why);
                    self.answer_woken();
                }
            }
        }
    }

    /// Drops connections that did not validate in time.
    fn drop_silent(&mut self) {
        let now = Instant::now();
        while let Some(&(at, id)) = self.hello_deadlines.front() {
            if at > now {
                break;
            }
            self.hello_deadlines.pop_front();
            if self.connections.get(&id).is_some_and(|c| !c.validated) {
                self.close(id, Close::Gone);
            }
        }
    }

    fn publish_stats(&self) {
        let mut stats = self.shared.stats.lock().unwrap();
        stats.stored_bytes = self.table.stored_bytes();
        stats.awaited_keys = self.table.awaited_keys();
    }

    /// One line on stderr about a refused request, within the rate limit.
    fn say(&mut self, line: std::fmt::Arguments<'_>) {
        let now = Instant::now();
        match self.log.second {
            Some(start) if now.duration_since(start) < Duration::from_secs(1) => {}
            _ => {
                self.log.second = Some(now);
                self.log.lines = 0;
            }
        }
        self.log.lines += 1;
        if self.log.lines <= LOG_LINES_PER_SECOND {
            eprintln!("rendezvous store at {}: {line}", self.addr);
        }
    }
}

/// Why a connection whose socket failed with `e` is closed: silent if the kernel gave up on it.
fn gone(e: &std::io::Error) -> Close {
    match went_silent(e) {
        true => Close::Silent,
        false => Close::Gone,
    }
}

fn refusal(malformed: &Malformed) -> String {
    format!("malformed request ({malformed})")
}
