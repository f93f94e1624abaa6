//! When a rank fails, the job ends: the others are stopped (self-spawn) or fail by themselves
//! (no parent, as under srun), with a message and a non-zero exit, never a hang. Ctrl-C and a
//! killed parent leave no orphan.
//!
//! This test binary is its own distributed program: re-executed with `SCENARIO` set, the test
//! function runs `comm_core::launch` instead of checking.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use comm_core::launch::run_settings;
use comm_core::Settings;
use comm_core::{BackendChoice, Communicator, ReduceOp};
use test_support::process::{
    assert_all_gone, scratch, start, wait_for_pid_files, Plainly, Running,
};

/// What a rank does in each scenario, with its pid recorded in `PID_DIR`.
fn as_rank(scenario: &str) -> ! {
    let timeout: f64 = std::env::var("JOB_TIMEOUT").unwrap().parse().unwrap();
    let settings = Settings {
        ranks: Some(3),
        backend: BackendChoice::Cpu,
        timeout: Duration::from_secs_f64(timeout),
        ..Settings::default()
    };
    // A rank records its pid as it starts (RANK is set by the launcher): a rank the job stops
    // before its body runs (one that exited early ends the others at once) is checked too.
    if let Ok(rank) = std::env::var("RANK") {
        let dir = std::env::var("PID_DIR").unwrap();
        std::fs::write(Path::new(&dir).join(rank), std::process::id().to_string()).unwrap();
    }
    let code = run_settings(&settings, |comm| {
        match scenario {
            "exit-early" if comm.rank() == 1 => {
                eprintln!("rank 1 is leaving on purpose");
                std::process::exit(3)
            }
            "hang" if comm.rank() == 1 => std::thread::sleep(Duration::from_secs(600)),
            "rank-0-alone" => return rank_0_alone(comm, Duration::ZERO),
            // Longer than the job's timeout.
            "rank-0-alone-slow" => return rank_0_alone(comm, Duration::from_secs(4)),
            _ => {}
        }
        let mut buf = comm.buffer(&vec![1.0f32; 1 << 16])?;
        comm.all_reduce(&mut buf, ReduceOp::Sum)
    });
    std::process::exit(code)
}

// ANCHOR: rank_0_alone
/// A collective only rank 0 calls, as a program does that all-reduces the loss to log it
/// `if rank == 0`: the ranks' calls no longer pair up. The others go on with their work for
/// `others_work`, then all-reduce their gradients.
fn rank_0_alone(comm: &Communicator, others_work: Duration) -> comm_core::Result<()> {
    let mut loss = comm.buffer(&[1.0f32])?;
    if comm.rank() == 0 {
        comm.all_reduce(&mut loss, ReduceOp::Sum)?; // rank 0 alone: the others never call it
    } else {
        std::thread::sleep(others_work); // the others' work (forward, backward) stands here
    }
    let mut gradients = comm.buffer(&vec![1.0f32; 1 << 16])?;
    comm.all_reduce(&mut gradients, ReduceOp::Sum) // every rank
}
// ANCHOR_END: rank_0_alone

/// Starts this test again as the job of `scenario`.
fn job(test: &str, scenario: &str, timeout: &str, dir: &Path) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("SCENARIO", scenario)
        .env("JOB_TIMEOUT", timeout)
        .env("PID_DIR", dir)
        .plainly();
    command
}

/// Waits for the ranks to record their pids.
fn rank_pids(dir: &Path, n: usize) -> Vec<i32> {
    wait_for_pid_files(dir, 0..n, Duration::from_secs(20))
}

/// Waits for the job (failing the test if it hangs): its exit code (-1 when killed by a signal)
/// and stderr.
fn wait_with_limit(job: Running, limit: Duration) -> (i32, String) {
    let finished = job.finish(limit);
    (finished.status.code().unwrap_or(-1), finished.stderr)
}

