//! Every collective and reduction of comm-core's collective table, against a sequential
//! reference on random data: world sizes 1 to 8, lengths 0, 1, not divisible by the world size
//! and 16 MiB, each dtype, in place and out of place, over every transport (channels between
//! threads, real TCP sockets, and shared-memory segments: reading the peers' registered buffers
//! where they lie, through the rings, or by one copy from the sender's buffer).
//!
//! Inputs are small whole numbers, so every float sum and product is exact and the ring's order
//! of additions cannot make a correct result look wrong.

use std::sync::Arc;
use std::time::Duration;

use comm_core::backend::cpu::{
    self, ChannelTransport, CopyChoice, TcpTransport, Transport, TransportChoice, Wiring,
};
use comm_core::check::{cases, input, Case, Mismatch};
use comm_core::comm::Buffers;
use comm_core::store::{Store, StoreServer};
use comm_core::{Buffer, Collective, Communicator, Element, ReduceOp};

const TIMEOUT: Duration = Duration::from_secs(60);
const BIG_BYTES: usize = 16 << 20;

#[derive(Clone, Copy, Debug)]
enum Wire {
    Channels,
    Tcp,
    /// Shared memory as `--copy auto` has it on one host: the communicator's buffers are
    /// registered, and collectives from `registered_from`'s size read the peers' buffers where
    /// they lie; smaller ones go through the rings.
    Shm,
    /// Shared memory, every collective that can on registered buffers (`--copy registered`).
    ShmRegistered,
    /// Shared memory, every message by one copy (`--copy single`: cross-memory attach).
    ShmSingle,
    /// Shared memory, every message through the rings (`--copy ring`).
    ShmRing,
}

