//! Errors carry their facts (missing ranks, the lost store), failed ranks write them as records at
//! `TORCHELASTIC_ERROR_FILE`, and self-spawn picks the root cause from those records.
//!
//! This test binary is also its own distributed program: re-executed with `ROOT_CAUSE_ROLE` set,
//! it is the spawning parent (printing what `spawn::run` returned) or, with `RANK` set, a rank.

use std::process::{Command, Stdio};
use std::time::Duration;

use comm_core::launch::run_settings;
use comm_core::spawn::{self, Outcome, SpawnPlan};
use comm_core::store::{Store, StoreServer};
use comm_core::Settings;
use comm_core::{BackendChoice, CommError, ReduceOp};
use test_support::process::Plainly;

fn client(server: &StoreServer, rank: usize, world: usize, timeout_ms: u64) -> Store {
    let timeout = Duration::from_millis(timeout_ms);
    Store::connect("127.0.0.1", server.port(), rank, world, timeout).unwrap()
}

#[test]
fn a_store_timeout_names_the_ranks_that_never_connected() {
    let server = StoreServer::bind(0, 4).unwrap();
    let a = client(&server, 0, 4, 300);
    let _c = client(&server, 2, 4, 300);
    let err = a.get("nccl_id").unwrap_err();
    assert!(err.to_string().contains("never connected: 1, 3"), "{err}");
    assert_eq!(err.missing_ranks(), [1, 3], "{err:?}");
    assert_eq!(err.blamed_rank(), None);
}

#[test]
fn a_barrier_timeout_names_the_missing_ranks() {
    let server = StoreServer::bind(0, 3).unwrap();
    let stores: Vec<Store> = (0..3).map(|r| client(&server, r, 3, 300)).collect();
    let err = stores[2].barrier("alone").unwrap_err();
    assert!(err.to_string().contains("missing: ranks 0, 1"), "{err}");
    assert_eq!(err.missing_ranks(), [0, 1], "{err:?}");
    // One missing rank is the one blamed (fresh stores: barriers count per connection).
    let server = StoreServer::bind(0, 3).unwrap();
    let stores: Vec<Store> = (0..3).map(|r| client(&server, r, 3, 300)).collect();
    std::thread::scope(|s| {
        s.spawn(|| stores[0].barrier("pair").unwrap_err());
        let err = stores[2].barrier("pair").unwrap_err();
        assert_eq!(err.missing_ranks(), [1], "{err:?}");
        assert_eq!(err.blamed_rank(), Some(1), "{err:?}");
    });
}

#[test]
fn a_store_that_is_not_there_is_named() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = Store::connect("127.0.0.1", port, 1, 2, Duration::from_millis(200))
        .err()
        .unwrap();
    assert!(
        matches!(err, CommError::StoreUnreachable { rank: 1, .. }),
        "{err:?}"
    );
    assert_eq!(err.lost_store(), Some(format!("127.0.0.1:{port}").as_str()));
    assert!(
        err.to_string()
            .contains("could not reach the rendezvous store"),
        "{err}"
    );
}

/// A rank of the job below: rank 1 fails on purpose, the others wait for it in a collective.
fn as_rank() -> ! {
    let settings = Settings {
        ranks: Some(3),
        backend: BackendChoice::Cpu,
        timeout: Duration::from_secs(20),
        ..Settings::default()
    };
    let code = run_settings(&settings, |comm| {
        if comm.rank() == 1 {
            std::thread::sleep(Duration::from_millis(200));
            return Err(CommError::Usage("rank 1 fails on purpose".into()));
        }
        let mut buf = comm.buffer(&vec![1.0f32; 1 << 10])?;
        comm.all_reduce(&mut buf, ReduceOp::Sum)
    });
    std::process::exit(code)
}

/// The spawning parent: starts the ranks and prints the root cause it found, and whether the
/// records' directory is gone.
fn as_parent(test: &str) -> ! {
    let plan = SpawnPlan {
        program: std::env::current_exe().unwrap(),
        args: [test, "--exact", "--nocapture", "--test-threads=1"]
            .iter()
            .map(Into::into)
            .collect(),
        nproc_per_node: 3,
        nnodes: 1,
        node_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: spawn::free_port().unwrap(),
        prefix_output: true,
        grace: Duration::from_secs(3),
        run_id: None,
    };
    let outcome = spawn::run(&plan).unwrap();
    let Outcome::Failed(failure) = outcome else {
        panic!("expected a failure, got {outcome:?}")
    };
    let record = failure.record.expect("the root cause wrote a record");
    println!("ROOT rank={}", failure.rank);
    println!("ROOT record.rank={:?}", record.rank);
    println!("ROOT record.kind={:?}", record.kind);
    println!("ROOT record.message={}", record.message.message);
    let prefix = format!("comm-core-errors-{}-", std::process::id());
    let left = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .count();
    println!("ROOT dirs left={left}");
    std::process::exit(0)
}

#[test]
fn spawn_takes_the_root_cause_from_the_records() {
    const TEST: &str = "spawn_takes_the_root_cause_from_the_records";
    if std::env::var_os("ROOT_CAUSE_ROLE").is_some() {
        if std::env::var_os("RANK").is_some() {
            as_rank();
        }
        as_parent(TEST);
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env("ROOT_CAUSE_ROLE", "parent")
        .plainly()
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(out.status.success(), "{all}");
    assert!(stdout.contains("ROOT rank=1\n"), "{all}");
    assert!(stdout.contains("ROOT record.rank=Some(1)\n"), "{all}");
    assert!(
        stdout.contains("ROOT record.kind=Some(\"usage\")\n"),
        "{all}"
    );
    assert!(
        stdout.contains("ROOT record.message=rank 1 fails on purpose\n"),
        "{all}"
    );
    assert!(stdout.contains("ROOT dirs left=0\n"), "{all}");
    // The rank's own line is unchanged.
    assert!(
        stderr.contains("[1]: error: rank 1: rank 1 fails on purpose"),
        "{all}"
    );
}
