//! The store against real sockets: values, waits and their timeouts, many clients at once, the
//! protocol's every command, and peers that send garbage.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::wire::{self, query, Command};
use super::{Store, StoreServer};
use crate::error::CommError;

fn client(server: &StoreServer, rank: usize, world: usize, timeout_ms: u64) -> Store {
    Store::connect(
        "127.0.0.1",
        server.port(),
        rank,
        world,
        Duration::from_millis(timeout_ms),
    )
    .unwrap()
}

#[test]
fn set_get_add_check_delete() {
    let server = StoreServer::bind(0, 2).unwrap();
    let a = client(&server, 0, 2, 5000);
    let b = client(&server, 1, 2, 5000);
    a.set("k", b"value").unwrap();
    assert_eq!(b.get("k").unwrap(), b"value");
    assert_eq!(a.add("n", 5).unwrap(), 5);
    assert_eq!(b.add("n", -2).unwrap(), 3);
    // ADD keeps a decimal ASCII number, as PyTorch's does.
    assert_eq!(a.get("n").unwrap(), b"3");
    assert!(a.check(&["k", "n"]).unwrap());
    assert!(!a.check(&["k", "missing"]).unwrap());
    assert!(a.delete("k").unwrap());
    assert!(!a.delete("k").unwrap());
    a.set("empty", b"").unwrap();
    assert_eq!(b.get("empty").unwrap(), b"");
}

#[test]
fn the_other_commands_of_tcpstore() {
    let server = StoreServer::bind(0, 1).unwrap();
    let a = client(&server, 0, 1, 5000);
    // compare_set: an unset key takes the new value only when nothing is expected.
    assert_eq!(a.compare_set("cs", b"x", b"y").unwrap(), b"x");
    assert!(!a.check(&["cs"]).unwrap());
    assert_eq!(a.compare_set("cs", b"", b"first").unwrap(), b"first");
    assert_eq!(a.compare_set("cs", b"wrong", b"second").unwrap(), b"first");
    assert_eq!(a.compare_set("cs", b"first", b"second").unwrap(), b"second");
    a.append("log", b"a").unwrap();
    a.append("log", b"bc").unwrap();
    assert_eq!(a.get("log").unwrap(), b"abc");
    a.multi_set(&[("m/1", b"one"), ("m/2", b"two")]).unwrap();
    assert_eq!(
        a.multi_get(&["m/2", "m/1"]).unwrap(),
        vec![b"two".to_vec(), b"one".to_vec()]
    );
    // The seeded world size, this rank's claim, cs, log, m/1, m/2.
    assert_eq!(a.num_keys().unwrap(), 6);
}

#[test]
fn get_waits_for_a_later_set() {
    let server = StoreServer::bind(0, 2).unwrap();
    let a = client(&server, 0, 2, 5000);
    let b = client(&server, 1, 2, 5000);
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            a.set("late", b"here").unwrap();
        });
        assert_eq!(b.get("late").unwrap(), b"here");
        b.wait(&["late"]).unwrap();
    });
}

#[test]
fn a_wait_times_out_naming_the_key_and_the_ranks_and_the_connection_goes_on() {
    let server = StoreServer::bind(0, 4).unwrap();
    let a = client(&server, 0, 4, 300);
    let _c = client(&server, 2, 4, 300);
    let started = Instant::now();
    let err = a.get("nccl_id").unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, CommError::Timeout { .. }), "{err:?}");
    assert_eq!(err.missing_ranks(), [1, 3]);
    let message = err.to_string();
    assert!(message.contains("key 'nccl_id'"), "{message}");
    assert!(
        message.contains("ranks connected to the store: 0, 2 of 4"),
        "{message}"
    );
    assert!(message.contains("never connected: 1, 3"), "{message}");
    // The wait was cancelled (CANCEL_WAIT), so a later set does not confuse the connection.
    a.set("nccl_id", b"id").unwrap();
    assert_eq!(a.get("nccl_id").unwrap(), b"id");
    assert_eq!(a.add("after", 1).unwrap(), 1);
}

