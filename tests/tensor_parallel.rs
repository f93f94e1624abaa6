//! Example 07 trains right, checked by running it as a user does:
//!
//! - a dp × tp mesh follows, step by step, the loss of one rank (example 06) with the whole
//!   global batch on the same samples, within float rounding: `-n 4 --tp 2` (dp 2) and
//!   `-n 2 --tp 2` (dp 1), 24 steps;
//! - the ranks that hold the same shard (one data-parallel group) end with the same weights, and
//!   the two shards differ;
//! - each step moves what the split says: two tensor-parallel all-reduces (B x hidden floats
//!   forward, B x context x embed backward), the shard's gradients and the loss over dp;
//! - bad flags are refused with a message and exit code 2 (or every rank's error), no panic.
//!
//! The PyTorch twin (python/tp_twin.py under torchrun) is checked in tests/torchrun.rs.

use std::path::Path;
use std::process::Command;

use test_support::build::example;
use test_support::process::{scratch, Plainly};

/// The flags every run here shares: a narrow model and few steps.
const SMALL: [&str; 6] = ["--hidden", "64", "--iters", "24", "--log-every", "1"];

/// Runs `program` with `flags` and the small model, dumping into `dir`: its stdout, and the
/// losses it wrote (full precision) in `losses` under `dir`.
fn train(program: &str, flags: &[&str], dir: &Path, losses: &str) -> (String, Vec<f64>) {
    let out = Command::new(example(program))
        .args(flags)
        .args(SMALL)
        .arg("--dump")
        .arg(dir)
        .plainly()
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let losses = std::fs::read_to_string(dir.join(losses)).unwrap();
    (stdout, losses.lines().map(|l| l.parse().unwrap()).collect())
}

/// Every rank's `Rank R (dp rank I, tp rank J): weights XXXXXXXX` line: (J, checksum) by R.
fn checksums(stdout: &str, n: usize) -> Vec<(usize, String)> {
    let mut found: Vec<(usize, usize, String)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("Rank "))
        .filter_map(|l| {
            let (rank, rest) = l.split_once(" (dp rank ")?;
            let (_, rest) = rest.split_once(", tp rank ")?;
            let (j, rest) = rest.split_once("): weights ")?;
            let sum = rest.split(',').next()?.to_string();
            Some((rank.parse().ok()?, j.parse().ok()?, sum))
        })
        .collect();
    found.sort();
    let ranks: Vec<usize> = found.iter().map(|f| f.0).collect();
    assert_eq!(
        ranks,
        (0..n).collect::<Vec<_>>(),
        "one line per rank:\n{stdout}"
    );
    found.into_iter().map(|(_, j, sum)| (j, sum)).collect()
}

/// As tests/ddp.rs's: the split sums each product in pieces (tp's partial products, then their
/// all-reduce; dp's gradients, then theirs) where one rank sums it at once; f32 rounding
/// differs in the last bits and 24 steps of SGD carry it into the loss. Measured here: about
/// 1e-7 relative; allowed 1e-5, far below what one misplaced weight or sample would move (1e-2).
const TOLERANCE: f64 = 1e-5;

fn worst(one: &[f64], many: &[f64]) -> f64 {
    assert_eq!(one.len(), many.len());
    one.iter()
        .zip(many)
        .map(|(a, b)| ((a - b) / a).abs())
        .fold(0.0, f64::max)
}

