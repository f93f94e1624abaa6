//! The store's client side: what every rank (rank 0 included) uses to set, get, wait, add and
//! meet at barriers.

use std::io::{BufReader, BufWriter};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::frame::{read_frame, write_frame, Refusal, Request, Response};
use super::MAX_FRAME;
use crate::error::{CommError, Result};

/// A connection to the rendezvous store.
pub struct Store {
    conn: Mutex<(BufReader<TcpStream>, BufWriter<TcpStream>)>,
    endpoint: String,
    rank: usize,
    world_size: usize,
    run_id: Option<String>,
    timeout: Duration,
    barriers: AtomicU64,
    local_addr: SocketAddr,
}

impl Store {
    /// Connects to the store at `host:port` as rank `rank` of `world_size`, without a run id
    /// (ranks started by hand, tests); see [`Store::connect_job`].
    pub fn connect(
        host: &str,
        port: u16,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Result<Store> {
        Self::connect_job(host, port, rank, world_size, None, timeout)
    }

    /// Connects to the store at `host:port` and says hello as rank `rank` of a job of
    /// `world_size` ranks and run `run_id`, retrying until `timeout`: rank 0 may not be up yet,
    /// the store may be full of a stranger's silent connections, or this process (or the
    /// server) may be out of file descriptors for a moment.
    ///
    /// The store refuses at once, and this returns, a rank of another run
    /// ([`CommError::ForeignRank`], compared only when both have a run id), a rank whose earlier
    /// connection is still open ([`CommError::DuplicateRank`]) and a world size other than rank
    /// 0's ([`CommError::WorldSizeMismatch`]).
    pub fn connect_job(
        host: &str,
        port: u16,
        rank: usize,
        world_size: usize,
        run_id: Option<&str>,
        timeout: Duration,
    ) -> Result<Store> {
        let endpoint = format!("{host}:{port}");
        let hello = Request::Hello {
            rank: u32::try_from(rank)
                .map_err(|_| CommError::Usage(format!("rank {rank} is too large")))?,
            world_size: u32::try_from(world_size)
                .map_err(|_| CommError::Usage(format!("world size {world_size} is too large")))?,
            run_id: run_id.map(str::to_string),
        };
        let who = Who {
            rank,
            endpoint: &endpoint,
            run_id,
        };
        // A timeout too far to represent waits for good rather than overflowing the clock.
        let deadline = far(timeout);
        let mut pause = Duration::from_millis(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let last = match attempt(&endpoint, &hello, left) {
                Ok((reader, writer, local_addr)) => {
                    return Ok(Store {
                        conn: Mutex::new((reader, writer)),
                        endpoint,
                        rank,
                        world_size,
                        run_id: run_id.map(str::to_string),
                        timeout,
                        barriers: AtomicU64::new(0),
                        local_addr,
                    })
                }
                // Full of connections: a stranger's silent ones go after the hello timeout.
                Err(Attempt::Refused(refusal @ Refusal::Limit { .. })) => Err(refusal),
                Err(Attempt::Refused(refusal)) => return Err(who.refused(refusal, "hello")),
                // Not listening yet, out of file descriptors here or there, a reset: again.
                Err(Attempt::Failed(source)) => Ok(source),
            };
            if far(pause) >= deadline {
                return Err(match last {
                    Ok(source) => CommError::StoreUnreachable {
                        rank,
                        endpoint,
                        timeout,
                        source,
                    },
                    Err(refusal) => who.refused(refusal, "hello"),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(500));
        }
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

    /// Sets `key` to `value`, replacing any earlier value, and wakes every rank waiting for it.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let request = Request::Set {
            key: key.into(),
            value: value.to_vec(),
        };
        self.request(request, key).map(|_| ())
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
        let request = Request::Get {
            key: key.into(),
            timeout_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
        };
        match self.request(request, key)? {
            Response::Value(v) => Ok(v),
            other => Err(self.unexpected(key, other)),
        }
    }

    /// Waits (up to the timeout) until every key is set.
    pub fn wait(&self, keys: &[&str]) -> Result<()> {
        let request = Request::Wait {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            timeout_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
        };
        self.request(request, &keys.join(", ")).map(|_| ())
    }

    /// Atomically adds `delta` to the number stored at `key` (0 if unset) and returns the result.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let request = Request::Add {
            key: key.into(),
            delta,
        };
        match self.request(request, key)? {
            Response::Number(n) => Ok(n),
            other => Err(self.unexpected(key, other)),
        }
    }

