//! The sbatch scripts of `slurm/`, submitted to a real Slurm: Debian's slurmctld and two slurmd
//! (node1, node2) started on this machine by `scripts/local-slurm.sh`, every job's output read
//! back (hello lines, grids cell by cell, one profile per rank).
//!
//! The local cluster is shaped like Leonardo's Booster as far as scheduling goes: partition
//! `boost_usr_prod` (24 h), 32 CPUs, about 494 GB and 4 `gpu` GRES per node (stand-in devices:
//! there is no GPU behind them), QOS `normal` and `boost_qos_dbg` (2 nodes, 30 minutes) and no
//! other, reservations that must exist, a `module` that knows `cuda` and `nccl` only, and one
//! account (another is refused). So the scripts run as a user submits them; the only things set
//! from outside are the backend (`BACKEND=cpu`), where the build is (`BIN_DIR`), where torch is
//! (`TORCH_VENV`: the environment `scripts/torch-env.sh install` makes), the output file and, to
//! test other shapes, `--nodes`/`--ntasks-per-node`. slurm/README.md's interactive
//! recipe (salloc, then srun) runs here too, as written there.
//!
//! Without Slurm installed (or without root, which the daemons need) the test says it skipped,
//! unless NCCL_WORKSHOP_REQUIRE_SLURM=1 (as `.ci/run` sets), where that is a failure; without
//! torch the torchrun jobs are skipped the same way (NCCL_WORKSHOP_REQUIRE_TORCH=1).
//! To add a script, add a [`Job`] to [`jobs`].

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use test_support::backend::{self, Backend, Kind};
use test_support::build::{the_one_build, THE_BUILD as BUILD};
use test_support::grid::{expect_cells, Grid, Rows};
use test_support::process::Plainly;
use test_support::torch;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// One submission: a script of `slurm/`, what to set, and how to check what it printed.
struct Job {
    /// Shown in messages; also names the output file.
    name: &'static str,
    script: &'static str,
    /// Files under BIN_DIR the job runs, built (or brought up to date) before the cluster starts.
    needs: &'static [&'static str],
    /// sbatch options given on the command line (they override the script's #SBATCH lines).
    options: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    /// Arguments after the script, passed on to the program.
    args: &'static [&'static str],
    check: fn(&Checked),
    /// The job must end FAILED (and `check` reads what it said).
    must_fail: bool,
}

/// What a finished job left behind.
struct Checked {
    output: String,
    /// A scratch folder of this job (reports, CSVs).
    dir: PathBuf,
    /// What `--backend auto` picks on this machine, outside Slurm.
    machine: Backend,
}

