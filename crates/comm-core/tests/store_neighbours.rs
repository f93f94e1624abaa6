//! The rendezvous store on a shared node full of neighbours using the same default ports: ranks
//! of another run, duplicate ranks, disagreeing world sizes, a rank that fails, silent
//! connections, floods of connections, keys and bytes, and running out of file descriptors. Real
//! sockets on 127.0.0.1, a real server speaking TCPStore; every case is bounded in time.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use comm_core::store::{Store, StoreLimits, StoreServer, MAX_VALUE_BYTES};
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
    let rank0 = join(&server, 0, 2, Some("job-456-cd"));
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
    // The job itself is untouched (a stranger cannot end it): its own rank 1 still joins.
    let rank1 = join(&server, 1, 2, Some("job-456-cd"));
    rank1.set("k", b"v").unwrap();
    assert_eq!(rank0.get("k").unwrap(), b"v");
}

#[test]
fn a_duplicate_rank_is_refused_naming_the_first_and_ends_the_job() {
    let server = job_server(3, Some("run-a"));
    let first = join(&server, 1, 3, Some("run-a"));
    let (err, took) = refused(&server, 1, 3, Some("run-a"), LONG);
    assert!(took < Duration::from_secs(1), "took {took:?}");
    let CommError::DuplicateRank { first_from, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(first_from.starts_with("127.0.0.1:"), "{first_from}");
    assert!(
        first_from.contains(&format!("(pid {} on ", std::process::id())),
        "{first_from}"
    );
    assert_eq!(err.kind(), "duplicate_rank");
    let message = err.to_string();
    assert!(
        message.contains(&format!("rank 1 already joined this job from {first_from}")),
        "{message}"
    );
    // Two processes with one rank is a broken job: the first hears so at its next wait.
    let started = Instant::now();
    let ended = first.get("anything").unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        matches!(ended, CommError::JobAborted { rank: 1, by: 1, .. }),
        "{ended:?}"
    );
    assert!(
        ended.to_string().contains("already joined this job"),
        "{ended}"
    );
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
    assert!(
        matches!(
            wrong,
            CommError::WorldSizeMismatch {
                store_world_size: 3,
                other_rank: 2,
                other_world_size: 4,
                ..
            }
        ),
        "{wrong:?}"
    );
    assert_eq!(wrong.kind(), "world_size_mismatch");
    for (rank, err) in [(0, &waiting0), (1, &waiting1)] {
        assert!(
            matches!(err, CommError::JobAborted { rank: r, by: 2, .. } if *r == rank),
            "{err:?}"
        );
        assert_eq!(err.blamed_rank(), Some(2));
        assert_eq!(err.kind(), "job_aborted");
    }
    for err in [&waiting0, &waiting1, &wrong] {
        let message = err.to_string();
        assert!(
            message.contains("started for 3 ranks, but rank 2 says 4"),
            "{message}"
        );
    }
    // A rank arriving later is told as it joins.
    let (late, took) = refused(&server, 2, 3, Some("run-w"), LONG);
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(
        matches!(late, CommError::JobAborted { by: 2, .. }),
        "{late:?}"
    );
}

#[test]
fn a_rank_that_fails_ends_the_job_for_the_others_at_once() {
    let server = job_server(3, Some("run-f"));
    let ranks: Vec<Store> = (0..3).map(|r| join(&server, r, 3, Some("run-f"))).collect();
    let (hook_tx, hook_rx) = std::sync::mpsc::channel();
    ranks[0].when_job_ends(move |e| hook_tx.send(e.to_string()).unwrap());
    let started = Instant::now();
    let waiting = std::thread::scope(|s| {
        let waiting = s.spawn(|| ranks[0].barrier("never").unwrap_err());
        std::thread::sleep(Duration::from_millis(100));
        ranks[2].abort(&CommError::Peer("rank 2 could not open its GPU".into()));
        waiting.join().unwrap()
    });
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        waiting.to_string(),
        "rank 0 stops because rank 2 ended the job: rank 2 could not open its GPU"
    );
    // The hook a Job installs hears it too, from the watcher's thread.
    let heard = hook_rx.recv_timeout(Duration::from_secs(2)).unwrap();
    assert!(heard.contains("rank 2 ended the job"), "{heard}");
    // The first reason stays: a second rank's abort does not replace it.
    ranks[1].abort(&CommError::Peer("later".into()));
    let err = ranks[1].get("x").unwrap_err();
    assert!(err.to_string().contains("could not open its GPU"), "{err}");
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
        max_connections: 4,
        max_keys: 50,
        max_value_bytes: 1 << 20,
        max_stored_bytes: 4 << 20,
        ..StoreLimits::for_world(world)
    }
}

/// A stranger speaking TCPStore by hand: one validated connection.
struct Stranger(TcpStream);

impl Stranger {
    fn connect(server: &StoreServer) -> Stranger {
        let mut stream = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        // VALIDATE (0) with TCPStore's magic number.
        let mut hello = vec![0u8];
        hello.extend_from_slice(&0x3C85_F7CEu32.to_ne_bytes());
        stream.write_all(&hello).unwrap();
        Stranger(stream)
    }

    /// SET (1) then PING (13): true if the store took it, false if it closed the connection.
    fn set(&mut self, key: &str, value: &[u8]) -> bool {
        let mut request = vec![1u8];
        request.extend_from_slice(&(key.len() as u64).to_ne_bytes());
        request.extend_from_slice(key.as_bytes());
        request.extend_from_slice(&(value.len() as u64).to_ne_bytes());
        request.extend_from_slice(value);
        request.push(13);
        request.extend_from_slice(&7u32.to_ne_bytes());
        if self.0.write_all(&request).is_err() {
            return false;
        }
        let mut nonce = [0u8; 4];
        self.0.read_exact(&mut nonce).is_ok() && nonce == 7u32.to_ne_bytes()
    }
}

