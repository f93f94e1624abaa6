//! A rank's session with the store, its top layer: the key-value client (`client.rs`) plus what
//! makes it this job's. Joining checks that the rank belongs to the job (`membership.rs`), a
//! watcher hears at once when the job ends (`watcher.rs`), and on top of TCPStore's commands come
//! the waits a user reads (a timeout names who never joined), the job's index of keys, barriers,
//! rank 0's value, aborting and leaving.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use super::client::Client;
use super::connection::{connect_until, Conn};
use super::membership::{self, Membership};
use super::watcher::Watcher;
use crate::deadline::Deadline;
use crate::error::{rank_list, CommError, Result};
use crate::heartbeat::Heartbeat;

/// A rank's connection to the rendezvous store.
pub struct Store {
    client: Client,
    world_size: usize,
    /// Barriers passed so far, by name: the next one's generation.
    barriers: Mutex<HashMap<String, u64>>,
    watcher: Option<Watcher>,
    /// Whether this rank was let into the job (its join checks passed).
    member: bool,
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
        Self::join(host, port, &who, timeout, Heartbeat::default())
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
    ///
    /// Both connections are probed as `beat` says: a store unheard for its bound is lost
    /// ([`CommError::StoreSilent`]), whatever this rank is doing.
    pub fn join(
        host: &str,
        port: u16,
        who: &Membership<'_>,
        timeout: Duration,
        beat: Heartbeat,
    ) -> Result<Store> {
        let endpoint = format!("{host}:{port}");
        let deadline = Deadline::after(timeout);
        let client = Client::connect(
            &endpoint,
            who.rank,
            who.namespace,
            (timeout, deadline),
            beat,
        )?;
        let mut store = Store {
            client,
            world_size: who.world_size,
            barriers: Mutex::default(),
            watcher: None,
            member: false,
        };
        // The watcher's connection is opened now and confirmed after joining, so that its
        // round trip overlaps the joining ones.
        let watcher = Conn::start(&endpoint, Duration::from_secs(5), beat);
        membership::join(&store.client, who)?;
        store.member = true;
        let lost = |source| CommError::StoreLost {
            rank: who.rank,
            endpoint: endpoint.clone(),
            key: "joining".into(),
            source,
        };
        let watcher = match watcher.and_then(Conn::confirm) {
            Ok(conn) => conn,
            Err(_) => connect_until(&endpoint, deadline, beat).map_err(lost)?,
        };
        store.watcher = Some(Watcher::start(&store.client, watcher).map_err(lost)?);
        Ok(store)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.client.rank()
    }

    /// Ranks in the job.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The store's `host:port`.
    pub fn endpoint(&self) -> &str {
        self.client.endpoint()
    }

    /// This end of the connection.
    pub fn local_addr(&self) -> SocketAddr {
        self.client.local_addr()
    }

    /// This end of both of this rank's connections to the store: its requests' and its
    /// watcher's (what rank 0's server counts as its own while it lingers).
    pub fn own_addrs(&self) -> Vec<SocketAddr> {
        let watcher = self.watcher.as_ref().and_then(Watcher::local_addr);
        std::iter::once(self.local_addr()).chain(watcher).collect()
    }

    /// The local address of this connection: an address of this host that the master can reach,
    /// so peers on other nodes likely can too.
    pub fn local_ip(&self) -> std::net::IpAddr {
        self.local_addr().ip()
    }

    /// The longest any wait through this store may take.
    pub fn timeout(&self) -> Duration {
        self.client.timeout()
    }

    /// Says that this rank leaves the job knowingly (it finished, or failed and said why): its
    /// connections closing is then no news to our server, which otherwise takes a rank whose
    /// connection closes for one that vanished and ends the job (`membership.rs`). Best effort.
    pub fn leave(&self) {
        let _ = self.set(&membership::left_key(self.rank()), b"");
    }

    /// Calls `hook` once, from the watcher's thread, when another rank ends the job or the store
    /// goes away (at once if that happened already). Not called after this store is dropped.
    pub fn when_job_ends(&self, hook: impl FnOnce(CommError) + Send + 'static) {
        if let Some(watcher) = &self.watcher {
            watcher.when_job_ends(&self.client, Box::new(hook));
        }
    }

    /// Ends the job for every rank with this rank's `error` as the reason (unless a rank gave
    /// one already). Best effort: the store may be gone.
    pub fn abort(&self, error: &CommError) {
        membership::abort(&self.client, error);
    }

