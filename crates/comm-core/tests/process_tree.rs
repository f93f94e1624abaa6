//! What a spawned job leaves behind and what it costs: a rank's own children go with it (its
//! process group is signalled, and emptied once the ranks have exited), a huge output line is
//! relayed cut (and memory stays bounded), and absurd sizes are refused at once.
//!
//! The spawning parent is this test binary started again with `PROCESS_TREE_ROLE` set (so the
//! signal handlers spawn installs stay out of the test harness); its ranks are `sh -c SCRIPT`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use comm_core::spawn::{self, Outcome, SpawnPlan, LINE_CAP};
use comm_core::topology::{expand_nodelist, first_host, Topology};
use test_support::process::{assert_all_gone, scratch, start, wait_for_pids_in, Plainly};

const ROLE: &str = "PROCESS_TREE_ROLE";
const SCRIPT: &str = "PROCESS_TREE_SCRIPT";
const STOP_WHEN: &str = "PROCESS_TREE_STOP_WHEN";

/// The parent: runs `sh -c $PROCESS_TREE_SCRIPT` on 2 ranks (1 for the line test), prints how
/// it ended, the summary's stderr tail size and its own peak memory.
fn as_parent() -> ! {
    let script = std::env::var(SCRIPT).unwrap();
    let nproc = std::env::var(ROLE).unwrap().parse().unwrap();
    let plan = SpawnPlan {
        program: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        nproc_per_node: nproc,
        nnodes: 1,
        node_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: 1,
        prefix_output: true,
        grace: Duration::from_secs(2),
        run_id: None,
    };
    // A launcher that stops the ranks itself, once they and their children have written their
    // pids into the folder STOP_WHEN names.
    let stop = std::env::var(STOP_WHEN).ok().map(|dir| {
        let (send, reasons) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            wait_for_pids_in(
                Path::new(&dir),
                &["0", "1", "w0", "w1"],
                Duration::from_secs(60),
            );
            send.send("the launcher's reason".to_string()).unwrap();
        });
        reasons
    });
    let extras = spawn::Extras {
        stop,
        ..Default::default()
    };
    let outcome = spawn::run_with(&plan, &extras).unwrap();
    if let Outcome::Stopped(reason) = &outcome {
        println!("OUTCOME stopped: {reason}");
    }
    if let Outcome::Failed(f) = &outcome {
        let tail: usize = f.last_stderr.iter().map(String::len).sum();
        println!("OUTCOME failed rank={} tail_bytes={tail}", f.rank);
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap();
    println!("OUTCOME code={} peak_kib={hwm}", outcome.exit_code());
    std::process::exit(outcome.exit_code())
}

fn parent(test: &str, nproc: usize, script: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, nproc.to_string())
        .env(SCRIPT, script)
        .plainly();
    c
}

fn role() {
    if std::env::var_os(ROLE).is_some() {
        as_parent();
    }
}

#[test]
fn a_failing_rank_takes_its_grandchildren_along() {
    role();
    let dir = scratch("tree-fail");
    let d = dir.display();
    // Each rank starts a grandchild and writes its pid and its own; rank 1 then fails, leaving
    // its grandchild behind, rank 0 waits for its own.
    let script = format!(
        "sleep 1000 & echo $! > {d}/$RANK; echo $$ > {d}/w$RANK; \
         while [ ! -s {d}/1 ] || [ ! -s {d}/0 ]; do sleep 0.05; done; \
         if [ $RANK = 1 ]; then exit 3; fi; wait"
    );
    let started = Instant::now();
    let job = start(&mut parent(
        "a_failing_rank_takes_its_grandchildren_along",
        2,
        &script,
    ));
    // The ranks' grandchildren (0, 1) and the ranks themselves (w0, w1).
    let pids = wait_for_pids_in(&dir, &["0", "1", "w0", "w1"], Duration::from_secs(30));
    let done = job.finish(Duration::from_secs(60));
    assert_eq!(done.code_or_signal(), 3, "{}\n{}", done.stdout, done.stderr);
    assert_all_gone(&pids);
    eprintln!(
        "failing rank with grandchildren: done in {:?}",
        started.elapsed()
    );
}

/// A launcher may stop the ranks for a reason of its own (commrun does when the store's node
/// went silent while its ranks were starting): they and their children are gone within the
/// grace, and the launch ends as stopped, with that reason and exit code 1.
#[test]
fn a_launcher_stops_its_ranks_for_its_own_reason() {
    role();
    let dir = scratch("tree-stop");
    let d = dir.display();
    let script = format!("sleep 1000 & echo $! > {d}/$RANK; echo $$ > {d}/w$RANK; wait");
    let mut job = parent("a_launcher_stops_its_ranks_for_its_own_reason", 2, &script);
    let job = start(job.env(STOP_WHEN, &dir));
    let pids = wait_for_pids_in(&dir, &["0", "1", "w0", "w1"], Duration::from_secs(30));
    let done = job.finish(Duration::from_secs(30));
    assert_eq!(done.code_or_signal(), 1, "{}\n{}", done.stdout, done.stderr);
    assert!(
        done.stdout
            .contains("OUTCOME stopped: the launcher's reason"),
        "{}",
        done.stdout
    );
    assert_all_gone(&pids);
}

