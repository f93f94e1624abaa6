//! `Communicator::split` against NCCL's documented meaning (ncclCommSplit) and torch's
//! new_group, run as a user runs it: comm-core's `split-check` on real ranks (processes, the
//! store, shared memory or TCP), which prints every rank's group and checks each group's
//! all-reduces while the parent's runs at the same time, on another thread.
//!
//! - the ranks of one color form a group ordered by key, ties by parent rank;
//! - NO_COLOR (-1) takes part and joins nothing;
//! - a group's collectives and its parent's in flight together give right sums (own links);
//! - bad input fails every rank with a message naming the problem, within the timeout: a
//!   negative color other than -1, a rank that never calls split, a group of one asked for a
//!   call between two ranks. No panic, no rank left behind.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use test_support::build::package_example;
use test_support::process::Plainly;

/// Runs split-check on `n` ranks with `flags`.
fn split_check(n: usize, flags: &[&str]) -> (Output, String, String) {
    let out = Command::new(package_example("comm-core", "split-check"))
        .args(["-n", &n.to_string(), "--len", "100000"])
        .args(flags)
        .plainly()
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

/// A rank's group: its name, its rank there, the members (job ranks) in order.
type Seat = (String, usize, Vec<usize>);

/// The rows of every table rank 0 printed (`rank color key group its-rank members`), by table:
/// per rank (its group's name, its rank there, the members in order), None for no group.
fn tables(stdout: &str) -> Vec<Vec<Option<Seat>>> {
    let mut found: Vec<Vec<Option<Seat>>> = Vec::new();
    for line in stdout.lines() {
        if line.starts_with("rank  color") {
            found.push(Vec::new());
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(table) = found.last_mut() else {
            continue;
        };
        if words.len() < 5 || words[0].parse::<usize>().is_err() {
            continue;
        }
        table.push(match words[3] {
            "-" => None,
            _ => Some((
                format!("{} {}", words[3], words[4]),
                words[5].parse().unwrap(),
                words[8..].iter().map(|m| m.parse().unwrap()).collect(),
            )),
        });
    }
    found
}

fn succeeded(out: &Output, stdout: &str, stderr: &str) {
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn ranks_of_a_color_are_ordered_by_key_then_by_parent_rank() {
    for transport in ["shm", "tcp"] {
        let flags = [
            "--colors",
            "1,0,1,0,1,0",
            "--keys",
            "2,0,1,0,1,9",
            "--transport",
            transport,
        ];
        let (out, stdout, stderr) = split_check(6, &flags);
        succeeded(&out, &stdout, &stderr);
        let g = &tables(&stdout)[0];
        // Color 1: ranks 0 (key 2), 2 (key 1), 4 (key 1): keys first, then 2 before 4.
        for (rank, at) in [(2, 0), (4, 1), (0, 2)] {
            assert_eq!(
                g[rank],
                Some(("group 1".into(), at, vec![2, 4, 0])),
                "{stdout}"
            );
        }
        // Color 0: ranks 1 and 3 (key 0, by rank), then 5 (key 9).
        for (rank, at) in [(1, 0), (3, 1), (5, 2)] {
            assert_eq!(
                g[rank],
                Some(("group 0".into(), at, vec![1, 3, 5])),
                "{stdout}"
            );
        }
        // Rank 0's group says what moves its bytes, naming the group.
        assert!(
            stdout.contains(&format!("transport (group 1): {transport}")),
            "{stdout}"
        );
        let at_once = "every group's all-reduces and the job's, at the same time: right on all 6";
        assert!(stdout.contains(at_once), "{stdout}");
    }
}

#[test]
fn a_rank_with_no_color_joins_no_group_and_still_serves_the_parent() {
    let (out, stdout, stderr) = split_check(4, &["--colors", "0,-1,0,0"]);
    succeeded(&out, &stdout, &stderr);
    let g = &tables(&stdout)[0];
    assert_eq!(g[1], None, "{stdout}");
    assert!(stdout.contains("   1     -1    0  -"), "{stdout}");
    assert!(stdout.contains("the job's, at the same time: right on all 4 ranks"));
    for (rank, at) in [(0, 0), (2, 1), (3, 2)] {
        assert_eq!(g[rank], Some(("group 0".into(), at, vec![0, 2, 3])));
    }
}

/// A color NCCL does not define is refused on every rank at once (not at the timeout),
/// naming the rank that gave it.
#[test]
fn a_negative_color_other_than_no_color_fails_every_rank_at_once() {
    let start = Instant::now();
    let (out, stdout, stderr) = split_check(3, &["--colors", "0,-2,0", "--timeout", "60"]);
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    assert!(
        !out.status.success() && !stderr.contains("panicked"),
        "{stdout}\n{stderr}"
    );
    let says = "rank 1 gave color -2: a color is 0 or more, or NO_COLOR (-1, NCCL_SPLIT_NOCOLOR)";
    assert!(stderr.contains(says), "{stderr}");
    for rank in 0..3 {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("error: rank {rank}:"))
                    && l.contains("gave color -2")),
            "rank {rank} says nothing of it:\n{stderr}"
        );
    }
}

/// A rank that never calls split: the others fail within the timeout, naming it.
#[test]
fn a_rank_that_never_splits_is_named_within_the_timeout() {
    let start = Instant::now();
    let (out, stdout, stderr) = split_check(3, &["--skip-rank", "2", "--timeout", "4"]);
    let took = start.elapsed();
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert!(
        !out.status.success() && !stderr.contains("panicked"),
        "{stdout}\n{stderr}"
    );
    let says = "waiting for every rank of comm0 to call split (its split 0); rank 2 never did \
                (ranks 0, 1 did)";
    assert!(stderr.contains(says), "{stderr}");
    assert!(stderr.contains("passes NO_COLOR (-1)"), "{stderr}");
}

