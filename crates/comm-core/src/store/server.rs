//! The store's server side: rank 0 binds MASTER_PORT and answers every rank's requests, one thread
//! per connection. A connection that sends a malformed or oversized frame is closed; the server and
//! the other connections go on.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufReader, BufWriter};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::frame::{read_frame, write_frame, Request, Response};
use crate::error::{CommError, Result};

#[derive(Default)]
struct State {
    values: HashMap<String, Vec<u8>>,
    /// Ranks that said hello, for timeout messages.
    ranks_seen: BTreeSet<u32>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    world_size: usize,
    stopping: AtomicBool,
    /// Open client connections; rank 0 waits for them to close before it exits.
    connections: Mutex<usize>,
    left: Condvar,
}

/// A running store server; dropping it stops accepting new connections.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl StoreServer {
    /// Serves on every interface at `port` (0 picks a free one). `world_size` is only used to say
    /// which ranks are missing when a wait times out.
    pub fn bind(port: u16, world_size: usize) -> Result<StoreServer> {
        let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
                format!(
                    "; another job or a leftover process holds port {port}: pick another with --master-port or MASTER_PORT"
                )
            } else {
                String::new()
            };
            CommError::io(
                format!("rank 0 cannot serve the rendezvous store on 0.0.0.0:{port}{hint}"),
                e,
            )
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| CommError::io("store listener address", e))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            world_size,
            stopping: AtomicBool::new(false),
            connections: Mutex::new(0),
            left: Condvar::new(),
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
    for stream in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let shared = shared.clone();
        *shared.connections.lock().unwrap() += 1;
        let _ = std::thread::Builder::new()
            .name("store-conn".into())
            .spawn(move || {
                serve(stream, &shared);
                *shared.connections.lock().unwrap() -= 1;
                shared.left.notify_all();
            });
    }
}

/// Answers one connection until it closes or misbehaves.
fn serve(stream: TcpStream, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut writer = BufWriter::new(write_half);
    loop {
        let Ok(payload) = read_frame(&mut reader) else {
            return;
        };
        let Ok(request) = Request::decode(&payload) else {
            return;
        };
        let response = answer(shared, request);
        if write_frame(&mut writer, &response.encode()).is_err() {
            return;
        }
    }
}

fn answer(shared: &Shared, request: Request) -> Response {
    let mut state = shared.state.lock().unwrap();
    match request {
        Request::Hello { rank } => {
            state.ranks_seen.insert(rank);
            Response::Ok
        }
        Request::Set { key, value } => {
            state.values.insert(key, value);
            shared.changed.notify_all();
            Response::Ok
        }
        Request::Get { key, timeout_ms } => {
            match wait_for(shared, state, std::slice::from_ref(&key), timeout_ms) {
                Ok(state) => Response::Value(state.values[&key].clone()),
                Err((detail, missing)) => Response::Timeout { detail, missing },
            }
        }
        Request::Wait { keys, timeout_ms } => match wait_for(shared, state, &keys, timeout_ms) {
            Ok(_) => Response::Ok,
            Err((detail, missing)) => Response::Timeout { detail, missing },
        },
        Request::Add { key, delta } => {
            let current = state
                .values
                .get(&key)
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok())
                .unwrap_or(0);
            let new = current.wrapping_add(delta);
            state.values.insert(key, new.to_string().into_bytes());
            shared.changed.notify_all();
            Response::Number(new)
        }
        Request::Check { keys } => {
            Response::Bool(keys.iter().all(|k| state.values.contains_key(k)))
        }
        Request::Delete { key } => Response::Bool(state.values.remove(&key).is_some()),
    }
}

/// Blocks until every key exists or the timeout passes; on timeout returns who had connected
/// (as text) and the ranks that never did.
fn wait_for<'a>(
    shared: &Shared,
    mut state: MutexGuard<'a, State>,
    keys: &[String],
    timeout_ms: u64,
) -> std::result::Result<MutexGuard<'a, State>, (String, Vec<u32>)> {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    while !keys.iter().all(|k| state.values.contains_key(k)) {
        let now = Instant::now();
        if now >= deadline {
            return Err(who_arrived(&state.ranks_seen, shared.world_size));
        }
        state = shared
            .changed
            .wait_timeout(state, deadline - now)
            .unwrap()
            .0;
    }
    Ok(state)
}

fn who_arrived(seen: &BTreeSet<u32>, world_size: usize) -> (String, Vec<u32>) {
    let list = |v: Vec<String>| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    let present: Vec<String> = seen.iter().map(u32::to_string).collect();
    let missing: Vec<u32> = (0..world_size as u32)
        .filter(|r| !seen.contains(r))
        .collect();
    let text = format!(
        "ranks connected to the store: {} of {world_size}; never connected: {}",
        list(present),
        list(missing.iter().map(u32::to_string).collect())
    );
    (text, missing)
}
