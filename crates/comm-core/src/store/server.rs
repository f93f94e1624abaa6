//! The store's server side: rank 0 binds MASTER_PORT and answers every rank's requests, one thread
//! per connection. A connection that sends a malformed or oversized frame is closed; the server and
//! the other connections go on.
//!
//! A shared node is full of other jobs using the same default ports, so the server checks who
//! talks to it and bounds what anyone can make it hold:
//!
//! - Every connection's first frame must be a hello naming run id, world size and rank. A hello
//!   from another run is refused (when both sides have a run id: ranks started by hand have none,
//!   and then nothing is compared), so is a rank whose earlier connection is still open. A world
//!   size other than rank 0's is refused, and from then on every wait of the job is answered with
//!   that disagreement instead of running into its timeout.
//! - A connection that has not said hello within [`StoreLimits::hello_timeout`] is dropped; it
//!   holds only its own thread, never the accept loop or other connections.
//! - Open connections, keys, value size and stored bytes are bounded ([`StoreLimits`]); a request
//!   over a bound is answered with a refusal naming it, and changes nothing.
//! - Out of file descriptors, the accept loop backs off (up to 100 ms) instead of spinning.
//!
//! None of this is security: the store trusts its network, as PyTorch's TCPStore does. Run ids
//! guard against accidents (a neighbour's job on the same port), not against attackers.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufReader, BufWriter, Read};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::frame::{
    read_frame, read_frame_within, write_frame, FrameTooLarge, Refusal, Request, Response,
};
use super::MAX_FRAME;
use crate::error::{rank_list, CommError, Result};

/// A hello is a few dozen bytes; before it, nobody may send more than this.
const MAX_HELLO_FRAME: usize = 4 << 10;
/// Bookkeeping a stored entry costs beyond its key and value, counted against the byte bound.
const ENTRY_OVERHEAD: usize = 64;
/// Connections over the bound still get their refusal from a short-lived thread, up to this many
/// at once; beyond that they are closed without a word.
const MAX_REFUSING: usize = 64;
/// The longest the accept loop sleeps after a failed accept (out of file descriptors).
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The store's bounds. The project's own use stays far below the defaults: an NCCL Id is 128 B, a
/// peer address a few dozen, a grid row small, a barrier a few keys per rank.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreLimits {
    /// Open connections at once, hello or not (each rank holds one).
    pub max_connections: usize,
    /// Keys stored at once.
    pub max_keys: usize,
    /// Bytes of one value (at most [`MAX_FRAME`], which bounds any frame).
    pub max_value_bytes: usize,
    /// Bytes of all keys and values together (plus a small per-entry overhead).
    pub max_stored_bytes: usize,
    /// How long a new connection may take to say hello before it is dropped.
    pub hello_timeout: Duration,
}

impl StoreLimits {
    /// The defaults for a job of `world_size` ranks: 4 connections per rank + 32, 100,000 keys +
    /// 64 per rank, values up to [`MAX_FRAME`] (16 MiB), 256 MiB in all, 2 s to say hello.
    pub fn for_world(world_size: usize) -> StoreLimits {
        StoreLimits {
            max_connections: world_size.saturating_mul(4).saturating_add(32),
            max_keys: world_size.saturating_mul(64).saturating_add(100_000),
            max_value_bytes: MAX_FRAME,
            max_stored_bytes: 256 << 20,
            hello_timeout: Duration::from_secs(2),
        }
    }
}

#[derive(Default)]
struct State {
    values: HashMap<String, Vec<u8>>,
    /// Bytes of keys and values (plus overhead) held in `values`.
    stored_bytes: usize,
    /// Ranks that said hello, for timeout messages.
    ranks_seen: BTreeSet<u32>,
    /// Ranks whose connection is open: the connection's number and where it came from.
    connected: HashMap<u32, (u64, SocketAddr)>,
    /// The first hello that disagreed on the world size: (rank, its world size).
    mismatch: Option<(u32, u32)>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    world_size: usize,
    run_id: Option<String>,
    limits: StoreLimits,
    stopping: AtomicBool,
    /// Open client connections; rank 0 waits for them to close before it exits.
    connections: Mutex<usize>,
    left: Condvar,
    /// Threads answering connections over the bound.
    refusing: AtomicUsize,
    next_connection: AtomicU64,
}

/// A running store server; dropping it stops accepting new connections.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
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

impl StoreServer {
    /// Serves on 127.0.0.1 at `port` (0 picks a free one), without a run id: for tests and
    /// one-host tools. A job serves through [`StoreServer::bind_job`].
    pub fn bind(port: u16, world_size: usize) -> Result<StoreServer> {
        Self::bind_job("127.0.0.1", port, world_size, None)
    }