#[test]
fn a_rank_that_exits_early_stops_the_job_with_its_code() {
    if let Ok(scenario) = std::env::var("SCENARIO") {
        as_rank(&scenario);
    }
    let dir = scratch("exit-early");
    let started = Instant::now();
    // A 60 s timeout: ending within seconds proves the parent stopped the others.
    let child = start(&mut job(
        "a_rank_that_exits_early_stops_the_job_with_its_code",
        "exit-early",
        "60",
        &dir,
    ));
    let (code, stderr) = wait_with_limit(child, Duration::from_secs(30));
    assert_eq!(
        code, 3,
        "the job exits with the failed rank's code; stderr:\n{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    assert!(stderr.contains("rank 1 is leaving on purpose"), "{stderr}");
    // The others were stopped, or stopped by themselves on hearing rank 1 vanished: either way
    // rank 1 is the one named first.
    assert!(
        stderr.contains("error: rank 1 exited with code 3"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_all_gone(&rank_pids(&dir, 3));
}

#[test]
fn without_a_parent_the_others_fail_by_themselves() {
    if let Ok(scenario) = std::env::var("SCENARIO") {
        as_rank(&scenario);
    }
    // Started one by one as torchrun or srun would: nobody stops the survivors but themselves.
    let dir = scratch("no-parent");
    let port = comm_core::spawn::free_port().unwrap();
    let ranks: Vec<Running> = (0..3)
        .map(|rank| {
            let mut rank_job = job(
                "without_a_parent_the_others_fail_by_themselves",
                "exit-early",
                "60",
                &dir,
            );
            rank_job
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "3")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string());
            start(&mut rank_job)
        })
        .collect();
    let results: Vec<(i32, String)> = ranks
        .into_iter()
        .map(|c| wait_with_limit(c, Duration::from_secs(30)))
        .collect();
    assert_eq!(results[1].0, 3);
    for rank in [0, 2] {
        let (code, stderr) = &results[rank];
        assert_ne!(*code, 0, "rank {rank} should fail");
        assert!(
            stderr.contains(&format!("error: rank {rank}: ")),
            "{stderr}"
        );
        // The store's server saw rank 1's connection close (it vanished, for the others), or
        // a link to it closed first.
        assert!(
            stderr.contains("rank 1 (pid ") && stderr.contains(") vanished while rank ")
                || stderr.contains("closed its connection")
                || stderr.contains("lost the rendezvous store"),
            "{stderr}"
        );
    }
}

#[test]
fn a_rank_that_never_answers_fails_the_job_at_the_timeout() {
    if let Ok(scenario) = std::env::var("SCENARIO") {
        as_rank(&scenario);
    }
    let dir = scratch("hang");
    let started = Instant::now();
    let child = start(&mut job(
        "a_rank_that_never_answers_fails_the_job_at_the_timeout",
        "hang",
        "2",
        &dir,
    ));
    let (code, stderr) = wait_with_limit(child, Duration::from_secs(30));
    assert_ne!(code, 0);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        stderr.contains("timed out after 2s waiting for rank 1"),
        "{stderr}"
    );
    assert_all_gone(&rank_pids(&dir, 3));
}

#[test]
fn ctrl_c_reaches_every_rank_and_leaves_no_orphan() {
    if let Ok(scenario) = std::env::var("SCENARIO") {
        as_rank(&scenario);
    }
    let dir = scratch("ctrl-c");
    let child = start(&mut job(
        "ctrl_c_reaches_every_rank_and_leaves_no_orphan",
        "hang",
        "60",
        &dir,
    ));
    let pids = rank_pids(&dir, 3);
    child.signal(libc::SIGINT);
    let (code, stderr) = wait_with_limit(child, Duration::from_secs(20));
    assert_eq!(code, 130, "128 + SIGINT; stderr:\n{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert_all_gone(&pids);
}

#[test]
fn a_killed_parent_takes_its_ranks_with_it() {
    if let Ok(scenario) = std::env::var("SCENARIO") {
        as_rank(&scenario);
    }
    let dir = scratch("kill-parent");
    let child = start(&mut job(
        "a_killed_parent_takes_its_ranks_with_it",
        "hang",
        "60",
        &dir,
    ));
    let pids = rank_pids(&dir, 3);
    child.kill(); // SIGKILL: no chance to clean up
    assert_all_gone(&pids);
}

/// Starts ranks by hand, as torchrun or srun would: rank r with world size `worlds[r]`, `None`
/// for a rank never started.
fn by_hand(test: &str, worlds: &[Option<usize>], port: u16, dir: &Path) -> Vec<(usize, Running)> {
    worlds
        .iter()
        .enumerate()
        .filter_map(|(rank, world)| {
            let world = (*world)?;
            let mut rank_job = job(test, "plain", "60", dir);
            rank_job
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string());
            Some((rank, start(&mut rank_job)))
        })
        .collect()
}

