//! The shared-memory transport as a user meets it: comm-bench's ranks on one host move bytes
//! through /dev/shm segments whose names are gone while the job runs, a rank killed with
//! `kill -9` mid-collective (reading registered buffers, or through the rings) ends the job
//! with an error naming it, and nothing is left behind: no process and no segment. A /dev/shm
//! too small for the registered buffers says how much was asked. The header and the transport
//! line say which transport ran.

use std::process::Command;
use std::time::{Duration, Instant};

use comm_core::backend::cpu::shm::leftovers;
use test_support::process::{alive, assert_all_gone, start, Plainly};

fn comm_bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_comm-bench"));
    c.plainly();
    c
}

/// The processes whose parent is `parent`, with the RANK each was given.
fn ranks_of(parent: i32) -> Vec<(usize, i32)> {
    let mut ranks = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // After the command's closing parenthesis: state, then the parent's pid.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
        if ppid != Some(parent) {
            continue;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let rank = environ
            .split(|&b| b == 0)
            .filter_map(|v| std::str::from_utf8(v).ok()?.strip_prefix("RANK="))
            .find_map(|r| r.parse().ok());
        if let Some(rank) = rank {
            ranks.push((rank, pid));
        }
    }
    ranks.sort();
    ranks
}

/// Whether `pid` maps one of our shared-memory segments, and whether its name is already gone.
fn maps_segment(pid: i32) -> Option<bool> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let line = maps.lines().find(|l| l.contains("/dev/shm/ncw-"))?;
    Some(line.ends_with("(deleted)"))
}

/// Segments in /dev/shm made by any of `pids` (names carry the creator's pid).
fn segments_of(pids: &[i32]) -> Vec<String> {
    leftovers()
        .into_iter()
        .filter(|name| pids.iter().any(|p| name.starts_with(&format!("ncw-{p}-"))))
        .collect()
}

#[test]
fn a_rank_killed_mid_collective_leaves_no_process_and_no_segment() {
    // Registered buffers (the default on one host), read in place; then the rings.
    killed_mid_collective("registered", "all_reduce");
    killed_mid_collective("registered", "broadcast");
    killed_mid_collective("ring", "all_reduce");
}

