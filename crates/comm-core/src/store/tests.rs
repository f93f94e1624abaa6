//! The store against real sockets: values, waits and their timeouts, many clients at once, and
//! peers that send garbage.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::frame::{Refusal, Request, Response};
use super::{Store, StoreServer, MAX_FRAME};
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
    assert!(a.check(&["k", "n"]).unwrap());
    assert!(!a.check(&["k", "missing"]).unwrap());
    assert!(a.delete("k").unwrap());
    assert!(!a.delete("k").unwrap());
    a.set("empty", b"").unwrap();
    assert_eq!(b.get("empty").unwrap(), b"");
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
fn a_wait_times_out_naming_the_key_and_the_ranks() {
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
    let message = err.to_string();
    assert!(message.contains("key 'nccl_id'"), "{message}");
    assert!(
        message.contains("ranks connected to the store: 0, 2 of 4"),
        "{message}"
    );
    assert!(message.contains("never connected: 1, 3"), "{message}");
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

/// Sends raw bytes on a fresh connection and reports whether the server closed it (after at most
/// a refusal) within 5 s.
fn server_closes_after(server: &StoreServer, bytes: &[u8]) -> bool {
    let mut raw = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    raw.write_all(bytes).unwrap();
    let mut answer = Vec::new();
    match raw.read_to_end(&mut answer) {
        Ok(_) => answer.len() < 256,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn garbage_and_oversized_frames_close_only_that_connection() {
    let server = StoreServer::bind(0, 2).unwrap();
    let good = client(&server, 0, 2, 5000);
    good.set("before", b"1").unwrap();

    // A length far over the limit: refused before any allocation.
    assert!(server_closes_after(&server, &u32::MAX.to_be_bytes()));
    assert!(server_closes_after(
        &server,
        &((MAX_FRAME as u32) + 1).to_be_bytes()
    ));
    // A well-framed payload with an unknown tag, a truncated field, and trailing bytes.
    assert!(server_closes_after(&server, &[0, 0, 0, 1, 99]));
    assert!(server_closes_after(&server, &[0, 0, 0, 3, 1, 0, 0]));
    let mut trailing = Request::Delete { key: "k".into() }.encode();
    trailing.push(0);
    let mut framed = (trailing.len() as u32).to_be_bytes().to_vec();
    framed.extend(trailing);
    assert!(server_closes_after(&server, &framed));
    // A key count that claims more keys than the frame holds.
    assert!(server_closes_after(
        &server,
        &[0, 0, 0, 5, 5, 0xff, 0xff, 0xff, 0xff]
    ));
    // Pseudo-random junk, then the sender vanishes.
    let junk: Vec<u8> = (0u32..4096)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    TcpStream::connect(("127.0.0.1", server.port()))
        .unwrap()
        .write_all(&junk)
        .unwrap();

    // The server and the well-behaved client carry on.
    assert_eq!(good.get("before").unwrap(), b"1");
    let late = client(&server, 1, 2, 5000);
    late.set("after", b"2").unwrap();
    assert_eq!(good.get("after").unwrap(), b"2");
}

#[test]
fn frames_round_trip() {
    let requests = [
        Request::Hello {
            rank: 7,
            world_size: 8,
            run_id: None,
        },
        Request::Hello {
            rank: 7,
            world_size: 8,
            run_id: Some("job-1".into()),
        },
        Request::Set {
            key: "a".into(),
            value: vec![0, 1, 2],
        },
        Request::Get {
            key: "b".into(),
            timeout_ms: 99,
        },
        Request::Wait {
            keys: vec!["x".into(), "y".into()],
            timeout_ms: 5,
        },
        Request::Add {
            key: "c".into(),
            delta: -3,
        },
        Request::Check { keys: vec![] },
        Request::Delete { key: "d".into() },
    ];
    for r in requests {
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
    }
    let responses = [
        Response::Ok,
        Response::Value(vec![9; 3]),
        Response::Number(-5),
        Response::Bool(true),
        Response::Timeout {
            detail: "who".into(),
            missing: vec![1, 3],
        },
        Response::Refused(Refusal::ForeignRun {
            store_run_id: "a".into(),
        }),
        Response::Refused(Refusal::DuplicateRank {
            first_from: "127.0.0.1:5".into(),
        }),
        Response::Refused(Refusal::WorldSizeMismatch {
            store_world_size: 2,
            rank: 1,
            rank_world_size: 4,
        }),
        Response::Refused(Refusal::Limit {
            what: "keys".into(),
            max: 9,
        }),
        Response::Refused(Refusal::Other("no".into())),
    ];
    for r in responses {
        assert_eq!(Response::decode(&r.encode()).unwrap(), r);
    }
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
