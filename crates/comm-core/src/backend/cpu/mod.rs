//! The CPU backend: Gloo-style collectives on host memory, run by [`algorithms`] over a
//! [`Transport`]: shared memory between processes of one host, TCP between hosts (and where
//! asked for), channels between threads.

pub mod algorithms;
mod channel;
pub mod shm;
mod tcp;
mod transport;

pub use channel::ChannelTransport;
pub use shm::{remove_own_segments, ShmTransport};
pub use tcp::TcpTransport;
pub use transport::{threaded_send_recv_with, CallScope, Sink, Transport, PIECE_BYTES};

/// What the user asked for with `--transport`: how CPU ranks move bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportChoice {
    /// Shared memory between ranks of one host, TCP between hosts.
    Auto,
    /// Shared memory between every pair; an error where ranks do not share a host.
    Shm,
    /// TCP between every pair, even on one host (what Gloo does).
    Tcp,
}

use crate::dtype::{Element, ReduceOp};
use crate::error::Result;

/// Collectives on host slices. In-place calls work on one buffer; `_into` calls read `send` and
/// write `recv`, as NCCL's out-of-place calls do.
pub struct CpuBackend {
    transport: Box<dyn Transport>,
}

impl CpuBackend {
    /// Collectives over `transport` (TCP between processes, channels between threads).
    pub fn new(transport: Box<dyn Transport>) -> Self {
        CpuBackend { transport }
    }

    /// The transport underneath, for its rank, world size and name.
    pub fn transport(&self) -> &dyn Transport {
        self.transport.as_ref()
    }

    /// Fills every rank's `buf` with the root's.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        algorithms::broadcast(self.transport(), buf, root)
    }

    /// The root's `send` lands in every rank's `recv`; other ranks' `send` is not read.
    pub fn broadcast_into<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        root: usize,
    ) -> Result<()> {
        algorithms::broadcast_into(self.transport(), send, recv, root)
    }

    /// Every rank's `buf` ends with the element-wise reduction of all ranks' buffers.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        algorithms::all_reduce(self.transport(), buf, op)
    }

    /// [`all_reduce`](Self::all_reduce) reading `send` and writing `recv`.
    pub fn all_reduce_into<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        algorithms::all_reduce_into(self.transport(), send, recv, op)
    }

    /// Reduces every rank's `buf` into the root's; other ranks' buffers are left as they were.
    pub fn reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        algorithms::reduce(self.transport(), buf, op, root)
    }

    /// Only the root's `recv` is written.
    pub fn reduce_into<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        algorithms::reduce_into(self.transport(), send, recv, op, root)
    }

    /// `buf` holds world_size equal blocks, this rank's in block `rank`; afterwards every block
    /// is filled.
    pub fn all_gather<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        algorithms::all_gather(self.transport(), buf)
    }

    /// `recv` (world_size × send.len()) gets every rank's `send`, in rank order.
    pub fn all_gather_into<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        algorithms::all_gather_into(self.transport(), send, recv)
    }

    /// `buf` holds world_size equal blocks; afterwards block `rank` holds its reduction over all
    /// ranks.
    pub fn reduce_scatter<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        algorithms::reduce_scatter(self.transport(), buf, op)
    }

    /// `send` (world_size × recv.len()) is reduced over ranks; block `rank` lands in `recv`.
    pub fn reduce_scatter_into<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        algorithms::reduce_scatter_into(self.transport(), send, recv, op)
    }

    /// Block `j` of `send` goes to rank `j`; block `i` of `recv` comes from rank `i`.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        algorithms::all_to_all(self.transport(), send, recv)
    }

    /// Sends `buf` to `peer` as one message; may block until `peer` receives it.
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.transport.send(peer, bytemuck::cast_slice(buf))
    }

    /// Receives one message from `peer`; one of another length than `buf` is an error.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.transport.recv(peer, bytemuck::cast_slice_mut(buf))
    }

    /// Sends to `to` while receiving from `from`, so a ring of ranks that all send cannot deadlock.
    pub fn send_recv<T: Element>(
        &self,
        send: &[T],
        to: usize,
        recv: &mut [T],
        from: usize,
    ) -> Result<()> {
        self.transport.send_recv(
            to,
            bytemuck::cast_slice(send),
            from,
            bytemuck::cast_slice_mut(recv),
        )
    }

    /// Returns once every rank has called it (a dissemination barrier).
    pub fn barrier(&self) -> Result<()> {
        algorithms::barrier(self.transport())
    }
}
