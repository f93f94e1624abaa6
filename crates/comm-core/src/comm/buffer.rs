//! A communicator's buffers: elements where its backend computes, host memory on the CPU,
//! device memory on NCCL (a buffer freed inside an open NCCL group waits for the group's end);
//! and a rank's buffers for one call, in place or out of place.

use crate::backend::nccl::GroupSafe;
use crate::dtype::Element;
use crate::error::{CommError, Result};
use crate::host_memory::HostMemory;

/// Elements on the communicator's device: host memory for the CPU backend, GPU memory for NCCL.
#[derive(Debug)]
pub struct Buffer<T: Element> {
    pub(super) repr: Repr<T>,
}

/// Where a buffer's elements are.
#[derive(Debug)]
pub(super) enum Repr<T: Element> {
    /// On the heap, or in registered memory where the ranks share a host.
    Host(HostMemory<T>),
    /// Never freed inside an open NCCL group, whose kernels only run at its end.
    Device(GroupSafe<T>),
}

impl<T: Element> Buffer<T> {
    /// Number of elements (not bytes).
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Host(v) => v.len(),
            Repr::Device(d) => d.len(),
        }
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A rank's buffers for one call: one buffer in place, a send and a receive buffer out of place.
#[derive(Debug)]
pub enum Buffers<T: Element> {
    /// The result overwrites the input.
    InPlace(Buffer<T>),
    /// Separate buffers, as NCCL's out-of-place calls take them.
    OutOfPlace {
        /// Read by the call.
        send: Buffer<T>,
        /// Written by the call.
        recv: Buffer<T>,
    },
}

impl<T: Element> Buffers<T> {
    /// The send buffer (none in place) and the receive buffer, as [`Communicator::collective`](Communicator::collective)
    /// takes them.
    pub fn parts(&mut self) -> (Option<&Buffer<T>>, &mut Buffer<T>) {
        match self {
            Buffers::InPlace(buf) => (None, buf),
            Buffers::OutOfPlace { send, recv } => (Some(send), recv),
        }
    }
}

pub(super) fn wrong_kind() -> CommError {
    CommError::Usage("this buffer belongs to a communicator of another backend".into())
}

/// A copy between buffers of different lengths is refused, naming both.
pub(super) fn same_length<T: Element>(what: &str, a: &Buffer<T>, b: &Buffer<T>) -> Result<()> {
    if a.len() == b.len() {
        return Ok(());
    }
    Err(CommError::Usage(format!(
        "{what}: a buffer of {} elements and one of {}: they must be as long",
        a.len(),
        b.len()
    )))
}

pub(super) fn host<T: Element>(buf: &Buffer<T>) -> Result<&[T]> {
    match &buf.repr {
        Repr::Host(v) => Ok(v),
        Repr::Device(_) => Err(wrong_kind()),
    }
}

pub(super) fn host_mut<T: Element>(buf: &mut Buffer<T>) -> Result<&mut [T]> {
    match &mut buf.repr {
        Repr::Host(v) => Ok(v),
        Repr::Device(_) => Err(wrong_kind()),
    }
}