#[test]
fn too_many_or_too_large_sets_are_refused_and_memory_stays_bounded() {
    let server = StoreServer::bind_with("127.0.0.1", 0, 2, None, small_limits(2)).unwrap();
    let rank0 = join(&server, 0, 2, None);
    // Our client refuses a value over TCPStore's bound before sending anything.
    let err = rank0
        .set("huge", &vec![0u8; MAX_VALUE_BYTES + 1])
        .unwrap_err();
    assert!(
        matches!(&err, CommError::StoreLimit { what, .. } if what == "value bytes"),
        "{err:?}"
    );
    assert!(err.to_string().contains("'huge' from rank 0"), "{err}");
    // A value over the server's bound closes the stranger's connection and changes nothing.
    assert!(!Stranger::connect(&server).set("big", &vec![7u8; (1 << 20) + 1]));
    // Forty 1 MiB values: the store keeps what fits in 4 MiB and refuses the rest.
    let kept = (0..40)
        .filter(|i| Stranger::connect(&server).set(&format!("blob/{i}"), &vec![1u8; 1 << 20]))
        .count();
    assert_eq!(kept, 3, "3 MiB-values fit in 4 MiB");
    assert!(
        server.stored_bytes() <= 4 << 20,
        "{}",
        server.stored_bytes()
    );
    // Many small keys: refused at the key bound (the store holds the world size, rank 0's
    // claim and the 3 blobs).
    let mut stranger = Stranger::connect(&server);
    let mut kept = 0;
    for i in 0..100 {
        if !stranger.set(&format!("k/{i}"), b"x") {
            break;
        }
        kept += 1;
    }
    assert_eq!(kept, 50 - 5);
    // A rank that meets the full store loses its connection, and is told where to look.
    let err = rank0.set("mine", b"small").unwrap_err();
    assert_eq!(err.kind(), "store_lost");
    assert!(
        err.to_string()
            .contains("over one of its bounds? rank 0's output says which"),
        "{err}"
    );
}

/// Resident memory of this process, in bytes (Linux).
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// The case of issue 13: forty 16 MiB Sets from a stranger took rank 0 from 4 MB to 823 MB.
/// Now values are at most 8 MiB (TCPStore's own bound), and the store keeps at most 256 MiB.
#[test]
fn forty_large_sets_stop_at_the_default_byte_bound() {
    let server = job_server(2, None);
    let before = rss();
    let value = vec![3u8; 8 << 20];
    let kept = (0..40)
        .filter(|i| Stranger::connect(&server).set(&format!("stranger/{i}"), &value))
        .count();
    drop(value);
    assert_eq!(kept, 31, "31 values of 8 MiB fit in 256 MiB");
    assert!(server.stored_bytes() <= 256 << 20);
    let grown = rss().saturating_sub(before);
    assert!(grown < 400 << 20, "grew by {} MiB", grown >> 20);
}

#[test]
fn connections_beyond_the_bound_are_closed_and_a_rank_waits_for_room() {
    let server = StoreServer::bind_with("127.0.0.1", 0, 4, None, small_limits(4)).unwrap();
    // Two ranks hold two connections each (requests and the watcher): the store is full.
    let mut ranks: Vec<Store> = (0..2).map(|r| join(&server, r, 4, None)).collect();
    let mut raw = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = Vec::new();
    assert_eq!(raw.read_to_end(&mut answer).unwrap(), 0, "closed at once");
    // A rank keeps trying within its timeout, then says why it could not get in.
    let (err, took) = refused(&server, 3, 4, None, Duration::from_millis(600));
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert_eq!(err.kind(), "store_unreachable");
    assert!(
        err.to_string()
            .contains("over its bound of open connections"),
        "{err}"
    );
    // When a rank leaves, the waiting one gets in.
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

#[test]
fn a_store_dropped_in_order_leaves_without_ending_the_job() {
    let server = job_server(3, None);
    let zero = join(&server, 0, 3, None);
    let one = join(&server, 1, 3, None);
    // Rank 1 is done with the store (a library user's drop, not a vanished process).
    drop(one);
    assert!(server.wait_until_at_most(2, Duration::from_secs(5)));
    assert!(!zero.check(&["job/abort"]).unwrap(), "no rank vanished");
    assert!(zero.check(&["job/left/1"]).unwrap(), "rank 1 said it left");
    // A rank of the job that comes later still joins.
    join(&server, 2, 3, None);
}

/// Rank 0 lingers until the other ranks' connections are gone, however many of its own are
/// still open: a rank that stops has its request socket shut and its watcher's closed, and the
/// others' two connections must not pass for its own (a survivor then lost the store before it
/// read why the job ended).
#[test]
fn rank_zero_waits_for_the_others_not_for_a_count() {
    let server = job_server(2, None);
    let zero = join(&server, 0, 2, None);
    let own = zero.own_addrs();
    assert_eq!(own.len(), 2, "requests and watcher: {own:?}");
    let one = join(&server, 1, 2, None);
    // Rank 0's own connections close; rank 1's two stay open.
    drop(zero);
    assert!(
        !server.wait_until_only(&own, Duration::from_millis(300)),
        "rank 1 is still connected"
    );
    drop(one);
    assert!(server.wait_until_only(&own, Duration::from_secs(5)));
}