#[test]
fn a_huge_line_is_relayed_cut_once_and_memory_stays_bounded() {
    role();
    const LEN: usize = 10_000_000;
    // 10 MB of x on stdout, then a short line; 10 MB of y on stderr, then failure.
    let script = format!(
        "head -c {LEN} /dev/zero | tr '\\0' x; echo; echo after; \
         head -c {LEN} /dev/zero | tr '\\0' y >&2; echo >&2; exit 4"
    );
    let job = start(&mut parent(
        "a_huge_line_is_relayed_cut_once_and_memory_stays_bounded",
        1,
        &script,
    ));
    let done = job.finish(Duration::from_secs(60));
    assert_eq!(done.code_or_signal(), 4, "{}", done.stderr);
    let cut = LEN - LINE_CAP;
    let x_lines: Vec<&str> = done.stdout.lines().filter(|l| l.contains('x')).collect();
    assert_eq!(x_lines.len(), 1, "printed once");
    // (The harness of the parent may print `test NAME ... ` before it on the same line.)
    let expected = format!("[0]: {} \u{2026} [{cut} bytes cut]", "x".repeat(LINE_CAP));
    assert!(
        x_lines[0].ends_with(&expected) && x_lines[0].len() < expected.len() + 200,
        "the line is not {LINE_CAP} x then the marker: {} bytes, ends {:?}",
        x_lines[0].len(),
        &x_lines[0][x_lines[0].len().saturating_sub(60)..]
    );
    assert_eq!(done.stdout.matches("[0]: after").count(), 1);
    let y_lines: Vec<&str> = done.stderr.lines().filter(|l| l.contains("yyy")).collect();
    assert_eq!(y_lines.len(), 1, "printed once");
    assert!(y_lines[0].ends_with(&format!("[{cut} bytes cut]")));
    assert!(y_lines[0].len() < LINE_CAP + 100);
    let field = |name: &str| -> u64 {
        let at = done
            .stdout
            .find(name)
            .unwrap_or_else(|| panic!("{}", done.stdout))
            + name.len();
        done.stdout[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(field("tail_bytes=") < 4096, "{}", done.stdout);
    // 10 MB lines twice over, never whole in memory: the parent stays well under 10 MB more
    // than a test binary needs.
    assert!(field("peak_kib=") < 40 * 1024, "{}", done.stdout);
}

#[test]
fn absurd_sizes_are_refused_at_once() {
    let started = Instant::now();
    let e = spawn::check_ranks("-n/--nproc-per-node", 100_000, 1).unwrap_err();
    assert!(
        e.to_string()
            .contains("-n/--nproc-per-node 100000: at most 1024 ranks on one node"),
        "{e}"
    );
    let e = spawn::check_ranks("--nproc-per-node × --nnodes", 8, 1 << 40).unwrap_err();
    assert!(e.to_string().contains("more than 65536 ranks"), "{e}");
    assert_eq!(spawn::check_ranks("-n", 4, 2).unwrap(), 8);

    let vars = |pairs: Vec<(&'static str, String)>| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        }
    };
    let e = Topology::from_vars(vars(vec![
        ("RANK", "0".into()),
        ("WORLD_SIZE", "1000000000".into()),
        ("MASTER_ADDR", "h".into()),
        ("MASTER_PORT", "1".into()),
    ]))
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("WORLD_SIZE=1000000000: more than 65536 ranks"),
        "{e}"
    );
    let slurm = |ntasks: &str, list: &str| {
        Topology::from_vars(vars(vec![
            ("SLURM_PROCID", "0".into()),
            ("SLURM_STEP_ID", "0".into()),
            ("SLURM_NTASKS", ntasks.into()),
            ("SLURM_LOCALID", "0".into()),
            ("SLURM_NTASKS_PER_NODE", "1".into()),
            ("SLURM_JOB_NODELIST", list.into()),
        ]))
    };
    let e = slurm("1000000000", "n1").unwrap_err();
    assert!(e.to_string().contains("SLURM_NTASKS=1000000000"), "{e}");
    // The master is the first host: the list is checked, never expanded.
    let t = slurm("4", "r[1-100000]n[1-100000]").unwrap().unwrap();
    assert_eq!(t.master_addr, "r1n1");
    assert_eq!(first_host("lrdn[0101-0104],x").unwrap(), "lrdn0101");
    let e = expand_nodelist("r[1-100000]n[1-100000]").unwrap_err();
    assert!(e.contains("more than 65536 hosts"), "{e}");
    assert!(expand_nodelist("r[1-18446744073709551615]n[1-2]").is_err());
    assert!(
        slurm("4", "r[1-2]n[5-3]").is_err(),
        "the whole list is checked"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}
