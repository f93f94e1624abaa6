//! Our rendezvous store and PyTorch's are one protocol: the real `torch.distributed.TCPStore`
//! reads a live job's keys (as the book's engineering notes show), talks to our server command by command, and
//! serves a store our ranks meet at (as torchrun's agent does). Without torch these tests say they
//! skipped, unless NCCL_WORKSHOP_REQUIRE_TORCH=1.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use comm_core::store::{Store, StoreServer};
use test_support::build::{the_one_build, workspace_root};
use test_support::grid::{expect_cells, Grid};
use test_support::process::{start, Plainly};
use test_support::torch::{or_skip, Torch};

/// Runs `script` with torch's Python, with `args`; its stdout, or the test fails with both.
fn python(torch: &Torch, script: &str, args: &[&str]) -> String {
    let out = Command::new(torch.python())
        .arg("-c")
        .arg(script)
        .args(args)
        .env("PYTHONWARNINGS", "ignore")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "python failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The book's page that shows the store session (the 00 chapter links to it).
const PAGE: &str = "docs/src/engineering-notes.md";

/// The bash block of [`PAGE`] that follows `marker`, as written.
fn book_block(marker: &str) -> String {
    let chapter = std::fs::read_to_string(workspace_root().join(PAGE)).unwrap();
    let after = chapter
        .split_once(marker)
        .unwrap_or_else(|| panic!("{PAGE} has no {marker}"))
        .1;
    let body = after
        .split_once("```bash\n")
        .expect("a bash block after the marker")
        .1;
    body.split_once("```")
        .expect("the block's end")
        .0
        .to_string()
}

#[test]
fn python_reads_a_live_jobs_keys_as_the_book_shows() {
    let Some(torch) = or_skip("python_reads_a_live_jobs_keys_as_the_book_shows") else {
        return;
    };
    let bin = the_one_build();
    // The chapter's commands, run by bash from the repository root as a reader types them
    // (its binaries are wherever this test's build put them).
    let block = book_block("<!-- run by tests/store_from_python.rs -->")
        .replace("target/release/", &format!("{}/", bin.display()));
    let mut command = Command::new("bash");
    command
        .args(["-euo", "pipefail", "-c", &block])
        .env("PATH", torch.path())
        .current_dir(workspace_root())
        .plainly();
    let done = start(&mut command).finish(Duration::from_secs(120));
    done.assert_success("the book's store session");
    let out = &done.stdout;
    // While ranks 0-2 wait for rank 3, Python sees the job as they wrote it.
    assert!(out.contains("  job/world_size     4\n"), "{out}");
    for rank in 0..3 {
        let claim = format!("  job/rank/{rank}         '127.0.0.1:");
        assert!(out.contains(&claim), "{claim}: {out}");
    }
    assert!(
        out.contains("  job/rank/3         (not joined yet)"),
        "{out}"
    );
    assert!(
        out.contains("comm0/backend                    by rank 0: '"),
        "{out}"
    );
    assert!(out.contains("NCCL's unique Id: "), "{out}");
    // Then rank 3 arrives and all four finish.
    for rank in 0..4 {
        assert!(
            out.contains(&format!("Hello from rank {rank} of 4")),
            "{out}"
        );
    }
}

/// Every command of TCPStore, from torch's client to our server, and the keys each side wrote
/// read by the other.
const TORCH_CLIENT: &str = r#"
import sys
from datetime import timedelta
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=timedelta(seconds=10))
print("ours:", s.get("from/rust").decode())
s.set("from/python", "hello rust")
assert s.add("counter", 5) == 5 and s.add("counter", -2) == 3
assert s.get("counter") == b"3"
assert s.compare_set("cs", "", "first") == b"first"
assert s.compare_set("cs", "wrong", "second") == b"first"
assert s.compare_set("cs", "first", "second") == b"second"
assert s.check(["cs", "counter"]) and not s.check(["missing"])
s.append("log", "a"); s.append("log", "bc")
assert s.get("log") == b"abc"
s.multi_set(["m/1", "m/2"], ["one", "two"])
assert s.multi_get(["m/2", "m/1"]) == [b"two", b"one"]
assert s.delete_key("m/1") and not s.delete_key("m/1")
s.wait(["cs"])
try:
    s.wait(["never"], timedelta(milliseconds=200))
    raise SystemExit("a wait for a missing key returned")
