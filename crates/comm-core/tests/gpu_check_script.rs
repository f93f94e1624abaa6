//! The NCCL backend's run-time checks where no GPU is: scripts/gpu-check.sh and its
//! `collective-check` on the CPU backend (so they keep working), what each of its checks reads
//! (with stand-in programs: only the After grid, a value only the collective can make), that it
//! is sound shell, and which NCCL it uses: the nvidia-nccl wheel of the Python that holds
//! PyTorch, found here in pip's wheel (NCCL_WORKSHOP_TEST_LIBNCCL, as `nccl_probe.rs` reads it)
//! and in the course's torch environment. `nccl_probe.rs` tests nccl-probe itself.

use std::path::{Path, PathBuf};
use std::process::Command;

use test_support::build;
use test_support::process::{on_path, scratch, Plainly};

/// The script, from the workspace root.
fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gpu-check.sh")
}

/// The folder of the example binaries gpu-check.sh runs (the root package's and comm-core's),
/// brought up to date: a stale one would check old code. comm-bench, which the script finds one
/// folder up (target/<profile>), too.
fn examples_dir() -> PathBuf {
    build::package_example("comm-core", "collective-check");
    build::binary("comm-bench", "comm-bench");
    let hello = build::example("00-hello-world");
    hello.parent().unwrap().to_path_buf()
}

/// The checks the script runs only on NCCL (the probe and the library it loaded, the GPU's
/// trace slices, one rank more than GPUs); every other check runs on the CPU backend too.
const NCCL_ONLY: [&str; 4] = ["probe", "nccl-used", "gpu-trace", "too-many-ranks"];

/// The names of the script's checks, as its `check NAME 0|fail …` calls (at the start of a line,
/// or after `FROM='…'`) and the kill check give them.
fn checks_in_script() -> Vec<String> {
    let text = std::fs::read_to_string(script()).unwrap();
    let mut names: Vec<String> = text
        .lines()
        .filter_map(|line| {
            let at = line.find("check ")?;
            let before = line[..at].trim();
            let call = before.is_empty() || before.starts_with("FROM=");
            let mut words = line[at + "check ".len()..].split_whitespace();
            let (name, expect) = (words.next()?, words.next()?);
            (call && matches!(expect, "0" | "fail")).then(|| name.to_string())
        })
        .collect();
    names.push("rank-killed".into());
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_gpu_check_script_passes_on_the_cpu_backend() {
    // Each check may take longer than on a GPU machine: debug builds on a shared 2-core VM run
    // collective-check's four sizes on 3 ranks in one to two minutes, more under load. What is
    // asserted is that every check passes, not how fast.
    let output = Command::new("bash")
        .arg(script())
        .env("BACKEND", "cpu")
        .env("GPUS", "3")
        .env("BIN_DIR", examples_dir())
        .env("CHECK_LIMIT", "600")
        .plainly()
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let named = checks_in_script();
    // Every check the script has for the CPU backend ran and passed: none skipped, none missing,
    // these among them.
    for check in [
        "hello-world",
        "broadcast",
        "allreduce",
        "collectives",
        // A float Avg all-reduce's result in a zeroed buffer: only the collective writes it.
        "avg-written",
        "trace",
        // 06: training, every rank's weights the same.
        "ddp-training",
        // Groups: split, and 07's tensor-parallel group.
        "split",
        "tensor-parallel",
        // 03 on both halves, and its ranks agreeing on one backend.
        "gloo-vs-nccl",
        "backend-agreed",
        "gloo-half-timeline",
        // comm-bench at each -z, -a and -I, -m 2, with nothing wrong.
        "bench-z0-a0",
        "bench-z0-I1",
        "bench-z1-a1-I1",
        "bench-z3-a2-I1",
        "bench-z3-a3",
        "bench-m2-z1",
        // A too-large -e refused size by size.
        "bench-too-large",
        // A rank killed mid-collective: the other ends within its --timeout + 2 s, naming it.
        "rank-killed",
    ] {
        assert!(named.iter().any(|n| n == check), "{check} in {named:?}");
    }
    for check in named.iter().filter(|n| !NCCL_ONLY.contains(&n.as_str())) {
        let row = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(check))
            .unwrap_or_else(|| panic!("no {check} row in\n{stdout}"));
        assert!(row.contains(" PASS "), "{row}\n{stdout}");
    }
    assert!(!stdout.contains(" SKIP "), "{stdout}");
    // On the CPU backend no NCCL is looked for.
    assert!(!stdout.contains("gpu-check: NCCL"), "{stdout}");
}

