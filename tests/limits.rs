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
                .contains("a buffer of 1000000000000000 f32 elements needs 8 PB of host memory"),
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
