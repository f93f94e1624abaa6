//! The course's torchrun commands, run as the docs write them: the real torchrun (torch 2.15,
//! from the environment `scripts/torch-env.sh install` makes) starting our programs, with
//! `--no-python target/release/<program>` where the course has its script, after the one build
//! command (`cargo build --release`). Under torchrun every rank joins the store that torchrun's
//! agent serves (`TORCHELASTIC_USE_AGENT_STORE=True`) as a client.
//!
//! Each command is written once here, and [`the_docs_show_exactly_the_commands_run_here`] holds
//! the docs to them: every `torchrun …` line of a `bash` block in README.md, slurm/README.md and
//! the book is one of [`cases`]' commands, and each of those is in the docs. What the programs
//! print is read back: the backend line (what runs here: NCCL where there is a GPU per rank of a
//! one-node job, else the CPU, GPUs hidden), every rank's own line, the grids cell by cell,
//! comm-bench's table.
//!
//! The commands use the book's fixed ports (12345, 29400, 29500), so they run one at a time
//! ([`PORTS`]); each within [`LIMIT`], after which it is killed with every worker it started.
//! None may leave a process behind. Without torch the tests say they skipped, unless
//! NCCL_WORKSHOP_REQUIRE_TORCH=1 (as `.ci/run` sets), where that is a failure.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use test_support::backend::{self, Backend, Kind};
use test_support::build::{the_one_build, workspace_root};
use test_support::grid::{expect_cells, Grid, Rows};
use test_support::process::{self, Finished, Plainly, Tag};
use test_support::torch;

/// How long one command (or the nodes of one job) may run.
const LIMIT: Duration = Duration::from_secs(120);

/// Held while a command runs: the book's commands use fixed ports.
static PORTS: Mutex<()> = Mutex::new(());

/// Seed 001's command, its script replaced by example 01 (README.md).
const STATIC_BROADCAST: &str = "torchrun --nproc_per_node=4 --nnodes=1 --rdzv_backend=static --master_addr=localhost --master_port=12345 --no-python target/release/01-broadcast";
/// Seed 001's command with example 00 (the 00 chapter).
const STATIC_HELLO: &str = "torchrun --nproc_per_node=4 --nnodes=1 --rdzv_backend=static --master_addr=localhost --master_port=12345 --no-python target/release/00-hello-world";
const STANDALONE_HELLO: &str =
    "torchrun --standalone --nproc_per_node=4 --no-python target/release/00-hello-world";
const C10D_HELLO: &str = "torchrun --nnodes=1 --nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=localhost:29400 --no-python target/release/00-hello-world";
/// Seed 003's two nodes (c10d), each a torchrun of its own, here both on 127.0.0.1.
const C10D_NODES: [&str; 2] = [
    "torchrun --nnodes=2 --nproc_per_node=2 --node_rank=0 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29500 --no-python target/release/02-allreduce",
    "torchrun --nnodes=2 --nproc_per_node=2 --node_rank=1 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29500 --no-python target/release/02-allreduce",
];
/// The same two nodes with seed 001's static rendezvous, where --node_rank decides the ranks.
const STATIC_NODES: [&str; 2] = [
    "torchrun --nnodes=2 --node_rank=0 --nproc_per_node=2 --rdzv_backend=static --master_addr=127.0.0.1 --master_port=29500 --no-python target/release/02-allreduce",
    "torchrun --nnodes=2 --node_rank=1 --nproc_per_node=2 --rdzv_backend=static --master_addr=127.0.0.1 --master_port=29500 --no-python target/release/02-allreduce",
];
/// Seed 003's command verbatim, its script replaced by example 06 (the training chapter).
const C10D_TRAIN: [&str; 2] = [
    "torchrun --nnodes=2 --nproc_per_node=2 --node_rank=0 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29500 --no-python target/release/06-ddp-training",
    "torchrun --nnodes=2 --nproc_per_node=2 --node_rank=1 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29500 --no-python target/release/06-ddp-training",
];
/// Example 06's PyTorch twin: torch's DDP on Gloo, on what [`TWIN_DUMP`] wrote.
const TWIN: &str = "torchrun --standalone --nproc_per_node=2 python/ddp_twin.py target/ddp-twin";
/// The Rust run whose weights, batches and losses the twin reads (a setup line of its block).
const TWIN_DUMP: &str = "target/release/06-ddp-training -n 2 --iters 30 --dump target/ddp-twin";
/// Example 07's PyTorch twin: init_device_mesh and a hand-written column/row-parallel MLP, DDP
/// over each data-parallel group, on Gloo, on what [`TP_TWIN_DUMP`] wrote.
const TP_TWIN: &str = "torchrun --standalone --nproc_per_node=4 python/tp_twin.py target/tp-twin";
/// The Rust run the tensor-parallel twin reads (a setup line of its block).
const TP_TWIN_DUMP: &str =
    "target/release/07-tensor-parallel -n 4 --tp 2 --iters 30 --dump target/tp-twin";
