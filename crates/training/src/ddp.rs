//! One rank of data-parallel training, DDP's way:
//!
//! - at the start every rank takes rank 0's weights (a broadcast), as DDP's constructor does;
//! - each step, a rank reads its share of the global batch ([`Sampler`]), runs forward and
//!   backward on it, and as each bucket of gradients is complete starts its all-reduce on the
//!   communication thread (`comm_core::work`) while backward goes on to the next layer;
//!   `overlap: false` waits for the whole backward first, then starts them all;
//! - gradients are divided by the world size and summed (DDP's default hook), so every rank
//!   holds the mean gradient over the global batch, and takes the same SGD step.
//!
//! Every step also all-reduces the loss (the global batch's mean, what rank 0 prints) after the
//! buckets. A rank times what it spends blocked in [`Work::wait`](comm_core::Work::wait): the
//! communication its backward did not hide.

use std::fs::File;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use comm_core::trace::Span;
use comm_core::{AsyncComm, CommError, Communicator, ReduceOp, Result, Work};

use crate::buckets::{self, Bucket};
use crate::data::{Dataset, Sampler, COURSE};
use crate::model::{Model, Shape};
use crate::traffic::Traffic;

/// What a run trains and how.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The model's shape.
    pub shape: Shape,
    /// Samples per rank per step (DDP's local batch).
    pub batch: usize,
    /// Steps to train.
    pub iters: usize,
    /// Largest bucket, in bytes (`--bucket-mb`).
    pub bucket_bytes: usize,
    /// Start each bucket's all-reduce as soon as it is full (else after the whole backward).
    pub overlap: bool,
    /// SGD's learning rate and momentum (PyTorch's `SGD(lr, momentum)`).
    pub lr: f32,
    /// SGD's momentum.
    pub momentum: f32,
    /// Seeds the initial weights (rank 0's are the ones kept) and the sampler's shuffles.
    pub seed: u64,
    /// Where to write the run's initial weights, batches, losses and final weights (for the
    /// PyTorch twin, `python/ddp_twin.py`).
    pub dump: Option<PathBuf>,
}

/// Limits on the flags: far beyond a lesson's sizes, short of what overflows or cannot fit.
const MAX_BATCH: usize = 1 << 16;
const MAX_WIDTH: usize = 4096;
const MAX_CONTEXT: usize = 64;
const MAX_EMBED: usize = 256;

impl Config {
    /// Refuses what cannot train: a usage error naming the flag.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(CommError::Usage(m));
        let s = &self.shape;
        for (flag, value, max) in [
            ("--batch", self.batch, MAX_BATCH),
            ("--hidden", s.hidden, MAX_WIDTH),
            ("--context", s.context, MAX_CONTEXT),
            ("--embed", s.embed, MAX_EMBED),
        ] {
            if value == 0 || value > max {
                return bad(format!("{flag} {value}: give 1 to {max}"));
            }
        }
        if self.iters == 0 {
            return bad("--iters 0: train at least one step".into());
        }
        if self.bucket_bytes < 4 {
            return bad("--bucket-mb: give a positive size, at least one float (4 bytes)".into());
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("--lr {}: give a positive, finite rate", self.lr));
        }
        if !(self.momentum.is_finite() && (0.0..1.0).contains(&self.momentum)) {
            return bad(format!("--momentum {}: give 0 to below 1", self.momentum));
        }
        let samples = COURSE.len().saturating_sub(s.context);
        if self.batch > samples {
            return bad(format!(
                "--batch {}: more than the text's {samples} samples",
                self.batch
            ));
        }
        // Weights, gradients, momentum, the buckets in flight and their copies: 5 of them.
        comm_core::memory::check_fits::<f32>(s.parameters(), 5)
    }

    /// `--bucket-mb` as bytes: a positive, finite number of megabytes (MiB, as DDP's
    /// `bucket_cap_mb`), at most 1024.
    pub fn bucket_bytes(mb: f64) -> Result<usize> {
        if !(mb.is_finite() && mb > 0.0 && mb <= 1024.0) {
            return Err(CommError::Usage(format!(
                "--bucket-mb {mb}: give a size above 0 and at most 1024 (MB)"
            )));
        }
        Ok((mb * (1 << 20) as f64) as usize)
    }
}

