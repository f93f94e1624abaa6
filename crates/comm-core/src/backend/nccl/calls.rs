//! The calls: one rank's communicator, its GPU and stream, and every collective enqueued on
//! that stream and waited for under the watchdog.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::{result, sys};

use super::batch::{Batching, Wait};
use super::errors::{cuda, nccl};
use super::group_safe::{GroupSafe, Groups};
use super::id::{id_from_bytes, new_unique_id};
use super::init::init_rank;
use super::probe::quietly;
use super::watchdog::{self, async_state, Arming, Watchdog};
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

/// One rank's NCCL communicator (a blocking one: calls are enqueued on this thread), its GPU
/// and its one stream.
pub struct NcclBackend {
    stream: Arc<CudaStream>,
    comm: sys::ncclComm_t,
    rank: usize,
    world_size: usize,
    /// Whether NCCL still holds the communicator: abort and finalize free it, once, on this
    /// thread (never from another: on a blocking communicator abort frees it at once, under any
    /// call still inside NCCL).
    live: Cell<bool>,
    /// The NCCL version (ncclCommFinalize exists from 2.14).
    version: i32,
    /// Shown every call; ends the process if the rank is stuck inside NCCL past the timeout.
    watchdog: Watchdog,
    /// Open groups, and the buffers dropped while one is open.
    groups: Arc<Groups>,
    /// Recorded after the calls waited for, and reused: one event, not one per wait.
    done: CudaEvent,
    /// Batches and groups this rank is in: when calls are waited for.
    batching: std::cell::Cell<Batching>,
    /// The one-element buffer barriers all-reduce, made at the first.
    barrier_token: std::cell::RefCell<Option<GroupSafe<i32>>>,
}