const RESTARTS: &str = "torchrun --standalone --nproc_per_node=4 --max-restarts 2 --no-python scripts/fail-first-attempt.sh target/release/01-broadcast";
const BENCH: &str = "torchrun --standalone --nproc_per_node=2 --no-python target/release/comm-bench -b 1K -e 64K -n 5 -w 1";

/// One job: the torchrun of each node, started together.
struct Case {
    nodes: Vec<&'static str>,
    per_node: usize,
}

fn cases() -> Vec<Case> {
    let one = |command, per_node| Case {
        nodes: vec![command],
        per_node,
    };
    vec![
        one(STATIC_BROADCAST, 4),
        one(STATIC_HELLO, 4),
        one(STANDALONE_HELLO, 4),
        one(C10D_HELLO, 4),
        Case {
            nodes: C10D_NODES.to_vec(),
            per_node: 2,
        },
        Case {
            nodes: STATIC_NODES.to_vec(),
            per_node: 2,
        },
        one(RESTARTS, 4),
        one(BENCH, 2),
        Case {
            nodes: C10D_TRAIN.to_vec(),
            per_node: 2,
        },
        one(TWIN, 2),
        one(TP_TWIN, 4),
    ]
}

/// What a job printed, node by node, and what runs its collectives here.
struct Ran {
    nodes: Vec<Finished>,
    backend: Backend,
    per_node: usize,
}

impl Ran {
    /// Every node's stdout, node 0 first (a blank line between: a grid never spans two).
    fn stdout(&self) -> String {
        let outs: Vec<&str> = self.nodes.iter().map(|n| n.stdout.as_str()).collect();
        outs.join("\n\n")
    }

    fn world_size(&self) -> usize {
        self.nodes.len() * self.per_node
    }

    /// The device rank `rank` names: `cpu:RANK`, or `cuda:LOCAL_RANK` on NCCL.
    fn device(&self, rank: usize) -> String {
        match self.backend.kind {
            Kind::Cpu => format!("cpu:{rank}"),
            Kind::Nccl => format!("cuda:{}", rank % self.per_node),
        }
    }

    /// Rank 0's backend line says what was expected to run here.
    fn backend_line(&self) {
        let stdout = self.stdout();
        let lines: Vec<Backend> = stdout.lines().filter_map(Backend::parse).collect();
        assert!(!lines.is_empty(), "no backend line in:\n{stdout}");
        assert!(
            lines.iter().all(|b| *b == self.backend),
            "expected {:?}, got {lines:?}",
            self.backend.line()
        );
    }

    /// `Rank R using device: D` once per rank of the job.
    fn device_lines(&self) {
        let stdout = self.stdout();
        for rank in 0..self.world_size() {
            let line = format!("Rank {rank} using device: {}", self.device(rank));
            let count = stdout.lines().filter(|l| *l == line).count();
            assert_eq!(count, 1, "{line:?} once in:\n{stdout}");
        }
    }

    /// The grid under `title` that rank 0 printed (other ranks' lines may land between its rows:
    /// the workers of a node share torchrun's stdout).
    fn grid(&self, title: &str) -> Rows {
        Grid::titled(title).amid_other_output().read(&self.stdout())
    }
}