/// What a rank measured over the run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The weights' checksum at the end ([`checksum`](crate::checksum)).
    pub checksum: u32,
    /// Samples (one predicted byte each) this rank trained on per second.
    pub tokens_per_s: f64,
    /// Mean time of a step.
    pub step: Duration,
    /// Mean time a step spent blocked waiting for communication.
    pub waited: Duration,
}

/// What DDP trains: the layers of a model whose parameters are seven (in [`NAMES`] order, one
/// flat vector), whose forward gives the batch's mean loss, and whose backward tells after each
/// layer which parameters' gradients are complete. [`Model`] is the whole model on one rank;
/// `tensor_parallel::TpModel` is this rank's shard of it, whose layers talk to the other shards.
///
/// [`NAMES`]: crate::model::NAMES
pub trait Layers {
    /// Each parameter's length on this rank.
    fn lengths(&self) -> [usize; 7];
    /// The mean loss of `samples`, keeping what backward needs.
    fn forward(&mut self, params: &[f32], samples: &[&[u8]]) -> Result<f32>;
    /// The last forward's gradients into `grads`, `ready` told after each layer.
    fn backward(
        &mut self,
        params: &[f32],
        grads: &mut [f32],
        ready: &mut dyn FnMut(&[usize], &[f32]),
    ) -> Result<()>;
}

impl Layers for Model {
    fn lengths(&self) -> [usize; 7] {
        self.shape().lengths()
    }

    fn forward(&mut self, params: &[f32], samples: &[&[u8]]) -> Result<f32> {
        Ok(Model::forward(self, params, samples))
    }

    fn backward(
        &mut self,
        params: &[f32],
        grads: &mut [f32],
        ready: &mut dyn FnMut(&[usize], &[f32]),
    ) -> Result<()> {
        Model::backward(self, params, grads, ready);
        Ok(())
    }
}

/// One rank's trainer: its weights, its share of the data, its buckets and its communicator
/// (the job's, or the data-parallel group's when the model is split: example 07).
pub struct Ddp<M: Layers = Model> {
    config: Config,
    comm: AsyncComm,
    dataset: Dataset<'static>,
    sampler: Sampler,
    model: M,
    params: Vec<f32>,
    grads: Vec<f32>,
    momentum: Vec<f32>,
    buckets: Vec<Bucket>,
    dump: Option<Dump>,
    time: Duration,
    /// The all-reduces of the buckets and the loss: bytes, and time blocked in `wait`.
    traffic: Traffic,
    steps: usize,
}

/// The files `--dump` writes.
struct Dump {
    dir: PathBuf,
    batches: File,
    losses: Vec<f32>,
}

impl Ddp {
    /// Sets a rank up: rank 0's weights broadcast to all, the buckets planned, the
    /// communication thread started with `comm`.
    pub fn new(comm: Communicator, config: &Config) -> Result<Ddp> {
        // Every rank makes its own weights (seed + rank: they differ), then takes rank 0's.
        let mine = config.shape.init(config.seed + comm.rank() as u64);
        let model = Model::new(config.shape, config.batch);
        Ddp::with_layers(comm, config, model, mine)
    }
}

impl<M: Layers> Ddp<M> {
    /// [`Ddp::new`] for `layers`, this rank's weights `mine` (rank 0's are broadcast to all).
    pub fn with_layers(
        comm: Communicator,
        config: &Config,
        layers: M,
        mine: Vec<f32>,
    ) -> Result<Ddp<M>> {
        config.check()?;
        let (rank, world) = (comm.rank(), comm.world_size());
        let dataset = Dataset::new(COURSE.as_bytes(), config.shape.context).ok_or_else(|| {
            CommError::Usage(format!(
                "--context {}: longer than the text",
                config.shape.context
            ))
        })?;
        let sampler = Sampler::new(dataset.len(), rank, world, config.batch, config.seed);
        if sampler.steps_per_epoch() == 0 {
            return Err(CommError::Usage(format!(
                "--batch {} on {world} ranks: more than the text's {} samples; give a smaller batch",
                config.batch,
                dataset.len()
            )));
        }
        let comm = AsyncComm::start(comm)?;
        let params = comm
            .broadcast("broadcast rank 0's weights", mine, 0)
            .wait()?;
        let n = params.len();
        let mut dump = None;
        if let Some(dir) = &config.dump {
            dump = Some(Dump::start(dir, rank, world, config, &params)?);
        }
        Ok(Ddp {
            buckets: buckets::plan(&layers.lengths(), config.bucket_bytes),
            model: layers,
            config: config.clone(),
            comm,
            dataset,
            sampler,
            params,
            grads: vec![0.0; n],
            momentum: vec![0.0; n],
            dump,
            time: Duration::ZERO,
            traffic: Traffic::default(),
            steps: 0,
        })
    }

