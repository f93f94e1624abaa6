//! `comm-bench model` as a user runs it: a fresh sweep on this machine, fitted, every series
//! described and close to its measurements; the report's words and curves from the same fit;
//! files it cannot fit refused with a message.

use std::process::{Command, Output};

use test_support::process::{scratch, Plainly};

fn run(args: &[&str]) -> (Output, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_comm-bench"))
        .plainly()
        .args(args)
        .output()
        .expect("comm-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

/// The percentage after `label` in `line` ("error at most 12% (at 2 MiB), median 4%").
fn percent_after(line: &str, label: &str) -> f64 {
    let rest = &line[line
        .find(label)
        .unwrap_or_else(|| panic!("{label} in {line}"))
        + label.len()..];
    let number: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    number
        .parse()
        .unwrap_or_else(|_| panic!("a number after {label} in {line}"))
}

#[test]
fn a_fresh_sweep_is_fitted_close_to_its_measurements() {
    let dir = scratch("model");
    let csv = dir.join("sweep.csv");
    let csv = csv.to_str().unwrap();
    // Each iteration timed alone (-z 3): the model fits the median iteration, which one slow
    // iteration on a busy machine cannot move.
    let (out, _, stderr) = run(&[
        "--backend",
        "cpu",
        "--world-sizes",
        "2",
        "-b",
        "1K",
        "-e",
        "4M",
        "-f",
        "2",
        "-z",
        "3",
        "-n",
        "20",
        "--collectives",
        "all_reduce,all_gather,reduce_scatter,broadcast",
        "--csv",
        csv,
    ]);
    assert!(out.status.success(), "{stderr}");
    let (out, stdout, stderr) = run(&["model", csv]);
    assert!(out.status.success(), "{stderr}");
    let series: Vec<&str> = stdout.lines().filter(|l| l.starts_with("cpu (")).collect();
    assert_eq!(series.len(), 8, "4 collectives x 2 placements:\n{stdout}");
    for name in ["all_reduce", "all_gather", "reduce_scatter", "broadcast"] {
        assert!(series.iter().any(|s| s.contains(name)), "{name}:\n{stdout}");
    }
    // Every series: its constants, a row per size, its errors from 64 KiB, the regimes in words.
    assert_eq!(stdout.matches("  α = ").count(), 8, "{stdout}");
    assert_eq!(
        stdout
            .matches("  Regimes: from 1 KiB latency-bound")
            .count(),
        8,
        "{stdout}"
    );
    let accuracy: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("error at most"))
        .collect();
    assert_eq!(accuracy.len(), 8, "{stdout}");
    for line in accuracy {
        // Generous for a loaded CI machine (this machine, quiet: medians 2-15%; the note of
        // issue 24 has the figures): a model that no longer follows the curve is far off.
        let median = percent_after(line, "median");
        assert!(median <= 30.0, "median error {median}%: {line}\n{stdout}");
    }
    for line in stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("α = "))
    {
        let alpha = percent_after(line, "α = ");
        assert!(alpha < 1000.0, "a latency per step in microseconds: {line}");
    }
    // The report fits the same model: its words, and the dashed curves' legend.
    let report_dir = dir.join("report");
    let (out, stdout, stderr) = run(&["report", csv, "-o", report_dir.to_str().unwrap()]);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("the model t = steps x alpha + bytes / B fits alpha ="),
        "{stdout}"
    );
    let svg = std::fs::read_to_string(report_dir.join("all_reduce-time.svg")).unwrap();
    assert!(
        svg.contains("dashed: the model"),
        "the model's legend in the time plot"
    );
}

#[test]
fn files_it_cannot_fit_are_refused_with_a_message() {
    let dir = scratch("model-bad");
    let (out, _, stderr) = run(&["model", dir.join("missing.csv").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.starts_with("comm-bench model: error: "), "{stderr}");
    assert!(stderr.contains("missing.csv"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Rows of a collective the model has no steps for (alltoall) and of one rank: nothing to fit.
    let csv = dir.join("alltoall.csv");
    let (out, _, stderr) = run(&[
        "--backend",
        "cpu",
        "--world-sizes",
        "1,2",
        "-b",
        "1K",
        "-e",
        "8K",
        "-f",
        "2",
        "--collectives",
        "alltoall",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{stderr}");
    let (out, _, stderr) = run(&["model", csv.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("no series to fit"), "{stderr}");
}
