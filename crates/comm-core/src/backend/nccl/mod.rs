//! The NCCL backend: real GPUs through cudarc (loaded at run time, so the workspace builds and
//! runs where there is no CUDA). One rank per GPU, `cuda:{local_rank % gpus}`.
//!
//! How a communicator comes up, as in PyTorch: rank 0 asks NCCL for a unique Id (128 bytes),
//! publishes it through the rendezvous store, the others wait for it there, and every rank calls
//! `ncclCommInitRank(world_size, id, rank)`. From then on NCCL talks GPU to GPU by itself (NVLink,
//! PCIe, InfiniBand or TCP sockets; `NCCL_DEBUG=INFO` shows which).
//!
//! Every collective is enqueued on the rank's stream and then waited for. While waiting, a
//! watchdog (like PyTorch's) polls NCCL for asynchronous errors and aborts the communicator when
//! the call outlives the timeout, e.g. because a peer died: an error, never a hang.

mod device;
pub mod library;

pub use device::{
    bus_id, check_one_gpu_per_rank, device_for, hostname, shared_gpu, GpuSeat, SharedGpu,
};

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError};
use cudarc::nccl::{result, sys};

use crate::dtype::{DType, Element, ReduceOp};
use crate::error::{CommError, Result};
use crate::store::Store;

/// What this machine offers NCCL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// NCCL can run.
    Ready {
        /// GPUs visible to this process.
        gpus: usize,
        /// libnccl's version, `major.minor.patch`.
        version: String,
    },
    /// NCCL cannot run here; the text says why.
    Unavailable(String),
    /// Only `libnccl.so.2` was found: restart with a `libnccl.so` link to it.
    Relink(PathBuf),
}

/// Runs `f`, turning a panic (cudarc's answer to a missing library) into an error message.
fn quietly<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    outcome.map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown failure".into())
    })
}

/// What the probe asks of the machine, one question at a time (so later ones are only asked
/// when earlier ones pass: no driver, no device query).
pub trait Machine {
    /// Whether a CUDA driver library loads.
    fn has_driver(&self) -> bool;
    /// GPUs CUDA sees, or why it cannot look.
    fn gpu_count(&self) -> std::result::Result<usize, String>;
    /// Whether libnccl loads under the name cudarc uses, `libnccl.so`.
    fn nccl_loadable(&self) -> bool;
    /// Why libnccl does not load (asked only when it does not).
    fn nccl_load_error(&self) -> String;
    /// Whether this process is already the restart with a `libnccl.so` link.
    fn relinked(&self) -> bool;
    /// A `libnccl.so.2` to link to, if there is one (see [`library::find`]).
    fn find_libnccl_so2(&self) -> Option<PathBuf>;
    /// libnccl's version as `major.minor.patch`, or why it could not be asked.
    fn nccl_version(&self) -> std::result::Result<String, String>;
}

/// This machine, through cudarc, with every call that could panic caught.
pub struct ThisMachine<F: Fn(&str) -> Option<String>>(pub F);

impl<F: Fn(&str) -> Option<String>> Machine for ThisMachine<F> {
    fn has_driver(&self) -> bool {
        // SAFETY: tries to dlopen the driver's candidate names and closes what it opened.
        unsafe { cudarc::driver::sys::is_culib_present() }
    }
    fn gpu_count(&self) -> std::result::Result<usize, String> {
        match quietly(CudaContext::device_count) {
            Err(panic) => Err(format!("the CUDA driver did not load: {panic}")),
            Ok(Err(e)) => Err(format!("CUDA sees no usable GPU: {}", driver_error(&e))),
            Ok(Ok(n)) => Ok(n.max(0) as usize),
        }
    }
    fn nccl_loadable(&self) -> bool {
        library::loadable()
    }
    fn nccl_load_error(&self) -> String {
        library::load_error()
    }
    fn relinked(&self) -> bool {
        library::relinked(&self.0)
    }
    fn find_libnccl_so2(&self) -> Option<PathBuf> {
        library::find(&self.0)
    }
    fn nccl_version(&self) -> std::result::Result<String, String> {
        match quietly(result::get_nccl_version) {
            Ok(Ok(v)) => Ok(format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)),
            Ok(Err(e)) => Err(format!(
                "libnccl loaded but {}",
                nccl_error("ncclGetVersion", e)
            )),
            Err(panic) => Err(format!("libnccl did not load: {panic}")),
        }
    }
}

