//! The store's client side: what every rank (rank 0 included) uses to set, get, wait, add and
//! meet at barriers, in c10d's TCPStore protocol, against our server or torchrun's.
//!
//! Keys travel as PyTorch's client sends them: a `/` in front (TCPStore's own prefix), after the
//! job's namespace if it has one. Under torchrun that namespace is `/worker/attempt_<n>`, the
//! `PrefixStore` torch's own workers put over the agent's store, so each restart of the worker
//! group meets under fresh keys; Python reads ours through the same two wrappers.
//!
//! Every store also keeps a second connection, the watcher, blocked in a WAIT for the job's abort
//! key: when a rank ends the job, or the store itself goes away (rank 0 killed), the watcher
//! hears it at once, fails this rank's pending and later requests with that reason, and tells
//! the hook a [`crate::job::Job`] installs, which stops the rank even if it is busy elsewhere.

use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::membership;
use super::wire::{self, query, Encoder, MAX_VALUE_BYTES};
use crate::error::{rank_list, CommError, Result};

/// The key on the wire for `key` in `namespace`: PyTorch's `PrefixStore` joins with `/`, and
/// its `TCPStore` puts `/` in front of every key.
pub fn wire_key(namespace: &str, key: &str) -> String {
    match namespace {
        "" => format!("/{key}"),
        ns => format!("/{ns}/{key}"),
    }
}

/// Who joins the store: which rank of how many, of which run, and under which namespace.
#[derive(Debug, Clone, Copy)]
pub struct Membership<'a> {
    /// This rank, 0..world_size.
    pub rank: usize,
    /// Ranks in the job.
    pub world_size: usize,
    /// The run's id, compared with the job's (None: ranks started by hand compare nothing).
    pub run_id: Option<&'a str>,
    /// A prefix for every key ("" for our own store; `/worker/attempt_<n>` under torchrun).
    pub namespace: &'a str,
}

/// What ended the job, as the watcher heard it.
#[derive(Debug, Clone)]
enum Ended {
    /// A rank wrote the abort key: its value.
    Aborted(Vec<u8>),
    /// The watcher's connection broke: the store is gone.
    Lost(ErrorKind, String),
}

type EndHook = Box<dyn FnOnce(CommError) + Send>;

/// What the watcher shares with the store.
struct Watch {
    ended: Mutex<Option<Ended>>,
    hook: Mutex<Option<EndHook>>,
    stopping: AtomicBool,
}

/// A connection to the rendezvous store.
pub struct Store {
    conn: Mutex<Conn>,
    /// The same socket, to interrupt a blocked request when the job ends.
    interrupt: TcpStream,
    endpoint: String,
    namespace: String,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    barriers: AtomicU64,
    local_addr: SocketAddr,
    watch: Arc<Watch>,
    watcher: Option<(TcpStream, std::thread::JoinHandle<()>)>,
}

