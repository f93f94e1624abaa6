//! The rendezvous store on a shared node full of neighbours using the same default ports: ranks
//! of another run, duplicate ranks, disagreeing world sizes, silent connections, floods of
//! connections, keys and bytes, and running out of file descriptors. Real sockets on 127.0.0.1,
//! a real server; every case is bounded in time.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use comm_core::store::{Store, StoreLimits, StoreServer, MAX_FRAME};
use comm_core::CommError;

const LONG: Duration = Duration::from_secs(20);

fn job_server(world: usize, run_id: Option<&str>) -> StoreServer {
    StoreServer::bind_job("127.0.0.1", 0, world, run_id).unwrap()
}

fn join(server: &StoreServer, rank: usize, world: usize, run_id: Option<&str>) -> Store {
    Store::connect_job("127.0.0.1", server.port(), rank, world, run_id, LONG).unwrap()
}

/// The error a connection attempt ends with, and how long it took.
fn refused(
    server: &StoreServer,
    rank: usize,
    world: usize,
    run_id: Option<&str>,
    timeout: Duration,
) -> (CommError, Duration) {
    let started = Instant::now();
    let err = Store::connect_job("127.0.0.1", server.port(), rank, world, run_id, timeout)
        .err()
        .expect("the store should refuse this hello");
    (err, started.elapsed())
}

#[test]
fn a_rank_of_another_run_is_refused_at_once_naming_both_runs_and_the_port() {
    let server = job_server(2, Some("job-456-cd"));
    let _rank0 = join(&server, 0, 2, Some("job-456-cd"));
    let (err, took) = refused(&server, 1, 2, Some("job-123-ab"), LONG);
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(
        matches!(err, CommError::ForeignRank { rank: 1, .. }),
        "{err:?}"
    );
    assert_eq!(err.kind(), "foreign_rank");
    assert_eq!(err.blamed_rank(), None);
    let message = err.to_string();
    let port = server.port();
    assert!(
        message.contains(&format!(
            "rank 1 of run job-123-ab belongs to another job than the store at 127.0.0.1:{port} \
             (run job-456-cd)"
        )),
        "{message}"
    );
    assert!(message.contains("same MASTER_PORT"), "{message}");
    // The job itself is untouched: its own rank 1 still joins.
    let rank1 = join(&server, 1, 2, Some("job-456-cd"));
    rank1.set("k", b"v").unwrap();
}

#[test]
fn a_duplicate_rank_is_refused_naming_where_the_first_came_from() {
    let server = job_server(3, Some("run-a"));
    let first = join(&server, 1, 3, Some("run-a"));
    let (err, took) = refused(&server, 1, 3, Some("run-a"), LONG);
    assert!(took < Duration::from_secs(1), "took {took:?}");
    let CommError::DuplicateRank { first_from, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(first_from.starts_with("127.0.0.1:"), "{first_from}");
    assert_eq!(err.kind(), "duplicate_rank");
    let message = err.to_string();
    assert!(
        message.contains(&format!("rank 1 already joined this job from {first_from}")),
        "{message}"
    );
    // Once the first connection is gone, the rank may come back.
    drop(first);
    let started = Instant::now();
    loop {
        match Store::connect_job("127.0.0.1", server.port(), 1, 3, Some("run-a"), LONG) {
            Ok(_) => break,
            Err(CommError::DuplicateRank { .. }) if started.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("{e:?}"),
        }
    }
}

#[test]
fn a_world_size_mismatch_fails_every_rank_fast_naming_both_sizes() {
    let server = job_server(3, Some("run-w"));
    let rank0 = join(&server, 0, 3, Some("run-w"));
    let rank1 = join(&server, 1, 3, Some("run-w"));
    let started = Instant::now();
    let (waiting0, waiting1, wrong) = std::thread::scope(|s| {
        let waiting0 = s.spawn(|| rank0.get("never").unwrap_err());
        let waiting1 = s.spawn(|| rank1.barrier("start").unwrap_err());
        std::thread::sleep(Duration::from_millis(200));
        let (wrong, _) = refused(&server, 2, 4, Some("run-w"), LONG);
        (waiting0.join().unwrap(), waiting1.join().unwrap(), wrong)
    });
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "took {took:?} (timeout is {LONG:?})"
    );
    for err in [&waiting0, &waiting1, &wrong] {
        assert!(
            matches!(
                err,
                CommError::WorldSizeMismatch {
                    store_world_size: 3,
                    other_rank: 2,
                    other_world_size: 4,
                    ..
                }
            ),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains("started for 3 ranks, but rank 2 says 4"),
            "{message}"
        );
        assert_eq!(err.kind(), "world_size_mismatch");
    }
    // A rank arriving later is told at its hello.
    let (late, took) = refused(&server, 2, 3, Some("run-w"), LONG);
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(
        matches!(late, CommError::WorldSizeMismatch { .. }),
        "{late:?}"
    );
}