/// Decides, without ever panicking, whether NCCL can run: a CUDA driver, a visible GPU, libnccl.
pub fn probe(machine: &impl Machine) -> Probe {
    if !machine.has_driver() {
        return Probe::Unavailable("no CUDA driver found".into());
    }
    let gpus = match machine.gpu_count() {
        Err(reason) => return Probe::Unavailable(reason),
        Ok(0) => {
            return Probe::Unavailable("no GPU visible (is CUDA_VISIBLE_DEVICES empty?)".into())
        }
        Ok(n) => n,
    };
    if !machine.nccl_loadable() {
        if machine.relinked() {
            return Probe::Unavailable(format!(
                "libnccl.so.2 was linked as libnccl.so but still does not load ({}); check that \
                 NCCL_LIBRARY or the install points at a real libnccl.so.2 for this CUDA driver",
                machine.nccl_load_error()
            ));
        }
        return match machine.find_libnccl_so2() {
            Some(path) => Probe::Relink(path),
            None => Probe::Unavailable(format!("no libnccl found; {}", library::INSTALL_HINT)),
        };
    }
    match machine.nccl_version() {
        Ok(version) => Probe::Ready { gpus, version },
        Err(reason) => Probe::Unavailable(reason),
    }
}

/// The unique Id as the bytes the store carries, and back.
pub fn id_to_bytes(id: &sys::ncclUniqueId) -> Vec<u8> {
    id.internal.iter().map(|&c| c as u8).collect()
}

/// The Id back from the store's bytes; anything but 128 bytes is a [`CommError::Peer`].
pub fn id_from_bytes(bytes: &[u8]) -> Result<sys::ncclUniqueId> {
    let internal: [u8; 128] = bytes.try_into().map_err(|_| {
        CommError::Peer(format!(
            "the NCCL unique Id in the store has {} bytes, not 128",
            bytes.len()
        ))
    })?;
    Ok(sys::ncclUniqueId {
        internal: internal.map(|b| b as std::ffi::c_char),
    })
}

/// A fresh unique Id from NCCL, as bytes. Needs libnccl but no GPU: rank 0 opens its bootstrap
/// socket here, and the Id carries that socket's address to the other ranks.
pub fn new_unique_id() -> Result<Vec<u8>> {
    let id = quietly(result::get_uniqueid)
        .map_err(|p| CommError::Backend(format!("libnccl did not load: {p}")))?
        .map_err(nccl("ncclGetUniqueId"))?;
    Ok(id_to_bytes(&id))
}

/// The address inside a unique Id: where rank 0's bootstrap root listens (NCCL's
/// `ncclBootstrapHandle`: an 8-byte magic, then a sockaddr). Every rank must reach it, which is
/// why NCCL_SOCKET_IFNAME matters on a cluster. `None` if the Id holds no IPv4/IPv6 address.
pub fn bootstrap_address(id: &[u8]) -> Option<std::net::SocketAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
    let addr = id.get(8..36)?;
    let family = u16::from_ne_bytes([addr[0], addr[1]]);
    let port = u16::from_be_bytes([addr[2], addr[3]]);
    match family as i32 {
        libc::AF_INET => {
            let ip: [u8; 4] = addr[4..8].try_into().ok()?;
            Some(SocketAddr::from((Ipv4Addr::from(ip), port)))
        }
        libc::AF_INET6 => {
            let ip: [u8; 16] = addr[8..24].try_into().ok()?;
            Some(SocketAddr::from((Ipv6Addr::from(ip), port)))
        }
        _ => None,
    }
}

