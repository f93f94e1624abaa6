//! The examples refuse what cannot work with a clear message, quickly, instead of allocating
//! until the process dies: a `--len` larger than memory, and `-n` far beyond any node.

use std::process::Command;
use std::time::{Duration, Instant};

use test_support::build::example;
use test_support::process::{start, Plainly};

fn run(name: &str, args: &[&str]) -> test_support::process::Finished {
    let mut c = Command::new(example(name));
    c.args(args).plainly();
    start(&mut c).finish(Duration::from_secs(120))
}

#[test]
fn a_len_larger_than_memory_is_a_usage_error() {
    for name in ["01-broadcast", "02-allreduce"] {
        let started = Instant::now();
        let done = run(
            name,
            &["-n", "2", "--backend", "cpu", "--len", "1000000000000000"],
        );
        // The ranks' usage error (code 1, as report_failure exits), passed on by the parent.
        assert_eq!(done.code_or_signal(), 1, "{name}: {}", done.stderr);
        assert!(
            done.stderr
                .contains("a buffer of 1000000000000000 f32 elements needs 4 PB of host memory"),
            "{name}: {}",
            done.stderr
        );
        assert!(done.stderr.contains("MemAvailable"), "{}", done.stderr);
        assert!(
            !done.stderr.contains("memory allocation"),
            "{}",
            done.stderr
        );
        eprintln!("{name} --len 1e15: {:?}", started.elapsed());
    }
    // Beyond what 64 bits address: refused before any multiplication overflows.
    let done = run(
        "02-allreduce",
        &[
            "-n",
            "1",
            "--backend",
            "cpu",
            "--len",
            "18446744073709551615",
        ],
    );
    assert!(
        done.stderr.contains("more bytes than memory can address"),
        "{}",
        done.stderr
    );
}

#[test]
fn absurd_rank_counts_are_refused_at_once() {
    let started = Instant::now();
    let done = run("01-broadcast", &["-n", "100000"]);
    assert_eq!(done.code_or_signal(), 2, "{}", done.stderr);
    assert!(
        done.stderr
            .contains("-n/--nproc-per-node 100000: at most 1024 ranks on one node"),
        "{}",
        done.stderr
    );
    assert_eq!(done.stderr.lines().count(), 1, "{}", done.stderr);
    let done = {
        let mut c = Command::new(example("00-hello-world"));
        c.env("RANK", "0")
            .env("WORLD_SIZE", "1000000000")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", "1");
        start(&mut c).finish(Duration::from_secs(60))
    };
    assert_eq!(done.code_or_signal(), 2, "{}", done.stderr);
    assert!(
        done.stderr
            .contains("WORLD_SIZE=1000000000: more than 65536 ranks"),
        "{}",
        done.stderr
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// A job needs file descriptors: rank 0's store two per rank, every rank a link per peer, the
/// launcher pipes per rank. More than `ulimit -n` allows is refused before any rank starts,
/// with the number and how to raise it; a soft limit below the need and a hard one above it is
/// raised, and the job runs.
#[test]
fn more_ranks_than_descriptors_allow_are_refused_at_start() {
    let limited = |limit: &str, program: &str, args: &str| {
        let mut c = Command::new("bash");
        c.arg("-c")
            .arg(format!("ulimit {limit} && exec \"$0\" {args}"))
            .arg(example(program))
            .plainly();
        start(&mut c).finish(Duration::from_secs(120))
    };
    let started = Instant::now();
    let done = limited("-n 300", "02-allreduce", "-n 256 --backend cpu");
    assert_eq!(done.code_or_signal(), 2, "{}", done.stderr);
    assert!(
        done.stderr.contains(
            "a job of 256 ranks whose rank 0 runs here (2 per rank for the store it serves, 1 \
             per peer link) needs 832 file descriptors, and this process may open 300"
        ) && done.stderr.contains("ulimit -n 832"),
        "{}",
        done.stderr
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // A rank a launcher started: rank 0 of 4096 serves the store.
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg("ulimit -n 1000 && exec \"$0\"")
        .arg(example("00-hello-world"))
        .plainly()
        .env("RANK", "0")
        .env("WORLD_SIZE", "4096")
        .env("MASTER_ADDR", "127.0.0.1")
        .env(
            "MASTER_PORT",
            comm_core::spawn::free_port().unwrap().to_string(),
        );
    let done = start(&mut c).finish(Duration::from_secs(60));
    assert_ne!(done.code_or_signal(), 0, "{}", done.stderr);
    assert!(
        done.stderr.contains(
            "rank 0 of a job of 4096 ranks (2 per rank for the store it serves, 1 per peer \
             link) needs 12351 file descriptors"
        ),
        "{}",
        done.stderr
    );
    // Only the soft limit is low: raised to what the job needs, and it runs.
    let done = limited("-S -n 200", "02-allreduce", "-n 128 --backend cpu --len 4");
    done.assert_success("128 ranks under a soft limit of 200");
}
