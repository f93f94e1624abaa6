//! The NCCL backend's run-time checks where no GPU is: scripts/gpu-check.sh and its
//! `collective-check` on the CPU backend (so they keep working), and `nccl-probe`, which needs
//! no GPU at all: with no libnccl, a broken one, and a real `libnccl.so.2` from pip's wheel.
//!
//! The real-library test reads the wheel's folder from NCCL_WORKSHOP_TEST_LIBNCCL (`.ci/run`
//! installs it: `python3 -m pip install --target target/nccl-wheel nvidia-nccl-cu12==2.21.5`) and
//! says it skipped without it, unless NCCL_WORKSHOP_REQUIRE_LIBNCCL=1 (as `.ci/run` sets).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use test_support::build;
use test_support::process::Plainly;

/// The folder of the example binaries gpu-check.sh runs (the root package's and comm-core's),
/// brought up to date: a stale one would check old code. comm-bench, which the script finds one
/// folder up (target/<profile>), too.
fn examples_dir() -> PathBuf {
    build::package_example("comm-core", "collective-check");
    build::binary("comm-bench", "comm-bench");
    let hello = build::example("00-hello-world");
    hello.parent().unwrap().to_path_buf()
}

#[test]
fn the_gpu_check_script_passes_on_the_cpu_backend() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = Command::new("bash")
        .arg(root.join("scripts/gpu-check.sh"))
        .env("BACKEND", "cpu")
        .env("GPUS", "3")
        .env("BIN_DIR", examples_dir())
        .plainly()
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Every check the script has for the CPU backend ran and passed: none skipped, none missing.
    for check in [
        "hello-world",
        "broadcast",
        "allreduce",
        "collectives",
        "trace",
        // 06: training, every rank's weights the same.
        "ddp-training",
        // 03 on both halves, and its ranks agreeing on one backend.
        "gloo-vs-nccl",
        "backend-agreed",
        "gloo-half-timeline",
        // comm-bench at each -z, -a and -I, with nothing wrong.
        "bench-z0-a0",
        "bench-z1-a1-I1",
        "bench-z3-a2-I1",
        "bench-z3-a3",
        // A too-large -e refused size by size.
        "bench-too-large",
        // A rank killed mid-collective: the other ends within its --timeout + 2 s, naming it.
        "rank-killed",
    ] {
        let row = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(check))
            .unwrap_or_else(|| panic!("no {check} row in\n{stdout}"));
        assert!(row.contains(" PASS "), "{row}\n{stdout}");
    }
    assert!(!stdout.contains(" SKIP "), "{stdout}");
}

/// The script's own limits: each check is killed only well after the programs' --timeout, so
/// that a hang meets the program's abort and watchdog first; and GPUs are counted as CUDA counts
/// them, through CUDA_VISIBLE_DEVICES (nvidia-smi ignores it): hiding every GPU leaves none.
#[test]
fn the_gpu_check_script_waits_longer_than_the_programs_and_honours_cuda_visible_devices() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let script = std::fs::read_to_string(root.join("scripts/gpu-check.sh")).unwrap();
    let number = |var: &str| -> u64 {
        let prefix = format!("{var}=${{{var}:-");
        let line = script
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {prefix}"));
        line[prefix.len()..].trim_end_matches('}').parse().unwrap()
    };
    let (program, check, kill) = (
        number("PROGRAM_TIMEOUT"),
        number("CHECK_LIMIT"),
        number("KILL_TIMEOUT"),
    );
    assert!(
        check >= 2 * program && kill + 2 < check,
        "{program} {check} {kill}"
    );
    assert!(script.contains(r#"timeout "$CHECK_LIMIT" "$@""#));
    assert!(!script.contains("timeout 300"));
    // No GPU visible: the script stops at once, saying why, before running anything.
    for hidden in ["", "-1", "-1,0"] {
        let output = Command::new("bash")
            .arg(root.join("scripts/gpu-check.sh"))
            .env("CUDA_VISIBLE_DEVICES", hidden)
            .env_remove("GPUS")
            .env("PATH", fake_nvidia_smi())
            .plainly()
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(2),
            "CUDA_VISIBLE_DEVICES={hidden:?}: {stderr}"
        );
        assert!(stderr.contains("no GPU found"), "{stderr}");
    }
    // One of the two listed: one GPU (the checks themselves fail here, on binaries that are not
    // in BIN_DIR, and fast).
    let output = Command::new("bash")
        .arg(root.join("scripts/gpu-check.sh"))
        .env("CUDA_VISIBLE_DEVICES", "1")
        .env_remove("GPUS")
        .env("PATH", fake_nvidia_smi())
        .env("BIN_DIR", "/nonexistent")
        .plainly()
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.starts_with("gpu-check: 1 GPU, backend nccl"),
        "{stdout}"
    );
    assert!(!output.status.success(), "{stdout}");
    // With one GPU, NCCL runs one rank: the kill check says why it cannot run.
    let killed = stdout
        .lines()
        .find(|l| l.starts_with("rank-killed "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        killed.contains(" SKIP ") && killed.contains("needs 2 ranks, and NCCL one GPU per rank"),
        "{killed}"
    );
}

