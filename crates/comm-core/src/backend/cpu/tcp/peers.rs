//! Which peers this rank has a link to, and how a pair's link comes to be exactly one: it opens
//! when the pair first talks (as NCCL connects a peer when a ring, a tree or a send first needs
//! it), dialled by whichever side needs it first. A rank's own threads wait while one of them
//! dials; the rank's acceptor (`handshake.rs`) takes the dials of peers.
//!
//! Both sides may dial at once. Then the lower rank's dial is the link: the lower rank answers
//! the higher one's hello with a tie ("use mine"), and the higher rank accepts the lower one's
//! even while it dials itself ([`verdict`]). A second hello claiming a rank whose dial was
//! accepted already is a stranger, or a second process given that rank.

use std::sync::{Arc, Condvar, Mutex, OnceLock};

use super::hello::Verdict;
use super::link::Link;
use crate::deadline::Deadline;

/// Where a pair's link stands, as this rank sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Nobody has dialled yet.
    Idle,
    /// A thread of this rank is dialling the peer.
    Dialing,
    /// This rank's dial lost a tie: the peer's own dial is coming, and will be the link.
    Awaiting,
    /// This rank accepted the peer's dial and is finishing its handshake.
    Accepting,
    /// Open, dialled by this rank.
    Dialed,
    /// Open, dialled by the peer.
    Accepted,
}

/// What this rank answers a hello from `peer` when its link to `peer` is in `state`
/// (`me` is this rank): the rule that leaves each pair one link.
pub(super) fn verdict(me: usize, peer: usize, state: State) -> Answer {
    match state {
        State::Idle | State::Awaiting => Answer::Accept,
        // Both dial: the lower rank's dial wins.
        State::Dialing if me > peer => Answer::Accept,
        State::Dialing | State::Dialed => Answer::Tie,
        State::Accepting | State::Accepted => Answer::Duplicate,
    }
}

/// [`verdict`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    /// This dial becomes the link.
    Accept,
    /// This rank's own dial is (or will be) the link.
    Tie,
    /// The peer's rank has a link from another dial already: a stranger, or a second process
    /// with that rank.
    Duplicate,
}

impl Answer {
    /// The verdict sent back for it (a duplicate's reason is the caller's).
    pub(super) fn wire(self, why: impl FnOnce() -> String) -> Verdict {
        match self {
            Answer::Accept => Verdict::Accepted,
            Answer::Tie => Verdict::Tie,
            Answer::Duplicate => Verdict::Refused(why()),
        }
    }
}

/// One peer's link and where it stands.
struct Slot {
    /// Set once, when the link opens: read without a lock on every send and receive.
    link: OnceLock<Arc<Link>>,
    state: Mutex<State>,
    changed: Condvar,
}

/// Every peer's slot (this rank's own is never used).
pub(super) struct Peers {
    slots: Vec<Slot>,
}

/// What a thread that needs a link is to do.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Turn {
    /// It is open.
    Open,
    /// Dial it: this thread has the turn (the state is now [`State::Dialing`]).
    Dial,
    /// Someone else is opening it: ask again (after checking for failures).
    Wait,
}

impl Peers {
    pub(super) fn new(world_size: usize) -> Peers {
        let slots = (0..world_size)
            .map(|_| Slot {
                link: OnceLock::new(),
                state: Mutex::new(State::Idle),
                changed: Condvar::new(),
            })
            .collect();
        Peers { slots }
    }

    /// The link to `peer`, if it is open.
    pub(super) fn get(&self, peer: usize) -> Option<&Arc<Link>> {
        self.slots[peer].link.get()
    }

    /// Every open link.
    pub(super) fn open(&self) -> impl Iterator<Item = &Arc<Link>> {
        self.slots.iter().filter_map(|s| s.link.get())
    }

    /// How many links are open.
    pub(super) fn count(&self) -> usize {
        self.open().count()
    }

    /// Whether the link to `peer` is open, is this thread's to dial, or is being opened by
    /// someone else (then after waiting a little for it); `None` once `deadline` has passed.
    pub(super) fn turn(&self, peer: usize, deadline: Deadline) -> Option<Turn> {
        let slot = &self.slots[peer];
        let mut state = slot.state.lock().unwrap();
        if slot.link.get().is_some() {
            return Some(Turn::Open);
        }
        if deadline.passed() {
            return None;
        }
        if *state == State::Idle {
            *state = State::Dialing;
            return Some(Turn::Dial);
        }
        // A short wait: a failure recorded elsewhere is checked by the caller between them.
        let wait = deadline.wait_at_most(std::time::Duration::from_millis(100))?;
        let _unused = slot.changed.wait_timeout(state, wait).unwrap();
        Some(Turn::Wait)
    }

