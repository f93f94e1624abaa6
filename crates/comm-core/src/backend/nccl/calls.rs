//! The calls: one rank's communicator, its GPU and stream, how every call is enqueued on that
//! stream and waited for under the watchdog, and how the communicator ends. Which NCCL function
//! each collective is lives in [`super::collectives`].

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError,
};
use cudarc::nccl::{result, sys};

use super::batch::{Batching, Wait};
use super::errors::{cuda, nccl, quietly};
use super::gpu_trace::GpuTrace;
use super::group_safe::{self, in_group, GroupSafe};
use super::id::{id_from_bytes, new_unique_id};
use super::init::init_rank;
use super::watchdog::{self, async_state, Arming, Watchdog};
use crate::collective::{Call, Collective};
use crate::dtype::Element;
use crate::error::{CommError, Result};
use crate::failure_record::end_process;
use crate::store::Scoped;

/// One rank's NCCL communicator (a blocking one: calls are enqueued on this thread), its GPU
/// and its one stream.
pub struct NcclBackend {
    pub(super) stream: Arc<CudaStream>,
    pub(super) comm: sys::ncclComm_t,
    pub(super) rank: usize,
    pub(super) world_size: usize,
    /// Whether NCCL still holds the communicator: abort and finalize free it, once, on this
    /// thread (never from another: on a blocking communicator abort frees it at once, under any
    /// call still inside NCCL).
    live: Cell<bool>,
    /// The NCCL version (ncclCommFinalize exists from 2.14).
    version: i32,
    /// Shown every call; ends the process if the rank is stuck inside NCCL past the timeout.
    pub(super) watchdog: Watchdog,
    /// Batches this communicator is in, and its calls not waited for yet.
    batching: std::cell::Cell<Batching>,
    /// The one-element buffer barriers all-reduce, made at the first.
    barrier_token: std::cell::RefCell<Option<GroupSafe<i32>>>,
    /// With `--trace`, the GPU's times of the calls, made at the first traced call.
    gpu_trace: std::cell::RefCell<Option<Box<GpuTrace>>>,
}

// SAFETY: the backend owns its `ncclComm_t` alone (no copy of the pointer outlives it but the
// watchdog's, which only aborts through its own synchronised handle), and NCCL lets a
// communicator be used from any thread as long as no two use it at once: moving the whole
// backend moves that one user. It is not `Sync` (its `Cell`s), so it is never shared. The new
// thread binds the CUDA context first ([`NcclBackend::bind_to_thread`]), as `comm_core::work`'s
// communication thread does.
unsafe impl Send for NcclBackend {}

/// How long past its timeout a rank may stay inside a blocking NCCL call before the watchdog ends
/// the process.
const STUCK_GRACE: Duration = Duration::from_secs(2);

/// How long `ncclCommAbort` may take before the watchdog ends the process: on InfiniBand it tears
/// down queue pairs and joins NCCL's proxy threads, which can take seconds.
const ABORT_ALLOWANCE: Duration = Duration::from_secs(30);

/// The abort's name, as the watchdog shows it when the abort itself is stuck.
const ABORT: &str = "ncclCommAbort, after an NCCL call failed or outlived --timeout,";