#[test]
fn a_barrier_times_out_naming_who_is_missing() {
    let server = StoreServer::bind(0, 3).unwrap();
    let stores: Vec<Store> = (0..3).map(|r| client(&server, r, 3, 400)).collect();
    // All three meet once.
    std::thread::scope(|s| {
        for store in &stores {
            s.spawn(move || store.barrier("first").unwrap());
        }
    });
    // Rank 1 never comes to the second.
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = [0, 2]
            .iter()
            .map(|&r| {
                let store = &stores[r];
                s.spawn(move || store.barrier("second").unwrap_err().to_string())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for message in errors {
        assert!(message.contains("barrier 'second'"), "{message}");
        assert!(
            message.contains("arrived: ranks 0, 2 of 3; missing: ranks 1"),
            "{message}"
        );
    }
}

#[test]
fn many_clients_at_once() {
    let server = StoreServer::bind(0, 64).unwrap();
    let clients: Vec<Store> = (0..64).map(|r| client(&server, r, 64, 10_000)).collect();
    std::thread::scope(|s| {
        for (rank, store) in clients.iter().enumerate() {
            s.spawn(move || {
                for _ in 0..50 {
                    store.add("counter", 1).unwrap();
                }
                store.set(&format!("done/{rank}"), &[rank as u8]).unwrap();
                store.barrier("all").unwrap();
            });
        }
    });
    assert_eq!(clients[0].add("counter", 0).unwrap(), 64 * 50);
    for rank in 0..64 {
        assert_eq!(
            clients[63].get(&format!("done/{rank}")).unwrap(),
            [rank as u8]
        );
    }
}

/// A raw TCPStore connection, validated, for bytes our client would never send.
fn raw(server: &StoreServer) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let hello = Command::Validate {
        magic: wire::VALIDATION_MAGIC,
    };
    stream.write_all(&hello.encode()).unwrap();
    stream
}

/// Whether the server closes `stream` (within 5 s) after `bytes`.
fn closes_after(mut stream: TcpStream, bytes: &[u8]) -> bool {
    let _ = stream.write_all(bytes);
    let mut answer = Vec::new();
    match stream.read_to_end(&mut answer) {
        Ok(_) => answer.len() < 256,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn garbage_and_oversized_requests_close_only_that_connection() {
    let server = StoreServer::bind(0, 2).unwrap();
    let good = client(&server, 0, 2, 5000);
    good.set("before", b"1").unwrap();

    // A key length of 2^63: refused before any allocation.
    let mut huge = vec![query::SET];
    huge.extend_from_slice(&(1u64 << 63).to_ne_bytes());
    assert!(closes_after(raw(&server), &huge));
    // An unknown command, a wrong magic number, no VALIDATE at all.
    assert!(closes_after(raw(&server), &[99]));
    let wrong_magic = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    wrong_magic
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert!(closes_after(
        wrong_magic,
        &Command::Validate { magic: 0xdead_beef }.encode()
    ));
    let unvalidated = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    unvalidated
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert!(closes_after(
        unvalidated,
        &Command::Get {
            key: "/before".into()
        }
        .encode()
    ));
    // ADD to a key that holds no number.
    assert!(closes_after(
        raw(&server),
        &Command::Add {
            key: "/before-text".into(),
            delta: 1
        }
        .encode()
        .iter()
        .copied()
        .chain(
            Command::Set {
                key: "/t".into(),
                value: b"x".to_vec()
            }
            .encode()
        )
        .chain(
            Command::Add {
                key: "/t".into(),
                delta: 1
            }
            .encode()
        )
        .collect::<Vec<u8>>()
    ));
    // Pseudo-random junk, then the sender vanishes.
    let junk: Vec<u8> = (0u32..4096)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    raw(&server).write_all(&junk).unwrap();

    // The server and the well-behaved client carry on.
    assert_eq!(good.get("before").unwrap(), b"1");
    let late = client(&server, 1, 2, 5000);
    late.set("after", b"2").unwrap();
    assert_eq!(good.get("after").unwrap(), b"2");
}

#[test]
fn a_request_may_arrive_byte_by_byte() {
    let server = StoreServer::bind(0, 1).unwrap();
    let mut stream = raw(&server);
    let mut request = Command::Set {
        key: "/slow".into(),
        value: b"drip".to_vec(),
    }
    .encode();
    request.extend(
        Command::Get {
            key: "/slow".into(),
        }
        .encode(),
    );
    for byte in request {
        stream.write_all(&[byte]).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut answer = [0u8; 12];
    stream.read_exact(&mut answer).unwrap();
    assert_eq!(&answer[..8], &4u64.to_ne_bytes());
    assert_eq!(&answer[8..], b"drip");
}

#[test]
fn a_port_in_use_is_named_with_the_fix() {
    let first = StoreServer::bind(0, 1).unwrap();
    let err = StoreServer::bind(first.port(), 1)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains(&format!("127.0.0.1:{}", first.port())),
        "{err}"
    );
    assert!(err.contains("--master-port or MASTER_PORT"), "{err}");
}

#[test]
fn an_absent_store_is_reported_after_the_timeout() {
    let port = crate::spawn::free_port().unwrap();
    let started = Instant::now();
    let err = Store::connect("127.0.0.1", port, 3, 4, Duration::from_millis(300))
        .err()
        .unwrap()
        .to_string();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        err.contains(&format!(
            "rank 3 could not reach the rendezvous store at 127.0.0.1:{port}"
        )),
        "{err}"
    );
}

#[test]
fn rank_zero_waits_for_the_others_to_leave() {
    let server = StoreServer::bind(0, 2).unwrap();
    let other = Arc::new(client(&server, 1, 2, 5000));
    assert!(!server.wait_until_idle(Duration::from_millis(100)));
    let leaving = other.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(leaving);
    });
    drop(other);
    assert!(server.wait_until_idle(Duration::from_secs(5)));
}

