//! The store's key-value client, its third layer (mini-redis's commands): TCPStore's commands on
//! one connection, against our server or torchrun's, with the errors a user reads. It knows
//! nothing of jobs; the session (`session.rs`) builds one on top.
//!
//! Keys travel as PyTorch's client sends them: a `/` in front (TCPStore's own prefix), after the
//! namespace if there is one ([`wire_key`]). Under torchrun that namespace is
//! `/worker/attempt_<n>`, the `PrefixStore` torch's own workers put over the agent's store, so
//! each restart of the worker group meets under fresh keys; Python reads ours through the same
//! two wrappers.
//!
//! A request blocked on the store can be ended from another thread with a reason ([`Ender`]):
//! the session's watcher does, when it hears that the job ended.

use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::connection::{connect_until, Conn};
use super::wire::{self, wire_key, Command, MAX_VALUE_BYTES};
use crate::deadline::Deadline;
use crate::error::{CommError, Result};
use crate::heartbeat::{went_silent, Heartbeat};

/// Why requests end early: the error for a request about a key, made in the requester's thread.
pub(super) type Reason = Arc<dyn Fn(&str) -> CommError + Send + Sync>;

/// A connection to a TCPStore, speaking for one rank (named in its errors).
pub(super) struct Client {
    conn: Mutex<Conn>,
    /// The same socket, to interrupt a blocked request.
    interrupt: TcpStream,
    ended: Arc<Mutex<Option<Reason>>>,
    endpoint: String,
    namespace: String,
    rank: usize,
    timeout: Duration,
    /// How the connection is probed: a store silent this long is lost.
    beat: Heartbeat,
    local_addr: SocketAddr,
}

/// Ends a [`Client`]'s pending and later requests, from any thread.
pub(super) struct Ender {
    ended: Arc<Mutex<Option<Reason>>>,
    socket: TcpStream,
}

impl Ender {
    /// Fails the client's requests with `reason` from now on; one blocked now ends at once.
    pub(super) fn end(&self, reason: Reason) {
        *self.ended.lock().unwrap() = Some(reason);
        let _ = self.socket.shutdown(Shutdown::Both);
    }
}

impl Client {
    /// Connects to the store at `endpoint`, retrying until `deadline` (the store may not be up
    /// yet, may be full of a stranger's silent connections, or this process or the server may
    /// be out of file descriptors for a moment), probed as `beat` says.
    pub(super) fn connect(
        endpoint: &str,
        rank: usize,
        namespace: &str,
        (timeout, deadline): (Duration, Deadline),
        beat: Heartbeat,
    ) -> Result<Client> {
        let conn = connect_until(endpoint, deadline, beat).map_err(|source| {
            CommError::StoreUnreachable {
                rank,
                endpoint: endpoint.to_string(),
                timeout,
                source,
            }
        })?;
        let lost = |source| CommError::StoreLost {
            rank,
            endpoint: endpoint.to_string(),
            key: "joining".into(),
            source,
        };
        Ok(Client {
            interrupt: conn.stream.try_clone().map_err(lost)?,
            local_addr: conn.stream.local_addr().map_err(lost)?,
            conn: Mutex::new(conn),
            ended: Arc::new(Mutex::new(None)),
            endpoint: endpoint.to_string(),
            namespace: namespace.to_string(),
            rank,
            timeout,
            beat,
        })
    }

    /// How the connection is probed.
    pub(super) fn heartbeat(&self) -> Heartbeat {
        self.beat
    }

    /// A handle that ends this client's requests from another thread.
    pub(super) fn ender(&self) -> std::io::Result<Ender> {
        Ok(Ender {
            ended: self.ended.clone(),
            socket: self.interrupt.try_clone()?,
        })
    }

    /// The error a request about `key` fails with, once an [`Ender`] ended this client.
    pub(super) fn ended(&self, key: &str) -> Option<CommError> {
        let reason = self.ended.lock().unwrap().clone();
        reason.map(|reason| reason(key))
    }

    pub(super) fn rank(&self) -> usize {
        self.rank
    }

