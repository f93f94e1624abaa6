//! What this rank is doing now, in words: when the job ends under a rank (another rank vanished,
//! the store went away), the line it prints says what it was doing then, so a student can tell
//! a rank lost while the links were being built from one lost in the middle of an all-reduce.
//!
//! One relaxed atomic store per change: cheap enough to mark every collective call.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::collective::Collective;

/// The phases of a rank's life, after which a collective call's own code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Before the rendezvous, or in the program's own code between the steps below.
    Working = 0,
    /// Meeting the other ranks at the store.
    Rendezvous,
    /// Building a communicator: the CPU backend's links, or the first exchange of a backend.
    Connecting,
    /// Inside NCCL's communicator init.
    NcclInit,
    /// Waiting for every rank at the end of the job.
    Finishing,
    /// In a communicator's barrier.
    Barrier,
}

/// A collective call is coded as this plus its index in the collective table.
const FIRST_COLLECTIVE: u8 = 16;

static NOW: AtomicU8 = AtomicU8::new(Phase::Working as u8);

/// This rank now enters `phase`.
pub fn enter(phase: Phase) {
    NOW.store(phase as u8, Ordering::Relaxed);
}

/// This rank now runs a call of `collective`.
pub fn enter_collective(collective: Collective) {
    NOW.store(FIRST_COLLECTIVE + collective as u8, Ordering::Relaxed);
}

/// What this rank is doing now, as words that follow "while this rank was".
pub fn now() -> String {
    describe(NOW.load(Ordering::Relaxed))
}

fn describe(code: u8) -> String {
    let phase = |p: Phase| p as u8;
    match code {
        c if c == phase(Phase::Rendezvous) => "meeting the others at the store (rendezvous)".into(),
        c if c == phase(Phase::Connecting) => "connecting to the other ranks".into(),
        c if c == phase(Phase::NcclInit) => "in NCCL's communicator init".into(),
        c if c == phase(Phase::Finishing) => "finishing (waiting for every rank)".into(),
        c if c == phase(Phase::Barrier) => "in a barrier".into(),
        c if c >= FIRST_COLLECTIVE => Collective::ALL
            .get(usize::from(c - FIRST_COLLECTIVE))
            .map_or_else(|| "in a collective".into(), |c| format!("in {}", c.name())),
        _ => "in its own code between collectives".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_and_collective_reads_as_words() {
        assert_eq!(
            describe(Phase::Working as u8),
            "in its own code between collectives"
        );
        assert_eq!(
            describe(Phase::NcclInit as u8),
            "in NCCL's communicator init"
        );
        for c in Collective::ALL {
            assert_eq!(
                describe(FIRST_COLLECTIVE + c as u8),
                format!("in {}", c.name())
            );
        }
    }
}
