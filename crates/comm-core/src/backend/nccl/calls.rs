//! The calls: one rank's communicator, its GPU and stream, and every collective enqueued on
//! that stream and waited for under the watchdog.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::{result, sys};

use super::errors::{cuda, nccl};
use super::id::{id_from_bytes, new_unique_id};
use super::init::init_rank;
use super::probe::quietly;
use super::watchdog::{async_state, watch, Look};
use crate::dtype::{DType, Element, ReduceOp};
use crate::error::{CommError, Result};
use crate::store::Store;

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

/// One rank's NCCL communicator, its GPU and stream.
pub struct NcclBackend {
    stream: Arc<CudaStream>,
    comm: sys::ncclComm_t,
    rank: usize,
    timeout: Duration,
    aborted: std::cell::Cell<bool>,
}

impl NcclBackend {
    /// Binds this rank to its GPU and builds the communicator through the store.
    pub fn connect(
        store: &Store,
        prefix: &str,
        rank: usize,
        world_size: usize,
        ordinal: usize,
    ) -> Result<Self> {
        let ctx = quietly(|| CudaContext::new(ordinal))
            .map_err(|p| CommError::Backend(format!("CUDA did not load: {p}")))?
            .map_err(cuda(&format!("opening cuda:{ordinal}")))?;
        let stream = ctx.new_stream().map_err(cuda("creating a stream"))?;
        // ANCHOR: unique_id
        let id = if rank == 0 {
            let id = new_unique_id()?;
            store.set(&format!("{prefix}/id"), &id)?;
            id_from_bytes(&id)?
        } else {
            id_from_bytes(&store.get(&format!("{prefix}/id"))?)?
        };
        // Everyone has the Id and is alive before NCCL's own init starts.
        store.barrier(&format!("{prefix}/init"))?;
        ctx.bind_to_thread().map_err(cuda("binding the context"))?;
        let comm = init_rank(world_size, id, rank, store.timeout())?;
        // ANCHOR_END: unique_id
        Ok(NcclBackend {
            stream,
            comm,
            rank,
            timeout: store.timeout(),
            aborted: std::cell::Cell::new(false),
        })
    }

    fn cu_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    fn check_usable(&self) -> Result<()> {
        if self.aborted.get() {
            return Err(CommError::Backend(
                "the NCCL communicator was aborted after an earlier failure".into(),
            ));
        }
        Ok(())
    }

    /// Waits for the work just enqueued: first for NCCL to finish enqueuing it (a nonblocking
    /// communicator may still be connecting), then for the GPU to finish it, watching for NCCL
    /// and CUDA errors and the timeout all the while.
    fn wait(&self, what: &str) -> Result<()> {
        let mut done = None;
        let mut look = || -> Result<Look> {
            if async_state(self.comm).map_err(nccl(what))? == Look::Busy {
                return Ok(Look::Busy);
            }
            let event = match &done {
                Some(event) => event,
                None => done.insert(
                    self.stream
                        .record_event(None)
                        .map_err(cuda("recording an event"))?,
                ),
            };
            let complete = event.try_is_complete().map_err(cuda(what))?;
            Ok(if complete { Look::Done } else { Look::Busy })
        };
        watch(
            &format!("NCCL {what} on rank {} to complete", self.rank),
            " (a peer died or is stuck?); the communicator was aborted",
            self.timeout,
            &mut look,
            || self.abort(),
        )
    }

    fn abort(&self) {
        if !self.aborted.replace(true) {
            // SAFETY: aborting a live communicator once; later calls see `aborted`.
            let _ = unsafe { result::comm_abort(self.comm) };
        }
    }

    /// Copies host values into a new buffer on this rank's GPU.
    pub fn upload<T: Element>(&self, values: &[T]) -> Result<CudaSlice<T>> {
        self.stream
            .clone_htod(values)
            .map_err(cuda("copying to the GPU"))
    }

    /// Copies a GPU buffer back to the host, after the work queued before it on the stream.
    pub fn download<T: Element>(&self, buf: &CudaSlice<T>) -> Result<Vec<T>> {
        self.stream
            .clone_dtoh(buf)
            .map_err(cuda("copying from the GPU"))
    }

