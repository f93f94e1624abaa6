//! The communicator: a group of ranks that run collectives together, whatever the backend. Its
//! calls mirror NCCL's: in-place ones take one buffer, `_into` ones a send and a receive buffer.
//! Buffers live where the backend computes (host memory for the CPU, device memory for NCCL);
//! `buffer` and `to_host` move data in and out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::backend::cpu::link_plan::LinkPlan;
use crate::backend::cpu::{algorithms, Algo, Transport};
use crate::backend::nccl::NcclBackend;
use crate::backend::{BackendKind, Device};
use crate::collective::{Call, Collective};
use crate::dtype::{reduce_into, Element, ReduceOp};
use crate::error::{CommError, Result};
use crate::host_memory::HostMemory;
use crate::steps;
use crate::store::Store;
use crate::trace::Span;

mod buffer;
mod part;
pub mod split;
use buffer::{host, host_mut, same_length, wrong_kind, Repr};
pub use buffer::{Buffer, Buffers};
pub use part::{Part, PartMut};

enum Engine {
    /// Host memory: the algorithms run over the transport.
    Cpu(Box<dyn Transport>),
    /// Boxed: a communicator, its stream, watchdog and events are large next to a transport.
    Nccl(Box<NcclBackend>),
}

/// This rank's handle on a group of ranks that run collectives together: what a communicator
/// is (rank, size, device, backend) and nothing of how the ranks were launched. A [`Job`]
/// builds them; tests build CPU ones straight from a transport.
///
/// [`Job`]: crate::job::Job
pub struct Communicator {
    rank: usize,
    world_size: usize,
    local_rank: usize,
    device: Device,
    engine: Engine,
    /// The rendezvous store, kept for grids: they gather a few cells to rank 0 out of band,
    /// as c10d's process groups keep theirs.
    store: Option<Arc<Store>>,
    /// Names this communicator's keys in the store, so several can share one.
    name: String,
    /// What moves a CPU communicator's bytes and why, as programs print it.
    transport_line: Option<String>,
    /// The CPU algorithm asked for, where a collective has it (`--algo`).
    algo: Option<Algo>,
    /// Show every rank's buffer after each step of an algorithm (`--steps`).
    steps: bool,
    /// Collective calls made while showing steps: their keys in the store.
    watched_calls: AtomicU64,
    grids: AtomicU64,
    /// How a CPU communicator's links were made, for its groups' own (see [`split`]).
    links: Option<Arc<LinkPlan>>,
    /// A split's group: its name (`tp 0`), in the transport line, the trace and errors.
    group: Option<String>,
    /// Splits made of this communicator: the next one's keys in the store.
    splits: AtomicU64,
}

impl Communicator {
    /// A CPU communicator over `transport`, with no store (no grids): how the tests run ranks as
    /// threads.
    pub fn cpu(transport: Box<dyn Transport>, local_rank: usize) -> Communicator {
        let (rank, world_size) = (transport.rank(), transport.world_size());
        let engine = Engine::Cpu(transport);
        Communicator::new(rank, world_size, local_rank, Device::Cpu(rank), engine)
    }

    fn new(
        rank: usize,
        world_size: usize,
        local_rank: usize,
        device: Device,
        engine: Engine,
    ) -> Communicator {
        Communicator {
            rank,
            world_size,
            local_rank,
            device,
            engine,
            store: None,
            name: String::new(),
            transport_line: None,
            algo: None,
            steps: false,
            watched_calls: AtomicU64::new(0),
            grids: AtomicU64::new(0),
            links: None,
            group: None,
            splits: AtomicU64::new(0),
        }
    }

    /// An NCCL communicator on GPU `ordinal`, for `rank` of `world_size`.
    pub(crate) fn nccl(
        backend: NcclBackend,
        rank: usize,
        world_size: usize,
        local_rank: usize,
        ordinal: usize,
    ) -> Communicator {
        let engine = Engine::Nccl(Box::new(backend));
        Communicator::new(rank, world_size, local_rank, Device::Cuda(ordinal), engine)
    }

