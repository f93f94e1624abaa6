//! An algorithm counted: its steps, the bytes through one rank's link and the bytes one rank
//! reduces, for a call of `s` bytes on `n` ranks (the structures of Thakur, Rabenseifner and
//! Gropp). Each algorithm's [`Schedule`] sits in its family's file, beside the function that runs
//! it, and is read three ways: the function takes its number of steps from it, so `--steps`
//! shows "step i of N" with the same N; [`choice`](super::choice) lists a collective's schedules
//! (the algorithms `--algo` names); comm-bench's α–β model fits a measured curve through its
//! counts (`comm-bench model`).

use super::choice::Algo;
use crate::collective::Collective;
use crate::named::Named;

/// How one CPU algorithm of one collective moves a call's bytes.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// The collective it runs.
    pub(super) collective: Collective,
    /// Its name, as `--algo` takes it; `None` for the registered algorithms, which the buffers
    /// choose (`--copy`), not `--algo`.
    pub(super) algo: Option<Algo>,
    /// Its counts as a reader writes them (`ring: 2(n−1) steps of s/n`).
    pub(super) words: &'static str,
    /// Messages one after another on one rank's critical path, for `bytes` on `n` ranks: the
    /// steps the algorithm runs.
    pub(super) steps: fn(bytes: usize, n: usize) -> usize,
    /// Bytes through one rank's link, for `s` bytes on `n` ranks (fractions of a byte where
    /// `s` does not split evenly: the model's continuous form).
    pub(super) link_bytes: fn(s: f64, n: f64) -> f64,
    /// Bytes one rank reduces, for `s` bytes on `n` ranks.
    pub(super) reduced_bytes: fn(s: f64, n: f64) -> f64,
}

impl Schedule {
    /// The collective it runs.
    pub fn collective(&self) -> Collective {
        self.collective
    }

    /// Its name, as `--algo` takes it (`None`: the registered algorithms).
    pub fn algo(&self) -> Option<Algo> {
        self.algo
    }

    /// Its name as tables print it: `--algo`'s, or "registered".
    pub fn name(&self) -> &'static str {
        self.algo.map_or("registered", |a| a.name())
    }

    /// Its counts in words (`ring: 2(n−1) steps of s/n`), as `comm-bench model` prints them.
    pub fn words(&self) -> &'static str {
        self.words
    }

    /// Steps one after another for a call of `bytes` on `n` ranks (each a message's latency).
    pub fn steps(&self, bytes: usize, n: usize) -> usize {
        (self.steps)(bytes, n)
    }

    /// Bytes through one rank's link for a call of `bytes` on `n` ranks.
    pub fn link_bytes(&self, bytes: f64, n: usize) -> f64 {
        (self.link_bytes)(bytes, n as f64)
    }

    /// Bytes one rank reduces for a call of `bytes` on `n` ranks.
    pub fn reduced_bytes(&self, bytes: f64, n: usize) -> f64 {
        (self.reduced_bytes)(bytes, n as f64)
    }
}

/// No bytes reduced: the reduced count of an algorithm that only moves data.
pub(super) fn nothing(_: f64, _: f64) -> f64 {
    0.0
}