    /// Whether every key is set, without waiting.
    pub fn check(&self, keys: &[&str]) -> Result<bool> {
        let request = Request::Check {
            keys: keys.iter().map(|k| k.to_string()).collect(),
        };
        match self.request(request, &keys.join(", "))? {
            Response::Bool(b) => Ok(b),
            other => Err(self.unexpected(&keys.join(", "), other)),
        }
    }

    /// Removes `key`; returns whether it was there.
    pub fn delete(&self, key: &str) -> Result<bool> {
        let request = Request::Delete { key: key.into() };
        match self.request(request, key)? {
            Response::Bool(b) => Ok(b),
            other => Err(self.unexpected(key, other)),
        }
    }

    /// Returns once every rank has called `barrier` with the same name the same number of times.
    /// On timeout the error lists which ranks had arrived.
    pub fn barrier(&self, name: &str) -> Result<()> {
        let generation = self.barriers.fetch_add(1, Ordering::SeqCst);
        let base = format!("barrier/{name}/{generation}");
        self.set(&format!("{base}/rank/{}", self.rank), b"")?;
        let done = format!("{base}/done");
        if self.add(&format!("{base}/count"), 1)? == self.world_size as i64 {
            self.set(&done, b"")?;
        }
        match self.wait(&[&done]) {
            Err(CommError::Timeout { timeout, .. }) => {
                let (mut arrived, mut missing) = (Vec::new(), Vec::new());
                for r in 0..self.world_size {
                    let key = format!("{base}/rank/{r}");
                    if self.check(&[&key]).unwrap_or(false) {
                        arrived.push(r);
                    } else {
                        missing.push(r);
                    }
                }
                let names = |ranks: &[usize]| crate::error::rank_list(ranks.iter().copied());
                Err(CommError::Timeout {
                    what: format!("barrier '{name}' on rank {}", self.rank),
                    timeout,
                    detail: format!(
                        "; arrived: ranks {} of {}; missing: ranks {} (did they fail or start late?)",
                        names(&arrived),
                        self.world_size,
                        names(&missing)
                    ),
                    missing,
                })
            }
            other => other,
        }
    }

    fn request(&self, request: Request, key: &str) -> Result<Response> {
        let waits = matches!(request, Request::Get { .. } | Request::Wait { .. });
        let mut conn = self.conn.lock().unwrap();
        // A waiting request gets a little longer than its own timeout, so the server's answer,
        // which says who had arrived, normally wins; a silent server still cannot hang us.
        let read_timeout = if waits {
            self.timeout.saturating_add(Duration::from_secs(5))
        } else {
            self.timeout.max(Duration::from_secs(5))
        };
        let lost = |source| CommError::StoreLost {
            rank: self.rank,
            endpoint: self.endpoint.clone(),
            key: key.to_string(),
            source,
        };
        let frame = request.encode();
        if frame.len() > MAX_FRAME {
            return Err(self.who().refused(
                Refusal::Limit {
                    what: "frame bytes".into(),
                    max: MAX_FRAME as u64,
                },
                key,
            ));
        }
        conn.0
            .get_ref()
            .set_read_timeout(Some(read_timeout))
            .map_err(lost)?;
        write_frame(&mut conn.1, &frame).map_err(lost)?;
        let payload = read_frame(&mut conn.0).map_err(|e| {
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                CommError::Timeout {
                    what: format!("the store at {} to answer '{key}'", self.endpoint),
                    timeout: read_timeout,
                    detail: String::new(),
                    missing: Vec::new(),
                }
            } else {
                lost(e)
            }
        })?;
        match Response::decode(&payload).map_err(lost)? {
            Response::Timeout { detail, missing } => Err(CommError::Timeout {
                what: format!("key '{key}' on rank {}", self.rank),
                timeout: self.timeout,
                detail: format!(" ({detail})"),
                missing: missing.into_iter().map(|r| r as usize).collect(),
            }),
            Response::Refused(refusal) => Err(self.who().refused(refusal, key)),
            response => Ok(response),
        }
    }

    fn who(&self) -> Who<'_> {
        Who {
            rank: self.rank,
            endpoint: &self.endpoint,
            run_id: self.run_id.as_deref(),
        }
    }

    fn unexpected(&self, key: &str, response: Response) -> CommError {
        CommError::Peer(format!(
            "the store at {} answered '{key}' with {response:?}",
            self.endpoint
        ))
    }
}

