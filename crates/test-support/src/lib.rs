//! What the tests of this workspace share, so that each harness exists once: building the
//! binaries a test runs ([`build`]), reading the grids ([`grid`]) and the backend line
//! ([`backend`]) the course's programs print, running processes with deadlines
//! ([`process`]), and finding the PyTorch that runs them under torchrun ([`torch`]).
//!
//! A dev-dependency only, and a leaf: it must not depend on comm-core, whose tests use it.

pub mod backend;
pub mod book;
pub mod build;
pub mod grid;
pub mod libnccl;
pub mod picture;
pub mod process;
pub mod source;
pub mod torch;