/// What `--backend auto` picks here for a job of `nodes` × `per_node` ranks, and the variables
/// that make it so: NCCL where this one machine has a GPU per rank of a one-node job; elsewhere
/// the GPUs are hidden (`CUDA_VISIBLE_DEVICES=`), since ranks of two "nodes" on one machine, or
/// more ranks than GPUs, would share one.
fn backend_here(
    bin: &Path,
    nodes: usize,
    per_node: usize,
) -> (Vec<(&'static str, &'static str)>, Backend) {
    static HERE: OnceLock<Backend> = OnceLock::new();
    let hello = bin.join("00-hello-world");
    let here = HERE.get_or_init(|| backend::on_this_machine(&hello, &[]));
    match here.kind {
        Kind::Nccl if nodes == 1 && here.gpus() >= per_node => (vec![], here.clone()),
        Kind::Nccl => {
            let hidden = vec![("CUDA_VISIBLE_DEVICES", "")];
            let backend = backend::on_this_machine(&hello, &hidden);
            assert_eq!(
                backend.kind,
                Kind::Cpu,
                "CUDA_VISIBLE_DEVICES= hides no GPU"
            );
            (hidden, backend)
        }
        Kind::Cpu => (vec![], here.clone()),
    }
}

/// Runs `case` (skipping where there is no torch): each node's torchrun as written, all at once,
/// each within [`LIMIT`]; every one must succeed and leave no process behind.
fn run(commands: &[&str]) -> Option<Ran> {
    let case = cases()
        .into_iter()
        .find(|c| c.nodes == commands)
        .unwrap_or_else(|| panic!("{commands:?} is not one of cases()"));
    let torch = torch::or_skip(&format!("torchrun: {}", commands[0]))?;
    let _ports = PORTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let bin = the_one_build();
    let (envs, backend) = backend_here(&bin, case.nodes.len(), case.per_node);
    let tag = Tag::new("torchrun");
    let running: Vec<process::Running> = case
        .nodes
        .iter()
        .map(|line| {
            let mut command = torch.as_written(line, &bin);
            command.plainly().envs(envs.iter().copied());
            tag.mark(&mut command);
            process::start(&mut command)
        })
        .collect();
    // A node that fails or hangs is killed with its workers (they live in sessions of their own:
    // the tag finds them) before the test fails.
    let nodes: Vec<Finished> = running.into_iter().map(|r| r.finish(LIMIT)).collect();
    for (line, node) in case.nodes.iter().zip(&nodes) {
        node.assert_success(line);
    }
    tag.assert_all_gone(commands[0]);
    Some(Ran {
        nodes,
        backend,
        per_node: case.per_node,
    })
}

fn hellos(ran: &Ran) {
    ran.backend_line();
    let stdout = ran.stdout();
    let n = ran.world_size();
    let kind = match ran.backend.kind {
        Kind::Cpu => "cpu",
        Kind::Nccl => "nccl",
    };
    for rank in 0..n {
        let hello = format!(
            "Hello from rank {rank} of {n} (local rank {}) on {} with the {kind} backend",
            rank % ran.per_node,
            ran.device(rank)
        );
        let count = stdout.lines().filter(|l| *l == hello).count();
        assert_eq!(count, 1, "{hello:?} once in:\n{stdout}");
    }
}

fn broadcast(ran: &Ran) {
    ran.backend_line();
    ran.device_lines();
    let n = ran.world_size();
    expect_cells(&ran.grid("Before broadcast:"), n, 4, |rank| {
        if rank == 0 {
            "42"
        } else {
            "0"
        }
    });
    expect_cells(&ran.grid("After broadcast:"), n, 4, |_| "42");
}

fn allreduce(ran: &Ran) {
    ran.backend_line();
    ran.device_lines();
    let n = ran.world_size();
    expect_cells(&ran.grid("Before reduce:"), n, 4, |_| "1");
    let n_text = n.to_string();
    expect_cells(&ran.grid("After reduce:"), n, 4, |_| &n_text);
}

/// Node `node` of a two-node job ran ranks `first..first + per_node` (their own lines are on its
/// output).
fn ran_ranks(ran: &Ran, node: usize, first: usize) {
    for rank in first..first + ran.per_node {
        let line = format!("Rank {rank} using device: {}\n", ran.device(rank));
        assert!(
            ran.nodes[node].stdout.contains(&line),
            "node {node} did not run rank {rank}:\n{}",
            ran.nodes[node].stdout
        );
    }
}

#[test]
fn static_one_node_as_seed_001_broadcasts() {
    if let Some(ran) = run(&[STATIC_BROADCAST]) {
        broadcast(&ran);
    }
}

#[test]
fn static_one_node_as_seed_001_says_hello() {
    if let Some(ran) = run(&[STATIC_HELLO]) {
        hellos(&ran);
    }
}