#[test]
fn ranks_that_disagree_on_the_world_size_all_stop_at_once() {
    if let Ok(scenario) = std::env::var("SCENARIO") {
        as_rank(&scenario);
    }
    let dir = scratch("world-size");
    let port = comm_core::spawn::free_port().unwrap();
    let test = "ranks_that_disagree_on_the_world_size_all_stop_at_once";
    // Ranks 0 and 2 of 3 meet and wait for rank 1, who comes later, saying 4 ranks.
    let mut ranks = by_hand(test, &[Some(3), None, Some(3)], port, &dir);
    std::thread::sleep(Duration::from_secs(2));
    let started = Instant::now();
    ranks.extend(by_hand(test, &[None, Some(4)], port, &dir));
    let pids: Vec<i32> = ranks.iter().map(|(_, r)| r.pid()).collect();
    let results: Vec<(usize, i32, String)> = ranks
        .into_iter()
        .map(|(rank, r)| {
            let (code, stderr) = wait_with_limit(r, Duration::from_secs(30));
            (rank, code, stderr)
        })
        .collect();
    // The timeout is 60 s: every rank ends long before, as soon as the disagreement is known.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    for (rank, code, stderr) in &results {
        assert_eq!(*code, 1, "rank {rank}: {stderr}");
        assert!(
            stderr.contains("started for 3 ranks, but rank 1 says 4"),
            "rank {rank}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_eq!(stderr.matches("error: ").count(), 1, "one line: {stderr}");
    }
    assert_no_segments_of(&pids);
}

