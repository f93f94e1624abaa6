//! One table line: a collective at one size, timed out-of-place and in-place, each followed by an
//! exact correctness check.
//!
//! Everything about the collective comes from comm-core's collective table through
//! [`check::Case`]: the buffer lengths for the size and world size, how each rank fills its
//! input, the call, and the reference the result is checked against (computed one rank's input
//! at a time, so checking 1 GB on 6 ranks does not hold 6 GB on every rank).

use comm_core::check::{self, Mismatch};
use comm_core::comm::Buffers;
use comm_core::timing::{time_loop_with, Average, Loop, Stopwatch, Timing};
use comm_core::{Collective, CommError, Communicator, DType, Element, ReduceOp, Result};

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
    /// The size asked for: the whole buffer, rounded down to whole elements (and to whole
    /// blocks for blocked collectives).
    pub bytes: u64,
}

/// How to measure.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The timed loop: warm-up, iterations, -m, -z and -I.
    pub timed: Loop,
    /// How the ranks' times become the reported one (-a).
    pub average: Average,
    pub checks: usize,
    pub out_of_place: bool,
    pub in_place: bool,
    pub inject_error: bool,
    /// On GPUs, the largest size whose buffers fit ([`crate::budget`]): the timed loop turns
    /// through buffer sets within it, as nccl-tests shifts its buffers within -e
    /// ([`rotation`]). None: one buffer set (the CPU backend).
    pub rotate_within: Option<u64>,
}

/// The most buffer sets one timed loop turns through: enough that a small size's sets are
/// spread as nccl-tests' shifted buffers are (its loop touches `iters` × `-m` places at most),
/// and a bound on allocations for a huge `-n` at a tiny size.
pub const MAX_BUFFER_SETS: usize = 1024;

/// How many buffer sets the timed loop of a call on `set_bytes` (the larger of its send and
/// receive buffers, nccl-tests' `max(sendBytes, expectedBytes)`) turns through, within
/// `within` bytes, over `calls` calls: nccl-tests' `startColl` shifts its buffers by that many
/// bytes every call, `iter % (maxbytes / totalnbytes)` times, so that consecutive calls never
/// read the same memory and a sweep is not timed out of the GPU's L2 cache (50 MB on an H100)
/// where a real workload's buffers would not be. We allocate `steps` separate sets instead of
/// one buffer of -e and offsets into it (our buffers are typed and whole), which reads different
/// memory from call to call in the same way, and within the same bytes: sets × `set_bytes` ≤
/// `within`. Never fewer than 1.
///
/// Only on GPUs: the CPU rows are compared with the course's Gloo and PyTorch numbers, whose
/// loops reuse one tensor, and the book reads the CPU curve's cache knee from them.
pub fn rotation(set_bytes: u64, within: u64, calls: usize) -> usize {
    let steps = within / set_bytes.max(1);
    (steps.min(calls as u64) as usize).clamp(1, MAX_BUFFER_SETS)
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
    /// The size column: the whole buffer in bytes (nccl-tests' `max(sendBytes, expectedBytes)`).
    pub bytes: u64,
    /// The count column: the call's count, as nccl-tests prints it (its `paramcount`): the
    /// whole buffer's elements for all_reduce, broadcast, reduce and sendrecv, one rank's block
    /// for all_gather, reduce_scatter, alltoall, gather and scatter.
    pub count: u64,
    pub out_of_place: Option<Outcome>,
    pub in_place: Option<Outcome>,
}

/// The call's count (per block for blocked collectives) and the whole buffer's elements, for
/// `bytes` of `elt`-byte elements on `n` ranks.
pub fn shape(c: Collective, bytes: u64, elt: usize, n: usize) -> (usize, u64) {
    let count = c.count_for((bytes / elt as u64) as usize, n);
    (count, c.counts(count, n, 0).whole() as u64)
}

/// Measures `case` on every rank (all must call it), marking iterations with `stopwatch` when
/// -I asks (one stopwatch for a whole run reuses its events). None when the size holds no
/// element per rank, or the collective needs more ranks than there are.
pub fn measure(
    comm: &Communicator,
    case: &Case,
    opts: &Options,
    stopwatch: &mut Stopwatch,
) -> Result<Option<Measured>> {
    #[allow(unreachable_patterns)] // with comm-core's f16 feature DType has more variants
    match case.dtype {
        DType::F32 => measure_as::<f32>(comm, case, opts, stopwatch),
        DType::F64 => measure_as::<f64>(comm, case, opts, stopwatch),
        DType::I32 => measure_as::<i32>(comm, case, opts, stopwatch),
        DType::I64 => measure_as::<i64>(comm, case, opts, stopwatch),
        other => Err(CommError::Usage(format!(
            "comm-bench does not measure {other} yet"
        ))),
    }
}

