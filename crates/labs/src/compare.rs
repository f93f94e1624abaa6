//! One case of a collective lab on every rank: the library's collective and the student's
//! function on the same inputs, every element compared, and the ranks agreeing (through the
//! library's all-gather) on whether the case is right. Where it is not, rank 0 prints the first
//! wrong rank and element, the two values, and both grids.

use comm_core::check::Case as CheckCase;
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

/// The first element where `got` is not `same` as `want`, and how many are not.
fn differences<T: Element>(
    got: &[T],
    want: &[T],
    same: impl Fn(T, T) -> bool,
) -> (Option<usize>, usize) {
    let wrong = |i: &usize| !same(got[*i], want[*i]);
    let first = (0..got.len()).find(wrong);
    (first, (0..got.len()).filter(wrong).count())
}

/// Exact equality: the labs' inputs are small whole numbers, exact in any order of adding.
pub fn exactly<T: Element>(a: T, b: T) -> bool {
    a == b
}

/// What one rank found in a case, as the ranks share it.
#[derive(Debug, Clone, Copy)]
struct Found<T> {
    /// The first wrong element, and how many are wrong.
    wrong: Option<usize>,
    count: usize,
    /// The two values there: expected and got.
    values: [T; 2],
}

/// Every rank's [`Found`], gathered through the library's all-gather.
fn share<T: Element>(comm: &Communicator, mine: &Found<T>) -> Result<Vec<Found<T>>> {
    let n = comm.world_size();
    let numbers = [mine.wrong.map_or(-1, |i| i as i64), mine.count as i64];
    let mut all_numbers = comm.zeros::<i64>(2 * n)?;
    comm.all_gather_into(&comm.buffer(&numbers)?, &mut all_numbers)?;
    let mut values = comm.zeros::<T>(2 * n)?;
    comm.all_gather_into(&comm.buffer(&mine.values)?, &mut values)?;
    let (numbers, values) = (comm.to_host(&all_numbers)?, comm.to_host(&values)?);
    Ok((0..n)
        .map(|r| Found {
            wrong: usize::try_from(numbers[2 * r]).ok(),
            count: numbers[2 * r + 1] as usize,
            values: [values[2 * r], values[2 * r + 1]],
        })
        .collect())
}

/// What a wrong case is called and shown as.
pub struct Shown<'a> {
    /// `case 37 of 80 is wrong: 4 ranks, 10 float elements, in place`: the first line.
    pub headline: String,
    /// What the values are: `element` (of the result), or `send buffer element`.
    pub element: &'a str,
    /// The grids' titles: the student's values, then the right ones.
    pub titles: [&'a str; 2],
}

/// Compares this rank's `got` with `want`, element by element, and agrees with the other ranks
/// on whether every rank is right. If not, rank 0 prints `shown`'s headline, the first wrong
/// rank and element, the two values there, and both grids (every rank's `got`, then `want`).
/// Whether some rank is wrong (every rank answers alike).
pub fn agree<T: Element>(
    comm: &Communicator,
    got: &[T],
    want: &[T],
    same: impl Fn(T, T) -> bool,
    shown: &Shown<'_>,
) -> Result<bool> {
    let (wrong, count) = differences(got, want, same);
    let values = wrong.map_or([T::default(); 2], |i| [want[i], got[i]]);
    let all = share(
        comm,
        &Found {
            wrong,
            count,
            values,
        },
    )?;
    let Some(first) = all.iter().position(|f| f.wrong.is_some()) else {
        return Ok(false);
    };
    if comm.rank() == 0 {
        let f = &all[first];
        let wrong_ranks: Vec<String> = (0..all.len())
            .filter(|&r| all[r].wrong.is_some())
            .map(|r| r.to_string())
            .collect();
        let ranks = if wrong_ranks.len() == 1 {
            "rank"
        } else {
            "ranks"
        };
        println!("{}", shown.headline);
        println!(
            "rank {first}, {} {}: expected {}, got {} ({} of {} wrong on rank {first}; wrong on \
             {ranks} {})",
            shown.element,
            f.wrong.unwrap_or(0),
            f.values[0],
            f.values[1],
            f.count,
            got.len(),
            wrong_ranks.join(", ")
        );
    }
    comm.print_grid(shown.titles[0], &comm.buffer(got)?)?;
    comm.print_grid(shown.titles[1], &comm.buffer(want)?)?;
    Ok(true)
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
    let headline = format!("{label} is wrong: {}", case.describe(lab));
    let result = Shown {
        headline: headline.clone(),
        element: "element",
        titles: ["Yours:", "The library's:"],
    };
    if agree(comm, &got, &want, exactly, &result)? {
        return Ok(true);
    }
    // Out of place, the send buffer is only read.
    let Buffers::OutOfPlace { send, .. } = &yours else {
        return Ok(false);
    };
    let shown = Shown {
        headline: format!(
            "{headline}: your code wrote into its send buffer, which it may only read"
        ),
        element: "send buffer element",
        titles: [
            "Your send buffers after the call:",
            "What they held before:",
        ],
    };
    agree(
        comm,
        &comm.to_host(send)?,
        &c.input::<T>(rank, n),
        exactly,
        &shown,
    )
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
    let watched = crate::cases::watched(lab, n);
    for (k, case) in watched.iter().enumerate() {
        report::in_case(k);
        let c = &case.check;
        if rank == 0 {
            println!("lab {}: your code on {}", lab.number(), case.describe(lab));
        }
        let mut yours = c.buffers::<i32>(comm)?;
        quiet.print_grid("Before:", yours.parts().1)?;
        student::<C, i32>(lab, c, comm, &mut yours)?;
        let got = c.result(comm, &yours)?;
        let want = c.expected::<i32>(rank, n);
        let shown = Shown {
            headline: "wrong:".into(),
            element: "element",
            titles: ["Yours:", "Expected (the library's result):"],
        };
        if agree(quiet, &got, &want, exactly, &shown)? {
            return Ok(Verdict::Wrong(k));
        }
        quiet.print_grid("Yours, right on every rank:", &quiet.buffer(&got)?)?;
    }
    Ok(Verdict::Right(watched.len()))
}
