//! `--trace`, run as a user runs it: the file is read by a strict JSON parser and checked for
//! every rank's track, every collective call, and an arrow from each send to its receive; then
//! drawn by `comm-bench timeline`.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use test_support::build::{binary, example};
use test_support::picture::book_picture_has_the_shape_of;
use test_support::process::{scratch, Plainly};

/// Runs `program args` in `dir`; its stdout.
fn run_in(dir: &Path, program: &Path, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .plainly()
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{args:?}: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn events<'a>(trace: &'a Value, ph: &str) -> Vec<&'a Value> {
    let all = trace["traceEvents"].as_array().expect("traceEvents");
    all.iter().filter(|e| e["ph"] == ph).collect()
}

/// Checks what every trace must hold: a named track per rank, `calls` collective calls on each,
/// every arrow's two ends (on one host the receive never ends before the send began).
fn check(trace: &Value, n: usize, call: &str, calls: usize) {
    let names: Vec<&str> = events(trace, "M")
        .iter()
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    for rank in 0..n {
        assert!(
            names.contains(&format!("rank {rank}").as_str()),
            "{names:?}"
        );
        let on_rank = events(trace, "X")
            .into_iter()
            .filter(|e| e["pid"] == rank && e["cat"] == "call" && e["name"] == call)
            .count();
        assert_eq!(on_rank, calls, "rank {rank}'s {call} calls");
    }
    let starts = events(trace, "s");
    let ends = events(trace, "f");
    assert_eq!(starts.len(), ends.len(), "every arrow has both ends");
    for end in &ends {
        let start = starts
            .iter()
            .find(|s| s["id"] == end["id"])
            .expect("a start");
        assert!(
            end["ts"].as_f64() >= start["ts"].as_f64(),
            "{start} -> {end}"
        );
    }
    let ranks = trace["otherData"]["ranks"].as_array().expect("notes");
    assert_eq!(ranks.len(), n);
    assert!(ranks.iter().all(|r| r["dropped_events"] == 0), "{ranks:?}");
}

fn read_trace(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).expect("a trace is JSON")
}

