//! Example 06 trains right, checked by running it as a user does:
//!
//! - N ranks with batch b follow, step by step, the loss of one rank with batch N·b on the same
//!   samples in the same order (N = 2 and 4, 24 steps), within float rounding;
//! - every rank ends with the same weights (the checksums each prints);
//! - overlapping the buckets' all-reduces with backward changes when they run, not what they
//!   compute: the losses with and without `--no-overlap` are the same bits;
//! - bad flags are refused with a message and exit code 2, no panic.
//!
//! The PyTorch twin (python/ddp_twin.py under torchrun) is checked in tests/torchrun.rs.

use std::path::Path;
use std::process::Command;

use test_support::build::example;
use test_support::picture::book_picture_has_the_shape_of;
use test_support::process::{scratch, Plainly};

/// The flags every run here shares: a narrow model and few steps, a few seconds in all.
const SMALL: [&str; 6] = ["--hidden", "64", "--iters", "24", "--log-every", "1"];

/// Runs 06 on `n` ranks with batch `batch` and `extra` flags, dumping into `dir`; its stdout
/// and the losses it wrote (full precision).
fn train(n: usize, batch: usize, extra: &[&str], dir: &Path) -> (String, Vec<f64>) {
    let n_text = n.to_string();
    let batch_text = batch.to_string();
    let out = Command::new(example("06-ddp-training"))
        .args(["-n", &n_text, "--batch", &batch_text, "--dump"])
        .arg(dir)
        .args(SMALL)
        .args(extra)
        .plainly()
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let losses = std::fs::read_to_string(dir.join("losses.txt")).unwrap();
    let losses = losses.lines().map(|l| l.parse().unwrap()).collect();
    (stdout, losses)
}

/// Every rank's `Rank R: weights XXXXXXXX, …` line: one per rank, all the same checksum.
fn same_weights_everywhere(stdout: &str, n: usize) -> String {
    let mut sums: Vec<(usize, String)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("Rank "))
        .filter_map(|l| {
            let (rank, rest) = l.split_once(": weights ")?;
            Some((rank.parse().ok()?, rest.split(',').next()?.to_string()))
        })
        .collect();
    sums.sort();
    let ranks: Vec<usize> = sums.iter().map(|(r, _)| *r).collect();
    assert_eq!(
        ranks,
        (0..n).collect::<Vec<_>>(),
        "one line per rank:\n{stdout}"
    );
    assert!(
        sums.iter().all(|(_, s)| *s == sums[0].1),
        "the ranks' weights differ: {sums:?}"
    );
    sums[0].1.clone()
}

/// The tolerance: the N-rank run sums each gradient over the batch in N pieces (each rank's
/// matrix product, then the all-reduce) where one rank sums it in one; f32 addition is not
/// associative, so the gradients differ in their last bits (f32's epsilon is 1.2e-7), and 24
/// steps of SGD carry that into the loss. Measured here: at most 1.1e-7 relative (N = 2 and 4);
/// allowed: 1e-5, a hundred times that, still far below any real difference (one sample in the
/// wrong rank's batch moves the loss by about 1e-2).
const TOLERANCE: f64 = 1e-5;

