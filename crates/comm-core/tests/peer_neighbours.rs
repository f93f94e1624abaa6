//! A rank's peer port on a shared node: other people's connections, other jobs' ranks, and
//! peers that stop or trickle. A silent connection does not delay the job, a rank of another run
//! or a rank that is taken is refused at once and named (when it dials: links open as a pair
//! first talks), and `--timeout` is one deadline per collective call that a stopped (SIGSTOP) or
//! trickling peer cannot stretch.
//!
//! All traffic stays on 127.0.0.1. This test binary is also its own helper process: re-executed
//! with `PEER_SCENARIO` set, the test function plays a rank instead of checking.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use comm_core::backend::cpu::{TcpTransport, Transport};
use comm_core::launch::run_settings;
use comm_core::settings::{timeout_flag, MAX_TIMEOUT};
use comm_core::store::{Store, StoreServer};
use comm_core::Settings;
use comm_core::{BackendChoice, CommError, Communicator, ReduceOp};
use test_support::process::{assert_all_gone, scratch, start, wait_for_pid_files, Plainly};

fn store(server: &StoreServer, rank: usize, world: usize, timeout: Duration) -> Store {
    Store::connect("127.0.0.1", server.port(), rank, world, timeout).unwrap()
}

/// The peer address `rank` published under `prefix`.
fn peer_addr(store: &Store, prefix: &str, rank: usize) -> String {
    String::from_utf8(store.get(&format!("{prefix}/addr/{rank}")).unwrap()).unwrap()
}

