//! The course's own outputs beside nccl-tests' table: `--preset profiler` prints and writes the
//! micro-profiler's lines (seeds/002), `--preset allreduce-sweep` writes the all-reduce
//! benchmark's files (seeds/004). Each run works in a scratch directory as its current directory,
//! with small sizes (-b/-e override the preset), 2 ranks and the CPU backend.

use std::path::Path;
use std::process::Command;

use test_support::process::{scratch, Plainly};

/// Runs comm-bench in `cwd`; (success, stdout, stderr).
fn run_in(cwd: &Path, args: &[&str]) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_comm-bench"));
    c.plainly();
    let out = c
        .current_dir(cwd)
        .args(args)
        .output()
        .expect("comm-bench runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `digits.ddd` with exactly `decimals` decimals.
fn number(text: &str, decimals: usize) -> bool {
    match text.split_once('.') {
        Some((whole, frac)) => {
            !whole.is_empty()
                && whole.chars().all(|c| c.is_ascii_digit())
                && frac.len() == decimals
                && frac.chars().all(|c| c.is_ascii_digit())
        }
        None => false,
    }
}

/// The profiler's line, as the regex
/// `^  (AllReduce|AllGather|ReduceScatter): +\d+\.\d{3} ms \| AlgBW: \d+\.\d{2} GB/s \| BusBW: \d+\.\d{2} GB/s$`
/// with the name padded to 15 columns. Returns the name.
fn profiler_line(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("  ")?;
    let (name, rest) = rest.split_once(':')?;
    if !["AllReduce", "AllGather", "ReduceScatter"].contains(&name) {
        return None;
    }
    let padded = &line[2..17];
    if !padded.starts_with(&format!("{name}:")) || !padded[name.len() + 1..].trim().is_empty() {
        return None;
    }
    let rest = rest.trim_start();
    let (ms, rest) = rest.split_once(" ms | AlgBW: ")?;
    let (alg, rest) = rest.split_once(" GB/s | BusBW: ")?;
    let bus = rest.strip_suffix(" GB/s")?;
    (number(ms, 3) && number(alg, 2) && number(bus, 2)).then_some(name)
}

#[test]
fn the_profiler_prints_and_writes_the_courses_lines() {
    let dir = scratch("course-profiler");
    let (ok, stdout, stderr) = run_in(
        &dir,
        &[
            "--preset",
            "profiler",
            "--backend",
            "cpu",
            "--world-sizes",
            "2",
            "-b",
            "64K",
            "-e",
            "256K",
            "-n",
            "2",
            "-w",
            "1",
        ],
    );
    assert!(ok, "{stdout}\n{stderr}");
    // nccl-tests' table first, then the profiler's block.
    let table = stdout
        .find("# comm-bench")
        .expect("nccl-tests' table is printed");
    let start = stdout
        .find("Configuration: World Size=2")
        .expect("the profiler's block is printed");
    assert!(table < start, "{stdout}");
    let block = &stdout[start..];
    let lines: Vec<&str> = block.lines().filter(|l| !l.is_empty()).collect();
    // The transport the run used, as its transport line named it (shm on one host).
    let transport = stdout
        .lines()
        .find_map(|l| l.strip_prefix("transport: ")?.split(' ').next())
        .expect("the transport line is printed");
    // On one host the buffers may be registered (`--copy auto`): the line then says so.
    let backend = format!("Backend: cpu ({transport} transport");
    assert!(
        lines[1].starts_with(&backend) && lines[1].contains(" (comm-core "),
        "{backend} in:\n{block}"
    );
    assert_eq!(lines[2], "=".repeat(80));
    let expected = [
        "Tensor Size: 16,384 elements (0.06 MB)",
        "AllReduce",
        "AllGather",
        "ReduceScatter",
        "Tensor Size: 65,536 elements (0.25 MB)",
        "AllReduce",
        "AllGather",
        "ReduceScatter",
    ];
    assert_eq!(lines.len(), 3 + expected.len(), "{block}");
    for (line, want) in lines[3..].iter().zip(expected) {
        if want.starts_with("Tensor Size") {
            assert_eq!(*line, want, "{block}");
        } else {
            assert_eq!(profiler_line(line), Some(want), "{line:?}\n{block}");
        }
    }
    // The file holds the same block.
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = &files[0];
    let stamp = name
        .strip_prefix("profile_cpu_world2_")
        .and_then(|s| s.strip_suffix(".txt"))
        .unwrap_or_else(|| panic!("{name}"));
    assert!(
        stamp.len() == 15
            && stamp.as_bytes()[8] == b'_'
            && stamp.chars().filter(char::is_ascii_digit).count() == 14,
        "{name}"
    );
    assert!(stderr.contains(&format!("wrote ./{name}")), "{stderr}");
    let text = std::fs::read_to_string(dir.join(name)).unwrap();
    assert!(text.starts_with(&"=".repeat(80)), "{text}");
    assert_eq!(
        text.trim_end(),
        format!("{}\n{}", "=".repeat(80), block.trim_end())
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_sweep_writes_the_courses_files() {
    let dir = scratch("course-sweep");
    let (ok, stdout, stderr) = run_in(
        &dir,
        &[
            "--preset",
            "allreduce-sweep",
            "--backend",
            "cpu",
            "--world-sizes",
            "2",
            "-b",
            "10MB",
            "-e",
            "100MB",
            "-n",
            "2",
            "-w",
            "1",
        ],
    );
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("# comm-bench"), "{stdout}");
    let out = dir.join("results/distributed_communication");
    let mut files: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "allreduce_backend_comparison_100mb.png",
            "allreduce_backend_comparison_100mb.svg",
            "allreduce_bandwidth_vs_datasize.png",
            "allreduce_bandwidth_vs_datasize.svg",
            "allreduce_time_vs_datasize.png",
            "allreduce_time_vs_datasize.svg",
            "analysis.txt",
            "combined_benchmark.csv",
            "full_results.md",
            "gloo_cpu_benchmark.csv",
            "report.md",
            "summary_by_config.md",
        ],
        "{stderr}"
    );
    // Only the course's folder: nothing else beside it.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    let rows = comm_bench::record::read(&out.join("combined_benchmark.csv")).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        rows,
        comm_bench::record::read(&out.join("gloo_cpu_benchmark.csv")).unwrap()
    );
    for png in [
        "allreduce_time_vs_datasize",
        "allreduce_bandwidth_vs_datasize",
        "allreduce_backend_comparison_100mb",
    ] {
        let bytes = std::fs::read(out.join(format!("{png}.png"))).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "{png}");
    }
    let full = std::fs::read_to_string(out.join("full_results.md")).unwrap();
    assert!(
        full.contains("| cpu | 2 | 100 MB | float | sum | in-place |"),
        "{full}"
    );
    let summary = std::fs::read_to_string(out.join("summary_by_config.md")).unwrap();
    assert!(
        summary.contains("| cpu, 2 ranks (in-place) | 10 MB to 100 MB (2) |"),
        "{summary}"
    );
    let analysis = std::fs::read_to_string(out.join("analysis.txt")).unwrap();
    assert!(
        analysis.contains("measured: cpu, 2 ranks (in-place): 10 MB, 100 MB"),
        "{analysis}"
    );
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("(allreduce_backend_comparison_100mb.png)"),
        "{report}"
    );
    // --out-dir puts them elsewhere; an explicit --csv is written as well.
    let (ok, stdout, stderr) = run_in(
        &dir,
        &[
            "--preset",
            "allreduce-sweep",
            "--backend",
            "cpu",
            "--world-sizes",
            "2",
            "-b",
            "1MB",
            "-e",
            "1MB",
            "-n",
            "1",
            "-w",
            "0",
            "--out-dir",
            "elsewhere",
            "--csv",
            "mine.csv",
        ],
    );
    assert!(ok, "{stdout}\n{stderr}");
    assert!(dir.join("mine.csv").is_file());
    assert!(dir.join("elsewhere/combined_benchmark.csv").is_file());
    assert!(dir.join("elsewhere/analysis.txt").is_file());
    std::fs::remove_dir_all(&dir).unwrap();
}