/// How long past its timeout a rank may stay inside a blocking NCCL call before the watchdog ends
/// the process.
const STUCK_GRACE: Duration = Duration::from_secs(2);

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
        // SAFETY: cudarc's per-buffer events order uses across streams; this rank has one stream
        // (every buffer is made, used by NCCL, copied and freed on it, in order; NCCL orders its
        // own internal streams against it), so they only cost time. Off before the stream is
        // made, so that no buffer of this context tracks them.
        unsafe { ctx.disable_event_tracking() };
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
        let comm = init_rank(&ctx, world_size, id, rank, store.timeout())?;
        // ANCHOR_END: unique_id
        let version = result::get_nccl_version().unwrap_or(0);
        let watchdog = Watchdog::start(
            store.timeout(),
            STUCK_GRACE,
            Box::new(move |what| stuck(rank, what)),
        );
        let done = ctx.new_event(None);
        let (watchdog, done) = match (watchdog, done) {
            (Ok(watchdog), Ok(done)) => (watchdog, done),
            (watchdog, done) => {
                // SAFETY: the communicator just made, never used; freed once, here.
                let _ = unsafe { result::comm_abort(comm) };
                return Err(match (watchdog, done) {
                    (Err(e), _) => CommError::io("starting the NCCL watchdog", e),
                    (_, Err(e)) => cuda("creating an event")(e),
                    _ => unreachable!("one of them failed"),
                });
            }
        };
        Ok(NcclBackend {
            stream,
            comm,
            rank,
            world_size,
            live: Cell::new(true),
            version,
            watchdog,
            groups: Arc::new(Groups::default()),
            barrier_token: std::cell::RefCell::new(None),
            done,
            batching: std::cell::Cell::new(Batching::default()),
        })
    }

    fn cu_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    fn check_usable(&self) -> Result<()> {
        if !self.live.get() {
            return Err(CommError::Backend(
                "the NCCL communicator was aborted after an earlier failure".into(),
            ));
        }
        Ok(())
    }

    /// Waits for the work enqueued so far, until `call`'s deadline. On a blocking communicator a
    /// call returns once it is enqueued, so only the GPU is waited for (`gpu`): an event recorded
    /// after the work, looked at without ever sleeping, and NCCL's asynchronous errors now and
    /// then. Past the deadline this thread aborts the communicator itself and fails.
    fn wait(&self, what: &str, gpu: bool, call: &Arming) -> Result<()> {
        if !gpu {
            return self.check_async(what);
        }
        self.done
            .record(&self.stream)
            .map_err(cuda("recording an event"))?;
        let started = Instant::now();
        for look in 0u64.. {
            if self.done.try_is_complete().map_err(cuda(what))? {
                return self.check_async(what);
            }
            // NCCL's own errors (a peer's network failure) show here, not in the event.
            if look % 1024 == 1023 {
                self.check_async(what)?;
            }
            if call.expired() {
                self.abort();
                return Err(self.timed_out(what));
            }
            watchdog::take(watchdog::pause(started.elapsed()));
        }
        unreachable!("the loop returns")
    }

    /// NCCL's asynchronous error, if any: the communicator is aborted and the error returned.
    fn check_async(&self, what: &str) -> Result<()> {
        self.check_usable()?;
        match async_state(self.comm) {
            Ok(_) => Ok(()),
            Err(e) => {
                self.abort();
                Err(nccl(what)(e))
            }
        }
    }

    /// The error of a call the watchdog gave up on.
    fn timed_out(&self, what: &str) -> CommError {
        CommError::Timeout {
            what: format!("NCCL {what} on rank {} to complete", self.rank),
            timeout: self.watchdog.timeout(),
            detail: " (a peer died or is stuck?); the communicator was aborted".into(),
            missing: Vec::new(),
        }
    }

    /// Waits as the batching says, until `call`'s deadline: `what` names the call, or the
    /// batch or group.
    fn settle(&self, wait: Wait, what: &str, call: &Arming) -> Result<()> {
        match wait {
            Wait::Nothing => Ok(()),
            // An aborted communicator is gone (no look at it is allowed), and so is its work.
            _ if !self.live.get() => self.check_usable(),
            Wait::Enqueued => self.wait(what, false, call),
            Wait::Finished { calls: 1 } => self.wait(what, true, call),
            Wait::Finished { calls } => self.wait(&format!("{what} ({calls} calls)"), true, call),
        }
    }

    /// Updates the batching state and returns what `step` says.
    fn batching<R>(&self, step: impl FnOnce(&mut Batching) -> R) -> R {
        let mut batching = self.batching.get();
        let out = step(&mut batching);
        self.batching.set(batching);
        out
    }

    /// Runs `body` with its calls enqueued and not waited for one by one; the outermost batch
    /// waits once, under the watchdog, for all of them when it ends, whether `body` succeeded
    /// or not (a panic in `body` aborts the communicator instead, if calls were left unwaited).
    pub(crate) fn batch<R>(&self, body: impl FnOnce() -> Result<R>) -> Result<R> {
        self.batching(Batching::begin_batch);
        let unwinding = AbortOnUnwind {
            backend: self,
            group: false,
        };
        let out = body();
        std::mem::forget(unwinding);
        let wait = self.batching(Batching::end_batch);
        let watched = self.watchdog.arm("batch");
        let waited = self.settle(wait, "batch", &watched);
        out.and_then(|value| waited.map(|_| value))
    }

    /// Runs `body` inside one ncclGroupStart/ncclGroupEnd: NCCL launches its calls together at
    /// the end, and they are waited for once after ncclGroupEnd (only until enqueued inside a
    /// batch, which waits at its own end). ncclGroupEnd is called whether `body` succeeded or
    /// not.
    ///
    /// Buffers dropped inside `body` are freed only after ncclGroupEnd has enqueued the
    /// group's kernels ([`group_safe`]): a kernel never reads freed memory.
    pub(crate) fn group<R>(&self, body: impl FnOnce() -> Result<R>) -> Result<R> {
        self.check_usable()?;
        result::group_start().map_err(nccl("ncclGroupStart"))?;
        self.groups.open();
        self.batching(Batching::begin_group);
        let unwinding = AbortOnUnwind {
            backend: self,
            group: true,
        };
        let out = body();
        std::mem::forget(unwinding);
        let wait = self.batching(Batching::end_group);
        let watched = self.watchdog.arm("group");
        let ended = result::group_end().and_then(enqueued);
        self.groups.close();
        let waited = match ended {
            Ok(()) => self.settle(wait, "group", &watched),
            Err(e) => {
                // Some of the group's calls may be in flight and nobody will watch them.
                self.abort();
                Err(nccl("ncclGroupEnd")(e))
            }
        };
        out.and_then(|value| waited.map(|_| value))
    }

    /// Aborts the communicator, once, from this thread: NCCL stops its work and frees it.
    fn abort(&self) {
        if self.live.replace(false) {
            // SAFETY: a communicator NCCL still holds (`live`), freed once; `live` keeps every
            // later call away from it (check_usable).
            let _ = unsafe { result::comm_abort(self.comm) };
        }
    }

    /// Copies host values into a new buffer on this rank's GPU, which is never freed inside
    /// an open group of this communicator.
    pub fn upload<T: Element>(&self, values: &[T]) -> Result<GroupSafe<T>> {
        let slice = self
            .stream
            .clone_htod(values)
            .map_err(cuda("copying to the GPU"))?;
        Ok(GroupSafe::new(slice, self.groups.clone()))
    }

    /// Copies a GPU buffer back to the host, after the work queued before it on the stream.
    /// In a batch, the calls before it are waited for first, under the watchdog; in a group,
    /// whose calls only run at its end, it is an error.
    pub fn download<T: Element>(&self, buf: &CudaSlice<T>) -> Result<Vec<T>> {
        let wait = self.batching(Batching::download).ok_or_else(|| {
            CommError::Usage(
                "to_host inside a group: the group's calls only run when it ends".into(),
            )
        })?;
        let watched = self.watchdog.arm("the calls before a download");
        self.settle(wait, "the calls before a download", &watched)?;
        self.stream
            .clone_dtoh(buf)
            .map_err(cuda("copying from the GPU"))
    }

    /// Enqueues one NCCL call and waits for it as the batching says (outside batches and
    /// groups: until the GPU finished it).
    fn enqueue(
        &self,
        what: &str,
        launch: impl FnOnce(
            sys::ncclComm_t,
            sys::cudaStream_t,
        ) -> std::result::Result<result::NcclStatus, result::NcclError>,
    ) -> Result<()> {
        self.check_usable()?;
        // Watched from before the launch: a blocking call can hang in NCCL's connection setup,
        // where only the watchdog sees it.
        let watched = self.watchdog.arm(what);
        if let Err(e) = launch(self.comm, self.cu_stream()).and_then(enqueued) {
            self.abort();
            return Err(nccl(what)(e));
        }
        let wait = self.batching(Batching::called);
        self.settle(wait, what, &watched)
    }

    /// The one way a collective reaches NCCL: checks the buffers' lengths against `count` and
    /// the world size ([`check_lengths`]), takes their device pointers and enqueues `call`.
    fn collective<T: Element>(
        &self,
        call: Call,
        send: Option<&CudaSlice<T>>,
        recv: Option<&mut CudaSlice<T>>,
        count: usize,
    ) -> Result<()> {
        let send_len = send.map(|b| b.len());
        let recv_len = recv.as_ref().map(|b| b.len());
        check_lengths(call, send_len, recv_len, count, self.world_size)?;
        let recv_count = recv_len.unwrap_or(0);
        let dtype = data_type(T::DTYPE);
        let block_bytes = (count * std::mem::size_of::<T>()) as u64;
        // The guards borrow the buffers (so they cannot be freed) until they drop at the end of
        // this function, after the call is enqueued; dropping, they tell cudarc the buffers were
        // used on this stream.
        let (r, _r) = recv.map(|b| b.device_ptr_mut(&self.stream)).unzip();
        let (s, _s) = send.map(|b| b.device_ptr(&self.stream)).unzip();
        let (s, r) = places(call, s, r, block_bytes, self.rank);
        // SAFETY: check_lengths passed, so for this `call` every buffer NCCL touches is present
        // and holds what NCCL reads or writes through it: `count` elements (broadcast, all_reduce,
        // reduce, send, recv, all_gather's send, reduce_scatter's recv), `recv_count` (send_recv's
        // recv) or world_size × `count` (all_gather's recv, reduce_scatter's and all_to_all's
        // buffers), and `places` offsets in-place pointers by at most (world_size - 1) blocks
        // (rank < world_size). The pointers are device pointers of live buffers on this rank's
        // GPU, kept alive by `_s`/`_r` until the call is enqueued; `dtype` is T's; `comm` is live
        // (enqueue checks it was not aborted); every group started here is ended.
        self.enqueue(call.name(), |comm, stream| unsafe {
            match call {
                Call::Broadcast { root } => {
                    result::broadcast(s as _, r as _, count, dtype, root as i32, comm, stream)
                }
                Call::AllReduce { op } => {
                    result::all_reduce(s as _, r as _, count, dtype, red_op(op), comm, stream)
                }
                Call::Reduce { op, root } => result::reduce(
                    s as _,
                    r as _,
                    count,
                    dtype,
                    red_op(op),
                    root as i32,
                    comm,
                    stream,
                ),
                Call::AllGather => result::all_gather(s as _, r as _, count, dtype, comm, stream),
                Call::ReduceScatter { op } => {
                    result::reduce_scatter(s as _, r as _, count, dtype, red_op(op), comm, stream)
                }
                Call::Send { peer } => {
                    result::send(s as _, count, dtype, peer as i32, comm, stream)
                }
                Call::Recv { peer } => {
                    result::recv(r as _, count, dtype, peer as i32, comm, stream)
                }
                Call::SendRecv { to, from } => {
                    result::group_start()?;
                    let queued = result::send(s as _, count, dtype, to as i32, comm, stream)
                        .and_then(|_| {
                            result::recv(r as _, recv_count, dtype, from as i32, comm, stream)
                        });
                    let ended = result::group_end();
                    queued.and(ended)
                }
                Call::AllToAll { world_size } => {
                    // ANCHOR: nccl_all_to_all
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
                    // ANCHOR_END: nccl_all_to_all
                }
            }
        })
    }

    /// Every rank's `recv` gets the root's `send` (or, with no `send`, the root's `recv`).
    pub(crate) fn broadcast<T: Element>(
        &self,
        send: Option<&CudaSlice<T>>,
        recv: &mut CudaSlice<T>,
        root: usize,
    ) -> Result<()> {
        let count = recv.len();
        self.collective(Call::Broadcast { root }, send, Some(recv), count)
    }

    /// Every rank's `recv` gets the reduction of all ranks' `send` (in place: of their `recv`).
    pub(crate) fn all_reduce<T: Element>(
        &self,
        send: Option<&CudaSlice<T>>,
        recv: &mut CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<()> {
        let count = recv.len();
        self.collective(Call::AllReduce { op }, send, Some(recv), count)
    }

    /// As [`all_reduce`](Self::all_reduce), but only the root's `recv` gets the result.
    pub(crate) fn reduce<T: Element>(
        &self,
        send: Option<&CudaSlice<T>>,
        recv: &mut CudaSlice<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let count = recv.len();
        self.collective(Call::Reduce { op, root }, send, Some(recv), count)
    }

    /// `recv` holds world_size blocks of `count`; in place, `send` is this rank's block of it.
    pub(crate) fn all_gather<T: Element>(
        &self,
        send: Option<&CudaSlice<T>>,
        recv: &mut CudaSlice<T>,
        count: usize,
    ) -> Result<()> {
        self.collective(Call::AllGather, send, Some(recv), count)
    }

    /// `send` holds world_size blocks of `count`; in place, the result lands in this rank's block.
    pub(crate) fn reduce_scatter<T: Element>(
        &self,
        send: Option<&CudaSlice<T>>,
        recv: &mut CudaSlice<T>,
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(Call::ReduceScatter { op }, send, Some(recv), count)
    }

    /// Sends `buf` to `peer`, which must receive as many elements.
    pub(crate) fn send<T: Element>(&self, buf: &CudaSlice<T>, peer: usize) -> Result<()> {
        self.collective(Call::Send { peer }, Some(buf), None, buf.len())
    }

    /// Receives `buf.len()` elements from `peer`.
    pub(crate) fn recv<T: Element>(&self, buf: &mut CudaSlice<T>, peer: usize) -> Result<()> {
        let count = buf.len();
        self.collective(Call::Recv { peer }, None, Some(buf), count)
    }

    /// Both calls in one NCCL group: NCCL runs them together, so every rank may send first.
    pub(crate) fn send_recv<T: Element>(
        &self,
        send: &CudaSlice<T>,
        to: usize,
        recv: &mut CudaSlice<T>,
        from: usize,
    ) -> Result<()> {
        let call = Call::SendRecv { to, from };
        self.collective(call, Some(send), Some(recv), send.len())
    }

    /// `send` and `recv` hold world_size blocks of `count`: one group with a send of block `j` to
    /// rank `j` and a receive of block `j` from rank `j` for every rank, as nccl-tests' alltoall
    /// (NCCL runs the whole group at once, so no rank waits for another's turn).
    pub(crate) fn all_to_all<T: Element>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        count: usize,
        world_size: usize,
    ) -> Result<()> {
        if world_size != self.world_size {
            return Err(CommError::Usage(format!(
                "alltoall over {world_size} ranks on a communicator of {}",
                self.world_size
            )));
        }
        let call = Call::AllToAll { world_size };
        self.collective(call, Some(send), Some(recv), count)
    }

    /// An all-reduce of one element: returns when every rank got here. Not inside a group,
    /// whose calls only run at its end.
    pub(crate) fn barrier(&self) -> Result<()> {
        if self.groups.is_open() {
            return Err(CommError::Usage(
                "barrier inside a group: the group's calls only run when it ends".into(),
            ));
        }
        // One token for every barrier: no allocation (and no free) per call.
        let mut token = self.barrier_token.borrow_mut();
        if token.is_none() {
            *token = Some(self.upload(&[0i32])?);
        }
        let token = token.as_mut().expect("made above");
        self.all_reduce(None, token, ReduceOp::Sum)
    }

    /// Timing events on this rank's stream (`events`): how a stopwatch reads the GPU's clock.
    pub(crate) fn timing_events(&self) -> super::events::Events {
        super::events::Events::on(self.stream.clone())
    }
}