#[test]
fn standalone_says_hello() {
    if let Some(ran) = run(&[STANDALONE_HELLO]) {
        hellos(&ran);
    }
}

#[test]
fn c10d_with_an_endpoint_says_hello() {
    if let Some(ran) = run(&[C10D_HELLO]) {
        hellos(&ran);
    }
}

/// Seed 003's command: with c10d the nodes get their ranks in the order they join (torchrun
/// ignores --node_rank and says so), so either node may hold rank 0 and print the grids.
#[test]
fn two_nodes_as_seed_003_reduce() {
    if let Some(ran) = run(&C10D_NODES) {
        allreduce(&ran);
        let first = |node: usize| {
            let out = &ran.nodes[node].stdout;
            (0..4)
                .find(|r| out.contains(&format!("Rank {r} using device: ")))
                .unwrap_or_else(|| panic!("node {node} ran no rank:\n{out}"))
        };
        let (a, b) = (first(0), first(1));
        assert!(
            (a, b) == (0, 2) || (a, b) == (2, 0),
            "each node runs two ranks: ranks from {a} and {b}"
        );
        ran_ranks(&ran, 0, a);
        ran_ranks(&ran, 1, b);
        // torchrun warns on the node given a --node_rank other than 0.
        let stderr = &ran.nodes[1].stderr;
        assert!(
            stderr.contains("node_rank is only used for static rdzv_backend"),
            "torchrun no longer says it ignores --node_rank with c10d (the book says so):\n{stderr}"
        );
    }
}

/// The same with static rendezvous: --node_rank decides, node 0 runs ranks 0-1 and prints the
/// grids of all four.
#[test]
fn two_nodes_static_reduce() {
    if let Some(ran) = run(&STATIC_NODES) {
        allreduce(&ran);
        ran_ranks(&ran, 0, 0);
        ran_ranks(&ran, 1, 2);
        assert!(
            ran.nodes[0].stdout.contains("After reduce:")
                && !ran.nodes[1].stdout.contains("After reduce:"),
            "node 0 prints the grids"
        );
    }
}

/// `--max-restarts 2` with a worker that fails on the group's first attempt: torchrun stops the
/// other ranks and starts the whole group again; the restarted ranks meet under fresh keys of its
/// store and finish. Rank 0's grids appear once: the first attempt never got that far.
#[test]
fn a_group_restarted_after_a_failure_meets_again_and_finishes() {
    if let Some(ran) = run(&[RESTARTS]) {
        broadcast(&ran);
        let node = &ran.nodes[0];
        for said in [
            "fail-first-attempt.sh: rank 1 fails on attempt 0 (TORCHELASTIC_RESTART_COUNT=0)",
            "fail-first-attempt.sh: rank 1 runs on attempt 1 (TORCHELASTIC_RESTART_COUNT=1)",
        ] {
            assert!(
                node.stderr.contains(said),
                "no {said:?} in:\n{}",
                node.stderr
            );
        }
        assert!(
            !node.stderr.contains("attempt 2"),
            "one restart was enough:\n{}",
            node.stderr
        );
        assert_eq!(node.stdout.matches("After broadcast:").count(), 1);
    }
}

/// comm-bench as one rank per worker: its header names 2 ranks and the backend, and its table
/// has every size from 1K to 64K, in and out of place, with no wrong element.
#[test]
fn comm_bench_runs_one_rank_per_worker() {
    let Some(ran) = run(&[BENCH]) else {
        return;
    };
    ran.backend_line();
    let stdout = ran.stdout();
    let kind = match ran.backend.kind {
        Kind::Cpu => "cpu",
        Kind::Nccl => "nccl",
    };
    let header = format!(": all_reduce on 2 ranks (1 node), backend {kind} ");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("# comm-bench ") && l.contains(&header)),
        "no header with {header:?} in:\n{stdout}"
    );
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|l| {
            !l.starts_with('#') && !l.starts_with("backend:") && !l.starts_with("transport:")
        })
        .map(|l| l.split_whitespace().collect::<Vec<&str>>())
        .filter(|w| !w.is_empty())
        .collect();
    let sizes: Vec<&str> = rows.iter().map(|w| w[0]).collect();
    assert_eq!(sizes, ["1024", "4096", "16384", "65536"], "{stdout}");
    for row in &rows {
        assert_eq!(
            row.len(),
            13,
            "size count type redop root, then 2 x time algbw busbw #wrong: {row:?}"
        );
        assert_eq!((row[8], row[12]), ("0", "0"), "#wrong: {row:?}");
    }
    assert!(stdout.contains("# Wrong elements       : 0 OK"), "{stdout}");
}