    /// The buckets: parameters and sizes.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// What rank 0 prints first: the model, its buckets, the data and how it is shared.
    pub fn describe(&self) -> String {
        // Each bucket's parameters and its real size: a bucket closes once it passes the cap.
        let names = |b: &Bucket| {
            let names: Vec<&str> = b.params.iter().map(|&p| crate::model::NAMES[p]).collect();
            let mb = (b.len * std::mem::size_of::<f32>()) as f64 / (1 << 20) as f64;
            format!("[{}] {mb:.2} MB", names.join(" "))
        };
        let buckets: Vec<String> = self.buckets.iter().map(names).collect();
        let c = &self.config;
        format!(
            "model: {} bytes of context -> 2 hidden layers of {} -> 256 logits, {} parameters\n\
             buckets: {}, each closed once past {:.2} MB, last layer first: {}\n\
             data: {} samples of the course's text; {} ranks x batch {} = {} a step; overlap {}",
            c.shape.context,
            c.shape.hidden,
            self.params.len(),
            self.buckets.len(),
            c.bucket_bytes as f64 / (1 << 20) as f64,
            buckets.join(", "),
            self.dataset.len(),
            self.comm.world_size(),
            c.batch,
            c.batch * self.comm.world_size(),
            if c.overlap {
                "on"
            } else {
                "off (--no-overlap)"
            }
        )
    }

    /// One step of training; the global batch's mean loss (before the step's update).
    pub fn step(&mut self, step: usize) -> Result<f32> {
        let start = Instant::now();
        let indices = self.sampler.batch(step);
        let samples: Vec<&[u8]> = indices.iter().map(|&i| self.dataset.sample(i)).collect();
        if let Some(dump) = &mut self.dump {
            dump.batch(&samples)?;
        }
        let span = Span::slice("compute", "forward");
        let loss = self.model.forward(&self.params, &samples)?;
        drop(span);

        // Backward, a layer at a time; each bucket's all-reduce starts once it is full.
        let world = self.comm.world_size() as f32;
        let lengths = self.model.lengths();
        let offsets = offsets_of(&lengths);
        let mut ready = [false; 7];
        let mut works: Vec<Option<Work<Vec<f32>>>> = self.buckets.iter().map(|_| None).collect();
        let (comm, buckets, overlap) = (&self.comm, &self.buckets, self.config.overlap);
        let start_bucket = |k: usize, grads: &[f32]| {
            let mut values = buckets[k].gather(grads, &offsets, &lengths);
            values.iter_mut().for_each(|g| *g /= world); // DDP divides, then sums
            let what = format!(
                "all-reduce bucket {k} ({:.0} KB)",
                values.len() as f64 * 4.0 / 1024.0
            );
            mark_start(k);
            comm.all_reduce(what, values, ReduceOp::Sum)
        };
        self.model
            .backward(&self.params, &mut self.grads, &mut |params, grads| {
                params.iter().for_each(|&p| ready[p] = true);
                for (k, bucket) in buckets.iter().enumerate() {
                    if overlap && works[k].is_none() && bucket.params.iter().all(|&p| ready[p]) {
                        works[k] = Some(start_bucket(k, grads));
                    }
                }
            })?;
        for (k, work) in works.iter_mut().enumerate() {
            if work.is_none() {
                *work = Some(start_bucket(k, &self.grads));
            }
        }
        let loss_work =
            self.comm
                .all_reduce("all-reduce the loss", vec![loss / world], ReduceOp::Sum);

        // Wait for every bucket, in order, and put the mean gradients back.
        for (k, work) in works.into_iter().enumerate() {
            let span = Span::slice("wait", format!("wait for bucket {k}"));
            let (reduced, waited) = work.expect("every bucket started").wait_timed();
            drop(span);
            self.traffic.waited += waited;
            self.traffic.calls += 1;
            self.traffic.bytes += (self.buckets[k].len * std::mem::size_of::<f32>()) as u64;
            self.buckets[k].scatter(&reduced?, &mut self.grads, &offsets, &lengths);
        }
        let (loss, waited) = loss_work.wait_timed();
        self.traffic.waited += waited;
        self.traffic.calls += 1;
        self.traffic.bytes += std::mem::size_of::<f32>() as u64;
        let loss = loss?[0];

        self.optimizer_step();
        if let Some(dump) = &mut self.dump {
            dump.losses.push(loss);
        }
        self.time += start.elapsed();
        self.steps += 1;
        Ok(loss)
    }

