//! Every rank's watcher: a second connection to the store, blocked in a WAIT for the job's abort
//! key. When a rank ends the job, or the store itself goes away (rank 0 killed), the watcher
//! hears it at once, ends this rank's pending and later requests with that reason, and tells the
//! hook a [`crate::job::Job`] installs, which stops the rank even if it is busy elsewhere.

use std::io::ErrorKind;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::client::{Client, Reason};
use super::connection::Conn;
use super::membership;
use super::wire::{self, Answer, Command, Shape};
use crate::error::CommError;
use crate::heartbeat::went_silent;

type EndHook = Box<dyn FnOnce(CommError) + Send>;

/// What the watcher's thread shares with the store.
struct Watch {
    hook: Mutex<Option<EndHook>>,
    stopping: AtomicBool,
}

/// The running watcher; dropping it stops it without calling the hook.
pub(super) struct Watcher {
    watch: Arc<Watch>,
    stream: TcpStream,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    /// This end of the watcher's connection.
    pub(super) fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.stream.local_addr().ok()
    }

    /// Starts the watcher on `conn`, its own connection: a WAIT for the abort key that only the
    /// job's end or the store's loss answers. It ends `client`'s requests when either comes.
    pub(super) fn start(client: &Client, mut conn: Conn) -> std::io::Result<Watcher> {
        let abort_key = client.wired(membership::ABORT_KEY);
        let watch = Arc::new(Watch {
            hook: Mutex::new(None),
            stopping: AtomicBool::new(false),
        });
        let shared = watch.clone();
        let (rank, endpoint) = (client.rank(), client.endpoint().to_string());
        let silence = client.heartbeat().silence();
        let ender = client.ender()?;
        let stream = conn.stream.try_clone()?;
        let thread = std::thread::Builder::new()
            .name("store-watcher".into())
            .spawn(move || {
                let ended = match watch_for_abort(&mut conn, &abort_key) {
                    Ok(value) => Ended::Aborted(value),
                    Err(_) if shared.stopping.load(Ordering::SeqCst) => return,
                    Err(e) if went_silent(&e) => Ended::Silent(silence),
                    Err(e) => Ended::Lost(
                        e.kind(),
                        format!(
                            "the store closed the connection ({e}), noticed by this rank's watcher"
                        ),
                    ),
                };
                let reason: Reason = Arc::new(move |key: &str| ended.error(rank, &endpoint, key));
                // A request blocked on the store ends now, with the reason above.
                ender.end(reason.clone());
                if let Some(hook) = shared.hook.lock().unwrap().take() {
                    hook(reason("the job"));
                }
            })?;
        Ok(Watcher {
            watch,
            stream,
            thread: Some(thread),
        })
    }

    /// Calls `hook` once, from the watcher's thread, when the job ends (at once, from this
    /// thread, if `client` was ended already).
    pub(super) fn when_job_ends(&self, client: &Client, hook: EndHook) {
        *self.watch.hook.lock().unwrap() = Some(hook);
        if let Some(error) = client.ended("the job") {
            if let Some(hook) = self.watch.hook.lock().unwrap().take() {
                hook(error);
            }
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.watch.stopping.store(true, Ordering::SeqCst);
        let _ = self.stream.shutdown(Shutdown::Both);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What ended the job, as the watcher heard it.
enum Ended {
    /// A rank (or our server, for a rank that vanished) wrote the abort key: its value.
    Aborted(Vec<u8>),
    /// The watcher's connection broke: the store is gone.
    Lost(ErrorKind, String),
    /// Nothing came from the store, not even an answer to the heartbeat, for this long.
    Silent(Duration),
}

impl Ended {
    /// The error rank `rank` fails with once the job ended, for its request about `key`.
    fn error(&self, rank: usize, endpoint: &str, key: &str) -> CommError {
        match self {
            Ended::Aborted(value) => membership::reason(rank, value),
            Ended::Silent(silence) => CommError::StoreSilent {
                rank,
                endpoint: endpoint.to_string(),
                silence: *silence,
                phase: crate::phase::now(),
            },
            Ended::Lost(kind, text) => CommError::StoreLost {
                rank,
                endpoint: endpoint.to_string(),
                key: key.to_string(),
                source: std::io::Error::new(*kind, text.clone()),
            },
        }
    }
}

/// The watcher's one request: WAIT for the abort key, then GET it.
fn watch_for_abort(conn: &mut Conn, abort_key: &str) -> std::io::Result<Vec<u8>> {
    conn.stream.set_read_timeout(None)?;
    let keys = vec![abort_key.to_string()];
    conn.send(&[Command::Wait { keys }])?;
    if conn.read(Shape::Waited)? != Answer::StopWaiting {
        return Err(wire::odd("a WAIT answered oddly"));
    }
    conn.stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let key = abort_key.to_string();
    conn.send(&[Command::Get { key }])?;
    conn.value()
}
