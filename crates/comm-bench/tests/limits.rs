//! comm-bench's guards: `report` never writes outside `-o`, whatever a CSV names its
//! collectives, a run that measured nothing fails, and absurd world sizes are refused.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use test_support::process::{scratch, start};

fn comm_bench(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_comm-bench"));
    for v in ["RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_STEP_ID"] {
        c.env_remove(v);
    }
    c.args(args);
    c
}

#[test]
fn report_writes_nothing_outside_its_folder() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/laptop-and-cluster.csv");
    let text = std::fs::read_to_string(&data).unwrap();
    let root = scratch("report-escape");
    let out = root.join("out");
    std::fs::create_dir_all(&out).unwrap();
    // Every row's collective renamed: one escapes upwards, one names a subfolder.
    let csv = root.join("evil.csv");
    let mut lines = text.lines();
    let mut evil = format!("{}\n", lines.next().unwrap());
    for (i, line) in lines.enumerate() {
        let name = if i % 2 == 0 { "../x" } else { "a/b" };
        let (backend, rest) = line.split_once(',').unwrap();
        let (_, rest) = rest.split_once(',').unwrap();
        evil.push_str(&format!("{backend},{name},{rest}\n"));
    }
    std::fs::write(&csv, evil).unwrap();
    let done = start(&mut comm_bench(&[
        "report",
        csv.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]))
    .finish(Duration::from_secs(120));
    done.assert_success("comm-bench report");
    let mut above: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    above.sort();
    assert_eq!(above, ["evil.csv", "out"], "written outside -o");
    for entry in std::fs::read_dir(&out).unwrap() {
        let entry = entry.unwrap();
        assert!(entry.file_type().unwrap().is_file(), "{:?}", entry.path());
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)),
            "{name}"
        );
    }
    assert!(out.join("___x-time.png").is_file());
    assert!(out.join("a_b-time.png").is_file());
    assert!(done.stdout.contains("___x-time.png"), "{}", done.stdout);
}

#[test]
fn a_run_that_measured_nothing_fails() {
    // Every size needs far more memory than any machine has: each is skipped.
    let done = start(&mut comm_bench(&[
        "--backend",
        "cpu",
        "--world-sizes",
        "2",
        "--collectives",
        "all_reduce",
        "-b",
        "1000T",
        "-e",
        "1000T",
        "--timeout",
        "60",
    ]))
    .finish(Duration::from_secs(120));
    assert_eq!(done.code_or_signal(), 1, "{}\n{}", done.stdout, done.stderr);
    assert!(
        done.stderr
            .contains("measured nothing: every size was skipped"),
        "{}",
        done.stderr
    );
}

#[test]
fn absurd_world_sizes_are_refused() {
    let done =
        start(&mut comm_bench(&["--world-sizes", "2,100000"])).finish(Duration::from_secs(30));
    assert_eq!(done.code_or_signal(), 2, "{}", done.stderr);
    assert!(
        done.stderr
            .contains("--world-sizes 100000: at most 1024 ranks on one node"),
        "{}",
        done.stderr
    );
}
