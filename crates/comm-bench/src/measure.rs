//! One table line: a collective at one size, timed out-of-place and in-place, each followed by an
//! exact correctness check.
//!
//! Inputs are comm-core's [`check::input`]: small whole numbers from (seed, rank), so any rank can
//! compute any other rank's input and float sums are exact whatever order an algorithm adds in.
//! The reference folds the ranks' inputs in rank order with the same [`reduce_into`] and
//! [`finish`] as [`check::reference`], but one rank's input at a time: holding all of them, as
//! `check::reference` does, would take world size × the buffer on every rank (36 GB for 1 GB on
//! 6 ranks).

use comm_core::check;
use comm_core::dtype::{finish, reduce_into};
use comm_core::timing::{time_iterations, Collective, Timing};
use comm_core::{Buffer, CommError, Communicator, DType, Element, ReduceOp, Result};

use crate::plan::{has_in_place, rooted};

/// nccl-tests' two ways to call a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Separate send and receive buffers.
    OutOfPlace,
    /// The result overwrites the input.
    InPlace,
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::OutOfPlace => "out-of-place",
            Placement::InPlace => "in-place",
        }
    }
}

/// What to measure on a line.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub collective: Collective,
    pub dtype: DType,
    /// None for collectives that do not reduce.
    pub op: Option<ReduceOp>,
    pub root: usize,
    /// The size asked for; rounded down to whole elements (per rank for all_gather and
    /// reduce_scatter).
    pub bytes: u64,
}

/// How to measure.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub warmup: usize,
    pub iters: usize,
    pub checks: usize,
    pub out_of_place: bool,
    pub in_place: bool,
    pub inject_error: bool,
}

/// One placement's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub timing: Timing,
    /// Wrong elements summed over ranks; None when not checked.
    pub wrong: Option<u64>,
}

/// One table line.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub collective: Collective,
    pub dtype: DType,
    pub op: Option<ReduceOp>,
    pub root: Option<usize>,
    /// The size column: the whole buffer in bytes.
    pub bytes: u64,
    pub count: u64,
    pub out_of_place: Option<Outcome>,
    pub in_place: Option<Outcome>,
}

/// Elements in one rank's input (the block, for all_gather and reduce_scatter) and in the whole
/// buffer the size column describes, for `bytes` of `elt`-byte elements on `n` ranks.
pub fn shape(c: Collective, bytes: u64, elt: usize, n: usize) -> (usize, u64) {
    let elements = bytes / elt as u64;
    match c {
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
            let block = elements / n as u64;
            (block as usize, block * n as u64)
        }
        _ => (elements as usize, elements),
    }
}

/// Measures `case` on every rank (all must call it). None when the size holds no element per
/// rank, or the collective needs more ranks than there are.
pub fn measure(comm: &Communicator, case: &Case, opts: &Options) -> Result<Option<Measured>> {
    #[allow(unreachable_patterns)] // with comm-core's f16 feature DType has more variants
    match case.dtype {
        DType::F32 => measure_as::<f32>(comm, case, opts),
        DType::F64 => measure_as::<f64>(comm, case, opts),
        DType::I32 => measure_as::<i32>(comm, case, opts),
        DType::I64 => measure_as::<i64>(comm, case, opts),
        other => Err(CommError::Usage(format!(
            "comm-bench does not measure {other} yet"
        ))),
    }
}

fn measure_as<T: Element>(
    comm: &Communicator,
    case: &Case,
    opts: &Options,
) -> Result<Option<Measured>> {
    let n = comm.world_size();
    let (per, count) = shape(case.collective, case.bytes, std::mem::size_of::<T>(), n);
    if per == 0 || (case.collective == Collective::SendRecv && n < 2) {
        return Ok(None);
    }
    if rooted(case.collective) && case.root >= n {
        return Err(CommError::Usage(format!(
            "-r/--root {}: not a rank of a world of {n}",
            case.root
        )));
    }
    let run = |placement| placement_outcome::<T>(comm, case, placement, per, opts);
    let out_of_place = match opts.out_of_place {
        true => Some(run(Placement::OutOfPlace)?),
        false => None,
    };
    let in_place = match opts.in_place && has_in_place(case.collective) {
        true => Some(run(Placement::InPlace)?),
        false => None,
    };
    Ok(Some(Measured {
        collective: case.collective,
        dtype: case.dtype,
        op: case.op,
        root: rooted(case.collective).then_some(case.root),
        bytes: count * std::mem::size_of::<T>() as u64,
        count,
        out_of_place,
        in_place,
    }))
}

/// A rank's buffers for one call: `a` alone in place; `a` (send) and `b` (receive) out of place.
struct Buffers<T: Element> {
    a: Buffer<T>,
    b: Option<Buffer<T>>,
}

