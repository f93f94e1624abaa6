//! Keys under one prefix, as PyTorch's `PrefixStore` gives each part of a job a namespace of its
//! own: the communicator's `comm0`, its CPU transport's `comm0/cpu`, shared memory's
//! `comm0/cpu/shm`. Every key a part of comm-core sets or reads is made here, from its scope and
//! a name (`addr`), or a name and an index (`addr/3`: one per rank).

use std::fmt::Display;

use super::session::Store;
use crate::error::Result;

/// The store, seen under one prefix (see the module's documentation).
#[derive(Clone)]
pub struct Scoped<'a> {
    store: &'a Store,
    prefix: String,
    /// Who meets under this prefix when not the whole job: this rank's place in a group and
    /// the group's size (a split's communicator, see [`Scoped::among`]).
    seat: Option<(usize, usize)>,
}

impl Store {
    /// This store under `prefix`.
    pub fn scoped(&self, prefix: &str) -> Scoped<'_> {
        Scoped {
            store: self,
            prefix: prefix.to_string(),
            seat: None,
        }
    }
}

impl<'a> Scoped<'a> {
    /// The store underneath: its rank, timeout and address.
    pub fn store(&self) -> &'a Store {
        self.store
    }

    /// A narrower scope: `name` under this one.
    pub fn scoped(&self, name: &str) -> Scoped<'a> {
        Scoped {
            seat: self.seat,
            ..self.store.scoped(&self.key(name))
        }
    }

    /// This scope as the meeting place of a group of `size` ranks of the job, this one its
    /// `rank`: its barriers wait for the group only, and its rank 0 is the group's. How a
    /// split's communicator connects its own links (`crate::group`).
    pub fn among(&self, rank: usize, size: usize) -> Scoped<'a> {
        Scoped {
            seat: Some((rank, size)),
            ..self.clone()
        }
    }

    /// This rank's place and the number of ranks that meet here: the group's, else the job's.
    pub fn seat(&self) -> (usize, usize) {
        self.seat
            .unwrap_or((self.store.rank(), self.store.world_size()))
    }

    /// The whole key of `name` in this scope.
    pub fn key(&self, name: impl Display) -> String {
        format!("{}/{name}", self.prefix)
    }

    /// The whole key of `name`'s entry `index` (one per rank, host, ...).
    pub fn key_at(&self, name: &str, index: impl Display) -> String {
        self.key(format_args!("{name}/{index}"))
    }

    /// Sets `name`.
    pub fn set(&self, name: &str, value: &[u8]) -> Result<()> {
        self.store.set(&self.key(name), value)
    }

    /// Waits for `name` and returns its value.
    pub fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.store.get(&self.key(name))
    }

    /// Sets `name`'s entry `index`.
    pub fn set_at(&self, name: &str, index: impl Display, value: &[u8]) -> Result<()> {
        self.store.set(&self.key_at(name, index), value)
    }

    /// Waits for `name`'s entries `indices` and returns their values in order.
    pub fn get_at<I: Display>(
        &self,
        name: &str,
        indices: impl IntoIterator<Item = I>,
    ) -> Result<Vec<Vec<u8>>> {
        let keys: Vec<String> = indices.into_iter().map(|i| self.key_at(name, i)).collect();
        self.store
            .multi_get(&keys.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Deletes `name`'s entries `indices`.
    pub fn delete_at<I: Display>(
        &self,
        name: &str,
        indices: impl IntoIterator<Item = I>,
    ) -> Result<usize> {
        let keys: Vec<String> = indices.into_iter().map(|i| self.key_at(name, i)).collect();
        self.store
            .delete_all(&keys.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Adds `delta` to the counter `name` and returns its new value.
    pub fn add(&self, name: &str, delta: i64) -> Result<i64> {
        self.store.add(&self.key(name), delta)
    }

    /// A barrier of every rank that meets here (see [`Scoped::seat`]) under `name`.
    pub fn barrier(&self, name: &str) -> Result<()> {
        let (rank, size) = self.seat();
        self.store.barrier_among(&self.key(name), rank, size)
    }

    /// Rank 0's `value` under `name` (see [`Store::rank0_value`]); in a group, the group's
    /// rank 0.
    pub fn rank0_value(&self, name: &str, value: &str) -> Result<String> {
        if self.seat().0 != 0 {
            return Ok(String::from_utf8_lossy(&self.get(name)?).into_owned());
        }
        self.set(name, value.as_bytes())?;
        Ok(value.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreServer;
    use std::time::Duration;

    #[test]
    fn keys_nest_under_their_scope() {
        let server = StoreServer::bind(0, 1).unwrap();
        let store = Store::connect("127.0.0.1", server.port(), 0, 1, Duration::from_secs(5));
        let store = store.unwrap();
        let comm = store.scoped("comm0");
        let cpu = comm.scoped("cpu");
        assert_eq!(cpu.key("transport"), "comm0/cpu/transport");
        assert_eq!(cpu.key_at("addr", 3), "comm0/cpu/addr/3");
        cpu.set_at("addr", 0, b"a").unwrap();
        cpu.set_at("addr", 1, b"b").unwrap();
        assert_eq!(store.get("comm0/cpu/addr/1").unwrap(), b"b");
        assert_eq!(
            cpu.get_at("addr", 0..2).unwrap(),
            [b"a".to_vec(), b"b".to_vec()]
        );
        assert_eq!(cpu.delete_at("addr", 0..2).unwrap(), 2);
    }
}