#[test]
fn a_timeout_too_far_to_represent_waits_instead_of_panicking() {
    let server = StoreServer::bind(0, 1).unwrap();
    let store = Store::connect("127.0.0.1", server.port(), 0, 1, Duration::MAX).unwrap();
    store.set("k", b"v").unwrap();
    assert_eq!(store.get("k").unwrap(), b"v");
    store.barrier("far").unwrap();
}

#[test]
fn losing_the_store_ends_every_wait_at_once_naming_it() {
    let server = StoreServer::bind(0, 2).unwrap();
    let port = server.port();
    let waiting = client(&server, 1, 2, 30_000);
    let started = Instant::now();
    let err = std::thread::scope(|s| {
        let w = s.spawn(|| waiting.get("never").unwrap_err());
        std::thread::sleep(Duration::from_millis(200));
        drop(server);
        w.join().unwrap()
    });
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, CommError::StoreLost { .. }), "{err:?}");
    assert_eq!(err.blamed_rank(), Some(0));
    assert!(
        err.to_string()
            .contains(&format!("lost the rendezvous store at 127.0.0.1:{port}")),
        "{err}"
    );
}

#[test]
fn waits_that_are_cancelled_replaced_or_abandoned_leave_nothing_behind() {
    // Room for the strangers' connections until the server has seen them close.
    let server = StoreServer::bind(0, 100).unwrap();
    // Strangers that WAIT for keys nobody sets, then vanish.
    for i in 0..200 {
        let mut stream = raw(&server);
        let wait = Command::Wait {
            keys: vec![format!("/never/{i}"), "/never/shared".into()],
        };
        stream.write_all(&wait.encode()).unwrap();
    }
    // One that waits, waits again for other keys, then cancels: one WAIT_CANCELED.
    let mut stream = raw(&server);
    for key in ["/a", "/b"] {
        let wait = Command::Wait {
            keys: vec![key.into()],
        };
        stream.write_all(&wait.encode()).unwrap();
    }
    stream.write_all(&Command::CancelWait.encode()).unwrap();
    let mut answer = [0u8; 1];
    stream.read_exact(&mut answer).unwrap();
    assert_eq!(answer[0], wire::WAIT_CANCELED);
    // A set of a key once waited for wakes nobody: nothing was left waiting on it.
    let a = client(&server, 0, 100, 5000);
    a.set("a", b"1").unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    assert!(stream.read(&mut answer).is_err(), "a stale STOP_WAITING");
    // Only the client's own watcher still waits (for the job's abort key); then nobody.
    assert_eq!(awaited_keys_settled(&server, 1), 1);
    drop((stream, a));
    assert_eq!(awaited_keys_settled(&server, 0), 0);
}

/// The server's count of awaited keys once it has come down to `expected` (the server sees
/// closed connections a moment after they close), or after 5 s.
fn awaited_keys_settled(server: &StoreServer, expected: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.awaited_keys() > expected && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    server.awaited_keys()
}

