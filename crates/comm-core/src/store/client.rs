//! The store's client side: what every rank (rank 0 included) uses to set, get, wait, add and
//! meet at barriers.

use std::io::{BufReader, BufWriter};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::frame::{read_frame, write_frame, Request, Response};
use crate::error::{CommError, Result};

/// A connection to the rendezvous store.
pub struct Store {
    conn: Mutex<(BufReader<TcpStream>, BufWriter<TcpStream>)>,
    endpoint: String,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    barriers: AtomicU64,
    local_addr: SocketAddr,
}

impl Store {
    /// Connects to the store at `host:port`, retrying until `timeout` (rank 0 may not be up yet).
    pub fn connect(
        host: &str,
        port: u16,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Result<Store> {
        let endpoint = format!("{host}:{port}");
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(20);
        let stream = loop {
            let attempt = endpoint
                .to_socket_addrs()
                .and_then(|mut addrs| {
                    addrs.next().ok_or_else(|| {
                        std::io::Error::new(std::io::ErrorKind::NotFound, "no address")
                    })
                })
                .and_then(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(5)));
            // A socket the kernel connected to itself (no listener yet) is not the store.
            let attempt = attempt.and_then(|s| match (s.local_addr(), s.peer_addr()) {
                (Ok(a), Ok(b)) if a == b => Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "no store listening yet",
                )),
                _ => Ok(s),
            });
            match attempt {
                Ok(stream) => break stream,
                Err(source) if Instant::now() + pause >= deadline => {
                    return Err(CommError::StoreUnreachable {
                        rank,
                        endpoint,
                        timeout,
                        source,
                    })
                }
                Err(_) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let local_addr = stream
            .local_addr()
            .map_err(|e| CommError::io("store connection", e))?;
        let write_half = stream
            .try_clone()
            .map_err(|e| CommError::io("store connection", e))?;
        let store = Store {
            conn: Mutex::new((BufReader::new(stream), BufWriter::new(write_half))),
            endpoint,
            rank,
            world_size,
            timeout,
            barriers: AtomicU64::new(0),
            local_addr,
        };
        store.request(Request::Hello { rank: rank as u32 }, "hello")?;
        Ok(store)
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

    /// Waits (up to the timeout) for `key` to be set and returns its value.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        let request = Request::Get {
            key: key.into(),
            timeout_ms: self.timeout.as_millis() as u64,
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
            timeout_ms: self.timeout.as_millis() as u64,
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
                let names = |ranks: &[usize]| {
                    ranks
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                };
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
            self.timeout + Duration::from_secs(5)
        } else {
            self.timeout.max(Duration::from_secs(5))
        };
        let lost = |source| CommError::StoreLost {
            rank: self.rank,
            endpoint: self.endpoint.clone(),
            key: key.to_string(),
            source,
        };
        conn.0
            .get_ref()
            .set_read_timeout(Some(read_timeout))
            .map_err(lost)?;
        write_frame(&mut conn.1, &request.encode()).map_err(lost)?;
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
            response => Ok(response),
        }
    }

    fn unexpected(&self, key: &str, response: Response) -> CommError {
        CommError::Peer(format!(
            "the store at {} answered '{key}' with {response:?}",
            self.endpoint
        ))
    }
}