impl Store {
    /// Connects to the store at `host:port` as rank `rank` of `world_size`, without a run id
    /// (ranks started by hand, tests); see [`Store::join`].
    pub fn connect(
        host: &str,
        port: u16,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Result<Store> {
        Self::connect_job(host, port, rank, world_size, None, timeout)
    }

    /// [`Store::join`] with no namespace: the store our rank 0 serves.
    pub fn connect_job(
        host: &str,
        port: u16,
        rank: usize,
        world_size: usize,
        run_id: Option<&str>,
        timeout: Duration,
    ) -> Result<Store> {
        let who = Membership {
            rank,
            world_size,
            run_id,
            namespace: "",
        };
        Self::join(host, port, &who, timeout)
    }

    /// Connects to the store at `host:port`, retrying until `timeout` (rank 0 may not be up yet,
    /// the store may be full of a stranger's silent connections, or this process or the server
    /// may be out of file descriptors for a moment), then joins the job as `who` says.
    ///
    /// Refused at once, and returned: a rank of another run ([`CommError::ForeignRank`], compared
    /// only when both have a run id), a rank another process already holds
    /// ([`CommError::DuplicateRank`]), a world size other than the job's
    /// ([`CommError::WorldSizeMismatch`]), and a job another rank already ended
    /// ([`CommError::JobAborted`]). The last three end the job for every rank.
    pub fn join(host: &str, port: u16, who: &Membership<'_>, timeout: Duration) -> Result<Store> {
        let endpoint = format!("{host}:{port}");
        let deadline = crate::deadline::after(timeout);
        let conn =
            connect_until(&endpoint, deadline).map_err(|source| CommError::StoreUnreachable {
                rank: who.rank,
                endpoint: endpoint.clone(),
                timeout,
                source,
            })?;
        let lost = |source| CommError::StoreLost {
            rank: who.rank,
            endpoint: endpoint.clone(),
            key: "joining".into(),
            source,
        };
        let interrupt = conn.stream.try_clone().map_err(lost)?;
        let local_addr = conn.stream.local_addr().map_err(lost)?;
        let mut store = Store {
            conn: Mutex::new(conn),
            interrupt,
            endpoint: endpoint.clone(),
            namespace: who.namespace.to_string(),
            rank: who.rank,
            world_size: who.world_size,
            timeout,
            barriers: AtomicU64::new(0),
            local_addr,
            watch: Arc::new(Watch {
                ended: Mutex::new(None),
                hook: Mutex::new(None),
                stopping: AtomicBool::new(false),
            }),
            watcher: None,
        };
        // The watcher's connection is opened now and confirmed after joining, so that its
        // round trip overlaps the joining ones.
        let watcher = Conn::start(&endpoint, Duration::from_secs(5));
        membership::join(&store, who.run_id)?;
        let watcher = match watcher.and_then(Conn::confirm) {
            Ok(conn) => conn,
            Err(_) => connect_until(&endpoint, deadline).map_err(lost)?,
        };
        store.watcher = Some(store.start_watcher(watcher).map_err(lost)?);
        Ok(store)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the job.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The store's `host:port`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// This end of the connection.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The local address of this connection: an address of this host that the master can reach,
    /// so peers on other nodes likely can too.
    pub fn local_ip(&self) -> std::net::IpAddr {
        self.local_addr.ip()
    }

    /// The longest any wait through this store may take; the backends built through it use
    /// the same limit.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Says that this rank leaves the job knowingly (it finished, or failed and said why): its
    /// connections closing is then no news to our server, which otherwise takes a rank whose
    /// connection closes for one that vanished and ends the job (`membership.rs`). Best effort.
    pub fn leave(&self) {
        let _ = self.set(&membership::left_key(self.rank), b"");
    }

    /// [`Store::leave`] as the store is dropped: the SET alone, unconfirmed (TCPStore does not
    /// answer a SET; the server reads it before this connection's end), and given up after
    /// 100 ms, so that dropping a store never waits on a store that is stuck or gone.
    fn say_leaving(&self) {
        let request = Encoder::command(query::SET)
            .bytes(self.wire(&membership::left_key(self.rank)).as_bytes())
            .bytes(b"");
        if let Ok(mut conn) = self.conn.try_lock() {
            let _ = conn
                .stream
                .set_write_timeout(Some(Duration::from_millis(100)));
            let _ = conn.send(&request.0);
        }
    }

    /// Calls `hook` once, from the watcher's thread, when another rank ends the job or the store
    /// goes away (at once if that happened already). Not called after this store is dropped.
    pub fn when_job_ends(&self, hook: impl FnOnce(CommError) + Send + 'static) {
        *self.watch.hook.lock().unwrap() = Some(Box::new(hook));
        if let Some(ended) = self.watch.ended.lock().unwrap().clone() {
            if let Some(hook) = self.watch.hook.lock().unwrap().take() {
                hook(self.ended_error(&ended, "the job"));
            }
        }
    }

    /// Ends the job for every rank with this rank's `error` as the reason (unless a rank gave
    /// one already). Best effort: the store may be gone.
    pub fn abort(&self, error: &CommError) {
        membership::abort(self, error);
    }

    /// Sets `key` to `value`, replacing any earlier value, and wakes every rank waiting for it.
    ///
    /// The key is also listed, with this rank, in the job's index (`job/keys`, one `<rank> <key>`
    /// line each; barriers' own keys aside), so that someone reading the store from outside can
    /// tell which keys there are and who wrote them: TCPStore has no command that lists keys.
    /// The APPEND travels in the same write as the SET.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.check_value(key, value)?;
        let mut request = Encoder::command(query::SET)
            .bytes(self.wire(key).as_bytes())
            .bytes(value);
        if !key.starts_with("barrier/") {
            let line = format!("{} {key}\n", self.rank);
            let index = Encoder::command(query::APPEND)
                .bytes(self.wire(membership::INDEX_KEY).as_bytes())
                .bytes(line.as_bytes());
            request.0.extend_from_slice(&index.0);
        }
        self.call(key, |c| c.confirmed(request))
    }

    /// Appends `value` to what `key` holds (or sets it).
    pub fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.check_value(key, value)?;
        let request = Encoder::command(query::APPEND)
            .bytes(self.wire(key).as_bytes())
            .bytes(value);
        self.call(key, |c| c.confirmed(request))
    }

