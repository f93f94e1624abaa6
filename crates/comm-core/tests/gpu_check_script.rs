//! scripts/gpu-check.sh, the NCCL backend's run-time check, run here on the CPU backend so the
//! script and its `collective-check` program keep working where no GPU is.

use std::path::PathBuf;
use std::process::Command;

/// The example binaries, brought up to date first: a stale one would check old code.
fn examples_dir() -> PathBuf {
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "--examples",
            "-p",
            "nccl-workshop",
            "-p",
            "comm-core",
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let test_exe = std::env::current_exe().unwrap();
    test_exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
}

#[test]
fn the_gpu_check_script_passes_on_the_cpu_backend() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = Command::new("bash")
        .arg(root.join("scripts/gpu-check.sh"))
        .env("BACKEND", "cpu")
        .env("GPUS", "3")
        .env("BIN_DIR", examples_dir())
        .env_remove("RANK")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for check in ["hello-world", "broadcast", "allreduce", "collectives"] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(check))
            .unwrap_or_else(|| panic!("{stdout}"));
        assert!(row.contains(" PASS "), "{row}");
    }
}

#[test]
fn collective_check_reports_every_collective() {
    let output = Command::new(examples_dir().join("collective-check"))
        .args(["--backend", "cpu", "-n", "2", "--lens", "0,5"])
        .env_remove("RANK")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    for name in [
        "all_reduce avg double out-of-place",
        "reduce_scatter prod int32 in-place",
        "all_gather int64 in-place",
        "broadcast float out-of-place",
        "send/recv double",
    ] {
        assert_eq!(
            stdout
                .lines()
                .filter(|l| l.starts_with(name) && l.ends_with("PASS"))
                .count(),
            2,
            "{name} in\n{stdout}"
        );
    }
    assert!(
        stdout.contains("checks: 288 passed, 0 failed on 2 ranks (cpu)"),
        "{stdout}"
    );
}