fn driver_error(e: &DriverError) -> String {
    format!("{e:?}")
}

/// An NCCL error by name, with its text and the usual hint.
pub fn nccl_error(what: &str, e: result::NcclError) -> String {
    // SAFETY: ncclGetErrorString returns a static string for any result code.
    let text = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(e.0)) };
    format!(
        "{what} failed: {:?}: {} (run with NCCL_DEBUG=INFO for details)",
        e.0,
        text.to_string_lossy()
    )
}

fn cuda(what: &str) -> impl Fn(DriverError) -> CommError + '_ {
    move |e| CommError::Backend(format!("CUDA {what} failed: {}", driver_error(&e)))
}

fn nccl(what: &str) -> impl Fn(result::NcclError) -> CommError + '_ {
    move |e| CommError::Backend(nccl_error(what, e))
}

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

/// What one look at an NCCL call in flight finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    Busy,
    Done,
}

/// The communicator's progress as NCCL reports it: busy (`ncclInProgress`), done, or an error.
fn async_state(comm: sys::ncclComm_t) -> std::result::Result<Look, result::NcclError> {
    let mut state = sys::ncclResult_t::ncclSuccess;
    // SAFETY: comm is a live communicator; state is a valid out-pointer.
    unsafe { sys::ncclCommGetAsyncError(comm, &mut state) }.result()?;
    match state.result()? {
        result::NcclStatus::InProgress => Ok(Look::Busy),
        _ => Ok(Look::Done),
    }
}

