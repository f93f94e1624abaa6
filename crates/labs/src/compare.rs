//! One case of a collective lab on every rank: the library's collective and the student's
//! function on the same inputs, every element compared, and the ranks agreeing (through the
//! library's all-gather) on whether the case is right. Where it is not, rank 0 prints the first
//! wrong rank and element, the two values, and both grids.

use comm_core::check::{self, Case as CheckCase};
use comm_core::comm::Buffers;
use comm_core::{Collective, Communicator, DType, Element, Result};

use crate::cases::Case;
use crate::catalog::Lab;
use crate::code::Code;
use crate::panics;
use crate::report::{self, Verdict};

/// Runs the student's function for `case` on `buffers` (filled by [`CheckCase::buffers`]).
fn student<C: Code, T: Element>(
    lab: Lab,
    case: &CheckCase,
    comm: &Communicator,
    buffers: &mut Buffers<T>,
) -> Result<()> {
    panics::caught(|| match (lab, case.collective, buffers) {
        (Lab::Broadcast, _, Buffers::InPlace(buf)) => C::tree_broadcast(comm, buf, case.root),
        (Lab::AllReduce, _, Buffers::InPlace(buf)) => C::ring_all_reduce(comm, buf),
        (Lab::Rings, Collective::AllGather, Buffers::InPlace(buf)) => C::all_gather(comm, buf),
        (Lab::Rings, Collective::AllGather, Buffers::OutOfPlace { send, recv }) => {
            C::all_gather_into(comm, send, recv)
        }
        (Lab::Rings, _, Buffers::InPlace(buf)) => C::reduce_scatter(comm, buf),
        (Lab::Rings, _, Buffers::OutOfPlace { send, recv }) => {
            C::reduce_scatter_into(comm, send, recv)
        }
        (lab, c, _) => unreachable!("lab {} has no out-of-place {c}", lab.number()),
    })
}

/// The first element where `got` differs from `want`, and how many do.
fn differences<T: Element>(got: &[T], want: &[T]) -> (Option<usize>, usize) {
    let first = (0..got.len()).find(|&i| got[i] != want[i]);
    (first, check::count_wrong(got, want) as usize)
}

/// What one rank found in a case, as the ranks share it.
#[derive(Debug, Clone, Copy)]
struct Found<T> {
    /// The first wrong element of the result, and how many are wrong.
    wrong: Option<usize>,
    count: usize,
    /// The first element of the send buffer the student's function changed.
    send_changed: Option<usize>,
    /// The two values at the first wrong place: expected (or what the send buffer held) and got.
    values: [T; 2],
}

impl<T: Element> Found<T> {
    fn numbers(&self) -> [i64; 3] {
        let or_none = |i: Option<usize>| i.map_or(-1, |i| i as i64);
        [
            or_none(self.wrong),
            self.count as i64,
            or_none(self.send_changed),
        ]
    }
}

/// Every rank's [`Found`], gathered through the library's all-gather.
fn share<T: Element>(comm: &Communicator, mine: &Found<T>) -> Result<Vec<Found<T>>> {
    let n = comm.world_size();
    let mut numbers = comm.zeros::<i64>(3 * n)?;
    comm.all_gather_into(&comm.buffer(&mine.numbers())?, &mut numbers)?;
    let mut values = comm.zeros::<T>(2 * n)?;
    comm.all_gather_into(&comm.buffer(&mine.values)?, &mut values)?;
    let (numbers, values) = (comm.to_host(&numbers)?, comm.to_host(&values)?);
    let index = |v: i64| usize::try_from(v).ok();
    Ok((0..n)
        .map(|r| Found {
            wrong: index(numbers[3 * r]),
            count: numbers[3 * r + 1] as usize,
            send_changed: index(numbers[3 * r + 2]),
            values: [values[2 * r], values[2 * r + 1]],
        })
        .collect())
}

