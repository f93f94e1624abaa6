//! Every collective and reduction, against a sequential reference on random data: world sizes 1
//! to 8, lengths 0, 1, not divisible by the world size and 16 MiB, each dtype, in place and out of
//! place, over both transports (channels between threads, and real TCP sockets).
//!
//! Inputs are small whole numbers, so every float sum and product is exact and the ring's order
//! of additions cannot make a correct result look wrong.

use std::sync::Arc;
use std::time::Duration;

use comm_core::backend::cpu::{ChannelTransport, TcpTransport, Transport};
use comm_core::check::{input, reference};
use comm_core::store::{Store, StoreServer};
use comm_core::{Communicator, Element, ReduceOp};

const TIMEOUT: Duration = Duration::from_secs(60);
const BIG_BYTES: usize = 16 << 20;

#[derive(Clone, Copy, Debug)]
enum Wire {
    Channels,
    Tcp,
}

/// Runs `body` on `n` ranks, one thread each, and returns what each rank returned.
fn on_ranks<R: Send>(n: usize, wire: Wire, body: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    let transports: Vec<Box<dyn Transport>> = match wire {
        Wire::Channels => ChannelTransport::mesh(n, TIMEOUT)
            .into_iter()
            .map(|t| Box::new(t) as Box<dyn Transport>)
            .collect(),
        Wire::Tcp => {
            let server = StoreServer::bind(0, n).unwrap();
            let port = server.port();
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..n)
                    .map(|rank| {
                        s.spawn(move || {
                            let store =
                                Store::connect("127.0.0.1", port, rank, n, TIMEOUT).unwrap();
                            Box::new(TcpTransport::connect(&store, "test", rank, n).unwrap())
                                as Box<dyn Transport>
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
                    body(&Communicator::cpu(t, rank, None, None))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Small whole numbers, different on every rank (see `comm_core::check::input`).
fn inputs<T: Element>(n: usize, len: usize, op: ReduceOp, seed: u64) -> Vec<Vec<T>> {
    (0..n).map(|rank| input(seed, rank, len, op)).collect()
}

fn assert_same<T: Element>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{what}: element {i} is {:?}, expected {:?}",
            got[i], want[i]
        );
    }
}

fn check_all_reduce<T: Element>(wire: Wire, n: usize, len: usize, op: ReduceOp) {
    let data = inputs::<T>(n, len, op, (n * 7919 + len) as u64);
    let want = reference(&data, op);
    let results = on_ranks(n, wire, |comm| {
        let mine = &data[comm.rank()];
        let mut inplace = comm.buffer(mine).unwrap();
        comm.all_reduce(&mut inplace, op).unwrap();
        let send = comm.buffer(mine).unwrap();
        let mut recv = comm.zeros::<T>(len).unwrap();
        comm.all_reduce_into(&send, &mut recv, op).unwrap();
        assert_eq!(comm.to_host(&send).unwrap(), *mine, "send buffer changed");
        (
            comm.to_host(&inplace).unwrap(),
            comm.to_host(&recv).unwrap(),
        )
    });
    for (rank, (inplace, outofplace)) in results.iter().enumerate() {
        let what = format!(
            "all_reduce {op} {} n={n} len={len} {wire:?} rank {rank}",
            T::DTYPE
        );
        assert_same(inplace, &want, &format!("{what} in place"));
        assert_same(outofplace, &want, &format!("{what} out of place"));
    }
}

fn check_reduce<T: Element>(wire: Wire, n: usize, len: usize, op: ReduceOp) {
    let data = inputs::<T>(n, len, op, (n * 31 + len) as u64);
    let want = reference(&data, op);
    let root = n / 2;
    let results = on_ranks(n, wire, |comm| {
        let mine = &data[comm.rank()];
        let mut inplace = comm.buffer(mine).unwrap();
        comm.reduce(&mut inplace, op, root).unwrap();
        let send = comm.buffer(mine).unwrap();
        let mut recv = comm.zeros::<T>(len).unwrap();
        comm.reduce_into(&send, &mut recv, op, root).unwrap();
        (
            comm.to_host(&inplace).unwrap(),
            comm.to_host(&recv).unwrap(),
        )
    });
    for (rank, (inplace, outofplace)) in results.iter().enumerate() {
        let what = format!(
            "reduce {op} {} n={n} len={len} {wire:?} rank {rank}",
            T::DTYPE
        );
        if rank == root {
            assert_same(inplace, &want, &what);
            assert_same(outofplace, &want, &what);
        } else {
            assert_same(
                inplace,
                &data[rank],
                &format!("{what}: non-root buffer changed"),
            );
            assert_same(
                outofplace,
                &vec![T::default(); len],
                &format!("{what}: non-root recv written"),
            );
        }
    }
}

fn check_reduce_scatter<T: Element>(wire: Wire, n: usize, count: usize, op: ReduceOp) {
    let data = inputs::<T>(n, n * count, op, (n * 131 + count) as u64);
    let want = reference(&data, op);
    let results = on_ranks(n, wire, |comm| {
        let rank = comm.rank();
        let mine = &data[rank];
        let mut inplace = comm.buffer(mine).unwrap();
        comm.reduce_scatter(&mut inplace, op).unwrap();
        let send = comm.buffer(mine).unwrap();
        let mut recv = comm.zeros::<T>(count).unwrap();
        comm.reduce_scatter_into(&send, &mut recv, op).unwrap();
        let inplace = comm.to_host(&inplace).unwrap();
        (
            inplace[rank * count..(rank + 1) * count].to_vec(),
            comm.to_host(&recv).unwrap(),
        )
    });
    for (rank, (inplace, outofplace)) in results.iter().enumerate() {
        let block = &want[rank * count..(rank + 1) * count];
        let what = format!(
            "reduce_scatter {op} {} n={n} count={count} {wire:?} rank {rank}",
            T::DTYPE
        );
        assert_same(inplace, block, &format!("{what} in place"));
        assert_same(outofplace, block, &format!("{what} out of place"));
    }
}

fn check_all_gather<T: Element>(wire: Wire, n: usize, count: usize) {
    let data = inputs::<T>(n, count, ReduceOp::Sum, (n * 17 + count) as u64);
    let want: Vec<T> = data.concat();
    let results = on_ranks(n, wire, |comm| {
        let rank = comm.rank();
        let mut staged = vec![T::default(); n * count];
        staged[rank * count..(rank + 1) * count].copy_from_slice(&data[rank]);
        let mut inplace = comm.buffer(&staged).unwrap();
        comm.all_gather(&mut inplace).unwrap();
        let send = comm.buffer(&data[rank]).unwrap();
        let mut recv = comm.zeros::<T>(n * count).unwrap();
        comm.all_gather_into(&send, &mut recv).unwrap();
        (
            comm.to_host(&inplace).unwrap(),
            comm.to_host(&recv).unwrap(),
        )
    });
    for (rank, (inplace, outofplace)) in results.iter().enumerate() {
        let what = format!(
            "all_gather {} n={n} count={count} {wire:?} rank {rank}",
            T::DTYPE
        );
        assert_same(inplace, &want, &format!("{what} in place"));
        assert_same(outofplace, &want, &format!("{what} out of place"));
    }
}

fn check_broadcast<T: Element>(wire: Wire, n: usize, len: usize) {
    let data = inputs::<T>(n, len, ReduceOp::Sum, (n * 5 + len) as u64);
    let root = n - 1;
    let results = on_ranks(n, wire, |comm| {
        let mine = &data[comm.rank()];
        let mut inplace = comm.buffer(mine).unwrap();
        comm.broadcast(&mut inplace, root).unwrap();
        let send = comm.buffer(mine).unwrap();
        let mut recv = comm.zeros::<T>(len).unwrap();
        comm.broadcast_into(&send, &mut recv, root).unwrap();
        (
            comm.to_host(&inplace).unwrap(),
            comm.to_host(&recv).unwrap(),
        )
    });
    for (rank, (inplace, outofplace)) in results.iter().enumerate() {
        let what = format!(
            "broadcast {} n={n} len={len} {wire:?} rank {rank}",
            T::DTYPE
        );
        assert_same(inplace, &data[root], &format!("{what} in place"));
        assert_same(outofplace, &data[root], &format!("{what} out of place"));
    }
}

/// Each rank sends to the next and receives from the previous (even ranks send first).
fn check_send_recv<T: Element>(wire: Wire, n: usize, len: usize) {
    if n < 2 {
        return;
    }
    let data = inputs::<T>(n, len, ReduceOp::Sum, (n * 3 + len) as u64);
    let results = on_ranks(n, wire, |comm| {
        let rank = comm.rank();
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        let send = comm.buffer(&data[rank]).unwrap();
        let mut recv = comm.zeros::<T>(len).unwrap();
        if rank % 2 == 0 {
            comm.send(&send, next).unwrap();
            comm.recv(&mut recv, prev).unwrap();
        } else {
            comm.recv(&mut recv, prev).unwrap();
            comm.send(&send, next).unwrap();
        }
        // The same ring with every rank sending first, through the combined call.
        let mut both = comm.zeros::<T>(len).unwrap();
        comm.send_recv(&send, next, &mut both, prev).unwrap();
        comm.barrier().unwrap();
        (comm.to_host(&recv).unwrap(), comm.to_host(&both).unwrap())
    });
    for (rank, (got, both)) in results.iter().enumerate() {
        let what = format!(
            "send/recv {} n={n} len={len} {wire:?} rank {rank}",
            T::DTYPE
        );
        assert_same(got, &data[(rank + n - 1) % n], &what);
        assert_same(
            both,
            &data[(rank + n - 1) % n],
            &format!("{what} (send_recv)"),
        );
    }
}

/// All collectives for one dtype, one transport, one world size, at the given lengths.
fn check_everything<T: Element>(wire: Wire, n: usize, lens: &[usize]) {
    for &len in lens {
        for op in ReduceOp::ALL {
            check_all_reduce::<T>(wire, n, len, op);
            check_reduce::<T>(wire, n, len, op);
            check_reduce_scatter::<T>(wire, n, len.div_ceil(n), op);
        }
        check_all_gather::<T>(wire, n, len.div_ceil(n));
        check_broadcast::<T>(wire, n, len);
        check_send_recv::<T>(wire, n, len);
    }
}

/// Lengths 0, 1 and a few not divisible by the world size, small and past the algorithms'
/// small-message thresholds.
fn small_lengths(n: usize) -> Vec<usize> {
    vec![0, 1, n + 1, 1000 * n + 3, 70_001]
}

fn all_dtypes(wire: Wire, n: usize, lens: &[usize]) {
    check_everything::<f32>(wire, n, lens);
    check_everything::<f64>(wire, n, lens);
    check_everything::<i32>(wire, n, lens);
    check_everything::<i64>(wire, n, lens);
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

/// 16 MiB per rank, every collective and dtype, at an odd world size where blocks are uneven.
fn big(wire: Wire) {
    let n = 3;
    fn one<T: Element>(wire: Wire, n: usize) {
        let len = BIG_BYTES / std::mem::size_of::<T>() + 1;
        check_all_reduce::<T>(wire, n, len, ReduceOp::Sum);
        check_all_reduce::<T>(wire, n, len, ReduceOp::Max);
        check_reduce::<T>(wire, n, len, ReduceOp::Sum);
        check_reduce_scatter::<T>(wire, n, len.div_ceil(n), ReduceOp::Sum);
        check_all_gather::<T>(wire, n, len.div_ceil(n));
        check_broadcast::<T>(wire, n, len);
        check_send_recv::<T>(wire, n, len);
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
fn tcp_16_mib_eight_ranks() {
    let len = BIG_BYTES / 4;
    check_all_reduce::<f32>(Wire::Tcp, 8, len, ReduceOp::Avg);
    check_broadcast::<f32>(Wire::Tcp, 8, len);
}

#[test]
fn ranks_that_disagree_on_sizes_get_an_error_not_a_hang() {
    for wire in [Wire::Channels, Wire::Tcp] {
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
        assert!(err.contains("must have world size"), "{err}");
        let err = comm.send(&buf, comm.rank()).unwrap_err().to_string();
        assert!(err.contains("is not another rank"), "{err}");
        let mut out = comm.zeros::<f32>(3).unwrap();
        let err = comm
            .send_recv(&buf, 1 - comm.rank(), &mut out, 5)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("send_recv: peer 5 is not another rank"),
            "{err}"
        );
    });
}

#[test]
fn a_peer_that_disappears_is_reported() {
    let server = StoreServer::bind(0, 2).unwrap();
    let port = server.port();
    let results: Vec<Option<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let store =
                        Arc::new(Store::connect("127.0.0.1", port, rank, 2, TIMEOUT).unwrap());
                    let t = TcpTransport::connect(&store, "gone", rank, 2).unwrap();
                    let comm = Communicator::cpu(Box::new(t), rank, None, None);
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
        "{message}"
    );
}
