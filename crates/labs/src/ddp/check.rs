//! Labs 5 and 6 checked: the library's DDP trains first and gives the losses to match; then each
//! of the student's variants trains from the same start. Every step, what the student's code
//! produced (the mean gradients, or ZeRO-1's new parameters) is compared element by element with
//! what they must be, and at the end each step's loss with DDP's, to 1e-5 relative.

use comm_core::{AsyncComm, BackendChoice, Communicator, Job, Result};
use training::{Config, Ddp};

use super::{mean, Trainer};
use crate::catalog::Lab;
use crate::code::Code;
use crate::compare::{agree, Shown};
use crate::panics;
use crate::report::{self, Verdict};

/// The largest relative difference allowed between a loss and DDP's.
pub const LOSS_TOLERANCE: f64 = 1e-5;

/// A lab's variants: lab 5's three ways, lab 6's one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// One all-reduce per tensor.
    Naive,
    /// One all-reduce of every gradient.
    Flattened,
    /// Buckets all-reduced while backward goes on.
    Bucketed,
    /// ZeRO-1's sharded optimizer step.
    Zero1,
}

impl Variant {
    /// The lab's variants, in the order they are checked.
    pub fn of(lab: Lab) -> &'static [Variant] {
        match lab {
            Lab::Zero => &[Variant::Zero1],
            _ => &[Variant::Naive, Variant::Flattened, Variant::Bucketed],
        }
    }

    /// How the student's output names it.
    pub fn describe(self) -> &'static str {
        match self {
            Variant::Naive => "naive (an all-reduce per tensor)",
            Variant::Flattened => "flattened (one all-reduce)",
            Variant::Bucketed => "bucketed and overlapped",
            Variant::Zero1 => "ZeRO-1",
        }
    }
}

/// The library's DDP on this job's ranks: each step's loss.
pub fn ddp_losses(job: &Job, config: &Config) -> Result<Vec<f32>> {
    let mut ddp = Ddp::new(job.communicator(BackendChoice::Cpu)?, config)?;
    let losses = (0..config.iters)
        .map(|s| ddp.step(s))
        .collect::<Result<Vec<f32>>>()?;
    ddp.finish()?.0.close()?;
    Ok(losses)
}

/// Within `tolerance` (relative) of `want`, on the scale of the largest `want`: gradients of
/// different tensors differ by orders of magnitude, and their sums by the order of adding.
fn close_to(want: &[f32]) -> impl Fn(f32, f32) -> bool {
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    move |want: f32, got: f32| (got - want).abs() <= 1e-5 * (scale + want.abs())
}

/// The student's averaging (or ZeRO-1 step) for step `step`; what it produced, and what that
/// must be: the mean gradients, or the parameters after DDP's step.
fn student_step<C: Code>(
    variant: Variant,
    comm: &Communicator,
    threaded: Option<&AsyncComm>,
    trainer: &mut Trainer,
    shard: &mut [f32],
) -> Result<(Vec<f32>, Vec<f32>)> {
    let local = trainer.gradients();
    let want = mean(comm, &local)?;
    let tensors = trainer.tensors.clone();
    let got = match variant {
        Variant::Naive | Variant::Flattened => {
            let mut grads = local;
            panics::caught(|| match variant {
                Variant::Naive => C::naive(comm, &mut grads, &tensors),
                _ => C::flattened(comm, &mut grads),
            })?;
            grads
        }
        Variant::Bucketed => {
            let mut grads = vec![0.0; local.len()];
            let threaded = threaded.expect("the bucketed variant has its thread");
            let buckets = trainer.buckets.clone();
            let mut backward = trainer.backward(&mut grads);
            panics::caught(|| C::bucketed(threaded, &mut backward, &buckets, &tensors))?;
            grads
        }
        Variant::Zero1 => {
            let mut params = trainer.params.clone();
            let sgd = trainer.sgd();
            panics::caught(|| C::zero1_step(comm, &mut params, &local, shard, sgd))?;
            trainer.step(&want);
            return Ok((params, trainer.params.clone()));
        }
    };
    trainer.step(&got);
    Ok((got, want))
}

/// One variant's training, step by step; whether it is wrong (every rank answers alike).
fn variant<C: Code>(
    variant: Variant,
    comm: &Communicator,
    job: &Job,
    config: &Config,
    ddp: &[f32],
    label: &str,
) -> Result<bool> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let mut trainer = Trainer::new(config, rank, n);
    let threaded = match variant {
        Variant::Bucketed => Some(AsyncComm::start(job.communicator(BackendChoice::Cpu)?)?),
        _ => None,
    };
    let mut shard = vec![0.0f32; trainer.params.len().div_ceil(n)];
    let what = match variant {
        Variant::Zero1 => ["parameter", "Your parameters after the step:", "DDP's:"],
        _ => ["gradient", "Your mean gradients:", "The mean gradients:"],
    };
    for (step, &theirs) in ddp.iter().enumerate() {
        let loss = trainer.forward(step);
        let (got, want) =
            student_step::<C>(variant, comm, threaded.as_ref(), &mut trainer, &mut shard)?;
        let shown = Shown {
            headline: format!(
                "{label} is wrong: {} on {n} ranks, step {step}: the {}s after your code",
                variant.describe(),
                what[0]
            ),
            element: what[0],
            titles: [what[1], what[2]],
        };
        if agree(comm, &got, &want, close_to(&want), &shown)? {
            return Ok(true);
        }
        let loss = mean(comm, &[loss])?[0];
        let relative = ((loss - theirs) / theirs).abs() as f64;
        if relative > LOSS_TOLERANCE {
            if rank == 0 {
                println!(
                    "{label} is wrong: {} on {n} ranks, step {step}: loss {loss}, the library's DDP {} (relative difference {relative:.1e}, more than {LOSS_TOLERANCE:.0e})",
                    variant.describe(),
                    theirs
                );
            }
            return Ok(true);
        }
    }
    if let Some(threaded) = threaded {
        threaded.finish()?.close()?;
    }
    Ok(false)
}

/// Every variant of `lab` on this job's ranks, until one is wrong. `before` cases ran on fewer
/// ranks, of `total` in all.
pub fn cases<C: Code>(
    lab: Lab,
    comm: &Communicator,
    job: &Job,
    before: usize,
    total: usize,
) -> Result<Verdict> {
    let config = super::checked_config();
    let ddp = ddp_losses(job, &config)?;
    for (k, &v) in Variant::of(lab).iter().enumerate() {
        report::in_case(k);
        let label = format!("case {} of {total}", before + k + 1);
        if variant::<C>(v, comm, job, &config, &ddp, &label)? {
            return Ok(Verdict::Wrong(k));
        }
    }
    Ok(Verdict::Right(Variant::of(lab).len()))
}