/// Kills rank 1 of 3 while they run `collective` with `--copy copy`, over and over: the job ends
/// with an error naming it, and no process and no segment are left.
fn killed_mid_collective(copy: &str, collective: &str) {
    let job = start(comm_bench().args([
        "--backend",
        "cpu",
        "--transport",
        "shm",
        "--copy",
        copy,
        "--world-sizes",
        "3",
        "--collectives",
        collective,
        "-b",
        "16M",
        "-e",
        "16M",
        "-n",
        "100000",
        "-w",
        "0",
        "-c",
        "0",
        "--timeout",
        "60",
    ]));
    // Wait until every rank maps its peers' segments: shared memory is set up and in use.
    let started = Instant::now();
    let ranks = loop {
        let ranks = ranks_of(job.pid());
        if ranks.len() == 3 && ranks.iter().all(|&(_, pid)| maps_segment(pid).is_some()) {
            break ranks;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{copy} {collective}: the 3 ranks never mapped shared memory: {ranks:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let pids: Vec<i32> = ranks.iter().map(|&(_, pid)| pid).collect();
    std::thread::sleep(Duration::from_millis(500));
    // While the job runs, the memory is mapped but no name is left in /dev/shm to leak.
    for &pid in &pids {
        assert_eq!(
            maps_segment(pid),
            Some(true),
            "rank pid {pid}'s segment is still named"
        );
    }
    assert_eq!(segments_of(&pids), Vec::<String>::new());

    let (_, victim) = ranks[1];
    // SAFETY: kill only sends a signal to a process this test started.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let killed_at = Instant::now();
    let finished = job.finish(Duration::from_secs(30));
    assert_ne!(finished.status.code(), Some(0), "{finished:?}");
    assert!(
        killed_at.elapsed() < Duration::from_secs(20),
        "{copy} {collective}: the job took {:?} to end after rank 1 was killed",
        killed_at.elapsed()
    );
    assert!(
        finished.stderr.contains("rank 1"),
        "{copy} {collective}: the error names the killed rank:\n{}",
        finished.stderr
    );
    assert!(!finished.stderr.contains("panicked"), "{}", finished.stderr);
    assert_all_gone(&pids);
    assert!(pids.iter().all(|&p| !alive(p)));
    assert_eq!(segments_of(&pids), Vec::<String>::new());
}

#[test]
fn the_header_and_transport_line_say_which_transport_ran() {
    for (transport, says) in [
        ("shm", "shared memory between the 2 ranks of this host"),
        ("tcp", "requested"),
        ("auto", "shared memory between the 2 ranks of this host"),
    ] {
        let out = comm_bench()
            .args(["--backend", "cpu", "--transport", transport])
            .args([
                "--world-sizes",
                "2",
                "-b",
                "1M",
                "-e",
                "1M",
                "-n",
                "2",
                "-w",
                "1",
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{transport}: {stdout}");
        let name = if transport == "tcp" { "tcp" } else { "shm" };
        let line = format!("transport: {name} ({says})");
        assert_eq!(stdout.lines().nth(1), Some(line.as_str()), "{stdout}");
        // One host: the communicator's buffers are registered and the header says from which
        // size all_reduce reads them (`--copy auto`'s measured bound).
        let header = match name {
            "tcp" => "backend cpu (tcp transport (comm-core".to_string(),
            _ => format!("backend cpu ({name} transport, registered buffers from 8K (comm-core"),
        };
        assert!(stdout.contains(&header), "{header} in:\n{stdout}");
        assert!(stdout.contains("# Wrong elements       : 0 OK"), "{stdout}");
    }
}

/// Runs `comm-bench args` with a /dev/shm of 6 MB of its own (a mount namespace, as a container
/// with a small `--shm-size` has); `None` where this machine lets no test mount one.
fn with_small_dev_shm(args: &[&str]) -> Option<std::process::Output> {
    let probe = Command::new("unshare")
        .args([
            "--mount",
            "sh",
            "-c",
            "mount -t tmpfs -o size=6M tmpfs /dev/shm",
        ])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: unshare --mount cannot mount a small /dev/shm here (not root?)");
        return None;
    }
    let script = r#"mount -t tmpfs -o size=6M tmpfs /dev/shm && exec "$@""#;
    let mut c = Command::new("unshare");
    c.args(["--mount", "sh", "-c", script, "sh"])
        .arg(env!("CARGO_BIN_EXE_comm-bench"))
        .args(args)
        .plainly();
    Some(c.output().unwrap())
}

/// Registered buffers live in /dev/shm: where it is too small, `--copy registered` ends the job
/// with the rings' message and the size asked for; `--copy auto` warns once and runs the
/// buffers that do not fit through the rings.
#[test]
fn a_dev_shm_too_small_for_registered_buffers_says_how_much() {
    let args = |copy| {
        [
            "--backend",
            "cpu",
            "--world-sizes",
            "2",
            "--copy",
            copy,
            "--collectives",
            "all_reduce",
            "-b",
            "8M",
            "-e",
            "8M",
            "-n",
            "2",
            "-w",
            "1",
            "--timeout",
            "30",
        ]
    };
    let Some(out) = with_small_dev_shm(&args("registered")) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("creating 8196 KiB in /dev/shm for a registered buffer of 8 MiB failed")
            && stderr.contains("No space left on device")
            && stderr.contains("docker run --shm-size raises it"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let out = with_small_dev_shm(&args("auto")).unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("# Wrong elements       : 0 OK"), "{stdout}");
    assert!(
        stderr.contains("warning: ") && stderr.contains("through the rings"),
        "{stderr}"
    );
}
