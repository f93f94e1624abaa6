//! `comm-bench model` as a user runs it: the sweep the repository keeps, fitted close to its
//! measurements; a fresh sweep on this machine fitted and every series described (how well it
//! fits depends on how quiet the machine is, so that is not asserted); the report's words and
//! curves from the same fit; files it cannot fit refused with a message.

use std::process::Command;

mod common;

use common::run;
use test_support::process::{scratch, Plainly};

/// Sweeps time this machine: one at a time (tests of one binary run side by side), so that
/// ranks of two sweeps do not share the cores.
static ONE_SWEEP_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_sweep_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_SWEEP_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner())
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

/// The series `comm-bench model` described: their header lines.
fn series(stdout: &str) -> Vec<&str> {
    stdout.lines().filter(|l| l.starts_with("cpu (")).collect()
}

/// The fit's quality, judged on the sweep the repository keeps (docs/src/data/cpu-sweep.csv, the
/// curve chapter's): the same numbers on every machine, so a model that no longer follows the
/// curve fails here and a slow or busy machine cannot.
#[test]
fn the_kept_sweep_is_fitted_close_to_its_measurements() {
    let data = root().join("docs/src/data/cpu-sweep.csv");
    let (out, stdout, stderr) = run(&["model", data.to_str().unwrap()]);
    assert!(out.status.success(), "{stderr}");
    let series = series(&stdout);
    assert_eq!(
        series.len(),
        8,
        "2 collectives x 2 rank counts x 2 placements:\n{stdout}"
    );
    // Every series: its constants, its errors from 64 KiB, the regimes in words. The kept sweep
    // was measured on a quiet machine: small sizes are latency-bound, large ones memory-bound.
    assert_eq!(stdout.matches("  α = ").count(), 8, "{stdout}");
    assert_eq!(
        stdout
            .matches("  Regimes: from 1 KiB latency-bound")
            .count(),
        8,
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("most bytes from memory").count(),
        8,
        "{stdout}"
    );
    let accuracy: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("error at most"))
        .collect();
    assert_eq!(accuracy.len(), 8, "{stdout}");
    for line in accuracy {
        // This fit's medians are 3-14%: a model that no longer follows the curve is far off.
        let median = percent_after(line, "median");
        assert!(median <= 20.0, "median error {median}%: {line}\n{stdout}");
    }
    // By default a summary per series; --table adds a header and a row per size under each.
    let (out, table, stderr) = run(&["model", "--table", data.to_str().unwrap()]);
    assert!(out.status.success(), "{stderr}");
    let sizes = std::fs::read_to_string(&data).unwrap().lines().count() - 1;
    assert!(!stdout.contains("measured (us)"), "{stdout}");
    assert_eq!(table.matches("measured (us)").count(), 8, "{table}");
    assert_eq!(
        table.lines().count(),
        stdout.lines().count() - 1 + 8 + sizes,
        "the table's lines are the summary's (less the line naming --table) and a row per size:\n{table}"
    );
    for line in stdout.lines().filter(|l| !l.contains("--table")) {
        assert!(
            table.lines().any(|l| l == line),
            "{line} in --table's output"
        );
    }
    for line in stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("α = "))
    {
        let alpha = percent_after(line, "α = ");
        assert!(
            alpha < 10.0,
            "a latency per step of a few microseconds: {line}"
        );
    }
}

/// A sweep measured now is fitted and described whatever the machine's speed: only the shape of
/// the answer is asserted (a series per collective and placement, its constants, errors and
/// regimes), never how well it fits, which depends on how quiet the machine is.
#[test]
fn a_fresh_sweep_is_fitted_and_described() {
    let dir = scratch("model");
    let csv = dir.join("sweep.csv");
    let csv = csv.to_str().unwrap();
    let sweeping = one_sweep_at_a_time();
    let (out, _, stderr) = run(&[
        "--backend",
        "cpu",
        "--world-sizes",
        "2",
        "-b",
        "1K",
        "-e",
        "1M",
        "-f",
        "2",
        "-z",
        "3",
        "-n",
        "5",
        "--collectives",
        "all_reduce,all_gather,reduce_scatter,broadcast",
        "--csv",
        csv,
    ]);
    assert!(out.status.success(), "{stderr}");
    drop(sweeping);
    let (out, stdout, stderr) = run(&["model", csv]);
    assert!(out.status.success(), "{stderr}");
    let series = series(&stdout);
    assert_eq!(series.len(), 8, "4 collectives x 2 placements:\n{stdout}");
    for name in ["all_reduce", "all_gather", "reduce_scatter", "broadcast"] {
        assert!(series.iter().any(|s| s.contains(name)), "{name}:\n{stdout}");
    }
    assert_eq!(stdout.matches("  α = ").count(), 8, "{stdout}");
    assert_eq!(
        stdout.matches("  Regimes: from 1 KiB ").count(),
        8,
        "{stdout}"
    );
    assert_eq!(stdout.matches("error at most").count(), 8, "{stdout}");
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

/// A series of a collective the model has no steps for is named as skipped, beside those fitted.
#[test]
fn a_series_the_model_has_no_steps_for_is_named_as_skipped() {
    let data = root().join("docs/src/data/cpu-sweep.csv");
    let mut rows = comm_bench::record::read(&data).unwrap();
    let renamed: Vec<_> = rows
        .iter()
        .filter(|r| r.collective != "all_reduce")
        .map(|r| comm_bench::record::Row {
            collective: "alltoall".into(),
            ..r.clone()
        })
        .collect();
    rows.extend(renamed);
    let csv = scratch("model-skipped").join("with-alltoall.csv");
    comm_bench::record::write_csv(&csv, &rows).unwrap();
    let (out, stdout, stderr) = run(&["model", csv.to_str().unwrap()]);
    assert!(out.status.success(), "{stderr}");
    let skipped: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(", alltoall, "))
        .collect();
    assert_eq!(skipped.len(), 4, "2 rank counts x 2 placements:\n{stdout}");
    for line in skipped {
        assert!(
            line.ends_with(": skipped, not modelled: the model has no step structure for alltoall"),
            "{line}"
        );
    }
    assert_eq!(series(&stdout).len(), 8 + 4, "{stdout}");
}