    /// Runs the CPU algorithm `algo` names wherever a collective has one of that name (all_reduce:
    /// ring or direct; broadcast: tree or chain); `None`: by size, the default.
    pub fn with_algo(mut self, algo: Option<Algo>) -> Communicator {
        self.algo = algo;
        self
    }

    /// Shows (`true`) every rank's buffer after each step of the CPU algorithms, as grids printed
    /// by rank 0; on NCCL, whose steps run inside one kernel, rank 0 says so once per call. Needs
    /// a communicator built by a Job (the rows travel through the store).
    pub fn with_steps(mut self, steps: bool) -> Communicator {
        self.steps = steps;
        self
    }

    /// Says what moves its bytes and why (see [`transport_line`](Self::transport_line)).
    pub(crate) fn with_transport_line(mut self, line: String) -> Communicator {
        self.transport_line = Some(line);
        self
    }

    /// Gives the communicator the rendezvous store for its grids, its keys under `name`.
    pub(crate) fn with_store(mut self, store: Arc<Store>, name: &str) -> Communicator {
        self.store = Some(store);
        self.name = name.to_string();
        self
    }

    /// `e`, a call this communicator refused, said of its group where it is a split's group of
    /// one: a call between two ranks finds no peer there.
    fn of_group(&self, e: CommError) -> CommError {
        match (&self.group, e) {
            (Some(group), CommError::Usage(m)) if self.world_size == 1 => {
                CommError::Usage(format!(
                    "{m}: {group} is a group of one rank, and this call needs two or more \
                     (give this rank's color to another rank too)"
                ))
            }
            (_, e) => e,
        }
    }

    /// This rank's number in the communicator, 0..world_size.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Rank among the processes on this node.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// Where this rank's buffers live (`cpu:n` or `cuda:n`).
    pub fn device(&self) -> Device {
        self.device
    }

    /// Which backend runs the collectives.
    pub fn backend(&self) -> BackendKind {
        match self.engine {
            Engine::Cpu(_) => BackendKind::Cpu,
            Engine::Nccl(_) => BackendKind::Nccl,
        }
    }

