//! The course examples, run as a user runs them (the built example binaries, which spawn their
//! own ranks), their printed grids read back cell by cell.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The example binary, built (or brought up to date) once per test run: `cargo test --test
/// examples` alone does not rebuild examples, and a stale one would test old code.
fn example(name: &str) -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(|| {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--examples", "-p", "nccl-workshop"])
            .status()
            .unwrap();
        assert!(status.success(), "cargo build --examples failed");
    });
    let test_exe = std::env::current_exe().unwrap();
    test_exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name)
}

fn run(name: &str, args: &[&str]) -> Output {
    let output = Command::new(example(name))
        .args(args)
        .env_remove("RANK")
        .env_remove("SLURM_PROCID")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{name} {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The grid under `title`: for each rank in order, its cells.
fn grid(stdout: &str, title: &str) -> Vec<Vec<String>> {
    let mut lines = stdout.lines().skip_while(|l| *l != title).skip(1);
    let mut rows = Vec::new();
    for line in lines.by_ref() {
        if line.trim().is_empty() {
            break;
        }
        if let Some(rest) = line.strip_prefix("Gpu ") {
            let (rank, cells) = rest.split_once('|').expect("a row has cells");
            assert_eq!(
                rank.trim().parse::<usize>().unwrap(),
                rows.len(),
                "rows in rank order"
            );
            let cells = cells.rsplit_once('|').unwrap().0;
            rows.push(cells.split('|').map(|c| c.trim().to_string()).collect());
        } else {
            assert!(
                line.trim().chars().all(|c| c == '-'),
                "unexpected line in grid: {line:?}"
            );
        }
    }
    assert!(!rows.is_empty(), "no grid titled {title:?} in:\n{stdout}");
    rows
}

fn expect_cells(rows: &[Vec<String>], n: usize, len: usize, cell: impl Fn(usize) -> String) {
    assert_eq!(rows.len(), n, "one row per rank");
    for (rank, row) in rows.iter().enumerate() {
        assert_eq!(row.len(), len, "rank {rank}: {row:?}");
        for value in row {
            assert_eq!(*value, cell(rank), "rank {rank}: {row:?}");
        }
    }
}

#[test]
fn hello_world_greets_from_every_rank() {
    for n in [2, 3, 4] {
        let out = run(
            "00-hello-world",
            &["-n", &n.to_string(), "--backend", "cpu"],
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(stdout.lines().next(), Some("backend: cpu (requested)"));
        for rank in 0..n {
            let hello = format!(
                "Hello from rank {rank} of {n} (local rank {rank}) on cpu:{rank} with the cpu backend"
            );
            assert_eq!(
                stdout.lines().filter(|l| *l == hello).count(),
                1,
                "{hello:?} in\n{stdout}"
            );
        }
    }
}

#[test]
fn broadcast_copies_rank_zeros_42s_everywhere() {
    for n in [2, 3, 4] {
        let out = run("01-broadcast", &["-n", &n.to_string()]);
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(stdout.starts_with("backend: cpu ("), "{stdout}");
        for rank in 0..n {
            assert!(stdout.contains(&format!("Rank {rank} using device: cpu:{rank}\n")));
        }
        let before = grid(&stdout, "Before broadcast:");
        expect_cells(&before, n, 4, |rank| {
            if rank == 0 { "42" } else { "0" }.into()
        });
        let after = grid(&stdout, "After broadcast:");
        expect_cells(&after, n, 4, |_| "42".into());
    }
}

#[test]
fn broadcast_default_is_four_ranks_and_long_buffers_are_elided() {
    let out = run("01-broadcast", &["--len", "1000"]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let after = grid(&stdout, "After broadcast:");
    assert_eq!(after.len(), 4);
    for row in after {
        assert_eq!(row, ["42", "42", "42", "...", "42", "42", "42"]);
    }
    assert!(stdout.contains("(1000 elements)"));
}

#[test]
fn allreduce_sums_ones_to_the_world_size() {
    for n in [2, 3, 4] {
        let out = run("02-allreduce", &["-n", &n.to_string()]);
        let stdout = String::from_utf8(out.stdout).unwrap();
        let before = grid(&stdout, "Before reduce:");
        expect_cells(&before, n, 4, |_| "1".into());
        let after = grid(&stdout, "After reduce:");
        expect_cells(&after, n, 4, |_| n.to_string());
    }
}

fn fails(name: &str, args: &[&str], envs: &[(&str, &str)]) -> String {
    let mut command = Command::new(example(name));
    command
        .args(args)
        .env_remove("RANK")
        .env_remove("SLURM_PROCID");
    for (k, v) in envs {
        command.env(k, v);
    }
    let output = command.output().unwrap();
    assert!(!output.status.success(), "{name} {args:?} should fail");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        !stderr.contains("panicked"),
        "a panic reached the user:\n{stderr}"
    );
    stderr
}

#[test]
fn bad_input_gets_a_clear_message() {
    let e = fails("01-broadcast", &["--backend", "nccl"], &[]);
    assert!(e.contains("NCCL cannot run here"), "{e}");
    let e = fails("01-broadcast", &["-n", "0"], &[]);
    assert!(e.contains("--nproc-per-node 0"), "{e}");
    let e = fails("01-broadcast", &["--timeout", "0"], &[]);
    assert!(e.contains("--timeout 0"), "{e}");
    let e = fails("01-broadcast", &["--backend", "gpu"], &[]);
    assert!(e.contains("invalid value 'gpu'"), "{e}");
    let e = fails("01-broadcast", &[], &[("RANK", "0"), ("WORLD_SIZE", "2")]);
    assert!(e.contains("MASTER_ADDR is not set"), "{e}");
    let e = fails("01-broadcast", &[], &[("RANK", "3"), ("WORLD_SIZE", "2")]);
    assert!(e.contains("RANK=3 but WORLD_SIZE=2"), "{e}");
}

#[test]
fn a_port_in_use_is_reported_by_rank_zero() {
    let taken = std::net::TcpListener::bind(("0.0.0.0", 0)).unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let env = [
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", port.as_str()),
    ];
    let e = fails("00-hello-world", &["--timeout", "5"], &env);
    assert!(
        e.contains(&format!(
            "error: rank 0: rank 0 cannot serve the rendezvous store on 0.0.0.0:{port}"
        )),
        "{e}"
    );
    assert!(
        e.contains("pick another with --master-port or MASTER_PORT"),
        "{e}"
    );
}

/// The line example 03 prints for one backend: (backend, MB, median ms, busbw).
fn timing_line(stdout: &str, backend: &str) -> (usize, f64, f64) {
    let prefix = format!("Rank 0 ({backend}): all-reduce ");
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{stdout}"));
    // Rank 0 (cpu): all-reduce 2 MB took 3.21 ms (median of 3, busbw 1.23 GB/s)
    let words: Vec<&str> = line.split_whitespace().collect();
    let mb = words[4].parse().unwrap();
    assert_eq!(
        (words[5], words[6], words[8]),
        ("MB", "took", "ms"),
        "{line}"
    );
    let ms: f64 = words[7].parse().unwrap();
    let busbw: f64 = words[13].parse().unwrap();
    assert!(ms > 0.0 && busbw > 0.0, "{line}");
    assert!(line.ends_with("GB/s)"), "{line}");
    (mb, ms, busbw)
}

fn check_gloo_vs_nccl(stdout: &str, mb: usize) {
    assert_eq!(timing_line(stdout, "cpu").0, mb);
    // No GPU here: the NCCL line says why it was skipped.
    assert!(
        stdout.contains("Rank 0 (nccl): skipped: NCCL cannot run here: no CUDA driver found"),
        "{stdout}"
    );
}

#[test]
fn gloo_vs_nccl_times_the_cpu_path_and_says_why_nccl_was_skipped() {
    for n in ["2", "4"] {
        let out = run(
            "03-multinode-gloo-vs-nccl",
            &["-n", n, "--size-mb", "2", "--iters", "3", "--warmup", "1"],
        );
        check_gloo_vs_nccl(&String::from_utf8(out.stdout).unwrap(), 2);
    }
}

/// A binary of another package in this workspace, brought up to date first.
fn workspace_binary(package: &str, name: &str) -> PathBuf {
    let status = Command::new(env!("CARGO"))
        .args(["build", "-p", package])
        .status()
        .unwrap();
    assert!(status.success());
    let test_exe = std::env::current_exe().unwrap();
    test_exe.parent().unwrap().parent().unwrap().join(name)
}

/// Starts every command at once (the processes of one job), waits for all, and checks each
/// succeeded.
fn run_together(commands: Vec<Command>) -> Vec<Output> {
    let children: Vec<_> = commands
        .into_iter()
        .map(|mut c| {
            c.env_remove("RANK")
                .env_remove("SLURM_PROCID")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for (i, out) in outputs.iter().enumerate() {
        assert!(
            out.status.success(),
            "process {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    outputs
}

const QUICK: [&str; 8] = [
    "--size-mb",
    "2",
    "--iters",
    "3",
    "--warmup",
    "1",
    "--timeout",
    "60",
];

#[test]
fn gloo_vs_nccl_across_two_launchers_as_two_nodes() {
    let commrun = workspace_binary("commrun", "commrun");
    let example = example("03-multinode-gloo-vs-nccl");
    let port = comm_core::spawn::free_port().unwrap().to_string();
    let nodes = (0..2)
        .map(|node| {
            let mut c = Command::new(&commrun);
            c.args(["--nnodes", "2", "--node-rank", &node.to_string()])
                .args(["--nproc-per-node", "2", "--master-addr", "127.0.0.1"])
                .args(["--master-port", &port, "--no-prefix"])
                .arg(&example)
                .args(QUICK);
            c
        })
        .collect();
    let outputs = run_together(nodes);
    // Rank 0 lives on node 0, and its lines say 4 ranks took part (busbw factor 2·3/4).
    let stdout = String::from_utf8(outputs[0].stdout.clone()).unwrap();
    check_gloo_vs_nccl(&stdout, 2);
    let (_, ms, busbw) = timing_line(&stdout, "cpu");
    let expected = 2e6 / (ms / 1e3) / 1e9 * 1.5;
    assert!(
        (busbw - expected).abs() <= 0.01 + expected * 0.02,
        "busbw {busbw} vs {expected} for 4 ranks"
    );
}

#[test]
fn gloo_vs_nccl_started_by_hand_with_the_courses_flags() {
    let port = comm_core::spawn::free_port().unwrap().to_string();
    let ranks = (0..2)
        .map(|rank| {
            let mut c = Command::new(example("03-multinode-gloo-vs-nccl"));
            c.args(["--world-size", "2", "--rank", &rank.to_string()])
                .args(["--master-addr", "127.0.0.1", "--master-port", &port])
                .args(QUICK);
            c
        })
        .collect();
    let outputs = run_together(ranks);
    check_gloo_vs_nccl(&String::from_utf8(outputs[0].stdout.clone()).unwrap(), 2);
    let e = fails(
        "03-multinode-gloo-vs-nccl",
        &["--world-size", "2", "--rank", "2"],
        &[],
    );
    assert!(e.contains("--rank=2 but --world-size=2"), "{e}");
}