/// The repository's root (this crate is crates/comm-bench).
fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The lines of the chapter's `bash` blocks.
fn bash_lines(chapter: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut inside = false;
    for line in chapter.lines() {
        match (inside, line.trim_start().strip_prefix("```")) {
            (false, Some(lang)) => inside = lang.trim() == "bash",
            (true, Some(_)) => inside = false,
            (true, None) => lines.push(line.trim().to_string()),
            (false, None) => {}
        }
    }
    lines
}

/// The lines of the output block after the illustrative mark that names `command`.
fn shown_output(chapter: &str, command: &str) -> Vec<String> {
    let mark = chapter
        .find(&format!("<!-- output-illustrative: {command}"))
        .unwrap_or_else(|| panic!("a block marked with {command}"));
    let block = &chapter[mark..];
    let start = block.find("```text\n").expect("a text block") + "```text\n".len();
    let end = block[start..].find("```").expect("its end") + start;
    block[start..end].lines().map(str::to_string).collect()
}

/// docs/src/curve.md as a reader runs it: every command of its `bash` blocks as written (in a
/// folder where `target/release/comm-bench` is this build and `docs` the book), its pictures drawn
/// again and compared (NCCL_WORKSHOP_UPDATE_PICTURES=1 writes them instead), its two output
/// blocks still what the commands they name print.
#[test]
fn the_curve_chapter_runs_as_written_and_redraws_its_pictures() {
    let chapter = std::fs::read_to_string(root().join("docs/src/curve.md")).unwrap();
    let dir = scratch("curve-chapter");
    std::fs::create_dir_all(dir.join("target/release")).unwrap();
    let bin = dir.join("target/release/comm-bench");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_comm-bench"), &bin).unwrap();
    std::os::unix::fs::symlink(root().join("docs"), dir.join("docs")).unwrap();
    // The clone's `out/`, where the chapter's commands write.
    std::fs::create_dir_all(dir.join("out")).unwrap();
    let lines = bash_lines(&chapter);
    assert!(lines.len() >= 6, "{lines:?}");
    let _sweeping = one_sweep_at_a_time();
    for line in &lines {
        let out = Command::new("bash")
            .plainly()
            .args(["-c", line])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`{line}`:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for (drawn, shown) in [
        (
            "out/curve/all_reduce-busbw.svg",
            "curve-all_reduce-busbw.svg",
        ),
        ("out/curve/all_reduce-time.svg", "curve-all_reduce-time.svg"),
        (
            "out/leonardo/all_reduce-busbw.svg",
            "leonardo-predicted-busbw.svg",
        ),
    ] {
        let drawn = std::fs::read_to_string(dir.join(drawn)).unwrap();
        let shown_path = root().join("docs/src/images").join(shown);
        assert!(
            chapter.contains(&format!("(images/{shown})")),
            "the chapter shows {shown}"
        );
        if std::env::var_os("NCCL_WORKSHOP_UPDATE_PICTURES").is_some() {
            std::fs::write(&shown_path, &drawn).unwrap();
        }
        let shown_text = std::fs::read_to_string(&shown_path).unwrap_or_default();
        assert!(
            shown_text == drawn,
            "{shown} is not what the chapter's commands draw: rerun with NCCL_WORKSHOP_UPDATE_PICTURES=1"
        );
    }
    let printed = |args: &[&str]| {
        let (out, stdout, stderr) = run(args);
        assert!(out.status.success(), "{stderr}");
        stdout
    };
    let model = "target/release/comm-bench model --table docs/src/data/cpu-sweep.csv";
    let data = root().join("docs/src/data/cpu-sweep.csv");
    let fitted = printed(&["model", "--table", data.to_str().unwrap()]);
    let predict = "target/release/comm-bench predict --system leonardo --nodes 2 -b 8 -e 8G -f 8";
    let predicted = printed(&[
        "predict", "--system", "leonardo", "--nodes", "2", "-b", "8", "-e", "8G", "-f", "8",
    ]);
    for (command, output) in [(model, &fitted), (predict, &predicted)] {
        for line in shown_output(&chapter, command) {
            assert!(
                output.lines().any(|l| l == line),
                "the chapter shows `{line}` from `{command}`, which now prints:\n{output}"
            );
        }
    }
}