/// Runs `body` on `n` ranks, one thread each, and returns what each rank returned.
fn on_ranks<R: Send>(n: usize, wire: Wire, body: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    let transports: Vec<Box<dyn Transport>> = match wire {
        Wire::Channels => ChannelTransport::mesh(n, TIMEOUT)
            .into_iter()
            .map(|t| Box::new(t) as Box<dyn Transport>)
            .collect(),
        Wire::Tcp | Wire::Shm | Wire::ShmRegistered | Wire::ShmSingle | Wire::ShmRing => {
            let server = StoreServer::bind(0, n).unwrap();
            let port = server.port();
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..n)
                    .map(|rank| {
                        s.spawn(move || {
                            let store =
                                Store::connect("127.0.0.1", port, rank, n, TIMEOUT).unwrap();
                            connect(wire, &store, "test", rank, n)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            })
        }
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = transports
            .into_iter()
            .map(|t| {
                let body = &body;
                s.spawn(move || {
                    let rank = t.rank();
                    body(&Communicator::cpu(t, rank))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// One rank's end of `wire` between processes.
fn connect(wire: Wire, store: &Store, prefix: &str, rank: usize, n: usize) -> Box<dyn Transport> {
    match wire {
        Wire::Shm | Wire::ShmRegistered | Wire::ShmSingle | Wire::ShmRing => {
            let ip = store.local_ip();
            let wiring = Wiring {
                transport: TransportChoice::Shm,
                copy: match wire {
                    Wire::ShmSingle => CopyChoice::Single,
                    Wire::ShmRing => CopyChoice::Ring,
                    Wire::ShmRegistered => CopyChoice::Registered,
                    _ => CopyChoice::Auto,
                },
                refuse_cross_memory: false,
                refuse_registered: false,
                heartbeat: Default::default(),
            };
            cpu::connect(
                &store.scoped(prefix),
                rank,
                n,
                None,
                wiring,
                ip,
                store.timeout(),
            )
            .unwrap()
            .transport
        }
        _ => Box::new(
            TcpTransport::connect(&store.scoped(prefix), rank, n, None, store.timeout()).unwrap(),
        ),
    }
}

/// Every case of the collective table (each collective, reduction and placement) for dtype `T`
/// at each length, on one set of `n` ranks, checked against the sequential reference: the
/// result, the untouched parts (a reduce's non-root buffers), and out of place the send buffer.
/// Blocked collectives (all_gather, reduce_scatter, alltoall) get `len` split into n blocks,
/// rounded up, so every collective moves about `len` elements.
fn check_table<T: Element>(wire: Wire, n: usize, lens: &[usize]) {
    let results = on_ranks(n, wire, |comm| {
        let mut verdicts = Vec::new();
        for &len in lens {
            for case in cases(n, len, (n * 7919 + len) as u64) {
                let blocks = case.collective.counts(1, n, 0).whole();
                let case = Case {
                    count: len.div_ceil(blocks),
                    ..case
                };
                let mismatch = case.run::<T>(comm).unwrap();
                verdicts.push((format!("{} len={len}", case.name(T::DTYPE)), mismatch));
            }
            verdicts.push((
                format!("send/recv len={len}"),
                blocking_send_recv::<T>(comm, len),
            ));
        }
        verdicts
    });
    let expected_checks = lens.len() * (cases(n, 0, 0).len() + usize::from(n > 1));
    for (rank, verdicts) in results.iter().enumerate() {
        let ran = verdicts
            .iter()
            .filter(|(name, _)| !name.starts_with("send/recv") || n > 1);
        assert_eq!(ran.count(), expected_checks, "rank {rank} ran every check");
        for (name, mismatch) in verdicts {
            assert_eq!(
                mismatch.wrong,
                0,
                "{name} n={n} {wire:?} rank {rank}: {}",
                mismatch.first.as_deref().unwrap_or("")
            );
        }
    }
}

/// Separate blocking calls, each rank sending to the next and receiving from the previous (even
/// ranks send first, so no cycle of waiting senders forms).
fn blocking_send_recv<T: Element>(comm: &Communicator, len: usize) -> Mismatch {
    let (n, rank) = (comm.world_size(), comm.rank());
    if n < 2 {
        return Mismatch::default();
    }
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let send = comm
        .buffer(&input::<T>(5, rank, len, ReduceOp::Sum))
        .unwrap();
    let mut recv = comm.zeros::<T>(len).unwrap();
    if rank % 2 == 0 {
        comm.send(&send, next).unwrap();
        comm.recv(&mut recv, prev).unwrap();
    } else {
        comm.recv(&mut recv, prev).unwrap();
        comm.send(&send, next).unwrap();
    }
    comm.barrier().unwrap();
    let want = input::<T>(5, prev, len, ReduceOp::Sum);
    Mismatch::between("recv", &comm.to_host(&recv).unwrap(), &want)
}

/// Lengths 0, 1 and a few not divisible by the world size, small and past the algorithms'
/// small-message thresholds.
fn small_lengths(n: usize) -> Vec<usize> {
    vec![0, 1, n + 1, 1000 * n + 3, 70_001]
}

fn all_dtypes(wire: Wire, n: usize, lens: &[usize]) {
    check_table::<f32>(wire, n, lens);
    check_table::<f64>(wire, n, lens);
    check_table::<i32>(wire, n, lens);
    check_table::<i64>(wire, n, lens);
}

#[test]
fn channels_world_sizes_1_to_8() {
    for n in 1..=8 {
        all_dtypes(Wire::Channels, n, &small_lengths(n));
    }
}

#[test]
fn tcp_world_sizes_1_to_8() {
    for n in 1..=8 {
        all_dtypes(Wire::Tcp, n, &small_lengths(n));
    }
}

/// Registered buffers at every size (`--copy auto` sends these small calls through the rings,
/// which `shm_ring_world_sizes_1_to_8` covers).
#[test]
fn shm_registered_world_sizes_1_to_8() {
    for n in 1..=8 {
        all_dtypes(Wire::ShmRegistered, n, &small_lengths(n));
    }
}

#[test]
fn shm_ring_world_sizes_1_to_8() {
    for n in 1..=8 {
        all_dtypes(Wire::ShmRing, n, &small_lengths(n));
    }
}

#[test]
fn shm_single_copy_world_sizes_1_to_8() {
    for n in 1..=8 {
        all_dtypes(Wire::ShmSingle, n, &small_lengths(n));
    }
}

/// 16 MiB per rank (plus one element), every collective and dtype, at an odd world size where
/// blocks are uneven, with Sum and Max where the collective reduces.
fn big(wire: Wire) {
    let n = 3;
    fn one<T: Element>(wire: Wire, n: usize) {
        let len = BIG_BYTES / std::mem::size_of::<T>() + 1;
        let results = on_ranks(n, wire, |comm| {
            let mut verdicts = Vec::new();
            for case in cases(n, len, 16) {
                if case.collective.describe().reduces
                    && ![ReduceOp::Sum, ReduceOp::Max].contains(&case.op)
                {
                    continue;
                }
                let blocks = case.collective.counts(1, n, 0).whole();
                let case = Case {
                    count: len.div_ceil(blocks),
                    ..case
                };
                verdicts.push((case.name(T::DTYPE), case.run::<T>(comm).unwrap()));
            }
            verdicts.push(("send/recv".into(), blocking_send_recv::<T>(comm, len)));
            verdicts
        });
        for (rank, verdicts) in results.iter().enumerate() {
            for (name, mismatch) in verdicts {
                let first = mismatch.first.as_deref().unwrap_or("");
                assert_eq!(
                    mismatch.wrong, 0,
                    "{name} 16 MiB {wire:?} rank {rank}: {first}"
                );
            }
        }
    }
    one::<f32>(wire, n);
    one::<f64>(wire, n);
    one::<i32>(wire, n);
    one::<i64>(wire, n);
}

#[test]
fn channels_16_mib() {
    big(Wire::Channels);
}

#[test]
fn tcp_16_mib() {
    big(Wire::Tcp);
}

#[test]
fn shm_16_mib() {
    big(Wire::Shm);
}

#[test]
fn shm_ring_16_mib() {
    big(Wire::ShmRing);
}

#[test]
fn shm_single_copy_16_mib() {
    big(Wire::ShmSingle);
}

#[test]
fn tcp_16_mib_eight_ranks() {
    eight_ranks(Wire::Tcp);
}

#[test]
fn shm_16_mib_eight_ranks() {
    eight_ranks(Wire::Shm);
}

#[test]
fn shm_single_copy_16_mib_eight_ranks() {
    eight_ranks(Wire::ShmSingle);
}

/// The long rings: all-reduce, and the pipelined chain broadcast, over 8 ranks.
fn eight_ranks(wire: Wire) {
    let n = 8;
    let len = BIG_BYTES / 4;
    let results = on_ranks(n, wire, |comm| {
        [
            (Collective::AllReduce, ReduceOp::Avg, true),
            (Collective::Broadcast, ReduceOp::Sum, true),
            (Collective::Broadcast, ReduceOp::Sum, false),
        ]
        .map(|(collective, op, in_place)| {
            let case = Case {
                collective,
                count: len,
                op,
                root: n - 1,
                in_place,
                seed: 8,
            };
            (
                case.name(comm_core::DType::F32),
                case.run::<f32>(comm).unwrap(),
            )
        })
    });
    for verdicts in &results {
        for (name, mismatch) in verdicts {
            assert_eq!(mismatch.wrong, 0, "{name}: {:?}", mismatch.first);
        }
    }
}

#[test]
fn ranks_that_disagree_on_sizes_get_an_error_not_a_hang() {
    for wire in [
        Wire::Channels,
        Wire::Tcp,
        Wire::Shm,
        Wire::ShmSingle,
        Wire::ShmRing,
    ] {
        let errors = on_ranks(2, wire, |comm| {
            let len = if comm.rank() == 0 { 8 } else { 12 };
            let mut buf = comm.buffer(&vec![1i32; len]).unwrap();
            comm.broadcast(&mut buf, 0).err().map(|e| e.to_string())
        });
        let message = errors[1].as_deref().expect("rank 1 should fail");
        assert!(
            message.contains("disagree on buffer sizes"),
            "{wire:?}: {message}"
        );
    }
}

/// Under `--copy auto` each rank picks a call's path from its own buffer: registered buffers
/// from `registered_from`'s size for the collective, the rings below. Ranks that disagree across that bound are on
/// two paths at once; each side sees the other while it waits (a ring message at the window's
/// barrier, a peer's barrier count ahead of a rank on the rings) and says so, long before the
/// timeout.
#[test]
fn ranks_split_between_registered_buffers_and_rings_get_an_error_not_a_hang() {
    let small = 1000; // 4 KB of i32: the rings
    let large = 100_000; // 400 KB: registered buffers
    let split = |collective: Collective, bound: &str| {
        format!(
            "the ranks disagree on buffer sizes or made different calls ({collective} calls of \
             {bound} or more go on registered buffers, smaller ones through the rings; pass the \
             same length, dtype and root on every rank, in the same calls)"
        )
    };
    for (collective, small_rank, bound) in [
        (Collective::AllReduce, 0, "8 KiB (8192 bytes)"),
        (Collective::AllReduce, 2, "8 KiB (8192 bytes)"),
        (Collective::Broadcast, 0, "64 KiB (65536 bytes)"),
        (Collective::Broadcast, 1, "64 KiB (65536 bytes)"),
    ] {
        let started = std::time::Instant::now();
        // Three ranks for the all-reduce (each talks to both peers); two for the broadcast,
        // where a rank that neither hears from the root nor talks to the failing rank would be
        // left to the launcher, which stops a job's other ranks when one fails.
        let n = if collective == Collective::AllReduce {
            3
        } else {
            2
        };
        let errors = on_ranks(n, Wire::Shm, |comm| {
            let len = if comm.rank() == small_rank {
                small
            } else {
                large
            };
            let mut buf = comm.buffer(&vec![1i32; len]).unwrap();
            let done = match collective {
                Collective::AllReduce => comm.all_reduce(&mut buf, ReduceOp::Sum),
                _ => comm.broadcast(&mut buf, 0),
            };
            done.err().map(|e| e.to_string())
        });
        let case = format!("{collective}, rank {small_rank} small: {errors:?}");
        assert!(started.elapsed() < Duration::from_secs(20), "{case}");
        let split = split(collective, bound);
        assert!(
            errors.iter().flatten().any(|e| e.contains(&split)),
            "{case}"
        );
        // The rank on the rings waits for a peer at the window's barrier, except a root whose
        // messages fit its rings: it returns, as a root of mismatched broadcasts does on rings.
        let root_alone = collective == Collective::Broadcast && small_rank == 0;
        assert!(
            errors.iter().filter(|e| e.is_none()).count() <= usize::from(root_alone),
            "{case}"
        );
    }
}

/// 03's staging: a buffer copied into one kept by the caller and back, no new buffer per copy;
/// buffers of different lengths are refused. (On a GPU the same calls copy device to host:
/// scripts/gpu-check.sh runs 03 there.)
#[test]
fn staging_copies_into_kept_buffers() {
    on_ranks(1, Wire::Channels, |comm| {
        let data = comm.buffer(&[1.0f32, 2.0, 3.0]).unwrap();
        let mut host = comm.zeros::<f32>(3).unwrap();
        comm.copy_to_host(&data, &mut host).unwrap();
        assert_eq!(comm.to_host(&host).unwrap(), [1.0, 2.0, 3.0]);
        let mut back = comm.zeros::<f32>(3).unwrap();
        comm.copy_from_host(&host, &mut back).unwrap();
        assert_eq!(comm.to_host(&back).unwrap(), [1.0, 2.0, 3.0]);
        let mut short = comm.zeros::<f32>(2).unwrap();
        let err = comm
            .copy_to_host(&data, &mut short)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("copy_to_host: a buffer of 3 elements and one of 2"),
            "{err}"
        );
    });
}

#[test]
fn bad_arguments_are_usage_errors() {
    on_ranks(2, Wire::Channels, |comm| {
        let mut buf = comm.buffer(&[1.0f32; 3]).unwrap();
        let err = comm.broadcast(&mut buf, 2).unwrap_err().to_string();
        assert!(err.contains("root 2 is not a rank"), "{err}");
        let err = comm.all_gather(&mut buf).unwrap_err().to_string();
        assert!(err.contains("does not split into 2 equal blocks"), "{err}");
        let mut small = comm.zeros::<f32>(2).unwrap();
        let err = comm
            .all_gather_into(&buf, &mut small)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("all_gather: recv has 2 elements but must have 6 (count 3, world size 2)"),
            "{err}"
        );
        let err = comm.send(&buf, comm.rank()).unwrap_err().to_string();
        assert!(err.contains("is not another rank"), "{err}");
        let mut out = comm.zeros::<f32>(3).unwrap();
        let err = comm
            .send_recv(&buf, 1 - comm.rank(), &mut out, 5)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sendrecv: peer 5 is not another rank"),
            "{err}"
        );
    });
}

/// The peer here is a thread that drops its sockets, so what shows is its links closing. On
/// registered buffers (`Wire::Shm`, `--copy auto`) ranks of a host never open a link (they meet
/// at boards in shared memory), so a peer's death shows as its process ending: comm-bench's
/// tests/shared_memory.rs kills a rank mid-collective there.
#[test]
fn a_peer_that_disappears_is_reported() {
    for wire in [Wire::Tcp, Wire::ShmSingle, Wire::ShmRing] {
        a_peer_disappears(wire);
    }
}

fn a_peer_disappears(wire: Wire) {
    let server = StoreServer::bind(0, 2).unwrap();
    let port = server.port();
    let results: Vec<Option<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let store =
                        Arc::new(Store::connect("127.0.0.1", port, rank, 2, TIMEOUT).unwrap());
                    let comm = Communicator::cpu(connect(wire, &store, "gone", rank, 2), rank);
                    if rank == 1 {
                        return None; // drops its sockets: as if the process died
                    }
                    std::thread::sleep(Duration::from_millis(100));
                    let mut buf = comm.buffer(&vec![1.0f32; 1 << 20]).unwrap();
                    comm.all_reduce(&mut buf, ReduceOp::Sum)
                        .err()
                        .map(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let message = results[0].as_deref().expect("rank 0 should fail");
    assert!(
        message.contains("rank 1 closed its connection"),
        "{wire:?}: {message}"
    );
}

/// A peer that has all it needs from this rank may finish and exit while this rank still waits
/// on another: that is not an error (only a peer still owed something is watched).
#[test]
fn a_peer_that_finished_its_part_may_leave() {
    for wire in [Wire::Tcp, Wire::Shm, Wire::ShmSingle] {
        let results = on_ranks(3, wire, |comm| {
            let data = comm.buffer(&[7i32; 1000]).unwrap();
            let mut got = comm.zeros::<i32>(1000).unwrap();
            match comm.rank() {
                // Receives rank 1's message, then is done: its links close as it returns.
                0 => comm.recv(&mut got, 1).map(|_| 0),
                1 => comm.send_recv(&data, 0, &mut got, 2).map(|_| 1),
                _ => {
                    std::thread::sleep(Duration::from_millis(300));
                    comm.send(&data, 1).map(|_| 2)
                }
            }
            .map_err(|e| e.to_string())
        });
        assert_eq!(results, vec![Ok(0), Ok(1), Ok(2)], "{wire:?}");
    }
}

/// Ranks given different `--transport`s fail with a message saying so, not a wait for a barrier
/// the others never reach.
#[test]
fn ranks_given_different_transports_are_told() {
    let server = StoreServer::bind(0, 2).unwrap();
    let port = server.port();
    let results: Vec<Result<&str, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = [TransportChoice::Auto, TransportChoice::Tcp]
            .into_iter()
            .enumerate()
            .map(|(rank, choice)| {
                s.spawn(move || {
                    let timeout = Duration::from_secs(3);
                    let store = Store::connect("127.0.0.1", port, rank, 2, timeout).unwrap();
                    cpu::connect(
                        &store.scoped("mixed"),
                        rank,
                        2,
                        None,
                        choice,
                        store.local_ip(),
                        timeout,
                    )
                    .map(|c| c.transport.name())
                    .map_err(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let message = results[1].as_ref().expect_err("rank 1 should fail");
    assert!(
        message.contains("rank 0 runs --transport auto but rank 1 was given --transport tcp"),
        "{message}"
    );
}

/// `--transport tcp` is TCP alone (no shared memory is set up), `auto` on one host is shared
/// memory between every pair; the transport line says why.
#[test]
fn each_transport_choice_builds_what_it_names() {
    for (choice, name, why) in [
        (TransportChoice::Tcp, "tcp", "requested"),
        (
            TransportChoice::Auto,
            "shm",
            "shared memory between the 3 ranks of this host",
        ),
    ] {
        let server = StoreServer::bind(0, 3).unwrap();
        let port = server.port();
        let built: Vec<(String, String)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|rank| {
                    s.spawn(move || {
                        let store = Store::connect("127.0.0.1", port, rank, 3, TIMEOUT).unwrap();
                        let ip = store.local_ip();
                        let scope = store.scoped("choice");
                        let c = cpu::connect(&scope, rank, 3, None, choice, ip, TIMEOUT).unwrap();
                        (c.transport.name().to_string(), c.why)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (got_name, got_why) in built {
            assert_eq!(
                (got_name.as_str(), got_why.as_str()),
                (name, why),
                "{choice:?}"
            );
        }
    }
}

/// Connects `n` ranks (threads) with `wiring(rank)`, each rank's transport name and line's
/// words, or its error.
fn wired(
    n: usize,
    wiring: impl Fn(usize) -> Wiring + Sync,
) -> Vec<Result<(String, String), String>> {
    wired_within(n, TIMEOUT, wiring)
}

/// [`wired`], every wait at most `timeout`.
fn wired_within(
    n: usize,
    timeout: Duration,
    wiring: impl Fn(usize) -> Wiring + Sync,
) -> Vec<Result<(String, String), String>> {
    let server = StoreServer::bind(0, n).unwrap();
    let port = server.port();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let wiring = wiring(rank);
                s.spawn(move || {
                    let store = Store::connect("127.0.0.1", port, rank, n, timeout).unwrap();
                    let ip = store.local_ip();
                    let scope = store.scoped("copy");
                    cpu::connect(&scope, rank, n, None, wiring, ip, timeout)
                        .map(|c| (c.transport.name().to_string(), c.why))
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The transport line says which copy runs: nothing added under `--copy auto` where every pair
/// can read each other (the book's lines), the path where it was forced.
#[test]
fn the_transport_line_says_which_copy() {
    for (copy, added) in [
        (CopyChoice::Auto, ""),
        (
            CopyChoice::Single,
            "; one copy for every message, by cross-memory attach (--copy single)",
        ),
        (
            CopyChoice::Ring,
            "; two copies through its rings (--copy ring)",
        ),
        (
            CopyChoice::Registered,
            "; one copy from registered buffers (--copy registered)",
        ),
    ] {
        let wiring = Wiring {
            transport: TransportChoice::Auto,
            copy,
            refuse_cross_memory: false,
            refuse_registered: false,
            heartbeat: Default::default(),
        };
        for got in wired(3, |_| wiring) {
            let why = format!("shared memory between the 3 ranks of this host{added}");
            assert_eq!(got, Ok(("shm".to_string(), why)), "{copy:?}");
        }
    }
}

/// One rank that cannot read its peers' memory (a host's policy; here the test hook) turns the
/// one-copy path off for the whole job under `--copy auto`, every rank's line saying why, and
/// collectives still run (through the rings); `--copy single` fails on every rank naming it.
#[test]
fn one_rank_that_cannot_read_turns_single_copy_off_for_all() {
    let refusing = |copy| {
        move |rank| Wiring {
            transport: TransportChoice::Shm,
            copy,
            refuse_cross_memory: rank == 2,
            refuse_registered: false,
            heartbeat: Default::default(),
        }
    };
    let why = "rank 2 cannot read rank 0's memory: refused";
    for got in wired(3, refusing(CopyChoice::Auto)) {
        let (name, line) = got.unwrap();
        assert_eq!(name, "shm");
        assert!(
            line.starts_with(
                "shared memory between the 3 ranks of this host; two copies through its rings: "
            ) && line.contains(why),
            "{line}"
        );
    }
    for got in wired(3, refusing(CopyChoice::Single)) {
        let e = got.unwrap_err();
        assert!(e.contains("--copy single: ") && e.contains(why), "{e}");
    }
    // The rings carry a message the one-copy path would have taken.
    let server = StoreServer::bind(0, 2).unwrap();
    let port = server.port();
    let sums: Vec<f32> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let store = Store::connect("127.0.0.1", port, rank, 2, TIMEOUT).unwrap();
                    let wiring = refusing(CopyChoice::Auto)(rank + 1);
                    let ip = store.local_ip();
                    let c = cpu::connect(&store.scoped("ring"), rank, 2, None, wiring, ip, TIMEOUT)
                        .unwrap();
                    assert!(c.why.contains("two copies through its rings"), "{}", c.why);
                    let comm = Communicator::cpu(c.transport, rank);
                    let mut buf = comm.buffer(&vec![rank as f32 + 1.0; 1 << 20]).unwrap();
                    comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
                    comm.to_host(&buf).unwrap()[12345]
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, vec![3.0, 3.0]);
}

/// Ranks given different `--copy`s fail saying so.
#[test]
fn ranks_given_different_copies_are_told() {
    let got = wired_within(2, Duration::from_secs(3), |rank| Wiring {
        transport: TransportChoice::Auto,
        copy: [CopyChoice::Auto, CopyChoice::Ring][rank],
        refuse_cross_memory: false,
        refuse_registered: false,
        heartbeat: Default::default(),
    });
    let e = got[1].as_ref().unwrap_err();
    assert!(
        e.contains("rank 0 runs --copy auto but rank 1 was given --copy ring"),
        "{e}"
    );
}

/// Calls on registered buffers back to back: the moment a call returns, each rank copies its
/// result out and overwrites its buffers, so a peer that still read them after the call
/// returned would take the overwritten values and show a wrong result. Every collective that
/// reads registered buffers, in place and out, sizes on both sides of the small all-reduce's
/// bound and of `--copy auto`'s (calls through the rings between calls on registered buffers),
/// roots in turn, one rank sleeping now and then to shake the timing.
#[test]
fn registered_calls_back_to_back_never_read_a_returned_buffer() {
    let n = 3;
    let collectives = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
    ];
    let counts = [1, 1000, 70_001, 300_000];
    let results = on_ranks(n, Wire::Shm, |comm| {
        let mut wrong = Vec::new();
        for round in 0..400u64 {
            let case = Case {
                collective: collectives[round as usize % 4],
                count: counts[(round as usize / 4) % 4],
                op: ReduceOp::Sum,
                root: round as usize % n,
                in_place: (round / 16) % 2 == 0,
                seed: round,
            };
            let mut buffers = case.buffers::<i32>(comm).unwrap();
            case.call(comm, &mut buffers).unwrap();
            let got = case.result(comm, &buffers).unwrap();
            match &mut buffers {
                Buffers::InPlace(buf) => overwrite(comm, buf),
                Buffers::OutOfPlace { send, recv } => {
                    overwrite(comm, send);
                    overwrite(comm, recv);
                }
            }
            let want = case.expected::<i32>(comm.rank(), n);
            let mismatch = Mismatch::between("result", &got, &want);
            if mismatch.wrong > 0 {
                wrong.push(format!(
                    "round {round}, {}: {:?}",
                    case.name(i32::DTYPE),
                    mismatch.first
                ));
            }
            if round % 7 == comm.rank() as u64 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        wrong
    });
    for (rank, wrong) in results.iter().enumerate() {
        assert!(wrong.is_empty(), "rank {rank}: {wrong:?}");
    }
}

/// Overwrites `buf` with a value no call makes.
fn overwrite(comm: &Communicator, buf: &mut Buffer<i32>) {
    let poison = comm.filled(-7_777_777, buf.len()).unwrap();
    comm.copy_from_host(&poison, buf).unwrap();
}

/// One rank that cannot open its peers' memory turns registered buffers off for the whole job
/// under `--copy auto` (every rank's line says why, and buffers stay on the heap); `--copy
/// registered` fails on every rank naming it.
#[test]
fn one_rank_that_cannot_open_peers_turns_registered_buffers_off_for_all() {
    let refusing = |copy| {
        move |rank| Wiring {
            transport: TransportChoice::Shm,
            copy,
            refuse_cross_memory: false,
            refuse_registered: rank == 1,
            heartbeat: Default::default(),
        }
    };
    let why = "rank 1 cannot open rank 0's buffers: refused";
    for got in wired(3, refusing(CopyChoice::Auto)) {
        let (_, line) = got.unwrap();
        let start = "shared memory between the 3 ranks of this host; no registered buffers: ";
        assert!(line.starts_with(start) && line.contains(why), "{line}");
    }
    for got in wired(3, refusing(CopyChoice::Registered)) {
        let e = got.unwrap_err();
        assert!(e.contains("--copy registered: ") && e.contains(why), "{e}");
    }
}

/// A buffer another communicator made (on the heap) beside registered ones: every rank learns
/// it when the call opens, and all take the rings; results are right either way.
#[test]
fn a_heap_buffer_on_one_rank_sends_every_rank_through_the_rings() {
    let n = 3;
    let results = on_ranks(n, Wire::Shm, |comm| {
        let rank = comm.rank();
        let heap = Communicator::cpu(Box::new(ChannelTransport::mesh(1, TIMEOUT).remove(0)), 0);
        let mut sums = Vec::new();
        for round in 0..6 {
            let values = vec![rank as i64 + round; 70_001];
            let mut buf = match (round + rank as i64) % 3 {
                0 => heap.buffer(&values).unwrap(),
                _ => comm.buffer(&values).unwrap(),
            };
            comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
            sums.push(comm.to_host(&buf).unwrap()[70_000]);
        }
        (comm.registers_buffers(), heap.registers_buffers(), sums)
    });
    for (registers, heap_registers, sums) in results {
        assert!(registers && !heap_registers);
        let want: Vec<i64> = (0..6).map(|round| 3 * round + 3).collect();
        assert_eq!(sums, want);
    }
}
