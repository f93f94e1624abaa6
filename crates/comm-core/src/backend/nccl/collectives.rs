//! From a call of the collective table to NCCL: which `ncclX` function (or group of
//! `ncclSend`/`ncclRecv`) each collective is, and where its pointers point. The lengths were
//! checked against the table ([`Call::check`]); in place, the pointers come from the table's
//! offsets ([`Counts`]), NCCL's convention (all_gather reads this rank's block of the one buffer,
//! reduce_scatter writes it).
//!
//! [`Call::check`]: crate::collective::Call::check
//! [`Counts`]: crate::collective::Counts

use cudarc::driver::{DevicePtr, DevicePtrMut};
use cudarc::nccl::{result, sys};

use super::calls::NcclBackend;
use super::group_safe;
use crate::collective::{Checked, Collective};
use crate::dtype::{DType, Element, ReduceOp};
use crate::error::{CommError, Result};

type Status = std::result::Result<result::NcclStatus, result::NcclError>;

fn data_type(dtype: DType) -> sys::ncclDataType_t {
    match dtype {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::F64 => sys::ncclDataType_t::ncclFloat64,
        DType::I32 => sys::ncclDataType_t::ncclInt32,
        DType::I64 => sys::ncclDataType_t::ncclInt64,
        #[cfg(feature = "f16")]
        DType::F16 => sys::ncclDataType_t::ncclFloat16,
        #[cfg(feature = "f16")]
        DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
    }
}

fn red_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Prod => sys::ncclRedOp_t::ncclProd,
        ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
    }
}

/// NCCL's name for what a collective enqueues, as errors and the watchdog say it.
fn nccl_name(collective: Collective) -> &'static str {
    match collective {
        Collective::AllReduce => "ncclAllReduce",
        Collective::AllGather => "ncclAllGather",
        Collective::ReduceScatter => "ncclReduceScatter",
        Collective::Broadcast => "ncclBroadcast",
        Collective::Reduce => "ncclReduce",
        Collective::SendRecv => "ncclSend/ncclRecv group",
        Collective::AllToAll => "ncclSend/ncclRecv alltoall group",
        Collective::Gather => "ncclSend/ncclRecv gather group",
        Collective::Scatter => "ncclSend/ncclRecv scatter group",
    }
}

/// The call of NCCL's own that nccl-tests (built against NCCL 2.28 or later) makes for a
/// collective this backend puts together from grouped ncclSend/ncclRecv, as it did before 2.28.
pub fn own_call_since_2_28(collective: Collective) -> Option<&'static str> {
    match collective {
        Collective::AllToAll => Some("ncclAlltoAll"),
        Collective::Gather => Some("ncclGather"),
        Collective::Scatter => Some("ncclScatter"),
        Collective::AllReduce
        | Collective::AllGather
        | Collective::ReduceScatter
        | Collective::Broadcast
        | Collective::Reduce
        | Collective::SendRecv => None,
    }
}

/// One call's device pointers and sizes, as NCCL takes them.
struct Args {
    send: u64,
    recv: u64,
    count: usize,
    /// Bytes in one block of `count` elements: how far apart the peers' blocks are.
    block_bytes: u64,
    dtype: sys::ncclDataType_t,
    comm: sys::ncclComm_t,
    stream: sys::cudaStream_t,
}

/// Enqueues `checked`'s NCCL function(s) with `a`'s pointers.
///
/// # Safety
/// `a.send` and `a.recv` point into live device buffers on the communicator's GPU, whose lengths
/// [`Call::check`](crate::collective::Call::check) found right for the call, `a.count` and the
/// communicator's world size (so every block NCCL reads or writes, up to world_size blocks of
/// `a.count`, lies inside them); `a.comm` is live; `a.dtype` is the buffers' element type.
unsafe fn launch(checked: &Checked, a: &Args) -> Status {
    let call = checked.call;
    let (s, r, count, dtype, comm, stream) = (a.send, a.recv, a.count, a.dtype, a.comm, a.stream);
    let (root, op) = (call.root as i32, red_op(call.op));
    match call.collective {
        Collective::AllReduce => result::all_reduce(s as _, r as _, count, dtype, op, comm, stream),
        Collective::AllGather => result::all_gather(s as _, r as _, count, dtype, comm, stream),
        Collective::ReduceScatter => {
            result::reduce_scatter(s as _, r as _, count, dtype, op, comm, stream)
        }
        Collective::Broadcast => {
            result::broadcast(s as _, r as _, count, dtype, root, comm, stream)
        }
        Collective::Reduce => result::reduce(s as _, r as _, count, dtype, op, root, comm, stream),
        Collective::SendRecv => {
            let (to, from) = call.exchange_peers(checked.rank(), checked.world_size());
            grouped(|| {
                result::send(s as _, count, dtype, to as i32, comm, stream)?;
                result::recv(r as _, count, dtype, from as i32, comm, stream)
            })
        }
        // ANCHOR: nccl_all_to_all
        // As nccl-tests' alltoall: one group, a send of block j to rank j and a receive of
        // block j from rank j for every j; NCCL runs the whole group at once.
        Collective::AllToAll => grouped(|| {
            for peer in 0..checked.world_size() {
                let at = peer as u64 * a.block_bytes;
                result::send((s + at) as _, count, dtype, peer as i32, comm, stream)?;
                result::recv((r + at) as _, count, dtype, peer as i32, comm, stream)?;
            }
            Ok(result::NcclStatus::Success)
        }),
        // ANCHOR_END: nccl_all_to_all
        // ANCHOR: nccl_gather
        // As nccl-tests' gather: every rank sends its block to the root, which receives block
        // j from rank j (itself included), all in one group.
        Collective::Gather => grouped(|| {
            if checked.rank() == call.root {
                for peer in 0..checked.world_size() {
                    let at = peer as u64 * a.block_bytes;
                    result::recv((r + at) as _, count, dtype, peer as i32, comm, stream)?;
                }
            }
            result::send(s as _, count, dtype, root, comm, stream)
        }),
        // ANCHOR_END: nccl_gather
        // As nccl-tests' scatter: the root sends block j to rank j (itself included), and every
        // rank receives its block from the root, all in one group.
        Collective::Scatter => grouped(|| {
            if checked.rank() == call.root {
                for peer in 0..checked.world_size() {
                    let at = peer as u64 * a.block_bytes;
                    result::send((s + at) as _, count, dtype, peer as i32, comm, stream)?;
                }
            }
            result::recv(r as _, count, dtype, root, comm, stream)
        }),
    }
}

