//! A rank that vanishes (SIGKILL: no chance to say anything) ends every other rank within 2 s, in
//! whatever phase they are, with a line naming it and what they were doing; a rank that is
//! stopped (SIGSTOP) ends the job at the call's one deadline. The ranks are started one by one,
//! as by hand, srun or torchrun would: no parent of ours sees a rank die, only the store does.
//!
//! This test binary is its own distributed program: re-executed with `SCENARIO` set, the test
//! function runs a rank instead of checking.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use comm_core::launch::run_job_settings;
use comm_core::Settings;
use comm_core::{BackendChoice, ReduceOp};
use test_support::process::{assert_all_gone, scratch, start, wait_for_pids_in, Plainly, Running};

/// The rule: a vanished rank is news to the others within this.
const NEWS: Duration = Duration::from_secs(2);

/// One rank of `scenario`: writes `<phase>-<rank>` with its pid in `PID_DIR` as it reaches each
/// point the test waits for, then goes on (rank 1 of "finishing" idles before the end instead).
fn as_rank(scenario: &str) -> ! {
    let timeout: f64 = std::env::var("JOB_TIMEOUT").unwrap().parse().unwrap();
    let settings = Settings {
        // Ignored where the ranks are started by hand (RANK is set).
        ranks: Some(3),
        backend: BackendChoice::Cpu,
        timeout: Duration::from_secs_f64(timeout),
        ..Settings::default()
    };
    let mark = |point: &str, rank: usize| {
        let dir = std::env::var("PID_DIR").unwrap();
        let file = Path::new(&dir).join(format!("{point}-{rank}"));
        std::fs::write(file, std::process::id().to_string()).unwrap();
    };
    let code = run_job_settings(&settings, None, |job| {
        let rank = job.topology().rank;
        mark("joined", rank);
        let comm = job.communicator(BackendChoice::Cpu)?;
        mark("connected", rank);
        let mut buf = comm.buffer(&vec![1.0f32; 1 << 16])?;
        let rounds = if scenario == "finishing" { 3 } else { u32::MAX };
        for _ in 0..rounds {
            comm.all_reduce(&mut buf, ReduceOp::Sum)?;
        }
        if rank == 1 {
            std::thread::sleep(Duration::from_secs(600));
        }
        Ok(())
    });
    std::process::exit(code)
}

/// Rank `rank` of a job of `world_size` ranks started by hand at `port`.
fn rank(
    test: &str,
    scenario: &str,
    rank: usize,
    world_size: usize,
    port: u16,
    dir: &Path,
) -> Running {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .plainly()
        .env("SCENARIO", scenario)
        .env("JOB_TIMEOUT", "60")
        .env("PID_DIR", dir)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world_size.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string());
    start(&mut command)
}

/// Waits for the files `<point>-<rank>` of `ranks`: their pids.
fn reached(dir: &Path, point: &str, ranks: &[usize]) -> Vec<i32> {
    let names: Vec<String> = ranks.iter().map(|r| format!("{point}-{r}")).collect();
    wait_for_pids_in(dir, &names, Duration::from_secs(30))
}

/// SIGKILL to `pid`.
fn kill(pid: i32) {
    // SAFETY: kill(2) on a rank this test started and has not reaped: its pid is still its own.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
}