    /// Sets several keys in one request.
    pub fn multi_set(&self, pairs: &[(&str, &[u8])]) -> Result<()> {
        let mut request = Encoder::command(query::MULTI_SET);
        request
            .0
            .extend_from_slice(&(pairs.len() as u64).to_ne_bytes());
        for (key, value) in pairs {
            self.check_value(key, value)?;
            request = request.bytes(self.wire(key).as_bytes()).bytes(value);
        }
        self.call("(multi_set)", |c| c.confirmed(request))
    }

    /// Rank 0's `value` under `key`: rank 0 sets its own and gets it back, every other rank
    /// waits for it. How ranks check that they were all given the same setting (the caller
    /// compares and names the difference).
    pub fn rank0_value(&self, key: &str, value: &str) -> Result<String> {
        if self.rank == 0 {
            self.set(key, value.as_bytes())?;
            return Ok(value.to_string());
        }
        Ok(String::from_utf8_lossy(&self.get(key)?).into_owned())
    }

    /// Waits (up to the timeout) for `key` to be set and returns its value.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.get_within(key, self.timeout)
    }

    /// [`Store::get`] with its own timeout.
    pub fn get_within(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait_within(&[key], timeout)?;
        let request = Encoder::command(query::GET).bytes(self.wire(key).as_bytes());
        self.call(key, |c| {
            c.send(&request.0)?;
            c.bytes()
        })
    }

    /// Waits (up to the timeout) for every key, then returns their values in order.
    pub fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.wait(keys)?;
        let wired: Vec<String> = keys.iter().map(|k| self.wire(k)).collect();
        let request = Encoder::command(query::MULTI_GET).keys(&wired);
        self.call(&keys.join(", "), |c| {
            c.send(&request.0)?;
            keys.iter().map(|_| c.bytes()).collect()
        })
    }

    /// Waits (up to the timeout) until every key is set.
    pub fn wait(&self, keys: &[&str]) -> Result<()> {
        self.wait_within(keys, self.timeout)
    }

    fn wait_within(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let wired: Vec<String> = keys.iter().map(|k| self.wire(k)).collect();
        let request = Encoder::command(query::WAIT).keys(&wired);
        let what = keys.join(", ");
        let answered = self.call(&what, |c| c.wait(&request.0, timeout))?;
        if answered {
            return Ok(());
        }
        let (detail, missing) = self.who_joined();
        Err(CommError::Timeout {
            what: format!("key '{what}' on rank {}", self.rank),
            timeout,
            detail: format!(" ({detail})"),
            missing,
        })
    }

    /// Atomically adds `delta` to the number stored at `key` (0 if unset) and returns the result.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let request = Encoder::command(query::ADD)
            .bytes(self.wire(key).as_bytes())
            .i64(delta);
        self.call(key, |c| {
            c.send(&request.0)?;
            c.i64()
        })
    }

    /// Sets `key` to `desired` if it holds `expected` (or is unset and `expected` is empty), and
    /// returns what it holds afterwards (TCPStore's compare_set).
    pub fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.check_value(key, desired)?;
        let request = Encoder::command(query::COMPARE_SET)
            .bytes(self.wire(key).as_bytes())
            .bytes(expected)
            .bytes(desired);
        self.call(key, |c| {
            c.send(&request.0)?;
            c.bytes()
        })
    }

    /// Several COMPARE_SETs and then a CHECK, sent in one write and answered in order: one
    /// round trip where one each would take four (how a rank joins, `membership.rs`).
    pub(super) fn compare_sets_then_check(
        &self,
        sets: &[(&str, &[u8])],
        check: &str,
    ) -> Result<(Vec<Vec<u8>>, bool)> {
        let mut request = Encoder::default();
        for (key, desired) in sets {
            self.check_value(key, desired)?;
            request = request
                .u8(query::COMPARE_SET)
                .bytes(self.wire(key).as_bytes())
                .bytes(b"")
                .bytes(desired);
        }
        request = request.u8(query::CHECK).keys(&[self.wire(check)]);
        self.call("joining", |c| {
            c.send(&request.0)?;
            let now = sets
                .iter()
                .map(|_| c.bytes())
                .collect::<std::io::Result<_>>()?;
            Ok((now, c.u8()? == wire::READY))
        })
    }

    /// Whether every key is set, without waiting.
    pub fn check(&self, keys: &[&str]) -> Result<bool> {
        let wired: Vec<String> = keys.iter().map(|k| self.wire(k)).collect();
        let request = Encoder::command(query::CHECK).keys(&wired);
        self.call(&keys.join(", "), |c| {
            c.send(&request.0)?;
            Ok(c.u8()? == wire::READY)
        })
    }

    /// Removes `key`; returns whether it was there.
    pub fn delete(&self, key: &str) -> Result<bool> {
        let request = Encoder::command(query::DELETE_KEY).bytes(self.wire(key).as_bytes());
        self.call(key, |c| {
            c.send(&request.0)?;
            Ok(c.i64()? > 0)
        })
    }

    /// Removes every key, in one round trip; returns how many were there.
    pub fn delete_all(&self, keys: &[&str]) -> Result<usize> {
        if keys.is_empty() {
            return Ok(0);
        }
        let mut request = Encoder::default();
        for key in keys {
            request = request
                .u8(query::DELETE_KEY)
                .bytes(self.wire(key).as_bytes());
        }
        self.call(&keys.join(", "), |c| {
            c.send(&request.0)?;
            keys.iter()
                .try_fold(0, |n, _| Ok(n + (c.i64()? > 0) as usize))
        })
    }

    /// Keys in the whole store (every namespace).
    pub fn num_keys(&self) -> Result<i64> {
        self.call("(num_keys)", |c| {
            c.send(&[query::GETNUMKEYS])?;
            c.i64()
        })
    }

    /// Returns once every rank has called `barrier` with the same name the same number of times.
    /// On timeout the error lists which ranks had arrived.
    pub fn barrier(&self, name: &str) -> Result<()> {
        let generation = self.barriers.fetch_add(1, Ordering::SeqCst);
        let base = format!("barrier/{name}/{generation}");
        self.set(&format!("{base}/rank/{}", self.rank), b"here")?;
        let done = format!("{base}/done");
        if self.add(&format!("{base}/count"), 1)? == self.world_size as i64 {
            self.set(&done, b"")?;
        }
        match self.wait(&[&done]) {
            Err(CommError::Timeout { timeout, .. }) => {
                let keys: Vec<String> = (0..self.world_size)
                    .map(|r| format!("{base}/rank/{r}"))
                    .collect();
                let (arrived, missing) = self.present(&keys)?;
                Err(CommError::Timeout {
                    what: format!("barrier '{name}' on rank {}", self.rank),
                    timeout,
                    detail: format!(
                        "; arrived: ranks {} of {}; missing: ranks {} (did they fail or start late?)",
                        rank_list(arrived),
                        self.world_size,
                        rank_list(missing.iter().copied())
                    ),
                    missing,
                })
            }
            other => other,
        }
    }

    /// Which of `keys` (one per rank, in rank order) are set: (ranks set, ranks not). One
    /// MULTI_GET without a WAIT before it, which TCPStore answers with an empty value for a key
    /// not set (so the keys asked about never hold an empty value).
    fn present(&self, keys: &[String]) -> Result<(Vec<usize>, Vec<usize>)> {
        let wired: Vec<String> = keys.iter().map(|k| self.wire(k)).collect();
        let request = Encoder::command(query::MULTI_GET).keys(&wired);
        let values = self.call("(who arrived)", |c| {
            c.send(&request.0)?;
            keys.iter()
                .map(|_| c.bytes())
                .collect::<std::io::Result<Vec<_>>>()
        })?;
        let (set, missing): (Vec<usize>, Vec<usize>) =
            (0..keys.len()).partition(|&rank| !values[rank].is_empty());
        Ok((set, missing))
    }

    /// Who had joined the job, for a timeout's message: the text and the ranks that never did.
    fn who_joined(&self) -> (String, Vec<usize>) {
        let keys: Vec<String> = (0..self.world_size).map(membership::rank_key).collect();
        match self.present(&keys) {
            Ok((joined, missing)) => (
                format!(
                    "ranks connected to the store: {} of {}; never connected: {}",
                    rank_list(joined),
                    self.world_size,
                    rank_list(missing.iter().copied())
                ),
                missing,
            ),
            Err(_) => ("the store did not say who had connected".into(), Vec::new()),
        }
    }

    fn wire(&self, key: &str) -> String {
        wire_key(&self.namespace, key)
    }

    fn check_value(&self, key: &str, value: &[u8]) -> Result<()> {
        if value.len() > MAX_VALUE_BYTES || self.wire(key).len() > wire::MAX_KEY_BYTES {
            let (what, max) = match value.len() > MAX_VALUE_BYTES {
                true => ("value bytes", MAX_VALUE_BYTES),
                false => ("key bytes", wire::MAX_KEY_BYTES),
            };
            return Err(CommError::StoreLimit {
                rank: self.rank,
                endpoint: self.endpoint.clone(),
                key: key.to_string(),
                what: what.into(),
                max: max as u64,
            });
        }
        Ok(())
    }

    /// Runs one exchange on the connection, turning its failure into the error a user reads:
    /// the job's end if the watcher heard of one, else a timeout or a lost store.
    fn call<T>(
        &self,
        key: &str,
        exchange: impl FnOnce(&mut Conn) -> std::io::Result<T>,
    ) -> Result<T> {
        if let Some(ended) = self.watch.ended.lock().unwrap().clone() {
            return Err(self.ended_error(&ended, key));
        }
        let mut conn = self.conn.lock().unwrap();
        let read_timeout = self.timeout.max(Duration::from_secs(5));
        conn.stream
            .set_read_timeout(Some(read_timeout))
            .and_then(|()| exchange(&mut conn))
            .map_err(|e| {
                if let Some(ended) = self.watch.ended.lock().unwrap().clone() {
                    return self.ended_error(&ended, key);
                }
                match e.kind() {
                    ErrorKind::WouldBlock | ErrorKind::TimedOut => CommError::Timeout {
                        what: format!("the store at {} to answer '{key}'", self.endpoint),
                        timeout: read_timeout,
                        detail: String::new(),
                        missing: Vec::new(),
                    },
                    _ => CommError::StoreLost {
                        rank: self.rank,
                        endpoint: self.endpoint.clone(),
                        key: key.to_string(),
                        source: e,
                    },
                }
            })
    }

    fn ended_error(&self, ended: &Ended, key: &str) -> CommError {
        ended_error(self.rank, &self.endpoint, ended, key)
    }

    /// Starts the watcher on its own connection: a WAIT for the abort key that only the job's end
    /// or the store's loss answers.
    fn start_watcher(
        &self,
        mut conn: Conn,
    ) -> std::io::Result<(TcpStream, std::thread::JoinHandle<()>)> {
        let abort_key = self.wire(membership::ABORT_KEY);
        let watch = self.watch.clone();
        let (rank, endpoint) = (self.rank, self.endpoint.clone());
        let interrupt = self.interrupt.try_clone()?;
        let handle = conn.stream.try_clone()?;
        let thread = std::thread::Builder::new()
            .name("store-watcher".into())
            .spawn(move || {
                let ended = match watch_for_abort(&mut conn, &abort_key) {
                    Ok(value) => Ended::Aborted(value),
                    Err(_) if watch.stopping.load(Ordering::SeqCst) => return,
                    Err(e) => Ended::Lost(
                        e.kind(),
                        format!(
                            "the store closed the connection ({e}), noticed by this rank's watcher"
                        ),
                    ),
                };
                *watch.ended.lock().unwrap() = Some(ended.clone());
                // A request blocked on the store ends now, with the reason above.
                let _ = interrupt.shutdown(Shutdown::Both);
                if let Some(hook) = watch.hook.lock().unwrap().take() {
                    hook(ended_error(rank, &endpoint, &ended, "the job"));
                }
            })?;
        Ok((handle, thread))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Dropped in order, this rank leaves knowingly; dropped by a panic, or never dropped (a
        // killed process), its connection closing is news the server passes on.
        if !std::thread::panicking() {
            self.say_leaving();
        }
        self.watch.stopping.store(true, Ordering::SeqCst);
        if let Some((stream, thread)) = self.watcher.take() {
            let _ = stream.shutdown(Shutdown::Both);
            let _ = thread.join();
        }
    }
}

