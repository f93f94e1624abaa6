#![warn(missing_docs)]
//! comm-core: everything a rank needs, one module per step of its life:
//!
//! environment → [`topology`] → [`store`] (rendezvous) → [`backend`] → [`comm::Communicator`]
//! → collectives on buffers → [`grid`] on rank 0.
//!
//! [`topology`] is the only module that reads the environment; [`host`] is this machine (its
//! name, its interfaces). The flags become one [`settings::Settings`] value; [`spawn`] starts
//! the ranks when no launcher did; a [`job::Job`] is what a launch gives a rank and builds its
//! communicators with those settings; [`launch::run`] ties it all together. Every collective is
//! described once, in [`collective`]; [`check`], the tests and comm-bench read that table.
//! [`work`] runs a communicator's collectives on a thread of its own, each a handle to wait on
//! (torch's `async_op=True`), as data-parallel training overlaps them with backward.
//! [`Communicator::split`] makes a group's communicator of some of the ranks (NCCL's
//! `ncclCommSplit`), and [`mesh`] a rank's data- and tensor-parallel groups.

pub mod agree;
pub mod backend;
pub mod check;
pub mod collective;
pub mod comm;
pub mod deadline;
pub mod descriptors;
pub mod dtype;
pub mod epoll;
pub mod error;
pub mod failure_record;
pub mod grid;
pub mod heartbeat;
pub mod host;
mod host_memory;
pub mod job;
pub mod launch;
pub mod memory;
pub mod mesh;
pub mod named;
pub mod phase;
pub mod settings;
pub mod spawn;
pub mod steps;
pub mod stopwatch;
pub mod store;
pub mod streaming;
pub mod timing;
pub mod topology;
pub mod trace;
pub mod units;
pub mod work;

pub use backend::{BackendChoice, BackendKind, Device};
pub use collective::{Call, Collective};
pub use comm::split::NO_COLOR;
pub use comm::{Buffer, Communicator};
pub use dtype::{DType, Element, ReduceOp};
pub use error::{CommError, Result};
pub use failure_record::{report_failure, ErrorRecord};
pub use job::Job;
pub use launch::run;
pub use mesh::{Mesh, Order};
pub use named::Named;
pub use settings::{JobArgs, LaunchArgs, Settings};
pub use topology::Topology;
pub use work::{AsyncComm, Work};