/// Every script of slurm/, as a job to submit and check (some more than once).
const JOBS: &[Job] = &[
    Job {
        name: "00-hello-world",
        script: "slurm/00-hello-world.sbatch",
        must_fail: false,
        needs: &["00-hello-world"],
        options: &[],
        env: &[],
        args: &[],
        check: |c| hellos(&c.output, 1, 4, ""),
    },
    Job {
        name: "00-hello-world-commrun",
        script: "slurm/00-hello-world.sbatch",
        must_fail: false,
        needs: &["00-hello-world", "commrun"],
        options: &[],
        env: &[("LAUNCH", "commrun")],
        args: &[],
        check: |c| hellos(&c.output, 1, 4, "[r]: "),
    },
    Job {
        name: "01-broadcast",
        script: "slurm/01-broadcast.sbatch",
        must_fail: false,
        needs: &["01-broadcast"],
        options: &[],
        env: &[],
        args: &["--len", "5"],
        check: |c| {
            let before = grid(&c.output, "Before broadcast:", "");
            expect_cells(&before, 4, 5, |r| if r == 0 { "42" } else { "0" });
            let after = grid(&c.output, "After broadcast:", "");
            expect_cells(&after, 4, 5, |_| "42");
        },
    },
    Job {
        name: "02-allreduce",
        script: "slurm/02-allreduce.sbatch",
        must_fail: false,
        needs: &["02-allreduce"],
        options: &[],
        env: &[],
        args: &["--len", "6"],
        check: |c| allreduced(&c.output, 4, 6, ""),
    },
    Job {
        name: "04-allgather",
        script: "slurm/08-allgather.sbatch",
        must_fail: false,
        needs: &["04-allgather"],
        options: &[],
        env: &[],
        args: &["--len", "2"],
        check: |c| {
            let after = grid(&c.output, "After all-gather:", "");
            let gathered = ["1", "1", "2", "2", "3", "3", "4", "4"];
            assert!(after.iter().all(|row| row == &gathered), "{after:?}");
        },
    },
    Job {
        name: "05-reduce-scatter",
        script: "slurm/09-reduce-scatter.sbatch",
        must_fail: false,
        needs: &["05-reduce-scatter"],
        options: &[],
        env: &[],
        args: &["--len", "1"],
        check: |c| {
            let after = grid(&c.output, "After reduce-scatter (block r on rank r):", "");
            expect_cells(&after, 4, 1, |r| (4 * (r + 1)).to_string());
        },
    },
    // Multi-node, srun starting every rank: 2 nodes x 2 tasks.
    Job {
        name: "02-allreduce-2x2-srun",
        script: "slurm/02-allreduce.sbatch",
        must_fail: false,
        needs: &["02-allreduce"],
        options: &["--nodes=2", "--ntasks-per-node=2", "--gres=gpu:2"],
        env: &[],
        args: &["--len", "3"],
        check: |c| {
            assert!(c
                .output
                .contains("on 2 node(s) (node[1-2]), 2 ranks per node"));
            for rank in 0..4 {
                assert!(c
                    .output
                    .contains(&format!("Rank {rank} using device: cpu:{rank}\n")));
            }
            allreduced(&c.output, 4, 3, "");
        },
    },
    // Multi-node, torchrun's way: one commrun per node, each starting 2 workers.
    Job {
        name: "02-allreduce-2x2-commrun",
        script: "slurm/02-allreduce.sbatch",
        must_fail: false,
        needs: &["02-allreduce", "commrun"],
        options: &["--nodes=2", "--ntasks-per-node=2", "--gres=gpu:2"],
        env: &[("LAUNCH", "commrun")],
        args: &["--len", "3"],
        check: |c| {
            for node in 0..2 {
                let line = format!("commrun: node {node} of 2 on ");
                assert!(c.output.contains(&line), "{line:?}");
            }
            assert!(c.output.contains(&format!(
                "ranks 2-3 of 4, rendezvous at node1:{}",
                20000 + c.job_id() % 20000
            )));
            for rank in 0..4 {
                let line = format!("[{rank}]: Rank {rank} using device: cpu:{rank}\n");
                assert!(c.output.contains(&line), "{line:?}");
            }
            allreduced(&c.output, 4, 3, "[0]: ");
        },
    },
    // Seed 003's training on two nodes of 4, one rank per task: the loss falls and all 8
    // ranks end with the same weights.
    Job {
        name: "06-ddp-training",
        script: "slurm/10-ddp-training.sbatch",
        must_fail: false,
        needs: &["06-ddp-training"],
        options: &[],
        env: &[],
        args: &["--iters", "30", "--log-every", "10"],
        check: |c| {
            let out = &c.output;
            assert!(
                out.contains("on 2 node(s) (node[1-2]), 4 ranks per node"),
                "{out}"
            );
            assert!(out.contains("8 ranks x batch 32 = 256 a step"), "{out}");
            assert!(out.contains("step   29  loss "), "{out}");
            let sums: Vec<&str> = out
                .lines()
                .filter_map(|l| l.split_once(": weights ")?.1.split(',').next())
                .collect();
            assert_eq!(sums.len(), 8, "{out}");
            assert!(sums.iter().all(|s| *s == sums[0]), "{sums:?}");
        },
    },
    // Example 07 on 2 nodes x 4 ranks: tensor parallel inside each node, data parallel across;
    // the shards' checksums equal across the nodes, each group's traffic printed.
    Job {
        name: "07-tensor-parallel",
        script: "slurm/11-tensor-parallel.sbatch",
        must_fail: false,
        needs: &["07-tensor-parallel"],
        options: &[],
        env: &[],
        args: &["--iters", "20", "--log-every", "10"],
        check: |c| {
            let out = &c.output;
            assert!(
                out.contains("on 2 node(s) (node[1-2]), 4 ranks per node"),
                "{out}"
            );
            assert!(out.contains("mesh: dp 2 x tp 4 (dp,tp)"), "{out}");
            assert!(out.contains("step   19  loss "), "{out}");
            let mut sums: Vec<(usize, String)> = out
                .lines()
                .filter_map(|l| {
                    let (_, rest) = l.split_once(", tp rank ")?;
                    let (j, rest) = rest.split_once("): weights ")?;
                    Some((j.parse().ok()?, rest.split(',').next()?.to_string()))
                })
                .collect();
            sums.sort();
            assert_eq!(sums.len(), 8, "{out}");
            // Shard j is on rank j of each node: the same weights on both.
            assert!(sums.chunks(2).all(|p| p[0].1 == p[1].1), "{sums:?}");
        },
    },
    Job {
        name: "03-multinode-2x1",
        script: "slurm/03-multinode-2x1.sbatch",
        must_fail: false,
        needs: &["03-multinode-gloo-vs-nccl"],
        options: &[],
        env: &[],
        args: &["--size-mb", "2", "--iters", "3", "--warmup", "1"],
        check: |c| {
            assert!(c
                .output
                .contains("on 2 node(s) (node[1-2]), 1 ranks per node"));
            cpu_line(&c.output, "2 MB");
            nccl_skipped(c);
        },
    },
    Job {
        name: "03-multinode-2x4",
        script: "slurm/03-multinode-2x4.sbatch",
        must_fail: false,
        needs: &["03-multinode-gloo-vs-nccl"],
        options: &[],
        env: &[],
        args: &["--size-mb", "2", "--iters", "3", "--warmup", "1"],
        check: |c| {
            assert!(c
                .output
                .contains("on 2 node(s) (node[1-2]), 4 ranks per node"));
            cpu_line(&c.output, "2 MB");
            nccl_skipped(c);
        },
    },
    Job {
        name: "04-bench-sweep",
        script: "slurm/04-bench-sweep.sbatch",
        must_fail: false,
        needs: &["comm-bench"],
        options: &[],
        env: &[
            ("OPS", "all_reduce"),
            ("MAX_BYTES", "1K"),
            ("ITERS", "2"),
            ("WARMUP", "1"),
        ],
        args: &[],
        check: |c| {
            for layout in ["1x4", "2x4"] {
                let csv = c.dir.join(format!("all_reduce-{layout}.csv"));
                assert!(csv.is_file(), "no {}", csv.display());
            }
        },
    },
    // nsys itself is not here: a stand-in records its arguments, writes the report file
    // its --output names (expanding %q{VAR} as nsys does) and runs the program.
    Job {
        name: "05-nsys-profile",
        script: "slurm/05-nsys-profile.sbatch",
        must_fail: false,
        needs: &["02-allreduce"],
        options: &[],
        env: &[("NSYS", "@fake-nsys")],
        args: &["--len", "4"],
        check: |c| {
            allreduced(&c.output, 4, 4, "");
            for rank in 0..4 {
                let report = c.dir.join(format!("02-allreduce-rank{rank}.nsys-rep"));
                assert!(report.is_file(), "no {}", report.display());
                let args = std::fs::read_to_string(&report).unwrap();
                assert!(args.starts_with("profile --trace=cuda,nvtx,osrt"), "{args}");
            }
        },
    },
    // The profiling recipe for example 03, as docs/src/profiling.md shows it (no arguments:
    // 03 takes no --len, so the script gives it none).
    Job {
        name: "05-nsys-profile-03",
        script: "slurm/05-nsys-profile.sbatch",
        must_fail: false,
        needs: &["03-multinode-gloo-vs-nccl"],
        options: &[],
        env: &[
            ("NSYS", "@fake-nsys"),
            ("EXAMPLE", "03-multinode-gloo-vs-nccl"),
        ],
        args: &[],
        check: |c| {
            cpu_line(&c.output, "100 MB");
            for rank in 0..4 {
                let report = c
                    .dir
                    .join(format!("03-multinode-gloo-vs-nccl-rank{rank}.nsys-rep"));
                assert!(report.is_file(), "no {}", report.display());
            }
        },
    },
    // ncu is not here either: a stand-in writes the report --export names and runs the program.
    Job {
        name: "06-ncu-kernel",
        script: "slurm/06-ncu-kernel.sbatch",
        must_fail: false,
        needs: &["03-multinode-gloo-vs-nccl"],
        options: &[],
        env: &[("NCU", "@fake-ncu"), ("WARMUP", "1"), ("ITERS", "2")],
        args: &["--size-mb", "1"],
        check: |c| {
            cpu_line(&c.output, "1 MB");
            let report = std::fs::read_to_string(c.dir.join("rank0.ncu-rep")).unwrap();
            assert!(report.contains("--kernel-name regex:ncclDevKernel_AllReduce_Sum_f32 --launch-skip 1 --launch-count 1 --metrics gpu__time_duration.sum,"), "{report}");
            assert!(
                report.contains(" --warmup 1 --iters 2 --size-mb 1"),
                "{report}"
            );
            assert!(
                !c.dir.join("rank1.ncu-rep").exists(),
                "only rank 0 runs under ncu"
            );
        },
    },
    // 00 -> 03 in one submission: 00-02 on one node, then 03 on both.
    Job {
        name: "00-03-course",
        script: "slurm/00-03-course.sbatch",
        must_fail: false,
        needs: &[
            "00-hello-world",
            "01-broadcast",
            "02-allreduce",
            "03-multinode-gloo-vs-nccl",
        ],
        options: &["--ntasks-per-node=2", "--gres=gpu:2"],
        env: &[],
        args: &["--size-mb", "1", "--iters", "2", "--warmup", "1"],
        check: |c| {
            let order = [
                "== 00-hello-world: 1 node x 2 ranks",
                "== 01-broadcast: 1 node x 2 ranks",
                "== 02-allreduce: 1 node x 2 ranks",
                "== 03-multinode-gloo-vs-nccl: 2 node(s) x 2 ranks",
                "== done: 00 -> 03",
            ];
            let at: Vec<usize> = order
                .iter()
                .map(|l| c.output.find(l).unwrap_or_else(|| panic!("no {l:?}")))
                .collect();
            assert!(at.windows(2).all(|w| w[0] < w[1]), "not in order 00 -> 03");
            hellos(&c.output, 1, 2, "");
            allreduced(&c.output, 2, 4, "");
            cpu_line(&c.output, "1 MB");
        },
    },
    // One torchrun per node under srun (torch from the local environment that
    // scripts/torch-env.sh makes), each starting 4 workers; c10d rendezvous on the first node.
    Job {
        name: "07-torchrun",
        script: "slurm/07-torchrun.sbatch",
        must_fail: false,
        needs: &["02-allreduce"],
        options: &[],
        env: &[("TORCH_VENV", "@torch-venv")],
        args: &["--len", "3"],
        check: |c| {
            let port = 20000 + c.job_id() % 20000;
            let line = format!("on 2 node(s) (node[1-2]), 4 ranks per node, started by torchrun (c10d rendezvous at node1:{port})");
            assert!(c.output.contains(&line), "{line:?}");
            ranks_once(&c.output, 8);
            allreduced(&c.output, 8, 3, "");
        },
    },
    // The same with static rendezvous: each node's --node_rank from its own SLURM_NODEID.
    Job {
        name: "07-torchrun-static",
        script: "slurm/07-torchrun.sbatch",
        must_fail: false,
        needs: &["02-allreduce"],
        options: &[],
        env: &[("TORCH_VENV", "@torch-venv"), ("RDZV", "static")],
        args: &["--len", "3"],
        check: |c| {
            assert!(c
                .output
                .contains("started by torchrun (static rendezvous at node1:"));
            ranks_once(&c.output, 8);
            allreduced(&c.output, 8, 3, "");
        },
    },
    // A course's reservation, given the way the scripts document it (sbatch's own variables).
    Job {
        name: "00-hello-world-reservation",
        script: "slurm/00-hello-world.sbatch",
        must_fail: false,
        needs: &["00-hello-world"],
        options: &[],
        env: &[
            ("SBATCH_RESERVATION", RESERVATION),
            ("SBATCH_QOS", "normal"),
        ],
        args: &[],
        check: |c| hellos(&c.output, 1, 4, ""),
    },
    // A module the site does not have: the job stops with what module said and what to do.
    Job {
        name: "00-hello-world-bad-module",
        script: "slurm/00-hello-world.sbatch",
        must_fail: true,
        needs: &[],
        options: &[],
        env: &[("MODULES", "cuda nccl/0.0-not-here")],
        args: &[],
        check: |c| {
            assert!(c
                .output
                .contains("The following module(s) are unknown: \"nccl/0.0-not-here\""));
            assert!(c
                .output
                .contains("error: `module load cuda nccl/0.0-not-here` failed"));
            assert!(!c.output.contains("Hello from rank"));
        },
    },
];

