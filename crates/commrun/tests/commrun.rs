//! commrun run as a user runs it: any program (`sh -c`, `env`), the real examples, two commruns
//! as two nodes on 127.0.0.1, failures, Ctrl-C and bad input.
//!
//! For the scenarios that need a real rank (rendezvous, then wait), this test binary is also the
//! worker: started by commrun with `COMMRUN_TEST_SCENARIO` set, the test function runs
//! `comm_core::launch` instead of checking.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use comm_core::launch;
use comm_core::LaunchArgs;
use test_support::build::example;
use test_support::grid::Grid;
use test_support::process::{
    assert_all_gone, scratch, start, wait_for_pid_files, Finished, Plainly, Running,
};

mod common;
use common::{commrun, run, text};

fn succeeds(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "commrun {args:?} failed:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// A port outside the kernel's ephemeral range, so nothing else grabs it before the job binds it.
fn free_port() -> u16 {
    comm_core::spawn::free_port().unwrap()
}

/// The torchrun variables each worker saw, by rank, from lines `[r]: NAME=value …`.
fn worker_envs(stdout: &str) -> BTreeMap<usize, HashMap<String, String>> {
    let mut envs = BTreeMap::new();
    for line in stdout.lines() {
        let (prefix, rest) = line.split_once(": ").expect("a prefixed line");
        let rank: usize = prefix
            .strip_prefix('[')
            .and_then(|p| p.strip_suffix(']'))
            .unwrap()
            .parse()
            .unwrap();
        let vars = rest
            .split_whitespace()
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect();
        assert!(envs.insert(rank, vars).is_none(), "one line per rank");
    }
    envs
}

const PRINT_ENV: &str = "echo RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE \
     LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE GROUP_RANK=$GROUP_RANK MASTER_ADDR=$MASTER_ADDR \
     MASTER_PORT=$MASTER_PORT OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}";

fn expect_env(
    envs: &BTreeMap<usize, HashMap<String, String>>,
    rank: usize,
    expected: &[(&str, String)],
) {
    let env = &envs[&rank];
    for (name, value) in expected {
        assert_eq!(&env[*name], value, "{name} of rank {rank}: {env:?}");
    }
}

#[test]
fn every_worker_gets_torchruns_variables() {
    let port = free_port().to_string();
    let out = succeeds(&[
        "--nproc-per-node",
        "3",
        "--master-port",
        &port,
        "sh",
        "-c",
        PRINT_ENV,
    ]);
    let envs = worker_envs(&out);
    assert_eq!(envs.keys().copied().collect::<Vec<_>>(), [0, 1, 2]);
    for rank in 0..3 {
        expect_env(
            &envs,
            rank,
            &[
                ("RANK", rank.to_string()),
                ("LOCAL_RANK", rank.to_string()),
                ("WORLD_SIZE", "3".into()),
                ("LOCAL_WORLD_SIZE", "3".into()),
                ("GROUP_RANK", "0".into()),
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", port.clone()),
                ("OMP_NUM_THREADS", "1".into()),
            ],
        );
    }

    // The second of three nodes: global ranks 2 and 3, the master's address as given.
    let out = succeeds(&[
        "--nnodes=3",
        "--node-rank=1",
        "--nproc-per-node=2",
        "--rdzv-endpoint=node0.example:1234",
        "--",
        "sh",
        "-c",
        PRINT_ENV,
    ]);
    let envs = worker_envs(&out);
    assert_eq!(envs.keys().copied().collect::<Vec<_>>(), [2, 3]);
    for (local, rank) in [(0, 2), (1, 3)] {
        expect_env(
            &envs,
            rank,
            &[
                ("RANK", rank.to_string()),
                ("LOCAL_RANK", local.to_string()),
                ("WORLD_SIZE", "6".into()),
                ("LOCAL_WORLD_SIZE", "2".into()),
                ("GROUP_RANK", "1".into()),
                ("MASTER_ADDR", "node0.example".into()),
                ("MASTER_PORT", "1234".into()),
            ],
        );
    }

    // One worker (torchrun's default) leaves OMP_NUM_THREADS alone.
    let envs = worker_envs(&succeeds(&["--standalone", "sh", "-c", PRINT_ENV]));
    expect_env(&envs, 0, &[("OMP_NUM_THREADS", "unset".into())]);
}

#[test]
fn under_srun_the_node_layout_comes_from_slurm() {
    // What srun gives the second task of `srun --nodes=2 --ntasks-per-node=1`.
    let out = commrun(&["--nproc-per-node", "2", "sh", "-c", PRINT_ENV])
        .env("SLURM_PROCID", "1")
        .env("SLURM_STEP_ID", "0")
        .env("SLURM_NTASKS", "2")
        .env("SLURM_LOCALID", "0")
        .env("SLURM_NODEID", "1")
        .env("SLURM_NTASKS_PER_NODE", "1")
        .env("SLURM_JOB_NODELIST", "lrdn[0101-0102]")
        .env("SLURM_JOB_ID", "4242")
        .env_remove("MASTER_PORT")
        .env_remove("MASTER_ADDR")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let envs = worker_envs(&text(&out.stdout));
    for (local, rank) in [(0, 2), (1, 3)] {
        expect_env(
            &envs,
            rank,
            &[
                ("LOCAL_RANK", local.to_string()),
                ("WORLD_SIZE", "4".into()),
                ("GROUP_RANK", "1".into()),
                ("MASTER_ADDR", "lrdn0101".into()),
                ("MASTER_PORT", (20000 + 4242).to_string()),
            ],
        );
    }
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("commrun: node 1 of 2 on ") && stderr.contains("ranks 2-3 of 4"),
        "{stderr}"
    );
}

