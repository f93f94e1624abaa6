//! The store's server side: rank 0 binds MASTER_PORT and answers every rank's requests in c10d's
//! TCPStore protocol (see `wire.rs`), from one thread that polls every connection, as PyTorch's
//! libuv server does. The poll loop only moves bytes: it accepts connections, holds them to the
//! protocol's handshake, decodes their requests and hands each to the key-value table
//! (`table.rs`, which keeps the values and the waits), and sends back what the table answers.
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

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::membership;
use super::table::{Bounds, ConnId, Refused, Table};
use super::wire::{self, Answer, Command, Malformed, MAX_VALUE_BYTES};
use crate::error::{CommError, Result};

/// The longest the server stops accepting after a failed accept (out of file descriptors).
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
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
        }
    }
}

/// What other threads may ask of the running server.
#[derive(Default)]
struct Stats {
    open_connections: usize,
    /// The other end of each open connection.
    peers: Vec<SocketAddr>,
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
        let mut server = Server {
            listener,
            woken,
            addr,
            limits,
            shared: shared.clone(),
            table,
            connections: HashMap::new(),
            next_id: 0,
            accept_paused_until: None,
            accept_backoff: Duration::ZERO,
            log: LogBudget::default(),
        };
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
        let others = |s: &Stats| s.peers.iter().any(|p| !own.contains(p));
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
            .wait_timeout_while(stats, timeout, |s| s.open_connections > open)
            .unwrap();
        stats.open_connections <= open
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

/// One client connection.
struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    /// Bytes received and not yet decoded.
    input: Vec<u8>,
    /// Answers not yet sent.
    output: Vec<u8>,
    /// Until it validates: when it is dropped for silence.
    hello_deadline: Option<Instant>,
}

/// Why the server closes a connection.
enum Close {
    /// It went away, or its socket failed.
    Gone,
    /// It broke the protocol or a bound: said on stderr.
    Refused(String),
}

/// Rate-limits the server's lines about refused requests.
#[derive(Default)]
struct LogBudget {
    second: Option<Instant>,
    lines: u32,
}

/// The server's state, owned by its one thread.
struct Server {
    listener: TcpListener,
    woken: UnixStream,
    addr: SocketAddr,
    limits: StoreLimits,
    shared: Arc<Shared>,
    /// The keys, values and waits.
    table: Table,
    connections: HashMap<ConnId, Connection>,
    next_id: ConnId,
    accept_paused_until: Option<Instant>,
    accept_backoff: Duration,
    log: LogBudget,
}

