//! Labs 5 and 6 timed, once every case is right: the step time of the library's DDP beside the
//! student's variants, on a model large enough for the all-reduces to matter, and for lab 6 the
//! optimizer state each rank keeps.

use std::time::Instant;

use comm_core::{AsyncComm, BackendChoice, Communicator, Job, ReduceOp, Result};
use training::{Config, Ddp, Shape};

use super::check::Variant;
use super::{mean, Trainer};
use crate::catalog::Lab;
use crate::code::Code;
use crate::panics;

/// Steps timed, after one untimed.
const STEPS: usize = 6;

/// Example 06's model, with its default width and a smaller batch.
fn timed_config() -> Config {
    let shape = Shape {
        context: 8,
        embed: 16,
        hidden: 256,
    };
    super::config(shape, 16, STEPS + 1)
}

/// The slowest rank's mean time of the steps after the first, in seconds.
fn slowest(comm: &Communicator, seconds: &[f64]) -> Result<f64> {
    let mine = seconds[1..].iter().sum::<f64>() / (seconds.len() - 1) as f64;
    let mut buf = comm.buffer(&[mine])?;
    comm.all_reduce(&mut buf, ReduceOp::Max)?;
    Ok(comm.to_host(&buf)?[0])
}

/// The library's DDP's step times.
fn library(job: &Job, config: &Config) -> Result<Vec<f64>> {
    let mut ddp = Ddp::new(job.communicator(BackendChoice::Cpu)?, config)?;
    let mut times = Vec::new();
    for step in 0..config.iters {
        let start = Instant::now();
        ddp.step(step)?;
        times.push(start.elapsed().as_secs_f64());
    }
    ddp.finish()?.0.close()?;
    Ok(times)
}

/// A variant's step times: forward, backward, the student's averaging and SGD's step (ZeRO-1's
/// in the student's code).
fn yours<C: Code>(
    variant: Variant,
    comm: &Communicator,
    job: &Job,
    config: &Config,
) -> Result<Vec<f64>> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let mut trainer = Trainer::new(config, rank, n);
    let threaded = match variant {
        Variant::Bucketed => Some(AsyncComm::start(job.communicator(BackendChoice::Cpu)?)?),
        _ => None,
    };
    let mut shard = vec![0.0f32; trainer.params.len().div_ceil(n)];
    let tensors = trainer.tensors.clone();
    let buckets = trainer.buckets.clone();
    let mut times = Vec::new();
    for step in 0..config.iters {
        let start = Instant::now();
        let loss = trainer.forward(step);
        let mut grads = vec![0.0; trainer.params.len()];
        match (variant, &threaded) {
            (Variant::Bucketed, Some(threaded)) => {
                let mut backward = trainer.backward(&mut grads);
                panics::caught(|| C::bucketed(threaded, &mut backward, &buckets, &tensors))?;
            }
            _ => grads = trainer.gradients(),
        }
        match variant {
            Variant::Naive => panics::caught(|| C::naive(comm, &mut grads, &tensors))?,
            Variant::Flattened => panics::caught(|| C::flattened(comm, &mut grads))?,
            _ => {}
        }
        match variant {
            Variant::Zero1 => {
                let mut params = std::mem::take(&mut trainer.params);
                let sgd = trainer.sgd();
                panics::caught(|| C::zero1_step(comm, &mut params, &grads, &mut shard, sgd))?;
                trainer.params = params;
            }
            _ => trainer.step(&grads),
        }
        // As DDP does: the global batch's mean loss, every step.
        mean(comm, &[loss])?;
        times.push(start.elapsed().as_secs_f64());
    }
    if let Some(threaded) = threaded {
        threaded.finish()?.close()?;
    }
    Ok(times)
}

/// Times the library's DDP and the lab's variants; rank 0 prints them side by side.
pub fn run<C: Code>(lab: Lab, comm: &Communicator, job: &Job) -> Result<()> {
    let config = timed_config();
    let n = comm.world_size();
    let mut rows = vec![(
        "the library's DDP (bucketed, overlapped)".to_string(),
        slowest(comm, &library(job, &config)?)?,
    )];
    for &variant in Variant::of(lab) {
        let times = yours::<C>(variant, comm, job, &config)?;
        rows.push((
            format!("yours, {}", variant.describe()),
            slowest(comm, &times)?,
        ));
    }
    if comm.rank() != 0 {
        return Ok(());
    }
    let parameters = config.shape.parameters();
    println!(
        "step time on {n} ranks, the mean of {STEPS} steps after the first, each the slowest rank's (a model of {parameters} parameters, {} samples a rank a step):",
        config.batch
    );
    for (name, seconds) in rows {
        println!("  {name}: {:.2} ms", seconds * 1e3);
    }
    if lab == Lab::Zero {
        let floats = |count: usize| count * std::mem::size_of::<f32>();
        println!(
            "optimizer state (SGD's momentum) on each rank: DDP {} bytes, yours {} bytes (1/{n} of it, padded to whole shards)",
            floats(parameters),
            floats(parameters.div_ceil(n))
        );
    }
    Ok(())
}