#[test]
fn output_is_prefixed_by_rank_never_torn_and_the_prefix_can_go() {
    // Each worker writes half a line, waits, then the rest: the relay holds the half line back.
    let script = "printf 'start-%s-' $RANK; sleep 0.2; printf 'end\\n'; \
                  i=0; while [ $i -lt 300 ]; do echo \"line-$RANK-$i-..............................................\"; i=$((i+1)); done; \
                  echo \"err-$RANK\" >&2";
    let out = run(&["--nproc-per-node", "3", "--standalone", "sh", "-c", script]);
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    let mut counts = [0usize; 3];
    for line in stdout.lines() {
        let (prefix, rest) = line.split_once(": ").unwrap();
        let rank: usize = prefix[1..prefix.len() - 1].parse().unwrap();
        if rest.starts_with("start-") {
            assert_eq!(rest, format!("start-{rank}-end"), "torn line: {line:?}");
        } else {
            let expected = format!("line-{rank}-{}-{}", counts[rank], ".".repeat(46));
            assert_eq!(rest, expected, "torn or misordered line");
            counts[rank] += 1;
        }
    }
    assert_eq!(counts, [300; 3]);
    let stderr = text(&out.stderr);
    for rank in 0..3 {
        assert!(
            stderr.contains(&format!("[{rank}]: err-{rank}\n")),
            "{stderr}"
        );
    }

    let out = succeeds(&[
        "--nproc-per-node",
        "2",
        "--no-prefix",
        "sh",
        "-c",
        "echo plain $RANK",
    ]);
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines, ["plain 0", "plain 1"]);
}

/// Waits until the workers of `ranks` wrote their pid into `dir/RANK`.
fn worker_pids(dir: &Path, ranks: std::ops::Range<usize>) -> Vec<i32> {
    wait_for_pid_files(dir, ranks, Duration::from_secs(30))
}

/// Waits for a started commrun (killing it and failing if it takes longer than `limit`): its
/// exit code (128 + the signal when killed by one), stdout and stderr.
fn finish(commrun: Running, limit: Duration) -> (i32, String, String) {
    let finished: Finished = commrun.finish(limit);
    (finished.code_or_signal(), finished.stdout, finished.stderr)
}

