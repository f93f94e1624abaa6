//! A cluster in a box (scripts/cluster.sh), run as a student runs it: the refusals, a failed and
//! an interrupted `up` leaving nothing, then two nodes linked at a set rate and the course's
//! multi-node commands as written on them (seed 000's two shells, seed 003's two torchruns,
//! commrun on both nodes), a sweep across the link whose model finds the link's rate, the
//! prediction for the box beside it, and a Slurm across both nodes (sbatch and salloc/srun
//! from this machine, the login node); then `down`, and nothing left.
//!
//! It needs root, `ip`, `tc`, `nsenter` and `unshare`, and 10.0.0.0/24 unused here; otherwise it
//! says it skipped, unless NCCL_WORKSHOP_REQUIRE_BOX=1 (as `.ci/run` sets). The box is one per
//! machine, so everything runs in one test, in order.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use test_support::build::the_one_build;
use test_support::process::{run_together, scratch, start, Finished, Plainly};
use test_support::torch;

const REPO: &str = env!("CARGO_MANIFEST_DIR");
const STATE: &str = "/run/nccl-workshop-cluster";
/// The rate the test shapes the links to (not cluster.sh's default, which the docs' commands use).
const RATE_GBIT: f64 = 1.0;

fn cluster_sh() -> PathBuf {
    Path::new(REPO).join("scripts/cluster.sh")
}

/// `scripts/cluster.sh ARGS`, finished within a minute.
fn cluster(args: &[&str]) -> Finished {
    let mut c = Command::new("bash");
    c.arg(cluster_sh()).args(args).plainly();
    start(&mut c).finish(Duration::from_secs(60))
}

/// `scripts/cluster.sh exec NODE` + a command as the docs write it (`target/release/X` is the
/// build's), run from the repository root.
fn on(node: &str, line: &str, bin: &Path) -> Command {
    let here = format!("{}/", bin.display());
    let mut c = Command::new("bash");
    c.arg(cluster_sh()).args(["exec", node]);
    for word in line.split_whitespace() {
        c.arg(word.replace("target/release/", &here));
    }
    c.current_dir(REPO).plainly();
    c
}

/// Why the box cannot run here, if it cannot.
fn missing() -> Option<String> {
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
    if uid != 0 {
        return Some("a cluster in a box needs root".into());
    }
    for tool in ["ip", "tc", "nsenter", "unshare", "setpriv"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!("no `{tool}` (apt-get install iproute2 util-linux)"));
        }
    }
    None
}

/// Nothing of the box is left: no namespace, no link, no state, no hosts files.
fn nothing_left(after: &str) {
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let netns = String::from_utf8_lossy(&netns.stdout).into_owned();
    assert!(!netns.contains("nw-"), "{after}: namespaces left:\n{netns}");
    let login = Command::new("ip")
        .args(["link", "show", "nw-login"])
        .output();
    assert!(!login.unwrap().status.success(), "{after}: nw-login left");
    assert!(!Path::new(STATE).exists(), "{after}: {STATE} left");
    let etc = std::fs::read_dir("/etc/netns")
        .map(|d| d.count())
        .unwrap_or(0);
    let ours = std::fs::read_dir("/etc/netns")
        .map(|d| {
            d.filter(|e| {
                let e = e.as_ref().unwrap();
                e.file_name().to_string_lossy().starts_with("nw-")
            })
            .count()
        })
        .unwrap_or(0);
    assert_eq!(
        ours, 0,
        "{after}: /etc/netns/nw-* left ({etc} entries there)"
    );
}

/// The box, taken down when dropped (even after a failed assertion).
struct Up;

impl Up {
    fn nodes(n: usize, rate: &str) -> Up {
        let out = cluster(&["up", "--nodes", &n.to_string(), "--rate", rate]);
        out.assert_success("cluster.sh up");
        Up
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = cluster(&["down"]);
    }
}

/// Refused with exit code 2 and a message containing `says`.
fn refused(out: &Finished, says: &str) {
    assert_eq!(out.code_or_signal(), 2, "{out:?}");
    assert!(out.stderr.contains(says), "{says:?} in {}", out.stderr);
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
}