#[test]
fn n_ranks_follow_one_rank_with_n_times_the_batch() {
    let dir = scratch("ddp-equivalence");
    let (_, one_2) = train(1, 16, &[], &dir.join("one-16"));
    let (_, one_4) = train(1, 32, &[], &dir.join("one-32"));
    for (n, one) in [(2, &one_2), (4, &one_4)] {
        let (stdout, many) = train(n, 8, &[], &dir.join(format!("ranks-{n}")));
        same_weights_everywhere(&stdout, n);
        assert_eq!(many.len(), 24);
        let worst = one
            .iter()
            .zip(&many)
            .map(|(a, b)| ((a - b) / a).abs())
            .fold(0.0, f64::max);
        eprintln!(
            "{n} ranks x batch 8 vs 1 rank x batch {}: worst relative difference {worst:.2e}",
            8 * n
        );
        assert!(worst < TOLERANCE, "{n} ranks: {many:?}\n1 rank: {one:?}");
        assert!(many[23] < many[0] - 0.1, "it learns: {many:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn overlap_changes_when_not_what() {
    let dir = scratch("ddp-overlap");
    // A small bucket cap: several buckets, so overlap has something to overlap.
    let small = ["--bucket-mb", "0.01"];
    let (with, a) = train(3, 8, &small, &dir.join("overlap"));
    let (without, b) = train(
        3,
        8,
        &[&small[..], &["--no-overlap"]].concat(),
        &dir.join("no"),
    );
    assert_eq!(a, b, "the same bits with and without overlap");
    assert_eq!(
        same_weights_everywhere(&with, 3),
        same_weights_everywhere(&without, 3)
    );
    assert!(with.contains("overlap on") && without.contains("overlap off"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_flags_are_refused_plainly() {
    for (flags, says) in [
        (
            &["--bucket-mb", "0"][..],
            "--bucket-mb 0: give a size above 0",
        ),
        (&["--bucket-mb", "NaN"], "--bucket-mb NaN"),
        (&["--bucket-mb", "1e9"], "at most 1024"),
        (&["--batch", "0"], "--batch 0: give 1 to"),
        (&["--batch", "1000000000"], "--batch 1000000000"),
        (&["--batch", "20000"], "more than the text's"),
        (&["--hidden", "1000000"], "--hidden 1000000"),
        (&["--iters", "0"], "--iters 0"),
        (&["--lr=-1"], "--lr -1"),
    ] {
        let out = Command::new(example("06-ddp-training"))
            .args(flags)
            .plainly()
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{flags:?}: {stderr}");
    }
}

/// The chapter's picture, drawn from a real trace by the commands it shows:
///
///     cargo run --release --example 06-ddp-training -- -n 2 --iters 3 --batch 128 --bucket-mb 0.1 --trace out/ddp.json
///     target/release/comm-bench timeline out/ddp.json -o out/ddp-timeline.svg
///
/// Each bucket is handed to the comm thread as soon as backward has filled it: the last layer's
/// before backward has reached the first layer. (Whether the comm thread then runs at once is
/// the machine's: on a busy 2-core one it may not get a core until backward ends.) The book's
/// picture has the shape drawn now (`NCCL_WORKSHOP_UPDATE_PICTURES=1` writes it anew).
#[test]
fn the_chapters_timeline_shows_backward_and_the_buckets_overlapping() {
    let dir = scratch("ddp-timeline");
    let out = Command::new(example("06-ddp-training"))
        .args([
            "-n",
            "2",
            "--iters",
            "3",
            "--bucket-mb",
            "0.1",
            "--trace",
            "ddp.json",
        ])
        .current_dir(&dir)
        .plainly()
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bench = test_support::build::binary("comm-bench", "comm-bench");
    let drawn = Command::new(bench)
        .args(["timeline", "ddp.json", "-o", "ddp-timeline.svg"])
        .current_dir(&dir)
        .plainly()
        .output()
        .unwrap();
    assert!(
        drawn.status.success(),
        "{}",
        String::from_utf8_lossy(&drawn.stderr)
    );
    let svg = std::fs::read_to_string(dir.join("ddp-timeline.svg")).unwrap();
    // Per rank: the main thread and the comm thread, each a lane.
    assert_eq!(svg.matches(">comm thread</text>").count(), 2);
    // Overlap: on each rank, some bucket's all-reduce (comm thread) runs while a backward
    // layer (main thread) does.
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ddp.json")).unwrap()).unwrap();
    let slices: Vec<(u64, String, f64, f64)> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            let ts = e["ts"].as_f64().unwrap();
            let name = e["name"].as_str().unwrap().to_string();
            (
                e["pid"].as_u64().unwrap(),
                name,
                ts,
                ts + e["dur"].as_f64().unwrap(),
            )
        })
        .collect();
    // With overlap, every step hands bucket 0 (the last layer's) to the comm thread before
    // backward's last layer has started, and the first layer's bucket only after it ended.
    for rank in 0..2 {
        let of = |prefix: &str| -> Vec<(f64, f64)> {
            let on_rank = slices.iter().filter(|s| s.0 == rank);
            on_rank
                .filter(|s| s.1.starts_with(prefix))
                .map(|s| (s.2, s.3))
                .collect()
        };
        let last_layer = of("backward layer 1");
        let (first, final_bucket) = (of("start bucket 0"), of("start bucket 3"));
        assert_eq!(
            (last_layer.len(), first.len(), final_bucket.len()),
            (3, 3, 3)
        );
        for step in 0..3 {
            assert!(
                first[step].0 < last_layer[step].0,
                "rank {rank} step {step}: bucket 0 waited for backward"
            );
            assert!(
                final_bucket[step].0 >= last_layer[step].1,
                "rank {rank} step {step}"
            );
        }
        assert_eq!(of("all-reduce bucket").len(), 4 * 3, "4 buckets x 3 steps");
    }
    book_picture_has_the_shape_of(&svg, "ddp-timeline.svg");
    std::fs::remove_dir_all(&dir).unwrap();
}