fn seed(case: &Case) -> u64 {
    0x5eed_0000 ^ case.bytes ^ ((case.collective as u64) << 40)
}

fn input_op(case: &Case) -> ReduceOp {
    case.op.unwrap_or(ReduceOp::Sum)
}

fn setup<T: Element>(
    comm: &Communicator,
    case: &Case,
    placement: Placement,
    per: usize,
) -> Result<Buffers<T>> {
    let (n, rank) = (comm.world_size(), comm.rank());
    let mine = |len| check::input::<T>(seed(case), rank, len, input_op(case));
    let out = placement == Placement::OutOfPlace;
    Ok(match case.collective {
        Collective::AllGather if !out => {
            let mut staged = vec![T::default(); n * per];
            staged[rank * per..(rank + 1) * per].copy_from_slice(&mine(per));
            Buffers {
                a: comm.buffer(&staged)?,
                b: None,
            }
        }
        Collective::AllGather => Buffers {
            a: comm.buffer(&mine(per))?,
            b: Some(comm.zeros(n * per)?),
        },
        Collective::ReduceScatter => Buffers {
            a: comm.buffer(&mine(n * per))?,
            b: if out { Some(comm.zeros(per)?) } else { None },
        },
        _ => Buffers {
            a: comm.buffer(&mine(per))?,
            b: if out { Some(comm.zeros(per)?) } else { None },
        },
    })
}

/// One call of the collective on `bufs`.
fn call<T: Element>(comm: &Communicator, case: &Case, bufs: &mut Buffers<T>) -> Result<()> {
    let (op, root) = (input_op(case), case.root);
    let a = &mut bufs.a;
    match (case.collective, bufs.b.as_mut()) {
        (Collective::AllReduce, None) => comm.all_reduce(a, op),
        (Collective::AllReduce, Some(b)) => comm.all_reduce_into(a, b, op),
        (Collective::AllGather, None) => comm.all_gather(a),
        (Collective::AllGather, Some(b)) => comm.all_gather_into(a, b),
        (Collective::ReduceScatter, None) => comm.reduce_scatter(a, op),
        (Collective::ReduceScatter, Some(b)) => comm.reduce_scatter_into(a, b, op),
        (Collective::Broadcast, None) => comm.broadcast(a, root),
        (Collective::Broadcast, Some(b)) => comm.broadcast_into(a, b, root),
        (Collective::Reduce, None) => comm.reduce(a, op, root),
        (Collective::Reduce, Some(b)) => comm.reduce_into(a, b, op, root),
        (Collective::SendRecv, Some(b)) => send_recv(comm, a, b),
        (c, _) => Err(CommError::Usage(format!(
            "comm-bench cannot run {c} this way"
        ))),
    }
}

/// The ring exchange, as nccl-tests' sendrecv: every rank sends to rank+1 while it receives from
/// rank-1, both directions at once (one grouped call on NCCL).
fn send_recv<T: Element>(
    comm: &Communicator,
    send: &Buffer<T>,
    recv: &mut Buffer<T>,
) -> Result<()> {
    let (n, rank) = (comm.world_size(), comm.rank());
    comm.send_recv(send, (rank + 1) % n, recv, (rank + n - 1) % n)
}

/// This rank's part of the result, on the host; None where the rank has nothing to check (a
/// reduce's non-root ranks).
fn result<T: Element>(
    comm: &Communicator,
    case: &Case,
    bufs: &Buffers<T>,
    per: usize,
) -> Result<Option<Vec<T>>> {
    let rank = comm.rank();
    match (case.collective, &bufs.b) {
        (Collective::Reduce, _) if rank != case.root => Ok(None),
        (Collective::ReduceScatter, None) => {
            let mut all = comm.to_host(&bufs.a)?;
            all.truncate((rank + 1) * per);
            all.drain(..rank * per);
            Ok(Some(all))
        }
        (_, Some(b)) => Ok(Some(comm.to_host(b)?)),
        (_, None) => Ok(Some(comm.to_host(&bufs.a)?)),
    }
}

/// Folds `n` parts in rank order, one part in memory at a time: [`check::reference`]'s result.
fn fold<T: Element>(n: usize, op: ReduceOp, part: impl Fn(usize) -> Vec<T>) -> Vec<T> {
    let mut acc = part(0);
    for r in 1..n {
        reduce_into(op, &mut acc, &part(r));
    }
    finish(op, &mut acc, n);
    acc
}