/// The watchdog, as in PyTorch: looks at a call until it is done, fails, or outlives `timeout`.
/// On failure or timeout `abort` runs first, so no rank is left inside NCCL, then the error
/// says what was waited for.
fn watch(
    what: &str,
    detail: &str,
    timeout: Duration,
    look: &mut dyn FnMut() -> Result<Look>,
    abort: impl FnOnce(),
) -> Result<()> {
    // ANCHOR: watchdog
    let start = Instant::now();
    let mut pause = Duration::from_micros(5);
    loop {
        match look() {
            Ok(Look::Done) => return Ok(()),
            Ok(Look::Busy) => {}
            Err(e) => {
                abort();
                return Err(e);
            }
        }
        if start.elapsed() > timeout {
            abort();
            return Err(CommError::Timeout {
                what: what.into(),
                timeout,
                detail: detail.into(),
                missing: Vec::new(),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
    // ANCHOR_END: watchdog
}

/// The first NCCL with nonblocking communicators (`ncclCommInitRankConfig`, `blocking = 0`).
const NONBLOCKING_SINCE: i32 = 21400;

/// NCCL_CONFIG_INITIALIZER with `blocking = 0`: every call returns at once and reports its
/// progress through ncclCommGetAsyncError, so init, too, can be watched and aborted.
fn nonblocking_config() -> sys::ncclConfig_t {
    const UNDEF: i32 = i32::MIN; // NCCL_CONFIG_UNDEF_INT: "NCCL's default"
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafebeef,
        // The layout of cudarc's bindings (NCCL 2.30's header): NCCL copies `size` bytes at most
        // and takes fields newer than `version` as defaults, so older libraries read a prefix.
        version: 23000,
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
        graphUsageMode: UNDEF,
        numRmaCtx: UNDEF,
        maxP2pPeers: UNDEF,
    }
}

/// `ncclCommInitRank` under the watchdog: a rank that never joins (it died after the store's
/// barrier) ends in a timeout and an abort, not a hang. NCCL older than 2.14 has no nonblocking
/// init and is called the blocking way.
fn init_rank(
    world_size: usize,
    id: sys::ncclUniqueId,
    rank: usize,
    timeout: Duration,
) -> Result<sys::ncclComm_t> {
    let mut comm: sys::ncclComm_t = std::ptr::null_mut();
    let version = result::get_nccl_version().map_err(nccl("ncclGetVersion"))?;
    if version < NONBLOCKING_SINCE {
        // SAFETY: comm is written by NCCL on success; the Id came from ncclGetUniqueId.
        unsafe { result::comm_init_rank(&mut comm, world_size as i32, id, rank as i32) }
            .map_err(nccl("ncclCommInitRank"))?;
        return Ok(comm);
    }
    let mut config = nonblocking_config();
    // SAFETY: as above; config outlives the call (NCCL copies it).
    unsafe {
        result::comm_init_rank_config(&mut comm, world_size as i32, id, rank as i32, &mut config)
    }
    .map_err(nccl("ncclCommInitRankConfig"))?;
    let mut look = || async_state(comm).map_err(nccl("ncclCommInitRankConfig"));
    watch(
        &format!("NCCL's communicator on rank {rank} of {world_size} to come up"),
        " (did every rank start? NCCL_DEBUG=INFO shows who connected); it was aborted",
        timeout,
        &mut look,
        // SAFETY: a communicator NCCL handed out, aborted once and never used again.
        || unsafe {
            let _ = result::comm_abort(comm);
        },
    )?;
    Ok(comm)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_waits_for_done() {
        let mut looks = [Look::Busy, Look::Busy, Look::Done].into_iter();
        let mut aborted = false;
        watch(
            "x",
            "",
            Duration::from_secs(5),
            &mut || Ok(looks.next().unwrap()),
            || aborted = true,
        )
        .unwrap();
        assert!(!aborted);
        assert_eq!(looks.next(), None, "it looked until done and no more");
    }

    #[test]
    fn the_watchdog_aborts_on_an_error_and_at_the_timeout() {
        let mut aborts = 0;
        let err = watch(
            "x",
            "",
            Duration::from_secs(5),
            &mut || Err(CommError::Backend("ncclRemoteError".into())),
            || aborts += 1,
        )
        .unwrap_err();
        assert_eq!(
            (aborts, err.to_string().contains("ncclRemoteError")),
            (1, true)
        );

        let err = watch(
            "NCCL ncclAllReduce on rank 1 to complete",
            " (a peer died or is stuck?)",
            Duration::from_millis(50),
            &mut || Ok(Look::Busy),
            || aborts += 1,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(aborts, 2);
        assert!(
            err.contains("NCCL ncclAllReduce on rank 1 to complete") && err.contains("peer died"),
            "{err}"
        );
    }

    #[test]
    fn the_nonblocking_config_is_nccls_initializer_with_blocking_off() {
        let config = nonblocking_config();
        assert_eq!(config.size, std::mem::size_of::<sys::ncclConfig_t>());
        assert_eq!((config.magic, config.blocking), (0xcafebeef, 0));
        assert!(config.version as i32 >= NONBLOCKING_SINCE);
        assert_eq!((config.minCTAs, config.splitShare), (i32::MIN, i32::MIN));
        assert!(config.netName.is_null() && config.commName.is_null());
    }

    #[test]
    fn unique_id_bytes_round_trip() {
        let bytes: Vec<u8> = (0..128u32).map(|i| (i * 37 % 256) as u8).collect();
        let id = id_from_bytes(&bytes).unwrap();
        assert_eq!(id_to_bytes(&id), bytes);
        let err = id_from_bytes(&bytes[..100]).unwrap_err().to_string();
        assert!(err.contains("has 100 bytes, not 128"), "{err}");
    }

    #[test]
    fn the_bootstrap_address_is_read_from_the_id() {
        // The first bytes of an Id that NCCL 2.32 made on a host with address 192.0.2.2.
        let mut id = vec![0u8; 128];
        let head = [
            0xd4, 0x57, 0x9d, 0x3c, 0x3d, 0x65, 0xfe, 0xb9, 0x02, 0x00, 0xae, 0xfd, 192, 0, 2, 2,
        ];
        id[..16].copy_from_slice(&head);
        assert_eq!(
            bootstrap_address(&id),
            Some("192.0.2.2:44797".parse().unwrap())
        );
        let mut v6 = vec![0u8; 128];
        v6[8..10].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[10..12].copy_from_slice(&4242u16.to_be_bytes());
        v6[16..32].copy_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
        assert_eq!(bootstrap_address(&v6), Some("[::1]:4242".parse().unwrap()));
        assert_eq!(bootstrap_address(&[0u8; 128]), None);
        assert_eq!(bootstrap_address(&[2u8; 10]), None);
    }

    #[test]
    fn the_probe_never_panics_on_this_machine() {
        let machine = ThisMachine(|_: &str| None);
        let outcome = probe(&machine);
        // On a machine without a driver (CI) the reason is named; elsewhere any answer is fine.
        if !machine.has_driver() {
            assert_eq!(outcome, Probe::Unavailable("no CUDA driver found".into()));
            // cudarc itself panics here; the probe's guard turns that into a reason.
            let count = machine.gpu_count().unwrap_err();
            assert!(count.contains("did not load"), "{count}");
            let version = machine.nccl_version();
            assert!(version.is_ok() || version.unwrap_err().contains("did not load"));
        }
    }

    /// A machine described by its answers, for the cases CI's machine cannot show.
    struct Described {
        driver: bool,
        gpus: std::result::Result<usize, String>,
        loadable: bool,
        relinked: bool,
        so2: Option<PathBuf>,
    }

    impl Machine for Described {
        fn has_driver(&self) -> bool {
            self.driver
        }
        fn gpu_count(&self) -> std::result::Result<usize, String> {
            assert!(self.driver, "asked for GPUs without a driver");
            self.gpus.clone()
        }
        fn nccl_loadable(&self) -> bool {
            self.loadable
        }
        fn nccl_load_error(&self) -> String {
            assert!(!self.loadable, "asked why a loadable NCCL does not load");
            "invalid ELF header".into()
        }
        fn relinked(&self) -> bool {
            self.relinked
        }
        fn find_libnccl_so2(&self) -> Option<PathBuf> {
            self.so2.clone()
        }
        fn nccl_version(&self) -> std::result::Result<String, String> {
            assert!(self.loadable, "asked NCCL's version without NCCL");
            Ok("2.21.5".into())
        }
    }

    #[test]
    fn the_probe_decides_in_order() {
        let base = || Described {
            driver: true,
            gpus: Ok(4),
            loadable: true,
            relinked: false,
            so2: None,
        };
        assert_eq!(
            probe(&base()),
            Probe::Ready {
                gpus: 4,
                version: "2.21.5".into()
            }
        );
        let no_driver = Described {
            driver: false,
            ..base()
        };
        assert_eq!(
            probe(&no_driver),
            Probe::Unavailable("no CUDA driver found".into())
        );
        let no_gpu = Described {
            gpus: Ok(0),
            ..base()
        };
        assert!(matches!(probe(&no_gpu), Probe::Unavailable(r) if r.contains("no GPU visible")));
        let broken = Described {
            gpus: Err("CUDA sees no usable GPU: X".into()),
            ..base()
        };
        assert_eq!(
            probe(&broken),
            Probe::Unavailable("CUDA sees no usable GPU: X".into())
        );
        let no_nccl = Described {
            loadable: false,
            ..base()
        };
        let reason = match probe(&no_nccl) {
            Probe::Unavailable(r) => r,
            other => panic!("{other:?}"),
        };
        assert!(
            reason.contains("no libnccl found") && reason.contains("module load nccl"),
            "{reason}"
        );
        let only_so2 = Described {
            loadable: false,
            so2: Some("/venv/nvidia/nccl/lib/libnccl.so.2".into()),
            ..base()
        };
        assert_eq!(
            probe(&only_so2),
            Probe::Relink("/venv/nvidia/nccl/lib/libnccl.so.2".into())
        );
        let still_broken = Described {
            relinked: true,
            ..only_so2
        };
        assert!(
            matches!(probe(&still_broken), Probe::Unavailable(r) if r.contains("still does not load (invalid ELF header)"))
        );
    }
}