/// Runs case `case` on this rank; whether it is wrong (every rank answers alike). `label` is
/// `case 37 of 80`.
fn one<C: Code, T: Element>(
    lab: Lab,
    case: &Case,
    comm: &Communicator,
    label: &str,
) -> Result<bool> {
    let c = &case.check;
    let (rank, n) = (comm.rank(), comm.world_size());
    let mut library = c.buffers::<T>(comm)?;
    c.call(comm, &mut library)?;
    let mut yours = c.buffers::<T>(comm)?;
    student::<C, T>(lab, c, comm, &mut yours)?;
    let (got, want) = (c.result(comm, &yours)?, c.result(comm, &library)?);
    let (wrong, count) = differences(&got, &want);
    let (mut send_changed, mut values) = (None, [T::default(); 2]);
    if let Some(i) = wrong {
        values = [want[i], got[i]];
    } else if let Buffers::OutOfPlace { send, .. } = &yours {
        let (now, before) = (comm.to_host(send)?, c.input::<T>(rank, n));
        send_changed = differences(&now, &before).0;
        if let Some(i) = send_changed {
            values = [before[i], now[i]];
        }
    }
    let all = share(
        comm,
        &Found {
            wrong,
            count,
            send_changed,
            values,
        },
    )?;
    let Some(first) = all
        .iter()
        .position(|f| f.wrong.is_some() || f.send_changed.is_some())
    else {
        return Ok(false);
    };
    let f = &all[first];
    if rank == 0 {
        println!("{label} is wrong: {}", case.describe(lab));
        let wrong_ranks: Vec<String> = (0..n)
            .filter(|&r| all[r].wrong.is_some())
            .map(|r| r.to_string())
            .collect();
        match (f.wrong, f.send_changed) {
            (Some(i), _) => println!(
                "rank {first}, element {i}: expected {}, got {} ({} of {} elements wrong on rank {first}; wrong on ranks {})",
                f.values[0], f.values[1], f.count, got.len(), wrong_ranks.join(", ")
            ),
            (None, Some(i)) => println!(
                "rank {first} changed its send buffer: element {i} held {}, now {} (an out-of-place collective only reads its send buffer)",
                f.values[0], f.values[1]
            ),
            (None, None) => unreachable!("a rank was found wrong"),
        }
    }
    match (f.wrong, &yours) {
        (None, Buffers::OutOfPlace { send, .. }) => {
            comm.print_grid("Your send buffers after the call:", send)?;
            comm.print_grid(
                "What they held before:",
                &comm.buffer(&c.input::<T>(rank, n))?,
            )?;
        }
        _ => {
            comm.print_grid("Yours:", &comm.buffer(&got)?)?;
            comm.print_grid("The library's:", &comm.buffer(&want)?)?;
        }
    }
    Ok(true)
}

/// [`one`] for the case's element type.
fn typed<C: Code>(lab: Lab, case: &Case, comm: &Communicator, label: &str) -> Result<bool> {
    match case.dtype {
        DType::F32 => one::<C, f32>(lab, case, comm, label),
        DType::F64 => one::<C, f64>(lab, case, comm, label),
        DType::I32 => one::<C, i32>(lab, case, comm, label),
        DType::I64 => one::<C, i64>(lab, case, comm, label),
    }
}

/// Every case of `lab` on this communicator's rank count, in order, until one is wrong.
/// `before` cases ran on fewer ranks, of `total` in all (for the case's number).
pub fn cases<C: Code>(
    lab: Lab,
    comm: &Communicator,
    before: usize,
    total: usize,
) -> Result<Verdict> {
    let cases = crate::cases::cases(lab, comm.world_size());
    for (k, case) in cases.iter().enumerate() {
        report::in_case(k);
        let label = format!("case {} of {total}", before + k + 1);
        if typed::<C>(lab, case, comm, &label)? {
            return Ok(Verdict::Wrong(k));
        }
    }
    Ok(Verdict::Right(cases.len()))
}

/// `--steps` and `--trace`: the lab's shown cases, each with every rank's buffers before, the
/// student's own steps (those it shows with `show_step`), its result and the expected one.
///
/// `quiet` is a communicator of the same ranks that shows no steps, for the checker's own calls.
pub fn watch<C: Code>(lab: Lab, comm: &Communicator, quiet: &Communicator) -> Result<Verdict> {
    let (rank, n) = (comm.rank(), comm.world_size());
    for (k, case) in crate::cases::watched(lab, n).iter().enumerate() {
        report::in_case(k);
        let c = &case.check;
        if rank == 0 {
            println!("lab {}: your code on {}", lab.number(), case.describe(lab));
        }
        let mut yours = c.buffers::<i32>(comm)?;
        let (_, before) = yours.parts();
        comm.print_grid("Before:", before)?;
        student::<C, i32>(lab, c, comm, &mut yours)?;
        let got = c.result(comm, &yours)?;
        let want = c.expected::<i32>(rank, n);
        comm.print_grid("Yours:", &comm.buffer(&got)?)?;
        comm.print_grid("Expected (the library's result):", &comm.buffer(&want)?)?;
        let (wrong, count) = differences(&got, &want);
        let all = share(
            quiet,
            &Found {
                wrong,
                count,
                send_changed: None,
                values: wrong.map_or([0; 2], |i| [want[i], got[i]]),
            },
        )?;
        if let Some(first) = all.iter().position(|f| f.wrong.is_some()) {
            let f = &all[first];
            if rank == 0 {
                println!(
                    "wrong: rank {first}, element {}: expected {}, got {}",
                    f.wrong.unwrap_or(0),
                    f.values[0],
                    f.values[1]
                );
            }
            return Ok(Verdict::Wrong(k));
        }
    }
    if rank == 0 {
        println!("right: your result is the library's on every rank");
    }
    Ok(Verdict::Right(crate::cases::watched(lab, n).len()))
}
