//! Data-parallel training the way PyTorch's DistributedDataParallel does it, on comm-core, for
//! example 06: a small byte-level language model ([`model`]), the course's text shared out by
//! DistributedSampler's rule ([`data`]), gradients all-reduced in buckets ([`buckets`]) started
//! while backward goes on ([`ddp`], over `comm_core::work`'s asynchronous all-reduce).
//!
//! Everything runs on the host: the matrix products are `matrixmultiply`'s. On the NCCL backend
//! the buckets are copied to the GPU, all-reduced there by NCCL and copied back; the model's
//! compute stays on the CPU (a real DDP keeps model, gradients and buckets on the GPU).

pub mod buckets;
pub mod data;
pub mod ddp;
pub mod model;

pub use ddp::{Config, Ddp, Report};
pub use model::Shape;

/// A small deterministic generator (splitmix64): the same numbers on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5eed_0006_dd9a_11ce)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// A slice on this thread's track of the trace (`--trace`), category `compute`, from now until
/// the guard drops; nothing when no trace is recorded.
pub fn trace_span(name: &'static str) -> Span {
    trace_span_as("compute", name.to_string())
}

/// [`trace_span`] in category `cat`, with a name made at run time.
pub fn trace_span_as(cat: &'static str, name: String) -> Span {
    Span(comm_core::trace::on().then(|| (cat, name, comm_core::trace::now())))
}

/// An open slice of the trace: recorded when dropped.
pub struct Span(Option<(&'static str, String, f64)>);

impl Drop for Span {
    fn drop(&mut self) {
        if let Some((cat, name, start)) = self.0.take() {
            comm_core::trace::slice(cat, name, start, comm_core::trace::Args::default());
        }
    }
}

/// A checksum of the weights (FNV-1a over their bits): equal on every rank when they agree.
pub fn checksum(params: &[f32]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in params.iter().flat_map(|v| v.to_bits().to_le_bytes()) {
        hash = (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193);
    }
    hash
}