/// One NCCL call, with what it takes besides the buffers and the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Broadcast { root: usize },
    AllReduce { op: ReduceOp },
    Reduce { op: ReduceOp, root: usize },
    AllGather,
    ReduceScatter { op: ReduceOp },
    Send { peer: usize },
    Recv { peer: usize },
    SendRecv { to: usize, from: usize },
    AllToAll { world_size: usize },
}

impl Call {
    /// NCCL's name for it, as errors and the watchdog say it.
    fn name(self) -> &'static str {
        match self {
            Call::Broadcast { .. } => "ncclBroadcast",
            Call::AllReduce { .. } => "ncclAllReduce",
            Call::Reduce { .. } => "ncclReduce",
            Call::AllGather => "ncclAllGather",
            Call::ReduceScatter { .. } => "ncclReduceScatter",
            Call::Send { .. } => "ncclSend",
            Call::Recv { .. } => "ncclRecv",
            Call::SendRecv { .. } => "ncclSend/ncclRecv group",
            Call::AllToAll { .. } => "ncclSend/ncclRecv alltoall group",
        }
    }
}

/// What one side (send or recv) of a call must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// No buffer on this side.
    Absent,
    /// Maybe a buffer (none: in place); if there is one, of this length.
    InPlaceOr(usize),
    /// A buffer of this length.
    Exactly(usize),
    /// A buffer of any length (its own count).
    Any,
}

