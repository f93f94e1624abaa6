//! The course's Python beside the Rust: each twin in `python/` run as the book shows it, under
//! the real torchrun on Gloo, and the matching example run with the same number of ranks on the
//! CPU backend; what both print is compared: the grids cell by cell (before and after), 00's
//! hello lines, every rank's device line, and 03's timing line (its shape, not its numbers).
//!
//! Each command is written once here ([`TWINS`]), and [`the_docs_show_exactly_the_twins_run_here`]
//! holds the docs to them: every `torchrun … python/0…` line in README.md and the book is one of
//! them, and each of them is in the docs (tests/torchrun.rs leaves those lines to this file).
//!
//! The twins run with the GPUs hidden (`CUDA_VISIBLE_DEVICES=`), so that they take Gloo on CPU
//! tensors on every machine, as the Rust side takes `--backend cpu`: four ranks would share a GPU
//! on a machine with fewer, and the comparison is of the same path. `--standalone` picks free
//! ports, so the twins run side by side. Without torch the tests say they skipped, unless
//! NCCL_WORKSHOP_REQUIRE_TORCH=1 (as `.ci/run` sets).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use test_support::build::{the_one_build, workspace_root};
use test_support::grid::{Grid, Rows};
use test_support::process::{self, Plainly, Tag};
use test_support::torch;

/// How long one run (the twin's torchrun, or the example) may take.
const LIMIT: Duration = Duration::from_secs(120);

const HELLO: &str = "torchrun --standalone --nproc_per_node=4 python/00_hello_world.py";
const BROADCAST: &str = "torchrun --standalone --nproc_per_node=4 python/01_broadcast.py";
const ALLREDUCE: &str = "torchrun --standalone --nproc_per_node=4 python/02_allreduce.py";
/// Two ranks, as the course's two nodes; 8 MB keeps it quick on a laptop.
const GLOO_VS_NCCL: &str =
    "torchrun --standalone --nproc_per_node=2 python/03_multinode_gloo_vs_nccl.py --size-mb 8";
const ALLGATHER: &str = "torchrun --standalone --nproc_per_node=4 python/04_allgather.py";
const REDUCE_SCATTER: &str = "torchrun --standalone --nproc_per_node=4 python/05_reduce_scatter.py";

/// Every twin's command, and the example beside it with its flags beyond `-n` and `--backend`.
const TWINS: [(&str, &str, &[&str]); 6] = [
    (HELLO, "00-hello-world", &[]),
    (BROADCAST, "01-broadcast", &[]),
    (ALLREDUCE, "02-allreduce", &[]),
    (
        GLOO_VS_NCCL,
        "03-multinode-gloo-vs-nccl",
        &["--size-mb", "8"],
    ),
    (ALLGATHER, "04-allgather", &[]),
    (REDUCE_SCATTER, "05-reduce-scatter", &[]),
];

/// What the twin and the example printed (stdout), each run with the same number of ranks.
struct Pair {
    python: String,
    rust: String,
    ranks: usize,
}

/// Runs the twin `line` as written and its example on the CPU backend, one after the other
/// (the example is quick); `None` where there is no torch.
fn run(line: &str) -> Option<Pair> {
    let (_, example, flags) = TWINS
        .iter()
        .find(|(l, _, _)| *l == line)
        .unwrap_or_else(|| panic!("{line:?} is not one of TWINS"));
    let torch = torch::or_skip(&format!("python twin: {line}"))?;
    let bin = the_one_build();
    let ranks: usize = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("--nproc_per_node="))
        .and_then(|n| n.parse().ok())
        .expect("--nproc_per_node=N");

    let tag = Tag::new("python-twin");
    let twin = || {
        let mut command = torch.as_written(line, &bin);
        command.plainly().env("CUDA_VISIBLE_DEVICES", "");
        tag.mark(&mut command);
        let python = process::start(&mut command).finish(LIMIT);
        tag.assert_all_gone(line);
        python
    };
    let mut python = twin();
    // Torch's Gloo connects its full mesh within a deadline of its own; on a loaded 2-core machine
    // a pair can miss it ("Connection closed by peer" from connectFullMesh, seen in CI). That is
    // torch's side of the comparison failing, not ours: it gets one more try.
    if !python.status.success() && python.stderr.contains("connectFullMesh") {
        eprintln!("{line}: torch's Gloo failed to connect its mesh; once more");
        python = twin();
    }
    python.assert_success(line);

    let mut command = Command::new(bin.join(example));
    command
        .args(["-n", &ranks.to_string(), "--backend", "cpu"])
        .args(*flags)
        .current_dir(workspace_root())
        .plainly();
    let rust = process::start(&mut command).finish(LIMIT);
    rust.assert_success(example);
    Some(Pair {
        python: python.stdout,
        rust: rust.stdout,
        ranks,
    })
}

