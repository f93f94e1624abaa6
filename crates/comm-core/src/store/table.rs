//! The store's data (mini-redis's `db.rs`): the key-value table, its bounds, and who waits for
//! which keys, with TCPStore's meaning for every request. It knows nothing of sockets: the
//! server's poll loop (`server.rs`) hands it each decoded request with the id of the connection
//! that sent it, sends back the answer it gives, and tells the connections whose WAIT a request
//! completed ([`Table::take_woken`]) that they may stop waiting.
//!
//! A WAIT is a registration, not a blocked thread: the connection is answered when the last of
//! its keys is set, and CANCEL_WAIT (or a new WAIT, or the connection closing) withdraws it, so
//! the waiter lists hold only live waits however many come and go.

use std::collections::HashMap;

use super::wire::{self, Answer, Command};

/// Which connection sent a request: the server's name for it.
pub(super) type ConnId = u64;

/// Bookkeeping a stored entry costs beyond its key and value, counted against the byte bound.
const ENTRY_OVERHEAD: usize = 64;

/// What the table may hold (the server's [`super::StoreLimits`] that concern data).
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    /// Keys stored at once.
    pub(super) max_keys: usize,
    /// Bytes of one value.
    pub(super) max_value_bytes: usize,
    /// Bytes of all keys and values together, with [`ENTRY_OVERHEAD`] per entry.
    pub(super) max_stored_bytes: usize,
}

/// A request the table refuses (a bound, an ADD to a key holding no number): why, in words. It
/// changed nothing but what came before it in the same request (MULTI_SET's earlier pairs).
#[derive(Debug, PartialEq)]
pub(super) struct Refused(pub(super) String);

/// A connection's pending WAIT.
struct Wait {
    /// The keys it waits for that were not set when it began.
    keys: Vec<String>,
    /// How many of them are still not set.
    missing: usize,
}

/// The keys, their values and their waiters.
pub(super) struct Table {
    bounds: Bounds,
    values: HashMap<String, Vec<u8>>,
    /// Bytes of keys and values (plus overhead) held in `values`.
    stored_bytes: usize,
    /// Key → connections whose WAIT includes it.
    waiters: HashMap<String, Vec<ConnId>>,
    /// Connection → its pending WAIT.
    waits: HashMap<ConnId, Wait>,
    /// Connections whose WAIT ended since [`Table::take_woken`] was last called.
    woken: Vec<ConnId>,
}

impl Table {
    pub(super) fn new(bounds: Bounds) -> Table {
        Table {
            bounds,
            values: HashMap::new(),
            stored_bytes: 0,
            waiters: HashMap::new(),
            waits: HashMap::new(),
            woken: Vec::new(),
        }
    }

    /// What is stored, under wire keys.
    pub(super) fn values(&self) -> &HashMap<String, Vec<u8>> {
        &self.values
    }

    /// Bytes held in keys and values, with the per-entry overhead: what the byte bound bounds.
    pub(super) fn stored_bytes(&self) -> usize {
        self.stored_bytes
    }

    /// Keys some connection waits for.
    pub(super) fn awaited_keys(&self) -> usize {
        self.waiters.len()
    }

    /// The connections whose WAIT requests have completed since the last call: each is owed
    /// [`Answer::StopWaiting`].
    pub(super) fn take_woken(&mut self) -> Vec<ConnId> {
        std::mem::take(&mut self.woken)
    }