fn refusals() {
    refused(&cluster(&["up", "--nodes", "0"]), "--nodes '0'");
    refused(&cluster(&["up", "--rate", "fast"]), "--rate 'fast'");
    refused(
        &cluster(&["up", "--colour", "red"]),
        "unknown argument '--colour'",
    );
    refused(&cluster(&["exec", "node0", "true"]), "no cluster is up");
    refused(&cluster(&["launch"]), "unknown command 'launch'");
    // Not root: as nobody.
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "bash"])
        .arg(cluster_sh())
        .args(["up", "--nodes", "2"])
        .plainly();
    let out = start(&mut c).finish(Duration::from_secs(30));
    refused(&out, "needs root");
    nothing_left("the refusals");
}

/// An `up` that fails half-way (a link of the name it wants already exists) removes what it made.
fn a_failed_up_leaves_nothing() {
    let made = Command::new("ip")
        .args([
            "link",
            "add",
            "nw-eth1",
            "type",
            "veth",
            "peer",
            "name",
            "nw-taken1",
        ])
        .status()
        .unwrap();
    assert!(made.success());
    let out = cluster(&["up", "--nodes", "3"]);
    let _ = Command::new("ip")
        .args(["link", "delete", "nw-eth1"])
        .status();
    assert_eq!(out.code_or_signal(), 1, "{out:?}");
    assert!(
        out.stderr.contains("up failed: removing what it made"),
        "{}",
        out.stderr
    );
    nothing_left("a failed up");
}

/// Ctrl-C during `up` (SIGINT to the script) removes what it made; tried at later and later
/// moments until one lands before `up` is done.
fn an_interrupted_up_leaves_nothing() {
    for delay_ms in [30, 60, 120, 240, 480] {
        let mut c = Command::new("bash");
        c.arg(cluster_sh()).args(["up", "--nodes", "12"]).plainly();
        let running = start(&mut c);
        std::thread::sleep(Duration::from_millis(delay_ms));
        running.signal(libc::SIGINT);
        let out = running.finish(Duration::from_secs(60));
        if out.code_or_signal() == 130 {
            assert!(
                out.stderr.contains("interrupted: removing what up made"),
                "{out:?}"
            );
            nothing_left("an interrupted up");
            return;
        }
        // Done before the signal, or interrupted before it began: either way, start again.
        let _ = cluster(&["down"]);
    }
    panic!("no SIGINT landed while up was making the box");
}

/// Seed 000's two shells, verbatim: rank 0 on node0, rank 1 on node1, meeting across the link.
fn seed_000(bin: &Path) {
    // cluster.sh exec node0 target/release/03-multinode-gloo-vs-nccl --world_size 2 --rank 0 --master_addr 10.0.0.1 --master_port 29502
    let line = |r: usize| {
        format!(
            "target/release/03-multinode-gloo-vs-nccl --world_size 2 --rank {r} --master_addr 10.0.0.1 --master_port 29502"
        )
    };
    let out = run_together(
        vec![on("node0", &line(0), bin), on("node1", &line(1), bin)],
        Duration::from_secs(120),
    );
    for o in &out {
        o.assert_success("seed 000's command on a node");
    }
    let rank0 = &out[0].stdout;
    assert!(
        rank0.contains("transport: tcp (no other rank on this host)"),
        "{rank0}"
    );
    assert!(
        rank0.contains("Rank 0 (Gloo): all-reduce 100 MB took "),
        "{rank0}"
    );
}

/// Seed 003's two torchruns, one per node, as written but for the program.
fn seed_003(bin: &Path, torchrun: &Path) {
    // cluster.sh exec node0 torchrun --nnodes=2 --nproc_per_node=2 --node_rank=0 --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29500 --no-python target/release/02-allreduce
    let line = |r: usize| {
        format!(
            "{} --nnodes=2 --nproc_per_node=2 --node_rank={r} --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29500 --no-python target/release/02-allreduce",
            torchrun.display()
        )
    };
    let out = run_together(
        vec![on("node0", &line(0), bin), on("node1", &line(1), bin)],
        Duration::from_secs(180),
    );
    for o in &out {
        o.assert_success("seed 003's torchrun on a node");
    }
    let all = format!("{}{}", out[0].stdout, out[1].stdout);
    assert!(
        all.contains("transport: shm+tcp (rank 0: shared memory to 1 rank of its host, TCP to 2)"),
        "{all}"
    );
    assert!(all.contains("Gpu 3  | 4  | 4  | 4  | 4  |"), "{all}");
}