/// The grid under `title`: other ranks' lines may land between rank 0's rows (torchrun's
/// workers share its stdout, and so do our ranks).
fn grid(output: &str, title: &str) -> Rows {
    Grid::titled(title).amid_other_output().read(output)
}

impl Pair {
    /// The grids under each title are the same, cell by cell, one row per rank.
    fn same_grids(&self, titles: &[&str]) {
        for title in titles {
            let (python, rust) = (grid(&self.python, title), grid(&self.rust, title));
            assert_eq!(
                rust.len(),
                self.ranks,
                "{title} one row per rank:\n{}",
                self.rust
            );
            assert_eq!(
                python, rust,
                "{title} differs: python/ left, Rust right\n--- python\n{}\n--- rust\n{}",
                self.python, self.rust
            );
        }
    }

    /// Every rank says which device it uses, once. Torch has one CPU device, `cpu`, where our
    /// ranks each name their own, `cpu:RANK`: the Rust line is read with `:RANK` dropped.
    fn same_device_lines(&self) {
        for rank in 0..self.ranks {
            let python = format!("Rank {rank} using device: cpu");
            let rust = format!("Rank {rank} using device: cpu:{rank}");
            assert_eq!(
                count(&self.python, &python),
                1,
                "{python:?} in\n{}",
                self.python
            );
            assert_eq!(count(&self.rust, &rust), 1, "{rust:?} in\n{}", self.rust);
        }
    }
}

fn count(output: &str, line: &str) -> usize {
    output.lines().filter(|l| *l == line).count()
}

#[test]
fn hello_says_the_same() {
    let Some(pair) = run(HELLO) else {
        return;
    };
    let n = pair.ranks;
    for rank in 0..n {
        // The same words, two normalisations: torch's one CPU device is `cpu` where ours is
        // `cpu:RANK`, and torch names the library (`gloo`) where ours names the backend's kind
        // (`cpu`, the CPU communicator, which moves bytes as Gloo does).
        let said = |device: &str, backend: &str| {
            format!("Hello from rank {rank} of {n} (local rank {rank}) on {device} with the {backend} backend")
        };
        let python = said("cpu", "gloo");
        let rust = said(&format!("cpu:{rank}"), "cpu");
        assert_eq!(
            count(&pair.python, &python),
            1,
            "{python:?} in\n{}",
            pair.python
        );
        assert_eq!(count(&pair.rust, &rust), 1, "{rust:?} in\n{}", pair.rust);
    }
    let hellos = |out: &str| out.lines().filter(|l| l.starts_with("Hello from")).count();
    assert_eq!(hellos(&pair.python), n, "{}", pair.python);
    assert_eq!(hellos(&pair.rust), n, "{}", pair.rust);
}

#[test]
fn broadcast_grids_are_the_same() {
    if let Some(pair) = run(BROADCAST) {
        pair.same_device_lines();
        pair.same_grids(&["Before broadcast:", "After broadcast:"]);
    }
}

#[test]
fn allreduce_grids_are_the_same() {
    if let Some(pair) = run(ALLREDUCE) {
        pair.same_device_lines();
        pair.same_grids(&["Before reduce:", "After reduce:"]);
    }
}

#[test]
fn allgather_grids_are_the_same() {
    if let Some(pair) = run(ALLGATHER) {
        pair.same_device_lines();
        pair.same_grids(&[
            "Before all-gather (each rank's block):",
            "After all-gather:",
        ]);
    }
}