/// Waits for a survivor: it must fail within [`NEWS`] of `since` (plus a margin for a loaded
/// machine's process start-up, not for the news itself) with a line naming `gone` and `phase`.
fn ends_naming(survivor: Running, since: Instant, gone: usize, pid: i32, phase: &str) {
    let finished = survivor.finish(Duration::from_secs(30));
    let took = since.elapsed();
    let stderr = finished.stderr;
    assert_ne!(finished.status.code(), Some(0), "{stderr}");
    assert!(
        took < NEWS,
        "ended {took:?} after rank {gone} vanished:\n{stderr}"
    );
    let named = format!("rank {gone} (pid {pid} at 127.0.0.1:");
    assert!(stderr.contains(&named), "{named}:\n{stderr}");
    assert!(stderr.contains(") vanished while rank "), "{stderr}");
    assert!(stderr.contains(phase), "{phase}:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_rank_killed_while_the_others_meet_and_connect_is_named_at_once() {
    const TEST: &str = "a_rank_killed_while_the_others_meet_and_connect_is_named_at_once";
    if let Ok(scenario) = std::env::var("SCENARIO") {
        as_rank(&scenario);
    }
    let dir = scratch("vanished-connecting");
    let port = comm_core::spawn::free_port().unwrap();
    // Ranks 0 and 1 of 3 have met at the store and wait for rank 2 (not started) to build their
    // links: the phase where a dead rank used to cost the others their whole timeout.
    let zero = rank(TEST, "connecting", 0, 3, port, &dir);
    let one = rank(TEST, "connecting", 1, 3, port, &dir);
    let pids = reached(&dir, "joined", &[0, 1]);
    std::thread::sleep(Duration::from_millis(300));
    kill(pids[1]);
    let since = Instant::now();
    one.finish(Duration::from_secs(5));
    ends_naming(
        zero,
        since,
        1,
        pids[1],
        "while rank 0 was connecting to the other ranks",
    );
}

/// Three ranks started by hand loop on all_reduce; `victim` is killed in the middle. Every
/// survivor must fail within [`NEWS`], without a panic: their stderr by rank, the pids, the port.
fn kill_mid_collective(test: &str, victim: usize) -> (Vec<(usize, String)>, Vec<i32>, u16) {
    let dir = scratch(&format!("vanished-collective-{victim}"));
    let port = comm_core::spawn::free_port().unwrap();
    let ranks: Vec<Running> = (0..3)
        .map(|r| rank(test, "collective", r, 3, port, &dir))
        .collect();
    let pids = reached(&dir, "connected", &[0, 1, 2]);
    std::thread::sleep(Duration::from_millis(300));
    kill(pids[victim]);
    let since = Instant::now();
    let mut survivors = Vec::new();
    for (survivor, running) in ranks.into_iter().enumerate().filter(|(r, _)| *r != victim) {
        let finished = running.finish(Duration::from_secs(30));
        let stderr = finished.stderr;
        assert_ne!(finished.status.code(), Some(0), "{stderr}");
        let took = since.elapsed();
        assert!(took < NEWS, "rank {survivor} took {took:?}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        survivors.push((survivor, stderr));
    }
    assert_all_gone(&pids);
    (survivors, pids, port)
}

#[test]
fn a_rank_killed_in_a_collective_is_named_at_once() {
    const TEST: &str = "a_rank_killed_in_a_collective_is_named_at_once";
    if let Ok(scenario) = std::env::var("SCENARIO") {
        as_rank(&scenario);
    }
    let (survivors, pids, _) = kill_mid_collective(TEST, 2);
    for (survivor, stderr) in survivors {
        // Its shared-memory link to rank 2 may tell first, or the store: either names rank 2.
        assert!(
            stderr.contains(&format!("rank 2 (pid {} at ", pids[2]))
                || stderr.contains("rank 2 closed its connection"),
            "rank {survivor}:\n{stderr}"
        );
    }
}

#[test]
fn the_stores_own_rank_killed_in_a_collective_is_named_at_once() {
    const TEST: &str = "the_stores_own_rank_killed_in_a_collective_is_named_at_once";
    if let Ok(scenario) = std::env::var("SCENARIO") {
        as_rank(&scenario);
    }
    let (survivors, _, port) = kill_mid_collective(TEST, 0);
    for (survivor, stderr) in survivors {
        // The store went with rank 0 (its host named by the endpoint), or a link to it closed.
        assert!(
            stderr.contains(&format!("lost the rendezvous store at 127.0.0.1:{port}"))
                || stderr.contains("rank 0 closed its connection"),
            "rank {survivor}:\n{stderr}"
        );
    }
}

#[test]
fn a_rank_killed_while_the_others_finish_is_named_at_once() {
    const TEST: &str = "a_rank_killed_while_the_others_finish_is_named_at_once";
    if let Ok(scenario) = std::env::var("SCENARIO") {
        as_rank(&scenario);
    }
    let dir = scratch("vanished-finishing");
    let port = comm_core::spawn::free_port().unwrap();
    // Rank 1 idles after its last all-reduce; ranks 0 and 2 wait for it at the end.
    let mut ranks: Vec<Running> = (0..3)
        .map(|r| rank(TEST, "finishing", r, 3, port, &dir))
        .collect();
    let pids = reached(&dir, "connected", &[0, 1, 2]);
    std::thread::sleep(Duration::from_millis(500));
    kill(pids[1]);
    let since = Instant::now();
    let two = ranks.pop().unwrap();
    ranks.pop().unwrap().finish(Duration::from_secs(5));
    let zero = ranks.pop().unwrap();
    ends_naming(two, since, 1, pids[1], "while rank 2 was finishing");
    ends_naming(zero, since, 1, pids[1], "while rank 0 was finishing");
}

#[test]
fn a_stopped_rank_ends_the_job_at_the_calls_one_deadline() {
    const TEST: &str = "a_stopped_rank_ends_the_job_at_the_calls_one_deadline";
    if let Ok(scenario) = std::env::var("SCENARIO") {
        as_rank(&scenario);
    }
    // Started by the program itself (-n 3, as `cargo run --example` does), timeout 3 s.
    let dir = scratch("stopped");
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .plainly()
        .env("SCENARIO", "collective")
        .env("JOB_TIMEOUT", "3")
        .env("PID_DIR", &dir);
    let job = start(&mut command);
    let pids = reached(&dir, "connected", &[0, 1, 2]);
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill(2) on a rank of the job this test started: its pid is still its own.
    assert_eq!(unsafe { libc::kill(pids[1], libc::SIGSTOP) }, 0);
    let since = Instant::now();
    let finished = job.finish(Duration::from_secs(30));
    let took = since.elapsed();
    assert_ne!(finished.status.code(), Some(0), "{}", finished.stderr);
    // One deadline for the call (3 s, begun before the stop), then at most a second of rank 0
    // serving the store and the stopped rank's SIGTERM with its SIGCONT.
    assert!(
        took < Duration::from_secs(3) + NEWS,
        "took {took:?}:\n{}",
        finished.stderr
    );
    assert!(
        finished
            .stderr
            .contains("timed out after 3s waiting for rank 1"),
        "{}",
        finished.stderr
    );
    assert_all_gone(&pids);
}