type Conn = (BufReader<TcpStream>, BufWriter<TcpStream>);

/// Why one connection attempt did not give a connection.
enum Attempt {
    /// The store answered the hello with a refusal.
    Refused(Refusal),
    /// No store (yet), or the connection broke: worth another try.
    Failed(std::io::Error),
}

/// One try: connect within what is `left` of the deadline (5 s at most), say hello, read the
/// answer.
fn attempt(
    endpoint: &str,
    hello: &Request,
    left: Duration,
) -> std::result::Result<(BufReader<TcpStream>, BufWriter<TcpStream>, SocketAddr), Attempt> {
    let left = left.clamp(Duration::from_millis(50), Duration::from_secs(5));
    let addr = endpoint
        .to_socket_addrs()
        .and_then(|mut addrs| {
            addrs
                .next()
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address"))
        })
        .map_err(Attempt::Failed)?;
    // EMFILE/ENFILE here (no descriptor for the socket) is as passing as a refused connection.
    let stream = TcpStream::connect_timeout(&addr, left).map_err(Attempt::Failed)?;
    // A socket the kernel connected to itself (no listener yet) is not the store.
    if let (Ok(a), Ok(b)) = (stream.local_addr(), stream.peer_addr()) {
        if a == b {
            return Err(Attempt::Failed(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "no store listening yet",
            )));
        }
    }
    let _ = stream.set_nodelay(true);
    let local_addr = stream.local_addr().map_err(Attempt::Failed)?;
    let write_half = stream.try_clone().map_err(Attempt::Failed)?;
    let (mut reader, mut writer): Conn = (BufReader::new(stream), BufWriter::new(write_half));
    reader
        .get_ref()
        .set_read_timeout(Some(left))
        .map_err(Attempt::Failed)?;
    write_frame(&mut writer, &hello.encode()).map_err(Attempt::Failed)?;
    let payload = read_frame(&mut reader).map_err(Attempt::Failed)?;
    match Response::decode(&payload).map_err(Attempt::Failed)? {
        Response::Ok => Ok((reader, writer, local_addr)),
        Response::Refused(refusal) => Err(Attempt::Refused(refusal)),
        other => Err(Attempt::Failed(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the store answered the hello with {other:?}"),
        ))),
    }
}

/// Who is asking, for the errors a refusal becomes.
struct Who<'a> {
    rank: usize,
    endpoint: &'a str,
    run_id: Option<&'a str>,
}

impl Who<'_> {
    /// The error a refusal of the request for `key` becomes.
    fn refused(&self, refusal: Refusal, key: &str) -> CommError {
        let endpoint = self.endpoint.to_string();
        match refusal {
            Refusal::ForeignRun { store_run_id } => CommError::ForeignRank {
                rank: self.rank,
                run_id: self.run_id.unwrap_or("(none)").to_string(),
                endpoint,
                store_run_id,
            },
            Refusal::DuplicateRank { first_from } => CommError::DuplicateRank {
                rank: self.rank,
                endpoint,
                first_from,
            },
            Refusal::WorldSizeMismatch {
                store_world_size,
                rank,
                rank_world_size,
            } => CommError::WorldSizeMismatch {
                rank: self.rank,
                endpoint,
                store_world_size: store_world_size as usize,
                other_rank: rank as usize,
                other_world_size: rank_world_size as usize,
            },
            Refusal::Limit { what, max } => CommError::StoreLimit {
                rank: self.rank,
                endpoint,
                key: key.to_string(),
                what,
                max,
            },
            Refusal::Other(why) => CommError::Peer(format!(
                "the rendezvous store at {endpoint} refused '{key}' from rank {}: {why}",
                self.rank
            )),
        }
    }
}

/// `timeout` from now, or a year from now where that cannot be represented.
fn far(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}
