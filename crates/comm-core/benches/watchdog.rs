//! What the NCCL watchdog costs each call: arming it before the call and disarming it after, as
//! the NCCL backend does around every collective, measured without a GPU (a `-z 0` sweep of 8 B
//! all-reduces pays this once per call, on top of NCCL's few microseconds).
//!
//!     cargo bench -p comm-core --bench watchdog
//!
//! Prints the median and the fastest of several rounds, in nanoseconds per call.

use std::time::Duration;

use comm_core::backend::nccl::cost_of_watching;

const CALLS: u64 = 200_000;
const ROUNDS: usize = 15;

fn main() {
    cost_of_watching(CALLS / 10); // warm-up: the thread started, the code paged in
    let mut per_call: Vec<f64> = (0..ROUNDS)
        .map(|_| ns_per_call(cost_of_watching(CALLS)))
        .collect();
    per_call.sort_by(f64::total_cmp);
    println!(
        "watchdog arm+disarm: median {:.1} ns/call, fastest {:.1} ns/call ({ROUNDS} rounds of {CALLS} calls)",
        per_call[ROUNDS / 2],
        per_call[0]
    );
}

fn ns_per_call(took: Duration) -> f64 {
    took.as_secs_f64() * 1e9 / CALLS as f64
}