/// Seed 003's command starting example 06: four ranks over two "nodes" train together; one of
/// them prints the losses (falling), and every rank the same weights.
#[test]
fn two_nodes_as_seed_003_train() {
    let Some(ran) = run(&C10D_TRAIN) else {
        return;
    };
    ran.backend_line();
    let stdout = ran.stdout();
    assert!(
        stdout.contains("data: 16256 samples of the course's text; 4 ranks x batch 32"),
        "{stdout}"
    );
    let losses: Vec<f64> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("step ")?.split_once("loss ")?.1.parse().ok())
        .collect();
    assert!(
        losses.len() > 5 && losses[losses.len() - 1] < losses[0] - 1.0,
        "{losses:?}"
    );
    let sums: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_once(": weights ")?.1.split(',').next())
        .collect();
    assert_eq!(sums.len(), 4, "a line per rank:\n{stdout}");
    assert!(sums.iter().all(|s| *s == sums[0]), "{sums:?}");
}

/// The PyTorch twin (torch's DDP on Gloo under the real torchrun) trains from the Rust run's
/// weights on its batches and gets the same loss curve, within the tolerance it states.
#[test]
fn the_pytorch_twin_follows_the_same_loss_curve() {
    if torch::or_skip("the PyTorch twin of example 06").is_none() {
        return;
    }
    let bin = the_one_build();
    let dump = process::start(
        std::process::Command::new(bin.join("06-ddp-training"))
            .args(TWIN_DUMP.split_whitespace().skip(1))
            .current_dir(workspace_root())
            .plainly(),
    )
    .finish(LIMIT);
    dump.assert_success(TWIN_DUMP);
    let Some(ran) = run(&[TWIN]) else {
        return;
    };
    let stdout = ran.stdout();
    assert!(
        stdout.contains("twin: 30 steps on 2 ranks") && stdout.contains(": same curve"),
        "{stdout}"
    );
}

/// The tensor-parallel twin (init_device_mesh, Megatron's f and g by hand, DDP over dp, on Gloo
/// under the real torchrun) trains from the Rust run's shards on its batches and gets the same
/// loss curve and final shards, within the tolerance it states.
#[test]
fn the_tensor_parallel_twin_follows_the_same_loss_curve() {
    if torch::or_skip("the PyTorch twin of example 07").is_none() {
        return;
    }
    let bin = the_one_build();
    let dump = process::start(
        std::process::Command::new(bin.join("07-tensor-parallel"))
            .args(TP_TWIN_DUMP.split_whitespace().skip(1))
            .current_dir(workspace_root())
            .plainly(),
    )
    .finish(LIMIT);
    dump.assert_success(TP_TWIN_DUMP);
    let Some(ran) = run(&[TP_TWIN]) else {
        return;
    };
    let stdout = ran.stdout();
    assert!(
        stdout.contains("twin: 30 steps on dp 2 x tp 2") && stdout.contains(": same curve"),
        "{stdout}"
    );
}

/// Every line of a bash block that runs torchrun (`torchrun …`, or after variables or `srun`) in
/// README.md, slurm/README.md and the book's chapters, and the other lines of such blocks, by
/// file: continuation lines joined, comments dropped, spaces collapsed. A chapter's exercise is
/// left out: tests/exercises.rs runs its commands.
fn torchrun_lines_in_docs() -> Vec<(String, String)> {
    let root = workspace_root();
    let mut files: Vec<PathBuf> = vec![root.join("README.md"), root.join("slurm/README.md")];
    files.extend(test_support::book::markdown_files());
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.strip_prefix(&root).unwrap().display().to_string();
        let mut in_bash = false;
        let mut in_exercise = false;
        let mut block = String::new();
        for line in text.lines() {
            let trimmed = line.trim_start();
            if !in_bash && line.starts_with("## ") {
                in_exercise = line == "## Exercise";
            }
            if let Some(info) = trimmed.strip_prefix("```") {
                if in_bash {
                    let lines = commands(&block);
                    let runs_torchrun = |c: &String| c.split_whitespace().any(|w| w == "torchrun");
                    if !in_exercise && lines.iter().any(runs_torchrun) {
                        for command in lines {
                            if runs_torchrun(&command) || SETUP.contains(&command.as_str()) {
                                found.push((name.clone(), command));
                            } else {
                                found.push((
                                    name.clone(),
                                    format!("(not a setup line these tests do) {command}"),
                                ));
                            }
                        }
                    }
                    block.clear();
                }
                in_bash = !in_bash && matches!(info.trim(), "bash" | "sh" | "console");
                continue;
            }
            if in_bash {
                block.push_str(trimmed);
                block.push('\n');
            }
        }
    }
    found
}

