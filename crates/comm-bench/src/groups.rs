//! `--group-size G`: the collectives measured on sub-communicators, all groups at once. The
//! job's ranks split into groups of G consecutive ranks (`Communicator::split(rank / G, rank)`,
//! the tensor-parallel groups of a mesh): on 8 ranks `--group-size 2` makes four groups, and
//! every case runs in all four together, each group on links of its own, so that what groups
//! cost each other (shared memory bandwidth, a shared network card, CPU cores) shows in the time.
//! The ranks of the whole job meet at a barrier before each case, so the groups start it
//! together. The table is group 0's (its rank 0 reports); #wrong is the sum over every group.

use comm_core::{CommError, Communicator, ReduceOp, Result};

use comm_core::stopwatch::Stopwatch;

use crate::measure::{Case, Measured, Options, Outcome};

/// This rank's group of `size` consecutive ranks of `comm`: a usage error, on every rank alike,
/// where `size` does not divide the job.
pub fn split(comm: &Communicator, size: usize) -> Result<Communicator> {
    let n = comm.world_size();
    if size == 0 || !n.is_multiple_of(size) {
        return Err(CommError::Usage(format!(
            "--group-size {size} on {n} ranks: give a size that divides {n} (groups of \
             consecutive ranks, all measured at once)"
        )));
    }
    let rank = comm.rank();
    let group = comm.split((rank / size) as i32, rank as i32)?;
    let group = group.ok_or_else(|| CommError::Peer(format!("rank {rank} has no group")))?;
    if rank == 0 {
        println!(
            "groups: {} groups of {size} consecutive ranks, each case measured in all of them \
             at once; the table is group 0's, #wrong every group's",
            n / size
        );
        if let Some(line) = group.transport_line() {
            println!("{line}");
        }
    }
    Ok(group)
}

/// [`measure`](crate::measure::measure) of `case` on `comm`; where `comm` is a group of `job`,
/// every group starts it together (a barrier of the whole job first) and its #wrong is summed
/// over every group.
pub fn measure(
    comm: &Communicator,
    job: Option<&Communicator>,
    case: &Case,
    opts: &Options,
    stopwatch: &mut Stopwatch,
) -> Result<Option<Measured>> {
    let Some(job) = job else {
        return crate::measure::measure(comm, case, opts, stopwatch);
    };
    job.barrier()?;
    let mut measured = crate::measure::measure(comm, case, opts, stopwatch)?;
    if let Some(m) = &mut measured {
        every_groups_wrong(job, comm, m)?;
    }
    Ok(measured)
}

/// `measured`'s #wrong summed over every group: each group's rank 0 gives its group's sum to an
/// all-reduce over the whole job (`parent`).
fn every_groups_wrong(
    parent: &Communicator,
    group: &Communicator,
    measured: &mut Measured,
) -> Result<()> {
    let outcomes = [&mut measured.out_of_place, &mut measured.in_place];
    let mine: Vec<i64> = outcomes
        .iter()
        .map(|o| match (o, group.rank()) {
            (Some(Outcome { wrong: Some(w), .. }), 0) => *w as i64,
            _ => 0,
        })
        .collect();
    let mut sums = parent.buffer(&mine)?;
    parent.all_reduce(&mut sums, ReduceOp::Sum)?;
    let sums = parent.to_host(&sums)?;
    for (outcome, sum) in outcomes.into_iter().zip(sums) {
        if let Some(Outcome { wrong: Some(w), .. }) = outcome {
            *w = sum as u64;
        }
    }
    Ok(())
}