fn measure_as<T: Element>(
    comm: &Communicator,
    case: &Case,
    opts: &Options,
    stopwatch: &mut Stopwatch,
) -> Result<Option<Measured>> {
    let n = comm.world_size();
    let described = case.collective.describe();
    let (count, whole) = shape(case.collective, case.bytes, std::mem::size_of::<T>(), n);
    if count == 0 || n < described.min_ranks {
        return Ok(None);
    }
    if described.rooted && case.root >= n {
        return Err(CommError::Usage(format!(
            "-r/--root {}: not a rank of a world of {n}",
            case.root
        )));
    }
    let mut run = |in_place| {
        placement_outcome::<T>(comm, &check_case(case, count, in_place), opts, stopwatch)
    };
    let out_of_place = match opts.out_of_place {
        true => Some(run(false)?),
        false => None,
    };
    let in_place = match opts.in_place && described.in_place {
        true => Some(run(true)?),
        false => None,
    };
    Ok(Some(Measured {
        collective: case.collective,
        dtype: case.dtype,
        op: case.op,
        root: described.rooted.then_some(case.root),
        bytes: whole * std::mem::size_of::<T>() as u64,
        count: count as u64,
        out_of_place,
        in_place,
    }))
}

/// The line's call as comm-core's checks describe it.
fn check_case(case: &Case, count: usize, in_place: bool) -> check::Case {
    check::Case {
        collective: case.collective,
        count,
        op: case.op.unwrap_or(ReduceOp::Sum),
        root: case.root,
        in_place,
        seed: 0x5eed_0000 ^ case.bytes ^ ((case.collective as u64) << 40),
    }
}

/// The rank whose result `--inject-error` corrupts: the last, which checks something in every
/// collective (a reduce's other ranks check that their buffers were left alone).
fn injected_rank(n: usize) -> usize {
    n - 1
}

/// This rank's verdict on one checked call, corrupted first where `--inject-error` says.
fn verify<T: Element>(
    comm: &Communicator,
    case: &check::Case,
    buffers: &Buffers<T>,
    inject: bool,
) -> Result<Mismatch> {
    if !inject {
        return case.verify(comm, buffers);
    }
    let mut got = case.result(comm, buffers)?;
    if let Some(first) = got.first_mut() {
        *first = T::combine(ReduceOp::Sum, *first, T::from_i64(1));
    }
    let want = case.expected::<T>(comm.rank(), comm.world_size());
    Ok(Mismatch::between("result", &got, &want))
}

/// The buffer sets the timed loop turns through ([`rotation`]): the case's own first, then
/// zeroed ones (what they hold does not change the time; their results are not checked).
fn timed_buffers<T: Element>(
    comm: &Communicator,
    case: &check::Case,
    opts: &Options,
) -> Result<Vec<Buffers<T>>> {
    let counts = case.counts(comm.rank(), comm.world_size());
    let element = std::mem::size_of::<T>() as u64;
    let set_bytes = counts.send.max(counts.recv).max(counts.whole()) as u64 * element;
    let calls = opts.timed.iters * opts.timed.aggregate.max(1);
    let sets = opts
        .rotate_within
        .map_or(1, |within| rotation(set_bytes, within, calls));
    let mut out = vec![case.buffers::<T>(comm)?];
    for _ in 1..sets {
        out.push(match case.in_place {
            true => Buffers::InPlace(comm.zeros(counts.whole())?),
            false => Buffers::OutOfPlace {
                send: comm.zeros(counts.send)?,
                recv: comm.zeros(counts.recv)?,
            },
        });
    }
    Ok(out)
}