/// The commands of a bash block: continuation lines joined, comments dropped, spaces collapsed.
fn commands(block: &str) -> Vec<String> {
    block
        .replace("\\\n", " ")
        .lines()
        .map(|l| {
            let l = if l.starts_with('#') { "" } else { l };
            let l = l.split(" #").next().unwrap_or_default();
            l.split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .filter(|l| !l.is_empty())
        .collect()
}

/// The lines beside torchrun commands in the docs' blocks, each done by these tests: the one
/// build command ([`the_one_build`]), torch's install (where torch is found, it is a no-op; CI
/// runs it), and the environment's activation (torchrun run from its `bin`).
const SETUP: [&str; 5] = [
    "cargo build --release",
    "bash scripts/torch-env.sh install",
    "source \"$(scripts/torch-env.sh dir)/bin/activate\"",
    TWIN_DUMP,
    TP_TWIN_DUMP,
];

/// The docs show the commands these tests run, and only those, as torchrun commands: a command
/// added to the docs needs a case here, and a command changed here must change in the docs.
/// Other lines of their blocks are setup these tests do ([`SETUP`]).
#[test]
fn the_docs_show_exactly_the_commands_run_here() {
    // torchrun on a node of the cluster in a box is run by tests/cluster.rs, as its chapter shows.
    let on_the_box = |c: &str| c.contains("scripts/cluster.sh exec node");
    // The course's Python twins (python/00_… to 05_…) are run by tests/python_twins.rs, the
    // labs' (python/labs/) by crates/labs/tests/python.rs.
    let a_twin = |c: &str| {
        c.split_whitespace()
            .any(|w| w.starts_with("python/0") || w.starts_with("python/labs/"))
    };
    let shown: Vec<(String, String)> = torchrun_lines_in_docs()
        .into_iter()
        .filter(|(_, c)| !SETUP.contains(&c.as_str()) && !on_the_box(c) && !a_twin(c))
        .collect();
    let tested: Vec<&str> = cases()
        .iter()
        .flat_map(|c| c.nodes.iter().copied())
        .collect();
    let untested: Vec<String> = shown
        .iter()
        .filter(|(_, c)| !tested.contains(&c.as_str()))
        .map(|(file, c)| format!("{file}: {c}"))
        .collect();
    assert!(
        untested.is_empty(),
        "torchrun commands the docs show that tests/torchrun.rs does not run (add a case), or other lines in their blocks:\n{}",
        untested.join("\n")
    );
    let missing: Vec<&str> = tested
        .iter()
        .copied()
        .filter(|t| !shown.iter().any(|(_, c)| c == t))
        .collect();
    assert!(
        missing.is_empty(),
        "commands tests/torchrun.rs runs that no doc shows (as a bash line):\n{}",
        missing.join("\n")
    );
    // Seed 001's command is shown as the course writes it, with our program for its script.
    let seed = "torchrun --nproc_per_node=4 --nnodes=1 --rdzv_backend=static --master_addr=localhost --master_port=12345 --no-python target/release/";
    for file in ["README.md", "docs/src/00-hello-world.md"] {
        assert!(
            shown.iter().any(|(f, c)| f == file && c.starts_with(seed)),
            "{file} does not show seed 001's command"
        );
    }
}

#[test]
fn commands_are_read_from_bash_blocks() {
    let block = "# a comment\ntorchrun --standalone \\\n    --nproc_per_node=4 --no-python x   # why\n\ncargo build --release\n";
    assert_eq!(
        commands(block),
        [
            "torchrun --standalone --nproc_per_node=4 --no-python x",
            "cargo build --release"
        ]
    );
}
