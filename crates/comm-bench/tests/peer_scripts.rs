//! The peer comparisons of our CPU backend: scripts/cpu-vs-gloo.sh with PyTorch's Gloo and
//! scripts/cpu-vs-openmpi.sh with Open MPI over shared memory. What each refuses (and that it
//! refuses before running anything), and a tiny real run where the peer is at hand: a Python
//! with torch named by NCCL_WORKSHOP_TEST_PYTHON, Open MPI's mpicc and mpirun on PATH.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use test_support::process::{scratch, start, Finished, Plainly};

const COLLECTIVES: [&str; 4] = ["all_reduce", "broadcast", "all_gather", "reduce_scatter"];

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name)
}

/// scripts/`name` run with `env` (the knobs not in it unset), within `limit`.
fn run_script(name: &str, args: &[&str], env: &[(&str, &OsStr)], limit: Duration) -> Finished {
    let mut c = Command::new("bash");
    c.arg(script(name)).args(args).plainly();
    for var in [
        "COLLECTIVES",
        "WORLD_SIZES",
        "SIZES",
        "ITERS",
        "WARMUP",
        "TRANSPORT",
        "MPICC",
        "MPIRUN",
        "MIN",
        "MAX",
        "FACTOR",
    ] {
        c.env_remove(var);
    }
    c.envs(env.iter().copied());
    start(&mut c).finish(limit)
}

fn cpu_vs_gloo(args: &[&str], env: &[(&str, &OsStr)], limit: Duration) -> Finished {
    run_script("cpu-vs-gloo.sh", args, env, limit)
}

fn cpu_vs_openmpi(args: &[&str], env: &[(&str, &OsStr)], limit: Duration) -> Finished {
    run_script("cpu-vs-openmpi.sh", args, env, limit)
}

/// An executable shell script `dir/name` with `body`.
fn executable(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A folder with a stand-in comm-bench that only leaves `ran` behind, and that file's path.
fn with_stand_in_bench(name: &str) -> (PathBuf, PathBuf) {
    let dir = scratch(name);
    executable(
        &dir,
        "comm-bench",
        &format!("touch '{}'", dir.join("ran").display()),
    );
    let ran = dir.join("ran");
    (dir, ran)
}

/// [`with_stand_in_bench`] and a Python that cannot import torch whatever this machine has
/// installed (no site-packages, no PYTHON* variables).
fn without_torch(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let (dir, ran) = with_stand_in_bench(name);
    let python = executable(&dir, "python-without-torch", "exec python3 -I -S \"$@\"");
    (dir, python, ran)
}

/// The rows of a peer script's table for the four collectives, checked: 2 ranks, 1MB, the
/// placement compared is the peer's call's, every time and ratio positive; and a summary line
/// per collective, "NAME: smallest PEER / ours ".
fn assert_tiny_table(stdout: &str, peer: &str) {
    // | collective | ranks | size | ours (ms) | ours compared | PEER (ms) | PEER / ours | other |
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
        .filter(|cells| cells.len() == 10 && COLLECTIVES.contains(&cells[1]))
        .collect();
    assert_eq!(rows.len(), COLLECTIVES.len(), "{stdout}");
    let positive = |cell: &str| cell.parse::<f64>().is_ok_and(|v| v > 0.0);
    for (row, name) in rows.iter().zip(COLLECTIVES) {
        assert_eq!(&row[1..4], [name, "2", "1MB"], "{stdout}");
        let compared = match name {
            "all_reduce" | "broadcast" => "in-place",
            _ => "out-of-place",
        };
        assert_eq!(row[5], compared, "{stdout}");
        for cell in [row[4], row[6], row[7], row[8].split(' ').next().unwrap()] {
            assert!(positive(cell), "{cell:?} in\n{stdout}");
        }
    }
    for name in COLLECTIVES {
        assert!(
            stdout.contains(&format!("{name}: smallest {peer} / ours ")),
            "{name} summary in\n{stdout}"
        );
    }
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
    // The knobs come first: the missing torch is not what it reports.
    assert_refused_before_anything_ran(&out, "PyTorch", &ran, &dir);
}

#[test]
fn help_prints_the_usage_and_other_arguments_are_refused() {
    let knobs = [
        "BIN_DIR",
        "PYTHON",
        "WORLD_SIZES",
        "SIZES",
        "COLLECTIVES",
        "TRANSPORT",
    ];
    assert_help_names_knobs_and_arguments_are_refused("cpu-vs-gloo.sh", &knobs);
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
    assert_tiny_table(&out.stdout, "Gloo");
}

/// MPICC and MPIRUN naming programs that do not exist, in the stand-in comm-bench's folder.
fn missing_mpi(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("no-such-mpicc"), dir.join("no-such-mpirun"))
}

