//! Whose code a check runs: the student's files (`src/labN_*.rs`, the default), the reference
//! solutions (`solutions/`, `--solution`), or, for the tests that keep the checker honest, the
//! pristine skeletons (`skeletons/`, what a fresh clone's student files hold) and one wrong
//! solution per lab planted on purpose (`planted/`). Each is a [`Code`]: the labs' functions
//! under one name, so the checker is written once for all four.

use std::ops::Range;

use comm_core::{AsyncComm, Buffer, Communicator, Element, Mesh, Named, Result};

use crate::ddp::{Backward, Bucket, Sgd};

/// The four sets of lab files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whose {
    /// The student's files in `crates/labs/src/`.
    Yours,
    /// The reference solutions in `crates/labs/solutions/`.
    Solution,
    /// The pristine skeletons in `crates/labs/skeletons/`.
    Skeleton,
    /// The planted wrong solutions in `crates/labs/planted/`.
    Planted,
}

impl Named for Whose {
    const ALL: &'static [Whose] = &[
        Whose::Yours,
        Whose::Solution,
        Whose::Skeleton,
        Whose::Planted,
    ];
    fn name(self) -> &'static str {
        match self {
            Whose::Yours => "yours",
            Whose::Solution => "solution",
            Whose::Skeleton => "skeleton",
            Whose::Planted => "planted",
        }
    }
}

/// The functions the labs ask for, as one set of files has them.
pub trait Code {
    /// Lab 1.
    fn ping_pong(comm: &Communicator, buf: &mut Buffer<f32>, round_trips: usize) -> Result<()>;
    /// Lab 1.
    fn fit_alpha_beta(points: &[(f64, f64)]) -> (f64, f64);
    /// Lab 2.
    fn tree_broadcast<T: Element>(
        comm: &Communicator,
        buf: &mut Buffer<T>,
        root: usize,
    ) -> Result<()>;
    /// Lab 3.
    fn ring_all_reduce<T: Element>(comm: &Communicator, data: &mut Buffer<T>) -> Result<()>;
    /// Lab 4, in place.
    fn all_gather<T: Element>(comm: &Communicator, buf: &mut Buffer<T>) -> Result<()>;
    /// Lab 4, out of place.
    fn all_gather_into<T: Element>(
        comm: &Communicator,
        send: &Buffer<T>,
        recv: &mut Buffer<T>,
    ) -> Result<()>;
    /// Lab 4, in place.
    fn reduce_scatter<T: Element>(comm: &Communicator, buf: &mut Buffer<T>) -> Result<()>;
    /// Lab 4, out of place.
    fn reduce_scatter_into<T: Element>(
        comm: &Communicator,
        send: &Buffer<T>,
        recv: &mut Buffer<T>,
    ) -> Result<()>;
    /// Lab 5.
    fn naive(comm: &Communicator, grads: &mut [f32], tensors: &[Range<usize>]) -> Result<()>;
    /// Lab 5.
    fn flattened(comm: &Communicator, grads: &mut [f32]) -> Result<()>;
    /// Lab 5.
    fn bucketed(
        comm: &AsyncComm,
        backward: &mut Backward<'_>,
        buckets: &[Bucket],
        tensors: &[Range<usize>],
    ) -> Result<()>;
    /// Lab 6.
    fn zero1_step(
        comm: &Communicator,
        params: &mut [f32],
        grads: &[f32],
        momentum: &mut [f32],
        sgd: Sgd,
    ) -> Result<()>;
    /// Lab 7.
    fn end_of_step(
        comm: &Communicator,
        stats: &mut Buffer<f32>,
        lr: &mut Buffer<f32>,
    ) -> Result<()>;
    /// Lab 8.
    fn mesh_groups(comm: &Communicator, dp: usize, tp: usize) -> Result<Mesh>;
}