/// The reservation the local cluster has while the job that names it runs.
const RESERVATION: &str = "nccl-course";

/// The account the jobs are charged to (`SBATCH_ACCOUNT`, as slurm/README.md has users set it).
const ACCOUNT: &str = "nccl-workshop-tests";

/// Submissions Leonardo refuses, refused here too: (sbatch options, environment, what sbatch says).
/// sbatch options, environment, and what sbatch says when it refuses.
type Refusal = (
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    &'static str,
);

const REFUSED: &[Refusal] = &[
    // the debug QOS: at most 30 minutes ...
    (&["--time=00:45:00"], &[], "QOSMaxWallDurationPerJobLimit"),
    // a QOS Leonardo does not have
    (&["--qos=no_such_qos"], &[], "Invalid qos specification"),
    // the partition: at most 24 hours
    (
        &["--qos=normal", "--time=25:00:00"],
        &[],
        "Requested time limit is invalid",
    ),
    // more memory than a node has
    (
        &["--mem=600G"],
        &[],
        "Memory specification can not be satisfied",
    ),
    // a reservation that does not exist
    (
        &[],
        &[("SBATCH_RESERVATION", "no-such-reservation")],
        "reservation",
    ),
    // a project the user is not in
    (
        &[],
        &[("SBATCH_ACCOUNT", "no_such_project")],
        "Invalid account",
    ),
];

