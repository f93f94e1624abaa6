//! The course examples, run as a user runs them (the built example binaries, which spawn their
//! own ranks), their printed grids read back cell by cell.

use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use test_support::backend::{self, Backend, Kind};
use test_support::build::example;
use test_support::grid::{expect_cells, Grid, Rows};
use test_support::process::{run_together, Plainly};

fn run(name: &str, args: &[&str]) -> Output {
    let output = Command::new(example(name))
        .args(args)
        .plainly()
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

/// The grid under `title`, rows in rank order, nothing else between its lines: the ranks share
/// one stdout, so a rank's own line ("Rank 2 using device: cpu:2"), printed before it sent its
/// row, comes before rank 0's grid.
fn grid(stdout: &str, title: &str) -> Rows {
    Grid::titled(title).read(stdout)
}

/// What `--backend auto` picks on this machine: the tests expect that, not a machine without GPUs.
fn this_machine() -> &'static Backend {
    static BACKEND: OnceLock<Backend> = OnceLock::new();
    BACKEND.get_or_init(|| backend::on_this_machine(&example("00-hello-world"), &[]))
}

/// Rank counts the examples can run with on this machine: NCCL needs a GPU per rank.
fn world_sizes() -> Vec<usize> {
    match this_machine().kind {
        Kind::Cpu => vec![2, 3, 4],
        Kind::Nccl => (1..=this_machine().gpus().min(4)).collect(),
    }
}

