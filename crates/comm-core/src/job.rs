//! A job: what a launch gives a rank, and what communicators are built from. It holds where the
//! rank sits ([`Topology`]), the rendezvous store every rank met at, and on rank 0 the store's
//! server. Communicators come from [`Job::communicator`], one per backend if wanted, all over the
//! same store (how example 03 and comm-bench compare the CPU path with NCCL on the same ranks);
//! a communicator itself knows nothing of how it was launched. The job holds the launch's
//! [`Settings`] and hands each part what it obeys: the timeout to the store, the transports and
//! NCCL; the transport, algorithm, steps and trace to the communicators.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::cpu;
use crate::backend::nccl::{self, NcclBackend};
use crate::backend::{self, BackendChoice, BackendKind, Selection};
use crate::comm::Communicator;
use crate::error::{CommError, Result};
use crate::phase::Phase;
use crate::settings::Settings;
use crate::store::{Membership, Store, StoreLimits, StoreServer};
use crate::topology::{StoreHost, Topology};

/// One rank's part in a launched job.
pub struct Job {
    topology: Topology,
    /// What `--backend` chose at launch, before the rendezvous.
    selection: Selection,
    /// Everything the flags decided, `settings.backend` being what `selection` answers.
    settings: Settings,
    store: Arc<Store>,
    /// Rank 0 serves the store for everyone until the job finishes.
    server: Option<Arc<StoreServer>>,
    /// Communicators built so far: the next one's name in the store.
    built: AtomicU64,
}

impl Job {
    /// Meets the other ranks: decides the backend (rank 0 says which and why), then rank 0
    /// serves the store at MASTER_PORT (unless torchrun's agent serves it there) and every rank
    /// joins it, within `settings.timeout`. With `settings.trace` every rank starts recording.
    /// From then on, if another rank ends the job or the store goes away, this rank stops at
    /// once, wherever it is, saying why (see [`Store::when_job_ends`]).
    ///
    /// Deciding has no side effects: linking pip's `libnccl.so.2` (and the restart that takes)
    /// happened at the start of the process, in [`backend::prepare`] (see [`nccl::library`]).
    pub fn rendezvous(topology: &Topology, settings: &Settings) -> Result<Job> {
        let selection = backend::select(settings.backend)?;
        let (rank, world_size) = (topology.rank, topology.world_size);
        let _span = crate::trace::Span::range(|| "rendezvous".into());
        crate::phase::enter(Phase::Rendezvous);
        let serves_store = topology.store == StoreHost::RankZero;
        crate::descriptors::check_rank(rank, world_size, serves_store)?;
        let limits = StoreLimits {
            heartbeat: settings.heartbeat,
            ..StoreLimits::for_world(world_size)
        };
        let server = match (rank, topology.store) {
            (0, StoreHost::RankZero) => Some(StoreServer::bind_with(
                &topology.master_addr,
                topology.master_port,
                world_size,
                topology.run_id.as_deref(),
                limits,
            )?),
            _ => None,
        }
        .map(Arc::new);
        let namespace = topology.store.namespace();
        let who = Membership {
            rank,
            world_size,
            run_id: topology.run_id.as_deref(),
            namespace: &namespace,
        };
        let (addr, port) = (&topology.master_addr, topology.master_port);
        let store = Store::join(addr, port, &who, settings.timeout, settings.heartbeat)?;
        let serving = server.clone();
        let own = store.own_addrs();
        store.when_job_ends(move |error| stop_now(rank, &error, serving.as_deref(), &own));
        crate::phase::enter(Phase::Working);
        if settings.trace.is_some() {
            crate::trace::start(&store.scoped("trace"), rank, world_size)?;
        }
        Ok(Job {
            topology: topology.clone(),
            selection,
            settings: settings.clone(),
            store: Arc::new(store),
            server,
            built: AtomicU64::new(0),
        })
    }

    /// Where this rank sits.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The backend `--backend` chose at launch, and why.
    pub fn selection(&self) -> &Selection {
        &self.selection
    }

    /// The rendezvous store, for a program's own out-of-band exchanges.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The settings the job was launched with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// How long any wait of this job may take (`--timeout`).
    pub fn timeout(&self) -> Duration {
        self.settings.timeout
    }

