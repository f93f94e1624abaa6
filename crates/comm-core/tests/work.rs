//! `comm_core::work`: asynchronous collectives on a communication thread. A started call's
//! result is right whenever it is waited for, calls run in the order they were started, the
//! caller keeps working meanwhile, and a failure reaches the Work instead of a hang or a panic.

use std::time::{Duration, Instant};

use comm_core::backend::cpu::ChannelTransport;
use comm_core::{AsyncComm, Communicator, ReduceOp};

/// Runs `body` on `n` ranks, one thread each, each with an [`AsyncComm`].
fn on_ranks<R: Send>(n: usize, body: impl Fn(AsyncComm) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let handles: Vec<_> = ChannelTransport::mesh(n, Duration::from_secs(30))
            .into_iter()
            .enumerate()
            .map(|(rank, t)| {
                let body = &body;
                s.spawn(move || {
                    body(AsyncComm::start(Communicator::cpu(Box::new(t), rank)).unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn started_all_reduces_give_the_sums_in_any_waiting_order() {
    for n in [1, 2, 3, 4] {
        let results = on_ranks(n, |comm| {
            let r = comm.rank() as f32;
            // Three calls in flight at once, of different lengths, waited for last first.
            let works: Vec<_> = (0..3)
                .map(|k| {
                    comm.all_reduce(
                        format!("bucket {k}"),
                        vec![r + k as f32; 1 + 1000 * k],
                        ReduceOp::Sum,
                    )
                })
                .collect();
            let sums: Vec<Vec<f32>> = works.into_iter().rev().map(|w| w.wait().unwrap()).collect();
            comm.finish().unwrap();
            sums
        });
        let base: f32 = (0..n).map(|r| r as f32).sum();
        for sums in results {
            for (i, sum) in sums.iter().enumerate() {
                let k = 2 - i;
                assert_eq!(sum.len(), 1 + 1000 * k);
                let want = base + (n * k) as f32;
                assert!(
                    sum.iter().all(|&v| v == want),
                    "n {n} bucket {k}: {:?}",
                    &sum[..1]
                );
            }
        }
    }
}

#[test]
fn a_broadcast_gives_the_roots_values() {
    let results = on_ranks(3, |comm| {
        let mine = vec![comm.rank() as i64 + 7; 5];
        let got = comm.broadcast("weights", mine, 1).wait().unwrap();
        comm.finish().unwrap();
        got
    });
    assert!(results.iter().all(|v| v == &vec![8i64; 5]));
}

/// The caller is not blocked while the thread works: a rank that starts a call its peer joins
/// only 300 ms later gets its Work back at once, and waits for it afterwards.
#[test]
fn starting_a_call_returns_at_once() {
    let results = on_ranks(2, |comm| {
        if comm.rank() == 1 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let start = Instant::now();
        let mut work = comm.all_reduce("late", vec![1.0f32; 4], ReduceOp::Sum);
        let started = start.elapsed();
        let done_early = work.is_completed();
        let (sum, waited) = work.wait_timed();
        assert_eq!(sum.unwrap(), vec![2.0; 4]);
        comm.finish().unwrap();
        (started, done_early, waited)
    });
    let (started, done_early, waited) = results[0];
    assert!(started < Duration::from_millis(100), "{started:?}");
    assert!(!done_early);
    assert!(
        waited > Duration::from_millis(150),
        "rank 0 waited {waited:?}"
    );
}

/// A call that fails (the lengths differ) answers its Work with the error; the calls after it
/// are not run on a communicator that failed, and say so, and nothing panics or hangs.
#[test]
fn a_failed_call_reaches_its_work_and_the_later_ones_say_so() {
    let results = on_ranks(1, |comm| {
        let failed = comm
            .submit("a failing call", |_| -> comm_core::Result<()> {
                Err(comm_core::CommError::Usage("this call fails".into()))
            })
            .wait();
        let after = comm.all_reduce("after", vec![1.0f32], ReduceOp::Sum).wait();
        let _ = comm.finish();
        (
            failed.unwrap_err().to_string(),
            after.unwrap_err().to_string(),
        )
    });
    let (failed, after) = &results[0];
    assert!(failed.contains("this call fails"), "{failed}");
    assert!(
        after.contains("after: the communication thread ended before answering"),
        "{after}"
    );
}

/// `finish` gives the communicator back, usable blocking again.
#[test]
fn finish_gives_the_communicator_back() {
    let results = on_ranks(2, |comm| {
        let work = comm.all_reduce("x", vec![1i32, 2], ReduceOp::Max);
        let comm = comm.finish().unwrap();
        let mut buf = comm.buffer(&[comm.rank() as i32]).unwrap();
        comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        (work.wait().unwrap(), comm.to_host(&buf).unwrap())
    });
    for (async_result, blocking) in results {
        assert_eq!(async_result, vec![1, 2]);
        assert_eq!(blocking, vec![1]);
    }
}