/// The device a rank of a one-node job names on this machine's backend.
fn device(rank: usize) -> String {
    match this_machine().kind {
        Kind::Cpu => format!("cpu:{rank}"),
        Kind::Nccl => format!("cuda:{rank}"),
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
    for n in world_sizes() {
        let out = run("01-broadcast", &["-n", &n.to_string()]);
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(Backend::first_line_of(&stdout), *this_machine(), "{stdout}");
        let first_grid = stdout.find("Before broadcast:").expect("a grid");
        for rank in 0..n {
            let line = format!("Rank {rank} using device: {}\n", device(rank));
            let at = stdout.find(&line);
            assert!(
                at.is_some_and(|at| at < first_grid),
                "{line:?} before the first grid in\n{stdout}"
            );
        }
        let before = grid(&stdout, "Before broadcast:");
        expect_cells(&before, n, 4, |rank| if rank == 0 { "42" } else { "0" });
        let after = grid(&stdout, "After broadcast:");
        expect_cells(&after, n, 4, |_| "42");
    }
}

#[test]
fn broadcast_default_is_a_rank_per_gpu_or_four_and_long_buffers_are_elided() {
    let out = run("01-broadcast", &["--len", "1000"]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let after = grid(&stdout, "After broadcast:");
    let default_ranks = match this_machine().kind {
        Kind::Cpu => 4,
        Kind::Nccl => this_machine().gpus(),
    };
    assert_eq!(after.len(), default_ranks);
    for row in after {
        assert_eq!(row, ["42", "42", "42", "...", "42", "42", "42"]);
    }
    assert!(stdout.contains("(1000 elements)"));
}

#[test]
fn allreduce_sums_ones_to_the_world_size() {
    for n in world_sizes() {
        let out = run("02-allreduce", &["-n", &n.to_string()]);
        let stdout = String::from_utf8(out.stdout).unwrap();
        let before = grid(&stdout, "Before reduce:");
        expect_cells(&before, n, 4, |_| "1");
        let after = grid(&stdout, "After reduce:");
        expect_cells(&after, n, 4, |_| n.to_string());
    }
}

/// 04 and 05 as the README runs them (the default ranks), then on every rank count.
#[test]
fn allgather_and_reduce_scatter_put_each_block_where_it_belongs() {
    let default_ranks = match this_machine().kind {
        Kind::Cpu => 4,
        Kind::Nccl => this_machine().gpus(),
    };
    let counts = [None]
        .into_iter()
        .chain(world_sizes().into_iter().map(Some));
    for n in counts {
        let flag = n.map(|n| n.to_string());
        let args: Vec<&str> = flag.iter().flat_map(|n| ["-n", n.as_str()]).collect();
        let n = n.unwrap_or(default_ranks);
        let out = run("04-allgather", &args);
        let stdout = String::from_utf8(out.stdout).unwrap();
        let before = grid(&stdout, "Before all-gather (each rank's block):");
        expect_cells(&before, n, 2, |rank| (rank + 1).to_string());
        let after = grid(&stdout, "After all-gather:");
        let gathered: Vec<String> = (0..2 * n).map(|i| (i / 2 + 1).to_string()).collect();
        assert!(after.iter().all(|row| *row == gathered), "{stdout}");
        let out = run("05-reduce-scatter", &args);
        let stdout = String::from_utf8(out.stdout).unwrap();
        let after = grid(&stdout, "After reduce-scatter (block r on rank r):");
        for (rank, row) in after.iter().enumerate() {
            let sums: Vec<String> = (1..=2).map(|j| (n * (2 * rank + j)).to_string()).collect();
            assert_eq!(*row, sums, "rank {rank}: {stdout}");
        }
    }
}

/// Runs an example that must fail; returns its exit code and stderr.
fn fails_with_code(name: &str, args: &[&str], envs: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = Command::new(example(name));
    command.args(args).plainly();
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
    (output.status.code(), stderr)
}

fn fails(name: &str, args: &[&str], envs: &[(&str, &str)]) -> String {
    fails_with_code(name, args, envs).1
}

#[test]
fn bad_input_gets_a_clear_message() {
    let machine = this_machine();
    match machine.kind {
        // The reason `auto` fell back to the CPU is the reason `--backend nccl` is refused.
        Kind::Cpu => {
            let (code, e) = fails_with_code("01-broadcast", &["--backend", "nccl"], &[]);
            assert_eq!(code, Some(2), "{e}");
            let refusal = format!("NCCL cannot run here: {}", machine.reason);
            assert!(e.contains(&refusal), "{refusal:?} in\n{e}");
        }
        Kind::Nccl => {
            let out = run("01-broadcast", &["--backend", "nccl"]);
            let stdout = String::from_utf8(out.stdout).unwrap();
            assert_eq!(Backend::first_line_of(&stdout).kind, Kind::Nccl, "{stdout}");
        }
    }
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

/// `01-broadcast | head -0`: the pipe's reader is gone before the program prints. The ranks end
/// by SIGPIPE as Unix programs do, and the launcher says so, with no panic.
#[test]
fn output_closed_early_ends_the_job_without_a_panic() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let output = Command::new(example("01-broadcast"))
        .plainly()
        .stdout(writer)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(141), "128 + SIGPIPE:\n{stderr}");
    assert!(stderr.contains("its output was closed"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `GLOO_SOCKET_IFNAME` names the interface the CPU backend's links listen on, as it does for
/// Gloo: `lo` works on one machine; a name this host lacks is refused, naming the variable and
/// the interfaces there are.
#[test]
fn gloo_socket_ifname_picks_the_interface_of_the_cpu_links() {
    let output = Command::new(example("02-allreduce"))
        .args(["--backend", "cpu", "-n", "2", "--len", "3"])
        .plainly()
        .env("GLOO_SOCKET_IFNAME", "lo")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert_eq!(grid(&stdout, "After reduce:"), vec![vec!["2"; 3]; 2]);
    let e = fails(
        "02-allreduce",
        &["--backend", "cpu", "-n", "2", "--timeout", "20"],
        &[("GLOO_SOCKET_IFNAME", "nosuch0")],
    );
    assert!(e.contains("GLOO_SOCKET_IFNAME=nosuch0"), "{e}");
    assert!(e.contains("lo"), "the interfaces there are: {e}");
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
            "error: rank 0: rank 0 cannot serve the rendezvous store on 127.0.0.1:{port}"
        )),
        "{e}"
    );
    assert!(
        e.contains("pick another with --master-port or MASTER_PORT"),
        "{e}"
    );
}

/// `--master-port` and `--master-addr` (or the course's `--master_port`): the ranks an example
/// starts meet there; a busy port is refused before any rank starts; with a launcher's
/// MASTER_PORT as well, the flag wins and rank 0 says so.
#[test]
fn master_port_and_addr_flags_place_the_store() {
    let free = std::net::TcpListener::bind(("0.0.0.0", 0)).unwrap();
    let port = free.local_addr().unwrap().port().to_string();
    drop(free);
    let out = run(
        "02-allreduce",
        &[
            "--backend",
            "cpu",
            "-n",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            &port,
        ],
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(grid(&stdout, "After reduce:"), vec![vec!["2"; 4]; 2]);

    let taken = std::net::TcpListener::bind(("0.0.0.0", 0)).unwrap();
    let busy = taken.local_addr().unwrap().port().to_string();
    let (code, e) = fails_with_code("00-hello-world", &["-n", "2", "--master-port", &busy], &[]);
    assert_eq!(code, Some(2), "{e}");
    assert!(e.contains(&format!("--master-port {busy} is taken")), "{e}");
    let e = fails("00-hello-world", &["--master-port", "0"], &[]);
    assert!(e.contains("--master-port"), "{e}");

    // MASTER_PORT names the busy port, the flag a free one: the flag wins, as with torchrun.
    let env = [
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", busy.as_str()),
    ];
    let output = Command::new(example("00-hello-world"))
        .args([
            "--backend",
            "cpu",
            "--master-port",
            &port,
            "--timeout",
            "20",
        ])
        .plainly()
        .envs(env)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--master-port {port} wins over the environment's port {busy}"
        )),
        "{stderr}"
    );
}