impl Checked {
    fn job_id(&self) -> u64 {
        let line = self.output.lines().next().unwrap_or_default();
        line.strip_prefix("job ")
            .and_then(|l| l.split(':').next())
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("no job id in the first line: {line:?}"))
    }
}

/// `Hello from rank r of n …` once per rank (with `[r]: ` before it under commrun).
fn hellos(output: &str, nodes: usize, per_node: usize, prefix: &str) {
    let n = nodes * per_node;
    for rank in 0..n {
        let prefix = prefix.replace('r', &rank.to_string());
        let hello = format!(
            "{prefix}Hello from rank {rank} of {n} (local rank {}) on cpu:{rank} with the cpu backend",
            rank % per_node
        );
        assert_eq!(
            output.lines().filter(|l| *l == hello).count(),
            1,
            "{hello:?} once"
        );
    }
    assert!(output.contains("backend: cpu (requested)"));
}

/// `Rank R using device: cpu:R` once for each of the `n` ranks.
fn ranks_once(output: &str, n: usize) {
    for rank in 0..n {
        let line = format!("Rank {rank} using device: cpu:{rank}");
        assert_eq!(
            output.lines().filter(|l| *l == line).count(),
            1,
            "{line:?} once"
        );
    }
}

/// Example 03's NCCL part is skipped under this Slurm, whose nodes share one machine: where
/// there is no GPU, for the reason `--backend auto` gives; where there are GPUs, because ranks
/// of different nodes (or more ranks than GPUs) would share a GPU.
fn nccl_skipped(c: &Checked) {
    let skipped = match c.machine.kind {
        Kind::Cpu => format!(
            "Rank 0 (NCCL): skipped: NCCL cannot run here: {}",
            c.machine.reason
        ),
        Kind::Nccl => "Rank 0 (NCCL): skipped: ".to_string(),
    };
    assert!(c.output.contains(&skipped), "no {skipped:?} line");
}

