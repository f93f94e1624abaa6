//! What a user sees of the settings before anything runs: every program answers `-h` and
//! `--help` with text written for them, and an `--algo` the program's collective does not have
//! is refused at once, naming those it has (no rank started).

use std::path::PathBuf;
use std::process::Command;

use test_support::build::{binary, example, package_example};
use test_support::process::Plainly;

/// Every program the book runs: the examples, comm-core's diagnostics, comm-bench, commrun,
/// the labs' checker and example.
fn programs() -> Vec<(&'static str, PathBuf)> {
    let mut all: Vec<(&str, PathBuf)> = [
        "00-hello-world",
        "01-broadcast",
        "02-allreduce",
        "03-multinode-gloo-vs-nccl",
        "04-allgather",
        "05-reduce-scatter",
    ]
    .into_iter()
    .map(|name| (name, example(name)))
    .collect();
    for name in ["nccl-probe", "collective-check", "split-check"] {
        all.push((name, package_example("comm-core", name)));
    }
    all.push(("comm-bench", binary("comm-bench", "comm-bench")));
    all.push(("commrun", binary("commrun", "commrun")));
    // The labs' checker (`cargo lab`), and the labs' example of a program of one's own.
    all.push(("lab", binary("labs", "lab")));
    all.push(("your-program", package_example("labs", "your-program")));
    all
}

#[test]
fn every_program_answers_help_for_its_user() {
    for (name, path) in programs() {
        for flag in ["-h", "--help"] {
            let out = Command::new(&path).arg(flag).plainly().output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{name} {flag}: {out:?}");
            assert!(stdout.contains("Usage:"), "{name} {flag}:\n{stdout}");
            // The first line says what the program does; no Rust doc comment leaks in (clap
            // takes a flattened struct's doc comment as the program's description).
            let first = stdout.lines().next().unwrap_or("");
            assert!(
                !first.starts_with("Usage:"),
                "{name} {flag} says nothing first"
            );
            for programmer in ["LaunchArgs", "MasterArgs", "[`", "Apart from"] {
                assert!(!stdout.contains(programmer), "{name} {flag}:\n{stdout}");
            }
            // nccl-probe's rows are the probe itself: --help must not run it.
            assert!(
                !stdout.contains("unique Id  "),
                "{name} {flag} ran:\n{stdout}"
            );
        }
    }
}

/// Runs `path` with `args`, which must be refused: (exit code, stdout, stderr).
fn refused(path: &PathBuf, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(path).args(args).plainly().output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn an_algorithm_the_collective_lacks_is_refused_naming_its_own() {
    for (name, algo, theirs) in [
        ("01-broadcast", "ring", "broadcast has tree or chain"),
        ("02-allreduce", "tree", "all_reduce has ring or direct"),
        ("05-reduce-scatter", "chain", "reduce_scatter has ring"),
    ] {
        let args = ["--backend", "cpu", "-n", "2", "--algo", algo];
        let (code, stdout, stderr) = refused(&example(name), &args);
        assert_eq!(code, Some(2), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("--algo {algo}")),
            "{name}: {stderr}"
        );
        assert!(stderr.contains(theirs), "{name}: {theirs:?} in {stderr}");
        // Refused before any rank started: no backend line, no grids.
        assert_eq!(stdout, "", "{name}");
    }
    // comm-bench the same, from its --collectives; one collective that has it is enough.
    let bench = binary("comm-bench", "comm-bench");
    let args = [
        "--collectives",
        "broadcast",
        "--algo",
        "ring",
        "-b",
        "8",
        "-e",
        "8",
    ];
    let (code, _, stderr) = refused(&bench, &args);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("broadcast has tree or chain"), "{stderr}");
}
