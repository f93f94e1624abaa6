//! `nccl-probe`, which needs no GPU at all: with no libnccl, a broken one, a real `libnccl.so.2`
//! from pip's wheel (found, linked, loaded, its version string read, an Id made), and a library
//! named by NCCL_LIBRARY winning over a `libnccl.so` that loads by itself, as a fork (NCCLX)
//! beside the system's NCCL must.
//!
//! The real-library tests read the wheel's folder from NCCL_WORKSHOP_TEST_LIBNCCL (`.ci/run`
//! installs it: `python3 -m pip install --target target/nccl-wheel nvidia-nccl-cu12==2.21.5`) and
//! say they skipped without it, unless NCCL_WORKSHOP_REQUIRE_LIBNCCL=1 (as `.ci/run` sets). The
//! second library of the NCCL_LIBRARY test is the one in the course's torch environment.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use test_support::build;
use test_support::process::scratch;

/// Runs `nccl-probe` with none of the places libnccl is looked for, but `env`.
fn probe(env: &[(&str, &str)]) -> (Output, String) {
    // A HOME of each run's own (tests run side by side in this process).
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let home = scratch(&format!("nccl-probe-home-{run}"));
    let mut command = Command::new(build::package_example("comm-core", "nccl-probe"));
    for var in [
        "LD_LIBRARY_PATH",
        "NCCL_LIBRARY",
        "NCCL_HOME",
        "CUDA_HOME",
        "CONDA_PREFIX",
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "NCCL_SOCKET_IFNAME",
    ] {
        command.env_remove(var);
    }
    command.env("HOME", &home);
    command.envs(env.iter().copied());
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let all = format!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{all}");
    assert!(!all.contains("panicked"), "{all}");
    // Once: a relink restarts the program before it prints, and never twice.
    let headers = stdout.lines().filter(|l| l.starts_with("CUDA driver"));
    assert_eq!(headers.count(), 1, "{all}");
    std::fs::remove_dir_all(&home).unwrap();
    (output, stdout)
}

fn row<'a>(stdout: &'a str, step: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(step))
        .unwrap_or_else(|| panic!("no {step} row in\n{stdout}"))
}

#[test]
fn the_probe_explains_a_machine_without_nccl() {
    let (_, stdout) = probe(&[]);
    let libnccl = row(&stdout, "libnccl");
    if libnccl.contains("NCCL 2.") {
        eprintln!("skipped: this machine has a libnccl of its own: {libnccl}");
        return;
    }
    assert!(
        libnccl.contains("not found") && libnccl.contains("module load nccl"),
        "{stdout}"
    );
    assert!(!stdout.contains("unique Id"), "{stdout}");
    assert!(!stdout.contains("version "), "{stdout}");
    if row(&stdout, "CUDA driver").contains("not found") {
        assert!(
            row(&stdout, "--backend").contains("cpu (no CUDA driver found)"),
            "{stdout}"
        );
    }
}

