//! The course examples, run as a user runs them (the built example binaries, which spawn their
//! own ranks), their printed grids read back cell by cell.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The example binary cargo built next to this test, building it if needed.
fn example(name: &str) -> PathBuf {
    let test_exe = std::env::current_exe().unwrap();
    let profile_dir = test_exe.parent().unwrap().parent().unwrap();
    let path = profile_dir.join("examples").join(name);
    if !path.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--example", name])
            .status()
            .unwrap();
        assert!(status.success(), "cargo build --example {name} failed");
    }
    path
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
        assert_eq!(
            stdout.lines().next(),
            Some("backend: cpu (asked for with --backend cpu)")
        );
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
    assert!(e.contains("--backend nccl"), "{e}");
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
