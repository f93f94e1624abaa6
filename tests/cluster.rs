//! A cluster in a box (scripts/cluster.sh), run as a student runs it: the refusals, a failed and
//! an interrupted `up` leaving nothing, then two nodes linked at a set rate and the course's
//! multi-node commands as written on them (seed 000's two shells, seed 003's two torchruns,
//! commrun on both nodes), a sweep across the link whose model finds the link's rate, the
//! prediction for the box beside it, a node whose cable is cut in the middle of an all-reduce
//! (found by the heartbeat, not the timeout; then the store's own node; then at the rendezvous,
//! after its ranks joined and while they are still starting; then at the job's last barrier), a
//! slow link that is not
//! taken for a lost node, and a Slurm across both nodes (sbatch and salloc/srun from this
//! machine, the login node); then `down`, and nothing left.
//!
//! It needs root, `ip`, `tc`, `nsenter` and `unshare`, and 10.0.0.0/24 unused here; otherwise it
//! says it skipped, unless NCCL_WORKSHOP_REQUIRE_BOX=1 (as `.ci/run` sets). The box is one per
//! machine, so everything runs in one test, in order.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use test_support::build::the_one_build;
use test_support::picture::book_picture_has_the_shape_of;
use test_support::process::{on_path, run_together, scratch, start, Finished, Plainly, Running};
use test_support::torch;

const REPO: &str = env!("CARGO_MANIFEST_DIR");
const STATE: &str = "/run/nccl-workshop-cluster";
/// cluster.sh's default rate, which the chapter's `up` gives the links.
const RATE_GBIT: f64 = 2.0;

fn cluster_sh() -> PathBuf {
    Path::new(REPO).join("scripts/cluster.sh")
}

/// `scripts/cluster.sh ARGS`, finished within a minute.
fn cluster(args: &[&str]) -> Finished {
    let mut c = Command::new("bash");
    c.arg(cluster_sh()).args(args).plainly();
    start(&mut c).finish(Duration::from_secs(60))
}

/// The chapter that shows the box's commands; every line run below is checked to be in it.
fn chapter() -> String {
    std::fs::read_to_string(Path::new(REPO).join("docs/src/cluster-in-a-box.md")).unwrap()
}

/// This test's own folder, where the chapter's `/tmp/` files go (`/tmp/box.csv`, the Slurm's
/// `/tmp/box-slurm`, …) and every job's output (`SBATCH_OUTPUT`: a job's `%x-%j.out` would
/// otherwise land in the repository, beside a student's own).
fn box_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| scratch("cluster-box"))
}

/// A line of the chapter, run as written from the repository root (this test is root, so the
/// scripts need no sudo; `/tmp/` is [`box_dir`]; `target/release/` is the build's folder; torch's
/// environment, where there is one, first on PATH, as after `source .../activate`), after
/// `before` (e.g. sourcing the Slurm's env.sh).
fn as_written(line: &str, before: &str, bin: &Path) -> Command {
    assert!(
        chapter().contains(line),
        "docs/src/cluster-in-a-box.md does not show `{line}`"
    );
    let command = format!("{before}{line}")
        .replace("/tmp/", &format!("{}/", box_dir().display()))
        .replace("target/release/", &format!("{}/", bin.display()));
    let mut c = Command::new("bash");
    c.args(["-c", &command]);
    if let Ok(t) = torch::find() {
        c.env("PATH", t.path());
    }
    c.current_dir(REPO)
        .env("SBATCH_OUTPUT", box_dir().join("%x-%j.out"))
        .plainly();
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
    let links = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .unwrap();
    let links = String::from_utf8_lossy(&links.stdout).into_owned();
    let ours: Vec<&str> = links.lines().filter(|l| l.contains(": nw-")).collect();
    assert!(ours.is_empty(), "{after}: links left: {ours:?}");
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
    fn as_written(line: &str, bin: &Path) -> Up {
        let out = start(&mut as_written(line, "", bin)).finish(Duration::from_secs(60));
        out.assert_success(line);
        Up
    }
}

