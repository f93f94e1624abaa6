//! What a rank's transports share, as gloo's `Context` is shared by its pairs: who the rank is,
//! the deadline of the collective call under way, and the first failure. A failure on any path
//! (a TCP link, a shared-memory ring) is recorded once, here, and ends every path at once: each
//! transport registers how to free its blocked threads ([`Context::on_failure`]), and every later
//! operation fails with the first error.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::transport::{CallClock, Deadline};
use crate::error::{CommError, Result};

/// Frees the threads blocked on one transport's paths (TCP: shuts its links).
type Hook = Box<dyn Fn() + Send + Sync>;

/// One rank's shared transport state (see the module's documentation).
pub struct Context {
    rank: usize,
    world_size: usize,
    clock: CallClock,
    first_failure: Mutex<Option<CommError>>,
    hooks: Mutex<Vec<Hook>>,
}

impl Context {
    /// Rank `rank` of `world_size`, each collective call with `timeout`.
    pub fn new(rank: usize, world_size: usize, timeout: Duration) -> Arc<Context> {
        Arc::new(Context {
            rank,
            world_size,
            clock: CallClock::new(timeout),
            first_failure: Mutex::new(None),
            hooks: Mutex::new(Vec::new()),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group, this one included.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The timeout each collective call has.
    pub fn timeout(&self) -> Duration {
        self.clock.timeout()
    }

    /// The deadline of the operation starting now: the call's, or its own.
    pub fn deadline(&self) -> Deadline {
        self.clock.deadline()
    }

    /// A collective call begins (see [`Transport::begin_call`](super::Transport::begin_call)).
    pub fn begin_call(&self) -> bool {
        self.clock.begin()
    }

    /// The call under way ends.
    pub fn end_call(&self) {
        self.clock.end()
    }

    /// The first failure again, if there was one.
    pub fn check(&self) -> Result<()> {
        match &*self.first_failure.lock().unwrap() {
            Some(first) => Err(replay(first)),
            None => Ok(()),
        }
    }

    /// Records `e` as the first failure and frees every thread blocked on any path (the hooks);
    /// if a failure came first, `e` is its consequence and that one is returned.
    pub fn fail(&self, e: CommError) -> CommError {
        let mut first = self.first_failure.lock().unwrap();
        if let Some(first) = &*first {
            return replay(first);
        }
        *first = Some(replay(&e));
        drop(first);
        for hook in self.hooks.lock().unwrap().iter() {
            hook();
        }
        e
    }

    /// Runs `hook` at the first failure.
    pub fn on_failure(&self, hook: impl Fn() + Send + Sync + 'static) {
        self.hooks.lock().unwrap().push(Box::new(hook));
    }
}

/// A copy of an error a transport made (they are not `Clone`: an I/O error is copied as its
/// kind and text).
fn replay(e: &CommError) -> CommError {
    match e {
        CommError::Timeout {
            what,
            timeout,
            detail,
            missing,
        } => CommError::Timeout {
            what: what.clone(),
            timeout: *timeout,
            detail: detail.clone(),
            missing: missing.clone(),
        },
        CommError::PeerClosed { rank, peer, doing } => CommError::PeerClosed {
            rank: *rank,
            peer: *peer,
            doing,
        },
        CommError::Io { context, source } => CommError::Io {
            context: context.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        CommError::PeerSilent {
            rank,
            peer,
            host,
            doing,
            silence,
            phase,
        } => CommError::PeerSilent {
            rank: *rank,
            peer: *peer,
            host: host.clone(),
            doing,
            silence: *silence,
            phase: phase.clone(),
        },
        CommError::PeerUnreachable {
            rank,
            peer,
            addr,
            source,
        } => CommError::PeerUnreachable {
            rank: *rank,
            peer: *peer,
            addr: addr.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        CommError::ForeignPeer {
            rank,
            from,
            claimed,
            their_run,
            our_run,
            their_world,
            our_world,
        } => CommError::ForeignPeer {
            rank: *rank,
            from: from.clone(),
            claimed: *claimed,
            their_run: their_run.clone(),
            our_run: our_run.clone(),
            their_world: *their_world,
            our_world: *our_world,
        },
        other => CommError::Peer(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn the_first_failure_wins_and_frees_every_path_once() {
        let ctx = Context::new(1, 3, Duration::from_secs(1));
        let freed = Arc::new(AtomicUsize::new(0));
        for _ in 0..2 {
            let freed = freed.clone();
            ctx.on_failure(move || {
                freed.fetch_add(1, Ordering::SeqCst);
            });
        }
        ctx.check().unwrap();
        let first = ctx.fail(CommError::PeerClosed {
            rank: 1,
            peer: 2,
            doing: "receiving from",
        });
        let later = ctx.fail(CommError::Peer("a consequence".into()));
        assert_eq!(later.to_string(), first.to_string());
        assert_eq!(ctx.check().unwrap_err().to_string(), first.to_string());
        assert_eq!(freed.load(Ordering::SeqCst), 2);
    }
}