    /// Carries out `request` from connection `id`: the answer it is owed now, if any. A WAIT
    /// not yet satisfied is answered later, through [`Table::take_woken`].
    pub(super) fn execute(
        &mut self,
        id: ConnId,
        request: Command,
    ) -> Result<Option<Answer>, Refused> {
        let answer = match request {
            // The connection's handshake: the server's business, never the table's.
            Command::Validate { .. } => None,
            Command::Ping { nonce } => Some(Answer::Nonce(nonce)),
            Command::Set { key, value } => {
                self.set(key, value)?;
                None
            }
            Command::CompareSet {
                key,
                expected,
                desired,
            } => Some(self.compare_set(key, &expected, desired)?),
            Command::Get { key } => Some(Answer::Value(self.get(&key))),
            Command::Add { key, delta } => Some(self.add(key, delta)?),
            Command::Check { keys } => {
                let ready = keys.iter().all(|k| self.values.contains_key(k));
                Some(Answer::Ready(ready))
            }
            Command::Wait { keys } => self.wait(id, keys),
            Command::NumKeys => Some(Answer::Number(self.values.len() as i64)),
            Command::Delete { key } => Some(self.delete(&key)),
            Command::Append { key, value } => {
                let mut whole = self.get(&key);
                whole.extend_from_slice(&value);
                self.set(key, whole)?;
                None
            }
            Command::MultiGet { keys } => {
                let values = keys.iter().map(|key| self.get(key)).collect();
                Some(Answer::Values(values))
            }
            Command::MultiSet { pairs } => {
                for (key, value) in pairs {
                    self.set(key, value)?;
                }
                None
            }
            Command::CancelWait => {
                self.forget(id);
                Some(Answer::WaitCanceled)
            }
        };
        Ok(answer)
    }

    /// The value at `key`; empty when unset (clients WAIT first, as TCPStore's do).
    fn get(&self, key: &str) -> Vec<u8> {
        self.values.get(key).cloned().unwrap_or_default()
    }

    /// SET: stores `value` at `key` if the bounds allow it, and wakes whoever waits for it.
    pub(super) fn set(&mut self, key: String, value: Vec<u8>) -> Result<(), Refused> {
        self.store(key.clone(), value)?;
        self.wake_waiters(&key);
        Ok(())
    }

    /// COMPARE_SET, with PyTorch's semantics (`wire::compare_set`); waiters wake either way.
    fn compare_set(
        &mut self,
        key: String,
        expected: &[u8],
        desired: Vec<u8>,
    ) -> Result<Answer, Refused> {
        let now = self.values.get(&key).map(Vec::as_slice);
        let (answer, changed) = wire::compare_set(now, expected, &desired);
        if changed {
            self.store(key.clone(), desired)?;
        }
        self.wake_waiters(&key);
        Ok(Answer::Value(answer))
    }

    /// ADD: the key's decimal number (0 when missing) plus `delta`; a key holding anything else
    /// is refused.
    fn add(&mut self, key: String, delta: i64) -> Result<Answer, Refused> {
        let now = match self.values.get(&key) {
            None => 0,
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .ok_or_else(|| Refused(format!("ADD to '{key}', which holds no number")))?,
        };
        let new = now.wrapping_add(delta);
        self.set(key, new.to_string().into_bytes())?;
        Ok(Answer::Number(new))
    }

    /// DELETE_KEY: answers 1 if the key was there.
    fn delete(&mut self, key: &str) -> Answer {
        let deleted = match self.values.remove(key) {
            Some(value) => {
                self.stored_bytes -= entry_bytes(key, &value);
                1
            }
            None => 0,
        };
        Answer::Number(deleted)
    }

    /// Stores `value` at `key` if the bounds allow it; otherwise says which bound.
    fn store(&mut self, key: String, value: Vec<u8>) -> Result<(), Refused> {
        let bounds = self.bounds;
        let over = |what: &str, max: usize| {
            Refused(format!(
                "setting '{key}' would exceed its bound of {max} {what}"
            ))
        };
        if value.len() > bounds.max_value_bytes {
            return Err(over("value bytes", bounds.max_value_bytes));
        }
        let old = self.values.get(&key).map(|v| entry_bytes(&key, v));
        if old.is_none() && self.values.len() >= bounds.max_keys {
            return Err(over("keys", bounds.max_keys));
        }
        let total = self.stored_bytes - old.unwrap_or(0) + entry_bytes(&key, &value);
        if total > bounds.max_stored_bytes {
            return Err(over("stored bytes", bounds.max_stored_bytes));
        }
        self.stored_bytes = total;
        self.values.insert(key, value);
        Ok(())
    }