/// Implements [`Code`] for a new type `$whose` with the files of module `$files` (`main.rs`
/// declares the four sets of files and their types).
macro_rules! code {
    ($whose:ident, $files:path) => {
        #[doc = concat!("The ", stringify!($whose), " files.")]
        pub struct $whose;
        impl crate::code::Code for $whose {
            fn ping_pong(
                comm: &::comm_core::Communicator,
                buf: &mut ::comm_core::Buffer<f32>,
                round_trips: usize,
            ) -> ::comm_core::Result<()> {
                use $files as files;
                files::lab1_ping_pong::ping_pong(comm, buf, round_trips)
            }
            fn fit_alpha_beta(points: &[(f64, f64)]) -> (f64, f64) {
                use $files as files;
                files::lab1_ping_pong::fit_alpha_beta(points)
            }
            fn tree_broadcast<T: ::comm_core::Element>(
                comm: &::comm_core::Communicator,
                buf: &mut ::comm_core::Buffer<T>,
                root: usize,
            ) -> ::comm_core::Result<()> {
                use $files as files;
                files::lab2_tree_broadcast::tree_broadcast(comm, buf, root)
            }
            fn ring_all_reduce<T: ::comm_core::Element>(
                comm: &::comm_core::Communicator,
                data: &mut ::comm_core::Buffer<T>,
            ) -> ::comm_core::Result<()> {
                use $files as files;
                files::lab3_ring_all_reduce::ring_all_reduce(comm, data)
            }
            fn all_gather<T: ::comm_core::Element>(
                comm: &::comm_core::Communicator,
                buf: &mut ::comm_core::Buffer<T>,
            ) -> ::comm_core::Result<()> {
                use $files as files;
                files::lab4_rings::all_gather(comm, buf)
            }
            fn all_gather_into<T: ::comm_core::Element>(
                comm: &::comm_core::Communicator,
                send: &::comm_core::Buffer<T>,
                recv: &mut ::comm_core::Buffer<T>,
            ) -> ::comm_core::Result<()> {
                use $files as files;
                files::lab4_rings::all_gather_into(comm, send, recv)
            }
            fn reduce_scatter<T: ::comm_core::Element>(
                comm: &::comm_core::Communicator,
                buf: &mut ::comm_core::Buffer<T>,
            ) -> ::comm_core::Result<()> {
                use $files as files;
                files::lab4_rings::reduce_scatter(comm, buf)
            }
            fn reduce_scatter_into<T: ::comm_core::Element>(
                comm: &::comm_core::Communicator,
                send: &::comm_core::Buffer<T>,
                recv: &mut ::comm_core::Buffer<T>,
            ) -> ::comm_core::Result<()> {
                use $files as files;
                files::lab4_rings::reduce_scatter_into(comm, send, recv)
            }
            fn naive(
                comm: &::comm_core::Communicator,
                grads: &mut [f32],
                tensors: &[::std::ops::Range<usize>],
            ) -> ::comm_core::Result<()> {
                use $files as files;
                files::lab5_ddp::naive(comm, grads, tensors)
            }
            fn flattened(
                comm: &::comm_core::Communicator,
                grads: &mut [f32],
            ) -> ::comm_core::Result<()> {
                use $files as files;
                files::lab5_ddp::flattened(comm, grads)
            }
            fn bucketed(
                comm: &::comm_core::AsyncComm,
                backward: &mut crate::ddp::Backward<'_>,
                buckets: &[crate::ddp::Bucket],
                tensors: &[::std::ops::Range<usize>],
            ) -> ::comm_core::Result<()> {
                use $files as files;
                files::lab5_ddp::bucketed(comm, backward, buckets, tensors)
            }
            fn zero1_step(
                comm: &::comm_core::Communicator,
                params: &mut [f32],
                grads: &[f32],
                momentum: &mut [f32],
                sgd: crate::ddp::Sgd,
            ) -> ::comm_core::Result<()> {
                use $files as files;
                files::lab6_zero::zero1_step(comm, params, grads, momentum, sgd)
            }
            fn end_of_step(
                comm: &::comm_core::Communicator,
                stats: &mut ::comm_core::Buffer<f32>,
                lr: &mut ::comm_core::Buffer<f32>,
            ) -> ::comm_core::Result<()> {
                use $files as files;
                files::lab7_deadlock::end_of_step(comm, stats, lr)
            }
            fn mesh_groups(
                comm: &::comm_core::Communicator,
                dp: usize,
                tp: usize,
            ) -> ::comm_core::Result<::comm_core::Mesh> {
                use $files as files;
                files::lab8_groups::mesh_groups(comm, dp, tp)
            }
        }
    };
}

pub(crate) use code;
