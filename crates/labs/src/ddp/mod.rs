//! Labs 5 and 6: data-parallel training by hand, on the training crate's model and data (the
//! ones example 06 trains). What the student's functions are handed ([`Backward`], [`Bucket`],
//! [`gather`], [`scatter`], [`Sgd`]); the trainer that runs a step around them as the library's
//! DDP runs it ([`Trainer`]); the checks against the library's DDP ([`check`]) and the step
//! times side by side ([`timing`]).

pub mod check;
pub mod timing;

use std::ops::Range;

use comm_core::{Communicator, ReduceOp, Result};
use training::buckets;
use training::data::{Dataset, Sampler, COURSE};
use training::model::Model;
use training::{Config, Shape};

pub use training::buckets::Bucket;

/// SGD with momentum's two constants, as `torch.optim.SGD(lr, momentum)` takes them.
#[derive(Debug, Clone, Copy)]
pub struct Sgd {
    /// The learning rate.
    pub lr: f32,
    /// The momentum.
    pub momentum: f32,
}

/// Backward, for the student to run: a layer at a time, last layer first.
pub struct Backward<'a> {
    model: &'a Model,
    params: &'a [f32],
    grads: &'a mut [f32],
}

impl Backward<'_> {
    /// Runs backward; after each layer, `ready(done, grads)` with the tensors just finished
    /// (indices into the model's tensors) and the gradients so far.
    pub fn run(&mut self, ready: impl FnMut(&[usize], &[f32])) {
        self.model.backward(self.params, self.grads, ready);
    }

    /// This rank's gradients (after `run`, every one of them).
    pub fn grads(&mut self) -> &mut [f32] {
        self.grads
    }
}

/// Bucket `bucket`'s gradients, one tensor after the other.
pub fn gather(bucket: &Bucket, tensors: &[Range<usize>], grads: &[f32]) -> Vec<f32> {
    bucket
        .params
        .iter()
        .flat_map(|&p| grads[tensors[p].clone()].iter().copied())
        .collect()
}

/// The values of a bucket (as [`gather`] laid them out) back into their tensors in `grads`.
pub fn scatter(bucket: &Bucket, tensors: &[Range<usize>], values: &[f32], grads: &mut [f32]) {
    let mut at = 0;
    for &p in &bucket.params {
        let len = tensors[p].len();
        grads[tensors[p].clone()].copy_from_slice(&values[at..at + len]);
        at += len;
    }
}

/// The training the checks run: small, so that a check takes seconds.
pub fn checked_config() -> Config {
    config(
        Shape {
            context: 8,
            embed: 16,
            hidden: 64,
        },
        8,
        3,
    )
}

/// A training run of `iters` steps of `batch` samples a rank, with example 06's other defaults
/// but smaller buckets (several even for a small model).
pub fn config(shape: Shape, batch: usize, iters: usize) -> Config {
    Config {
        shape,
        batch,
        iters,
        bucket_bytes: 32 << 10,
        overlap: true,
        lr: 0.1,
        momentum: 0.9,
        seed: 0,
        dump: None,
    }
}

/// One rank's training, step by step, as the library's DDP does it (rank 0's initial weights,
/// the same sampler, SGD with momentum), with the gradients' averaging left to a lab's code.
pub struct Trainer {
    /// The run.
    pub config: Config,
    dataset: Dataset<'static>,
    sampler: Sampler,
    /// The model (what forward kept for backward).
    pub model: Model,
    /// The parameters, flat.
    pub params: Vec<f32>,
    /// SGD's momentum, for every parameter (DDP's).
    pub momentum: Vec<f32>,
    /// Where each tensor lies in the flat vectors.
    pub tensors: Vec<Range<usize>>,
    /// DDP's buckets.
    pub buckets: Vec<Bucket>,
}

impl Trainer {
    /// Rank `rank` of `world`, with rank 0's initial weights (what DDP broadcasts).
    pub fn new(config: &Config, rank: usize, world: usize) -> Trainer {
        let shape = config.shape;
        let dataset = Dataset::new(COURSE.as_bytes(), shape.context).expect("the text is longer");
        let sampler = Sampler::new(dataset.len(), rank, world, config.batch, config.seed);
        let (offsets, _) = shape.offsets();
        let tensors = offsets
            .iter()
            .zip(shape.lengths())
            .map(|(&o, l)| o..o + l)
            .collect();
        let params = shape.init(config.seed);
        Trainer {
            config: config.clone(),
            dataset,
            sampler,
            model: Model::new(shape, config.batch),
            momentum: vec![0.0; params.len()],
            params,
            tensors,
            buckets: buckets::plan(&shape.lengths(), config.bucket_bytes),
        }
    }

    /// Forward on this rank's share of step `step`'s batch: its loss.
    pub fn forward(&mut self, step: usize) -> f32 {
        let indices = self.sampler.batch(step);
        let samples: Vec<&[u8]> = indices.iter().map(|&i| self.dataset.sample(i)).collect();
        self.model.forward(&self.params, &samples)
    }

    /// Backward, all at once: this rank's own gradients.
    pub fn gradients(&self) -> Vec<f32> {
        let mut grads = vec![0.0; self.params.len()];
        self.model.backward(&self.params, &mut grads, |_, _| {});
        grads
    }

    /// Backward for the student to run, into `grads`.
    pub fn backward<'a>(&'a self, grads: &'a mut [f32]) -> Backward<'a> {
        Backward {
            model: &self.model,
            params: &self.params,
            grads,
        }
    }

    /// SGD's constants.
    pub fn sgd(&self) -> Sgd {
        Sgd {
            lr: self.config.lr,
            momentum: self.config.momentum,
        }
    }

    /// The parameters after SGD's step with the mean gradients `grads`, and the momentum with
    /// it (as DDP's optimizer, and torch.optim.SGD).
    pub fn step(&mut self, grads: &[f32]) {
        let Sgd { lr, momentum: mu } = self.sgd();
        for ((p, g), m) in self.params.iter_mut().zip(grads).zip(&mut self.momentum) {
            *m = mu * *m + g;
            *p -= lr * *m;
        }
    }
}

/// The mean of every rank's `values`, element by element (a sum, then a division).
pub fn mean(comm: &Communicator, values: &[f32]) -> Result<Vec<f32>> {
    let mut buf = comm.buffer(values)?;
    comm.all_reduce(&mut buf, ReduceOp::Sum)?;
    let n = comm.world_size() as f32;
    Ok(comm.to_host(&buf)?.into_iter().map(|v| v / n).collect())
}