#[test]
fn a_group_of_one_asked_for_a_call_between_two_ranks_says_so() {
    let (out, stdout, stderr) = split_check(3, &["--colors", "0,1,1", "--send-recv"]);
    assert!(
        !out.status.success() && !stderr.contains("panicked"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("group 0 is a group of one rank, and this call needs two or more"),
        "{stderr}"
    );
}

#[test]
fn a_ring_step_goes_around_each_group() {
    let (out, stdout, stderr) = split_check(4, &["--colors", "0,1,0,1", "--send-recv"]);
    succeeded(&out, &stdout, &stderr);
    assert!(
        stdout.contains("a message around every group's ring: right on all 4 ranks"),
        "{stdout}"
    );
}

/// init_device_mesh's layout: tensor-parallel groups of consecutive ranks, data-parallel ones
/// across them; each group's all-reduces right while the other's run.
#[test]
fn a_mesh_puts_consecutive_ranks_in_a_tensor_parallel_group() {
    let (out, stdout, stderr) = split_check(6, &["--mesh", "2"]);
    succeeded(&out, &stdout, &stderr);
    let t = tables(&stdout);
    for (rank, (tp_seat, dp_seat)) in t[0].iter().zip(&t[1]).enumerate() {
        let (row, column) = (rank / 2, rank % 2);
        let tp = (format!("tp {row}"), column, vec![2 * row, 2 * row + 1]);
        assert_eq!(tp_seat, &Some(tp), "{stdout}");
        let dp = (
            format!("dp {column}"),
            row,
            vec![column, column + 2, column + 4],
        );
        assert_eq!(dp_seat, &Some(dp), "{stdout}");
    }
    let both = "the dp groups' all-reduces and the tp groups', at the same time: right on all 6";
    assert!(stdout.contains(both), "{stdout}");
    let (out, _, stderr) = split_check(6, &["--mesh", "4"]);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("a mesh of dp 1 x tp 4 needs 4 ranks, and there are 6"),
        "{stderr}"
    );
}

/// Ranks started by hand (as torchrun or srun start them) with different meshes: both shapes
/// fit two ranks, so only the split can see they differ, and every rank says so at once.
#[test]
fn ranks_given_different_meshes_fail_at_once_naming_both() {
    let port = comm_core::spawn::free_port().unwrap();
    let start = Instant::now();
    let ranks: Vec<_> = [("0", "2"), ("1", "1")]
        .into_iter()
        .map(|(rank, tp)| {
            Command::new(package_example("comm-core", "split-check"))
                .args(["--mesh", tp, "--timeout", "60"])
                .env("RANK", rank)
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .spawn_output()
        })
        .collect();
    for (rank, ended) in ranks.into_iter().map(|r| r.join().unwrap()).enumerate() {
        let stderr = String::from_utf8_lossy(&ended.stderr);
        assert!(!ended.status.success(), "rank {rank}: {stderr}");
        assert!(
            stderr.contains(
                "rank 0 splits for a mesh of dp 1 x tp 2 (dp,tp) but rank 1 for a mesh of dp 2 x tp 1 (dp,tp)"
            ),
            "rank {rank}: {stderr}"
        );
    }
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
}

/// Runs a command on a thread of its own, collecting its output.
trait SpawnOutput {
    fn spawn_output(&mut self) -> std::thread::JoinHandle<Output>;
}

impl SpawnOutput for Command {
    fn spawn_output(&mut self) -> std::thread::JoinHandle<Output> {
        let child = self
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::spawn(move || child.wait_with_output().unwrap())
    }
}

/// `--trace` names the groups: each group's calls and messages carry its name (`tp 0:
/// all_reduce`), on the job rank's own track, and each group's arrows pair up by their own ids.
/// Through the rings (`--copy ring`): on registered buffers, the default on one host, a call
/// sends no message.
#[test]
fn a_trace_names_each_group() {
    let dir = test_support::process::scratch("split-trace");
    let file = dir.join("trace.json");
    let trace = file.to_str().unwrap();
    let args = ["--mesh", "2", "--copy", "ring", "--trace", trace];
    let (out, stdout, stderr) = split_check(4, &args);
    succeeded(&out, &stdout, &stderr);
    let text = std::fs::read_to_string(&file).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let named = |pid: u64, name: &str| {
        events
            .iter()
            .any(|e| e["pid"] == pid && e["cat"] == "call" && e["name"] == name)
    };
    for rank in 0..4u64 {
        let (row, column) = (rank / 2, rank % 2);
        assert!(named(rank, &format!("tp {row}: all_reduce")), "rank {rank}");
        assert!(
            named(rank, &format!("dp {column}: all_reduce")),
            "rank {rank}"
        );
    }
    let mut ends = std::collections::BTreeMap::<String, (usize, usize)>::new();
    for e in events.iter().filter(|e| e["cat"] == "message") {
        let id = e["id"].as_str().unwrap().to_string();
        let end = ends.entry(id).or_default();
        match e["ph"].as_str() {
            Some("s") => end.0 += 1,
            _ => end.1 += 1,
        }
    }
    assert!(
        ends.keys().any(|id| id.starts_with("tp 1:")),
        "{:?}",
        ends.keys()
    );
    assert!(ends.keys().any(|id| id.starts_with("dp 0:")));
    assert!(
        ends.values().all(|&(s, f)| s == 1 && f == 1),
        "unpaired arrows"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