fn placement_outcome<T: Element>(
    comm: &Communicator,
    case: &check::Case,
    opts: &Options,
    stopwatch: &mut Stopwatch,
) -> Result<Outcome> {
    let timing = {
        let mut sets = timed_buffers::<T>(comm, case, opts)?;
        let mut next = 0;
        time_loop_with(comm, &opts.timed, stopwatch, || {
            let set = next % sets.len();
            let buffers = &mut sets[set];
            next += 1;
            case.call(comm, buffers)
        })?
    };
    if opts.checks == 0 {
        return Ok(Outcome {
            timing,
            wrong: None,
        });
    }
    let inject = opts.inject_error && comm.rank() == injected_rank(comm.world_size());
    let mut wrong = 0u64;
    for _ in 0..opts.checks {
        let mut buffers = case.buffers::<T>(comm)?;
        case.call(comm, &mut buffers)?;
        wrong += verify(comm, case, &buffers, inject)?.wrong;
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
        assert_eq!(
            shape(Collective::AllToAll, 1_000_000, 4, 6),
            (41_666, 249_996)
        );
        assert_eq!(shape(Collective::ReduceScatter, 8, 4, 4), (0, 0));
    }

    /// nccl-tests' shift: `maxbytes / totalnbytes` places, of which a loop of `iters` × `-m`
    /// calls reaches at most that many.
    #[test]
    fn buffers_rotate_within_the_largest_size_as_nccl_tests_shifts_them() {
        const MB: u64 = 1 << 20;
        // 1 GiB sweep, 8 B call, 20 calls: 20 sets (the calls bound it).
        assert_eq!(rotation(8, 1024 * MB, 20), 20);
        // 16 MiB within 64 MiB: 4 places, whatever the calls.
        assert_eq!(rotation(16 * MB, 64 * MB, 20), 4);
        assert_eq!(rotation(16 * MB, 64 * MB, 3), 3);
        // The largest size itself, or one that does not fit: one set.
        assert_eq!(rotation(64 * MB, 64 * MB, 20), 1);
        assert_eq!(rotation(64 * MB, 0, 20), 1);
        // A huge -n at a tiny size: bounded.
        assert_eq!(rotation(4, u64::MAX, 1_000_000), MAX_BUFFER_SETS);
        assert_eq!(rotation(0, 64 * MB, 0), 1);
    }

    /// The timed loop's buffer sets, on a CPU communicator of one rank: as many as [`rotation`]
    /// says, each shaped as the case's own (in place: one whole buffer; out of place: send and
    /// receive), the first holding the case's input; none beyond the first without a limit.
    #[test]
    fn timed_buffers_are_the_rotation_s_sets() {
        use comm_core::backend::cpu::ChannelTransport;
        let transport = ChannelTransport::mesh(1, std::time::Duration::from_secs(10))
            .pop()
            .unwrap();
        let comm = Communicator::cpu(Box::new(transport), 0);
        let opts = |rotate_within| Options {
            timed: Loop {
                warmup: 0,
                iters: 10,
                aggregate: 1,
                waiting: comm_core::timing::Waiting::BackToBack,
                per_iteration: false,
            },
            average: Average::Mean,
            checks: 0,
            out_of_place: true,
            in_place: true,
            inject_error: false,
            rotate_within,
        };
        for in_place in [false, true] {
            let case = check::Case {
                collective: Collective::AllGather,
                count: 256,
                op: ReduceOp::Sum,
                root: 0,
                in_place,
                seed: 1,
            };
            // 256 floats gathered from 1 rank: 1 KiB sets, 4 of them within 4 KiB.
            let sets = timed_buffers::<f32>(&comm, &case, &opts(Some(4096))).unwrap();
            assert_eq!(sets.len(), 4);
            for mut set in sets {
                let (send, recv) = set.parts();
                assert_eq!(
                    (send.map(|b| b.len()), recv.len()),
                    match in_place {
                        true => (None, 256),
                        false => (Some(256), 256),
                    }
                );
            }
            assert_eq!(
                timed_buffers::<f32>(&comm, &case, &opts(None))
                    .unwrap()
                    .len(),
                1
            );
        }
    }

    #[test]
    fn every_collective_gets_a_seed_of_its_own() {
        let case = |collective| Case {
            collective,
            dtype: DType::F32,
            op: None,
            root: 0,
            bytes: 4096,
        };
        let seeds: std::collections::HashSet<u64> = Collective::ALL
            .iter()
            .map(|&c| check_case(&case(c), 1, false).seed)
            .collect();
        assert_eq!(seeds.len(), Collective::ALL.len());
    }
}