    /// WAIT: answered now if every key is set, else when the last one is. A connection waits
    /// for one WAIT at a time (its client is blocked on it); a new one replaces the old.
    fn wait(&mut self, id: ConnId, keys: Vec<String>) -> Option<Answer> {
        self.forget(id);
        let missing: Vec<String> = keys
            .into_iter()
            .filter(|k| !self.values.contains_key(k))
            .collect();
        if missing.is_empty() {
            return Some(Answer::StopWaiting);
        }
        for key in &missing {
            self.waiters.entry(key.clone()).or_default().push(id);
        }
        let wait = Wait {
            missing: missing.len(),
            keys: missing,
        };
        self.waits.insert(id, wait);
        None
    }

    /// Withdraws connection `id`'s pending WAIT, if any (cancelled, replaced, or the connection
    /// closed).
    pub(super) fn forget(&mut self, id: ConnId) {
        let Some(wait) = self.waits.remove(&id) else {
            return;
        };
        for key in wait.keys {
            if let Some(ids) = self.waiters.get_mut(&key) {
                ids.retain(|&waiting| waiting != id);
                if ids.is_empty() {
                    self.waiters.remove(&key);
                }
            }
        }
    }

    /// `key` is set: every WAIT that was missing only it is over.
    fn wake_waiters(&mut self, key: &str) {
        let Some(ids) = self.waiters.remove(key) else {
            return;
        };
        for id in ids {
            let Some(wait) = self.waits.get_mut(&id) else {
                continue;
            };
            wait.missing = wait.missing.saturating_sub(1);
            if wait.missing == 0 {
                self.waits.remove(&id);
                self.woken.push(id);
            }
        }
    }
}