/// Example 03's line for its CPU-mediated half, in the course's words, its label saying what ran:
/// `Rank 0 (CPU, Gloo-style over TRANSPORT): all-reduce SIZE took … ms`.
fn cpu_line(output: &str, size: &str) {
    let line = format!("): all-reduce {size} took ");
    assert!(
        output
            .lines()
            .any(|l| l.contains("Rank 0 (CPU, Gloo-style over ") && l.contains(&line)),
        "no \"Rank 0 (CPU, Gloo-style over …{line}\" line"
    );
}

fn allreduced(output: &str, n: usize, len: usize, prefix: &str) {
    let before = grid(output, "Before reduce:", prefix);
    expect_cells(&before, n, len, |_| "1");
    let after = grid(output, "After reduce:", prefix);
    let n_text = n.to_string();
    expect_cells(&after, n, len, |_| &n_text);
}

/// The grid under `title` that rank 0 printed: for each rank in order, its cells. Under srun
/// the other ranks' lines may land between rank 0's, so only grid lines are read.
fn grid(output: &str, title: &str, prefix: &str) -> Rows {
    Grid::titled(title)
        .prefix(prefix)
        .amid_other_output()
        .read(output)
}

/// Says something the test runner does not capture (a skip must be seen).
fn say(message: &str) {
    let _ = writeln!(std::io::stderr(), "{message}");
}

fn slurm_missing() -> Option<String> {
    let found = Command::new("sh")
        .args(["-c", "command -v slurmctld || test -x /usr/sbin/slurmctld"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        return Some("Slurm not installed (run scripts/local-slurm.sh install)".into());
    }
    // /proc/self belongs to whoever this process runs as.
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
    if uid != 0 {
        return Some("the local Slurm's daemons need root".into());
    }
    None
}

/// A running local cluster; dropping it stops everything it started, even after a panic.
struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
}