    /// SGD with momentum on the averaged gradients, as torch.optim.SGD: buf = momentum·buf +
    /// grad; p -= lr·buf.
    fn optimizer_step(&mut self) {
        let _span = Span::slice("compute", "optimizer step");
        let (lr, mu) = (self.config.lr, self.config.momentum);
        for ((p, g), m) in self
            .params
            .iter_mut()
            .zip(&self.grads)
            .zip(&mut self.momentum)
        {
            *m = mu * *m + g;
            *p -= lr * *m;
        }
    }

    /// The layers it trains.
    pub fn layers(&self) -> &M {
        &self.model
    }

    /// What its all-reduces (buckets and loss) moved and cost so far.
    pub fn traffic(&self) -> Traffic {
        self.traffic
    }

    /// Steps taken.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Ends the run: what this rank measured, and its communicator back.
    pub fn finish(self) -> Result<(Communicator, Report)> {
        self.finish_with_layers()
            .map(|(comm, _, report)| (comm, report))
    }

    /// [`finish`](Self::finish), giving the layers back too.
    pub fn finish_with_layers(self) -> Result<(Communicator, M, Report)> {
        let steps = self.steps.max(1) as u32;
        let report = Report {
            checksum: checksum(&self.params),
            tokens_per_s: (self.steps * self.config.batch) as f64
                / self.time.as_secs_f64().max(1e-9),
            step: self.time / steps,
            waited: self.traffic.waited / steps,
        };
        if let Some(dump) = self.dump {
            dump.finish(self.comm.rank(), &self.params)?;
        }
        Ok((self.comm.finish()?, self.model, report))
    }
}

impl Dump {
    fn start(
        dir: &std::path::Path,
        rank: usize,
        world: usize,
        config: &Config,
        params: &[f32],
    ) -> Result<Dump> {
        let io = |what: String| move |e| CommError::io(what, e);
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        if rank == 0 {
            let s = &config.shape;
            let described = serde_json::json!({
                "context": s.context, "embed": s.embed, "hidden": s.hidden, "batch": config.batch,
                "world": world, "iters": config.iters, "lr": config.lr, "momentum": config.momentum,
                "bucket_bytes": config.bucket_bytes, "parameters": params.len(),
            });
            write(&dir.join("config.json"), described.to_string().as_bytes())?;
            write(&dir.join("init.bin"), &f32_bytes(params))?;
        }
        let path = dir.join(format!("batches-rank{rank}.bin"));
        let batches = File::create(&path).map_err(io(format!("creating {}", path.display())))?;
        Ok(Dump {
            dir: dir.to_path_buf(),
            batches,
            losses: Vec::new(),
        })
    }

    fn batch(&mut self, samples: &[&[u8]]) -> Result<()> {
        for s in samples {
            self.batches.write_all(s).map_err(|e| {
                CommError::io(format!("writing batches into {}", self.dir.display()), e)
            })?;
        }
        Ok(())
    }

    fn finish(self, rank: usize, params: &[f32]) -> Result<()> {
        if rank == 0 {
            let losses: String = self.losses.iter().map(|l| format!("{l:.9e}\n")).collect();
            write(&self.dir.join("losses.txt"), losses.as_bytes())?;
            write(&self.dir.join("final.bin"), &f32_bytes(params))?;
        }
        Ok(())
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn write(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| CommError::io(format!("writing {}", path.display()), e))
}

/// Where each parameter of `lengths` starts in the flat vector.
fn offsets_of(lengths: &[usize; 7]) -> [usize; 7] {
    let mut offsets = [0; 7];
    for p in 1..7 {
        offsets[p] = offsets[p - 1] + lengths[p - 1];
    }
    offsets
}

/// A checksum of the weights (FNV-1a over their bits): equal on every rank when they agree.
pub fn checksum(params: &[f32]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in params.iter().flat_map(|v| v.to_bits().to_le_bytes()) {
        hash = (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193);
    }
    hash
}

/// A mark on the main thread's track when tracing: the moment bucket `k`'s all-reduce was handed
/// to the comm thread.
fn mark_start(k: usize) {
    if comm_core::trace::on() {
        drop(Span::slice("start", format!("start bucket {k}")));
    }
}