/// What this rank's part of the result must be.
fn expected<T: Element>(case: &Case, n: usize, rank: usize, per: usize) -> Vec<T> {
    let (seed, op) = (seed(case), input_op(case));
    let input = |r, len| check::input::<T>(seed, r, len, op);
    match case.collective {
        Collective::AllReduce | Collective::Reduce => fold(n, op, |r| input(r, per)),
        Collective::ReduceScatter => fold(n, op, |r| {
            let mut v = input(r, n * per);
            v.truncate((rank + 1) * per);
            v.drain(..rank * per);
            v
        }),
        Collective::AllGather => (0..n).flat_map(|r| input(r, per)).collect(),
        Collective::Broadcast => input(case.root, per),
        Collective::SendRecv => input((rank + n - 1) % n, per),
        Collective::AllToAll => Vec::new(),
    }
}

/// Elements of `got` that differ from `want` (a length mismatch counts the longer length).
pub fn count_wrong<T: PartialEq>(got: &[T], want: &[T]) -> u64 {
    if got.len() != want.len() {
        return got.len().max(want.len()) as u64;
    }
    got.iter().zip(want).filter(|(a, b)| a != b).count() as u64
}

/// The rank whose result `--inject-error` corrupts: one that checks something.
fn injected_rank(case: &Case, n: usize) -> usize {
    match case.collective {
        Collective::Reduce => case.root,
        _ => n - 1,
    }
}

fn placement_outcome<T: Element>(
    comm: &Communicator,
    case: &Case,
    placement: Placement,
    per: usize,
    opts: &Options,
) -> Result<Outcome> {
    let (n, rank) = (comm.world_size(), comm.rank());
    let timing = {
        let mut bufs = setup::<T>(comm, case, placement, per)?;
        time_iterations(comm, opts.warmup, opts.iters, || {
            call(comm, case, &mut bufs)
        })?
    };
    if opts.checks == 0 {
        return Ok(Outcome {
            timing,
            wrong: None,
        });
    }
    let mut wrong = 0u64;
    for _ in 0..opts.checks {
        let got = {
            let mut bufs = setup::<T>(comm, case, placement, per)?;
            call(comm, case, &mut bufs)?;
            result(comm, case, &bufs, per)?
        };
        if let Some(mut got) = got {
            if opts.inject_error && rank == injected_rank(case, n) {
                if let Some(first) = got.first_mut() {
                    *first = T::combine(ReduceOp::Sum, *first, T::from_i64(1));
                }
            }
            wrong += count_wrong(&got, &expected::<T>(case, n, rank, per));
        }
    }
    // #wrong is the sum over ranks, as in nccl-tests.
    let mut total = comm.buffer(&[wrong as i64])?;
    comm.all_reduce(&mut total, ReduceOp::Sum)?;
    let total = comm.to_host(&total)?[0];
    Ok(Outcome {
        timing,
        wrong: Some(total as u64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_round_to_whole_elements_per_rank() {
        assert_eq!(
            shape(Collective::AllReduce, 1 << 20, 4, 6),
            (1 << 18, 1 << 18)
        );
        assert_eq!(shape(Collective::AllReduce, 6, 4, 2), (1, 1));
        // 1 MB of floats over 6 ranks: 41666 per rank, 249996 in the gathered buffer.
        assert_eq!(
            shape(Collective::AllGather, 1_000_000, 4, 6),
            (41_666, 249_996)
        );
        assert_eq!(shape(Collective::ReduceScatter, 8, 4, 4), (0, 0));
    }

    #[test]
    fn wrong_elements() {
        assert_eq!(count_wrong(&[1, 2, 3], &[1, 2, 3]), 0);
        assert_eq!(count_wrong(&[1, 5, 3], &[1, 2, 4]), 2);
        assert_eq!(count_wrong(&[1, 2], &[1, 2, 3]), 3);
    }

    #[test]
    fn the_fold_is_check_reference() {
        let case = Case {
            collective: Collective::AllReduce,
            dtype: DType::F32,
            op: Some(ReduceOp::Avg),
            root: 0,
            bytes: 4096,
        };
        for n in 1..5 {
            let inputs: Vec<Vec<f32>> = (0..n)
                .map(|r| check::input(seed(&case), r, 1024, ReduceOp::Avg))
                .collect();
            let want = check::reference(&inputs, ReduceOp::Avg);
            assert_eq!(expected::<f32>(&case, n, 0, 1024), want);
            // reduce_scatter: block `rank` of the reduction of each rank's whole buffer.
            let rs = Case {
                collective: Collective::ReduceScatter,
                ..case
            };
            let blocks: Vec<Vec<f32>> = (0..n)
                .map(|r| check::input(seed(&rs), r, n * 3, ReduceOp::Avg))
                .collect();
            let all = check::reference(&blocks, ReduceOp::Avg);
            for rank in 0..n {
                assert_eq!(
                    expected::<f32>(&rs, n, rank, 3),
                    all[rank * 3..(rank + 1) * 3]
                );
            }
        }
    }
}