/// A node's launcher attends the store while its ranks start: it claims the node, lets go once
/// they have all joined, refuses another job's store and another launcher's claim, takes over
/// its own earlier one, hears rank 0's store close, and stops when told, whether or not the
/// store is up. (A silent node or store is the cluster in a box's to show: tests/cluster.rs.)
#[test]
fn a_launcher_attends_the_store_until_its_ranks_have_joined() {
    use super::presence::{attend, Attended, NodeClaim};
    use crate::heartbeat::Heartbeat;
    use std::sync::atomic::{AtomicBool, Ordering};

    let server = StoreServer::bind_job("127.0.0.1", 0, 4, Some("run-a")).unwrap();
    let endpoint = format!("127.0.0.1:{}", server.port());
    let claim = NodeClaim {
        node: 1,
        ranks: 2..4,
        world_size: 4,
        run_id: Some("run-a"),
    };
    let stop = AtomicBool::new(false);
    let beat = Heartbeat::default();
    std::thread::scope(|s| {
        let attending = s.spawn(|| attend(&endpoint, &claim, beat, &stop));
        let peek = client(&server, 0, 4, 5000);
        peek.wait(&["job/node/1"]).unwrap();
        let node = String::from_utf8(peek.get("job/node/1").unwrap()).unwrap();
        assert!(node.ends_with(") ranks 2-3"), "{node}");
        assert!(
            node.contains(&format!("(pid {} on ", std::process::id())),
            "{node}"
        );
        let join = |rank| {
            Store::connect_job(
                "127.0.0.1",
                server.port(),
                rank,
                4,
                Some("run-a"),
                Duration::from_secs(5),
            )
            .unwrap()
        };
        let _two = join(2);
        std::thread::sleep(Duration::from_millis(300));
        assert!(!attending.is_finished(), "let go before rank 3 joined");
        let _three = join(3);
        assert_eq!(attending.join().unwrap(), Attended::RanksJoined);
    });

    // Another job's store (another run id): nothing claimed.
    let other = NodeClaim {
        run_id: Some("run-b"),
        ..claim.clone()
    };
    assert_eq!(attend(&endpoint, &other, beat, &stop), Attended::NotOurs);

    // Rank 0 ended (its store closed) before the node's ranks joined.
    let ending = StoreServer::bind_job("127.0.0.1", 0, 4, None).unwrap();
    let port = ending.port();
    let endpoint = format!("127.0.0.1:{port}");
    std::thread::scope(|s| {
        let attending = s.spawn(|| attend(&endpoint, &claim, beat, &stop));
        let peek = client(&ending, 0, 4, 5000);
        peek.wait(&["job/node/1"]).unwrap();
        drop(peek);
        drop(ending);
        assert_eq!(attending.join().unwrap(), Attended::StoreClosed);
    });

    // A claim of this node already there: another launcher's is refused; this process's own,
    // from an earlier connection whose answer was lost, is taken over.
    let claimed = StoreServer::bind_job("127.0.0.1", 0, 4, None).unwrap();
    let endpoint = format!("127.0.0.1:{}", claimed.port());
    let peek = client(&claimed, 0, 4, 5000);
    let host = crate::host::hostname();
    peek.set(
        "job/node/1",
        format!("127.0.0.1:1 (pid 1 on {host}) ranks 2-3").as_bytes(),
    )
    .unwrap();
    assert_eq!(attend(&endpoint, &claim, beat, &stop), Attended::NotOurs);
    let stale = format!(
        "127.0.0.1:1 (pid {} on {host}) ranks 2-3",
        std::process::id()
    );
    peek.set("job/node/1", stale.as_bytes()).unwrap();
    let stop_it = AtomicBool::new(false);
    std::thread::scope(|s| {
        let attending = s.spawn(|| attend(&endpoint, &claim, beat, &stop_it));
        let started = Instant::now();
        let mut now = stale.clone();
        while now == stale {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "never taken over"
            );
            std::thread::sleep(Duration::from_millis(20));
            now = String::from_utf8(peek.get("job/node/1").unwrap()).unwrap();
        }
        assert!(
            !now.starts_with("127.0.0.1:1 ") && now.ends_with(") ranks 2-3"),
            "{now}"
        );
        stop_it.store(true, Ordering::Relaxed);
        assert_eq!(attending.join().unwrap(), Attended::Stopped);
    });
    // Its launcher gone before any of node 1's ranks joined: the job ends, naming the node.
    match peek.wait(&["never/set"]) {
        Err(CommError::NodeGone {
            node: 1,
            first_rank: 2,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }

    // Told to stop while waiting for its ranks, and while the store is not up at all.
    let lonely = StoreServer::bind_job("127.0.0.1", 0, 4, None).unwrap();
    let nobody = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap().to_string()
    };
    for endpoint in [format!("127.0.0.1:{}", lonely.port()), nobody] {
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let attending = s.spawn(|| attend(&endpoint, &claim, beat, &stop));
            std::thread::sleep(Duration::from_millis(400));
            let told = Instant::now();
            stop.store(true, Ordering::Relaxed);
            assert_eq!(attending.join().unwrap(), Attended::Stopped, "{endpoint}");
            assert!(told.elapsed() < Duration::from_secs(2), "{endpoint}");
        });
    }
}