#[test]
fn a_broken_libnccl_so2_is_named_not_a_crash_or_a_loop() {
    let dir = scratch("nccl-broken");
    let so2 = dir.join("libnccl.so.2");
    std::fs::write(&so2, b"not a library").unwrap();
    let (_, stdout) = probe(&[("NCCL_LIBRARY", so2.to_str().unwrap())]);
    let libnccl = row(&stdout, "libnccl");
    assert!(
        libnccl.contains("linked as libnccl.so but does not load") && libnccl.contains("too short"),
        "{stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The probe's libnccl and version rows say that `so2` (its real path) was loaded.
fn assert_loaded(stdout: &str, so2: &Path, how: &str) {
    let libnccl = row(stdout, "libnccl");
    assert!(
        libnccl.contains("NCCL 2.")
            && libnccl.contains(&format!("from {}", so2.display()))
            && libnccl.contains("(libnccl.so.2, linked as libnccl.so)"),
        "{how}:\n{stdout}"
    );
    // The string NCCL writes into the file: its version (the same as ncclGetVersion's), then
    // the CUDA it was built for.
    let version = libnccl.split_whitespace().nth(2).unwrap();
    let string = row(stdout, "version");
    assert!(
        string.starts_with(&format!("version       NCCL version {version}"))
            && string.contains("+cuda"),
        "{how}:\n{stdout}"
    );
}

#[test]
fn a_real_libnccl_so2_from_pip_is_found_linked_and_loaded() {
    let Some(wheel) = test_support::libnccl::wheel_or_skip() else {
        return;
    };
    let lib = wheel.join("nvidia/nccl/lib");
    let so2 = test_support::libnccl::so2(&wheel);
    // A virtual environment whose site-packages is the wheel's folder.
    let venv = scratch("nccl-venv");
    let site = venv.join("lib/python3.11/site-packages");
    std::fs::create_dir_all(site.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(wheel.canonicalize().unwrap(), &site).unwrap();
    let ways: [(&str, &Path); 5] = [
        ("NCCL_LIBRARY", &so2),
        // NCCL_LIBRARY may name the folder.
        ("NCCL_LIBRARY", &lib),
        ("LD_LIBRARY_PATH", &lib),
        ("VIRTUAL_ENV", &venv),
        // The last resort: the Python on PATH knows where its nvidia.nccl is.
        ("PYTHONPATH", &wheel),
    ];
    for (var, value) in ways {
        let (_, stdout) = probe(&[(var, value.to_str().unwrap())]);
        assert_loaded(&stdout, &so2, &format!("{var}={}", value.display()));
        let id = row(&stdout, "unique Id");
        assert!(
            id.contains("128 bytes; rank 0 would wait for the others at "),
            "{stdout}"
        );
    }
    // NCCL reads NCCL_SOCKET_IFNAME when it opens the bootstrap socket the Id points at.
    let (_, stdout) = probe(&[
        ("NCCL_LIBRARY", so2.to_str().unwrap()),
        ("NCCL_SOCKET_IFNAME", "lo"),
    ]);
    assert!(
        row(&stdout, "unique Id").contains("at 127.0.0.1:"),
        "{stdout}"
    );
    std::fs::remove_dir_all(&venv).unwrap();
}

/// Where `nccl-probe` is pointed at a second NCCL (as at a fork: NCCLX) while a `libnccl.so`
/// that loads by itself is on LD_LIBRARY_PATH (as a system's NCCL is), the second one runs: it
/// is linked and loaded, and the probe names its file and its version string. The two
/// libraries: pip's wheel as the system's, the torch environment's as the fork.
#[test]
fn the_library_nccl_library_names_wins_over_one_that_loads_by_itself() {
    let Some(wheel) = test_support::libnccl::wheel_or_skip() else {
        return;
    };
    let Some(torch) =
        test_support::torch::or_skip("a second libnccl.so.2 to point NCCL_LIBRARY at")
    else {
        return;
    };
    let system = test_support::libnccl::so2(&wheel);
    let Some(fork) = torch_libnccl(&torch.venv) else {
        assert!(
            !test_support::torch::required(),
            "no nvidia/nccl/lib/libnccl.so.2 in {}",
            torch.venv.display()
        );
        eprintln!("skipped: torch's environment has no libnccl.so.2 of its own");
        return;
    };
    // libnccl.so loads by itself from this folder: the "system's" NCCL.
    let dir = scratch("nccl-system");
    std::os::unix::fs::symlink(&system, dir.join("libnccl.so")).unwrap();
    let system_path = dir.to_str().unwrap();
    let (_, stdout) = probe(&[("LD_LIBRARY_PATH", system_path)]);
    let libnccl = row(&stdout, "libnccl");
    assert!(
        libnccl.contains(&format!("from {}", system.display())) && !libnccl.contains("linked"),
        "without NCCL_LIBRARY the system's loads, unlinked:\n{stdout}"
    );
    let (_, stdout) = probe(&[
        ("LD_LIBRARY_PATH", system_path),
        ("NCCL_LIBRARY", fork.to_str().unwrap()),
    ]);
    assert_loaded(
        &stdout,
        &fork,
        "NCCL_LIBRARY beside a libnccl.so that loads",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The `libnccl.so.2` of pip's NCCL wheel in a virtual environment, if it has one (its real
/// path).
fn torch_libnccl(venv: &Path) -> Option<PathBuf> {
    let lib = venv.join("lib");
    std::fs::read_dir(&lib)
        .ok()?
        .flatten()
        .map(|python| {
            python
                .path()
                .join("site-packages/nvidia/nccl/lib/libnccl.so.2")
        })
        .find(|so2| so2.is_file())
        .map(|so2| so2.canonicalize().unwrap())
}
