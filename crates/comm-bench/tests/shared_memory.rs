//! The shared-memory transport as a user meets it: comm-bench's ranks on one host move bytes
//! through /dev/shm segments whose names are gone while the job runs, a rank killed with
//! `kill -9` mid-collective ends the job with an error naming it, and nothing is left behind:
//! no process and no segment. The header and the transport line say which transport ran.

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
    let job = start(comm_bench().args([
        "--backend",
        "cpu",
        "--transport",
        "shm",
        "--world-sizes",
        "3",
        "--collectives",
        "all_reduce",
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
            "the 3 ranks never mapped shared memory: {ranks:?}"
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
        "the job took {:?} to end after rank 1 was killed",
        killed_at.elapsed()
    );
    assert!(
        finished.stderr.contains("rank 1"),
        "the error names the killed rank:\n{}",
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
        let header = format!("backend cpu ({name} transport (comm-core");
        assert!(stdout.contains(&header), "{header} in:\n{stdout}");
        assert!(stdout.contains("# Wrong elements       : 0 OK"), "{stdout}");
    }
}