/// The rule that makes every NCCL call sound: the buffers hold exactly what NCCL reads and
/// writes through them for `call` with `count` on `world_size` ranks. `send`/`recv` are the
/// buffers' lengths, `None` where there is none (in place, or a one-sided call). Pure, so it is
/// tested without a GPU; the calls run it right before their unsafe block.
fn check_lengths(
    call: Call,
    send: Option<usize>,
    recv: Option<usize>,
    count: usize,
    world_size: usize,
) -> Result<()> {
    let name = call.name();
    let blocks = count.checked_mul(world_size).ok_or_else(|| {
        CommError::Usage(format!(
            "{name}: count {count} × world size {world_size} overflows"
        ))
    })?;
    let (send_rule, recv_rule) = match call {
        Call::Broadcast { .. } | Call::AllReduce { .. } | Call::Reduce { .. } => {
            (Side::InPlaceOr(count), Side::Exactly(count))
        }
        Call::AllGather => (Side::InPlaceOr(count), Side::Exactly(blocks)),
        Call::ReduceScatter { .. } if send.is_some() => {
            (Side::Exactly(blocks), Side::Exactly(count))
        }
        Call::ReduceScatter { .. } => (Side::InPlaceOr(count), Side::Exactly(blocks)),
        Call::Send { .. } => (Side::Exactly(count), Side::Absent),
        Call::Recv { .. } => (Side::Absent, Side::Exactly(count)),
        Call::SendRecv { .. } => (Side::Exactly(count), Side::Any),
        Call::AllToAll { world_size: ranks } if ranks != world_size => {
            return Err(CommError::Usage(format!(
                "{name}: over {ranks} ranks on a communicator of {world_size}"
            )))
        }
        Call::AllToAll { .. } => (Side::Exactly(blocks), Side::Exactly(blocks)),
    };
    for (side, rule, len) in [("send", send_rule, send), ("recv", recv_rule, recv)] {
        let wrong = match (rule, len) {
            (Side::Absent, None) | (Side::InPlaceOr(_), None) | (Side::Any, Some(_)) => continue,
            (Side::Absent, Some(len)) => format!("takes no {side} buffer but got {len} elements"),
            (Side::Exactly(_) | Side::Any, None) => format!("needs a {side} buffer"),
            (Side::InPlaceOr(want) | Side::Exactly(want), Some(len)) if len == want => continue,
            (Side::InPlaceOr(want) | Side::Exactly(want), Some(len)) => format!(
                "{side} has {len} elements but must have {want} (count {count}, world size \
                 {world_size})"
            ),
        };
        return Err(CommError::Usage(format!("{name}: {wrong}")));
    }
    Ok(())
}