/// `calls` between ncclGroupStart and ncclGroupEnd, which is called even when one failed. Counted
/// as every group is ([`group_safe`]); `calls` abort nothing, so no abort waits for this end.
fn grouped(calls: impl FnOnce() -> Status) -> Status {
    group_safe::group_start()?;
    let queued = calls();
    let (ended, aborts) = group_safe::group_end();
    debug_assert!(
        aborts.is_empty(),
        "an abort waited for a group that aborts nothing"
    );
    queued.and(ended)
}

impl NcclBackend {
    /// The one way a collective reaches NCCL: takes the buffers' device pointers (in place, at
    /// the table's offsets into the one buffer) and enqueues the call's NCCL function.
    pub(crate) fn collective<T: Element>(
        &self,
        checked: &Checked,
        send: Option<&impl DevicePtr<T>>,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        if !checked.fits(send.map(|b| b.len()), recv.len(), self.world_size) {
            return Err(CommError::Usage(format!(
                "{}: buffers other than the ones checked",
                checked.call.collective
            )));
        }
        let element = std::mem::size_of::<T>() as u64;
        let counts = checked.counts;
        // The guards borrow the buffers (so they cannot be freed) until they drop at the end of
        // this function, after the call is enqueued; dropping, they tell cudarc the buffers were
        // used on this stream.
        let (r, _r) = recv.device_ptr_mut(&self.stream);
        let (s, _s) = send.map(|b| b.device_ptr(&self.stream)).unzip();
        let send = s.unwrap_or(r + counts.in_place_send_offset as u64 * element);
        let recv = match s {
            Some(_) => r,
            None => r + counts.in_place_recv_offset as u64 * element,
        };
        let what = nccl_name(checked.call.collective);
        self.enqueue(what, |comm, stream| {
            let args = Args {
                send,
                recv,
                count: counts.count,
                block_bytes: counts.count as u64 * element,
                dtype: data_type(T::DTYPE),
                comm,
                stream,
            };
            // SAFETY: `fits` holds, so the buffers are the checked ones, of the lengths the
            // table gives for this call on this world size, and in place the offsets stay inside
            // the one buffer (the table's); the pointers are those of live buffers on this rank's
            // GPU, kept alive by `_s`/`_r` until the call is enqueued; the dtype is T's; enqueue
            // hands over a live communicator and this rank's stream.
            unsafe { launch(checked, &args) }
        })
    }

    /// Sends `buf` to `peer`, which must receive as many elements: one message, on its own.
    pub(crate) fn send<T: Element>(&self, buf: &impl DevicePtr<T>, peer: usize) -> Result<()> {
        let (s, _s) = buf.device_ptr(&self.stream);
        let (count, dtype) = (buf.len(), data_type(T::DTYPE));
        // SAFETY: NCCL reads `count` elements of T from a live buffer (or a part of one, checked
        // to lie inside it) of that many, kept alive by `_s` until the call is enqueued; enqueue
        // hands over a live communicator.
        self.enqueue("ncclSend", |comm, stream| unsafe {
            result::send(s as _, count, dtype, peer as i32, comm, stream)
        })
    }

    /// Receives `buf.len()` elements from `peer`.
    pub(crate) fn recv<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        peer: usize,
    ) -> Result<()> {
        let (count, dtype) = (buf.len(), data_type(T::DTYPE));
        let (r, _r) = buf.device_ptr_mut(&self.stream);
        // SAFETY: NCCL writes `count` elements of T into a live buffer (or a part of one) of that
        // many, kept alive by `_r` until the call is enqueued; enqueue hands over a live
        // communicator.
        self.enqueue("ncclRecv", |comm, stream| unsafe {
            result::recv(r as _, count, dtype, peer as i32, comm, stream)
        })
    }
}
