//! The CPU backend: Gloo-style collectives on host memory, run by [`algorithms`] over a
//! [`Transport`] (TCP between processes, channels between threads).

pub mod algorithms;
mod channel;
mod tcp;
mod transport;

pub use channel::ChannelTransport;
pub use tcp::TcpTransport;
pub use transport::Transport;

use crate::dtype::{Element, ReduceOp};
use crate::error::Result;

/// Collectives on host slices. In-place calls work on one buffer; `_into` calls read `send` and
/// write `recv`, as NCCL's out-of-place calls do.
pub struct CpuBackend {
    transport: Box<dyn Transport>,
}

impl CpuBackend {
    pub fn new(transport: Box<dyn Transport>) -> Self {
        CpuBackend { transport }
    }

    pub fn transport(&self) -> &dyn Transport {
        self.transport.as_ref()
    }

    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        algorithms::broadcast(self.transport(), buf, root)
    }

    pub fn broadcast_into<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        root: usize,
    ) -> Result<()> {
        if self.transport.rank() == root {
            recv.copy_from_slice(send);
        }
        self.broadcast(recv, root)
    }

    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        algorithms::all_reduce(self.transport(), buf, op)
    }

    pub fn all_reduce_into<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        recv.copy_from_slice(send);
        self.all_reduce(recv, op)
    }

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
        if self.transport.rank() == root {
            recv.copy_from_slice(send);
            self.reduce(recv, op, root)
        } else {
            self.reduce(&mut send.to_vec(), op, root)
        }
    }

    pub fn all_gather<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        algorithms::all_gather(self.transport(), buf)
    }

    pub fn all_gather_into<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let rank = self.transport.rank();
        recv[rank * send.len()..(rank + 1) * send.len()].copy_from_slice(send);
        self.all_gather(recv)
    }

    pub fn reduce_scatter<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        algorithms::reduce_scatter(self.transport(), buf, op)
    }

    pub fn reduce_scatter_into<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let rank = self.transport.rank();
        let mut scratch = send.to_vec();
        self.reduce_scatter(&mut scratch, op)?;
        recv.copy_from_slice(&scratch[rank * recv.len()..(rank + 1) * recv.len()]);
        Ok(())
    }

    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        algorithms::all_to_all(self.transport(), send, recv)
    }

    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.transport.send(peer, bytemuck::cast_slice(buf))
    }

    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.transport.recv(peer, bytemuck::cast_slice_mut(buf))
    }

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

    pub fn barrier(&self) -> Result<()> {
        algorithms::barrier(self.transport())
    }
}