/// The error rank `rank` fails with once the job `ended`, for its request about `key`.
fn ended_error(rank: usize, endpoint: &str, ended: &Ended, key: &str) -> CommError {
    match ended {
        Ended::Aborted(value) => membership::reason(rank, value),
        Ended::Lost(kind, text) => CommError::StoreLost {
            rank,
            endpoint: endpoint.to_string(),
            key: key.to_string(),
            source: std::io::Error::new(*kind, text.clone()),
        },
    }
}

/// The watcher's one request: WAIT for the abort key, then GET it.
fn watch_for_abort(conn: &mut Conn, abort_key: &str) -> std::io::Result<Vec<u8>> {
    conn.stream.set_read_timeout(None)?;
    conn.send(&Encoder::command(query::WAIT).keys(&[abort_key]).0)?;
    if conn.u8()? != wire::STOP_WAITING {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            "a WAIT answered oddly",
        ));
    }
    conn.stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.send(&Encoder::command(query::GET).bytes(abort_key.as_bytes()).0)?;
    conn.bytes()
}

/// One TCPStore connection.
struct Conn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    /// Connects within `left`, validates and pings (the ping proves a TCPStore answers).
    fn open(endpoint: &str, left: Duration) -> std::io::Result<Conn> {
        Conn::start(endpoint, left)?.confirm()
    }

    /// Connects within `left` and sends VALIDATE and a PING, without waiting for the answer:
    /// [`Conn::confirm`] reads it, so the round trip can overlap other work.
    fn start(endpoint: &str, left: Duration) -> std::io::Result<Conn> {
        let left = left.clamp(Duration::from_millis(50), Duration::from_secs(5));
        let addr = endpoint.to_socket_addrs()?.next().ok_or_else(|| {
            std::io::Error::new(ErrorKind::NotFound, format!("{endpoint} has no address"))
        })?;
        // EMFILE/ENFILE here (no descriptor for the socket) is as passing as a refused connection.
        let stream = TcpStream::connect_timeout(&addr, left)?;
        // A socket the kernel connected to itself (no listener yet) is not the store.
        if stream.local_addr()? == stream.peer_addr()? {
            return Err(std::io::Error::new(
                ErrorKind::ConnectionRefused,
                "no store listening yet",
            ));
        }
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(left))?;
        let reader = BufReader::new(stream.try_clone()?);
        let mut conn = Conn { stream, reader };
        let hello = Encoder::command(query::VALIDATE)
            .u32(wire::VALIDATION_MAGIC)
            .u8(query::PING)
            .u32(std::process::id());
        match conn.send(&hello.0) {
            Err(e) if closed(&e) => Err(closed_at_once()),
            sent => sent.map(|()| conn),
        }
    }

    /// Reads the answer to [`Conn::start`]'s PING.
    fn confirm(mut self) -> std::io::Result<Conn> {
        match self.u32() {
            Ok(echo) if echo == std::process::id() => Ok(self),
            Ok(_) => Err(std::io::Error::new(
                ErrorKind::InvalidData,
                "what answers there is not a TCPStore (its ping came back wrong)",
            )),
            Err(e) if closed(&e) => Err(closed_at_once()),
            Err(e) => Err(e),
        }
    }

    fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Sends a request TCPStore does not answer, then a PING, so that the request is known done
    /// (or refused: the server closes the connection) when this returns.
    fn confirmed(&mut self, request: Encoder) -> std::io::Result<()> {
        let nonce = std::process::id();
        let mut bytes = request.0;
        bytes.extend_from_slice(&Encoder::command(query::PING).u32(nonce).0);
        self.send(&bytes)?;
        match self.u32() {
            Ok(n) if n == nonce => Ok(()),
            Ok(_) => Err(std::io::Error::new(
                ErrorKind::InvalidData,
                "the store's ping came back wrong",
            )),
            Err(e) if closed(&e) => Err(std::io::Error::new(
                ErrorKind::ConnectionAborted,
                "the store closed the connection after this request (over one of its bounds? \
                 rank 0's output says which)",
            )),
            Err(e) => Err(e),
        }
    }

    /// WAIT: true once the keys are set, false after `timeout` (the wait is then cancelled).
    fn wait(&mut self, request: &[u8], timeout: Duration) -> std::io::Result<bool> {
        self.send(request)?;
        self.stream
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
        match self.u8() {
            Ok(wire::STOP_WAITING) => return Ok(true),
            Ok(_) => {
                return Err(std::io::Error::new(
                    ErrorKind::InvalidData,
                    "a WAIT answered oddly",
                ))
            }
            Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(e)
            }
            Err(_) => {}
        }
        // Withdraw the wait; the answer to it may have crossed our cancel, so skip it.
        self.stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        self.send(&[query::CANCEL_WAIT])?;
        let mut answer = self.u8()?;
        if answer == wire::STOP_WAITING {
            answer = self.u8()?;
        }
        match answer {
            wire::WAIT_CANCELED => Ok(false),
            _ => Err(std::io::Error::new(
                ErrorKind::InvalidData,
                "CANCEL_WAIT answered oddly",
            )),
        }
    }

    fn exact<const N: usize>(&mut self) -> std::io::Result<[u8; N]> {
        let mut buf = [0u8; N];
        self.reader.read_exact(&mut buf)?;
        Ok(buf)
    }
    fn u8(&mut self) -> std::io::Result<u8> {
        Ok(self.exact::<1>()?[0])
    }
    fn u32(&mut self) -> std::io::Result<u32> {
        Ok(u32::from_ne_bytes(self.exact()?))
    }
    fn i64(&mut self) -> std::io::Result<i64> {
        Ok(i64::from_ne_bytes(self.exact()?))
    }
    /// A value: its length is checked before anything is allocated, and the buffer grows only
    /// as bytes arrive.
    fn bytes(&mut self) -> std::io::Result<Vec<u8>> {
        let len = u64::from_ne_bytes(self.exact()?);
        if len > MAX_VALUE_BYTES as u64 {
            return Err(std::io::Error::new(
                ErrorKind::InvalidData,
                format!("the store sent a value of {len} bytes, over {MAX_VALUE_BYTES}"),
            ));
        }
        let mut value = Vec::with_capacity((len as usize).min(64 << 10));
        (&mut self.reader).take(len).read_to_end(&mut value)?;
        if value.len() as u64 != len {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        Ok(value)
    }
}

/// The store closed a new connection before answering its ping.
fn closed_at_once() -> std::io::Error {
    std::io::Error::new(
        ErrorKind::ConnectionAborted,
        "the store closed the connection at once (it closes connections over its bound of open \
         connections, and says so in rank 0's output)",
    )
}

/// Whether `e` says the other end closed the connection (a close, or a reset when it closed
/// without reading what we sent).
fn closed(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
    )
}

/// Connects, validates and pings, retrying with a growing pause until `deadline`.
fn connect_until(endpoint: &str, deadline: Instant) -> std::io::Result<Conn> {
    let mut pause = Duration::from_millis(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match Conn::open(endpoint, left) {
            Ok(conn) => return Ok(conn),
            Err(e)
                if Instant::now()
                    .checked_add(pause)
                    .is_none_or(|t| t >= deadline) =>
            {
                return Err(e)
            }
            Err(_) => {}
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}