/// The device pointers NCCL gets for `call`, from the buffers' (absent ones: 0, which
/// [`check_lengths`] ensures is never passed). In place, NCCL's convention: all_gather reads
/// this rank's block of `recv`; reduce_scatter reduces all of `recv` into this rank's block;
/// the others read and write `recv`.
fn places(
    call: Call,
    send: Option<u64>,
    recv: Option<u64>,
    block_bytes: u64,
    rank: usize,
) -> (u64, u64) {
    let r = recv.unwrap_or(0);
    let mine = r + rank as u64 * block_bytes;
    match (call, send) {
        (_, Some(s)) => (s, r),
        (Call::AllGather, None) => (mine, r),
        (Call::ReduceScatter { .. }, None) => (r, mine),
        (_, None) => (r, r),
    }
}

/// Ends a batch or group when its body panics (closing NCCL's group too, so later calls are
/// not swallowed by it), and aborts the communicator if that leaves calls enqueued that nobody
/// will wait for.
struct AbortOnUnwind<'a> {
    backend: &'a NcclBackend,
    group: bool,
}

impl Drop for AbortOnUnwind<'_> {
    fn drop(&mut self) {
        let backend = self.backend;
        let end = if self.group {
            let _ = result::group_end();
            backend.groups.close();
            Batching::end_group
        } else {
            Batching::end_batch
        };
        if backend.batching(end) != Wait::Nothing || backend.batching(|b| b.unwaited()) > 0 {
            backend.abort();
        }
    }
}