    /// Builds a communicator of `choice` over this job's ranks. Every rank must call it, in the
    /// same order (the n-th communicator of every rank meets under the same keys), and every
    /// rank must end up on the same backend: rank 0's decision rules, and a rank that would run
    /// another one fails saying so.
    pub fn communicator(&self, choice: BackendChoice) -> Result<Communicator> {
        let settings = &self.settings;
        let timeout = settings.timeout;
        let selection = match choice == settings.backend {
            true => self.selection.clone(),
            false => backend::select(choice)?,
        };
        let name = format!("comm{}", self.built.fetch_add(1, Ordering::SeqCst));
        let topology = &self.topology;
        let (rank, world_size) = (topology.rank, topology.world_size);
        let _span = crate::trace::Span::range(|| format!("communicator init ({})", selection.kind));
        let ours = selection.kind.to_string();
        let scope = self.store.scoped(&name);
        crate::phase::enter(Phase::Connecting);
        let chosen = scope.rank0_value("backend", &ours)?;
        if chosen != ours {
            return Err(CommError::Backend(format!(
                "rank 0 runs the {chosen} backend but this rank would run {selection}; \
                 give every rank the same --backend, or fix this node's CUDA/NCCL"
            )));
        }
        let comm = match selection.kind {
            BackendKind::Cpu => {
                let ip = match &topology.socket_ifname {
                    Some(name) => crate::host::interface_address(name)?,
                    None => self.store.local_ip(),
                };
                let plan = cpu::link_plan::LinkPlan {
                    wiring: cpu::Wiring {
                        transport: settings.transport,
                        copy: settings.copy,
                        refuse_cross_memory: false,
                        refuse_registered: false,
                        heartbeat: settings.heartbeat,
                    },
                    ip,
                    run_id: topology.run_id.clone(),
                    timeout,
                    traced: settings.trace.is_some(),
                };
                let linked = plan.connect(&scope.scoped("cpu"), None)?;
                Communicator::cpu(linked.transport, topology.local_rank)
                    .with_transport_line(linked.line)
                    .with_links(Arc::new(plan))
            }
            BackendKind::Nccl => {
                let ordinal = nccl::device_for(topology.local_rank, selection.gpus)?;
                // One GPU per rank: two ranks of one host on the same GPU are named here, in
                // one error on every rank, before NCCL would refuse them.
                nccl::check_one_gpu_per_rank(&scope, rank, world_size, ordinal)?;
                let nccl = scope.scoped("nccl");
                crate::phase::enter(Phase::NcclInit);
                let backend = NcclBackend::connect(&nccl, rank, world_size, ordinal, timeout)?;
                Communicator::nccl(backend, rank, world_size, topology.local_rank, ordinal)
            }
        };
        let comm = comm.with_store(self.store.clone(), &name);
        crate::phase::enter(Phase::Working);
        Ok(comm.with_algo(settings.algo).with_steps(settings.steps))
    }

    /// Ends the job for every rank because this one failed with `error`: the others stop at once
    /// instead of waiting for this rank until their timeout. Best effort. Not for the failures
    /// the others see by themselves (a timeout, a peer's or the store's loss): each of them then
    /// reports what it waited for, which is how the launcher finds the rank at the root; this
    /// rank only says it leaves knowingly, so that its exit is not taken for a rank vanishing.
    ///
    /// A rank that lost the store tells it nothing: a store gone silent would hold the request
    /// until this rank's own connection is found silent too. A peer found silent is news to
    /// tell: the others may not have noticed yet.
    pub fn abort(&self, error: &CommError) {
        let store_gone = matches!(
            error,
            CommError::StoreLost { .. }
                | CommError::StoreSilent { .. }
                | CommError::StoreUnreachable { .. }
        );
        let seen_by_all = matches!(
            error,
            CommError::Timeout { .. }
                | CommError::PeerClosed { .. }
                | CommError::PeerGone { .. }
                | CommError::PeerUnreachable { .. }
                | CommError::JobAborted { .. }
                | CommError::RankVanished { .. }
                | CommError::RankSilent { .. }
                | CommError::NodeSilent { .. }
                | CommError::NodeGone { .. }
        );
        if store_gone {
            return;
        }
        if seen_by_all {
            self.store.leave();
        } else {
            self.store.abort(error);
        }
    }

    /// After this rank failed: if it serves the store, keeps serving it while the other ranks
    /// are still connected, for at most a second, so that each of them fails by itself saying
    /// what it waited for (the launcher follows those reports to the root cause) instead of all
    /// losing the store the moment this rank exits. A second is enough: the others fail at
    /// about the same deadline, or stop at once on the abort key. Longer would keep a job whose
    /// rank was stopped (SIGSTOP), and so never disconnects, alive past its timeout.
    pub fn linger(&self) {
        if let Some(server) = &self.server {
            let longest = self.settings.timeout.min(LINGER);
            server.wait_until_only(&self.store.own_addrs(), longest);
        }
    }

    /// Ends the job cleanly: waits for every rank, then rank 0 keeps serving the store until the
    /// others have disconnected, so nobody loses it while waiting for an answer.
    pub fn finish(self) -> Result<()> {
        crate::phase::enter(Phase::Finishing);
        if let Some(file) = &self.settings.trace {
            crate::trace::write_part(file)?;
        }
        self.store.barrier("finish")?;
        // Every rank is here: closing the store's connections is no news now.
        self.store.leave();
        if let (Some(file), 0) = (&self.settings.trace, self.topology.rank) {
            crate::trace::merge(file, self.topology.world_size)?;
        }
        let timeout = self.settings.timeout;
        // Our own connection must close too before the server counts itself idle.
        drop(self.store);
        if let Some(server) = &self.server {
            server.wait_until_idle(timeout.min(Duration::from_secs(10)));
        }
        Ok(())
    }
}

/// Stops this rank now, from the store's watcher, because the job ended under it (another rank
/// failed or vanished, or the store is gone): reports `error` and exits, unless the main thread
/// reported a failure first (it then exits by itself). Shared-memory segments this process
/// created and has not yet unlinked go first, so nothing is left in /dev/shm. Rank 0 serves the
/// store a moment longer (up to 1 s), until the other ranks have read why the job ended and left.
///
/// The exit is [`crate::failure_record::exit_now`]: the rank's own thread may be inside NCCL or CUDA.
fn stop_now(rank: usize, error: &CommError, server: Option<&StoreServer>, own: &[SocketAddr]) {
    if crate::failure_record::reported() {
        return;
    }
    let code = crate::failure_record::report_failure(rank, error);
    crate::backend::cpu::remove_own_segments();
    if let Some(server) = server {
        server.wait_until_only(own, LINGER);
    }
    crate::failure_record::exit_now(code);
}

/// At most this long rank 0 keeps serving the store after it failed or the job ended under it.
const LINGER: Duration = Duration::from_secs(1);