/// A peer hello as the wire carries it (see `backend/cpu/tcp/hello.rs`), from host `here`.
fn hello(rank: u32, world: u32, run: &str) -> Vec<u8> {
    let mut out = b"NCW3".to_vec();
    out.extend_from_slice(&rank.to_le_bytes());
    out.extend_from_slice(&world.to_le_bytes());
    for text in [run, "here"] {
        out.extend_from_slice(&(text.len() as u16).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    out
}

/// Rank `rank` of `world` ranks' transport under `prefix`, with run id `run`.
fn transport(
    server: &StoreServer,
    prefix: &str,
    (rank, world): (usize, usize),
    run: Option<&str>,
    timeout: Duration,
) -> Result<TcpTransport, CommError> {
    let store = store(server, rank, 2, timeout);
    TcpTransport::connect(&store.scoped(prefix), rank, world, run, timeout)
}

#[test]
fn a_silent_connection_does_not_delay_the_job() {
    let server = StoreServer::bind(0, 2).unwrap();
    let timeout = Duration::from_secs(10);
    std::thread::scope(|s| {
        let rank0 = s.spawn(|| {
            let t = TcpTransport::connect(
                &store(&server, 0, 2, timeout).scoped("p"),
                0,
                2,
                Some("r"),
                timeout,
            )
            .unwrap();
            let comm = Communicator::cpu(Box::new(t), 0);
            let mut buf = comm.buffer(&[1.0f32; 4]).unwrap();
            comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
            comm.to_host(&buf).unwrap()
        });
        let store1 = store(&server, 1, 2, timeout);
        let addr = peer_addr(&store1, "p", 0);
        // Ahead of the real rank 1: three connections that say nothing, one that speaks
        // another protocol, one that gives up halfway through the magic.
        let mut strangers: Vec<TcpStream> =
            (0..5).map(|_| TcpStream::connect(&addr).unwrap()).collect();
        strangers[3].write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        strangers[4].write_all(b"NC").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let started = Instant::now();
        let t = TcpTransport::connect(&store1.scoped("p"), 1, 2, Some("r"), timeout).unwrap();
        let took = started.elapsed();
        eprintln!("rendezvous behind 5 strangers: {took:?}");
        // Before: each silent connection held rank 0 for the whole timeout (3 × 10 s here).
        assert!(
            took < Duration::from_millis(1500),
            "rendezvous took {took:?}"
        );
        let comm = Communicator::cpu(Box::new(t), 0);
        let mut buf = comm.buffer(&[2.0f32; 4]).unwrap();
        comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        assert_eq!(comm.to_host(&buf).unwrap(), [3.0; 4]);
        assert_eq!(rank0.join().unwrap(), [3.0; 4]);
        // Rank 0 dropped the strangers: they read the end, not silence.
        for mut stranger in strangers {
            stranger
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut byte = [0u8; 1];
            match stranger.read(&mut byte) {
                Ok(0) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                other => panic!("a stranger was not dropped: {other:?}"),
            }
        }
    });
}

#[test]
fn a_peer_from_another_run_is_refused_naming_both_runs() {
    let server = StoreServer::bind(0, 2).unwrap();
    let timeout = Duration::from_secs(10);
    let (zero, one) = std::thread::scope(|s| {
        let server = &server;
        let zero = s.spawn(move || transport(server, "x", (0, 2), Some("job-a"), timeout));
        let one = transport(server, "x", (1, 2), Some("job-b"), timeout).unwrap();
        (zero.join().unwrap().unwrap(), one)
    });
    // Rank 1 talks first: its dial is refused, and rank 0 has failed by the time it hears so.
    let started = Instant::now();
    let refused = one.send(0, &[0u8; 4]).unwrap_err();
    assert!(
        refused.to_string().contains("refused rank 1's connection"),
        "{refused}"
    );
    let err = zero.recv(1, &mut [0u8; 4]).unwrap_err();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "refusing took {took:?}");
    eprintln!("another run, after {took:?}: {err}");
    match &err {
        CommError::ForeignPeer {
            rank: 0,
            claimed: 1,
            their_run,
            our_run,
            from,
            ..
        } => {
            assert_eq!(their_run.as_deref(), Some("job-b"));
            assert_eq!(our_run.as_deref(), Some("job-a"));
            assert!(from.starts_with("127.0.0.1:"), "{from}");
        }
        other => panic!("{other:?}"),
    }
    let message = err.to_string();
    for fact in [
        "rank 0 refused",
        "127.0.0.1:",
        "'job-a'",
        "'job-b'",
        "MASTER_PORT",
    ] {
        assert!(message.contains(fact), "{fact:?} not in: {message}");
    }
    assert_eq!(err.kind(), "foreign_peer");
    assert_eq!(
        err.blamed_rank(),
        None,
        "the culprit is not a rank of this job"
    );
}

#[test]
fn without_a_run_id_on_one_side_run_ids_are_not_compared() {
    let server = StoreServer::bind(0, 2).unwrap();
    let timeout = Duration::from_secs(10);
    std::thread::scope(|s| {
        let handles: Vec<_> = [(0, None), (1, Some("by-launcher"))]
            .into_iter()
            .map(|(rank, run)| {
                let server = &server;
                s.spawn(move || {
                    let t = transport(server, "h", (rank, 2), run, timeout).unwrap();
                    let comm = Communicator::cpu(Box::new(t), rank);
                    let mut buf = comm.buffer(&[1.0f32; 4]).unwrap();
                    comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}

#[test]
fn a_rank_that_is_already_connected_is_refused() {
    // Two by-hand jobs: both their ranks 1 dial job A's rank 0. (Through one store the second
    // rank 1 would be refused by the store itself, so job B's rank 1 meets at a store of its
    // own that was told job A's peer address.)
    let server = StoreServer::bind(0, 2).unwrap();
    let server_b = StoreServer::bind(0, 2).unwrap();
    let timeout = Duration::from_secs(3);
    let store0 = store(&server, 0, 2, timeout);
    let (zero, job_a) = std::thread::scope(|s| {
        let zero = s.spawn(|| TcpTransport::connect(&store0.scoped("d"), 0, 2, None, timeout));
        let job_a = transport(&server, "d", (1, 2), None, timeout).unwrap();
        (zero.join().unwrap().unwrap(), job_a)
    });
    let store_b = store(&server_b, 1, 2, timeout);
    store_b
        .set("d/addr/0", &store0.get("d/addr/0").unwrap())
        .unwrap();
    let job_b = TcpTransport::connect(&store_b.scoped("d"), 1, 2, None, timeout).unwrap();
    // Job A's rank 1 talks first and is let in; then job B's.
    job_a.send(0, &[1u8; 4]).unwrap();
    let started = Instant::now();
    let refused = job_b.send(0, &[2u8; 4]).unwrap_err();
    assert!(
        refused.to_string().contains("refused rank 1's connection"),
        "{refused}"
    );
    let err = zero
        .recv(1, &mut [0u8; 4])
        .expect_err("rank 0 must refuse the second rank 1");
    let took = started.elapsed();
    eprintln!("duplicate rank, after {took:?}: {err}");
    assert!(took < Duration::from_secs(2), "refusing took {took:?}");
    assert!(
        matches!(
            err,
            CommError::ForeignPeer {
                rank: 0,
                claimed: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("rank 1, which is already connected"),
        "{err}"
    );
}

#[test]
fn a_peer_of_another_world_size_is_refused() {
    let server = StoreServer::bind(0, 2).unwrap();
    let timeout = Duration::from_secs(3);
    let started = Instant::now();
    let zero = std::thread::scope(|s| {
        let server = &server;
        // Rank 1 says 3 ranks: its transport waits for rank 2's address, which never comes.
        let one = s.spawn(move || transport(server, "w", (1, 3), None, timeout));
        let zero = transport(server, "w", (0, 2), None, timeout).unwrap();
        let mut buf = [0u8; 4];
        let err = zero.recv(1, &mut buf).unwrap_err();
        let took = started.elapsed();
        eprintln!("world size, after {took:?}: {err}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        // Rank 1 refused rank 0's dial, and said why.
        let why = "claiming to be rank 0 of a job of 2 ranks, but this job has 3";
        assert!(
            err.to_string().contains("refused rank 0's connection")
                && err.to_string().contains(why),
            "{err}"
        );
        // That, not its wait for rank 2, is what rank 1 reports.
        let one = one.join().unwrap().err().expect("rank 1 fails too");
        assert!(
            one.to_string()
                .contains("a job of 2 ranks, but this job has 3"),
            "{one}"
        );
        zero
    });
    drop(zero);
}

/// Rank 1 as a process of its own, so that it can be stopped: connects, records its pid, then
/// starts a large all_reduce that rank 0 will not find it in.
fn stopped_rank(dir: &Path) -> ! {
    let port: u16 = std::env::var("STORE_PORT").unwrap().parse().unwrap();
    let store = Store::connect("127.0.0.1", port, 1, 2, Duration::from_secs(20)).unwrap();
    std::fs::write(dir.join("1"), std::process::id().to_string()).unwrap();
    let t =
        TcpTransport::connect(&store.scoped("stop"), 1, 2, None, Duration::from_secs(20)).unwrap();
    let comm = Communicator::cpu(Box::new(t), 0);
    let mut buf = comm.buffer(&vec![1.0f32; 4 << 20]).unwrap();
    let _ = comm.all_reduce(&mut buf, ReduceOp::Sum);
    std::process::exit(0)
}

#[test]
fn a_stopped_peer_is_reported_within_the_timeout() {
    if std::env::var("PEER_SCENARIO").as_deref() == Ok("stopped") {
        stopped_rank(Path::new(&std::env::var("PID_DIR").unwrap()));
    }
    let dir = scratch("stopped-peer");
    let server = StoreServer::bind(0, 2).unwrap();
    let child = start(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "a_stopped_peer_is_reported_within_the_timeout",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("PEER_SCENARIO", "stopped")
            .env("PID_DIR", &dir)
            .env("STORE_PORT", server.port().to_string()),
    );
    let pid = wait_for_pid_files(&dir, 1..2, Duration::from_secs(20))[0];
    let timeout = Duration::from_secs(2);
    let t = TcpTransport::connect(
        &store(&server, 0, 2, timeout).scoped("stop"),
        0,
        2,
        None,
        timeout,
    )
    .unwrap();
    child.signal(libc::SIGSTOP);
    let comm = Communicator::cpu(Box::new(t), 0);
    // 16 MiB: the ring's sends fill the socket buffers of the stopped rank and block.
    let mut buf = comm.buffer(&vec![1.0f32; 4 << 20]).unwrap();
    let started = Instant::now();
    let err = comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
    let took = started.elapsed();
    child.kill(); // SIGKILL ends a stopped process too, and reaps it
    eprintln!("stopped peer, after {took:?}: {err}");
    assert_all_gone(&[pid]);
    // Before: about 2.2 × the timeout (a per-read timeout, then the send thread's own).
    assert!(
        took >= timeout - Duration::from_millis(100) && took < timeout + Duration::from_secs(2),
        "reported after {took:?}: {err}"
    );
    assert!(
        err.to_string()
            .contains("timed out after 2s waiting for rank 1"),
        "{err}"
    );
    assert_eq!(err.blamed_rank(), Some(1), "{err:?}");
    // The transport stays failed with that first error, at once.
    let started = Instant::now();
    let again = comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(500));
    assert_eq!(again.to_string(), err.to_string());
}

#[test]
fn a_trickling_peer_does_not_extend_the_deadline() {
    let server = StoreServer::bind(0, 2).unwrap();
    let timeout = Duration::from_secs(2);
    std::thread::scope(|s| {
        let server = &server;
        // Rank 1 speaks the protocol by hand: a hello, then one byte every 0.5 s of a message
        // of the right size (8 bytes of length, 16 of payload): it would arrive whole after
        // 12 s, and each byte restarted a per-read timeout.
        let (dialled, linked) = std::sync::mpsc::channel();
        s.spawn(move || {
            let store1 = store(server, 1, 2, Duration::from_secs(10));
            // An address for rank 0's transport to read; rank 1 dials before rank 0 talks.
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let own = listener.local_addr().unwrap().to_string();
            store1.set("tr/addr/1", own.as_bytes()).unwrap();
            let mut stream = TcpStream::connect(peer_addr(&store1, "tr", 0)).unwrap();
            stream.write_all(&hello(1, 2, "")).unwrap();
            // Rank 0's hello (its host name is this machine's), then the verdict.
            let mut head = [0u8; 16];
            stream.read_exact(&mut head).unwrap();
            assert_eq!(&head[..4], b"NCW3");
            let host = u16::from_le_bytes([head[14], head[15]]) as usize;
            let mut rest = vec![0u8; host + 3];
            stream.read_exact(&mut rest).unwrap();
            assert_eq!(rest[host], 0, "accepted");
            dialled.send(()).unwrap();
            let mut message = 16u64.to_le_bytes().to_vec();
            message.extend_from_slice(&[0u8; 16]);
            for byte in message {
                if stream.write_all(&[byte]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        let t = TcpTransport::connect(
            &store(server, 0, 2, timeout).scoped("tr"),
            0,
            2,
            None,
            timeout,
        )
        .unwrap();
        linked.recv().unwrap();
        let started = Instant::now();
        let mut out = [0u8; 16];
        let err = t.recv(1, &mut out).unwrap_err();
        let took = started.elapsed();
        eprintln!("trickling peer, after {took:?}: {err}");
        assert!(
            took < timeout + Duration::from_secs(2),
            "reported after {took:?}: {err}"
        );
        assert!(
            err.to_string()
                .contains("timed out after 2s waiting for rank 1"),
            "{err}"
        );
        // The failure shut the link: the trickler's writes fail and its thread ends.
    });
}

/// A whole self-spawned job with `--timeout 1e19`.
fn huge_timeout_job() -> ! {
    let settings = Settings {
        ranks: Some(2),
        backend: BackendChoice::Cpu,
        timeout: timeout_flag(1e19).unwrap(),
        ..Settings::default()
    };
    let code = run_settings(&settings, |comm| {
        let mut buf = comm.buffer(&[1.0f32; 8])?;
        comm.all_reduce(&mut buf, ReduceOp::Sum)?;
        assert_eq!(comm.to_host(&buf)?, [2.0; 8]);
        Ok(())
    });
    std::process::exit(code)
}

#[test]
fn a_timeout_too_long_to_represent_does_not_panic() {
    if std::env::var("PEER_SCENARIO").as_deref() == Ok("huge-timeout") {
        huge_timeout_job();
    }
    assert_eq!(timeout_flag(1e19).unwrap(), MAX_TIMEOUT);
    assert_eq!(timeout_flag(2.5).unwrap(), Duration::from_millis(2500));
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0, 0.0] {
        let err = timeout_flag(bad).unwrap_err();
        assert_eq!(err.kind(), "usage", "{bad}: {err}");
    }
    let finished = start(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "a_timeout_too_long_to_represent_does_not_panic",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("PEER_SCENARIO", "huge-timeout")
            .plainly(),
    )
    .finish(Duration::from_secs(60));
    finished.assert_success("a job with --timeout 1e19");
    assert!(!finished.stderr.contains("panicked"), "{}", finished.stderr);
}