fn entry_bytes(key: &str, value: &[u8]) -> usize {
    key.len() + value.len() + ENTRY_OVERHEAD
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        Table::new(Bounds {
            max_keys: 4,
            max_value_bytes: 100,
            max_stored_bytes: 400,
        })
    }

    fn run(table: &mut Table, id: ConnId, request: Command) -> Option<Answer> {
        table.execute(id, request).expect("within the bounds")
    }

    fn set(key: &str, value: &[u8]) -> Command {
        Command::Set {
            key: key.into(),
            value: value.to_vec(),
        }
    }

    fn wait(keys: &[&str]) -> Command {
        Command::Wait {
            keys: keys.iter().map(|k| k.to_string()).collect(),
        }
    }

    #[test]
    fn values_are_read_back_as_tcpstore_answers() {
        let mut t = table();
        assert_eq!(run(&mut t, 1, set("k", b"v")), None);
        let get = |key: &str| Command::Get { key: key.into() };
        assert_eq!(run(&mut t, 2, get("k")), Some(Answer::Value(b"v".to_vec())));
        assert_eq!(
            run(&mut t, 2, get("unset")),
            Some(Answer::Value(Vec::new()))
        );
        let add = |delta| Command::Add {
            key: "n".into(),
            delta,
        };
        assert_eq!(run(&mut t, 1, add(5)), Some(Answer::Number(5)));
        assert_eq!(run(&mut t, 1, add(-7)), Some(Answer::Number(-2)));
        assert_eq!(t.values()["n"], b"-2");
        let append = Command::Append {
            key: "k".into(),
            value: b"w".to_vec(),
        };
        assert_eq!(run(&mut t, 1, append), None);
        let both = Command::MultiGet {
            keys: vec!["k".into(), "n".into()],
        };
        let values = Answer::Values(vec![b"vw".to_vec(), b"-2".to_vec()]);
        assert_eq!(run(&mut t, 1, both), Some(values));
        assert_eq!(run(&mut t, 1, Command::NumKeys), Some(Answer::Number(2)));
        let check = Command::Check {
            keys: vec!["k".into(), "gone".into()],
        };
        assert_eq!(run(&mut t, 1, check), Some(Answer::Ready(false)));
        let delete = || Command::Delete { key: "k".into() };
        assert_eq!(run(&mut t, 1, delete()), Some(Answer::Number(1)));
        assert_eq!(run(&mut t, 1, delete()), Some(Answer::Number(0)));
        assert_eq!(t.stored_bytes(), entry_bytes("n", b"-2"));
    }

    #[test]
    fn a_wait_is_answered_when_the_last_of_its_keys_is_set() {
        let mut t = table();
        run(&mut t, 1, set("a", b""));
        // Already set: answered at once.
        assert_eq!(run(&mut t, 7, wait(&["a"])), Some(Answer::StopWaiting));
        assert_eq!(run(&mut t, 7, wait(&["a", "b", "c"])), None);
        assert_eq!(t.awaited_keys(), 2);
        run(&mut t, 1, set("b", b""));
        assert!(t.take_woken().is_empty());
        // COMPARE_SET wakes waiters whether or not it changed the value.
        let cas = Command::CompareSet {
            key: "c".into(),
            expected: b"x".to_vec(),
            desired: b"y".to_vec(),
        };
        assert_eq!(run(&mut t, 1, cas), Some(Answer::Value(b"x".to_vec())));
        assert_eq!(t.take_woken(), vec![7]);
        assert!(t.take_woken().is_empty(), "told once");
        assert_eq!(t.awaited_keys(), 0);
    }

    #[test]
    fn cancelled_replaced_and_abandoned_waits_leave_nothing_behind() {
        let mut t = table();
        assert_eq!(run(&mut t, 1, wait(&["a", "a", "b"])), None);
        assert_eq!(
            run(&mut t, 1, Command::CancelWait),
            Some(Answer::WaitCanceled)
        );
        assert_eq!(t.awaited_keys(), 0);
        run(&mut t, 1, wait(&["a"]));
        run(&mut t, 1, wait(&["b"])); // replaces the wait for a
        run(&mut t, 2, wait(&["b"]));
        assert_eq!(t.awaited_keys(), 1);
        t.forget(2); // connection 2 closed
        run(&mut t, 3, set("a", b""));
        assert!(t.take_woken().is_empty(), "1 no longer waits for a");
        run(&mut t, 3, set("b", b""));
        assert_eq!(t.take_woken(), vec![1]);
        assert_eq!(t.awaited_keys(), 0);
    }

    #[test]
    fn a_request_over_a_bound_changes_nothing_and_says_which() {
        let mut t = table();
        let refusal = |r: Result<Option<Answer>, Refused>| r.unwrap_err().0;
        let big = refusal(t.execute(1, set("k", &[0; 101])));
        assert_eq!(big, "setting 'k' would exceed its bound of 100 value bytes");
        for k in ["a", "b", "c", "d"] {
            run(&mut t, 1, set(k, b""));
        }
        let fifth = refusal(t.execute(1, set("e", b"")));
        assert_eq!(fifth, "setting 'e' would exceed its bound of 4 keys");
        // Replacing a key is no new key; bytes are bounded in all.
        run(&mut t, 1, set("a", &[0; 100]));
        let bytes = refusal(t.execute(1, set("b", &[0; 100])));
        assert_eq!(
            bytes,
            "setting 'b' would exceed its bound of 400 stored bytes"
        );
        let add = Command::Add {
            key: "a".into(),
            delta: 1,
        };
        assert_eq!(
            refusal(t.execute(1, add)),
            "ADD to 'a', which holds no number"
        );
        assert_eq!(t.values()["b"], b"");
    }

    #[test]
    fn a_multi_set_refused_half_way_still_wakes_who_its_first_pairs_satisfied() {
        let mut t = table();
        run(&mut t, 2, wait(&["ok"]));
        let pairs = vec![("ok".to_string(), Vec::new()), ("big".into(), vec![0; 101])];
        assert!(t.execute(1, Command::MultiSet { pairs }).is_err());
        assert!(t.values().contains_key("ok") && !t.values().contains_key("big"));
        assert_eq!(t.take_woken(), vec![2]);
    }
}
