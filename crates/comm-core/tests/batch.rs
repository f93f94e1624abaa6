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

/// The timed loops comm-bench runs, nccl-tests' -z 0, 1 and 3, with and without per-iteration
/// marks (-I), `aggregate` calls per iteration in one group: every call runs, every rank's time
/// comes back by rank, and the iteration times are the slowest rank's, the same on every rank.
#[test]
fn timed_loops_run_every_call_and_report_per_call_times() {
    use comm_core::timing::{time_loop, time_loop_with, Average, Clock, Loop, Waiting};
    let plan = |waiting, aggregate, per_iteration| Loop {
        warmup: 2,
        iters: 5,
        aggregate,
        waiting,
        per_iteration,
    };
    let cases = [
        (Waiting::BackToBack, 1, false),
        (Waiting::BackToBack, 3, false),
        (Waiting::BackToBack, 2, true),
        (Waiting::BarrierEach, 1, false),
        (Waiting::BarrierEach, 4, true),
        (Waiting::EachCall, 1, false),
        (Waiting::EachCall, 4, false),
        (Waiting::EachCall, 2, true),
    ];
    let results = on_ranks(2, |comm| {
        let mut buf = comm.buffer(&[1i64]).unwrap();
        let mut calls = 0;
        // One stopwatch for every loop, as comm-bench keeps one per run.
        let mut stopwatch = comm.stopwatch();
        cases
            .iter()
            .map(|&(waiting, aggregate, marks)| {
                let before = calls;
                let op = || {
                    calls += 1;
                    comm.all_reduce(&mut buf, ReduceOp::Max)
                };
                let loop_plan = plan(waiting, aggregate, marks);
                let timing = match marks {
                    true => time_loop_with(comm, &loop_plan, &mut stopwatch, op),
                    false => time_loop(comm, &loop_plan, op),
                }
                .unwrap();
                (timing, calls - before)
            })
            .collect::<Vec<_>>()
    });
    for (rank, runs) in results.iter().enumerate() {
        for ((timing, calls), &(waiting, aggregate, marks)) in runs.iter().zip(&cases) {
            let case = format!(
                "rank {rank}, -z {} -m {aggregate} -I {marks}",
                waiting.flag()
            );
            // (warm-up + timed iterations) x calls per iteration, and the one untimed call
            // nccl-tests' BenchTime makes before its timed loop ("Sync").
            assert_eq!(*calls, 7 * aggregate + 1, "{case}");
            assert_eq!(timing.ranks.len(), 2, "{case}: a time per rank");
            // -z 0 without marks: one time for the whole loop; else one per iteration.
            let per_iteration = if waiting == Waiting::BackToBack && !marks {
                1
            } else {
                5
            };
            assert_eq!(timing.iterations.len(), per_iteration, "{case}");
            assert_eq!(timing.clock, Clock::Host, "{case}: the CPU's clock");
            for t in timing.ranks.iter().chain(&timing.iterations) {
                assert!(*t > 0.0 && *t < 5.0, "{case}: {t}");
            }
            let (fastest, slowest) = (timing.time(Average::Min), timing.time(Average::Max));
            let mean = timing.time(Average::Mean);
            assert!(fastest <= mean && mean <= slowest, "{case}: {timing:?}");
        }
        // The same on every rank.
        assert_eq!(runs, &results[0], "rank {rank}");
    }
}

/// What each -z counts, with ranks that take different times: rank 0's call takes 1 ms, rank
/// 1's 20 ms (sleeps, no collective inside, so nothing but the loop's barriers makes rank 0
/// wait). With -z 3 rank 0's clock stops before the barrier where it waits for rank 1; with
/// -z 1 it runs through it. -a picks among the ranks' times; each iteration's time is the
/// slowest rank's. Only lower bounds and orderings that sleeps guarantee are asserted.
#[test]
fn each_mode_counts_what_nccl_tests_counts() {
    use comm_core::timing::{time_loop, Average, Loop, Waiting};
    let (fast, slow) = (Duration::from_millis(1), Duration::from_millis(20));
    let plan = |waiting, per_iteration| Loop {
        warmup: 0,
        iters: 3,
        aggregate: 1,
        waiting,
        per_iteration,
    };
    let results = on_ranks(2, |comm| {
        let nap = if comm.rank() == 0 { fast } else { slow };
        [
            (Waiting::BackToBack, true),
            (Waiting::BarrierEach, false),
            (Waiting::EachCall, false),
        ]
        .map(|(waiting, marks)| {
            time_loop(comm, &plan(waiting, marks), || {
                std::thread::sleep(nap);
                Ok(())
            })
            .unwrap()
        })
    });
    let [back_to_back, barrier_each, each_call] = &results[0];
    let slow_s = slow.as_secs_f64();
    // -z 0 on the CPU: calls back to back, no barrier between them; rank 0 is done early.
    assert!(
        back_to_back.ranks[0] < back_to_back.ranks[1],
        "{back_to_back:?}"
    );
    // Marked iterations: each the slowest rank's.
    assert!(
        back_to_back.iterations.iter().all(|&t| t >= slow_s),
        "{back_to_back:?}"
    );
    // -z 1: rank 0's clock runs through the barriers where it waits for rank 1.
    assert!(barrier_each.ranks[0] > slow_s / 2.0, "{barrier_each:?}");
    // -z 3: it stops before them.
    assert!(each_call.ranks[0] < each_call.ranks[1], "{each_call:?}");
    assert!(each_call.ranks[1] >= slow_s, "{each_call:?}");
    assert!(
        each_call.iterations.iter().all(|&t| t >= slow_s),
        "{each_call:?}"
    );
    // -a: 0 rank 0's, 2 the fastest, 3 the slowest, 1 between them.
    let t = each_call;
    assert_eq!(t.time(Average::Rank0), t.ranks[0]);
    assert_eq!(t.time(Average::Min), t.ranks[0]);
    assert_eq!(t.time(Average::Max), t.ranks[1]);
    assert_eq!(t.time(Average::Mean), (t.ranks[0] + t.ranks[1]) / 2.0);
    assert_eq!(results[1], results[0], "the same on every rank");
}

/// `-w 0` still leaves the first call out of the timing, as nccl-tests' BenchTime does with its
/// "Sync" call (NCCL connects ranks lazily, at the first call that needs them): the first call
/// is made and waited for before the timed loop's barrier: with no warm-up a loop of 3
/// iterations makes 4 calls, whatever -z says.
#[test]
fn without_warm_up_the_first_call_is_still_untimed() {
    use comm_core::timing::{time_loop, Loop, Waiting};
    for waiting in Waiting::ALL {
        let plan = Loop {
            warmup: 0,
            iters: 3,
            aggregate: 1,
            waiting,
            per_iteration: false,
        };
        let results = on_ranks(2, |comm| {
            let mut buf = comm.buffer(&[1i64]).unwrap();
            let mut calls = 0;
            time_loop(comm, &plan, || {
                calls += 1;
                comm.all_reduce(&mut buf, ReduceOp::Sum)
            })
            .unwrap();
            calls
        });
        // 3 timed calls and the untimed one before them, on every rank.
        assert_eq!(results, vec![4, 4], "-z {}", waiting.flag());
    }
}
