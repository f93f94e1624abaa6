//! scripts/cpu-vs-gloo.sh, the peer comparison of our CPU backend with PyTorch's Gloo: what it
//! refuses (and that it refuses before running anything), and, where a Python with torch is
//! named by NCCL_WORKSHOP_TEST_PYTHON, a tiny real run.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use test_support::process::{scratch, start, Finished, Plainly};

const COLLECTIVES: [&str; 4] = ["all_reduce", "broadcast", "all_gather", "reduce_scatter"];

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/cpu-vs-gloo.sh")
}

/// The script run with `env`, within `limit`.
fn cpu_vs_gloo(args: &[&str], env: &[(&str, &OsStr)], limit: Duration) -> Finished {
    let mut c = Command::new("bash");
    c.arg(script()).args(args).plainly();
    for var in [
        "COLLECTIVES",
        "WORLD_SIZES",
        "SIZES",
        "ITERS",
        "WARMUP",
        "TRANSPORT",
    ] {
        c.env_remove(var);
    }
    c.envs(env.iter().copied());
    start(&mut c).finish(limit)
}

/// An executable shell script `dir/name` with `body`.
fn executable(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A folder with a stand-in comm-bench that only leaves `ran` behind, and a Python that cannot
/// import torch whatever this machine has installed (no site-packages, no PYTHON* variables).
fn without_torch(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = scratch(name);
    executable(
        &dir,
        "comm-bench",
        &format!("touch '{}'", dir.join("ran").display()),
    );
    let python = executable(&dir, "python-without-torch", "exec python3 -I -S \"$@\"");
    let ran = dir.join("ran");
    (dir, python, ran)
}

#[test]
fn without_torch_it_says_so_and_runs_nothing() {
    let (dir, python, ran) = without_torch("gloo-no-torch");
    let out = cpu_vs_gloo(
        &[],
        &[("BIN_DIR", dir.as_os_str()), ("PYTHON", python.as_os_str())],
        Duration::from_secs(60),
    );
    assert_eq!(out.code_or_signal(), 2, "{out:?}");
    let stderr = out.stderr.trim_end();
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    for part in [
        python.to_str().unwrap(),
        "PyTorch",
        "pip install torch",
        "PYTHON=",
    ] {
        assert!(stderr.contains(part), "{part:?} in {stderr}");
    }
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    assert!(!ran.exists(), "comm-bench ran although torch is missing");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_unknown_collective_is_refused_before_torch_is_looked_for() {
    let (dir, python, ran) = without_torch("gloo-bogus");
    let out = cpu_vs_gloo(
        &[],
        &[
            ("BIN_DIR", dir.as_os_str()),
            ("PYTHON", python.as_os_str()),
            ("COLLECTIVES", OsStr::new("all_reduce bogus")),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code_or_signal(), 2, "{out:?}");
    assert!(out.stderr.contains("'bogus'"), "{}", out.stderr);
    // The knobs come first: the missing torch is not what it reports.
    assert!(!out.stderr.contains("PyTorch"), "{}", out.stderr);
    assert!(!ran.exists(), "comm-bench ran with a bad COLLECTIVES");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_prints_the_usage_and_other_arguments_are_refused() {
    let help = cpu_vs_gloo(&["--help"], &[], Duration::from_secs(30));
    help.assert_success("cpu-vs-gloo.sh --help");
    for knob in [
        "BIN_DIR",
        "PYTHON",
        "WORLD_SIZES",
        "SIZES",
        "COLLECTIVES",
        "TRANSPORT",
    ] {
        assert!(help.stdout.contains(knob), "{knob} in\n{}", help.stdout);
    }
    let bad = cpu_vs_gloo(&["--sizes"], &[], Duration::from_secs(30));
    assert_eq!(bad.code_or_signal(), 2, "{bad:?}");
    assert!(bad.stderr.contains("'--sizes'"), "{}", bad.stderr);
}

/// A real comparison: 2 ranks, 1 MB, the four collectives. NCCL_WORKSHOP_TEST_PYTHON names
/// a python with torch; without it the test skips (CI has no torch).
#[test]
fn a_tiny_run_against_gloo_where_torch_is() {
    let Some(python) = std::env::var_os("NCCL_WORKSHOP_TEST_PYTHON") else {
        eprintln!("skipped: set NCCL_WORKSHOP_TEST_PYTHON to a python that has torch");
        return;
    };
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_comm-bench"))
        .parent()
        .unwrap();
    let out = cpu_vs_gloo(
        &[],
        &[
            ("BIN_DIR", bin_dir.as_os_str()),
            ("PYTHON", &python),
            ("WORLD_SIZES", OsStr::new("2")),
            ("SIZES", OsStr::new("1MB")),
            ("ITERS", OsStr::new("2")),
            ("WARMUP", OsStr::new("1")),
        ],
        Duration::from_secs(300),
    );
    out.assert_success("cpu-vs-gloo.sh");
    // | collective | ranks | size | ours (ms) | ours compared | Gloo (ms) | Gloo / ours | other |
    let rows: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
        .filter(|cells| cells.len() == 10 && COLLECTIVES.contains(&cells[1]))
        .collect();
    assert_eq!(rows.len(), 4, "{}", out.stdout);
    let positive = |cell: &str| cell.parse::<f64>().is_ok_and(|v| v > 0.0);
    for (row, name) in rows.iter().zip(COLLECTIVES) {
        assert_eq!(&row[1..4], [name, "2", "1MB"], "{}", out.stdout);
        let compared = match name {
            "all_reduce" | "broadcast" => "in-place",
            _ => "out-of-place",
        };
        assert_eq!(row[5], compared, "{}", out.stdout);
        for cell in [row[4], row[6], row[7], row[8].split(' ').next().unwrap()] {
            assert!(positive(cell), "{cell:?} in\n{}", out.stdout);
        }
    }
    for name in COLLECTIVES {
        assert!(
            out.stdout
                .contains(&format!("{name}: smallest Gloo / ours ")),
            "{name} summary in\n{}",
            out.stdout
        );
    }
}