except dist.DistStoreError as e:
    print("timed out as expected:", "wait timeout" in str(e))
s.set("after/timeout", "still talking")
print("keys:", s.num_keys())
"#;

#[test]
fn torchs_client_and_our_server_speak_one_protocol() {
    let Some(torch) = or_skip("torchs_client_and_our_server_speak_one_protocol") else {
        return;
    };
    let server = StoreServer::bind(0, 1).unwrap();
    let ours = Store::connect("127.0.0.1", server.port(), 0, 1, Duration::from_secs(10)).unwrap();
    ours.set("from/rust", b"hello python").unwrap();
    let out = python(&torch, TORCH_CLIENT, &[&server.port().to_string()]);
    assert!(out.contains("ours: hello python"), "{out}");
    assert!(out.contains("timed out as expected: True"), "{out}");
    assert_eq!(ours.get("from/python").unwrap(), b"hello rust");
    assert_eq!(ours.get("cs").unwrap(), b"second");
    assert_eq!(ours.add("counter", 0).unwrap(), 3);
    assert_eq!(ours.get("after/timeout").unwrap(), b"still talking");
    assert!(!ours.check(&["m/1"]).unwrap());
}

/// A store served by torch, as torchrun's agent serves one: prints its port, then on a line from
/// stdin reads what our ranks wrote under `/worker/attempt_0`, as torch's own workers would.
const TORCH_SERVER: &str = r#"
import sys
from datetime import timedelta
import torch.distributed as dist
master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
print(master.port, flush=True)
sys.stdin.readline()
job = dist.PrefixStore("/worker/attempt_0", master)
print("world_size", job.get("job/world_size").decode())
print("backend", job.get("comm0/backend").decode())
for line in job.get("job/keys").decode().splitlines():
    print("index", line)
print("done", flush=True)
"#;

#[test]
fn our_ranks_meet_at_a_store_torch_serves() {
    let Some(torch) = or_skip("our_ranks_meet_at_a_store_torch_serves") else {
        return;
    };
    let bin = the_one_build();
    let mut server = Command::new(torch.python())
        .args(["-c", TORCH_SERVER])
        .env("PYTHONWARNINGS", "ignore")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let port = lines.next().unwrap().unwrap();
    // Four ranks as torchrun starts them when its agent serves the store.
    let ranks: Vec<_> = (0..4)
        .map(|rank| {
            let mut command = Command::new(bin.join("01-broadcast"));
            command
                .plainly()
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "4")
                .env("LOCAL_RANK", rank.to_string())
                .env("LOCAL_WORLD_SIZE", "4")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("TORCHELASTIC_USE_AGENT_STORE", "True")
                .env("TORCHELASTIC_RESTART_COUNT", "0");
            start(&mut command)
        })
        .collect();
    let mut outputs: Vec<String> = Vec::new();
    for (rank, running) in ranks.into_iter().enumerate() {
        let done = running.finish(Duration::from_secs(60));
        done.assert_success(&format!("rank {rank}"));
        outputs.push(done.stdout);
    }
    let rows = Grid::titled("After broadcast:").read(&outputs[0]);
    expect_cells(&rows, 4, 4, |_| "42");
    // What they wrote is in torch's store, under torch's own worker prefix.
    let mut stdin = server.stdin.take().unwrap();
    writeln!(stdin).unwrap();
    let read: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(server.wait().unwrap().success(), "{read:?}");
    assert!(read.contains(&"world_size 4".to_string()), "{read:?}");
    assert!(read.iter().any(|l| l.starts_with("backend ")), "{read:?}");
    assert!(
        read.contains(&"index 0 comm0/backend".to_string()),
        "{read:?}"
    );
    assert_eq!(read.last().map(String::as_str), Some("done"));
}