impl NcclBackend {
    /// Ends the communicator as NCCL means it to end: every rank reaches a device barrier (no
    /// peer still sends to this one), `ncclCommFinalize` flushes this rank's operations (its last
    /// sends across InfiniBand included), `ncclCommDestroy` frees it. Under the watchdog: past
    /// the timeout the communicator is aborted instead.
    pub(crate) fn close(&self) -> Result<()> {
        self.check_usable()?;
        self.barrier()?;
        self.finalize()
    }

    /// `ncclCommFinalize` (NCCL 2.14 and later) then `ncclCommDestroy`, or an abort if either
    /// fails. Once: afterwards nothing may use the communicator. A finalize stuck on a dead peer
    /// is the watchdog's: the process ends.
    fn finalize(&self) -> Result<()> {
        if !self.live.replace(false) {
            return Ok(()); // aborted or finalized already
        }
        let _watched = self.watchdog.arm("ncclCommFinalize");
        // SAFETY: a communicator NCCL still held (`live` was set; cleared above, so nothing
        // else reaches it), finalized and destroyed once, or aborted once if that fails. On a
        // blocking communicator finalize returns once this rank's operations are flushed.
        unsafe {
            let finalized = match self.version >= FINALIZE_SINCE {
                true => result::comm_finalize(self.comm)
                    .and_then(enqueued)
                    .map_err(nccl("ncclCommFinalize")),
                false => Ok(()),
            };
            let ended = finalized.and_then(|()| {
                result::comm_destroy(self.comm)
                    .and_then(enqueued)
                    .map_err(nccl("ncclCommDestroy"))
            });
            if ended.is_err() {
                let _ = result::comm_abort(self.comm);
            }
            ended
        }
    }
}

