//! `Communicator::batch` and `group` on the CPU backend: they return the body's value and error,
//! nest, and the collectives inside are as correct as outside.

use std::time::Duration;

use comm_core::backend::cpu::ChannelTransport;
use comm_core::{CommError, Communicator, ReduceOp};

/// Runs `body` on `n` ranks, one thread each, and returns what each rank returned.
fn on_ranks<R: Send>(n: usize, body: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let handles: Vec<_> = ChannelTransport::mesh(n, Duration::from_secs(30))
            .into_iter()
            .enumerate()
            .map(|(rank, t)| {
                let body = &body;
                s.spawn(move || body(&Communicator::cpu(Box::new(t), rank)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_batch_returns_the_body_value_and_its_collectives_are_correct() {
    let results = on_ranks(3, |comm| {
        let rank = comm.rank() as i64;
        let mut sum = comm.buffer(&[rank, 10 * rank]).unwrap();
        let mut gathered = comm.zeros::<i64>(3).unwrap();
        let mine = comm.buffer(&[rank + 1]).unwrap();
        let value = comm
            .batch(|| {
                for _ in 0..4 {
                    comm.all_reduce(&mut sum, ReduceOp::Sum)?;
                }
                comm.all_gather_into(&mine, &mut gathered)?;
                // Nested: behaves as one batch.
                comm.batch(|| comm.barrier())?;
                Ok(comm.rank() * 7)
            })
            .unwrap();
        (
            value,
            comm.to_host(&sum).unwrap(),
            comm.to_host(&gathered).unwrap(),
        )
    });
    for (rank, (value, sum, gathered)) in results.into_iter().enumerate() {
        assert_eq!(value, rank * 7);
        // Each all-reduce multiplies by 3 after the first sum 0+1+2 = 3: 3, 9, 27, 81.
        assert_eq!(sum, vec![81, 810]);
        assert_eq!(gathered, vec![1, 2, 3]);
    }
}

#[test]
fn a_group_returns_the_body_value_and_its_collectives_are_correct() {
    let results = on_ranks(4, |comm| {
        let rank = comm.rank() as f32;
        let mut a = comm.buffer(&[rank; 5]).unwrap();
        let mut b = comm.buffer(&[1.0f32, 2.0]).unwrap();
        let count = comm
            .batch(|| {
                comm.group(|| {
                    comm.all_reduce(&mut a, ReduceOp::Sum)?;
                    comm.all_reduce(&mut b, ReduceOp::Max)?;
                    comm.group(|| comm.broadcast(&mut b, 2))?;
                    Ok("two")
                })
            })
            .unwrap();
        (count, comm.to_host(&a).unwrap(), comm.to_host(&b).unwrap())
    });
    for (count, a, b) in results {
        assert_eq!(count, "two");
        assert_eq!(a, vec![6.0; 5]);
        assert_eq!(b, vec![1.0, 2.0]);
    }
}

#[test]
fn a_failing_body_fails_the_batch_and_the_group_with_its_error() {
    let results = on_ranks(2, |comm| {
        let batch: Result<(), CommError> =
            comm.batch(|| Err(CommError::Usage("the body failed".into())));
        let group: Result<(), CommError> = comm.group(|| {
            let mut wrong = comm.zeros::<f64>(3)?;
            comm.all_gather(&mut wrong) // 3 elements do not split into 2 blocks
        });
        // The communicator still works afterwards.
        let mut one = comm.buffer(&[1u8 as i32]).unwrap();
        comm.batch(|| comm.all_reduce(&mut one, ReduceOp::Sum))
            .unwrap();
        (
            batch.unwrap_err().to_string(),
            group.unwrap_err().to_string(),
            comm.to_host(&one).unwrap(),
        )
    });
    for (batch, group, one) in results {
        assert!(batch.contains("the body failed"), "{batch}");
        assert!(group.contains("all_gather"), "{group}");
        assert_eq!(one, vec![2]);
    }
}

/// The timed loops comm-bench runs: back to back (one time for the whole loop, per call) or each
/// call waited for (one time per iteration), `aggregate` calls per iteration in one group.
#[test]
fn timed_loops_run_every_call_and_report_per_call_times() {
    use comm_core::timing::{time_loop, Loop, Waiting};
    let plan = |waiting, aggregate| Loop {
        warmup: 2,
        iters: 5,
        aggregate,
        waiting,
    };
    let results = on_ranks(2, |comm| {
        let mut buf = comm.buffer(&[1i64]).unwrap();
        let mut calls = 0;
        let mut run = |loop_plan: Loop| {
            let before = calls;
            let timing = time_loop(comm, &loop_plan, || {
                calls += 1;
                comm.all_reduce(&mut buf, ReduceOp::Max)
            })
            .unwrap();
            (timing.seconds, calls - before)
        };
        [
            run(plan(Waiting::BackToBack, 1)),
            run(plan(Waiting::BackToBack, 3)),
            run(plan(Waiting::EachCall, 1)),
            run(plan(Waiting::EachCall, 4)),
        ]
    });
    for (rank, runs) in results.iter().enumerate() {
        let [(b1, n_b1), (b3, n_b3), (e1, n_e1), (e4, n_e4)] = runs;
        // (warm-up + timed iterations) x calls per iteration.
        assert_eq!([*n_b1, *n_b3, *n_e1, *n_e4], [7, 21, 7, 28], "rank {rank}");
        assert_eq!((b1.len(), b3.len()), (1, 1), "back to back: one time");
        assert_eq!(
            (e1.len(), e4.len()),
            (5, 5),
            "each call: one time per iteration"
        );
        for t in b1.iter().chain(b3).chain(e1).chain(e4) {
            assert!(*t > 0.0 && *t < 5.0, "rank {rank}: {t}");
        }
        // The slowest rank's times: the same on every rank.
        assert_eq!(runs, &results[0], "rank {rank}");
    }
}
