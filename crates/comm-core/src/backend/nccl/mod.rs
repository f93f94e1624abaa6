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

pub mod library;

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
    Ready {
        gpus: usize,
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
    fn has_driver(&self) -> bool;
    fn gpu_count(&self) -> std::result::Result<usize, String>;
    fn nccl_loadable(&self) -> bool;
    fn relinked(&self) -> bool;
    fn find_libnccl_so2(&self) -> Option<PathBuf>;
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
            return Probe::Unavailable(
                "libnccl.so.2 was linked as libnccl.so but still does not load; check that it matches this CUDA driver".into(),
            );
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

/// The GPU for a rank: `local_rank % gpus`, one rank per GPU.
pub fn device_for(local_rank: usize, local_world_size: usize, gpus: usize) -> Result<usize> {
    if gpus == 0 {
        return Err(CommError::Backend("no GPU visible to this rank".into()));
    }
    if local_world_size > gpus {
        return Err(CommError::Backend(format!(
            "{local_world_size} ranks on this node but only {gpus} GPU{}: NCCL needs one GPU per rank \
             (two ranks on one GPU fail with ncclInvalidUsage); start at most {gpus} per node (-n {gpus})",
            if gpus == 1 { "" } else { "s" }
        )));
    }
    Ok(local_rank % gpus)
}

/// The unique Id as the bytes the store carries, and back.
pub fn id_to_bytes(id: &sys::ncclUniqueId) -> Vec<u8> {
    id.internal.iter().map(|&c| c as u8).collect()
}

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
            let id = result::get_uniqueid().map_err(nccl("ncclGetUniqueId"))?;
            store.set(&format!("{prefix}/id"), &id_to_bytes(&id))?;
            id
        } else {
            id_from_bytes(&store.get(&format!("{prefix}/id"))?)?
        };
        // Everyone has the Id and is alive before NCCL's own (timeout-less) init starts.
        store.barrier(&format!("{prefix}/init"))?;
        ctx.bind_to_thread().map_err(cuda("binding the context"))?;
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: comm is written by NCCL on success; the Id came from ncclGetUniqueId.
        let comm = unsafe {
            result::comm_init_rank(comm.as_mut_ptr(), world_size as i32, id, rank as i32)
                .map_err(nccl("ncclCommInitRank"))?;
            comm.assume_init()
        };
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

    /// Waits for the work just enqueued, watching for NCCL errors and the timeout.
    fn wait(&self, what: &str) -> Result<()> {
        let done = self
            .stream
            .record_event(None)
            .map_err(cuda("recording an event"))?;
        let start = Instant::now();
        let mut pause = Duration::from_micros(5);
        loop {
            if done.is_complete() {
                return Ok(());
            }
            let mut state = sys::ncclResult_t::ncclSuccess;
            // SAFETY: comm is a live communicator; state is a valid out-pointer.
            unsafe { sys::ncclCommGetAsyncError(self.comm, &mut state) };
            if !matches!(
                state,
                sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
            ) {
                self.abort();
                return Err(CommError::Backend(nccl_error(
                    what,
                    result::NcclError(state),
                )));
            }
            if start.elapsed() > self.timeout {
                self.abort();
                return Err(CommError::Timeout {
                    what: format!("NCCL {what} on rank {} to complete", self.rank),
                    timeout: self.timeout,
                    detail: " (a peer died or is stuck?); the communicator was aborted".into(),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    fn abort(&self) {
        if !self.aborted.replace(true) {
            // SAFETY: aborting a live communicator once; later calls see `aborted`.
            let _ = unsafe { result::comm_abort(self.comm) };
        }
    }

    pub fn upload<T: Element>(&self, values: &[T]) -> Result<CudaSlice<T>> {
        self.stream
            .clone_htod(values)
            .map_err(cuda("copying to the GPU"))
    }

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

    pub fn broadcast<T: Element>(
        &self,
        send: Option<&CudaSlice<T>>,
        recv: &mut CudaSlice<T>,
        root: usize,
    ) -> Result<()> {
        let count = recv.len();
        let (r, _r) = recv.device_ptr_mut(&self.stream);
        let s = match send {
            Some(send) => send.device_ptr(&self.stream).0,
            None => r,
        };
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
    fn one_rank_per_gpu() {
        assert_eq!(device_for(0, 4, 4).unwrap(), 0);
        assert_eq!(device_for(3, 4, 4).unwrap(), 3);
        assert_eq!(device_for(1, 2, 4).unwrap(), 1);
        let err = device_for(2, 3, 2).unwrap_err().to_string();
        assert!(
            err.contains("3 ranks on this node but only 2 GPUs"),
            "{err}"
        );
        assert!(err.contains("-n 2"), "{err}");
        assert!(device_for(0, 1, 0).is_err());
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
            matches!(probe(&still_broken), Probe::Unavailable(r) if r.contains("still does not load"))
        );
    }
}
