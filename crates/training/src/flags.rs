//! The training flags examples 06 and 07 share, declared once, and the [`Config`] they make.

use std::path::PathBuf;

use comm_core::Result;

use crate::ddp::Config;
use crate::model::Shape;

/// What to train and how: the model's size, the batch, the steps, DDP's buckets, SGD.
#[derive(Debug, Clone, clap::Args)]
// The struct's own doc comment would otherwise become the program's --help text.
#[command(about = None, long_about = None)]
pub struct TrainArgs {
    /// Training steps.
    #[arg(long, default_value_t = 200)]
    pub iters: usize,
    /// Samples per data-parallel rank per step (the global batch is ranks x this).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Largest gradient bucket, in MB (DDP's bucket_cap_mb).
    #[arg(long, default_value_t = 0.25)]
    pub bucket_mb: f64,
    /// Wait for the whole backward before starting the buckets' all-reduces.
    #[arg(long)]
    pub no_overlap: bool,
    /// Width of the two hidden layers.
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    /// Bytes of context the model reads.
    #[arg(long, default_value_t = 8)]
    pub context: usize,
    /// Floats per byte of context.
    #[arg(long, default_value_t = 16)]
    pub embed: usize,
    /// SGD's learning rate (momentum 0.9).
    #[arg(long, default_value_t = 0.1)]
    pub lr: f32,
    /// Seeds the weights and the shuffles.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Rank 0 prints the loss every this many steps (and after the last).
    #[arg(long, default_value_t = 20)]
    pub log_every: usize,
    /// Write the initial weights, every rank's batches and the losses to DIR (for the PyTorch
    /// twins in python/).
    #[arg(long, value_name = "DIR")]
    pub dump: Option<PathBuf>,
}

impl TrainArgs {
    /// The run's [`Config`], checked: a usage error names the flag.
    pub fn config(&self) -> Result<Config> {
        let config = Config {
            shape: Shape {
                context: self.context,
                embed: self.embed,
                hidden: self.hidden,
            },
            batch: self.batch,
            iters: self.iters,
            bucket_bytes: Config::bucket_bytes(self.bucket_mb)?,
            overlap: !self.no_overlap,
            lr: self.lr,
            momentum: 0.9,
            seed: self.seed,
            dump: self.dump.clone(),
        };
        config.check()?;
        Ok(config)
    }

    /// Whether rank 0 prints step `step`'s loss.
    pub fn logs(&self, step: usize) -> bool {
        step.is_multiple_of(self.log_every.max(1)) || step + 1 == self.iters
    }
}
