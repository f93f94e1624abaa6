//! Data-parallel training the way PyTorch's DistributedDataParallel does it, on comm-core, for
//! example 06: a small byte-level language model ([`model`]), the course's text shared out by
//! DistributedSampler's rule ([`data`]), gradients all-reduced in buckets ([`buckets`]) started
//! while backward goes on ([`ddp`], over `comm_core::work`'s asynchronous all-reduce). For
//! example 07, [`tensor_parallel`] splits the model's MLP over a tensor-parallel group
//! (Megatron's column- and row-parallel layers) and trains each shard with the same DDP over
//! its data-parallel group.
//!
//! Everything runs on the host: the matrix products are `matrixmultiply`'s. On the NCCL backend
//! the buckets are copied to the GPU, all-reduced there by NCCL and copied back; the model's
//! compute stays on the CPU (a real DDP keeps model, gradients and buckets on the GPU).

pub mod buckets;
pub mod data;
pub mod ddp;
pub mod flags;
pub mod model;
pub mod rng;
pub mod tensor_parallel;
pub mod tp_picture;
pub mod traffic;

pub use ddp::checksum;
pub use ddp::{Config, Ddp, Layers, Report};
pub use flags::TrainArgs;
pub use model::Shape;
pub use rng::Rng;
pub use traffic::Traffic;