#[test]
fn a_mesh_follows_one_rank_with_the_whole_batch() {
    let dir = scratch("tp-equivalence");
    let one = |batch: &str, name: &str| {
        train(
            "06-ddp-training",
            &["-n", "1", "--batch", batch],
            &dir.join(name),
            "losses.txt",
        )
        .1
    };
    for (n, batch, whole) in [("4", "8", "16"), ("2", "16", "16")] {
        let reference = one(whole, &format!("one-{n}"));
        let flags = ["-n", n, "--tp", "2", "--batch", batch];
        let (stdout, losses) = train(
            "07-tensor-parallel",
            &flags,
            &dir.join(format!("tp-{n}")),
            "tp0/losses.txt",
        );
        let w = worst(&reference, &losses);
        eprintln!("07 -n {n} --tp 2 --batch {batch} vs 06 -n 1 --batch {whole}: worst relative difference {w:.2e}");
        assert!(w < TOLERANCE, "{losses:?}\nvs one rank: {reference:?}");
        assert!(losses[23] < losses[0] - 0.1, "it learns: {losses:?}");
        let sums = checksums(&stdout, n.parse().unwrap());
        for (j, sum) in &sums {
            let same_shard = sums.iter().filter(|(k, _)| k == j);
            assert!(
                same_shard.clone().all(|(_, s)| s == sum),
                "shard {j}: {sums:?}"
            );
        }
        assert_ne!(sums[0].1, sums[1].1, "the two shards differ: {sums:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What a step moves: forward all-reduces batch x hidden floats, backward batch x context x
/// embed (8 x 64 x 4 + 8 x 8 x 16 x 4 bytes = 6 KB in two calls); dp all-reduces the shard's
/// gradients in one bucket and the loss.
#[test]
fn each_group_moves_what_the_split_says() {
    let dir = scratch("tp-traffic");
    let (stdout, _) = train(
        "07-tensor-parallel",
        &["-n", "4", "--tp", "2", "--batch", "8"],
        &dir,
        "tp0/losses.txt",
    );
    let shard = 256 * 16 + 128 * 32 + 32 + 32 * 64 + 64 + 64 * 256 + 256;
    assert!(
        stdout.contains(&format!("{shard} parameters a rank")),
        "{stdout}"
    );
    let dp_kb = (shard * 4 + 4) as f64 / 1024.0;
    let step = "tp 0: 2 all-reduces, 6.0 KB, waited ";
    let dp = format!("dp 0: 2 all-reduces, {dp_kb:.1} KB, waited ");
    let line = stdout.lines().find(|l| l.starts_with("step    3")).unwrap();
    assert!(line.contains(step) && line.contains(&dp), "{line}\n{dp}");
    assert!(stdout.contains("transport (tp 0): ") && stdout.contains("transport (dp 0): "));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_flags_are_refused_plainly() {
    for (flags, code, says) in [
        (
            &["--tp", "3", "--hidden", "64"][..],
            Some(2),
            "--tp 3: the hidden layer's 64 units must split evenly",
        ),
        (
            &["--tp", "0"],
            Some(2),
            "--tp 0: a tensor-parallel group has one rank or more",
        ),
        (
            &["-n", "3", "--tp", "2", "--hidden", "64", "--iters", "1"],
            None,
            "a mesh of dp 1 x tp 2 needs 2 ranks, and there are 3",
        ),
    ] {
        let out = Command::new(example("07-tensor-parallel"))
            .args(flags)
            .plainly()
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        match code {
            Some(code) => assert_eq!(out.status.code(), Some(code), "{flags:?}: {stderr}"),
            None => assert!(!out.status.success(), "{flags:?}: {stderr}"),
        }
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{flags:?}: {stderr}");
    }
}

/// The book's picture of the split is what `07-tensor-parallel --draw` draws now, for the run
/// the chapter shows (4 ranks, --tp 2, the default model and batch):
/// `NCCL_WORKSHOP_UPDATE_PICTURES=1` writes the new one instead of failing.
#[test]
fn the_books_picture_of_the_split_is_drawn_by_the_program() {
    let dir = scratch("tp-picture");
    let file = dir.join("tensor-parallel-split.svg");
    // cargo run --example 07-tensor-parallel -- --draw tensor-parallel-split.svg
    let drawn = Command::new(example("07-tensor-parallel"))
        .arg("--draw")
        .arg(&file)
        .plainly()
        .output()
        .unwrap();
    assert!(drawn.status.success(), "{drawn:?}");
    let picture = std::fs::read_to_string(&file).unwrap();
    assert!(picture.contains("<title>Example 07's MLP split over a tensor-parallel group of 2"));
    let book =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/images/tensor-parallel-split.svg");
    if std::env::var_os("NCCL_WORKSHOP_UPDATE_PICTURES").is_some() {
        std::fs::write(&book, &picture).unwrap();
    }
    let committed = std::fs::read_to_string(&book).unwrap_or_default();
    assert!(
        committed == picture,
        "{} differs from what 07 --draw draws now: rerun this test with \
         NCCL_WORKSHOP_UPDATE_PICTURES=1 and commit the picture",
        book.display()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
