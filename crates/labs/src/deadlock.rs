//! Lab 7 checked: the end of a training step (a reduce to rank 1, then rank 1's broadcast) run by
//! the student's program beside the library's two calls on the same values. The given program
//! hangs: each rank waits for one that waits for it, until `--timeout`, and the library's
//! messages say who waited for whom. Fixed, it must finish and give the library's values.

use comm_core::check::input;
use comm_core::{Communicator, ReduceOp, Result};

use crate::code::Code;
use crate::compare::{agree, exactly, Shown};
use crate::panics;
use crate::report::{self, Verdict};

/// The cases on one rank count: one.
pub fn count() -> usize {
    1
}

/// The case on this communicator's ranks.
pub fn cases<C: Code>(comm: &Communicator, before: usize, total: usize) -> Result<Verdict> {
    let (rank, n) = (comm.rank(), comm.world_size());
    report::in_case(0);
    let stats = input::<f32>(7, rank, 2, ReduceOp::Sum);
    let lr = [if rank == 1 { 0.05 } else { 0.0 }];
    let (mut want_stats, mut want_lr) = (comm.buffer(&stats)?, comm.buffer(&lr)?);
    comm.reduce(&mut want_stats, ReduceOp::Sum, 1)?;
    comm.broadcast(&mut want_lr, 1)?;
    let (mut got_stats, mut got_lr) = (comm.buffer(&stats)?, comm.buffer(&lr)?);
    panics::caught(|| C::end_of_step(comm, &mut got_stats, &mut got_lr))?;
    let label = format!("case {} of {total} is wrong: {n} ranks", before + 1);
    let checks = [
        (
            &got_stats,
            &want_stats,
            "the stats (rank 1 holds the sums; the others their own)",
        ),
        (
            &got_lr,
            &want_lr,
            "the learning rate (every rank holds rank 1's)",
        ),
    ];
    for (got, want, what) in checks {
        let shown = Shown {
            headline: format!("{label}: {what}"),
            element: "element",
            titles: ["Yours:", "The library's:"],
        };
        if agree(
            comm,
            &comm.to_host(got)?,
            &comm.to_host(want)?,
            exactly,
            &shown,
        )? {
            return Ok(Verdict::Wrong(0));
        }
    }
    Ok(Verdict::Right(1))
}
