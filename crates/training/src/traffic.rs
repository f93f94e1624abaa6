//! What a group's collectives moved and what they cost a rank: counted by the trainers of
//! examples 06 and 07, per group, and printed per step.

use std::time::Duration;

/// What one group's collectives moved and cost, so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Collective calls.
    pub calls: u64,
    /// Bytes they all-reduced (each call's buffer, as nccl-tests' size column).
    pub bytes: u64,
    /// Time this rank's main thread was blocked in them.
    pub waited: Duration,
}

impl Traffic {
    /// What moved since `before`.
    pub fn since(&self, before: &Traffic) -> Traffic {
        Traffic {
            calls: self.calls - before.calls,
            bytes: self.bytes - before.bytes,
            waited: self.waited.saturating_sub(before.waited),
        }
    }

    /// `tp 0: 2 all-reduces, 36.0 KB, waited 0.41 ms`: what group `group` moved and cost.
    pub fn describe(&self, group: &str) -> String {
        let kb = self.bytes as f64 / 1024.0;
        let size = match kb < 1024.0 {
            true => format!("{kb:.1} KB"),
            false => format!("{:.2} MB", kb / 1024.0),
        };
        format!(
            "{group}: {} all-reduce{}, {size}, waited {:.2} ms",
            self.calls,
            if self.calls == 1 { "" } else { "s" },
            self.waited.as_secs_f64() * 1e3
        )
    }
}