/// A stand-in for one of the script's programs in `dir`: a shell script printing `output`.
fn stand_in(dir: &Path, name: &str, output: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\ncat <<'EOF'\n{output}EOF\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The course's grid of one rank, as the examples print it.
fn grid(title: &str, value: &str) -> String {
    format!(
        "{title}\n       ---------------------\nGpu 0  | {value:<2} | {value:<2} | {value:<2} | {value:<2} |\n       ---------------------\n\n"
    )
}

/// The script on one rank with stand-ins for 01, 02 and collective-check; its table's rows.
fn one_rank_with(dir: &Path, broadcast: &str, allreduce: &str, checks: &str) -> Vec<String> {
    stand_in(dir, "01-broadcast", broadcast);
    stand_in(dir, "02-allreduce", allreduce);
    stand_in(dir, "collective-check", checks);
    let output = Command::new("bash")
        .arg(script())
        .env("BACKEND", "cpu")
        .env("GPUS", "1")
        .env("BIN_DIR", dir)
        .env("LOGS", dir.join("logs"))
        .plainly()
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The other checks fail, on programs that are not there.
    assert!(!output.status.success(), "{stdout}");
    stdout.lines().map(String::from).collect()
}

fn verdict<'a>(rows: &'a [String], check: &str) -> &'a str {
    let row = rows
        .iter()
        .find(|l| l.split_whitespace().next() == Some(check))
        .unwrap_or_else(|| panic!("no {check} row in {rows:#?}"));
    row.split_whitespace().nth(1).unwrap()
}