    /// Serves the store of a job of `world_size` ranks whose ranks connect to `master_addr:port`
    /// (0 picks a free port): on 127.0.0.1 when `master_addr` is a loopback address (or
    /// `localhost`), on every interface otherwise. `run_id` (see
    /// [`crate::topology::Topology::run_id`]) lets it refuse ranks of another job at once; `None`
    /// (ranks started by hand) compares nothing. Bounds are [`StoreLimits::for_world`].
    pub fn bind_job(
        master_addr: &str,
        port: u16,
        world_size: usize,
        run_id: Option<&str>,
    ) -> Result<StoreServer> {
        Self::bind_with(
            master_addr,
            port,
            world_size,
            run_id,
            StoreLimits::for_world(world_size),
        )
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
            let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
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
        let addr = listener
            .local_addr()
            .map_err(|e| CommError::io("store listener address", e))?;
        let mut limits = limits;
        limits.max_value_bytes = limits.max_value_bytes.min(MAX_FRAME);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            world_size,
            run_id: run_id.map(str::to_string),
            limits,
            stopping: AtomicBool::new(false),
            connections: Mutex::new(0),
            left: Condvar::new(),
            refusing: AtomicUsize::new(0),
            next_connection: AtomicU64::new(0),
        });
        let accept_shared = shared.clone();
        std::thread::Builder::new()
            .name("store-accept".into())
            .spawn(move || accept_loop(listener, accept_shared))
            .map_err(|e| CommError::io("starting the store server thread", e))?;
        Ok(StoreServer { addr, shared })
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
        self.shared.state.lock().unwrap().stored_bytes
    }

    /// Waits until every client has disconnected, so rank 0 does not take the store away while
    /// another rank still waits for an answer. Returns false if some were still connected at the
    /// timeout.
    pub fn wait_until_idle(&self, timeout: Duration) -> bool {
        let open = self.shared.connections.lock().unwrap();
        let (open, _) = self
            .shared
            .left
            .wait_timeout_while(open, timeout, |n| *n > 0)
            .unwrap();
        *open == 0
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from((Ipv4Addr::LOCALHOST, self.addr.port())),
            Duration::from_millis(200),
        );
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut backoff = Duration::ZERO;
    loop {
        let accepted = listener.accept();
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff = Duration::ZERO;
                stream
            }
            Err(_) => {
                // EMFILE/ENFILE (out of file descriptors) leaves the connection queued, so an
                // immediate retry fails again: sleep, longer each time, until one succeeds.
                backoff = (backoff * 2)
                    .max(Duration::from_millis(1))
                    .min(MAX_ACCEPT_BACKOFF);
                std::thread::sleep(backoff);
                continue;
            }
        };
        let open = {
            let mut open = shared.connections.lock().unwrap();
            if *open < shared.limits.max_connections {
                *open += 1;
                true
            } else {
                false
            }
        };
        if !open {
            refuse_connection(stream, &shared);
            continue;
        }
        let conn_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("store-conn".into())
            .spawn(move || {
                serve(stream, &conn_shared);
                *conn_shared.connections.lock().unwrap() -= 1;
                conn_shared.left.notify_all();
            });
        if spawned.is_err() {
            // No thread to be had (the stream went down with the closure): count it closed and
            // give the system a moment.
            *shared.connections.lock().unwrap() -= 1;
            shared.left.notify_all();
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A connection over the bound: answer that, from a short-lived thread (so the refusal arrives
/// before the close, not a reset), or close it at once if too many are being refused already.
fn refuse_connection(stream: TcpStream, shared: &Arc<Shared>) {
    if shared.refusing.fetch_add(1, Ordering::SeqCst) >= MAX_REFUSING {
        shared.refusing.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    let refusal = Response::Refused(Refusal::Limit {
        what: "open connections".into(),
        max: shared.limits.max_connections as u64,
    });
    let timeout = shared.limits.hello_timeout;
    let inner = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("store-refuse".into())
        .spawn(move || {
            let _ = stream.set_write_timeout(Some(timeout));
            let _ = write_frame(&mut &stream, &refusal.encode());
            let _ = stream.shutdown(Shutdown::Write);
            // Read what the client sent (its hello) until it closes, so closing does not
            // reset the connection before the client read the refusal.
            let deadline = Instant::now() + timeout;
            let mut sink = [0u8; 1024];
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
                    break;
                }
                match (&stream).read(&mut sink) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            inner.refusing.fetch_sub(1, Ordering::SeqCst);
        });
    if spawned.is_err() {
        // The closure (and its decrement) never ran; the stream closed with it.
        shared.refusing.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Reads from a stream until an overall deadline, however the bytes trickle in.
struct Until<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Read for Until<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// Answers one connection until it closes or misbehaves.
fn serve(stream: TcpStream, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    let peer = stream
        .peer_addr()
        .unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
    let id = shared.next_connection.fetch_add(1, Ordering::SeqCst);
    let mut writer = BufWriter::new(&stream);
    let answer_and_close = |writer: &mut BufWriter<&TcpStream>, response: Response| {
        let _ = write_frame(writer, &response.encode());
    };

    // The hello, within the hello timeout, however slowly it trickles in.
    let mut until = Until {
        stream: &stream,
        deadline: Instant::now() + shared.limits.hello_timeout,
    };
    let hello = match read_frame_within(&mut until, MAX_HELLO_FRAME) {
        Ok(payload) => Request::decode(&payload),
        Err(e) => {
            if let Some(too_large) = frame_too_large(&e) {
                answer_and_close(&mut writer, too_large);
            }
            return;
        }
    };
    let rank = match hello {
        Ok(Request::Hello {
            rank,
            world_size,
            run_id,
        }) => match admit(shared, id, peer, rank, world_size, run_id) {
            Ok(()) => rank,
            Err(refusal) => return answer_and_close(&mut writer, Response::Refused(refusal)),
        },
        Ok(_) => {
            let refusal = Refusal::Other("the first request must be a hello".into());
            return answer_and_close(&mut writer, Response::Refused(refusal));
        }
        Err(_) => return,
    };
    if write_frame(&mut writer, &Response::Ok.encode()).is_err()
        || stream.set_read_timeout(None).is_err()
    {
        return leave(shared, rank, id);
    }

    // A rank of this job: it may stay silent for as long as the job runs.
    let mut reader = BufReader::new(&stream);
    loop {
        let request = match read_frame(&mut reader) {
            Ok(payload) => Request::decode(&payload),
            Err(e) => {
                if let Some(too_large) = frame_too_large(&e) {
                    answer_and_close(&mut writer, too_large);
                }
                break;
            }
        };
        let Ok(request) = request else { break };
        let response = answer(shared, request);
        if write_frame(&mut writer, &response.encode()).is_err() {
            break;
        }
    }
    leave(shared, rank, id);
}

/// The refusal for a frame over the bound, if that is what `e` is.
fn frame_too_large(e: &std::io::Error) -> Option<Response> {
    let too_large = e.get_ref()?.downcast_ref::<FrameTooLarge>()?;
    Some(Response::Refused(Refusal::Limit {
        what: "frame bytes".into(),
        max: too_large.max as u64,
    }))
}

/// Checks a hello against the job this store serves, and records the rank as connected.
fn admit(
    shared: &Shared,
    id: u64,
    peer: SocketAddr,
    rank: u32,
    world_size: u32,
    run_id: Option<String>,
) -> std::result::Result<(), Refusal> {
    // Ranks started by hand have no run id: compare only when both sides have one.
    if let (Some(ours), Some(theirs)) = (&shared.run_id, &run_id) {
        if ours != theirs {
            return Err(Refusal::ForeignRun {
                store_run_id: ours.clone(),
            });
        }
    }
    let mut state = shared.state.lock().unwrap();
    if world_size as usize != shared.world_size && state.mismatch.is_none() {
        state.mismatch = Some((rank, world_size));
        // Every wait of the job ends now, with this reason.
        shared.changed.notify_all();
    }
    if let Some(refusal) = mismatch(shared, &state) {
        return Err(refusal);
    }
    if rank as usize >= shared.world_size {
        return Err(Refusal::Other(format!(
            "rank {rank} is outside a world of {} ranks",
            shared.world_size
        )));
    }
    if let Some((_, first_from)) = state.connected.get(&rank) {
        return Err(Refusal::DuplicateRank {
            first_from: first_from.to_string(),
        });
    }
    state.connected.insert(rank, (id, peer));
    state.ranks_seen.insert(rank);
    Ok(())
}

/// The connection of `rank` numbered `id` closed.
fn leave(shared: &Shared, rank: u32, id: u64) {
    let mut state = shared.state.lock().unwrap();
    if state
        .connected
        .get(&rank)
        .is_some_and(|&(open, _)| open == id)
    {
        state.connected.remove(&rank);
    }
}

fn mismatch(shared: &Shared, state: &State) -> Option<Refusal> {
    state
        .mismatch
        .map(|(rank, rank_world_size)| Refusal::WorldSizeMismatch {
            store_world_size: shared.world_size as u32,
            rank,
            rank_world_size,
        })
}

fn limit(what: &str, max: usize) -> Response {
    Response::Refused(Refusal::Limit {
        what: what.into(),
        max: max as u64,
    })
}

/// Stores `value` at `key` if the bounds allow it; otherwise says which bound.
fn store_value(
    shared: &Shared,
    state: &mut State,
    key: String,
    value: Vec<u8>,
) -> std::result::Result<(), Response> {
    let limits = &shared.limits;
    if value.len() > limits.max_value_bytes {
        return Err(limit("value bytes", limits.max_value_bytes));
    }
    let old = state
        .values
        .get(&key)
        .map(|v| key.len() + v.len() + ENTRY_OVERHEAD);
    if old.is_none() && state.values.len() >= limits.max_keys {
        return Err(limit("keys", limits.max_keys));
    }
    let new = key.len() + value.len() + ENTRY_OVERHEAD;
    let total = state.stored_bytes - old.unwrap_or(0) + new;
    if total > limits.max_stored_bytes {
        return Err(limit("stored bytes", limits.max_stored_bytes));
    }
    state.stored_bytes = total;
    state.values.insert(key, value);
    Ok(())
}

fn answer(shared: &Shared, request: Request) -> Response {
    let mut state = shared.state.lock().unwrap();
    match request {
        Request::Hello { .. } => {
            Response::Refused(Refusal::Other("this connection already said hello".into()))
        }
        Request::Set { key, value } => match store_value(shared, &mut state, key, value) {
            Ok(()) => {
                shared.changed.notify_all();
                Response::Ok
            }
            Err(refused) => refused,
        },
        Request::Get { key, timeout_ms } => {
            match wait_for(shared, state, std::slice::from_ref(&key), timeout_ms) {
                Ok(state) => Response::Value(state.values[&key].clone()),
                Err(refused) => refused,
            }
        }
        Request::Wait { keys, timeout_ms } => match wait_for(shared, state, &keys, timeout_ms) {
            Ok(_) => Response::Ok,
            Err(refused) => refused,
        },
        Request::Add { key, delta } => {
            let current = state
                .values
                .get(&key)
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok())
                .unwrap_or(0);
            let new = current.wrapping_add(delta);
            match store_value(shared, &mut state, key, new.to_string().into_bytes()) {
                Ok(()) => {
                    shared.changed.notify_all();
                    Response::Number(new)
                }
                Err(refused) => refused,
            }
        }
        Request::Check { keys } => {
            Response::Bool(keys.iter().all(|k| state.values.contains_key(k)))
        }
        Request::Delete { key } => match state.values.remove(&key) {
            Some(value) => {
                state.stored_bytes -= key.len() + value.len() + ENTRY_OVERHEAD;
                Response::Bool(true)
            }
            None => Response::Bool(false),
        },
    }
}

/// Blocks until every key exists or the timeout passes; on timeout answers who had connected
/// (as text) and the ranks that never did. Once the ranks disagree on the world size, answers
/// that at once instead.
fn wait_for<'a>(
    shared: &Shared,
    mut state: MutexGuard<'a, State>,
    keys: &[String],
    timeout_ms: u64,
) -> std::result::Result<MutexGuard<'a, State>, Response> {
    let deadline = Instant::now()
        .checked_add(Duration::from_millis(timeout_ms))
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 24 * 3600));
    loop {
        if let Some(refusal) = mismatch(shared, &state) {
            return Err(Response::Refused(refusal));
        }
        if keys.iter().all(|k| state.values.contains_key(k)) {
            return Ok(state);
        }
        let now = Instant::now();
        if now >= deadline {
            let (detail, missing) = who_arrived(&state.ranks_seen, shared.world_size);
            return Err(Response::Timeout { detail, missing });
        }
        state = shared
            .changed
            .wait_timeout(state, deadline - now)
            .unwrap()
            .0;
    }
}

fn who_arrived(seen: &BTreeSet<u32>, world_size: usize) -> (String, Vec<u32>) {
    let list = |ranks: &mut dyn Iterator<Item = &u32>| rank_list(ranks.map(|&r| r as usize));
    let missing: Vec<u32> = (0..world_size as u32)
        .filter(|r| !seen.contains(r))
        .collect();
    let text = format!(
        "ranks connected to the store: {} of {world_size}; never connected: {}",
        list(&mut seen.iter()),
        list(&mut missing.iter())
    );
    (text, missing)
}