    /// The acceptor's decision on a hello from `peer` (`me` is this rank): on
    /// [`Answer::Accept`] the state becomes [`State::Accepting`] until [`Peers::install`] or
    /// [`Peers::give_up`].
    pub(super) fn decide(&self, me: usize, peer: usize) -> Answer {
        let mut state = self.slots[peer].state.lock().unwrap();
        let answer = verdict(me, peer, *state);
        if answer == Answer::Accept {
            *state = State::Accepting;
        }
        answer
    }

    /// This rank's dial lost a tie: the peer's dial will be the link.
    pub(super) fn await_peer(&self, peer: usize) {
        let mut state = self.slots[peer].state.lock().unwrap();
        if *state == State::Dialing {
            *state = State::Awaiting;
        }
    }

    /// The link to `peer` is open (`dialed`: by this rank): every thread waiting for it goes on.
    pub(super) fn install(&self, peer: usize, link: Link, dialed: bool) -> Arc<Link> {
        let slot = &self.slots[peer];
        let mut state = slot.state.lock().unwrap();
        let link = slot.link.get_or_init(|| Arc::new(link)).clone();
        *state = match dialed {
            true => State::Dialed,
            false => State::Accepted,
        };
        slot.changed.notify_all();
        link
    }

    /// This rank's dial to `peer` failed: true when that does not matter, because the peer's
    /// own dial was accepted meanwhile and is (becoming) the link (the peer may even have
    /// finished and closed the losing dial's connection); otherwise as [`Peers::give_up`].
    pub(super) fn dial_failed(&self, peer: usize) -> bool {
        let state = *self.slots[peer].state.lock().unwrap();
        if matches!(state, State::Accepting | State::Accepted) {
            return true;
        }
        self.give_up(peer);
        false
    }

    /// A dial or an accepted handshake with `peer` failed: anyone may dial again.
    pub(super) fn give_up(&self, peer: usize) {
        let slot = &self.slots[peer];
        let mut state = slot.state.lock().unwrap();
        if slot.link.get().is_none() {
            *state = State::Idle;
        }
        slot.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every order in which two ranks' dials and hellos can meet leaves one link, the same on
    /// both sides.
    #[test]
    fn each_pair_ends_with_one_link_whoever_dials() {
        use Answer::*;
        // Nobody else dials: accepted, from either side.
        assert_eq!(verdict(0, 1, State::Idle), Accept);
        assert_eq!(verdict(1, 0, State::Idle), Accept);
        // Both dial: rank 0 (lower) says tie to rank 1's dial; rank 1 accepts rank 0's.
        assert_eq!(verdict(0, 1, State::Dialing), Tie);
        assert_eq!(verdict(1, 0, State::Dialing), Accept);
        // Rank 1 heard the tie first and now awaits rank 0's dial.
        assert_eq!(verdict(1, 0, State::Awaiting), Accept);
        // Rank 1's dial arrives after rank 0's was accepted and its link opened.
        assert_eq!(verdict(0, 1, State::Dialed), Tie);
        // A second dial claiming a rank whose dial was accepted: not that rank.
        assert_eq!(verdict(0, 1, State::Accepted), Duplicate);
        assert_eq!(verdict(0, 1, State::Accepting), Duplicate);
    }

    #[test]
    fn a_thread_dials_once_and_the_others_wait_for_its_link() {
        let peers = Peers::new(2);
        let soon = Deadline::after(std::time::Duration::from_millis(300));
        assert_eq!(peers.turn(1, soon), Some(Turn::Dial));
        // Another thread of this rank finds it being dialled, and waits until the deadline.
        while let Some(turn) = peers.turn(1, soon) {
            assert_eq!(turn, Turn::Wait);
        }
        assert!(
            !peers.dial_failed(1),
            "nobody else opens it: it is idle again"
        );
        assert_eq!(peers.turn(1, soon), None, "the deadline has passed");
        let later = Deadline::after(std::time::Duration::from_secs(5));
        assert_eq!(peers.turn(1, later), Some(Turn::Dial));
        assert_eq!(peers.decide(0, 1), Answer::Tie);
        assert_eq!(peers.count(), 0);
    }

    /// Rank 1 dials rank 0 while rank 0 dials rank 1: rank 1 accepts rank 0's dial, and its own
    /// dial failing afterwards (rank 0 done and gone) is no failure of the pair.
    #[test]
    fn a_losing_dial_that_fails_leaves_the_winning_one() {
        let peers = Peers::new(2);
        let soon = Deadline::after(std::time::Duration::from_secs(5));
        assert_eq!(peers.turn(0, soon), Some(Turn::Dial));
        assert_eq!(peers.decide(1, 0), Answer::Accept);
        assert!(peers.dial_failed(0), "rank 0's dial is the link");
        assert_eq!(peers.decide(1, 0), Answer::Duplicate);
    }
}