/// On one rank the Before grid holds what the After grid must (42 for the broadcast's root, 1
/// for an all-reduce of ones), so a run whose collective did nothing would pass a check that
/// reads the whole output. The script reads the After grid only; and it passes only where a
/// float Avg all-reduce wrote its result into a zeroed receive buffer, a value only the
/// collective can make (on one rank NCCL launches a kernel for it).
#[test]
fn only_the_after_grid_and_a_value_only_the_collective_makes_pass() {
    let dir = scratch("gpu-check-stand-ins");
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let avg = |len: usize, wrong: usize| {
        let result = if wrong == 0 { "PASS" } else { "FAIL" };
        format!(
            "{:<44} {len:>9} {wrong:>7}  {result}\nchecks: 1 passed, 0 failed on 1 ranks (cpu)\n",
            "all_reduce avg float out-of-place"
        )
    };
    // The broadcast's Before grid is right and its After grid is not; 02's After grid is right.
    let rows = one_rank_with(
        &dir,
        &format!(
            "{}{}",
            grid("Before broadcast:", "42"),
            grid("After broadcast:", "0")
        ),
        &format!(
            "{}{}",
            grid("Before reduce:", "1"),
            grid("After reduce:", "1")
        ),
        &avg(1 << 20, 0),
    );
    assert_eq!(verdict(&rows, "broadcast"), "FAIL", "{rows:#?}");
    assert_eq!(verdict(&rows, "allreduce"), "PASS", "{rows:#?}");
    assert_eq!(verdict(&rows, "collectives"), "PASS", "{rows:#?}");
    assert_eq!(verdict(&rows, "avg-written"), "PASS", "{rows:#?}");
    // The line found early in a long output (more than a pipe holds): still found.
    let long = format!("{}{}", avg(1 << 20, 0), "more output\n".repeat(20_000));
    let rows = one_rank_with(&dir, "", "", &long);
    assert_eq!(verdict(&rows, "avg-written"), "PASS", "{rows:#?}");
    // No After grid at all; the Avg result wrong, or only a short one.
    for checks in [avg(1 << 20, 3), avg(1001, 0)] {
        let rows = one_rank_with(&dir, &grid("Before broadcast:", "42"), "", &checks);
        assert_eq!(verdict(&rows, "broadcast"), "FAIL", "{rows:#?}");
        assert_eq!(verdict(&rows, "allreduce"), "FAIL", "{rows:#?}");
        assert_eq!(verdict(&rows, "avg-written"), "FAIL", "{rows:#?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The script parses as bash, and passes shellcheck where it is installed.
#[test]
fn the_gpu_check_script_is_sound_shell() {
    let parsed = Command::new("bash")
        .arg("-n")
        .arg(script())
        .output()
        .unwrap();
    assert!(
        parsed.status.success(),
        "{}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    let Some(shellcheck) = on_path("shellcheck") else {
        eprintln!("skipped: shellcheck is not installed (apt-get install shellcheck)");
        return;
    };
    let checked = Command::new(shellcheck).arg(script()).output().unwrap();
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stdout)
    );
}

/// The script's limits: each check is killed only well after the programs' --timeout, so that a
/// hang meets the program's abort and watchdog first; and GPUs are counted as CUDA counts them,
/// through CUDA_VISIBLE_DEVICES (nvidia-smi ignores it): hiding every GPU leaves none.
#[test]
fn the_gpu_check_script_waits_longer_than_the_programs_and_honours_cuda_visible_devices() {
    let text = std::fs::read_to_string(script()).unwrap();
    let number = |var: &str| -> u64 {
        let prefix = format!("{var}=${{{var}:-");
        let line = text
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
    assert!(text.contains(r#"timeout "$CHECK_LIMIT" "$@""#));
    assert!(!text.contains("timeout 300"));
    let smi = scratch("fake-nvidia-smi");
    // No GPU visible: the script stops at once, saying why, before running anything.
    for hidden in ["", "-1", "-1,0"] {
        let output = Command::new("bash")
            .arg(script())
            .env("CUDA_VISIBLE_DEVICES", hidden)
            .env_remove("GPUS")
            .env("PATH", fake_nvidia_smi(&smi))
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
        .arg(script())
        .env("CUDA_VISIBLE_DEVICES", "1")
        .env_remove("GPUS")
        .env("PATH", fake_nvidia_smi(&smi))
        .env("BIN_DIR", "/nonexistent")
        .plainly()
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.starts_with("gpu-check: 1 GPU, backend nccl"),
        "{stdout}"
    );
    // The second line says which NCCL the checks use, found or not.
    assert!(
        stdout
            .lines()
            .nth(1)
            .unwrap_or("")
            .starts_with("gpu-check: N"),
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
    std::fs::remove_dir_all(&smi).unwrap();
}

/// A PATH whose nvidia-smi (in `dir`) lists two GPUs, whatever CUDA_VISIBLE_DEVICES says (as
/// the real one does), before the system's folders.
fn fake_nvidia_smi(dir: &Path) -> String {
    stand_in(
        dir,
        "nvidia-smi",
        "GPU 0: NVIDIA H100 (UUID: GPU-a)\nGPU 1: NVIDIA H100 (UUID: GPU-b)\n",
    );
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// `gpu-check.sh --which-nccl` with `envs`, PATH's first folder `path_first` (its python3 knows
/// no NCCL wheel) and the course's torch environment at `torch_venv`: its status and output.
fn which_nccl(path_first: &Path, torch_venv: &Path, envs: &[(&str, &Path)]) -> (i32, String) {
    let mut command = Command::new("bash");
    command
        .arg(script())
        .arg("--which-nccl")
        .env_remove("NCCL_LIBRARY")
        .env_remove("PYTHONPATH")
        .env(
            "PATH",
            format!(
                "{}:{}",
                path_first.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("NCCL_WORKSHOP_TORCH_VENV", torch_venv);
    for (var, value) in envs {
        command.env(var, value);
    }
    let output = command.output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), said)
}

/// Which NCCL the script uses, and says it uses: NCCL_LIBRARY where set (a file or a folder; a
/// wrong one stops it), else the nvidia-nccl wheel of the python3 on PATH (a GPU machine's
/// holds PyTorch), else that of the course's torch environment, else none (then each program
/// searches). The wheel here is pip's (NCCL_WORKSHOP_TEST_LIBNCCL), seen through PYTHONPATH and
/// through a stand-in torch environment; and the real torch environment's, where installed.
#[test]
fn the_script_uses_the_nccl_of_the_python_that_holds_pytorch() {
    let dir = scratch("gpu-check-which-nccl");
    // A python3 first on PATH that knows no NCCL wheel (the machine's own might: it runs
    // without site-packages), but what PYTHONPATH adds.
    let plain = dir.join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let python3 = on_path("python3").expect("python3 on PATH");
    python_without_site(&plain.join("python3"), &python3, None);
    let no_venv = dir.join("no-venv");
    let (status, said) = which_nccl(&plain, &no_venv, &[]);
    assert_eq!(status, 1, "{said}");
    assert!(
        said.contains("NCCL_LIBRARY is not set and no python3 has an nvidia-nccl wheel"),
        "{said}"
    );
    let missing = dir.join("missing.so.2");
    let (status, said) = which_nccl(&plain, &no_venv, &[("NCCL_LIBRARY", &missing)]);
    assert_eq!(status, 2, "{said}");
    assert!(
        said.contains(&format!(
            "NCCL_LIBRARY={} names no library",
            missing.display()
        )),
        "{said}"
    );
    let Some(wheel) = test_support::libnccl::wheel_or_skip() else {
        return;
    };
    let so2 = wheel.join("nvidia/nccl/lib/libnccl.so.2");
    let lib = wheel.join("nvidia/nccl/lib");
    for given in [&so2, &lib] {
        let (status, said) = which_nccl(&plain, &no_venv, &[("NCCL_LIBRARY", given)]);
        assert_eq!(status, 0, "{said}");
        assert_eq!(
            said,
            format!("gpu-check: NCCL from {} (NCCL_LIBRARY)\n", so2.display())
        );
    }
    // The wheel in the Python on PATH, then in the torch environment: named with its version
    // and the Python that holds it.
    let from_the_wheel = |said: &str| {
        let start = format!("gpu-check: NCCL from {} (nvidia-nccl-cu1", so2.display());
        said.starts_with(&start) && said.contains(", the wheel of /") && said.ends_with(")\n")
    };
    let (status, said) = which_nccl(&plain, &no_venv, &[("PYTHONPATH", &wheel)]);
    assert!(status == 0 && from_the_wheel(&said), "{said}");
    let venv = dir.join("torch-venv");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    python_without_site(&venv.join("bin/python"), &python3, Some(&wheel));
    let (status, said) = which_nccl(&plain, &venv, &[]);
    assert!(status == 0 && from_the_wheel(&said), "{said}");
    // The course's real torch environment: PyTorch's own NCCL wheel.
    if let Some(torch) = test_support::torch::or_skip("the torch environment's NCCL") {
        let (status, said) = which_nccl(&plain, &torch.venv, &[]);
        assert_eq!(status, 0, "{said}");
        assert!(
            said.contains("/nvidia/nccl/lib/libnccl.so.2 (nvidia-nccl-cu1")
                && said.contains(&format!("the wheel of {}", torch.venv.display())),
            "{said}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A Python at `at`: `python3` without its site-packages (`-S`), with `wheel` on its path if
/// given (as a virtual environment's `bin/python` holding the wheel).
fn python_without_site(at: &Path, python3: &Path, wheel: Option<&Path>) {
    use std::os::unix::fs::PermissionsExt;
    let path = wheel.map_or(String::new(), |w| format!("PYTHONPATH='{}' ", w.display()));
    std::fs::write(
        at,
        format!("#!/bin/sh\n{path}exec '{}' -S \"$@\"\n", python3.display()),
    )
    .unwrap();
    std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o755)).unwrap();
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