    /// How a CPU communicator's ranks move bytes ("shm", "tcp", "shm+tcp", "channels"); `None`
    /// on NCCL, which picks its own transports.
    pub fn transport(&self) -> Option<&'static str> {
        match &self.engine {
            Engine::Cpu(t) => Some(t.name()),
            Engine::Nccl(_) => None,
        }
    }

    /// Whether this CPU communicator's buffers lie in registered memory, where its collectives
    /// read the peers' buffers in place (every rank on this host, `--copy auto` or
    /// `registered`); false on NCCL.
    pub fn registers_buffers(&self) -> bool {
        match &self.engine {
            Engine::Cpu(t) => t.window().is_some(),
            Engine::Nccl(_) => false,
        }
    }

    /// Where its buffers are registered, the size (nccl-tests': the larger buffer) from which
    /// a call of `collective` reads the peers' buffers in place: 0 under `--copy registered`,
    /// the measured bound under `--copy auto` (smaller calls send messages); `None` where they
    /// are not.
    pub fn registered_from(&self, collective: Collective) -> Option<usize> {
        match &self.engine {
            Engine::Cpu(t) => t.window().map(|w| w.registered_from(collective)),
            Engine::Nccl(_) => None,
        }
    }

    /// The CPU algorithm asked for (`--algo`), if any.
    pub fn algo(&self) -> Option<Algo> {
        self.algo
    }

    /// `transport: shm (shared memory between the 4 ranks of this host)`: what moves a CPU
    /// communicator's bytes and why, for the program to print (rank 0 does, after the backend
    /// line); `None` on NCCL and for communicators built without a store.
    pub fn transport_line(&self) -> Option<&str> {
        self.transport_line.as_deref()
    }

    /// The rendezvous store, when this communicator was built through one.
    pub fn store(&self) -> Option<&Store> {
        self.store.as_deref()
    }

    /// Copies host values onto the device. On the CPU backend the copy is checked against the
    /// host memory available first (see [`filled`](Self::filled)), and lies in registered
    /// memory where the ranks share a host ([`host_buffer`](Self::host_buffer)).
    pub fn buffer<T: Element>(&self, values: &[T]) -> Result<Buffer<T>> {
        let repr = match &self.engine {
            Engine::Cpu(_) => {
                crate::memory::check_fits::<T>(values.len(), 1)?;
                self.host_buffer(
                    values.len(),
                    |b| b.copy_from_slice(values),
                    || values.to_vec(),
                )?
            }
            Engine::Nccl(nccl) => Repr::Device(nccl.upload(values)?),
        };
        Ok(Buffer { repr })
    }

    /// A buffer of `len` copies of `value` on the device. Before allocating anything, checks
    /// that it fits in host memory (MemAvailable, shared by the ranks of this node): a `len`
    /// too large is a usage error naming the size and what is available, not an abort in the
    /// allocator.
    pub fn filled<T: Element>(&self, value: T, len: usize) -> Result<Buffer<T>> {
        crate::memory::check_fits::<T>(len, 1)?;
        let repr = match &self.engine {
            Engine::Cpu(_) => self.host_buffer(len, |b| b.fill(value), || vec![value; len])?,
            Engine::Nccl(nccl) => Repr::Device(nccl.upload(&vec![value; len])?),
        };
        Ok(Buffer { repr })
    }

    /// A buffer of `len` zeros on the device, checked as [`filled`](Self::filled) is.
    pub fn zeros<T: Element>(&self, len: usize) -> Result<Buffer<T>> {
        self.filled(T::default(), len)
    }

    /// A CPU buffer of `len` elements: in registered memory, set by `fill`, where the
    /// transport reads peers' buffers in place (every rank on this host, `--copy auto` or
    /// `registered`), so that collectives on it take one copy per byte; else `heap()`'s `Vec`.
    fn host_buffer<T: Element>(
        &self,
        len: usize,
        fill: impl FnOnce(&mut [T]),
        heap: impl FnOnce() -> Vec<T>,
    ) -> Result<Repr<T>> {
        let window = match &self.engine {
            Engine::Cpu(t) => t.window(),
            Engine::Nccl(_) => None,
        };
        Ok(Repr::Host(HostMemory::new(window, len, fill, heap)?))
    }

    /// Copies a buffer back to the host (waiting for work on it to finish).
    pub fn to_host<T: Element>(&self, buf: &Buffer<T>) -> Result<Vec<T>> {
        match (&self.engine, &buf.repr) {
            (Engine::Cpu(_), Repr::Host(v)) => Ok(v.to_vec()),
            (Engine::Nccl(nccl), Repr::Device(d)) => nccl.download(d),
            _ => Err(wrong_kind()),
        }
    }

    /// Copies `buf`, on this communicator's device, into `host`: a CPU communicator's buffer of
    /// as many elements, kept by the caller. How a CUDA tensor is staged through host memory
    /// allocated once (PyTorch's Gloo backend keeps its staging copies too), not a new buffer
    /// per copy as [`to_host`](Self::to_host) makes.
    pub fn copy_to_host<T: Element>(&self, buf: &Buffer<T>, host: &mut Buffer<T>) -> Result<()> {
        same_length("copy_to_host", buf, host)?;
        let bytes = std::mem::size_of_val(host_mut(host)?);
        let name = match self.engine {
            Engine::Cpu(_) => "copy",
            Engine::Nccl(_) => "copy to host",
        };
        crate::trace::copying_as(name, bytes, || {
            match (&self.engine, &buf.repr, &mut host.repr) {
                (Engine::Cpu(_), Repr::Host(from), Repr::Host(to)) => {
                    to.copy_from_slice(from);
                    Ok(())
                }
                (Engine::Nccl(nccl), Repr::Device(from), Repr::Host(to)) => {
                    nccl.download_into(&**from, to)
                }
                _ => Err(wrong_kind()),
            }
        })
    }

    /// The way back: `host` (a CPU communicator's buffer) into `buf`, on this communicator's
    /// device, as many elements.
    pub fn copy_from_host<T: Element>(&self, host: &Buffer<T>, buf: &mut Buffer<T>) -> Result<()> {
        same_length("copy_from_host", buf, host)?;
        let from = self::host(host)?;
        let name = match self.engine {
            Engine::Cpu(_) => "copy",
            Engine::Nccl(_) => "copy to the GPU",
        };
        crate::trace::copying_as(name, std::mem::size_of_val(from), || {
            match (&self.engine, &mut buf.repr) {
                (Engine::Cpu(_), Repr::Host(to)) => {
                    to.copy_from_slice(from);
                    Ok(())
                }
                (Engine::Nccl(nccl), Repr::Device(to)) => nccl.upload_into(from, &mut **to),
                _ => Err(wrong_kind()),
            }
        })
    }

    /// Runs `body`, whose collectives are enqueued back to back and waited for once, at the
    /// end, for all of them: what nccl-tests times by default (N calls, one wait, total / N),
    /// and how a training step overlaps its collectives with the CPU's work.
    ///
    /// On NCCL each call inside only waits until NCCL has enqueued it on the rank's stream;
    /// when the outermost batch ends (batches nest, and behave as one) it waits for the GPU to
    /// finish everything, under the watchdog, as a single call would, and it does so even when
    /// `body` failed, so no work is left unwatched (a panic in `body` aborts the communicator
    /// instead). [`to_host`](Self::to_host) inside a batch first waits for the calls before it,
    /// so it reads their results; a [`barrier`](Self::barrier) inside only enqueues its
    /// all-reduce. An error from any call inside may surface at the batch's end rather than at
    /// the call. On the CPU backend every call completes before it returns, so `batch` just runs
    /// `body`. Returns what `body` returns, or the first error.
    pub fn batch<R>(&self, body: impl FnOnce() -> Result<R>) -> Result<R> {
        match &self.engine {
            Engine::Cpu(_) => body(),
            Engine::Nccl(nccl) => nccl.batch(body),
        }
    }

    /// Runs `body`'s collectives as one NCCL group, nccl-tests' `-m N` aggregation: the calls go
    /// between one `ncclGroupStart` and `ncclGroupEnd`, NCCL launches them together at the end,
    /// and they are waited for once after it (inside a [`batch`](Self::batch), not until the
    /// batch ends). Groups nest as NCCL's do. Inside a group the calls have not run yet, so
    /// [`to_host`](Self::to_host) there is an error; a buffer made and dropped inside the group
    /// is freed only after the group's kernels are enqueued, so the calls never read freed
    /// memory. On the CPU backend it just runs `body`. Returns what `body`
    /// returns, or the first error.
    pub fn group<R>(&self, body: impl FnOnce() -> Result<R>) -> Result<R> {
        match &self.engine {
            Engine::Cpu(_) => body(),
            Engine::Nccl(nccl) => nccl.group(body),
        }
    }

    /// Ends the communicator cleanly once every rank is done with it: on NCCL a barrier, then
    /// `ncclCommFinalize` (this rank's last operations flushed) and `ncclCommDestroy`, all under
    /// the watchdog. Dropping a communicator without it skips the barrier (a peer may have failed)
    /// and still finalizes; the CPU backend has nothing to flush.
    pub fn close(self) -> Result<()> {
        match &self.engine {
            Engine::Cpu(_) => Ok(()),
            Engine::Nccl(nccl) => nccl.close(),
        }
    }

    /// A stopwatch on this rank's own clock of its work, for timing iterations between marks:
    /// CUDA events recorded on the rank's stream on NCCL (read with `cuEventElapsedTime`), the
    /// host clock on the CPU backend, whose calls are done when they return. Keep it to reuse its
    /// events from one timed loop to the next ([`time_loop_with`]).
    ///
    /// [`time_loop_with`]: crate::timing::time_loop_with
    pub fn stopwatch(&self) -> crate::stopwatch::Stopwatch {
        match &self.engine {
            Engine::Cpu(_) => crate::stopwatch::Stopwatch::host(),
            Engine::Nccl(nccl) => crate::stopwatch::Stopwatch::events(nccl.timing_events()),
        }
    }

    /// Makes this communicator usable from the calling thread, once it has moved there (it is
    /// `Send`): on NCCL the rank's CUDA context becomes current; nothing to do on the CPU.
    pub fn bind_to_thread(&self) -> Result<()> {
        match &self.engine {
            Engine::Cpu(_) => Ok(()),
            Engine::Nccl(nccl) => nccl.bind_to_thread(),
        }
    }

    /// Blocks until every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        crate::phase::enter(crate::phase::Phase::Barrier);
        let _between = PhaseAfterCall;
        // Its own box on a timeline: a barrier's messages are not a collective's steps.
        let _span = Span::slice("barrier", "barrier")
            .with_args(crate::trace::Args::bytes(0))
            .with_range(|| "barrier".into());
        match &self.engine {
            Engine::Cpu(t) => algorithms::barrier(t.as_ref()),
            Engine::Nccl(nccl) => nccl.barrier(),
        }
    }

    /// Runs one call of the collective table on this rank's buffers (`send` `None`: in place,
    /// `recv` is the one buffer), as every rank of the communicator must: the one way a
    /// collective reaches a backend. Checks the call and the buffers' lengths against the table
    /// first ([`Call::check`]); the methods below are this, named.
    pub fn collective<T: Element>(
        &self,
        call: Call,
        send: Option<&Buffer<T>>,
        recv: &mut Buffer<T>,
    ) -> Result<()> {
        self.collective_on_parts(call, send.map(Part::from), recv.into())
    }

    /// [`collective`](Self::collective) on parts of buffers (send_recv's blocks).
    fn collective_on_parts<T: Element>(
        &self,
        call: Call,
        send: Option<Part<'_, T>>,
        mut recv: PartMut<'_, T>,
    ) -> Result<()> {
        let placement = if send.is_some() {
            "out-of-place"
        } else {
            "in-place"
        };
        let checked = call
            .check(
                send.as_ref().map(Part::len),
                recv.len(),
                self.rank,
                self.world_size,
            )
            .map_err(|e| self.of_group(e))?;
        crate::phase::enter_collective(call.collective);
        let _between = PhaseAfterCall;
        let len = recv.len();
        let args = crate::trace::Args {
            placement: Some(placement),
            ..crate::trace::Args::bytes(len * std::mem::size_of::<T>())
        };
        // A group's calls are named after it (formatted only when a trace is recorded).
        let name = match &self.group {
            Some(group) if crate::trace::on() => format!("{group}: {}", call.collective).into(),
            _ => std::borrow::Cow::Borrowed(call.collective.name()),
        };
        let _span = Span::slice("call", name)
            .with_args(args)
            .with_range(|| format!("{} {placement} {} x {len}", call.collective, T::DTYPE));
        self.run_checked(&checked, send, &mut recv)
    }

    /// Runs a checked call on this rank's backend.
    fn run_checked<T: Element>(
        &self,
        checked: &crate::collective::Checked,
        send: Option<Part<'_, T>>,
        recv: &mut PartMut<'_, T>,
    ) -> Result<()> {
        match &self.engine {
            Engine::Cpu(t) => {
                let send = send.as_ref().map(Part::host).transpose()?;
                let recv = recv.host()?;
                let algo = self.algo;
                let mut run = move || algorithms::run(t.as_ref(), checked, send, recv, algo);
                match self.step_grids::<T>() {
                    Some(show) => steps::watching(show, run),
                    None => run(),
                }
            }
            Engine::Nccl(nccl) => {
                if self.steps && self.rank == 0 {
                    println!(
                        "({}: on NCCL every step runs inside one kernel)",
                        checked.call.collective
                    );
                }
                let send = send.as_ref().map(Part::device).transpose()?;
                nccl.collective(checked, send, recv.device()?)
            }
        }
    }

    /// With `--steps`, what shows each step of the next call: this rank's buffer goes to rank 0
    /// through the store, as a grid's row, under `comm<n>/steps/<call>/<step>`.
    fn step_grids<T: Element>(&self) -> Option<steps::Show> {
        let store = self.store.clone().filter(|_| self.steps)?;
        let call = self.watched_calls.fetch_add(1, Ordering::SeqCst);
        let scope = format!("{}/steps/{call}", self.name);
        let (rank, world_size) = (self.rank, self.world_size);
        let step = std::cell::Cell::new(0u64);
        Some(Box::new(move |title: &str, bytes: &[u8]| {
            let mut values = vec![T::default(); bytes.len() / std::mem::size_of::<T>()];
            bytemuck::cast_slice_mut(&mut values).copy_from_slice(bytes);
            let row = crate::grid::Row::of(&values);
            let scope = store.scoped(&scope);
            let scope = scope.scoped(&step.replace(step.get() + 1).to_string());
            crate::grid::share(&scope, rank, world_size, title, row)
        }))
    }

    /// The end of a step of an algorithm of your own: with `--steps`, rank 0 prints every rank's
    /// `buf` as the course's grid under `title`, as the library's algorithms show theirs; without
    /// `--steps`, nothing happens. Every rank must call it at the same steps.
    pub fn show_step<T: Element>(&self, title: &str, buf: &Buffer<T>) -> Result<()> {
        let Some(show) = self.step_grids::<T>() else {
            return Ok(());
        };
        show(title, bytemuck::cast_slice(&self.to_host(buf)?))
    }

    /// Copies the root's buffer to every rank.
    pub fn broadcast<T: Element>(&self, buf: &mut Buffer<T>, root: usize) -> Result<()> {
        self.collective(Call::new(Collective::Broadcast).root(root), None, buf)
    }

    /// The root's `send` lands in every rank's `recv`.
    pub fn broadcast_into<T: Element>(
        &self,
        send: &Buffer<T>,
        recv: &mut Buffer<T>,
        root: usize,
    ) -> Result<()> {
        self.collective(
            Call::new(Collective::Broadcast).root(root),
            Some(send),
            recv,
        )
    }

    /// Every rank ends with the element-wise reduction of all ranks' buffers.
    pub fn all_reduce<T: Element>(&self, buf: &mut Buffer<T>, op: ReduceOp) -> Result<()> {
        self.collective(Call::new(Collective::AllReduce).op(op), None, buf)
    }

    /// Every rank's `recv` gets the element-wise reduction of all ranks' `send`.
    pub fn all_reduce_into<T: Element>(
        &self,
        send: &Buffer<T>,
        recv: &mut Buffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(Call::new(Collective::AllReduce).op(op), Some(send), recv)
    }

    /// The root ends with the reduction; other ranks' buffers are unchanged.
    pub fn reduce<T: Element>(&self, buf: &mut Buffer<T>, op: ReduceOp, root: usize) -> Result<()> {
        self.collective(Call::new(Collective::Reduce).op(op).root(root), None, buf)
    }

    /// Only the root's `recv` is written.
    pub fn reduce_into<T: Element>(
        &self,
        send: &Buffer<T>,
        recv: &mut Buffer<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let call = Call::new(Collective::Reduce).op(op).root(root);
        self.collective(call, Some(send), recv)
    }

    /// In place: `buf` holds world_size equal blocks, this rank's data in block `rank`;
    /// afterwards every block holds its rank's data.
    pub fn all_gather<T: Element>(&self, buf: &mut Buffer<T>) -> Result<()> {
        self.collective(Call::new(Collective::AllGather), None, buf)
    }

    /// `recv` (world_size × send.len()) gets every rank's `send`, in rank order.
    pub fn all_gather_into<T: Element>(
        &self,
        send: &Buffer<T>,
        recv: &mut Buffer<T>,
    ) -> Result<()> {
        self.collective(Call::new(Collective::AllGather), Some(send), recv)
    }

    /// In place: `buf` holds world_size equal blocks; afterwards block `rank` holds the
    /// reduction of block `rank` over all ranks (other blocks hold partial sums).
    pub fn reduce_scatter<T: Element>(&self, buf: &mut Buffer<T>, op: ReduceOp) -> Result<()> {
        self.collective(Call::new(Collective::ReduceScatter).op(op), None, buf)
    }

    /// `send` (world_size × recv.len()) is reduced over ranks; block `rank` lands in `recv`.
    pub fn reduce_scatter_into<T: Element>(
        &self,
        send: &Buffer<T>,
        recv: &mut Buffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(
            Call::new(Collective::ReduceScatter).op(op),
            Some(send),
            recv,
        )
    }

    /// Sends `send` to `to` while receiving `recv` from `from`, both at once: the ring step, and
    /// nccl-tests' sendrecv. On NCCL one group (ncclGroupStart, ncclSend, ncclRecv, ncclGroupEnd),
    /// so a ring of ranks that all send first cannot deadlock.
    ///
    /// Either side may be a whole buffer (`&buf`, `&mut buf`) or a part of one
    /// ([`Buffer::part`], [`Buffer::part_mut`], [`Buffer::parts`]): a block sent and received
    /// where it lies, with no copy. The two sides may differ in length (a ring's blocks of a
    /// buffer that does not split evenly): `from` must send as many elements as `recv` holds.
    pub fn send_recv<'a, 'b, T: Element>(
        &self,
        send: impl Into<Part<'a, T>>,
        to: usize,
        recv: impl Into<PartMut<'b, T>>,
        from: usize,
    ) -> Result<()> {
        let (send, recv) = (send.into(), recv.into());
        if send.len() != recv.len() {
            return self.exchange(send, to, recv, from);
        }
        let call = Call::new(Collective::SendRecv).peers(to, from);
        self.collective_on_parts(call, Some(send), recv)
    }

    /// `send` and `recv` hold world_size blocks each: block `j` of this rank's `send` lands in
    /// block `rank` of rank `j`'s `recv` (NCCL: one group of ncclSend/ncclRecv, as nccl-tests'
    /// alltoall; CPU: a pairwise exchange). Out of place only.
    pub fn all_to_all<T: Element>(&self, send: &Buffer<T>, recv: &mut Buffer<T>) -> Result<()> {
        self.collective(Call::new(Collective::AllToAll), Some(send), recv)
    }

    /// Sends `buf` to `peer`, which must call `recv` with as many elements: one message, not a
    /// collective. `buf` is a whole buffer (`&buf`) or a part of one ([`Buffer::part`]), sent
    /// where it lies.
    pub fn send<'a, T: Element>(&self, buf: impl Into<Part<'a, T>>, peer: usize) -> Result<()> {
        let buf = buf.into();
        let _span = Span::range(|| format!("send {} x {}", T::DTYPE, buf.len()));
        crate::collective::another_rank("send", peer, self.rank, self.world_size)
            .map_err(|e| self.of_group(e))?;
        match &self.engine {
            Engine::Cpu(t) => t.send(peer, bytemuck::cast_slice(buf.host()?)),
            Engine::Nccl(nccl) => nccl.send(buf.device()?, peer),
        }
    }

    /// Receives into `buf` (`&mut buf`, or a part: [`Buffer::part_mut`]) what `peer` sends with
    /// [`send`](Self::send); the lengths must match.
    pub fn recv<'a, T: Element>(&self, buf: impl Into<PartMut<'a, T>>, peer: usize) -> Result<()> {
        let mut buf = buf.into();
        let _span = Span::range(|| format!("recv {} x {}", T::DTYPE, buf.len()));
        crate::collective::another_rank("recv", peer, self.rank, self.world_size)
            .map_err(|e| self.of_group(e))?;
        match &self.engine {
            Engine::Cpu(t) => t.recv(peer, bytemuck::cast_slice_mut(buf.host()?)),
            Engine::Nccl(nccl) => nccl.recv(buf.device()?, peer),
        }
    }

    /// [`send_recv`](Communicator::send_recv) of two parts of different lengths, which the
    /// collective table's sendrecv (nccl-tests' equal counts) does not describe: on the CPU the
    /// transport's exchange, on NCCL one group of `ncclSend` and `ncclRecv`.
    fn exchange<T: Element>(
        &self,
        send: Part<'_, T>,
        to: usize,
        mut recv: PartMut<'_, T>,
        from: usize,
    ) -> Result<()> {
        for peer in [to, from] {
            crate::collective::another_rank("send_recv", peer, self.rank, self.world_size)?;
        }
        match &self.engine {
            Engine::Cpu(t) => t.send_recv(
                to,
                bytemuck::cast_slice(send.host()?),
                from,
                bytemuck::cast_slice_mut(recv.host()?),
            ),
            Engine::Nccl(nccl) => nccl.group(|| {
                nccl.send(send.device()?, to)?;
                nccl.recv(recv.device()?, from)
            }),
        }
    }

    /// `into[i] = into[i] op from[i]` on this rank, no message sent: the add of a ring's
    /// reduce-scatter step, after the block has arrived. Both parts are as long. On the CPU
    /// backend it runs on the host memory where they lie; on NCCL, which gives this library no
    /// kernels of its own, the two parts go through host memory and back (PyTorch would launch
    /// an add kernel on the GPU).
    pub fn reduce_local<'a, 'b, T: Element>(
        &self,
        into: impl Into<PartMut<'a, T>>,
        from: impl Into<Part<'b, T>>,
        op: ReduceOp,
    ) -> Result<()> {
        let (mut into, from) = (into.into(), from.into());
        same_part_length("reduce_local", into.len(), from.len())?;
        match &self.engine {
            Engine::Cpu(_) => {
                reduce_into(op, into.host()?, from.host()?);
                Ok(())
            }
            Engine::Nccl(nccl) => {
                let (mut acc, mut other) = (
                    vec![T::default(); into.len()],
                    vec![T::default(); from.len()],
                );
                nccl.download_into(into.device()?, &mut acc)?;
                nccl.download_into(from.device()?, &mut other)?;
                reduce_into(op, &mut acc, &other);
                nccl.upload_into(&acc, into.device()?)
            }
        }
    }

    /// Copies `from` into `into` on this rank, no message sent (both as long): how an
    /// out-of-place collective first puts its own block where the result wants it. On NCCL the
    /// elements go through host memory.
    pub fn copy_local<'a, 'b, T: Element>(
        &self,
        from: impl Into<Part<'a, T>>,
        into: impl Into<PartMut<'b, T>>,
    ) -> Result<()> {
        let (from, mut into) = (from.into(), into.into());
        same_part_length("copy_local", into.len(), from.len())?;
        match &self.engine {
            Engine::Cpu(_) => {
                into.host()?.copy_from_slice(from.host()?);
                Ok(())
            }
            Engine::Nccl(nccl) => {
                let mut values = vec![T::default(); from.len()];
                nccl.download_into(from.device()?, &mut values)?;
                nccl.upload_into(&values, into.device()?)
            }
        }
    }

    /// Prints every rank's buffer as the course's grid, on rank 0, under `title`. Every rank
    /// must call it; only the cells shown travel (through the store), so it is cheap for long
    /// buffers.
    pub fn print_grid<T: Element>(&self, title: &str, buf: &Buffer<T>) -> Result<()> {
        let step = self.grids.fetch_add(1, Ordering::SeqCst);
        let store = self.store.as_deref().ok_or_else(|| {
            CommError::Usage(
                "print_grid needs a communicator built by a Job (through the rendezvous store)"
                    .into(),
            )
        })?;
        let row = crate::grid::Row::of(&self.to_host(buf)?);
        // This grid's rows, under comm<n>/grid/<step>/row/<rank>.
        let scope = store.scoped(&self.name).scoped("grid");
        let scope = scope.scoped(&step.to_string());
        crate::grid::share(&scope, self.rank, self.world_size, title, row)
    }
}

/// Marks the rank back in its own code when a call returns, errors and panics included.
struct PhaseAfterCall;

impl Drop for PhaseAfterCall {
    fn drop(&mut self) {
        crate::phase::enter(crate::phase::Phase::Working);
    }
}

/// Two parts of as many elements, or a usage error for `what` naming both lengths.
fn same_part_length(what: &str, a: usize, b: usize) -> Result<()> {
    match a == b {
        true => Ok(()),
        false => Err(CommError::Usage(format!(
            "{what}: a part of {a} elements and one of {b}: they must be as long"
        ))),
    }
}