/// A PATH whose nvidia-smi lists two GPUs, whatever CUDA_VISIBLE_DEVICES says (as the real one
/// does), before the system's folders.
fn fake_nvidia_smi() -> String {
    let dir = std::env::temp_dir().join(format!("fake-nvidia-smi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let smi = dir.join("nvidia-smi");
    std::fs::write(
        &smi,
        "#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-a)'\necho 'GPU 1: NVIDIA H100 (UUID: GPU-b)'\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn collective_check_reports_every_collective() {
    let output = Command::new(build::package_example("comm-core", "collective-check"))
        .args(["--backend", "cpu", "-n", "2", "--lens", "0,5"])
        .plainly()
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
        "sendrecv int32",
        "alltoall float out-of-place",
        "alltoall int64 out-of-place",
        "gather float in-place",
        "scatter int32 out-of-place",
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
    // Every check the collective table gives 2 ranks, for each dtype, at both lengths.
    let per_len: usize = comm_core::DType::ALL
        .iter()
        .map(|&dtype| comm_core::check::names(2, dtype).len())
        .sum();
    let summary = format!("checks: {} passed, 0 failed on 2 ranks (cpu)", 2 * per_len);
    assert!(stdout.contains(&summary), "{summary} in\n{stdout}");
}

/// Runs `nccl-probe` with none of the places libnccl is looked for, but `env`.
fn probe(env: &[(&str, &str)]) -> (Output, String) {
    let home = std::env::temp_dir().join(format!("nccl-probe-home-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
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
    if row(&stdout, "CUDA driver").contains("not found") {
        assert!(
            row(&stdout, "--backend").contains("cpu (no CUDA driver found)"),
            "{stdout}"
        );
    }
}

#[test]
fn a_broken_libnccl_so2_is_named_not_a_crash_or_a_loop() {
    let dir = std::env::temp_dir().join(format!("nccl-broken-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
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

#[test]
fn a_real_libnccl_so2_from_pip_is_found_linked_and_loaded() {
    let Some(wheel) = test_support::libnccl::wheel_or_skip() else {
        return;
    };
    let lib = wheel.join("nvidia/nccl/lib");
    let so2 = test_support::libnccl::so2(&wheel);
    // A virtual environment whose site-packages is the wheel's folder.
    let venv = std::env::temp_dir().join(format!("nccl-venv-{}", std::process::id()));
    let site = venv.join("lib/python3.11/site-packages");
    std::fs::create_dir_all(site.parent().unwrap()).unwrap();
    if !site.exists() {
        std::os::unix::fs::symlink(wheel.canonicalize().unwrap(), &site).unwrap();
    }
    let ways: [(&str, &Path); 4] = [
        ("NCCL_LIBRARY", &so2),
        ("LD_LIBRARY_PATH", &lib),
        ("VIRTUAL_ENV", &venv),
        // The last resort: the Python on PATH knows where its nvidia.nccl is.
        ("PYTHONPATH", &wheel),
    ];
    for (var, value) in ways {
        let (_, stdout) = probe(&[(var, value.to_str().unwrap())]);
        let libnccl = row(&stdout, "libnccl");
        assert!(
            libnccl.contains("NCCL 2.")
                && libnccl.contains(&format!("from {}", so2.display()))
                && libnccl.contains("(libnccl.so.2, linked as libnccl.so)"),
            "{var}={}:\n{stdout}",
            value.display()
        );
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