/// The course's line example 03 prints for one half (`CPU` for the CPU path, whose label goes on
/// to name its transport, or `NCCL`): (MB, median ms, busbw).
fn timing_line(stdout: &str, half: &str) -> (usize, f64, f64) {
    let prefix = format!("Rank 0 ({half}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&prefix) && l.contains("): all-reduce "))
        .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{stdout}"));
    // Rank 0 (CPU, Gloo-style over shm): all-reduce 2 MB took 3.21 ms (median of 3, busbw 1.23 GB/s)
    let (_, timing) = line.split_once("): ").unwrap();
    let words: Vec<&str> = timing.split_whitespace().collect();
    let mb = words[1].parse().unwrap();
    assert_eq!(
        (words[0], words[2], words[3], words[5]),
        ("all-reduce", "MB", "took", "ms"),
        "{line}"
    );
    let ms: f64 = words[4].parse().unwrap();
    let busbw: f64 = words[10].parse().unwrap();
    assert!(ms > 0.0 && busbw > 0.0, "{line}");
    assert!(line.ends_with("GB/s)"), "{line}");
    (mb, ms, busbw)
}

/// Where example 03's ranks run: `nodes` pretended nodes on this one machine, `ranks_per_node`
/// ranks each.
struct Layout {
    nodes: usize,
    ranks_per_node: usize,
}

/// Example 03 (under `--backend auto`) said which backend the job chose, timed the CPU path, and
/// NCCL too where this machine can run it for `layout`; where it cannot, it says why.
fn check_gloo_vs_nccl(stdout: &str, mb: usize, layout: Layout) {
    let first = stdout.lines().next().unwrap_or_default();
    assert_eq!(
        Backend::first_line_of(stdout).kind,
        this_machine().kind,
        "{stdout}"
    );
    assert!(
        !first.contains("requested"),
        "nothing was requested: {first}"
    );
    assert_eq!(timing_line(stdout, "CPU").0, mb);
    let machine = this_machine();
    let gpus = machine.gpus();
    match machine.kind {
        Kind::Cpu => {
            let skipped = format!(
                "Rank 0 (NCCL): skipped: NCCL cannot run here: {}",
                machine.reason
            );
            assert!(stdout.contains(&skipped), "{skipped:?} in\n{stdout}");
        }
        Kind::Nccl if layout.nodes == 1 && layout.ranks_per_node <= gpus => {
            assert_eq!(timing_line(stdout, "NCCL").0, mb);
            assert!(stdout.contains("NCCL was "), "{stdout}");
        }
        // Too many ranks for the GPUs, or pretended nodes sharing them: the ranks' PCI bus ids
        // name two ranks of this host on one GPU (NCCL would refuse them with ncclInvalidUsage).
        Kind::Nccl => {
            assert!(stdout.contains("Rank 0 (NCCL): skipped: "), "{stdout}");
            let why = if layout.ranks_per_node > gpus {
                // Local rank `gpus` of the first node takes cuda:0 again, as rank 0 does.
                format!("ranks 0 and {gpus} share one GPU on host ")
            } else {
                "share one GPU on host ".to_string()
            };
            assert!(stdout.contains(&why), "{why:?} in\n{stdout}");
        }
    }
}