/// The chapter's picture, drawn by `cluster.sh picture` from the box that is up.
fn the_picture(dir: &Path) {
    // scripts/cluster.sh picture cluster-in-a-box.svg
    let file = dir.join("cluster-in-a-box.svg");
    cluster(&["picture", file.to_str().unwrap()]).assert_success("cluster.sh picture");
    let svg = std::fs::read_to_string(&file).unwrap();
    assert!(
        svg.contains(">node1</text>") && svg.contains("eth0 10.0.0.2"),
        "{svg}"
    );
    book_picture_has_the_shape_of(&svg, "cluster-in-a-box.svg");
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
    // Not root: as nobody. Without sudo the script refuses; with it, it asks sudo, which
    // refuses nobody (no terminal to ask a password on, nobody not in sudoers).
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "bash"])
        .arg(cluster_sh())
        .args(["up", "--nodes", "2"])
        .stdin(Stdio::null())
        .plainly();
    let out = start(&mut c).finish(Duration::from_secs(30));
    if on_path("sudo").is_some() {
        assert_ne!(out.code_or_signal(), 0, "{out:?}");
    } else {
        refused(&out, "needs root");
    }
    nothing_left("the refusals");
}

/// An `up` that fails half-way (node1's hosts file cannot be made: a file is where its folder
/// goes) removes what it made, that file included.
fn a_failed_up_leaves_nothing() {
    std::fs::create_dir_all("/etc/netns").unwrap();
    std::fs::write("/etc/netns/nw-node1", "in the way").unwrap();
    let out = cluster(&["up", "--nodes", "3"]);
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
        // Exit code 130 is up's trap; killed by the signal itself (on a busy machine bash may
        // not have reached the trap yet), nothing was made: try a later moment.
        if out.status.code() == Some(130) {
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

/// The chapter's lines `line(0)` and `line(1)` (one per node) run together as written, each
/// succeeding within `limit`.
fn on_both_nodes(
    line: impl Fn(usize) -> String,
    bin: &Path,
    limit: Duration,
    what: &str,
) -> Vec<Finished> {
    let out = run_together(
        vec![as_written(&line(0), "", bin), as_written(&line(1), "", bin)],
        limit,
    );
    for (node, o) in out.iter().enumerate() {
        o.assert_success(&format!("{what} on node{node}"));
    }
    out
}

/// Seed 000's two shells, verbatim: rank 0 on node0, rank 1 on node1, meeting across the link.
fn seed_000(bin: &Path) {
    let line = |r: usize| {
        format!(
            "scripts/cluster.sh exec node{r} target/release/03-multinode-gloo-vs-nccl --world_size 2 --rank {r} --master_addr 10.0.0.1 --master_port 29502"
        )
    };
    let out = on_both_nodes(line, bin, Duration::from_secs(120), "seed 000's command");
    let rank0 = &out[0].stdout;
    assert!(
        rank0.contains("transport: tcp (no other rank on this host)"),
        "{rank0}"
    );
    assert!(
        rank0.contains("Rank 0 (CPU, Gloo-style over tcp): all-reduce 100 MB took "),
        "{rank0}"
    );
}

/// Seed 003's two torchruns, one per node, as written but for the program.
fn seed_003(bin: &Path) {
    let line = |r: usize| {
        format!(
            "scripts/cluster.sh exec node{r} torchrun --nnodes=2 --nproc_per_node=2 --node_rank={r} --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29500 --no-python target/release/02-allreduce"
        )
    };
    let out = on_both_nodes(line, bin, Duration::from_secs(180), "seed 003's torchrun");
    let all = format!("{}{}", out[0].stdout, out[1].stdout);
    assert!(
        all.contains("transport: shm+tcp (rank 0: shared memory to 1 rank of its host, TCP to 2)"),
        "{all}"
    );
    assert!(all.contains("Gpu 3  | 4  | 4  | 4  | 4  |"), "{all}");
}

/// commrun on both nodes running a sweep across the link; `comm-bench model` on it finds the
/// link's rate (tc enforces it whatever the machine's speed; TCP and Ethernet headers take
/// about 1% at MTU 9000); `comm-bench predict` for the box lands near.
fn sweep_and_model(bin: &Path) {
    let csv = box_dir().join("box.csv");
    let _ = std::fs::remove_file(&csv);
    let common = "--nproc-per-node 2 --master-addr 10.0.0.1 target/release/comm-bench --backend cpu -b 4M -e 32M -f 2 --collectives all_gather -n 5 -w 1";
    let node0 = format!("scripts/cluster.sh exec node0 target/release/commrun --nnodes 2 --node-rank 0 {common} --csv /tmp/box.csv");
    let node1 = format!(
        "scripts/cluster.sh exec node1 target/release/commrun --nnodes 2 --node-rank 1 {common}"
    );
    let out = run_together(
        vec![as_written(&node0, "", bin), as_written(&node1, "", bin)],
        Duration::from_secs(180),
    );
    for o in &out {
        o.assert_success("commrun on a node");
    }
    let model = as_written("target/release/comm-bench model /tmp/box.csv", "", bin)
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
    // Never more than the link carries: tc enforces the rate on any machine, so this holds however
    // slow or busy the machine is. How close the fit comes to the rate is a measurement, not a test
    // (the chapter gives a quiet machine's figure: within 3%).
    for rate in rates {
        assert!(
            rate > 0.0 && rate <= RATE_GBIT * 1.10,
            "the model found {rate} Gbit/s for a {RATE_GBIT} Gbit/s link:\n{text}"
        );
    }
    // The prediction for 2 nodes of 2 ranks at this rate has a 16 MiB row, as the chapter shows,
    // and the measured run wrote its 16 MiB row; how near they are is the chapter's figure.
    let predict = "target/release/comm-bench predict --system crates/comm-bench/systems/box.toml --nodes 2 --nic-gbps 2 --collectives all_gather -b 1M -e 16M -f 4";
    let predicted = as_written(predict, "", bin).output().unwrap();
    assert!(predicted.status.success(), "{predict}");
    let predicted = String::from_utf8_lossy(&predicted.stdout).into_owned();
    let predicted_us: f64 = predicted
        .lines()
        .find(|l| l.trim_start().starts_with("16777216"))
        .and_then(|row| row.split_whitespace().nth(5)?.parse().ok())
        .unwrap_or_else(|| panic!("a 16 MiB row with a time in\n{predicted}"));
    let measured = std::fs::read_to_string(&csv).unwrap();
    let measured_us: f64 = measured
        .lines()
        .find(|l| l.contains(",16777216,") && l.contains("out-of-place"))
        .and_then(|l| l.split(',').nth(16)?.parse().ok())
        .expect("the 16 MiB out-of-place row");
    assert!(
        predicted_us > 0.0 && measured_us > 0.0,
        "{predicted}\n{measured}"
    );
    std::fs::remove_file(&csv).unwrap();
}

/// The chapter's all-reduce across the box on node `node`, `--timeout 300`, that runs until a
/// node is lost.
fn endless_all_reduce(node: usize) -> String {
    format!(
        "scripts/cluster.sh exec node{node} target/release/commrun --nnodes 2 --node-rank {node} --nproc-per-node 2 --master-addr 10.0.0.1 target/release/comm-bench --backend cpu -b 16M -e 16M --collectives all_reduce -n 1000000 -w 0 --timeout 300"
    )
}

/// The heartbeat's bound (`--heartbeat 5` × `--heartbeat-misses 3`), and what a loaded machine
/// adds to it before a launcher has ended its ranks; far below `--timeout 300`.
const HEARTBEAT_BOUND: Duration = Duration::from_secs(15);
const MARGIN: Duration = Duration::from_secs(20);

/// Cuts node `node`'s cable (the chapter's line), waits for each job of `watching` to end, then
/// mends it: what each printed and how long after the cut it ended, which must be within the
/// heartbeat's bound, non-zero and without a panic.
fn cut_and_watch(node: usize, watching: Vec<Running>, bin: &Path) -> Vec<(Finished, Duration)> {
    let cut = format!("scripts/cluster.sh cut node{node}");
    as_written(&cut, "", bin).output().unwrap();
    let cut_at = Instant::now();
    let seen: Vec<(Finished, Duration)> = watching
        .into_iter()
        .map(|job| {
            let seen = job.finish(HEARTBEAT_BOUND + MARGIN + Duration::from_secs(30));
            (seen, cut_at.elapsed())
        })
        .collect();
    let mend = format!("scripts/cluster.sh mend node{node}");
    as_written(&mend, "", bin).output().unwrap();
    for (seen, took) in &seen {
        eprintln!(
            "node{node} cut: a job watching ended after {took:?}:\n{}",
            seen.stderr
        );
        assert_ne!(seen.status.code(), Some(0), "{}", seen.stderr);
        assert!(
            *took < HEARTBEAT_BOUND + MARGIN,
            "node{node} cut: noticed after {took:?}:\n{}",
            seen.stderr
        );
        assert!(!seen.stderr.contains("panicked"), "{}", seen.stderr);
    }
    seen
}

/// Both nodes run the endless all-reduce; once node0's rank 0 prints its header (the ranks have
/// met, the collective starts), `lost`'s cable is cut (no FIN, no RST: the kernel drops every
/// packet). The other node's ranks must end within the heartbeat's bound, non-zero, naming the
/// lost node and what they were doing; then the cable is mended and the lost node's ranks end
/// too. Returns how long the other node took.
fn a_node_cut_in_a_collective(lost: usize, bin: &Path) -> Duration {
    let mut running: Vec<_> = (0..2)
        .map(|n| start(&mut as_written(&endless_all_reduce(n), "", bin)))
        .collect();
    let started = Instant::now();
    while !running[0].stdout_so_far().contains("# comm-bench ") {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the job never started: {}",
            running[0].stdout_so_far()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A few all-reduces in: the links are open and data crosses the cable.
    std::thread::sleep(Duration::from_secs(3));
    let lost_job = running.remove(lost);
    let (seen, took) = cut_and_watch(lost, vec![running.remove(0)], bin).remove(0);
    let gone = lost_job.finish(Duration::from_secs(90));
    assert_ne!(gone.status.code(), Some(0), "{}", gone.stderr);
    let names = [format!("node{lost}"), format!("10.0.0.{}", lost + 1)];
    assert!(
        names.iter().any(|n| seen.stderr.contains(n.as_str())),
        "node{lost} not named:\n{}",
        seen.stderr
    );
    assert!(
        seen.stderr.contains("went silent") || seen.stderr.contains("heard nothing"),
        "{}",
        seen.stderr
    );
    assert!(
        seen.stderr.contains("all_reduce"),
        "the phase: {}",
        seen.stderr
    );
    took
}

/// `scripts/cluster.sh exec node<node> env VARS…`, from the repository root: the command to
/// run there follows (a launcher's variables, for ranks started by hand).
fn on_node(node: usize, vars: &[String]) -> Command {
    let mut c = Command::new("bash");
    c.arg(cluster_sh())
        .args(["exec", &format!("node{node}"), "env"])
        .args(vars)
        .current_dir(REPO)
        .plainly();
    c
}

/// commrun on node `node` of a job of 2 nodes × 2 ranks meeting at node0's `port`, under
/// `vars`; the program and its arguments follow.
fn commrun_2x2(node: usize, port: u16, vars: &[String], bin: &Path) -> Command {
    let mut c = on_node(node, vars);
    c.arg(bin.join("commrun"))
        .args(["--nnodes", "2", "--node-rank", &node.to_string()])
        .args(["--nproc-per-node", "2", "--master-addr", "10.0.0.1"])
        .args(["--master-port", &port.to_string()]);
    c
}

/// A node cut at the rendezvous: ranks 2 and 3 on node1 have joined rank 0's store (on node0)
/// and wait with it for rank 1, which never starts; then node1's cable is cut. The store hears
/// nothing more from them, not even the heartbeat's answers, and rank 0 ends within the bound,
/// naming node1 and what it was doing. (A node cut before any rank of it joined is a node that
/// never came: it is found at `--timeout`, as torchrun's rendezvous finds it at its join
/// timeout.) The ranks are started as a launcher starts them, by their environment.
fn a_node_cut_at_the_rendezvous(bin: &Path) -> Duration {
    let rank = |rank: usize| {
        let env = [
            format!("RANK={rank}"),
            "WORLD_SIZE=4".into(),
            format!("LOCAL_RANK={}", rank % 2),
            "LOCAL_WORLD_SIZE=2".into(),
            "MASTER_ADDR=10.0.0.1".into(),
            "MASTER_PORT=29540".into(),
        ];
        let mut c = on_node(rank / 2, &env);
        c.arg(bin.join("comm-bench"))
            .args(["--backend", "cpu", "-b", "1M", "-e", "1M", "-n", "10"])
            .args(["--collectives", "all_reduce", "--timeout", "300"]);
        start(&mut c)
    };
    let waiting = rank(0);
    let started = Instant::now();
    while !waiting.stdout_so_far().contains("backend: cpu") {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "rank 0 never started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let joined = [rank(2), rank(3)];
    // Long enough to join on a busy machine; rank 0 waits at the rendezvous for rank 1 meanwhile.
    std::thread::sleep(Duration::from_secs(4));
    let (seen, took) = cut_and_watch(1, vec![waiting], bin).remove(0);
    for gone in joined {
        let gone = gone.finish(Duration::from_secs(90));
        assert_ne!(gone.status.code(), Some(0), "{}", gone.stderr);
    }
    assert!(seen.stderr.contains("on node1)"), "{}", seen.stderr);
    assert!(
        seen.stderr.contains("went silent while rank 0 was"),
        "{}",
        seen.stderr
    );
    took
}

/// A node cut while its ranks start, before any of them joined (a slow start: a program that
/// imports a large library first): node1's commrun holds its place at the store meanwhile
/// (comm-core's `store::presence`). Its cable cut, node0's ranks end within the heartbeat's
/// bound naming node 1, and node1's commrun stops its workers, having lost the store. Both are
/// started as the chapter starts commrun, with workers on node1 that never join.
fn a_node_cut_while_its_ranks_start(bin: &Path) -> Duration {
    let commrun =
        |node: usize, program: &[&str]| start(commrun_2x2(node, 29560, &[], bin).args(program));
    let comm_bench = bin.join("comm-bench").display().to_string();
    let waiting = commrun(
        0,
        &[
            &comm_bench,
            "--backend",
            "cpu",
            "-b",
            "1M",
            "-e",
            "1M",
            "-n",
            "10",
        ],
    );
    let started = Instant::now();
    while !waiting.stdout_so_far().contains("backend: cpu") {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "node0's ranks never started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let slow = commrun(1, &["bash", "-c", "sleep 600"]);
    // Long enough for node1's commrun to reach the store on a busy machine.
    std::thread::sleep(Duration::from_secs(4));
    // The cable is mended only once both have ended: node1 must hear the store's silence.
    let mut seen = cut_and_watch(1, vec![waiting, slow], bin).into_iter();
    let ((seen, took), (lost, _)) = (seen.next().unwrap(), seen.next().unwrap());
    assert!(
        seen.stderr.contains("node 1 (its commrun")
            && seen.stderr.contains("none of its ranks had joined"),
        "{}",
        seen.stderr
    );
    assert_eq!(lost.status.code(), Some(1), "{}", lost.stderr);
    assert!(
        lost.stderr.contains(
            "the rendezvous store at 10.0.0.1:29560 (node 0) went silent while this node's \
             workers were starting"
        ),
        "{}",
        lost.stderr
    );
    took
}

/// Set in a worker's environment: this test binary is then one rank of a job ([`as_worker`]).
const WORKER: &str = "CLUSTER_TEST_WORKER";

/// One rank of the barrier's job: every rank meets the others and builds its communicator; then
/// node1's ranks (2 and 3) compute for ten minutes, while node0's go on to the job's last
/// barrier (the store's, no collective and no NCCL in it) and wait there for them.
fn as_worker() -> ! {
    #[derive(clap::Parser)]
    struct Args {
        #[command(flatten)]
        launch: comm_core::LaunchArgs,
    }
    let args =
        <Args as clap::Parser>::parse_from(["worker", "--backend", "cpu", "--timeout", "300"]);
    let settings = args.launch.settings(&[]).unwrap();
    let code = comm_core::launch::run_settings(&settings, |comm| {
        if comm.rank() >= 2 {
            std::thread::sleep(Duration::from_secs(600));
        }
        Ok(())
    });
    std::process::exit(code)
}

/// A node cut while the others wait at a barrier of the store (the job's last): node0's ranks
/// have finished their work, node1's are still computing; node1's cable is cut. node0's ranks
/// end within the heartbeat's bound, naming node1 and that they were finishing. The workers are
/// this test binary ([`as_worker`]), started by commrun on both nodes.
fn a_node_cut_at_the_last_barrier(bin: &Path) -> Duration {
    let me = std::env::current_exe().unwrap();
    let commrun = |node: usize| {
        let mut c = commrun_2x2(node, 29570, &[format!("{WORKER}=1")], bin);
        c.arg(&me)
            .args(["the_course_runs_across_a_cluster_in_a_box", "--exact"])
            .args(["--nocapture", "--test-threads=1"]);
        start(&mut c)
    };
    let waiting = commrun(0);
    let computing = commrun(1);
    // Long enough to meet and build the communicator on a busy machine: node0's ranks then
    // wait at the last barrier.
    std::thread::sleep(Duration::from_secs(6));
    let (seen, took) = cut_and_watch(1, vec![waiting], bin).remove(0);
    let gone = computing.finish(Duration::from_secs(90));
    assert_ne!(gone.status.code(), Some(0), "{}", gone.stderr);
    assert!(seen.stderr.contains("on node1)"), "{}", seen.stderr);
    assert!(
        seen.stderr
            .contains("went silent while rank 0 was finishing (waiting for every rank)"),
        "{}",
        seen.stderr
    );
    took
}

/// A slow link is not a silent one: node1's cable at 1 Mbit/s, a 4 MB all-reduce across it
/// (messages of 2 MB, 17 s each to cross, longer than the heartbeat's bound) finishes and is
/// right; then the cable's rate is the box's again.
fn a_slow_link_is_not_a_lost_node(bin: &Path) {
    let slow = "scripts/cluster.sh rate node1 1mbit";
    let fast = "scripts/cluster.sh rate node1 2gbit";
    as_written(slow, "", bin).output().unwrap();
    let line = |n: usize| {
        format!(
            "scripts/cluster.sh exec node{n} target/release/commrun --nnodes 2 --node-rank {n} --nproc-per-node 1 --master-addr 10.0.0.1 target/release/comm-bench --backend cpu -b 4M -e 4M --collectives all_reduce --placement out-of-place -n 1 -w 0 --timeout 300"
        )
    };
    let started = Instant::now();
    let out = run_together(
        vec![as_written(&line(0), "", bin), as_written(&line(1), "", bin)],
        Duration::from_secs(280),
    );
    let took = started.elapsed();
    as_written(fast, "", bin).output().unwrap();
    eprintln!("4 MB all-reduce across a 1 Mbit/s link: {took:?}");
    for (node, o) in out.iter().enumerate() {
        o.assert_success(&format!("the slow link's all-reduce on node{node}"));
    }
    assert!(
        out[0].stdout.contains("# Wrong elements       : 0 OK"),
        "{}",
        out[0].stdout
    );
    assert!(
        took > HEARTBEAT_BOUND,
        "the message crossed in {took:?}: not slower than the heartbeat's bound"
    );
}

/// What the job of `line` (an `sbatch --wait` of a script of slurm/) wrote: the script's
/// `%x-%j.out` in [`box_dir`] (`SBATCH_OUTPUT`), read and removed. sbatch's last word is the
/// job's id.
fn job_output(line: &str, sbatch: &Output) -> String {
    let said = String::from_utf8_lossy(&sbatch.stdout);
    let id = said.trim().rsplit(' ').next().unwrap_or_default();
    let script = line
        .split_whitespace()
        .find(|w| w.ends_with(".sbatch"))
        .unwrap();
    // The output is `%x-%j.out`: the job's name (its #SBATCH --job-name) and id.
    let text = std::fs::read_to_string(Path::new(REPO).join(script)).unwrap();
    let name = text
        .lines()
        .find_map(|l| l.strip_prefix("#SBATCH --job-name="))
        .unwrap_or_else(|| panic!("{script} names no job"));
    let file = box_dir().join(format!("{name}-{id}.out"));
    let job = std::fs::read_to_string(&file).unwrap_or_default();
    let _ = std::fs::remove_file(&file);
    job
}

/// Slurm across both nodes: slurmctld on node0, a slurmd per node; sbatch and salloc + srun
/// from this machine (the login node), as the chapter writes them.
fn slurm_across_nodes(bin: &Path) {
    let start = "LOCAL_SLURM_BOX=1 scripts/local-slurm.sh start /tmp/box-slurm";
    let stop = "LOCAL_SLURM_BOX=1 scripts/local-slurm.sh stop /tmp/box-slurm";
    let env = "source /tmp/box-slurm/env.sh";
    assert!(chapter().contains(env));
    let started = as_written(start, "", bin).output().unwrap();
    let stop = || as_written(stop, "", bin).output().unwrap();
    if !started.status.success() {
        stop();
        panic!("{}", String::from_utf8_lossy(&started.stderr));
    }
    let sourced = format!("{env} && ");
    let sbatch = as_written("sbatch --wait slurm/03-multinode-2x1.sbatch", &sourced, bin)
        .output()
        .unwrap();
    let salloc = "salloc -N2 --ntasks-per-node=1 --qos boost_qos_dbg --time 5 srun hostname";
    let salloc = as_written(salloc, &sourced, bin).output().unwrap();
    // The other multi-node scripts: each job's output, read back.
    let mut others = vec!["sbatch --wait slurm/03-multinode-2x4.sbatch --size-mb 8"];
    let sweep = "OPS=all_gather MIN_BYTES=1M MAX_BYTES=16M FACTOR=4 ITERS=5 WARMUP=1 OUT_DIR=/tmp/box-bench sbatch --wait slurm/04-bench-sweep.sbatch";
    others.push(sweep);
    let torchrun =
        "TORCH_VENV=\"$(scripts/torch-env.sh dir)\" sbatch --wait slurm/07-torchrun.sbatch";
    if torch::or_skip("07-torchrun.sbatch across the box").is_some() {
        others.push(torchrun);
    }
    others.push("sbatch --wait slurm/11-tensor-parallel.sbatch --iters 20");
    let outputs: Vec<(&str, Output, String)> = others
        .iter()
        .map(|line| {
            let out = as_written(line, &sourced, bin).output().unwrap();
            let job = job_output(line, &out);
            (*line, out, job)
        })
        .collect();
    let stopped = stop();
    let _ = std::fs::remove_dir_all(box_dir().join("box-slurm"));
    let said = String::from_utf8_lossy(&sbatch.stdout).into_owned();
    let job = job_output("sbatch --wait slurm/03-multinode-2x1.sbatch", &sbatch);
    assert!(
        sbatch.status.success(),
        "sbatch: {said}{}\n{job}",
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
    for (line, out, job) in &outputs {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{line}: {stderr}\n{job}");
        let expected = if line.contains("2x4") {
            "on 2 node(s) (node[0-1]), 4 ranks per node"
        } else if line.contains("torchrun") {
            "on 2 node(s) (node[0-1]), 4 ranks per node, started by torchrun"
        } else if line.contains("tensor-parallel") {
            "07-tensor-parallel on 2 node(s) (node[0-1]), 4 ranks per node"
        } else {
            "comm-bench sweep on node[0-1], 4 ranks per node"
        };
        assert!(job.contains(expected), "{line}: {expected:?} in\n{job}");
    }
    for layout in ["1x4", "2x4"] {
        let csv = box_dir()
            .join("box-bench")
            .join(format!("all_gather-{layout}.csv"));
        assert!(csv.is_file(), "no {}", csv.display());
    }
    let _ = std::fs::remove_dir_all(box_dir().join("box-bench"));
    assert!(
        stopped.status.success(),
        "{}",
        String::from_utf8_lossy(&stopped.stderr)
    );
}

/// `scripts/tp-layouts.sh` as the chapter runs it, shorter (few steps of a small model): its
/// table has both layouts, each with a step time and a waiting share. What it measured is
/// printed, never asserted.
fn tp_layouts(bin: &Path) {
    let line = "scripts/tp-layouts.sh";
    let mut c = as_written(line, "", bin);
    c.envs([
        ("BIN_DIR", bin.to_str().unwrap()),
        ("ITERS", "6"),
        ("BATCH", "32"),
        ("HIDDEN", "64"),
    ]);
    let out = start(&mut c).finish(Duration::from_secs(120));
    out.assert_success(line);
    eprintln!("{}", out.stdout);
    for layout in [
        "| dp,tp: tp inside each node, dp across |",
        "| tp,dp: tp across the link, dp inside |",
    ] {
        let row = out.stdout.lines().find(|l| l.starts_with(layout));
        let row = row.unwrap_or_else(|| panic!("no row {layout} in\n{}", out.stdout));
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 6, "{row}");
        for cell in &cells[2..5] {
            assert!(cell.parse::<f64>().is_ok_and(|v| v >= 0.0), "{row}");
        }
        assert!(cells[5].ends_with('%'), "{row}");
    }
}

#[test]
fn the_course_runs_across_a_cluster_in_a_box() {
    if std::env::var_os(WORKER).is_some() {
        as_worker();
    }
    let required = std::env::var("NCCL_WORKSHOP_REQUIRE_BOX").is_ok_and(|v| v == "1");
    if let Some(why) = missing() {
        assert!(!required, "NCCL_WORKSHOP_REQUIRE_BOX=1 but {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let started = Instant::now();
    let bin = the_one_build();
    let dir = scratch("cluster-in-a-box");
    // The chapter's first two commands, the box at its default rate.
    let up = "scripts/cluster.sh up --nodes 2";
    let _ = cluster(&["down"]);
    refusals();
    a_failed_up_leaves_nothing();
    an_interrupted_up_leaves_nothing();
    {
        let _box = Up::as_written(up, &bin);
        let again = cluster(&["up", "--nodes", "2"]);
        refused(&again, "is up already");
        let status = cluster(&["status"]);
        assert!(
            status.stdout.starts_with("2 nodes, links of 2gbit"),
            "{status:?}"
        );
        let mut hostname = as_written("scripts/cluster.sh exec node1 hostname", "", &bin);
        let hostname = hostname.output().unwrap();
        assert_eq!(String::from_utf8_lossy(&hostname.stdout), "node1\n");
        refused(&cluster(&["exec", "node2", "true"]), "no node 'node2'");
        the_picture(&dir);
        seed_000(&bin);
        if torch::or_skip("seed 003's torchruns across the box").is_some() {
            seed_003(&bin);
        }
        sweep_and_model(&bin);
        tp_layouts(&bin);
        let node1_lost = a_node_cut_in_a_collective(1, &bin);
        let node0_lost = a_node_cut_in_a_collective(0, &bin);
        let at_the_rendezvous = a_node_cut_at_the_rendezvous(&bin);
        let while_starting = a_node_cut_while_its_ranks_start(&bin);
        let at_the_barrier = a_node_cut_at_the_last_barrier(&bin);
        eprintln!(
            "a lost node found in {node1_lost:?}, the store's node in {node0_lost:?}, a node \
             lost at the rendezvous in {at_the_rendezvous:?}, one lost while its ranks started \
             in {while_starting:?}, one lost at the last barrier in {at_the_barrier:?}"
        );
        a_slow_link_is_not_a_lost_node(&bin);
        if Command::new("sh")
            .args(["-c", "command -v slurmctld"])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            slurm_across_nodes(&bin);
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
    let _ = std::fs::remove_dir_all(box_dir());
    eprintln!(
        "the cluster in a box: {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