/// No shared-memory segment of these processes is left (names are `ncw-<pid>-…`).
fn assert_no_segments_of(pids: &[i32]) {
    let left: Vec<String> = comm_core::backend::cpu::shm::leftovers()
        .into_iter()
        .filter(|name| {
            pids.iter()
                .any(|pid| name.starts_with(&format!("ncw-{pid}-")))
        })
        .collect();
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

#[test]
fn killing_the_rank_that_serves_the_store_stops_the_others_at_once() {
    if let Ok(scenario) = std::env::var("SCENARIO") {
        as_rank(&scenario);
    }
    // Ranks 0-2 of 4: they meet and wait for rank 3, who never comes, until rank 0 is killed.
    let dir = scratch("store-killed");
    let port = comm_core::spawn::free_port().unwrap();
    let mut ranks = by_hand(
        "killing_the_rank_that_serves_the_store_stops_the_others_at_once",
        &[Some(4), Some(4), Some(4), None],
        port,
        &dir,
    );
    std::thread::sleep(Duration::from_secs(1));
    let (_, rank0) = ranks.remove(0);
    let pids: Vec<i32> = ranks.iter().map(|(_, r)| r.pid()).collect();
    let rank0_pid = rank0.pid();
    let killed = Instant::now();
    rank0.kill();
    for (rank, running) in ranks {
        let (code, stderr) = wait_with_limit(running, Duration::from_secs(30));
        assert!(
            killed.elapsed() < Duration::from_secs(2),
            "rank {rank} took {:?} (timeout 60 s): {stderr}",
            killed.elapsed()
        );
        assert_eq!(code, 1, "{stderr}");
        assert!(
            stderr.contains(&format!(
                "error: rank {rank}: rank {rank} lost the rendezvous store at 127.0.0.1:{port}"
            )),
            "{stderr}"
        );
        assert!(stderr.contains("did rank 0 exit or fail?"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    assert_all_gone(&pids);
    // Rank 0 could not clean up after itself; the others did it for it.
    assert_no_segments_of(&[&pids[..], &[rank0_pid]].concat());
}

/// docs/src/01-broadcast.md's mismatch, both ways it ends here: at once where the next message
/// has another size than the call expects, at the timeout where no message comes. The chapter
/// quotes these lines.
#[test]
fn a_collective_only_rank_0_calls_fails_the_job_saying_what_disagrees() {
    if let Ok(scenario) = std::env::var("SCENARIO") {
        as_rank(&scenario);
    }
    let test = "a_collective_only_rank_0_calls_fails_the_job_saying_what_disagrees";
    let dir = scratch("rank-0-alone");
    let (code, stderr) = wait_with_limit(
        start(&mut job(test, "rank-0-alone", "2", &dir)),
        Duration::from_secs(30),
    );
    assert_ne!(code, 0);
    // Which rank notices first changes from run to run: rank 1 gets rank 0's loss where it
    // expects a block of gradients, or rank 0 gets rank 2's block where it expects the loss.
    let noticed = [
        "error: rank 1: rank 0 sent 4 bytes where rank 1 expected 87384",
        "error: rank 0: rank 2 sent 87380 bytes where rank 0 expected 4",
    ];
    // On one host (`--copy auto`) the others' 262144 bytes go on registered buffers and rank
    // 0's 4 bytes through the rings: a rank at the others' barrier finds rank 0's message, or
    // rank 0 finds a peer at that barrier.
    let split = [
        "error: rank 1: rank 0 sent rank 1 a message of 4 bytes through the rings while rank 1 \
         waited at a barrier of its all_reduce (sum) of 262144 bytes of float on registered buffers",
        "error: rank 2: rank 0 sent rank 2 a message of 4 bytes through the rings while rank 2 \
         waited at a barrier of its all_reduce (sum) of 262144 bytes of float on registered buffers",
        "error: rank 0: rank 1 called all_reduce (sum) of 262144 bytes of float on registered \
         buffers while rank 0 was",
        "error: rank 0: rank 2 called all_reduce (sum) of 262144 bytes of float on registered \
         buffers while rank 0 was",
    ];
    let split = split.iter().any(|s| stderr.contains(s))
        && stderr.contains(
            ": the ranks disagree on buffer sizes or made different calls (all_reduce calls of \
             8 KiB (8192 bytes) or more go on registered buffers, smaller ones through the \
             rings; pass the same length, dtype and root on every rank, in the same calls)",
        );
    let messages = noticed.iter().any(|n| stderr.contains(n))
        && stderr.contains(
            ": the ranks disagree on buffer sizes (pass the same length, dtype and root on \
             every rank)",
        );
    assert!(split || messages, "{stderr}");
    assert_all_gone(&rank_pids(&dir, 3));

    let dir = scratch("rank-0-alone-slow");
    let started = Instant::now();
    let (code, stderr) = wait_with_limit(
        start(&mut job(test, "rank-0-alone-slow", "2", &dir)),
        Duration::from_secs(30),
    );
    assert_ne!(code, 0);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    let waited = |peer: usize| {
        format!(
            "error: rank 0: timed out after 2s waiting for rank {peer} while rank 0 was \
             receiving from it (is that rank stuck, or did the ranks call different collectives?)"
        )
    };
    // Rank 0's 4 bytes go through the rings (on one host too: all_reduce under 8 KiB), so it times out
    // waiting for a message, whether or not the others' large call is on registered buffers.
    assert!(
        stderr.contains(&waited(2)) || stderr.contains(&waited(1)),
        "{stderr}"
    );
    assert_all_gone(&rank_pids(&dir, 3));
}