#[test]
fn silent_connections_do_not_delay_the_ranks_and_are_dropped() {
    let server = job_server(4, Some("run-s"));
    // Strangers that connect and say nothing, or trickle a byte now and then.
    let mut silent: Vec<TcpStream> = (0..10)
        .map(|_| TcpStream::connect(("127.0.0.1", server.port())).unwrap())
        .collect();
    silent[0].write_all(&[0, 0]).unwrap();
    let started = Instant::now();
    std::thread::scope(|s| {
        for rank in 0..4 {
            let server = &server;
            s.spawn(move || {
                let store = join(server, rank, 4, Some("run-s"));
                store.barrier("met").unwrap();
            });
        }
    });
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "rendezvous took {took:?}");
    // After the 2 s hello timeout the server has closed them all.
    for stream in &mut silent {
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 16];
        let read = stream.read(&mut buf);
        let closed = match &read {
            Ok(n) => *n == 0,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        };
        assert!(closed, "{read:?}");
    }
    let held = started.elapsed();
    assert!(
        held < Duration::from_secs(4),
        "silent ones held for {held:?}"
    );
}

fn small_limits(world: usize) -> StoreLimits {
    StoreLimits {
        max_connections: 3,
        max_keys: 50,
        max_value_bytes: 1 << 20,
        max_stored_bytes: 4 << 20,
        ..StoreLimits::for_world(world)
    }
}

