//! How a rank waits for its peers of the host (a free slot, a full one, a barrier): it spins
//! briefly, yields its core, then sleeps on a doorbell (a futex) until a peer rings it. While it
//! sleeps it wakes every few milliseconds to check the deadline and whether a peer's TCP link
//! has closed (the peer died or failed), so a dead peer is an error within milliseconds and a
//! stopped one a timeout.
//!
//! How long each stage lasts depends on the host ([`Pacing`]): where every rank has a core of its
//! own, yielding for a while keeps the wake-up cheap; where ranks outnumber cores (`-n 16` on a
//! 2-core laptop), a waiting rank that yields still runs, taking turns with the ranks that have
//! work, so it goes to sleep after its spins and leaves the cores to them.

use std::time::{Duration, Instant};

use super::ring::Doorbell;
use crate::backend::cpu::context::Context;
use crate::backend::cpu::tcp::TcpTransport;
use crate::backend::cpu::transport::Deadline;
use crate::error::{CommError, Result};

/// Spins before yielding: short waits (a peer a slot behind) cost no system call.
const SPINS: u32 = 64;
/// Measured on 2 and 4 ranks of a 2-core VM (`comm-bench --collectives all -b 8 -e 64M -f 4`,
/// `-z 0` against `-z 3`): with 50 yields and then sleeps, back-to-back calls cost up to 7x a call
/// on its own (a rank woken from its futex after each barrier); yielding for 2 ms brings that
/// within 1.2x on 2 ranks for all but 7 of 192 rows.
const YIELDING: Duration = Duration::from_millis(2);
/// The longest a sleeping rank goes without checking the deadline and its peers.
const NAP: Duration = Duration::from_millis(5);

/// How long a waiting rank spins and yields before it sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pacing {
    spins: u32,
    yielding: Duration,
}

impl Pacing {
    /// For `ranks` ranks on a host whose processes may run on `cores` cores: [`SPINS`] spins,
    /// then [`YIELDING`] of yields where every rank has a core, none where they outnumber them.
    pub(crate) fn for_host(ranks: usize, cores: usize) -> Pacing {
        Pacing {
            spins: SPINS,
            yielding: match ranks > cores {
                true => Duration::ZERO,
                false => YIELDING,
            },
        }
    }
}

/// The cores this process may run on (its affinity mask, or the machine's).
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// What a wait needs besides its condition: the rank's shared state (deadline, first failure),
/// its TCP links (how a dead peer shows) and its pacing.
pub(crate) struct Waiter<'a> {
    pub(crate) ctx: &'a Context,
    pub(crate) tcp: &'a TcpTransport,
    pub(crate) pacing: Pacing,
}

impl Waiter<'_> {
    /// Waits until `ready()` holds, checked after every ring of `bell`. While it sleeps it
    /// checks the deadline, the peers in `watch` (their TCP links closing means they died or
    /// failed; `doing` says, for the error, what waited on whom) and `astray()` (a peer seen in
    /// another call than this rank's: its error); at the deadline the error is `timed_out()`'s.
    pub(crate) fn wait(
        &self,
        bell: Doorbell,
        deadline: Deadline,
        mut ready: impl FnMut() -> bool,
        watch: &[(usize, &'static str)],
        mut astray: impl FnMut() -> Option<CommError>,
        timed_out: impl FnOnce() -> CommError,
    ) -> Result<()> {
        let mut round = 0u32;
        let mut yielding_since = None;
        loop {
            let seen = bell.seen();
            if ready() {
                return Ok(());
            }
            round += 1;
            if round <= self.pacing.spins {
                std::hint::spin_loop();
                continue;
            }
            let since = *yielding_since.get_or_insert_with(Instant::now);
            if since.elapsed() < self.pacing.yielding {
                std::thread::yield_now();
                continue;
            }
            self.ctx.check()?;
            // A peer in another call first: it may have failed on it and exited.
            let found = astray().or_else(|| {
                let (peer, doing) = *watch.iter().find(|&&(p, _)| self.tcp.peer_closed(p))?;
                let rank = self.ctx.rank();
                Some(CommError::PeerClosed { rank, peer, doing })
            });
            if let Some(settled) = look_again(found, &mut ready) {
                return settled.map_err(|e| self.ctx.fail(e));
            }
            let Some(nap) = deadline.wait_at_most(NAP) else {
                return Err(self.ctx.fail(timed_out()));
            };
            bell.sleep(seen, nap);
        }
    }

    /// The timeout error for waiting on `missing` while `doing` (" while rank 0 was receiving
    /// from it").
    pub(crate) fn timeout(&self, what: String, missing: Vec<usize>) -> CommError {
        CommError::Timeout {
            what,
            timeout: self.ctx.timeout(),
            detail: " (is that rank stuck, or did the ranks call different collectives?)".into(),
            missing,
        }
    }
}

/// What a wait does once its look at the peers `found` a sign of trouble (a closed link, a
/// peer in another call): `None` where there is none (wait on); else it looks at `ready()` once
/// more, and a wait that is over is no failure. A peer that did its part closes its link, or
/// posts its next call, after its last write to shared memory: the last barrier of a job,
/// passed by a fast rank that then exits while a slow one, between its look at the barrier and
/// its look at the peers, has not seen it pass. The second look tells that peer from one that
/// died or went astray mid-call.
fn look_again(
    found: Option<CommError>,
    ready: &mut impl FnMut() -> bool,
) -> Option<std::result::Result<(), CommError>> {
    let e = found?;
    Some(if ready() { Ok(()) } else { Err(e) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_finished_and_exited_is_not_a_failure() {
        let closed = || CommError::PeerClosed {
            rank: 0,
            peer: 3,
            doing: "receiving from",
        };
        // Rank 3 exited after the write this rank waits for.
        assert!(matches!(
            look_again(Some(closed()), &mut || true),
            Some(Ok(()))
        ));
        // Still not ready once its link is seen closed: it died before its part.
        let failed = look_again(Some(closed()), &mut || false);
        assert!(matches!(
            failed,
            Some(Err(CommError::PeerClosed { peer: 3, .. }))
        ));
        // Nothing found: wait on, without another look at the condition.
        assert!(look_again(None, &mut || panic!("looked")).is_none());
    }

    #[test]
    fn ranks_that_outnumber_cores_sleep_without_yielding() {
        assert_eq!(Pacing::for_host(2, 2).yielding, YIELDING);
        assert_eq!(Pacing::for_host(3, 2).yielding, Duration::ZERO);
        assert_eq!(Pacing::for_host(8, 16).yielding, YIELDING);
    }
}