impl Cluster {
    fn start(dir: &Path) -> Cluster {
        let _ = std::fs::remove_dir_all(dir);
        let ports: Vec<String> = (0..3).map(|_| free_port().to_string()).collect();
        let cluster = Cluster {
            dir: dir.to_path_buf(),
            conf: dir.join("slurm.conf"),
        };
        let out = Command::new("bash")
            .arg(Path::new(REPO).join("scripts/local-slurm.sh"))
            .arg("start")
            .arg(dir)
            .env("LOCAL_SLURM_CTLD_PORT", &ports[0])
            .env("LOCAL_SLURM_NODE1_PORT", &ports[1])
            .env("LOCAL_SLURM_NODE2_PORT", &ports[2])
            .env("LOCAL_SLURM_CPUS", "32")
            .env("LOCAL_SLURM_GPUS", "4")
            .env("LOCAL_SLURM_PARTITION", "boost_usr_prod")
            // Leonardo's Booster: 24 h per job on the partition, the debug QOS 2 nodes for
            // 30 minutes, about 494 GB per node, modules `cuda` and `nccl`.
            .env("LOCAL_SLURM_MAXTIME", "24:00:00")
            .env("LOCAL_SLURM_MEM", "494000")
            .env("LOCAL_SLURM_QOS", "normal:64:0 boost_qos_dbg:2:30")
            .env("LOCAL_SLURM_MODULES", "cuda nccl")
            // The one project the jobs here are charged to; naming another is refused.
            .env("LOCAL_SLURM_ACCOUNTS", ACCOUNT)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the local Slurm did not start:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        cluster
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command
            .env("SLURM_CONF", &self.conf)
            // The cluster's `module` stand-in first, as env.sh puts it.
            .env(
                "PATH",
                format!(
                    "{}:{}:/usr/sbin:/sbin",
                    self.dir.join("bin").display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .stdin(Stdio::null());
        command
    }

    /// What slurmctld says about a job: its state and exit code, e.g. ("COMPLETED", "0:0").
    fn job_state(&self, id: &str) -> Option<(String, String)> {
        let out = self
            .command("scontrol")
            .args(["-o", "show", "job", id])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |name: &str| {
            text.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .map(str::to_string)
        };
        Some((field("JobState=")?, field("ExitCode=")?))
    }

    /// A reservation of both nodes for root, as a course has one for its users.
    fn reserve(&self, name: &str) {
        let out = self
            .command("scontrol")
            .args(["create", "reservation", &format!("reservationname={name}")])
            .args(["starttime=now", "duration=60", "nodes=ALL", "users=root"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scontrol create reservation: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn unreserve(&self, name: &str) {
        let _ = self
            .command("scontrol")
            .args(["delete", &format!("reservationname={name}")])
            .output();
    }

    fn logs(&self) -> String {
        let mut logs = String::new();
        for name in ["slurmctld.log", "slurmd-node1.log", "slurmd-node2.log"] {
            let text = std::fs::read_to_string(self.dir.join("log").join(name)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            logs += &format!("----- {name} (last lines)\n");
            for line in tail.into_iter().rev() {
                logs += line;
                logs.push('\n');
            }
        }
        logs
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(Path::new(REPO).join("scripts/local-slurm.sh"))
            .arg("stop")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A port outside the kernel's ephemeral range, so nothing else grabs it before the job binds it.
fn free_port() -> u16 {
    comm_core::spawn::free_port().unwrap()
}

/// slurm/README.md's interactive recipe as written there: the `salloc` line's options (its
/// continuation lines joined) and the lines then typed in salloc's shell, up to `exit`, with the
/// build's folder where the recipe says `target/release/`.
fn interactive_recipe(bin: &Path) -> (Vec<String>, Vec<String>) {
    let readme = std::fs::read_to_string(Path::new(REPO).join("slurm/README.md")).unwrap();
    let (_, section) = readme
        .split_once("## Interactive: salloc, then srun")
        .expect("slurm/README.md: no section 'Interactive: salloc, then srun'");
    let (block, _) = section
        .split_once("```bash\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("slurm/README.md: no bash block in the interactive section");
    let joined = block.replace("\\\n", " ");
    let mut lines = joined
        .lines()
        .map(|l| l.split(" #").next().unwrap_or_default().trim().to_string())
        .filter(|l| !l.is_empty());
    let salloc: Vec<String> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(
        salloc.first().map(String::as_str),
        Some("salloc"),
        "slurm/README.md: the interactive recipe starts with salloc"
    );
    let here = format!("{}/", bin.display());
    let typed = lines
        .take_while(|l| l != "exit")
        .map(|l| l.replace("target/release/", &here))
        .collect();
    (salloc[1..].to_vec(), typed)
}

/// docs/src/running-on-leonardo.md shows slurm/README.md's interactive recipe, the one run
/// above, as it is written there (no Slurm needed to check that).
#[test]
fn the_book_shows_the_interactive_recipe_run_here() {
    let read = |path: &str| std::fs::read_to_string(Path::new(REPO).join(path)).unwrap();
    let readme = read("slurm/README.md");
    let (_, section) = readme
        .split_once("## Interactive: salloc, then srun")
        .expect("slurm/README.md: no interactive section");
    let block = section
        .split_once("```bash\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("slurm/README.md: no bash block in the interactive section")
        .0;
    assert!(
        read("docs/src/running-on-leonardo.md").contains(&format!("```bash\n{block}```")),
        "docs/src/running-on-leonardo.md does not show slurm/README.md's interactive recipe:\n{block}"
    );
}

/// A stand-in for `nsys profile [OPTIONS] PROGRAM ARGS…`.
const FAKE_NSYS: &str = r#"#!/bin/bash
# Records the arguments in the report file that --output names, as nsys would name it, then runs
# the program as nsys does.
[[ $1 == profile ]] || { echo "fake nsys: only 'profile'" >&2; exit 2; }
args="$*"
shift
out=report
while [[ $# -gt 0 && $1 == -* ]]; do
    case $1 in
    --output=*) out=${1#--output=} ;;
    -o | --output) out=$2; shift ;;
    esac
    shift
done
while [[ $out =~ %q\{([A-Za-z_][A-Za-z0-9_]*)\} ]]; do
    var=${BASH_REMATCH[1]}
    out=${out/"%q{$var}"/${!var}}
done
echo "$args" >"$out.nsys-rep"
exec "$@"
"#;

/// A stand-in for `ncu [OPTIONS] PROGRAM ARGS…`: records its arguments in the report that
/// --export names, then runs the program.
const FAKE_NCU: &str = r#"#!/bin/bash
args="$*"
out=report
log=""
while [[ $# -gt 0 && $1 == -* ]]; do
    case $1 in
    --export) out=$2; shift ;;
    --log-file) log=$2; shift ;;
    --force-overwrite | --target-processes) [[ $1 == --target-processes ]] && shift ;;
    *) shift ;;
    esac
    shift
done
echo "$args" >"$out.ncu-rep"
[[ -z $log ]] || echo '==PROF== Profiling "ncclDevKernel_AllReduce_Sum_f32_RING_LL" - 0: 0%....50%....100% - 1 pass' >"$log"
exec "$@"
"#;

#[test]
fn slurm_scripts_run_on_a_real_slurm() {
    let required = std::env::var("NCCL_WORKSHOP_REQUIRE_SLURM").is_ok_and(|v| v == "1");
    if let Some(why) = slurm_missing() {
        assert!(!required, "NCCL_WORKSHOP_REQUIRE_SLURM=1 but {why}");
        say(&format!("skipped: {why}"));
        return;
    }
    let started = Instant::now();
    let jobs = JOBS;
    // Every script of slurm/ is submitted here.
    for entry in std::fs::read_dir(Path::new(REPO).join("slurm")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".sbatch") {
            let script = format!("slurm/{name}");
            assert!(
                jobs.iter().any(|j| j.script == script),
                "{script} has no Job in tests/slurm.rs"
            );
        }
    }
    let bin = the_one_build();
    for job in jobs {
        for need in job.needs {
            let path = bin.join(need);
            assert!(path.is_file(), "`{BUILD}` built no {}", path.display());
        }
    }
    // Short: munge's socket path must stay under 100 characters.
    let root = PathBuf::from(format!("/tmp/nccl-slurm-{}", std::process::id()));
    let cluster = Cluster::start(&root.join("cluster"));
    let ctx = Submission::new(root.clone(), bin);
    let mut ran = Vec::new();
    for job in jobs {
        if ctx.submit_and_check(&cluster, job) {
            ran.push(job.name);
        }
    }
    leonardos_refusals(&cluster);
    // On a machine with GPUs the recipe's ranks would share them (both nodes are this machine;
    // the scripts above run with BACKEND=cpu, the recipe sets no backend): there it is skipped.
    if matches!(ctx.machine.kind, Kind::Cpu) {
        the_interactive_recipe(&cluster, &ctx.bin);
        ran.push("interactive recipe (salloc, srun)");
    } else {
        say("skipped: slurm/README.md's interactive recipe (this machine's GPUs would be shared)");
    }
    one_gpu_per_task(&cluster);
    ran.push("refusals and GPU binding");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&root);
    say(&format!(
        "slurm: {} jobs ran and were checked in {:.0?} ({})",
        ran.len(),
        started.elapsed(),
        ran.join(", ")
    ));
}

/// What every job's submission shares: its folders, the built programs, the stand-ins for nsys
/// and ncu, torch's environment where there is one, and what this machine's backend is.
struct Submission {
    root: PathBuf,
    bin: PathBuf,
    fake_nsys: PathBuf,
    fake_ncu: PathBuf,
    torch_venv: Option<PathBuf>,
    machine: Backend,
}

impl Submission {
    fn new(root: PathBuf, bin: PathBuf) -> Submission {
        let machine = backend::on_this_machine(&bin.join("00-hello-world"), &[]);
        let fake_nsys = root.join("fake-nsys");
        std::fs::write(&fake_nsys, FAKE_NSYS).unwrap();
        let fake_ncu = root.join("fake-ncu");
        std::fs::write(&fake_ncu, FAKE_NCU).unwrap();
        for fake in [&fake_nsys, &fake_ncu] {
            let executable = std::os::unix::fs::PermissionsExt::from_mode(0o755);
            std::fs::set_permissions(fake, executable).unwrap();
        }
        // The torchrun jobs need torch (scripts/torch-env.sh install): skipped without it,
        // unless NCCL_WORKSHOP_REQUIRE_TORCH=1.
        let torch_venv = match torch::find() {
            Ok(t) => Some(t.venv),
            Err(why) => {
                assert!(!torch::required(), "{}=1 but {why}", torch::REQUIRE);
                None
            }
        };
        Submission {
            root,
            bin,
            fake_nsys,
            fake_ncu,
            torch_venv,
            machine,
        }
    }

    /// Submits `job` with sbatch, waits for it, and runs its check; false when it was skipped.
    fn submit_and_check(&self, cluster: &Cluster, job: &Job) -> bool {
        let needs_torch = job.env.iter().any(|(_, v)| *v == "@torch-venv");
        if needs_torch && self.torch_venv.is_none() {
            say(&format!(
                "skipped: job {}: no torch (bash scripts/torch-env.sh install)",
                job.name
            ));
            return false;
        }
        let dir = self.root.join(job.name);
        std::fs::create_dir_all(&dir).unwrap();
        let output_file = dir.join("job.out");
        let reserved = job
            .env
            .iter()
            .any(|(name, _)| *name == "SBATCH_RESERVATION");
        if reserved {
            cluster.reserve(RESERVATION);
        }
        let id = self.submit(cluster, job, &dir, &output_file);
        let (state, exit) = finished(cluster, job, &id);
        let output = std::fs::read_to_string(&output_file).unwrap_or_default();
        if reserved {
            cluster.unreserve(RESERVATION);
        }
        let ok = if job.must_fail {
            state == "FAILED"
        } else {
            state == "COMPLETED" && exit == "0:0"
        };
        assert!(
            ok,
            "job {} ({id}, {}): {state}, exit {exit}; its output:\n{output}\n{}",
            job.name,
            job.script,
            cluster.logs()
        );
        let checked = Checked {
            output,
            dir,
            machine: self.machine.clone(),
        };
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (job.check)(&checked)));
        if let Err(e) = result {
            say(&format!(
                "job {} ({id}) printed:\n{}",
                job.name, checked.output
            ));
            std::panic::resume_unwind(e);
        }
        true
    }

    /// `sbatch` of `job`, its output to `output_file`: the job's id.
    fn submit(&self, cluster: &Cluster, job: &Job, dir: &Path, output_file: &Path) -> String {
        let mut sbatch = cluster.command("sbatch");
        sbatch
            .current_dir(REPO)
            .plainly()
            .env("BACKEND", "cpu")
            .env("OUT_DIR", dir)
            .env("SBATCH_ACCOUNT", ACCOUNT)
            .arg("--parsable")
            .arg(format!("--output={}", output_file.display()))
            .args(job.options)
            .arg(job.script)
            .args(job.args);
        // The scripts' default BIN_DIR is $SLURM_SUBMIT_DIR/target/release: set only if cargo
        // builds elsewhere (CARGO_TARGET_DIR).
        if self.bin != Path::new(REPO).join("target/release") {
            sbatch.env("BIN_DIR", &self.bin);
        }
        for (name, value) in job.env {
            match *value {
                "@fake-nsys" => sbatch.env(name, &self.fake_nsys),
                "@fake-ncu" => sbatch.env(name, &self.fake_ncu),
                "@torch-venv" => sbatch.env(name, self.torch_venv.as_ref().expect("torch")),
                _ => sbatch.env(name, value),
            };
        }
        let submitted = sbatch.output().unwrap();
        assert!(
            submitted.status.success(),
            "sbatch {} refused it: {}",
            job.script,
            String::from_utf8_lossy(&submitted.stderr)
        );
        let stdout = String::from_utf8_lossy(&submitted.stdout);
        stdout.trim().split(';').next().unwrap().to_string()
    }
}

/// Waits (at most 120 s) for job `id` to end: its state and exit code.
fn finished(cluster: &Cluster, job: &Job, id: &str) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match cluster.job_state(id) {
            Some((state, exit))
                if !matches!(
                    state.as_str(),
                    "PENDING" | "CONFIGURING" | "RUNNING" | "COMPLETING" | "SUSPENDED"
                ) =>
            {
                return (state, exit)
            }
            _ if Instant::now() > deadline => {
                let _ = cluster.command("scancel").arg(id).status();
                panic!(
                    "job {} ({id}) did not finish within 120 s\n{}",
                    job.name,
                    cluster.logs()
                );
            }
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// What Leonardo refuses is refused here, at submission.
fn leonardos_refusals(cluster: &Cluster) {
    for (options, env, says) in REFUSED {
        let mut sbatch = cluster.command("sbatch");
        sbatch
            .current_dir(REPO)
            .env("SBATCH_ACCOUNT", ACCOUNT)
            .envs(env.iter().copied())
            .arg("--parsable")
            .args(*options)
            .arg("slurm/02-allreduce.sbatch");
        let out = sbatch.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(says),
            "sbatch {options:?} {env:?} slurm/02-allreduce.sbatch: expected a refusal saying {says:?}, got: {}{stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// slurm/README.md's interactive recipe: salloc, then srun in its shell, 4 ranks then 2.
fn the_interactive_recipe(cluster: &Cluster, bin: &Path) {
    let (options, typed) = interactive_recipe(bin);
    let out = cluster
        .command("salloc")
        .current_dir(REPO)
        .plainly()
        .args(&options)
        .args(["bash", "-c", &format!("set -e\n{}", typed.join("\n"))])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "salloc {options:?} with {typed:?} failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second = stdout
        .match_indices("Before reduce:")
        .nth(1)
        .map(|(at, _)| at)
        .unwrap_or_else(|| panic!("the recipe's two runs did not both print:\n{stdout}"));
    allreduced(&stdout[..second], 4, 8, "");
    allreduced(&stdout[second..], 2, 8, "");
}

/// GRES binding as on Leonardo: --gpus-per-task=1 gives each task one entry of
/// CUDA_VISIBLE_DEVICES (where mknod works: the GPUs are stand-in devices).
fn one_gpu_per_task(cluster: &Cluster) {
    let out = cluster
        .command("srun")
        .args([
            "-N1",
            "-n4",
            "--gpus-per-task=1",
            "--qos=boost_qos_dbg",
            "-t",
            "1",
        ])
        .args([
            "bash",
            "-c",
            "echo \"$SLURM_PROCID=${CUDA_VISIBLE_DEVICES-unset}\"",
        ])
        .output()
        .unwrap();
    let mut seen: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    seen.sort();
    assert_eq!(seen, ["0=0", "1=1", "2=2", "3=3"], "--gpus-per-task=1");
}