#[test]
fn gloo_vs_nccl_times_the_cpu_path_and_nccl_where_it_can_run() {
    let mut sizes = vec![2, 4];
    if this_machine().kind == Kind::Nccl && !sizes.contains(&this_machine().gpus()) {
        sizes.push(this_machine().gpus());
    }
    for n in sizes {
        let out = run(
            "03-multinode-gloo-vs-nccl",
            &[
                "-n",
                &n.to_string(),
                "--size-mb",
                "2",
                "--iters",
                "3",
                "--warmup",
                "1",
            ],
        );
        let layout = Layout {
            nodes: 1,
            ranks_per_node: n,
        };
        check_gloo_vs_nccl(&String::from_utf8(out.stdout).unwrap(), 2, layout);
    }
}

/// Generous: each job's own --timeout is 60 s.
const JOB_LIMIT: Duration = Duration::from_secs(180);

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
    let commrun = test_support::build::binary("commrun", "commrun");
    let example = example("03-multinode-gloo-vs-nccl");
    let port = comm_core::spawn::free_port().unwrap().to_string();
    let nodes = (0..2)
        .map(|node| {
            let mut c = Command::new(&commrun);
            c.args(["--nnodes", "2", "--node-rank", &node.to_string()])
                .args(["--nproc-per-node", "2", "--master-addr", "127.0.0.1"])
                .args(["--master-port", &port, "--no-prefix"])
                .arg(&example)
                .args(QUICK)
                .plainly();
            c
        })
        .collect();
    let outputs = run_together(nodes, JOB_LIMIT);
    for (node, out) in outputs.iter().enumerate() {
        out.assert_success(&format!("commrun of node {node}"));
    }
    // Rank 0 lives on node 0, and its lines say 4 ranks took part (busbw factor 2·3/4).
    let stdout = &outputs[0].stdout;
    let layout = Layout {
        nodes: 2,
        ranks_per_node: 2,
    };
    check_gloo_vs_nccl(stdout, 2, layout);
    let (_, ms, busbw) = timing_line(stdout, "CPU");
    let expected = 2e6 / (ms / 1e3) / 1e9 * 1.5;
    assert!(
        (busbw - expected).abs() <= 0.01 + expected * 0.02,
        "busbw {busbw} vs {expected} for 4 ranks"
    );
}

/// Two hosts in one job, each with three ranks: shared memory inside a host, TCP between them,
/// so the ring's ranks at a host's edge have a shared-memory neighbour on one side and a TCP one
/// on the other, while the middle rank has shared memory on both (12 MB: blocks of 2 MB cross
/// in pieces).
/// Every link must frame its messages the same way whichever code path its two ends take (a
/// 4 MB buffer crosses in pieces). The hosts are this machine under two host names (a UTS
/// namespace each, `unshare --uts`: root only; skipped otherwise).
#[test]
fn two_hosts_mix_shared_memory_and_tcp_in_one_ring() {
    let root = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0;
    let unshare = Command::new("unshare").arg("--version").output();
    if !root || !unshare.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: two host names on one machine need root and unshare");
        return;
    }
    let commrun = test_support::build::binary("commrun", "commrun");
    let example = example("03-multinode-gloo-vs-nccl");
    let port = comm_core::spawn::free_port().unwrap().to_string();
    let nodes = (0..2)
        .map(|node| {
            // unshare --uts sh -c 'hostname hostN && exec commrun ...'
            let mut c = Command::new("unshare");
            c.args(["--uts", "sh", "-c", "hostname \"$0\" && exec \"$@\""])
                .arg(format!("mixed-host{node}"))
                .arg(&commrun)
                .args(["--nnodes", "2", "--node-rank", &node.to_string()])
                .args(["--nproc-per-node", "3", "--master-addr", "127.0.0.1"])
                .args(["--master-port", &port, "--no-prefix"])
                .arg(&example)
                .args([
                    "--backend",
                    "cpu",
                    "--size-mb",
                    "12",
                    "--iters",
                    "2",
                    "--warmup",
                    "1",
                ])
                .plainly();
            c
        })
        .collect();
    let outputs = run_together(nodes, JOB_LIMIT);
    for (node, out) in outputs.iter().enumerate() {
        out.assert_success(&format!("commrun on host {node}"));
    }
    let stdout = &outputs[0].stdout;
    let mixed = "transport: shm+tcp (rank 0: shared memory to 2 ranks of its host, TCP to 3)";
    assert!(stdout.contains(mixed), "{stdout}");
    assert_eq!(timing_line(stdout, "CPU, Gloo-style over shm+tcp").0, 12);
}