#[test]
fn too_many_or_too_large_sets_are_refused_and_memory_stays_bounded() {
    let server = StoreServer::bind_with("127.0.0.1", 0, 2, None, small_limits(2)).unwrap();
    let rank0 = join(&server, 0, 2, None);
    let stranger = join(&server, 1, 2, None);
    // A value over the value bound.
    let err = stranger.set("big", &vec![7u8; (1 << 20) + 1]).unwrap_err();
    assert!(
        matches!(&err, CommError::StoreLimit { what, max, .. } if what == "value bytes" && *max == 1 << 20),
        "{err:?}"
    );
    assert!(err.to_string().contains("'big' from rank 1"), "{err}");
    // Forty 1 MiB values: the store keeps what fits in 4 MiB and refuses the rest.
    let mut refusals = 0;
    for i in 0..40 {
        match stranger.set(&format!("blob/{i}"), &vec![1u8; 1 << 20]) {
            Ok(()) => {}
            Err(CommError::StoreLimit { what, .. }) if what == "stored bytes" => refusals += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(refusals, 37, "3 MiB-values fit in 4 MiB");
    assert!(
        server.stored_bytes() <= 4 << 20,
        "{}",
        server.stored_bytes()
    );
    // Many small keys: refused at the key bound.
    let mut key_refusals = 0;
    for i in 0..100 {
        if let Err(e) = stranger.set(&format!("k/{i}"), b"x") {
            assert!(
                matches!(&e, CommError::StoreLimit { what, max: 50, .. } if what == "keys"),
                "{e:?}"
            );
            key_refusals += 1;
        }
    }
    assert_eq!(key_refusals, 100 - (50 - 3));
    // Deleting makes room again, and the real rank was never disturbed.
    assert!(stranger.delete("blob/0").unwrap());
    rank0.set("blob/0", b"small").unwrap();
    assert_eq!(stranger.get("blob/0").unwrap(), b"small");
    // Over the frame bound the client refuses before sending anything.
    let err = stranger.set("huge", &vec![0u8; MAX_FRAME]).unwrap_err();
    assert!(
        matches!(&err, CommError::StoreLimit { what, .. } if what == "frame bytes"),
        "{err:?}"
    );
}

/// Resident memory of this process, in bytes (Linux).
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// The case from the issue: forty 16 MiB Sets from a stranger took rank 0 from 4 MB to 823 MB.
/// With the default bounds the store keeps at most 256 MiB.
#[test]
fn forty_large_sets_stop_at_the_default_byte_bound() {
    let server = job_server(2, None);
    let stranger = join(&server, 1, 2, None);
    let before = rss();
    let value = vec![3u8; 15 << 20];
    let mut refused = 0;
    for i in 0..40 {
        if let Err(e) = stranger.set(&format!("stranger/{i}"), &value) {
            assert!(
                matches!(&e, CommError::StoreLimit { what, .. } if what == "stored bytes"),
                "{e:?}"
            );
            refused += 1;
        }
    }
    drop(value);
    assert_eq!(refused, 40 - 17, "17 values of 15 MiB fit in 256 MiB");
    assert!(server.stored_bytes() <= 256 << 20);
    let grown = rss().saturating_sub(before);
    assert!(grown < 400 << 20, "grew by {} MiB", grown >> 20);
}

#[test]
fn connections_beyond_the_bound_are_refused_naming_it() {
    let server = StoreServer::bind_with("127.0.0.1", 0, 4, None, small_limits(4)).unwrap();
    let mut ranks: Vec<Store> = (0..3).map(|r| join(&server, r, 4, None)).collect();
    // A raw fourth connection hears why before the server closes it.
    let mut raw = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = Vec::new();
    raw.read_to_end(&mut answer).unwrap();
    assert!(
        String::from_utf8_lossy(&answer).contains("open connections"),
        "{answer:?}"
    );
    // A rank keeps trying within its timeout, then names the bound.
    let (err, took) = refused(&server, 3, 4, None, Duration::from_millis(600));
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert!(
        matches!(&err, CommError::StoreLimit { what, max: 3, .. } if what == "open connections"),
        "{err:?}"
    );
    assert_eq!(err.kind(), "store_limit");
    // When a connection goes, the waiting rank gets in.
    std::thread::scope(|s| {
        let late = s
            .spawn(|| Store::connect_job("127.0.0.1", server.port(), 3, 4, None, LONG).map(|_| ()));
        std::thread::sleep(Duration::from_millis(300));
        ranks.pop();
        late.join().unwrap().unwrap();
    });
}

#[test]
fn by_hand_ranks_without_run_ids_still_meet() {
    // Nobody has a run id.
    let server = job_server(2, None);
    let stores = [join(&server, 0, 2, None), join(&server, 1, 2, None)];
    std::thread::scope(|s| {
        for store in &stores {
            s.spawn(move || store.barrier("b").unwrap());
        }
    });
    // Only one side has one: nothing is compared.
    let server = job_server(2, Some("run-x"));
    let _a = join(&server, 0, 2, Some("run-x"));
    let _b = join(&server, 1, 2, None);
    let server = job_server(2, None);
    let _a = join(&server, 0, 2, None);
    let _b = join(&server, 1, 2, Some("run-y"));
    // The plain `Store::connect` is a by-hand rank.
    let server = job_server(1, Some("run-z"));
    Store::connect("127.0.0.1", server.port(), 0, 1, LONG).unwrap();
}

#[test]
fn a_loopback_job_listens_on_loopback_only() {
    for master in ["127.0.0.1", "localhost"] {
        let server = StoreServer::bind_job(master, 0, 1, None).unwrap();
        assert!(
            server.local_addr().ip().is_loopback(),
            "{master}: {}",
            server.local_addr()
        );
        Store::connect(master, server.port(), 0, 1, LONG).unwrap();
    }
    let server = StoreServer::bind_job("0.0.0.0", 0, 1, None).unwrap();
    assert!(server.local_addr().ip().is_unspecified());
}

/// CPU time (user + system) this process has used.
fn cpu_time() -> Duration {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) }, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

const EMFILE_ROLE: &str = "STORE_NEIGHBOURS_EMFILE";

/// Out of file descriptors: the server's accept loop backs off instead of spinning, and a rank
/// keeps trying within its timeout instead of failing at the first EMFILE; once descriptors are
/// free again it joins. Runs in a child process (this test binary again), whose descriptor limit
/// it lowers, so the other tests keep theirs.
#[test]
fn out_of_file_descriptors_the_store_backs_off_and_the_rank_retries() {
    if std::env::var_os(EMFILE_ROLE).is_some() {
        return starve_and_recover();
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "out_of_file_descriptors_the_store_backs_off_and_the_rank_retries",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(EMFILE_ROLE, "1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("starved:"), "{text}");
    eprintln!("{text}");
}

fn starve_and_recover() {
    let server = StoreServer::bind(0, 1).unwrap();
    let port = server.port();
    // Lower the limit to a little above what is open, then fill all of it but one descriptor.
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count();
    let limit = libc::rlimit {
        rlim_cur: (open + 16) as libc::rlim_t,
        rlim_max: libc::RLIM_INFINITY,
    };
    let mut old: libc::rlimit = unsafe { std::mem::zeroed() };
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) };
    let limit = libc::rlimit {
        rlim_max: old.rlim_max,
        ..limit
    };
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    let mut fillers = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        fillers.push(f);
    }
    // A stranger's connection takes the last descriptor and waits in the listen queue: every
    // accept of the server now fails with EMFILE, and so does the rank's socket().
    fillers.pop();
    let _stranger = TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::thread::scope(|s| {
        let rank = s.spawn(|| {
            let started = Instant::now();
            let store = Store::connect("127.0.0.1", port, 0, 1, Duration::from_secs(8));
            (store.map(|_| ()), started.elapsed())
        });
        // A second of starvation.
        let cpu = cpu_time();
        std::thread::sleep(Duration::from_secs(1));
        let spent = cpu_time() - cpu;
        fillers.clear();
        let (joined, took) = rank.join().unwrap();
        println!("starved: {spent:?} of CPU in 1 s; the rank joined after {took:?}: {joined:?}");
        assert!(
            spent < Duration::from_millis(300),
            "spinning: {spent:?} of CPU in 1 s"
        );
        joined.unwrap();
    });
}