#[test]
fn a_ring_all_reduce_traces_every_step_of_every_rank() {
    for n in [2usize, 4] {
        let dir = scratch(&format!("trace-ring-{n}"));
        let args = [
            "-n",
            &n.to_string(),
            "--len",
            "100000",
            "--algo",
            "ring",
            "--backend",
            "cpu",
        ];
        // cargo run --example 02-allreduce -- -n 4 --len 100000 --algo ring --backend cpu --trace out/ring.json
        let trace_args = [&args[..], &["--trace", "ring.json"]].concat();
        let stdout = run_in(&dir, &example("02-allreduce"), &trace_args);
        assert!(stdout.contains("trace: ring.json"), "{stdout}");
        let trace = read_trace(&dir.join("ring.json"));
        check(&trace, n, "all_reduce", 1);
        // 2(n-1) ring steps a rank, each sending one message and receiving one.
        let steps = events(&trace, "X")
            .into_iter()
            .filter(|e| e["cat"] == "sendrecv")
            .count();
        assert_eq!(steps, n * 2 * (n - 1));
        assert_eq!(events(&trace, "s").len(), n * 2 * (n - 1));
        // Each reduce-scatter step reduces what arrived (one piece: a block of 400 KB / n),
        // inside its exchange, on the same rank and thread.
        let slices = events(&trace, "X");
        let reduces: Vec<_> = slices.iter().filter(|e| e["cat"] == "reduce").collect();
        assert_eq!(reduces.len(), n * (n - 1));
        for r in reduces {
            let (start, end) = (
                r["ts"].as_f64().unwrap(),
                r["ts"].as_f64().unwrap() + r["dur"].as_f64().unwrap(),
            );
            let inside = slices.iter().any(|e| {
                let from = e["ts"].as_f64().unwrap();
                e["cat"] == "sendrecv"
                    && e["pid"] == r["pid"]
                    && e["tid"] == r["tid"]
                    && from <= start
                    && end <= from + e["dur"].as_f64().unwrap()
            });
            assert!(inside, "{r} lies inside an exchange");
        }
        let parts = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(parts, 1, "the ranks' parts are merged and removed");
        // target/release/comm-bench timeline out/ring.json -o out/ring-timeline.svg
        let timeline = ["timeline", "ring.json", "-o", "ring-timeline.svg"];
        let drawn = run_in(&dir, &binary("comm-bench", "comm-bench"), &timeline);
        assert!(drawn.contains("slices"), "{drawn}");
        let svg = std::fs::read_to_string(dir.join("ring-timeline.svg")).unwrap();
        assert_eq!(svg.matches("marker-end").count(), n * 2 * (n - 1));
        if n == 4 {
            book_picture_has_the_shape_of(&svg, "ring-timeline.svg");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The direct all-reduce (small buffers) over messages (`--copy ring`: on registered buffers,
/// the default on one host, no message crosses): every rank exchanges with every other, and
/// copies its input in beside theirs and the sum out.
#[test]
fn a_direct_all_reduce_shows_its_exchanges_and_copies() {
    let dir = scratch("trace-direct");
    let args = [
        "-n",
        "3",
        "--backend",
        "cpu",
        "--copy",
        "ring",
        "--trace",
        "d.json",
    ];
    run_in(&dir, &example("02-allreduce"), &args);
    let trace = read_trace(&dir.join("d.json"));
    check(&trace, 3, "all_reduce", 1);
    let slices = events(&trace, "X");
    for rank in 0..3 {
        let count = |cat: &str| {
            let mine = |e: &&&Value| e["pid"] == rank && e["cat"] == cat;
            slices.iter().filter(mine).count()
        };
        assert_eq!((count("sendrecv"), count("copy")), (2, 2), "rank {rank}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Tree against chain, as docs/src/watching.md draws them: a 4 MB broadcast on 4 ranks.
#[test]
fn tree_and_chain_broadcasts_send_what_their_schedules_say() {
    let dir = scratch("trace-broadcast");
    // 4 MB is 4 segments of the chain's 1 MiB: each crosses 3 hops; the tree sends 3 messages.
    for (algo, messages) in [("tree", 3), ("chain", 4 * 3)] {
        let file = format!("{algo}.json");
        let picture = format!("broadcast-{algo}-timeline.svg");
        // cargo run --example 01-broadcast -- -n 4 --len 1048576 --algo tree --backend cpu --trace out/tree.json
        let args = [
            "-n",
            "4",
            "--len",
            "1048576",
            "--algo",
            algo,
            "--backend",
            "cpu",
        ];
        run_in(
            &dir,
            &example("01-broadcast"),
            &[&args[..], &["--trace", &file]].concat(),
        );
        let trace = read_trace(&dir.join(&file));
        check(&trace, 4, "broadcast", 1);
        assert_eq!(events(&trace, "s").len(), messages, "{algo}");
        // target/release/comm-bench timeline out/tree.json -o out/broadcast-tree-timeline.svg
        let timeline = ["timeline", file.as_str(), "-o", picture.as_str()];
        run_in(&dir, &binary("comm-bench", "comm-bench"), &timeline);
        let svg = std::fs::read_to_string(dir.join(&picture)).unwrap();
        book_picture_has_the_shape_of(&svg, &picture);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A timed loop as a profiler shows one, as docs/src/profiling.md draws it: the warm-up calls,
/// the one untimed call after them, the timed calls, then one small all-reduce that gathers the
/// times (every rank's total and each iteration's, as f64). The barriers between them are not
/// calls: on the CPU they are exchanges of their own. Inside each call, on registered buffers
/// (the default on one host), two barriers and the read of the peer's half.
#[test]
fn a_timed_loop_shows_warm_up_untimed_and_timed_calls() {
    let dir = scratch("trace-profile");
    let (ranks, warmup, iters) = (2usize, 1usize, 3usize);
    // cargo run --example 03-multinode-gloo-vs-nccl -- -n 2 --size-mb 1 --warmup 1 --iters 3 --backend cpu --trace out/profile.json
    let args = [
        "-n",
        "2",
        "--size-mb",
        "1",
        "--warmup",
        "1",
        "--iters",
        "3",
        "--backend",
        "cpu",
        "--trace",
        "profile.json",
    ];
    run_in(&dir, &example("03-multinode-gloo-vs-nccl"), &args);
    let trace = read_trace(&dir.join("profile.json"));
    let big = warmup + 1 + iters;
    check(&trace, ranks, "all_reduce", big + 1);
    for rank in 0..ranks {
        let sizes: Vec<u64> = events(&trace, "X")
            .into_iter()
            .filter(|e| e["pid"] == rank && e["cat"] == "call")
            .map(|e| e["args"]["bytes"].as_u64().unwrap())
            .collect();
        let mut want = vec![1_000_000; big];
        want.push(8 * (ranks + iters) as u64);
        assert_eq!(sizes, want, "rank {rank}'s calls in order");
    }
    // target/release/comm-bench timeline out/profile.json -o out/profile-timeline.svg
    let timeline = ["timeline", "profile.json", "-o", "profile-timeline.svg"];
    run_in(&dir, &binary("comm-bench", "comm-bench"), &timeline);
    let svg = std::fs::read_to_string(dir.join("profile-timeline.svg")).unwrap();
    book_picture_has_the_shape_of(&svg, "profile-timeline.svg");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The two ways bytes cross between ranks of a host, as docs/src/transports.md draws them: a
/// 4 MiB broadcast on 2 ranks through the rings (the sender copies every piece in, the receiver
/// copies it out), by one copy (the receiver reads the sender's buffer, the sender copies
/// nothing), and from registered buffers (the receiver copies the sender's buffer where it lies,
/// between two barriers, and no message crosses).
#[test]
fn the_rings_copy_twice_and_the_single_copy_reads_once() {
    let dir = scratch("trace-copies");
    for copy in ["ring", "single", "registered"] {
        let file = format!("{copy}.json");
        let picture = format!("transports-{copy}-timeline.svg");
        // cargo run --example 01-broadcast -- -n 2 --len 1048576 --backend cpu --copy ring --trace out/ring.json
        let args = [
            "-n",
            "2",
            "--len",
            "1048576",
            "--backend",
            "cpu",
            "--copy",
            copy,
        ];
        let out = run_in(
            &dir,
            &example("01-broadcast"),
            &[&args[..], &["--trace", &file]].concat(),
        );
        assert!(out.contains(&format!("(--copy {copy})")), "{out}");
        let trace = read_trace(&dir.join(&file));
        check(&trace, 2, "broadcast", 1);
        let slices = events(&trace, "X");
        let count = |rank: usize, name: &str| {
            let mine = |e: &&&Value| e["pid"] == rank && e["name"] == name;
            slices.iter().filter(mine).count()
        };
        let bytes = |rank: usize, cat: &str| -> u64 {
            let mine = |e: &&&Value| e["pid"] == rank && e["cat"] == cat;
            let sized = slices.iter().filter(mine);
            sized.map(|e| e["args"]["bytes"].as_u64().unwrap()).sum()
        };
        let (into, out_of, read) = (
            "copy into the ring",
            "copy out of the ring",
            "read the sender's buffer",
        );
        let barriers = |rank: usize| count(rank, "wait for every rank");
        match copy {
            "ring" => {
                assert!(count(0, into) > 1, "the message crosses in pieces");
                assert_eq!(count(0, into), count(1, out_of));
                assert_eq!((bytes(0, "ring"), bytes(1, "ring")), (4 << 20, 4 << 20));
                assert_eq!(count(1, read), 0);
            }
            "single" => {
                assert_eq!((count(1, read), bytes(1, "read")), (1, 4 << 20));
                assert_eq!(
                    bytes(0, "ring") + bytes(1, "ring"),
                    0,
                    "no copy through a ring"
                );
            }
            _ => {
                let peer = "read a peer's buffer";
                assert_eq!((count(1, peer), bytes(1, "read")), (1, 4 << 20));
                assert_eq!(
                    (count(0, peer), bytes(0, "read")),
                    (0, 0),
                    "the root reads nothing"
                );
                assert_eq!(bytes(0, "ring") + bytes(1, "ring"), 0, "no ring");
                // The call's two barriers on each rank: all posted, all done reading.
                assert_eq!((barriers(0), barriers(1)), (2, 2));
            }
        }
        // target/release/comm-bench timeline out/ring.json -o out/transports-ring-timeline.svg
        let timeline = ["timeline", file.as_str(), "-o", picture.as_str()];
        run_in(&dir, &binary("comm-bench", "comm-bench"), &timeline);
        let svg = std::fs::read_to_string(dir.join(&picture)).unwrap();
        book_picture_has_the_shape_of(&svg, &picture);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn comm_bench_traces_one_job_and_refuses_several() {
    let dir = scratch("trace-bench");
    let bench = binary("comm-bench", "comm-bench");
    let args = [
        "--world-sizes",
        "2",
        "--backend",
        "cpu",
        "-b",
        "1K",
        "-e",
        "4K",
        "-f",
        "4",
        "-n",
        "2",
        "-w",
        "1",
    ];
    run_in(&dir, &bench, &[&args[..], &["--trace", "c.json"]].concat());
    let trace = read_trace(&dir.join("c.json"));
    let calls = events(&trace, "X")
        .into_iter()
        .filter(|e| e["cat"] == "call")
        .count();
    assert!(
        calls > 2 * 2 * 3,
        "warm-up, timed and checked calls of 2 sizes, 2 placements: {calls}"
    );
    let refused = Command::new(&bench)
        .args(["--world-sizes", "2,3", "--trace", "x.json"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--trace records one job"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