#[test]
fn without_open_mpi_it_says_so_and_runs_nothing() {
    let (dir, ran) = with_stand_in_bench("openmpi-missing");
    let (mpicc, mpirun) = missing_mpi(&dir);
    let out = cpu_vs_openmpi(
        &[],
        &[
            ("BIN_DIR", dir.as_os_str()),
            ("MPICC", mpicc.as_os_str()),
            ("MPIRUN", mpirun.as_os_str()),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code_or_signal(), 2, "{out:?}");
    let stderr = out.stderr.trim_end();
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    for part in [
        mpicc.to_str().unwrap(),
        mpirun.to_str().unwrap(),
        "Open MPI",
        "apt-get install openmpi-bin libopenmpi-dev",
        "MPICC=",
        "MPIRUN=",
    ] {
        assert!(stderr.contains(part), "{part:?} in {stderr}");
    }
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    assert!(!ran.exists(), "comm-bench ran although Open MPI is missing");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_unknown_collective_is_refused_before_open_mpi_is_looked_for() {
    let (dir, ran) = with_stand_in_bench("openmpi-bogus");
    let (mpicc, mpirun) = missing_mpi(&dir);
    let out = cpu_vs_openmpi(
        &[],
        &[
            ("BIN_DIR", dir.as_os_str()),
            ("MPICC", mpicc.as_os_str()),
            ("MPIRUN", mpirun.as_os_str()),
            ("COLLECTIVES", OsStr::new("all_reduce bogus")),
        ],
        Duration::from_secs(60),
    );
    // The knobs come first: the missing Open MPI is not what it reports.
    assert_refused_before_anything_ran(&out, "apt-get", &ran, &dir);
}

#[test]
fn open_mpi_help_prints_the_usage_and_other_arguments_are_refused() {
    let knobs = [
        "BIN_DIR",
        "MPICC",
        "MPIRUN",
        "WORLD_SIZES",
        "SIZES",
        "COLLECTIVES",
        "TRANSPORT",
    ];
    assert_help_names_knobs_and_arguments_are_refused("cpu-vs-openmpi.sh", &knobs);
}

/// `NAME --help` prints the usage, naming every knob; an argument (`--sizes`) is refused with
/// exit code 2, naming it.
fn assert_help_names_knobs_and_arguments_are_refused(name: &str, knobs: &[&str]) {
    let help = run_script(name, &["--help"], &[], Duration::from_secs(30));
    help.assert_success(&format!("{name} --help"));
    for knob in knobs {
        assert!(help.stdout.contains(knob), "{knob} in\n{}", help.stdout);
    }
    let bad = run_script(name, &["--sizes"], &[], Duration::from_secs(30));
    assert_eq!(bad.code_or_signal(), 2, "{bad:?}");
    assert!(bad.stderr.contains("'--sizes'"), "{}", bad.stderr);
}

/// A bad COLLECTIVES was refused (exit code 2, naming 'bogus') before the peer was looked for
/// (`peer_hint`, what the missing peer's message says, is not in stderr) and before comm-bench
/// ran; then `dir` is removed.
fn assert_refused_before_anything_ran(out: &Finished, peer_hint: &str, ran: &Path, dir: &Path) {
    assert_eq!(out.code_or_signal(), 2, "{out:?}");
    assert!(out.stderr.contains("'bogus'"), "{}", out.stderr);
    assert!(!out.stderr.contains(peer_hint), "{}", out.stderr);
    assert!(!ran.exists(), "comm-bench ran with a bad COLLECTIVES");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Whether `program` is an executable file in a folder of PATH.
fn on_path(program: &str) -> bool {
    test_support::process::on_path(program).is_some()
}

/// A real comparison: 2 ranks, 1 MB, the four collectives, where mpicc and mpirun are on PATH;
/// without them the test skips (CI may have no Open MPI).
#[test]
fn a_tiny_run_against_open_mpi_where_it_is() {
    if !on_path("mpicc") || !on_path("mpirun") {
        eprintln!(
            "skipped: no mpicc and mpirun on PATH (apt-get install openmpi-bin libopenmpi-dev)"
        );
        return;
    }
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_comm-bench"))
        .parent()
        .unwrap();
    let out = cpu_vs_openmpi(
        &[],
        &[
            ("BIN_DIR", bin_dir.as_os_str()),
            ("WORLD_SIZES", OsStr::new("2")),
            ("SIZES", OsStr::new("1MB")),
            ("ITERS", OsStr::new("3")),
            ("WARMUP", OsStr::new("1")),
        ],
        Duration::from_secs(300),
    );
    out.assert_success("cpu-vs-openmpi.sh");
    let header = out.stdout.lines().next().unwrap_or_default();
    assert!(
        header.contains("Open MPI ") && header.contains("pml ob1, btl self,"),
        "{header}"
    );
    assert_tiny_table(&out.stdout, "OpenMPI");
    // | collective | ranks | size | ours out / in place | OpenMPI out / in place |
    //   ours out / (in place + memcpy) |
    let placements: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
        .filter(|cells| cells.len() == 8 && COLLECTIVES.contains(&cells[1]))
        .collect();
    assert_eq!(placements.len(), COLLECTIVES.len(), "{}", out.stdout);
    for (row, name) in placements.iter().zip(COLLECTIVES) {
        assert_eq!(&row[1..4], [name, "2", "1MB"], "{}", out.stdout);
        for ratio in &row[4..7] {
            let ratio: f64 = ratio.parse().unwrap_or(0.0);
            assert!(ratio > 0.0, "{row:?} in\n{}", out.stdout);
        }
    }
    // The one-copy bound, both placements of each collective:
    // | collective | ranks | size | placement | ours (ms) | memcpy of the bytes (ms) | ours / memcpy |
    let bound: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
        .filter(|cells| cells.len() == 9 && COLLECTIVES.contains(&cells[1]))
        .collect();
    assert_eq!(bound.len(), 2 * COLLECTIVES.len(), "{}", out.stdout);
    for row in &bound {
        assert!(["in-place", "out-of-place"].contains(&row[4]), "{row:?}");
        let ratio: f64 = row[7].parse().unwrap_or(0.0);
        assert!(ratio > 0.0, "{row:?} in\n{}", out.stdout);
    }
}

/// scripts/placement-and-pacing.sh as a user runs it, tiny: both tables, a row per (collective,
/// size) with a ratio, the two count lines; an argument refused.
#[test]
fn placement_and_pacing_measures_both_goals() {
    if !on_path("cc") {
        eprintln!("skipped: no C compiler for the memcpy timer (apt-get install gcc)");
        return;
    }
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_comm-bench"))
        .parent()
        .unwrap();
    let env = [
        ("BIN_DIR", bin_dir.as_os_str()),
        ("WORLD_SIZES", OsStr::new("2")),
        ("MIN", OsStr::new("1K")),
        ("MAX", OsStr::new("4K")),
        ("FACTOR", OsStr::new("4")),
        ("COLLECTIVES", OsStr::new("all_reduce,all_gather")),
        ("ITERS", OsStr::new("3")),
        ("WARMUP", OsStr::new("1")),
    ];
    let limit = Duration::from_secs(120);
    let out = run_script("placement-and-pacing.sh", &[], &env, limit);
    out.assert_success("placement-and-pacing.sh");
    let rows = |columns: usize| -> Vec<Vec<String>> {
        let cells = |l: &str| {
            l.split('|')
                .map(|c| c.trim().to_string())
                .collect::<Vec<_>>()
        };
        let ours = |c: &Vec<String>| c.len() == columns + 2 && c[1].starts_with("all_");
        out.stdout.lines().map(cells).filter(ours).collect()
    };
    // Times measured (positive) and a ratio printed; the ratio itself may round to 0.00 on a
    // busy machine, where one timing can be a thousand times another's.
    let measured = |r: &Vec<String>, times: [usize; 2], ratio: usize| {
        let number = |i: usize| r[i].parse::<f64>().ok();
        times.iter().all(|&i| number(i).is_some_and(|t| t > 0.0)) && number(ratio).is_some()
    };
    // placement: 2 collectives x 2 sizes; pacing: x 2 placements
    let placement = rows(9);
    assert_eq!(placement.len(), 4, "{}", out.stdout);
    let all_measured = placement.iter().all(|r| measured(r, [4, 5], 8));
    assert!(all_measured, "{}", out.stdout);
    let pacing = rows(7);
    assert_eq!(pacing.len(), 8, "{}", out.stdout);
    let all_measured = pacing.iter().all(|r| measured(r, [4, 5], 6));
    assert!(all_measured, "{}", out.stdout);
    for line in ["placement: ", "pacing: "] {
        assert!(out.stdout.contains(line), "{line} in\n{}", out.stdout);
    }
    let bad = run_script("placement-and-pacing.sh", &["--sizes"], &[], limit);
    assert_eq!(bad.code_or_signal(), 2, "{bad:?}");
    assert!(bad.stderr.contains("'--sizes'"), "{}", bad.stderr);
}