    /// Sets `key` to `value`, replacing any earlier value, and wakes every rank waiting for it.
    ///
    /// The key is also listed, with this rank, in the job's index (`job/keys`, one `<rank> <key>`
    /// line each; barriers' own keys aside), so that someone reading the store from outside can
    /// tell which keys there are and who wrote them: TCPStore has no command that lists keys.
    /// The APPEND travels in the same write as the SET.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        if key.starts_with("barrier/") {
            return self.client.set(key, value);
        }
        let line = format!("{} {key}\n", self.rank());
        let index = membership::INDEX_KEY;
        self.client
            .set_then_append(key, value, index, line.as_bytes())
    }

    /// Appends `value` to what `key` holds (or sets it).
    pub fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.client.append(key, value)
    }

    /// Sets several keys in one request.
    pub fn multi_set(&self, pairs: &[(&str, &[u8])]) -> Result<()> {
        self.client.multi_set(pairs)
    }

    /// Rank 0's `value` under `key`: rank 0 sets its own and gets it back, every other rank
    /// waits for it. How ranks check that they were all given the same setting (the caller
    /// compares and names the difference).
    pub fn rank0_value(&self, key: &str, value: &str) -> Result<String> {
        if self.rank() == 0 {
            self.set(key, value.as_bytes())?;
            return Ok(value.to_string());
        }
        Ok(String::from_utf8_lossy(&self.get(key)?).into_owned())
    }

    /// Waits (up to the timeout) for `key` to be set and returns its value.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.get_within(key, self.timeout())
    }

    /// [`Store::get`] with its own timeout.
    pub fn get_within(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait_within(&[key], timeout)?;
        self.client.get(key)
    }

    /// Waits (up to the timeout) for every key, then returns their values in order.
    pub fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.wait(keys)?;
        self.client.multi_get(keys)
    }

    /// Waits (up to the timeout) until every key is set.
    pub fn wait(&self, keys: &[&str]) -> Result<()> {
        self.wait_within(keys, self.timeout())
    }

    fn wait_within(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        if self.client.wait(keys, timeout)? {
            return Ok(());
        }
        let what = keys.join(", ");
        Err(membership::wait_timed_out(
            &self.client,
            self.world_size,
            &what,
            timeout,
        ))
    }

    /// Atomically adds `delta` to the number stored at `key` (0 if unset) and returns the result.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.client.add(key, delta)
    }

    /// Sets `key` to `desired` if it holds `expected` (or is unset and `expected` is empty), and
    /// returns what it holds afterwards (TCPStore's compare_set).
    pub fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.client.compare_set(key, expected, desired)
    }

    /// Whether every key is set, without waiting.
    pub fn check(&self, keys: &[&str]) -> Result<bool> {
        self.client.check(keys)
    }

    /// Removes `key`; returns whether it was there.
    pub fn delete(&self, key: &str) -> Result<bool> {
        self.client.delete(key)
    }

    /// Removes every key, in one round trip; returns how many were there.
    pub fn delete_all(&self, keys: &[&str]) -> Result<usize> {
        self.client.delete_all(keys)
    }

    /// Keys in the whole store (every namespace).
    pub fn num_keys(&self) -> Result<i64> {
        self.client.num_keys()
    }

    /// Returns once every rank has called `barrier` with the same name the same number of times.
    /// On timeout the error lists which ranks had arrived.
    pub fn barrier(&self, name: &str) -> Result<()> {
        self.barrier_among(name, self.rank(), self.world_size)
    }

    /// [`Store::barrier`] of a group of `size` ranks of the job, this one its `rank` (a
    /// split's ranks, which the others do not wait for): every rank of the group calls it with
    /// the same name the same number of times. Generations count per name, so ranks that pass
    /// different groups' barriers still meet at the job's.
    pub fn barrier_among(&self, name: &str, rank: usize, size: usize) -> Result<()> {
        let generation = {
            let mut barriers = self.barriers.lock().unwrap_or_else(|e| e.into_inner());
            let passed = barriers.entry(name.to_string()).or_default();
            *passed += 1;
            *passed - 1
        };
        let base = format!("barrier/{name}/{generation}");
        self.set(&format!("{base}/rank/{rank}"), b"here")?;
        let done = format!("{base}/done");
        if self.add(&format!("{base}/count"), 1)? == size as i64 {
            self.set(&done, b"")?;
        }
        match self.wait(&[&done]) {
            Err(CommError::Timeout { timeout, .. }) => {
                let keys: Vec<String> = (0..size).map(|r| format!("{base}/rank/{r}")).collect();
                let (arrived, missing) = self.client.present(&keys)?;
                Err(CommError::Timeout {
                    what: format!("barrier '{name}' on rank {rank}"),
                    timeout,
                    detail: format!(
                        "; arrived: ranks {} of {size}; missing: ranks {} (did they fail or start late?)",
                        rank_list(arrived),
                        rank_list(missing.iter().copied())
                    ),
                    missing,
                })
            }
            other => other,
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Dropped in order, this rank leaves knowingly: the SET alone, unconfirmed (the server
        // reads it before this connection's end), and given up after 100 ms, so that dropping a
        // store never waits on a store that is stuck or gone. Dropped by a panic, or never
        // dropped (a killed process), its connection closing is news the server passes on.
        // Only a member leaves: a rank refused at its join (another run's, a duplicate) must not
        // write this job's key for the rank it claimed.
        if self.member && !std::thread::panicking() {
            let left = membership::left_key(self.rank());
            self.client
                .set_unconfirmed(&left, b"", Duration::from_millis(100));
        }
        // The watcher stops before this rank's connection closes, so it never hears of it.
        drop(self.watcher.take());
    }
}