    pub(super) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub(super) fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The key on the wire for `key`, under this client's namespace.
    pub(super) fn wired(&self, key: &str) -> String {
        wire_key(&self.namespace, key)
    }

    fn wired_all(&self, keys: &[&str]) -> Vec<String> {
        keys.iter().map(|k| self.wired(k)).collect()
    }

    /// SET: `key` holds `value`, and whoever waits for it wakes.
    pub(super) fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.check_value(key, value)?;
        let set = self.set_command(key, value);
        self.call(key, |c| c.confirmed(vec![set]))
    }

    /// A SET and an APPEND in one write, confirmed together.
    pub(super) fn set_then_append(
        &self,
        key: &str,
        value: &[u8],
        list: &str,
        line: &[u8],
    ) -> Result<()> {
        self.check_value(key, value)?;
        let append = Command::Append {
            key: self.wired(list),
            value: line.to_vec(),
        };
        let set = self.set_command(key, value);
        self.call(key, |c| c.confirmed(vec![set, append]))
    }

    /// A SET alone, unconfirmed (TCPStore does not answer a SET), given up after `within`, and
    /// not sent at all while another request holds the connection. Best effort.
    pub(super) fn set_unconfirmed(&self, key: &str, value: &[u8], within: Duration) {
        let set = self.set_command(key, value);
        if let Ok(mut conn) = self.conn.try_lock() {
            let _ = conn.stream.set_write_timeout(Some(within));
            let _ = conn.send(&[set]);
        }
    }

    fn set_command(&self, key: &str, value: &[u8]) -> Command {
        Command::Set {
            key: self.wired(key),
            value: value.to_vec(),
        }
    }

    /// APPEND: adds `value` to what `key` holds (or sets it).
    pub(super) fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.check_value(key, value)?;
        let append = Command::Append {
            key: self.wired(key),
            value: value.to_vec(),
        };
        self.call(key, |c| c.confirmed(vec![append]))
    }

    /// MULTI_SET: several keys in one request.
    pub(super) fn multi_set(&self, pairs: &[(&str, &[u8])]) -> Result<()> {
        let mut wired = Vec::with_capacity(pairs.len());
        for (key, value) in pairs {
            self.check_value(key, value)?;
            wired.push((self.wired(key), value.to_vec()));
        }
        let multi_set = Command::MultiSet { pairs: wired };
        self.call("(multi_set)", |c| c.confirmed(vec![multi_set]))
    }

    /// GET, without waiting: TCPStore answers an empty value for a key not set.
    pub(super) fn get(&self, key: &str) -> Result<Vec<u8>> {
        let get = Command::Get {
            key: self.wired(key),
        };
        self.call(key, |c| {
            c.send(&[get])?;
            c.value()
        })
    }

    /// MULTI_GET, without waiting: each value in order, empty for a key not set.
    pub(super) fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        self.values(&self.wired_all(keys), &keys.join(", "))
    }

    fn values(&self, wired: &[String], what: &str) -> Result<Vec<Vec<u8>>> {
        let multi_get = Command::MultiGet {
            keys: wired.to_vec(),
        };
        self.call(what, |c| {
            c.send(&[multi_get])?;
            c.values(wired.len())
        })
    }

    /// Which of `keys` are set: (their indices, the others'). One MULTI_GET without a WAIT, so
    /// the keys asked about must never hold an empty value.
    pub(super) fn present(&self, keys: &[String]) -> Result<(Vec<usize>, Vec<usize>)> {
        let wired: Vec<String> = keys.iter().map(|k| self.wired(k)).collect();
        let values = self.values(&wired, "(who arrived)")?;
        Ok((0..keys.len()).partition(|&i| !values[i].is_empty()))
    }

    /// WAIT: true once every key is set, false after `timeout` (the wait withdrawn).
    pub(super) fn wait(&self, keys: &[&str], timeout: Duration) -> Result<bool> {
        let wired = self.wired_all(keys);
        self.call(&keys.join(", "), |c| c.wait(wired, timeout))
    }

    /// ADD: `delta` added to the number at `key` (0 if unset); the result.
    pub(super) fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let add = Command::Add {
            key: self.wired(key),
            delta,
        };
        self.call(key, |c| {
            c.send(&[add])?;
            c.number()
        })
    }

    /// COMPARE_SET: `desired` if `key` holds `expected` (or is unset and `expected` is empty);
    /// what it holds afterwards.
    pub(super) fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>> {
        self.check_value(key, desired)?;
        let compare_set = Command::CompareSet {
            key: self.wired(key),
            expected: expected.to_vec(),
            desired: desired.to_vec(),
        };
        self.call(key, |c| {
            c.send(&[compare_set])?;
            c.value()
        })
    }

    /// Several COMPARE_SETs of unset keys and then a CHECK, sent in one write and answered in
    /// order: one round trip where one each would take several. `what` names them in errors.
    pub(super) fn compare_sets_then_check(
        &self,
        sets: &[(&str, &[u8])],
        check: &str,
        what: &str,
    ) -> Result<(Vec<Vec<u8>>, bool)> {
        let mut requests = Vec::with_capacity(sets.len() + 1);
        for (key, desired) in sets {
            self.check_value(key, desired)?;
            requests.push(Command::CompareSet {
                key: self.wired(key),
                expected: Vec::new(),
                desired: desired.to_vec(),
            });
        }
        requests.push(Command::Check {
            keys: vec![self.wired(check)],
        });
        self.call(what, |c| {
            c.send(&requests)?;
            let now = sets
                .iter()
                .map(|_| c.value())
                .collect::<std::io::Result<_>>()?;
            Ok((now, c.ready()?))
        })
    }

    /// CHECK: whether every key is set, without waiting.
    pub(super) fn check(&self, keys: &[&str]) -> Result<bool> {
        let check = Command::Check {
            keys: self.wired_all(keys),
        };
        self.call(&keys.join(", "), |c| {
            c.send(&[check])?;
            c.ready()
        })
    }

    /// DELETE_KEY: whether it was there.
    pub(super) fn delete(&self, key: &str) -> Result<bool> {
        let delete = Command::Delete {
            key: self.wired(key),
        };
        self.call(key, |c| {
            c.send(&[delete])?;
            Ok(c.number()? > 0)
        })
    }

    /// A DELETE_KEY per key, in one write; how many were there.
    pub(super) fn delete_all(&self, keys: &[&str]) -> Result<usize> {
        if keys.is_empty() {
            return Ok(0);
        }
        let deletes: Vec<Command> = keys
            .iter()
            .map(|k| Command::Delete { key: self.wired(k) })
            .collect();
        self.call(&keys.join(", "), |c| {
            c.send(&deletes)?;
            keys.iter()
                .try_fold(0, |n, _| Ok(n + (c.number()? > 0) as usize))
        })
    }

    /// GETNUMKEYS: keys in the whole store (every namespace).
    pub(super) fn num_keys(&self) -> Result<i64> {
        self.call("(num_keys)", |c| {
            c.send(&[Command::NumKeys])?;
            c.number()
        })
    }

    fn check_value(&self, key: &str, value: &[u8]) -> Result<()> {
        if value.len() > MAX_VALUE_BYTES || self.wired(key).len() > wire::MAX_KEY_BYTES {
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
    /// the reason the client was ended for, if it was, else a timeout or a lost store.
    fn call<T>(
        &self,
        key: &str,
        exchange: impl FnOnce(&mut Conn) -> std::io::Result<T>,
    ) -> Result<T> {
        if let Some(ended) = self.ended(key) {
            return Err(ended);
        }
        let mut conn = self.conn.lock().unwrap();
        let read_timeout = self.timeout.max(Duration::from_secs(5));
        conn.stream
            .set_read_timeout(Some(read_timeout))
            .and_then(|()| exchange(&mut conn))
            .map_err(|e| {
                if let Some(ended) = self.ended(key) {
                    return ended;
                }
                if went_silent(&e) {
                    return CommError::StoreSilent {
                        rank: self.rank,
                        endpoint: self.endpoint.clone(),
                        silence: self.beat.silence(),
                        phase: crate::phase::now(),
                    };
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
}
