//! The job's one choice of backend (`comm_core::backend::agree`), with ranks that disagree: two
//! ranks over a real store, one of which got the backend and one of which did not (as when one
//! node's NCCL init fails, or one rank sees no GPU). Both must leave it, at once rather than at
//! the store's timeout, and say which rank could not and why; where all got it, all keep it.

use std::time::{Duration, Instant};

use comm_core::agree::{agree, Disagreement};
use comm_core::store::{Store, StoreServer};

/// Long, so that a rank left waiting for the other would show as a wait this long.
const TIMEOUT: Duration = Duration::from_secs(120);

/// Each rank's attempt, agreed over a store of `attempts.len()` ranks: what each rank ends up
/// with (its value, or the disagreement), and how long the slowest took.
fn agreed(attempts: Vec<Result<u32, String>>) -> (Vec<Result<u32, Disagreement>>, Duration) {
    let n = attempts.len();
    let server = StoreServer::bind(0, n).unwrap();
    let port = server.port();
    let started = Instant::now();
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = attempts
            .into_iter()
            .enumerate()
            .map(|(rank, mine)| {
                s.spawn(move || {
                    let store = Store::connect("127.0.0.1", port, rank, n, TIMEOUT).unwrap();
                    let host = format!("host{rank}");
                    agree(&store, "agree0", "built", &host, mine).unwrap()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    (results, started.elapsed())
}

#[test]
fn ranks_that_disagree_all_leave_the_backend_at_once_naming_the_rank() {
    let (results, took) = agreed(vec![
        Ok(7),
        Err("ncclCommInitRank: unhandled cuda error".into()),
    ]);
    // Not a wait for the timeout: rank 0 learned of rank 1's failure from the store.
    assert!(took < TIMEOUT / 4, "took {took:?}");
    for (rank, result) in results.iter().enumerate() {
        let why = result
            .as_ref()
            .expect_err("no rank may keep a backend another rank lacks")
            .describe("NCCL");
        assert_eq!(
            why,
            "NCCL cannot run on rank 1 (host host1): ncclCommInitRank: unhandled cuda error; \
             every rank of the job takes the CPU path instead",
            "rank {rank}"
        );
    }
}

#[test]
fn ranks_that_all_got_it_keep_it_and_ranks_that_all_lack_it_say_why_once() {
    let (results, _) = agreed(vec![Ok(1), Ok(2), Ok(3)]);
    assert_eq!(
        results.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let (results, _) = agreed(vec![Err("no CUDA driver found".into()); 2]);
    for result in results {
        assert_eq!(
            result.unwrap_err().describe("NCCL"),
            "NCCL cannot run here: no CUDA driver found"
        );
    }
}