#[test]
fn a_failed_worker_stops_the_others_and_commrun_says_why() {
    let dir = scratch("fail");
    let script = format!(
        "echo $$ > {0}/$RANK.tmp && mv {0}/$RANK.tmp {0}/$RANK; \
         if [ $RANK = 1 ]; then sleep 0.5; echo 'rank 1 is leaving on purpose' >&2; exit 7; fi; \
         exec sleep 60",
        dir.display()
    );
    let started = Instant::now();
    let child = start(&mut commrun(&[
        "--nproc-per-node",
        "3",
        "--standalone",
        "sh",
        "-c",
        &script,
    ]));
    let pids = worker_pids(&dir, 0..3);
    let (code, _, stderr) = finish(child, Duration::from_secs(30));
    assert_eq!(
        code, 7,
        "commrun exits with the failed worker's code:\n{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        stderr.contains("[1]: rank 1 is leaving on purpose"),
        "{stderr}"
    );
    assert!(
        stderr.contains("commrun: error: rank 1 exited with code 7"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Root cause (first worker to fail on this node):"),
        "{stderr}"
    );
    assert!(
        stderr.contains("rank       : 1 (local rank 1 of 3, node 0 of 1, host "),
        "{stderr}"
    );
    assert!(stderr.contains("ended      : exit code 7"), "{stderr}");
    assert!(
        stderr.contains("    | rank 1 is leaving on purpose"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_all_gone(&pids);

    // A crash: the code is 128 + the signal, as a shell reports it.
    let dir = scratch("crash");
    let script = format!(
        "echo $$ > {0}/$RANK.tmp && mv {0}/$RANK.tmp {0}/$RANK; \
         if [ $RANK = 2 ]; then sleep 0.5; date +%s%N > {0}/crashed; kill -SEGV $$; fi; exec sleep 60",
        dir.display()
    );
    let child = start(&mut commrun(&[
        "--nproc-per-node",
        "3",
        "--standalone",
        "sh",
        "-c",
        &script,
    ]));
    let pids = worker_pids(&dir, 0..3);
    let (code, _, stderr) = finish(child, Duration::from_secs(30));
    let exited = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let crashed: u64 = std::fs::read_to_string(dir.join("crashed"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let crash_to_exit = exited.saturating_sub(Duration::from_nanos(crashed));
    // Typically a few milliseconds; generous for a loaded CI machine.
    assert!(
        crash_to_exit < Duration::from_secs(2),
        "crash to exit: {crash_to_exit:?}"
    );
    assert_eq!(code, 128 + libc::SIGSEGV, "{stderr}");
    assert!(
        stderr.contains("rank 2 was killed by signal 11 (SIGSEGV)"),
        "{stderr}"
    );
    assert_all_gone(&pids);
}

#[test]
fn workers_that_ignore_sigterm_are_killed_after_the_shutdown_timeout() {
    let dir = scratch("stubborn");
    let script = format!(
        "trap '' TERM; echo $$ > {0}/$RANK.tmp && mv {0}/$RANK.tmp {0}/$RANK; \
         if [ $RANK = 0 ]; then sleep 0.5; exit 1; fi; while :; do sleep 0.1; done",
        dir.display()
    );
    let child = start(&mut commrun(&[
        "--nproc-per-node",
        "2",
        "--standalone",
        "--shutdown-timeout",
        "1",
        "sh",
        "-c",
        &script,
    ]));
    let pids = worker_pids(&dir, 0..2);
    let started = Instant::now();
    let (code, _, stderr) = finish(child, Duration::from_secs(30));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_all_gone(&pids);
}

#[test]
fn ctrl_c_reaches_every_worker_and_leaves_no_orphan() {
    let dir = scratch("ctrl-c");
    let script = format!(
        "trap 'echo got-INT-$RANK; exit 130' INT; echo $$ > {0}/$RANK.tmp && mv {0}/$RANK.tmp {0}/$RANK; \
         while :; do sleep 0.1; done",
        dir.display()
    );
    let child = start(&mut commrun(&[
        "--nproc-per-node",
        "3",
        "--standalone",
        "sh",
        "-c",
        &script,
    ]));
    let pids = worker_pids(&dir, 0..3);
    child.signal(libc::SIGINT);
    let (code, stdout, stderr) = finish(child, Duration::from_secs(30));
    assert_eq!(code, 130, "{stderr}");
    for rank in 0..3 {
        assert!(
            stdout.contains(&format!("[{rank}]: got-INT-{rank}")),
            "{stdout}"
        );
    }
    assert!(
        stderr.contains("commrun: interrupted by signal 2"),
        "{stderr}"
    );
    assert_all_gone(&pids);

    // Even a commrun killed outright (SIGKILL, nothing to catch) takes its workers with it.
    let dir = scratch("killed");
    let script = format!(
        "echo $$ > {0}/$RANK.tmp && mv {0}/$RANK.tmp {0}/$RANK; exec sleep 60",
        dir.display()
    );
    let child = start(&mut commrun(&[
        "--nproc-per-node",
        "3",
        "--standalone",
        "sh",
        "-c",
        &script,
    ]));
    let pids = worker_pids(&dir, 0..3);
    child.kill();
    assert_all_gone(&pids);
}

/// commrun's flags for node `rank` of two, with two workers each, meeting at 127.0.0.1:`port`.
fn two_nodes_of_two<'a>(rank: &'a str, port: &'a str) -> [&'a str; 10] {
    [
        "--nnodes",
        "2",
        "--node-rank",
        rank,
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        port,
    ]
}

#[test]
fn two_commruns_on_one_machine_form_one_job() {
    let allreduce = example("02-allreduce");
    let port = free_port().to_string();
    let node = |rank: &str| {
        start(
            commrun(&two_nodes_of_two(rank, &port))
                .arg(&allreduce)
                .args(["--backend", "cpu", "--timeout", "60", "--len", "5"]),
        )
    };
    // Node 1 first: its workers wait for node 0's store, as on a real cluster.
    let node1 = node("1");
    std::thread::sleep(Duration::from_millis(300));
    let node0 = node("0");
    let (code0, out0, err0) = finish(node0, Duration::from_secs(90));
    let (code1, out1, err1) = finish(node1, Duration::from_secs(90));
    assert_eq!((code0, code1), (0, 0), "node 0:\n{err0}\nnode 1:\n{err1}");
    assert!(out0.contains("[0]: backend: cpu"), "{out0}");
    for rank in [0, 1] {
        assert!(out0.contains(&format!("[{rank}]: Rank {rank} using device: cpu:{rank}")));
    }
    for rank in [2, 3] {
        assert!(out1.contains(&format!("[{rank}]: Rank {rank} using device: cpu:{rank}")));
    }
    for (title, value) in [("Before reduce:", "1"), ("After reduce:", "4")] {
        let rows = Grid::titled(title).prefix("[0]: ").read(&out0);
        assert_eq!(rows.len(), 4, "world size 4: {rows:?}");
        for row in rows {
            assert_eq!(row, vec![value; 5]);
        }
    }
}

/// Two nodes whose host names differ (node 1 runs in a UTS namespace of its own, with its own
/// host name, as a second machine would have): the ranks of each node share memory, and the
/// pairs across nodes stay on TCP. Needs `unshare --uts` (root): skipped, saying so, without.
#[test]
fn across_hosts_pairs_use_tcp_and_within_a_host_shared_memory() {
    if !Command::new("unshare")
        .args(["--uts", "true"])
        .status()
        .is_ok_and(|s| s.success())
    {
        eprintln!("skipped: `unshare --uts` is not permitted here (it needs root)");
        return;
    }
    let allreduce = example("02-allreduce");
    let port = free_port().to_string();
    let node = |rank: &str| {
        let mut command = commrun(&two_nodes_of_two(rank, &port));
        command
            .arg(&allreduce)
            .args(["--backend", "cpu", "--timeout", "60", "--len", "3"]);
        if rank == "1" {
            // The same command, started in a namespace whose host name is "other-node".
            let program = command.get_program().to_owned();
            let args: Vec<_> = command.get_args().map(|a| a.to_owned()).collect();
            let mut other = Command::new("unshare");
            other
                .args([
                    "--uts",
                    "sh",
                    "-c",
                    "hostname other-node && exec \"$0\" \"$@\"",
                ])
                .arg(program)
                .args(args)
                .plainly()
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            return start(&mut other);
        }
        start(&mut command)
    };
    let node1 = node("1");
    let node0 = node("0");
    let (code0, out0, err0) = finish(node0, Duration::from_secs(90));
    let (code1, _, err1) = finish(node1, Duration::from_secs(90));
    assert_eq!((code0, code1), (0, 0), "node 0:\n{err0}\nnode 1:\n{err1}");
    assert!(
        out0.contains(
            "[0]: transport: shm+tcp (rank 0: shared memory to 1 rank of its host, TCP to 2)"
        ),
        "{out0}"
    );
    let rows = Grid::titled("After reduce:").prefix("[0]: ").read(&out0);
    assert_eq!(rows, vec![vec!["4"; 3]; 4]);
}

/// What a worker does in the scenarios below (this test binary, started by commrun).
fn as_worker(scenario: &str) -> ! {
    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        launch: LaunchArgs,
    }
    let timeout = std::env::var("JOB_TIMEOUT").unwrap();
    let args = Args::parse_from(["worker", "--backend", "cpu", "--timeout", &timeout]);
    let settings = args.launch.settings(&[]).unwrap();
    let code = launch::run_settings(&settings, |comm| {
        let dir = std::env::var("PID_DIR").unwrap();
        let path = Path::new(&dir).join(comm.rank().to_string());
        std::fs::write(path.with_extension("tmp"), std::process::id().to_string()).unwrap();
        std::fs::rename(path.with_extension("tmp"), path).unwrap();
        if scenario == "node-1-stalls" && comm.rank() >= 2 {
            std::thread::sleep(Duration::from_secs(600));
        }
        Ok(())
    });
    std::process::exit(code)
}

#[test]
fn a_lost_node_is_named_by_the_other_nodes_workers() {
    if let Ok(scenario) = std::env::var("COMMRUN_TEST_SCENARIO") {
        as_worker(&scenario);
    }
    let dir = scratch("lost-node");
    let port = free_port().to_string();
    let node = |rank: &str| {
        start(
            commrun(&two_nodes_of_two(rank, &port))
                .arg("--")
                .arg(std::env::current_exe().unwrap())
                .args([
                    "a_lost_node_is_named_by_the_other_nodes_workers",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("COMMRUN_TEST_SCENARIO", "node-1-stalls")
                .env("JOB_TIMEOUT", "4")
                .env("PID_DIR", &dir),
        )
    };
    let node0 = node("0");
    let node1 = node("1");
    // Every rank met at the store; then node 1 is lost (its commrun killed, its workers with it;
    // the kernel closes their connections).
    let pids = worker_pids(&dir, 0..4);
    node1.kill();
    assert_all_gone(&pids[2..]);
    let (code, _, stderr) = finish(node0, Duration::from_secs(60));
    assert_eq!(code, 1, "{stderr}");
    // The store's server saw node 1's ranks' connections close: node 0's workers name one of them
    // at once instead of waiting out their timeout at the last barrier. (Rank 0 may not have
    // reached that barrier yet: its pid file is written just before it returns.)
    assert!(
        [
            ") vanished while rank 0 was finishing (waiting for every rank)",
            ") vanished while rank 0 was in its own code between collectives",
        ]
        .iter()
        .any(|phase| stderr.contains(phase)),
        "{stderr}"
    );
    assert!(
        stderr.contains("rank 2 (pid ") || stderr.contains("rank 3 (pid "),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint       : the ranks named above include ranks of node 1 (ranks 2-3): node 1 was lost"),
        "{stderr}"
    );
    assert_all_gone(&pids[..2]);

    // A node that never joins: node 0's workers give up at the rendezvous and name it.
    let hello = example("00-hello-world");
    let port = free_port().to_string();
    let out = commrun(&two_nodes_of_two("0", &port))
        .arg(&hello)
        .args(["--backend", "cpu", "--timeout", "3"])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // Which wait gives up first is the backend's business; the node's ranks are named either way.
    assert!(
        stderr.contains("ranks 2, 3") || stderr.contains("never connected: 2, 3"),
        "{stderr}"
    );
    assert!(
        stderr.contains("of node 1 (ranks 2-3): node 1 was lost or never joined"),
        "{stderr}"
    );
}

/// A node whose workers fail before they join: its commrun held the node's place at the store
/// meanwhile, so when it ends the store ends the job at once, naming the node, instead of node
/// 0's ranks waiting out `--timeout` for ranks that will never come.
#[test]
fn a_node_whose_workers_fail_before_joining_ends_the_job_at_once() {
    let hello = example("00-hello-world");
    let port = free_port().to_string();
    let node0 = start(commrun(&two_nodes_of_two("0", &port)).arg(&hello).args([
        "--backend",
        "cpu",
        "--timeout",
        "120",
    ]));
    // A slow start that fails: long enough for node 1's commrun to reach rank 0's store.
    let node1 = start(commrun(&two_nodes_of_two("1", &port)).args([
        "sh",
        "-c",
        "sleep 3; echo 'cannot import the model' >&2; exit 3",
    ]));
    let started = Instant::now();
    let (code1, _, err1) = finish(node1, Duration::from_secs(60));
    assert_eq!(code1, 3, "{err1}");
    let (code0, _, err0) = finish(node0, Duration::from_secs(60));
    let took = started.elapsed();
    assert_eq!(code0, 1, "{err0}");
    assert!(
        err0.contains("node 1 (its commrun, pid ")
            && err0.contains("ended before any of its ranks joined"),
        "{err0}"
    );
    assert!(
        err0.contains("of node 1 (ranks 2-3): node 1 was lost or never joined"),
        "{err0}"
    );
    // Far below --timeout 120: the store heard of it when node 1's commrun ended.
    assert!(took < Duration::from_secs(60), "{took:?}");
}

#[test]
fn bad_input_gets_a_clear_message_and_no_panic() {
    let fails = |args: &[&str], expected: &str| {
        let out = run(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "commrun {args:?}:\n{stderr}");
        assert!(
            stderr.contains(expected),
            "commrun {args:?}: {expected:?} not in\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    };
    fails(&["--nprocs", "2", "true"], "unexpected argument '--nprocs'");
    fails(&["--nproc-per-node", "two", "true"], "gpu, cpu or auto");
    fails(&[], "PROGRAM");
    fails(
        &["no-such-program-anywhere"],
        "program no-such-program-anywhere not found on PATH",
    );
    fails(
        &["./no/such/program"],
        "program ./no/such/program: No such file",
    );
    fails(
        &["--nnodes", "2", "--node-rank", "1", "true"],
        "--nnodes 2 needs the address of node 0",
    );
    fails(
        &["--nnodes", "2", "--master-addr", "h", "true"],
        "--nnodes 2 needs --node-rank",
    );
    fails(
        &[
            "--nnodes",
            "2",
            "--node-rank",
            "2",
            "--master-addr",
            "h",
            "true",
        ],
        "--node-rank 2 but --nnodes 2",
    );
    fails(&["--nnodes", "1:4", "true"], "elastic ranges");
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    fails(
        &["--master-port", &port, "true"],
        &format!("port {port} is already in use on this host"),
    );
    // The program's own failure to start is a worker failure, reported as one.
    let out = run(&["--standalone", "/"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("is a directory"));
}

/// `commrun … | head -0`: the pipe's reader is gone before the first line is relayed. commrun
/// ends by SIGPIPE as Unix tools do, with no panic, and its workers go with it.
#[test]
fn output_closed_early_ends_commrun_and_its_workers() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let dir = scratch("closed-output");
    let script = format!("echo $$ > {}/$RANK; echo hello; sleep 30", dir.display());
    let output = commrun(&["--nproc-per-node", "2", "sh", "-c", &script])
        .stdout(writer)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), None, "{stderr}");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&output.status),
        Some(libc::SIGPIPE)
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The worker whose line was relayed wrote its pid first; the other may have died before.
    let pids: Vec<i32> = (0..2)
        .filter_map(|rank| std::fs::read_to_string(dir.join(rank.to_string())).ok())
        .filter_map(|pid| pid.trim().parse().ok())
        .collect();
    assert!(!pids.is_empty(), "no worker wrote its pid");
    assert_all_gone(&pids);
}
