//! The one deadline type: a moment by which a wait must end, used by the store's rendezvous, the
//! CPU transports and NCCL's waits alike. A timeout too long for the clock to represent
//! (`--timeout 1e9`, `Duration::MAX`) makes a deadline that never comes, rather than an overflow.

use std::time::{Duration, Instant};

/// A moment by which an operation must finish; `None` inside when the timeout is so long that
/// no clock can represent its end (it then never comes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline(Option<Instant>);

impl Deadline {
    /// `timeout` from now.
    pub fn after(timeout: Duration) -> Deadline {
        Deadline(Instant::now().checked_add(timeout))
    }

    /// The moment itself, `None` when it never comes.
    pub fn at(&self) -> Option<Instant> {
        self.0
    }

    /// Time left, `None` when unbounded; zero once it has passed.
    pub fn remaining(&self) -> Option<Duration> {
        self.0
            .map(|at| at.saturating_duration_since(Instant::now()))
    }

    /// Whether it has passed.
    pub fn passed(&self) -> bool {
        self.remaining().is_some_and(|left| left.is_zero())
    }

    /// How long a single blocking wait may last now: the time left, at most `most`. `None` once
    /// the deadline has passed.
    pub fn wait_at_most(&self, most: Duration) -> Option<Duration> {
        match self.remaining() {
            None => Some(most),
            Some(left) if left.is_zero() => None,
            Some(left) => Some(left.min(most)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_too_long_to_represent_never_comes() {
        let forever = Deadline::after(Duration::MAX);
        assert_eq!(forever.at(), None);
        assert!(!forever.passed());
        assert_eq!(forever.remaining(), None);
        let most = Duration::from_millis(5);
        assert_eq!(forever.wait_at_most(most), Some(most));
    }

    #[test]
    fn a_passed_deadline_allows_no_more_waiting() {
        let now = Deadline::after(Duration::ZERO);
        assert!(now.passed());
        assert_eq!(now.wait_at_most(Duration::from_secs(1)), None);
        let later = Deadline::after(Duration::from_secs(60));
        assert!(!later.passed());
        assert!(later.wait_at_most(Duration::from_secs(1)) == Some(Duration::from_secs(1)));
    }
}
