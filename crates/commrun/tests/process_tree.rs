//! commrun leaves nothing behind: what a worker started goes with it when a worker fails and
//! when commrun is interrupted (SIGINT, as Ctrl-C), and absurd rank counts are refused at once.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use test_support::process::{assert_all_gone, scratch, start, wait_for_pids_in, Plainly};

const COMMRUN: &str = env!("CARGO_BIN_EXE_commrun");

fn commrun(args: &[&str]) -> Command {
    let mut command = Command::new(COMMRUN);
    command.args(args).plainly().stdin(Stdio::null());
    command
}

/// A worker script: start a grandchild (`sleep 1000`), write its pid to DIR/RANK and the
/// worker's to DIR/wRANK, wait until every worker has, then `then`.
fn script(dir: &std::path::Path, then: &str) -> String {
    let d = dir.display();
    format!(
        "sleep 1000 & echo $$ > {d}/w$RANK; echo $! > {d}/$RANK; \
         while [ ! -s {d}/0 ] || [ ! -s {d}/1 ]; do sleep 0.05; done; {then}"
    )
}

/// The grandchildren's pids (files 0, 1) and the workers' (w0, w1).
fn pids(dir: &std::path::Path) -> Vec<i32> {
    wait_for_pids_in(dir, &["0", "1", "w0", "w1"], Duration::from_secs(30))
}

#[test]
fn a_failing_worker_leaves_no_grandchild() {
    let dir = scratch("commrun-tree-fail");
    let script = script(&dir, "if [ $RANK = 1 ]; then exit 7; fi; wait");
    let started = Instant::now();
    let job = start(&mut commrun(&[
        "--nproc-per-node",
        "2",
        "--shutdown-timeout",
        "2",
        "sh",
        "-c",
        &script,
    ]));
    let pids = pids(&dir);
    let done = job.finish(Duration::from_secs(60));
    assert_eq!(done.code_or_signal(), 7, "{}", done.stderr);
    assert!(
        done.stderr.contains("rank 1 exited with code 7"),
        "{}",
        done.stderr
    );
    assert_all_gone(&pids);
    eprintln!("failing worker: {:?}", started.elapsed());
}

#[test]
fn ctrl_c_leaves_no_grandchild() {
    let dir = scratch("commrun-tree-int");
    let script = script(&dir, "wait");
    let job = start(&mut commrun(&[
        "--nproc-per-node",
        "2",
        "--shutdown-timeout",
        "2",
        "sh",
        "-c",
        &script,
    ]));
    let pids = pids(&dir);
    let started = Instant::now();
    job.signal(libc::SIGINT);
    let done = job.finish(Duration::from_secs(60));
    assert_eq!(done.code_or_signal(), 130, "{}", done.stderr);
    assert!(
        done.stderr.contains("interrupted by signal 2"),
        "{}",
        done.stderr
    );
    assert_all_gone(&pids);
    eprintln!("ctrl-c: {:?}", started.elapsed());
}

#[test]
fn absurd_rank_counts_are_refused_at_once() {
    let started = Instant::now();
    for (args, expected) in [
        (
            vec!["--nproc-per-node", "100000", "true"],
            "--nproc-per-node 100000: at most 1024 ranks on one node",
        ),
        (
            vec![
                "--nproc-per-node",
                "1000",
                "--nnodes",
                "1000000",
                "--node-rank",
                "0",
                "--master-addr",
                "h",
                "true",
            ],
            "more than 65536 ranks",
        ),
    ] {
        let done = start(&mut commrun(&args)).finish(Duration::from_secs(30));
        assert_eq!(done.code_or_signal(), 2, "{args:?}: {}", done.stderr);
        assert!(done.stderr.contains(expected), "{args:?}: {}", done.stderr);
        assert_eq!(done.stderr.lines().count(), 1, "{}", done.stderr);
    }
    assert!(started.elapsed() < Duration::from_secs(20));
}