impl NcclBackend {
    /// Binds this rank to its GPU and builds the communicator through the store. `timeout` (the
    /// job's `--timeout`) bounds NCCL's init and, through the watchdog, every call.
    pub fn connect(
        scope: &Scoped,
        rank: usize,
        world_size: usize,
        ordinal: usize,
        timeout: Duration,
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
            scope.set("id", &id)?;
            id_from_bytes(&id)?
        } else {
            id_from_bytes(&scope.get("id")?)?
        };
        // Everyone has the Id and is alive before NCCL's own init starts.
        scope.barrier("init")?;
        ctx.bind_to_thread().map_err(cuda("binding the context"))?;
        let comm = init_rank(&ctx, world_size, id, rank, timeout)?;
        // ANCHOR_END: unique_id
        Self::adopt(stream, comm, rank, world_size, timeout)
    }

    /// Takes charge of `comm`, a communicator NCCL just made (by init or by a split), whose
    /// calls go on `stream`: its watchdog. On failure `comm` is aborted.
    pub(super) fn adopt(
        stream: Arc<CudaStream>,
        comm: sys::ncclComm_t,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Result<Self> {
        let version = result::get_nccl_version().unwrap_or(0);
        let watchdog = Watchdog::start(
            timeout,
            STUCK_GRACE,
            Box::new(move |what, allowed| stuck(rank, what, allowed)),
        );
        let watchdog = match watchdog {
            Ok(watchdog) => watchdog,
            Err(e) => {
                // SAFETY: the communicator just made, never used; freed once, here.
                let _ = unsafe { result::comm_abort(comm) };
                return Err(CommError::io("starting the NCCL watchdog", e));
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
            barrier_token: std::cell::RefCell::new(None),
            gpu_trace: std::cell::RefCell::new(None),
            batching: std::cell::Cell::new(Batching::default()),
        })
    }

    fn cu_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    pub(super) fn check_usable(&self) -> Result<()> {
        usable(self.live.get())
    }

    /// Waits for the work enqueued so far, until `call`'s deadline. On a blocking communicator a
    /// call returns once it is enqueued, so only the GPU is waited for (`gpu`): the rank's stream,
    /// looked at without ever sleeping ([`Self::stream_idle`]), and NCCL's asynchronous errors now
    /// and then. Past the deadline this thread aborts the communicator itself (the abort, shown
    /// to the watchdog in the call's place, is then what it watches) and fails.
    fn wait(&self, what: &str, gpu: bool, call: &Arming) -> Result<()> {
        if !gpu {
            return self.check_async(what);
        }
        let started = Instant::now();
        for look in 0u64.. {
            if self.stream_idle().map_err(cuda(what))? {
                // Every call enqueued has finished: its trace events can be read.
                if let Some(gpu_trace) = self.gpu_trace.borrow_mut().as_mut() {
                    gpu_trace.read_finished()?;
                }
                return self.check_async(what);
            }
            // NCCL's own errors (a peer's network failure) show here, not on the stream.
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

    /// Whether the rank's stream has finished everything enqueued on it: `cuStreamQuery`, as
    /// nccl-tests' `testStreamSynchronize` (`src/common.cu`) polls `cudaStreamQuery`. On an idle
    /// stream it answers at once, where an event recorded and then looked at costs a round trip
    /// to the GPU: an in-place call on one rank, say, for which NCCL enqueues nothing at all
    /// (`src/enqueue.cc`, `taskAppend`: one rank goes to `ncclLaunchOneRank`, which for any
    /// reduction but `PreMulSum` only copies, and in place has nothing to copy:
    /// `src/device/onerank.cu`). Only this rank's calls and copies go on its stream.
    fn stream_idle(&self) -> std::result::Result<bool, DriverError> {
        // SAFETY: the stream is live (`self.stream` holds it) and its context is current on this
        // thread (bound at connect, or by `bind_to_thread` after a move); cuStreamQuery only
        // reads the stream's state.
        idle(unsafe { cudarc::driver::sys::cuStreamQuery(self.stream.cu_stream()) })
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

    /// The error of a call that outlived its timeout, whose communicator this rank aborted.
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
        let wait = self.batching(|b| b.end_batch(in_group()));
        let watched = self.watchdog.arm("the calls of a batch");
        let waited = self.settle(wait, "batch", &watched);
        out.and_then(|value| waited.map(|_| value))
    }

    /// Runs `body` inside one ncclGroupStart/ncclGroupEnd: NCCL launches its calls together at
    /// the end, and they are waited for once after ncclGroupEnd (only until enqueued inside a
    /// batch, which waits at its own end). ncclGroupEnd is called whether `body` succeeded or
    /// not.
    ///
    /// Buffers dropped inside `body` are freed only after ncclGroupEnd has enqueued the
    /// group's kernels ([`group_safe`]): a kernel never reads freed memory. Groups are the
    /// thread's, as NCCL's are: inside another communicator's group, this one's end launches
    /// nothing, and its calls are waited for at its next wait ([`super::batch`]).
    pub(crate) fn group<R>(&self, body: impl FnOnce() -> Result<R>) -> Result<R> {
        self.check_usable()?;
        group_safe::group_start().map_err(nccl("ncclGroupStart"))?;
        let unwinding = AbortOnUnwind {
            backend: self,
            group: true,
        };
        let out = body();
        std::mem::forget(unwinding);
        let watched = self.watchdog.arm("a group's ncclGroupEnd and calls");
        let ended = self.group_end().and_then(enqueued);
        let wait = self.batching(|b| b.end_group(in_group()));
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

    /// Aborts the communicator, once, from this thread: NCCL stops its work and frees it. Inside
    /// an open NCCL group (this thread's, over every communicator) NCCL would only queue the abort
    /// until the outermost ncclGroupEnd, which could then launch the group's work on a freed
    /// communicator; so there the abort waits for that end ([`group_safe::Nesting`]). Either
    /// way nothing reaches the communicator after this (`live`).
    fn abort(&self) {
        if self.live.replace(false) {
            if let Some(now) = group_safe::abort(group_safe::Comm(self.comm)) {
                self.run_aborts(vec![now]);
            }
        }
    }

    /// Aborts `comms` (given by [`group_safe`] outside every group), shown to the watchdog in
    /// place of the call that failed: the rank's own thread is in charge of the abort, and only
    /// an abort stuck past [`ABORT_ALLOWANCE`] ends the process.
    fn run_aborts(&self, comms: Vec<group_safe::Comm>) {
        if comms.is_empty() {
            return;
        }
        let _watched = self.watchdog.arm_for(ABORT, ABORT_ALLOWANCE);
        for comm in comms {
            // SAFETY: group_safe hands out each communicator once, outside every group, after
            // its owner cleared `live` (nothing else reaches it): NCCL still holds it, and
            // frees it here.
            let _ = unsafe { result::comm_abort(comm.0) };
        }
    }

    /// ncclGroupEnd, then the aborts that waited for the outermost group to end.
    fn group_end(&self) -> std::result::Result<result::NcclStatus, result::NcclError> {
        let (ended, aborts) = group_safe::group_end();
        self.run_aborts(aborts);
        ended
    }

    /// Makes this rank's CUDA context current on the calling thread: the first thing a thread
    /// that the backend moved to does.
    pub fn bind_to_thread(&self) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(cuda("binding the context to the communication thread"))
    }

    /// Copies host values into a new buffer on this rank's GPU, which is never freed inside
    /// an open NCCL group. Allowed in a group: no call before it can use a buffer that did not
    /// exist. Under the watchdog (a copy can hang behind a stuck kernel). Refused once the
    /// communicator was aborted, as every call is.
    pub fn upload<T: Element>(&self, values: &[T]) -> Result<GroupSafe<T>> {
        self.check_usable()?;
        let _watched = self.watchdog.arm("a copy to the GPU");
        let slice = self
            .stream
            .clone_htod(values)
            .map_err(cuda("copying to the GPU"))?;
        Ok(GroupSafe::new(slice))
    }

    /// Copies a GPU buffer back to the host, after the work queued before it on the stream.
    /// In a batch, the calls before it are waited for first, under the watchdog; in a group,
    /// whose calls only run at its end, and after an abort, it is an error
    /// ([`before_download`]).
    pub fn download<T: Element>(&self, buf: &CudaSlice<T>) -> Result<Vec<T>> {
        let mut host = vec![T::default(); buf.len()];
        self.download_into(buf, &mut host)?;
        Ok(host)
    }

    /// [`download`](Self::download) into host memory the caller keeps (as many elements).
    pub fn download_into<T: Element>(&self, buf: &impl DevicePtr<T>, host: &mut [T]) -> Result<()> {
        let live = self.live.get();
        let wait = self.batching(|b| before_download(live, in_group(), b))?;
        let watched = self
            .watchdog
            .arm("the calls before a download, and the download");
        self.settle(wait, "the calls before a download", &watched)?;
        // Into pageable memory the copy has finished when the call returns.
        self.stream
            .memcpy_dtoh(buf, host)
            .map_err(cuda("copying from the GPU"))
    }

    /// Copies host values into an existing GPU buffer (as many elements), behind the work
    /// queued on the stream; the values may be reused as soon as it returns. Refused inside a
    /// group (of any communicator, this thread's): the copy would run before the group's calls,
    /// which are enqueued only at its end, even those called before it
    /// ([`Batching::copy_into`]); and after an abort. Under the watchdog.
    pub fn upload_into<T: Element>(
        &self,
        values: &[T],
        buf: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.check_usable()?;
        self.batching.get().copy_into(in_group())?;
        let _watched = self.watchdog.arm("a copy to the GPU");
        self.stream
            .memcpy_htod(values, buf)
            .map_err(cuda("copying to the GPU"))
    }

    /// Enqueues one NCCL call and waits for it as the batching says (outside batches and
    /// groups: until the GPU finished it).
    pub(super) fn enqueue(
        &self,
        what: &'static str,
        launch: impl FnOnce(
            sys::ncclComm_t,
            sys::cudaStream_t,
        ) -> std::result::Result<result::NcclStatus, result::NcclError>,
    ) -> Result<()> {
        self.check_usable()?;
        // Watched from before the launch: a blocking call can hang in NCCL's connection setup,
        // where only the watchdog sees it.
        let watched = self.watchdog.arm(what);
        let traced = self.trace_mark()?;
        if let Err(e) = launch(self.comm, self.cu_stream()).and_then(enqueued) {
            self.abort();
            return Err(nccl(what)(e));
        }
        if let Some(start) = traced {
            let end = self.trace_mark()?.expect("tracing, as at the start");
            let mut gpu_trace = self.gpu_trace.borrow_mut();
            gpu_trace
                .as_mut()
                .expect("made by trace_mark")
                .called(what, start, end);
        }
        let wait = self.batching(|b| b.called(in_group()));
        self.settle(wait, what, &watched)
    }

    /// With `--trace`, an event on the stream now (the first one anchors the GPU's times to the
    /// host's clock). Not inside a group (this thread's, of any communicator): its calls are
    /// only enqueued when it ends.
    fn trace_mark(&self) -> Result<Option<CudaEvent>> {
        if !crate::trace::on() || in_group() {
            return Ok(None);
        }
        let mut gpu_trace = self.gpu_trace.borrow_mut();
        if gpu_trace.is_none() {
            *gpu_trace = Some(Box::new(GpuTrace::anchored(self.stream.clone())?));
        }
        gpu_trace.as_mut().expect("made above").mark().map(Some)
    }

    /// An all-reduce of one element: returns when every rank got here. Not inside a group (this
    /// thread's, of any communicator), whose calls only run at its end.
    pub(crate) fn barrier(&self) -> Result<()> {
        if in_group() {
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
        let checked =
            Call::new(Collective::AllReduce).check(None, 1, self.rank, self.world_size)?;
        self.collective(&checked, None::<&CudaSlice<i32>>, &mut **token)
    }

    /// Timing events on this rank's stream (`events`): how a stopwatch reads the GPU's clock.
    pub(crate) fn timing_events(&self) -> super::events::Events {
        super::events::Events::on(self.stream.clone())
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
        if self.group {
            let _ = backend.group_end();
        }
        let group = self.group;
        let wait = backend.batching(|b| match group {
            true => b.end_group(in_group()),
            false => b.end_batch(in_group()),
        });
        if wait != Wait::Nothing || backend.batching(|b| b.unwaited()) > 0 {
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
        if !self.live.get() {
            return Ok(()); // aborted or finalized already
        }
        if group_safe::in_group() {
            // Dropped inside another communicator's group: NCCL would queue a finalize or
            // destroy until that group ends, as it queues an abort; an abort can wait for it.
            self.abort();
            return Ok(());
        }
        self.live.set(false);
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
                // The abort is watched as itself, not as the finalize that failed.
                let _watched = self.watchdog.arm_for(ABORT, ABORT_ALLOWANCE);
                let _ = result::comm_abort(self.comm);
            }
            ended
        }
    }
}

/// Whether a communicator may be used: not once it was aborted (NCCL freed it; what its calls
/// left in the buffers is no result).
fn usable(live: bool) -> Result<()> {
    match live {
        true => Ok(()),
        false => Err(CommError::Backend(
            "the NCCL communicator was aborted after an earlier failure".into(),
        )),
    }
}

/// Before a copy back to the host: what to wait for first. Refused after an abort, even with
/// nothing left to wait for (the buffer holds whatever the aborted calls left), and inside a
/// group, whose calls have not run.
fn before_download(live: bool, in_group: bool, batching: &mut Batching) -> Result<Wait> {
    usable(live)?;
    batching.download(in_group).ok_or_else(|| {
        CommError::Usage("to_host inside a group: the group's calls only run when it ends".into())
    })
}

/// `cuStreamQuery`'s answer as a look: everything done (`CUDA_SUCCESS`), still busy
/// (`CUDA_ERROR_NOT_READY`), or an error (an earlier launch's, a lost device).
fn idle(answer: cudarc::driver::sys::CUresult) -> std::result::Result<bool, DriverError> {
    use cudarc::driver::sys::CUresult;
    match answer {
        CUresult::CUDA_SUCCESS => Ok(true),
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        error => Err(DriverError(error)),
    }
}

/// The first NCCL with `ncclCommFinalize` (cudarc panics on a symbol the library lacks).
const FINALIZE_SINCE: i32 = 21400;

/// A call's status: `ncclInProgress` would mean a nonblocking communicator, which this backend
/// never makes (its work might not be on the stream yet when the wait looks at the stream, which
/// would then pass at once). Whatever NCCL's version does with threads, the backend relies only
/// on this: a call that returns without `ncclInProgress` has enqueued its work.
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

/// The watchdog's end of a rank still inside NCCL's `what` `STUCK_GRACE` after the `allowed`
/// time ran out (the rank's thread never came back to abort, or its abort is what hangs): only
/// the process's end frees that thread. Reports why, as a failed rank does, and exits.
fn stuck(rank: usize, what: &str, allowed: Duration) -> ! {
    let error = CommError::Timeout {
        what: format!("{what} on rank {rank} to return"),
        timeout: allowed.saturating_add(STUCK_GRACE),
        detail: " (a peer died or is stuck?): the rank's thread is still inside NCCL, which \
                 nothing but the process's end can free; the watchdog ends the process"
            .into(),
        missing: Vec::new(),
    };
    end_process(rank, &error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUresult;

    #[test]
    fn a_stream_query_is_done_busy_or_an_error() {
        assert_eq!(idle(CUresult::CUDA_SUCCESS), Ok(true));
        assert_eq!(idle(CUresult::CUDA_ERROR_NOT_READY), Ok(false));
        assert_eq!(
            idle(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS),
            Err(DriverError(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS))
        );
    }

    #[test]
    fn a_call_answering_in_progress_is_an_error_whatever_nccls_version() {
        // The only thing the wait relies on: a call that returned has enqueued its work.
        assert!(enqueued(result::NcclStatus::Success).is_ok());
        assert_eq!(
            enqueued(result::NcclStatus::InProgress).unwrap_err(),
            result::NcclError(sys::ncclResult_t::ncclInvalidUsage)
        );
    }

    #[test]
    fn a_download_after_an_abort_is_refused_though_nothing_is_pending() {
        let mut nothing_pending = Batching::default();
        let refused = before_download(false, false, &mut nothing_pending).unwrap_err();
        assert!(refused.to_string().contains("aborted"), "{refused}");
        // Also with calls unwaited, and inside a group: the abort is what is said.
        let mut pending = Batching::default();
        pending.called(true);
        let refused = before_download(false, true, &mut pending).unwrap_err();
        assert!(refused.to_string().contains("aborted"), "{refused}");
        // A live one waits for what is pending, or nothing, and refuses inside a group.
        assert_eq!(
            before_download(true, false, &mut pending).unwrap(),
            Wait::Finished { calls: 1 }
        );
        assert_eq!(
            before_download(true, false, &mut nothing_pending).unwrap(),
            Wait::Nothing
        );
        let in_group = before_download(true, true, &mut nothing_pending).unwrap_err();
        assert!(matches!(in_group, CommError::Usage(_)), "{in_group}");
    }
}