/// commrun on both nodes running a sweep across the link; `comm-bench model` on it finds the
/// link's rate (within 10%: the rate is tc's, enforced whatever the machine's speed; TCP and
/// Ethernet headers take about 1% at MTU 9000); `comm-bench predict` for the box lands near.
fn sweep_and_model(bin: &Path, dir: &Path) {
    let csv = dir.join("box.csv");
    let line = |r: usize| {
        format!(
            "target/release/commrun --nnodes 2 --node-rank {r} --nproc-per-node 2 --master-addr 10.0.0.1 target/release/comm-bench --backend cpu -b 1M -e 16M -f 4 --collectives all_gather -n 5 -w 1 --csv {}",
            csv.display()
        )
    };
    let out = run_together(
        vec![on("node0", &line(0), bin), on("node1", &line(1), bin)],
        Duration::from_secs(180),
    );
    for o in &out {
        o.assert_success("commrun on a node");
    }
    let model = Command::new(bin.join("comm-bench"))
        .arg("model")
        .arg(&csv)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&model.stdout).into_owned();
    assert!(model.status.success(), "{text}");
    let rates: Vec<f64> = text
        .lines()
        .filter_map(|l| {
            l.split("GB/s = ")
                .nth(1)?
                .split(" Gbit/s")
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(rates.len(), 2, "both placements' link rate in\n{text}");
    for rate in rates {
        let off = (rate - RATE_GBIT) / RATE_GBIT;
        assert!(
            off.abs() < 0.10,
            "the model found {rate} Gbit/s for a {RATE_GBIT} Gbit/s link:\n{text}"
        );
    }
    // The prediction for 2 nodes of 2 ranks at this rate, at 16 MiB, near the measured time.
    let predicted = Command::new(bin.join("comm-bench"))
        .args([
            "predict",
            "--system",
            "crates/comm-bench/systems/box.toml",
            "--nodes",
            "2",
        ])
        .args([
            "--nic-gbps",
            &RATE_GBIT.to_string(),
            "--collectives",
            "all_gather",
        ])
        .args(["-b", "16M", "-e", "16M"])
        .current_dir(REPO)
        .output()
        .unwrap();
    let predicted = String::from_utf8_lossy(&predicted.stdout).into_owned();
    let time_at = |table: &str| -> f64 {
        let row = table
            .lines()
            .find(|l| l.trim_start().starts_with("16777216"))
            .unwrap();
        row.split_whitespace().nth(5).unwrap().parse().unwrap()
    };
    let measured = std::fs::read_to_string(&csv).unwrap();
    let measured_us: f64 = measured
        .lines()
        .find(|l| l.contains(",16777216,") && l.contains("out-of-place"))
        .and_then(|l| l.split(',').nth(16)?.parse().ok())
        .expect("the 16 MiB out-of-place row");
    let ratio = time_at(&predicted) / measured_us;
    assert!(
        (0.7..1.4).contains(&ratio),
        "predicted / measured {ratio}:\n{predicted}\n{measured}"
    );
}

/// Slurm across both nodes: slurmctld on node0, a slurmd per node; sbatch and salloc + srun
/// from this machine (the login node).
fn slurm_across_nodes(bin: &Path, dir: &Path) {
    let slurm = dir.join("slurm");
    let ports: Vec<String> = (0..2)
        .map(|_| comm_core::spawn::free_port().unwrap().to_string())
        .collect();
    let start = Command::new("bash")
        .arg(Path::new(REPO).join("scripts/local-slurm.sh"))
        .args(["start"])
        .arg(&slurm)
        .env("LOCAL_SLURM_BOX", "1")
        .env("LOCAL_SLURM_CTLD_PORT", &ports[0])
        .env("LOCAL_SLURM_NODE1_PORT", &ports[1])
        .env("LOCAL_SLURM_CPUS", "32")
        .env("LOCAL_SLURM_GPUS", "4")
        .env("LOCAL_SLURM_PARTITION", "boost_usr_prod")
        .env("LOCAL_SLURM_MEM", "494000")
        .env("LOCAL_SLURM_QOS", "normal:64:0 boost_qos_dbg:2:30")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stop = || {
        let _ = Command::new("bash")
            .arg(Path::new(REPO).join("scripts/local-slurm.sh"))
            .arg("stop")
            .arg(&slurm)
            .env("LOCAL_SLURM_BOX", "1")
            .output();
    };
    assert!(
        start.status.success(),
        "{}",
        String::from_utf8_lossy(&start.stderr)
    );
    let client = |program: &str| {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", slurm.join("slurm.conf"))
            .env("SLURM_SRUN_COMM_IFHN", "10.0.0.254")
            .env("BACKEND", "cpu")
            .env("BIN_DIR", bin)
            .current_dir(REPO)
            .stdin(Stdio::null());
        c
    };
    let output = dir.join("job-%j.out");
    let sbatch = client("sbatch")
        .args(["--wait", "--parsable", "--output"])
        .arg(&output)
        .args([
            "slurm/03-multinode-2x1.sbatch",
            "--size-mb",
            "2",
            "--iters",
            "3",
        ])
        .output()
        .unwrap();
    let id = String::from_utf8_lossy(&sbatch.stdout).trim().to_string();
    let job = std::fs::read_to_string(dir.join(format!("job-{id}.out"))).unwrap_or_default();
    let salloc = client("salloc")
        .args([
            "-N2",
            "--ntasks-per-node=1",
            "--qos",
            "boost_qos_dbg",
            "--time",
            "5",
        ])
        .args(["srun", "hostname"])
        .output()
        .unwrap();
    stop();
    assert!(
        sbatch.status.success(),
        "sbatch: {}\n{job}",
        String::from_utf8_lossy(&sbatch.stderr)
    );
    assert!(
        job.contains("on 2 node(s) (node[0-1]), 1 ranks per node"),
        "{job}"
    );
    assert!(
        job.contains("transport: tcp (no other rank on this host)"),
        "{job}"
    );
    let hosts = String::from_utf8_lossy(&salloc.stdout);
    let mut hosts: Vec<&str> = hosts.lines().collect();
    hosts.sort();
    assert_eq!(
        hosts,
        ["node0", "node1"],
        "salloc + srun: {}",
        String::from_utf8_lossy(&salloc.stderr)
    );
}

#[test]
fn the_course_runs_across_a_cluster_in_a_box() {
    let required = std::env::var("NCCL_WORKSHOP_REQUIRE_BOX").is_ok_and(|v| v == "1");
    if let Some(why) = missing() {
        assert!(!required, "NCCL_WORKSHOP_REQUIRE_BOX=1 but {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let started = Instant::now();
    let bin = the_one_build();
    let dir = scratch("cluster-in-a-box");
    let _ = cluster(&["down"]);
    refusals();
    a_failed_up_leaves_nothing();
    an_interrupted_up_leaves_nothing();
    {
        let _box = Up::nodes(2, &format!("{RATE_GBIT}gbit"));
        let again = cluster(&["up", "--nodes", "2"]);
        refused(&again, "is up already");
        let status = cluster(&["status"]);
        assert!(
            status.stdout.starts_with("2 nodes, links of 1gbit"),
            "{status:?}"
        );
        let hostname = on("node1", "hostname", &bin).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&hostname.stdout), "node1\n");
        refused(&cluster(&["exec", "node2", "true"]), "no node 'node2'");
        seed_000(&bin);
        if let Some(t) = torch::or_skip("seed 003's torchruns across the box") {
            seed_003(&bin, &t.torchrun());
        }
        sweep_and_model(&bin, &dir);
        if Command::new("sh")
            .args(["-c", "command -v slurmctld"])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            slurm_across_nodes(&bin, &dir);
        } else {
            assert!(
                !std::env::var("NCCL_WORKSHOP_REQUIRE_SLURM").is_ok_and(|v| v == "1"),
                "Slurm is required here"
            );
            eprintln!("skipped the Slurm across the box: no Slurm");
        }
    }
    nothing_left("down");
    std::fs::remove_dir_all(&dir).unwrap();
    eprintln!(
        "the cluster in a box: {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