    /// Enqueues one NCCL call with (send, recv) device pointers and waits for it.
    fn call(
        &self,
        what: &str,
        launch: impl FnOnce(
            sys::ncclComm_t,
            sys::cudaStream_t,
        ) -> std::result::Result<result::NcclStatus, result::NcclError>,
    ) -> Result<()> {
        self.check_usable()?;
        launch(self.comm, self.cu_stream()).map_err(nccl(what))?;
        self.wait(what)
    }

    /// Every rank's `recv` gets the root's `send` (or, with no `send`, the root's `recv`).
    pub fn broadcast<T: Element>(
        &self,
        send: Option<&CudaSlice<T>>,
        recv: &mut CudaSlice<T>,
        root: usize,
    ) -> Result<()> {
        let count = recv.len();
        let (r, _r) = recv.device_ptr_mut(&self.stream);
        let s = send.map_or(r, |send| send.device_ptr(&self.stream).0);
        // SAFETY: both pointers address `count` elements of T on this rank's GPU.
        self.call("ncclBroadcast", |comm, stream| unsafe {
            result::broadcast(
                s as _,
                r as _,
                count,
                data_type(T::DTYPE),
                root as i32,
                comm,
                stream,
            )
        })
    }

    /// Every rank's `recv` gets the reduction of all ranks' `send` (in place: of their `recv`).
    pub fn all_reduce<T: Element>(
        &self,
        send: Option<&CudaSlice<T>>,
        recv: &mut CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<()> {
        let count = recv.len();
        let (r, _r) = recv.device_ptr_mut(&self.stream);
        let s = send.map_or(r, |send| send.device_ptr(&self.stream).0);
        // SAFETY: as above.
        self.call("ncclAllReduce", |comm, stream| unsafe {
            result::all_reduce(
                s as _,
                r as _,
                count,
                data_type(T::DTYPE),
                red_op(op),
                comm,
                stream,
            )
        })
    }

    /// As [`all_reduce`](Self::all_reduce), but only the root's `recv` gets the result.
    pub fn reduce<T: Element>(
        &self,
        send: Option<&CudaSlice<T>>,
        recv: &mut CudaSlice<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let count = recv.len();
        let (r, _r) = recv.device_ptr_mut(&self.stream);
        let s = send.map_or(r, |send| send.device_ptr(&self.stream).0);
        // SAFETY: as above; NCCL writes `recv` on the root only.
        self.call("ncclReduce", |comm, stream| unsafe {
            result::reduce(
                s as _,
                r as _,
                count,
                data_type(T::DTYPE),
                red_op(op),
                root as i32,
                comm,
                stream,
            )
        })
    }

    /// `recv` holds world_size blocks of `count`; in place, `send` is this rank's block of it.
    pub fn all_gather<T: Element>(
        &self,
        send: Option<&CudaSlice<T>>,
        recv: &mut CudaSlice<T>,
        count: usize,
    ) -> Result<()> {
        let offset = (self.rank * count * std::mem::size_of::<T>()) as u64;
        let (r, _r) = recv.device_ptr_mut(&self.stream);
        let s = send.map_or(r + offset, |send| send.device_ptr(&self.stream).0);
        // SAFETY: `recv` holds world_size × count elements; `s` addresses count of them.
        self.call("ncclAllGather", |comm, stream| unsafe {
            result::all_gather(s as _, r as _, count, data_type(T::DTYPE), comm, stream)
        })
    }

    /// `send` holds world_size blocks of `count`; in place, the result lands in this rank's block.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: Option<&CudaSlice<T>>,
        recv: &mut CudaSlice<T>,
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let offset = (self.rank * count * std::mem::size_of::<T>()) as u64;
        let (r, _r) = recv.device_ptr_mut(&self.stream);
        let (s, r) = match send {
            Some(send) => (send.device_ptr(&self.stream).0, r),
            None => (r, r + offset),
        };
        // SAFETY: `s` holds world_size × count elements; `r` addresses count of them.
        self.call("ncclReduceScatter", |comm, stream| unsafe {
            result::reduce_scatter(
                s as _,
                r as _,
                count,
                data_type(T::DTYPE),
                red_op(op),
                comm,
                stream,
            )
        })
    }