/// The first NCCL with `ncclCommFinalize` (cudarc panics on a symbol the library lacks).
const FINALIZE_SINCE: i32 = 21400;

/// A call's status: `ncclInProgress` would mean a nonblocking communicator, which this backend
/// never makes (its work would not be enqueued yet when the wait's event is recorded).
fn enqueued(status: result::NcclStatus) -> std::result::Result<(), result::NcclError> {
    match status {
        result::NcclStatus::InProgress => {
            Err(result::NcclError(sys::ncclResult_t::ncclInvalidUsage))
        }
        _ => Ok(()),
    }
}

impl Drop for NcclBackend {
    /// Without [`NcclBackend::close`] (an error ended the rank's work, or the program did not
    /// close): no barrier, which could wait on a peer that failed; finalize and destroy, or
    /// abort, under the watchdog.
    fn drop(&mut self) {
        if let Err(e) = self.finalize() {
            eprintln!("warning: rank {}: NCCL teardown: {e}", self.rank);
        }
    }
}

/// A rank still inside NCCL `STUCK_GRACE` after the watchdog aborted its communicator: only the
/// process's end frees it. Reports why, as a failed rank does, and exits.
fn stuck(rank: usize, what: &str) {
    let error = CommError::Timeout {
        what: format!("{what} on rank {rank}"),
        timeout: STUCK_GRACE,
        detail: " after the watchdog aborted the communicator (a peer died or is stuck?); \
                 the rank is still inside NCCL and the process ends"
            .into(),
        missing: Vec::new(),
    };
    let code = crate::failure_record::report_failure(rank, &error);
    // SAFETY: _exit has no preconditions. Not exit(): its handlers (CUDA's among them) would run
    // while the rank's thread is still inside NCCL and CUDA.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(result: Result<()>) -> String {
        match result {
            Err(CommError::Usage(text)) => text,
            other => panic!("not a usage error: {other:?}"),
        }
    }

    const SUM: ReduceOp = ReduceOp::Sum;

    #[test]
    fn same_length_calls_want_count_on_both_sides() {
        for call in [
            Call::Broadcast { root: 0 },
            Call::AllReduce { op: SUM },
            Call::Reduce { op: SUM, root: 1 },
        ] {
            check_lengths(call, Some(5), Some(5), 5, 4).unwrap();
            check_lengths(call, None, Some(5), 5, 4).unwrap();
            let err = usage(check_lengths(call, Some(3), Some(5), 5, 4));
            assert!(
                err.contains(call.name()) && err.contains("send has 3 elements but must have 5"),
                "{err}"
            );
            usage(check_lengths(call, Some(5), Some(4), 5, 4));
            usage(check_lengths(call, Some(5), None, 5, 4));
        }
    }

    #[test]
    fn all_gather_wants_count_in_and_world_size_blocks_out() {
        check_lengths(Call::AllGather, Some(2), Some(8), 2, 4).unwrap();
        check_lengths(Call::AllGather, None, Some(8), 2, 4).unwrap();
        let err = usage(check_lengths(Call::AllGather, Some(2), Some(6), 2, 4));
        assert!(
            err.contains(
                "ncclAllGather: recv has 6 elements but must have 8 (count 2, world size 4)"
            ),
            "{err}"
        );
        usage(check_lengths(Call::AllGather, Some(3), Some(8), 2, 4));
    }

    #[test]
    fn reduce_scatter_wants_world_size_blocks_in_and_count_out() {
        let call = Call::ReduceScatter { op: SUM };
        check_lengths(call, Some(8), Some(2), 2, 4).unwrap();
        check_lengths(call, None, Some(8), 2, 4).unwrap();
        let err = usage(check_lengths(call, Some(6), Some(2), 2, 4));
        assert!(
            err.contains("ncclReduceScatter: send has 6 elements but must have 8"),
            "{err}"
        );
        usage(check_lengths(call, Some(8), Some(8), 2, 4));
        usage(check_lengths(call, None, Some(2), 2, 4));
    }

    #[test]
    fn all_to_all_wants_world_size_blocks_on_both_sides() {
        let call = Call::AllToAll { world_size: 3 };
        check_lengths(call, Some(6), Some(6), 2, 3).unwrap();
        usage(check_lengths(call, Some(6), Some(4), 2, 3));
        usage(check_lengths(call, Some(4), Some(6), 2, 3));
        let err = usage(check_lengths(call, None, Some(6), 2, 3));
        assert!(err.contains("needs a send buffer"), "{err}");
        let err = usage(check_lengths(call, Some(6), Some(6), 2, 2));
        assert!(err.contains("over 3 ranks on a communicator of 2"), "{err}");
    }

    #[test]
    fn point_to_point_calls_have_one_side_or_their_own_counts() {
        check_lengths(Call::Send { peer: 1 }, Some(7), None, 7, 2).unwrap();
        check_lengths(Call::Recv { peer: 1 }, None, Some(7), 7, 2).unwrap();
        usage(check_lengths(Call::Send { peer: 1 }, Some(7), None, 8, 2));
        usage(check_lengths(
            Call::Recv { peer: 1 },
            Some(7),
            Some(7),
            7,
            2,
        ));
        let call = Call::SendRecv { to: 1, from: 0 };
        check_lengths(call, Some(7), Some(3), 7, 2).unwrap();
        usage(check_lengths(call, Some(7), None, 7, 2));
    }

    #[test]
    fn a_count_that_overflows_is_refused() {
        let err = usage(check_lengths(
            Call::AllGather,
            Some(1),
            Some(1),
            usize::MAX,
            2,
        ));
        assert!(err.contains("overflows"), "{err}");
    }

    #[test]
    fn in_place_pointers_follow_nccls_convention() {
        let (recv, send, block) = (Some(0x1000), Some(0x9000), 0x10);
        assert_eq!(
            places(Call::AllGather, None, recv, block, 2),
            (0x1020, 0x1000)
        );
        assert_eq!(
            places(Call::ReduceScatter { op: SUM }, None, recv, block, 2),
            (0x1000, 0x1020)
        );
        assert_eq!(
            places(Call::AllReduce { op: SUM }, None, recv, block, 2),
            (0x1000, 0x1000)
        );
        assert_eq!(
            places(Call::AllGather, send, recv, block, 2),
            (0x9000, 0x1000)
        );
        assert_eq!(
            places(Call::Send { peer: 1 }, send, None, block, 0),
            (0x9000, 0)
        );
    }
}