impl Server {
    fn run(&mut self) {
        loop {
            let ids: Vec<ConnId> = self.connections.keys().copied().collect();
            let mut fds = vec![
                poll_fd(self.woken.as_raw_fd(), libc::POLLIN),
                poll_fd(self.listener.as_raw_fd(), self.accept_events()),
            ];
            fds.extend(ids.iter().map(|id| {
                let conn = &self.connections[id];
                let mut events = 0;
                if conn.output.len() < OUTPUT_BACKLOG {
                    events |= libc::POLLIN;
                }
                if !conn.output.is_empty() {
                    events |= libc::POLLOUT;
                }
                poll_fd(conn.stream.as_raw_fd(), events)
            }));
            let timeout = self.poll_timeout();
            // SAFETY: `fds` is a live, exclusively borrowed array of `fds.len()` pollfds.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if ready < 0 && std::io::Error::last_os_error().kind() != ErrorKind::Interrupted {
                return;
            }
            if fds[0].revents != 0 {
                return; // StoreServer was dropped.
            }
            if fds[1].revents != 0 {
                self.accept();
            }
            for (id, fd) in ids.iter().zip(&fds[2..]) {
                if fd.revents != 0 {
                    if let Err(close) = self.service(*id, fd.revents) {
                        self.close(*id, close);
                    }
                }
            }
            self.drop_silent();
            self.publish_stats();
        }
    }

    /// Whether to poll the listener: not while backing off from a failed accept.
    fn accept_events(&mut self) -> libc::c_short {
        match self.accept_paused_until {
            Some(until) if Instant::now() < until => 0,
            _ => {
                self.accept_paused_until = None;
                libc::POLLIN
            }
        }
    }

    /// Milliseconds until the next deadline (a silent connection, the end of a back-off).
    fn poll_timeout(&self) -> libc::c_int {
        let next = self
            .connections
            .values()
            .filter_map(|c| c.hello_deadline)
            .chain(self.accept_paused_until)
            .min();
        match next {
            None => -1,
            Some(at) => at
                .saturating_duration_since(Instant::now())
                .as_millis()
                .clamp(1, 60_000) as libc::c_int,
        }
    }

    fn accept(&mut self) {
        loop {
            let (stream, peer) = match self.listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    // EMFILE/ENFILE (out of file descriptors) leaves the connection queued, so
                    // an immediate retry fails again: stop polling the listener for a while.
                    self.accept_backoff = (self.accept_backoff * 2)
                        .max(Duration::from_millis(1))
                        .min(MAX_ACCEPT_BACKOFF);
                    self.accept_paused_until = Some(Instant::now() + self.accept_backoff);
                    return;
                }
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
            self.next_id += 1;
            self.connections.insert(
                id,
                Connection {
                    stream,
                    peer,
                    input: Vec::new(),
                    output: Vec::new(),
                    hello_deadline: Some(Instant::now() + self.limits.hello_timeout),
                },
            );
        }
    }

    /// Reads, answers and writes what one connection's poll result allows.
    fn service(&mut self, id: ConnId, revents: libc::c_short) -> std::result::Result<(), Close> {
        if revents & libc::POLLIN != 0 || revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            self.receive(id)?;
            self.answer_all(id)?;
        }
        self.flush(id)
    }

    /// Appends what has arrived to the connection's input.
    fn receive(&mut self, id: ConnId) -> std::result::Result<(), Close> {
        let conn = self.connections.get_mut(&id).ok_or(Close::Gone)?;
        let mut chunk = [0u8; 64 << 10];
        match (&conn.stream).read(&mut chunk) {
            Ok(0) => Err(Close::Gone),
            Ok(n) => {
                conn.input.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(()),
            Err(_) => Err(Close::Gone),
        }
    }

    /// Decodes and answers every whole request in the connection's input.
    fn answer_all(&mut self, id: ConnId) -> std::result::Result<(), Close> {
        let mut used = 0;
        let result = loop {
            let conn = self.connections.get_mut(&id).ok_or(Close::Gone)?;
            if conn.output.len() >= OUTPUT_BACKLOG {
                break Ok(());
            }
            let input = &conn.input[used..];
            // Before it validates, a connection may send nothing else: no partial request of
            // some other kind is ever buffered for it.
            if conn.hello_deadline.is_some() && input.first().is_some_and(|&c| c != 0) {
                break Err(Close::Refused(
                    "it did not start with TCPStore's VALIDATE (is it a TCPStore client?)".into(),
                ));
            }
            match wire::decode(input, self.limits.max_value_bytes) {
                Ok(None) => break Ok(()),
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

    /// Sends what it can of the connection's answers.
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
                Err(_) => return Err(Close::Gone),
            }
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
            conn.hello_deadline = None;
        }
        Ok(())
    }

    /// Tells every connection whose WAIT the table completed that it may stop waiting.
    fn answer_woken(&mut self) {
        for id in self.table.take_woken() {
            if let Some(conn) = self.connections.get_mut(&id) {
                Answer::StopWaiting.encode_into(&mut conn.output);
                let _ = self.flush(id);
            }
        }
    }

    fn close(&mut self, id: ConnId, why: Close) {
        self.table.forget(id);
        if let Some(conn) = self.connections.remove(&id) {
            match why {
                Close::Refused(reason) => {
                    let peer = conn.peer;
                    self.say(format_args!("closed the connection from {peer}: {reason}"));
                }
                // A rank's connection closed by the other end: news if the rank did not say it
                // was leaving (see `membership.rs`).
                Close::Gone => {
                    if let Some((abort, why)) = membership::vanished(self.table.values(), conn.peer)
                    {
                        let _ = self.table.set(abort, why);
                        self.answer_woken();
                    }
                }
            }
        }
    }

    /// Drops connections that did not validate in time.
    fn drop_silent(&mut self) {
        let now = Instant::now();
        let silent: Vec<ConnId> = self
            .connections
            .iter()
            .filter(|(_, c)| c.hello_deadline.is_some_and(|d| d <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in silent {
            self.close(id, Close::Gone);
        }
    }

    fn publish_stats(&self) {
        let mut stats = self.shared.stats.lock().unwrap();
        let before = stats.open_connections;
        stats.open_connections = self.connections.len();
        stats.peers = self.connections.values().map(|c| c.peer).collect();
        stats.stored_bytes = self.table.stored_bytes();
        stats.awaited_keys = self.table.awaited_keys();
        if stats.open_connections < before {
            self.shared.changed.notify_all();
        }
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

fn refusal(malformed: &Malformed) -> String {
    format!("malformed request ({malformed})")
}

fn poll_fd(fd: std::os::fd::RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}
