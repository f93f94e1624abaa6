//! Deadlines from timeouts that may be too far to represent (`--timeout 1e9`, `Duration::MAX`).

use std::time::{Duration, Instant};

/// `timeout` from now, or a year from now where that cannot be represented: waiting that long is
/// waiting for good, and no deadline computed from it overflows the clock.
pub fn after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}