    /// Sends `buf` to `peer`, which must receive as many elements.
    pub fn send<T: Element>(&self, buf: &CudaSlice<T>, peer: usize) -> Result<()> {
        let count = buf.len();
        let (s, _s) = buf.device_ptr(&self.stream);
        // SAFETY: `s` addresses `count` elements on this GPU.
        self.call("ncclSend", |comm, stream| unsafe {
            result::send(
                s as _,
                count,
                data_type(T::DTYPE),
                peer as i32,
                comm,
                stream,
            )
        })
    }

    /// Receives `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&self, buf: &mut CudaSlice<T>, peer: usize) -> Result<()> {
        let count = buf.len();
        let (r, _r) = buf.device_ptr_mut(&self.stream);
        // SAFETY: `r` addresses `count` elements on this GPU.
        self.call("ncclRecv", |comm, stream| unsafe {
            result::recv(
                r as _,
                count,
                data_type(T::DTYPE),
                peer as i32,
                comm,
                stream,
            )
        })
    }

    /// Both calls in one NCCL group: NCCL runs them together, so every rank may send first.
    pub fn send_recv<T: Element>(
        &self,
        send: &CudaSlice<T>,
        to: usize,
        recv: &mut CudaSlice<T>,
        from: usize,
    ) -> Result<()> {
        let (send_count, recv_count) = (send.len(), recv.len());
        let (s, _s) = send.device_ptr(&self.stream);
        let (r, _r) = recv.device_ptr_mut(&self.stream);
        let dtype = data_type(T::DTYPE);
        // SAFETY: `s` and `r` address their buffers' elements on this GPU; the group is closed
        // whatever happens inside it.
        self.call("ncclSend/ncclRecv group", |comm, stream| unsafe {
            result::group_start()?;
            let queued = result::send(s as _, send_count, dtype, to as i32, comm, stream)
                .and_then(|_| result::recv(r as _, recv_count, dtype, from as i32, comm, stream));
            let ended = result::group_end();
            queued.and(ended)
        })
    }

    /// `send` and `recv` hold world_size blocks of `count`: one group with a send of block `j` to
    /// rank `j` and a receive of block `j` from rank `j` for every rank, as nccl-tests' alltoall
    /// (NCCL runs the whole group at once, so no rank waits for another's turn).
    pub fn all_to_all<T: Element>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        count: usize,
        world_size: usize,
    ) -> Result<()> {
        let block_bytes = (count * std::mem::size_of::<T>()) as u64;
        let (s, _s) = send.device_ptr(&self.stream);
        let (r, _r) = recv.device_ptr_mut(&self.stream);
        let dtype = data_type(T::DTYPE);
        // SAFETY: `send` and `recv` each hold world_size × count elements on this GPU (the
        // communicator checked the lengths), so every block pointer addresses `count` of them;
        // the guards `_s` and `_r` keep both buffers alive until the group is enqueued; the
        // group is closed whatever happens inside it.
        // ANCHOR: nccl_all_to_all
        self.call("ncclSend/ncclRecv alltoall group", |comm, stream| unsafe {
            result::group_start()?;
            let mut queued = Ok(result::NcclStatus::Success);
            for peer in 0..world_size {
                let at = peer as u64 * block_bytes;
                queued = queued
                    .and_then(|_| {
                        result::send((s + at) as _, count, dtype, peer as i32, comm, stream)
                    })
                    .and_then(|_| {
                        result::recv((r + at) as _, count, dtype, peer as i32, comm, stream)
                    });
            }
            let ended = result::group_end();
            queued.and(ended)
        })
        // ANCHOR_END: nccl_all_to_all
    }

    /// An all-reduce of one element: returns when every rank got here.
    pub fn barrier(&self) -> Result<()> {
        let mut token = self.upload(&[0i32])?;
        self.all_reduce(None, &mut token, ReduceOp::Sum)
    }
}

impl Drop for NcclBackend {
    fn drop(&mut self) {
        if !self.aborted.get() {
            // SAFETY: a live communicator, destroyed once. Abort, not finalize: finalize waits
            // for peers, which must never hang an exiting rank.
            let _ = unsafe { result::comm_abort(self.comm) };
        }
    }
}