#[test]
fn gloo_vs_nccl_started_by_hand_with_the_courses_flags() {
    let port = comm_core::spawn::free_port().unwrap().to_string();
    let ranks = (0..2)
        .map(|rank| {
            let mut c = Command::new(example("03-multinode-gloo-vs-nccl"));
            // Rank 0 with the course's own spellings, rank 1 with the dashed ones.
            let flags = match rank {
                0 => ["--world_size", "--master_addr", "--master_port"],
                _ => ["--world-size", "--master-addr", "--master-port"],
            };
            c.args([flags[0], "2", "--rank", &rank.to_string()])
                .args([flags[1], "127.0.0.1", flags[2], &port])
                .args(QUICK)
                .plainly();
            c
        })
        .collect();
    let outputs = run_together(ranks, JOB_LIMIT);
    for (rank, out) in outputs.iter().enumerate() {
        out.assert_success(&format!("rank {rank}"));
    }
    // Started by hand, each rank is a node of its own; here they share this machine.
    let layout = Layout {
        nodes: 2,
        ranks_per_node: 1,
    };
    check_gloo_vs_nccl(&outputs[0].stdout, 2, layout);
    let e = fails(
        "03-multinode-gloo-vs-nccl",
        &["--world-size", "2", "--rank", "2"],
        &[],
    );
    assert!(e.contains("--rank=2 but --world-size=2"), "{e}");
}

#[test]
fn gloo_vs_nccl_runs_the_halves_backend_asks_for() {
    let quick = ["-n", "2", "--size-mb", "1", "--iters", "2", "--warmup", "1"];
    // --backend cpu: the CPU path alone, and the job says it was requested.
    let out = run(
        "03-multinode-gloo-vs-nccl",
        &[&quick[..], &["--backend", "cpu"]].concat(),
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout.lines().next(),
        Some("backend: cpu (requested)"),
        "{stdout}"
    );
    assert_eq!(timing_line(&stdout, "CPU").0, 1);
    assert!(
        !stdout.contains("(NCCL)") && !stdout.contains("faster"),
        "{stdout}"
    );
    // --backend nccl: NCCL alone (one GPU per rank), or refused for the reason `auto` falls
    // back to the CPU.
    let machine = this_machine();
    let n = match machine.kind {
        Kind::Cpu => 2,
        Kind::Nccl => machine.gpus().min(2),
    }
    .to_string();
    let nccl = [&["-n", &n], &quick[2..], &["--backend", "nccl"]].concat();
    match machine.kind {
        Kind::Cpu => {
            let (code, e) = fails_with_code("03-multinode-gloo-vs-nccl", &nccl, &[]);
            assert_eq!(code, Some(2), "{e}");
            let refusal = format!("NCCL cannot run here: {}", machine.reason);
            assert!(e.contains(&refusal), "{refusal:?} in\n{e}");
        }
        Kind::Nccl => {
            let out = run("03-multinode-gloo-vs-nccl", &nccl);
            let stdout = String::from_utf8(out.stdout).unwrap();
            assert_eq!(Backend::first_line_of(&stdout).kind, Kind::Nccl, "{stdout}");
            assert_eq!(timing_line(&stdout, "NCCL").0, 1);
            assert!(!stdout.contains("(CPU, Gloo-style"), "{stdout}");
        }
    }
}