#[test]
fn reduce_scatter_grids_are_the_same() {
    if let Some(pair) = run(REDUCE_SCATTER) {
        pair.same_device_lines();
        pair.same_grids(&[
            "Before reduce-scatter:",
            "After reduce-scatter (block r on rank r):",
        ]);
    }
}

/// 03's timing line of the CPU half, its numbers (the median and the bus bandwidth, which differ
/// from run to run) masked: `all-reduce 8 MB took X ms (median of 10, busbw X GB/s)` from both,
/// after a label that says what ran: `Rank 0 (Gloo)` for the twin, torch's real Gloo;
/// `Rank 0 (CPU, Gloo-style over shm)` for the example, our CPU path the Gloo way.
/// Without CUDA the twin says its NCCL half was skipped; the example on `--backend cpu` runs the
/// CPU half alone and says nothing of NCCL, so that line is the twin's only.
#[test]
fn gloo_vs_nccl_prints_the_same_timing_line() {
    let Some(pair) = run(GLOO_VS_NCCL) else {
        return;
    };
    let shape = |out: &str, label: &str| -> Vec<String> {
        out.lines()
            .filter_map(|l| l.strip_prefix(label))
            .map(masked)
            .collect()
    };
    let expected = "all-reduce 8 MB took X ms (median of 10, busbw X GB/s)";
    assert_eq!(
        shape(&pair.python, "Rank 0 (Gloo): "),
        [expected],
        "{}",
        pair.python
    );
    assert_eq!(
        shape(&pair.rust, "Rank 0 (CPU, Gloo-style over shm): "),
        [expected],
        "{}",
        pair.rust
    );
    assert!(
        pair.python
            .contains("Rank 0 (NCCL): skipped: torch.cuda.is_available() is False"),
        "{}",
        pair.python
    );
}

/// Each word that is a decimal number (`12.34`) as `X`.
fn masked(line: &str) -> String {
    line.split(' ')
        .map(|w| {
            let decimal = w.contains('.') && w.parse::<f64>().is_ok();
            if decimal {
                "X"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every `torchrun … python/0…` line in README.md and the book's chapters, by file.
fn twin_lines_in_docs() -> Vec<(String, String)> {
    let root = workspace_root();
    let mut files: Vec<PathBuf> = vec![root.join("README.md")];
    files.extend(test_support::book::markdown_files());
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.strip_prefix(&root).unwrap().display().to_string();
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.first() == Some(&"torchrun") && words.iter().any(|w| w.starts_with("python/0"))
            {
                found.push((name.clone(), words.join(" ")));
            }
        }
    }
    found
}

/// The docs show the twins' commands as run here, and each chapter 00-05 its own.
#[test]
fn the_docs_show_exactly_the_twins_run_here() {
    let shown = twin_lines_in_docs();
    let commands: Vec<&str> = TWINS.iter().map(|(line, _, _)| *line).collect();
    for (file, line) in &shown {
        assert!(
            commands.contains(&line.as_str()),
            "{file} shows {line:?}, which tests/python_twins.rs does not run (add it to TWINS)"
        );
    }
    let chapters = [
        "00-hello-world.md",
        "01-broadcast.md",
        "02-allreduce.md",
        "03-gloo-vs-nccl.md",
        "04-allgather.md",
        "05-reduce-scatter.md",
    ];
    for (command, chapter) in commands.iter().zip(chapters) {
        let file = format!("docs/src/{chapter}");
        assert!(
            shown.iter().any(|(f, l)| *f == file && l == command),
            "{file} does not show {command:?}"
        );
    }
    assert!(
        shown.iter().any(|(f, _)| f == "README.md"),
        "README.md shows no twin's command"
    );
}

#[test]
fn decimals_are_masked() {
    assert_eq!(
        masked("Rank 0 (Gloo): all-reduce 8 MB took 0.89 ms (median of 10, busbw 9.01 GB/s)"),
        "Rank 0 (Gloo): all-reduce 8 MB took X ms (median of 10, busbw X GB/s)"
    );
}
