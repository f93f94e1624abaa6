//! The plan: what to start (program, arguments, ranks per node, nodes, where rank 0 serves the
//! store), checked before anything starts; what a launcher adds to it; and a free port for a job
//! that picks its own.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use super::relay::RankOutput;
use crate::error::{CommError, Result};
use crate::topology::{Launcher, StoreHost, Topology};

// The job's bounds live with the job's shape, in topology (which spawn builds on).
pub use crate::topology::{MAX_LOCAL_RANKS, MAX_WORLD_SIZE};

/// Ranks per CPU core beyond which starting them earns a warning: they will mostly wait for a
/// core, and time out under load.
pub const RANKS_PER_CORE_WARNING: usize = 8;

/// Checks `nproc_per_node` ranks on each of `nnodes` nodes against [`MAX_LOCAL_RANKS`] and
/// [`MAX_WORLD_SIZE`], before anything starts; `flag` names what the user typed (e.g.
/// `--nproc-per-node`). Returns the world size.
pub fn check_ranks(flag: &str, nproc_per_node: usize, nnodes: usize) -> Result<usize> {
    if nproc_per_node == 0 || nnodes == 0 {
        return Err(CommError::Usage(format!(
            "{flag}: a job needs at least one rank on at least one node"
        )));
    }
    if nproc_per_node > MAX_LOCAL_RANKS {
        return Err(CommError::Usage(format!(
            "{flag} {nproc_per_node}: at most {MAX_LOCAL_RANKS} ranks on one node (this one has \
             {} CPU cores); each rank is a process with its own threads and sockets, so that many \
             would exhaust the node before the job starts",
            cores()
        )));
    }
    match nproc_per_node.checked_mul(nnodes) {
        Some(world) if world <= MAX_WORLD_SIZE => Ok(world),
        _ => Err(CommError::Usage(format!(
            "{flag}: {nproc_per_node} ranks on each of {nnodes} nodes is more than \
             {MAX_WORLD_SIZE} ranks, the most one job may have"
        ))),
    }
}

/// A warning, when `nproc_per_node` ranks are far more than this node's cores, else None.
pub fn oversubscription_warning(nproc_per_node: usize) -> Option<String> {
    let cores = cores();
    (nproc_per_node > RANKS_PER_CORE_WARNING * cores).then(|| {
        format!(
            "warning: {nproc_per_node} ranks on {cores} CPU core{}: more than \
             {RANKS_PER_CORE_WARNING} per core, they will mostly wait for a core (and may time out)",
            if cores == 1 { "" } else { "s" }
        )
    })
}

/// The CPU cores this process may use.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// What to start and how.
#[derive(Debug, Clone)]
pub struct SpawnPlan {
    /// The program every rank runs (this one, when it spawns itself).
    pub program: PathBuf,
    /// Arguments every rank gets, unchanged.
    pub args: Vec<OsString>,
    /// Ranks to start on this node.
    pub nproc_per_node: usize,
    /// Nodes in the job: the world size is nnodes × nproc_per_node.
    pub nnodes: usize,
    /// This node's index; its ranks are node_rank × nproc_per_node onwards.
    pub node_rank: usize,
    /// The host rank 0 serves the rendezvous store on, passed to the ranks as MASTER_ADDR.
    pub master_addr: String,
    /// The store's port, passed to the ranks as MASTER_PORT.
    pub master_port: u16,
    /// Prefix each relayed line with `[rank]: ` (commrun's default). Without it the ranks'
    /// stdout is this process's own, so lines keep the order the ranks wrote them in.
    pub prefix_output: bool,
    /// Time between SIGTERM and SIGKILL when stopping ranks.
    pub grace: Duration,
    /// The run the ranks belong to, passed as TORCHELASTIC_RUN_ID (None: ranks started by hand).
    pub run_id: Option<String>,
}

/// What a launcher adds to a [`SpawnPlan`] for one start of the ranks. The default adds
/// nothing: [`run`](super::run).
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// Variables every rank gets besides torchrun's (e.g. `TORCHELASTIC_RESTART_COUNT`).
    pub env: Vec<(String, String)>,
    /// Where each rank's output goes, by local rank; a rank past the end: the console.
    pub outputs: Vec<RankOutput>,
    /// A reason sent here stops the ranks (SIGTERM, then SIGKILL after the grace) and ends the
    /// launch as [`Outcome::Stopped`](super::Outcome::Stopped) with it, unless a rank failed
    /// first: the launcher heard of trouble that the ranks cannot (commrun: the store's node
    /// went silent while its ranks were still starting).
    pub stop: Option<crossbeam_channel::Receiver<String>>,
}

/// A port that is free right now on this machine, for a job that picks its own.
///
/// Rank 0 binds it a moment later, so it is picked below the kernel's ephemeral range
/// (`ip_local_port_range`), where no outgoing connection or `bind(0)` can take it meanwhile.
pub fn free_port() -> Result<u16> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(10_001));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64)
        ^ ((std::process::id() as u64) << 32);
    for attempt in 0..64u64 {
        let mixed =
            (seed ^ attempt.wrapping_mul(0x9e3779b97f4a7c15)).wrapping_mul(0xbf58476d1ce4e5b9);
        let port = low + ((mixed >> 33) % u64::from(high - low)) as u16;
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return Ok(port);
        }
    }
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| CommError::io("finding a free port for the rendezvous store", e))
}

/// Checks a plan before anything starts: the ranks' counts ([`check_ranks`]) and this node's
/// index; warns on stderr when the ranks far outnumber the cores. Returns the world size.
pub(super) fn check(plan: &SpawnPlan) -> Result<usize> {
    let world_size = check_ranks("--nproc-per-node", plan.nproc_per_node, plan.nnodes)?;
    if plan.node_rank >= plan.nnodes {
        return Err(CommError::Usage(format!(
            "node rank {} but {} nodes: node ranks go from 0 to {}",
            plan.node_rank,
            plan.nnodes,
            plan.nnodes - 1
        )));
    }
    // Rank 0 runs on node 0 and serves the store there.
    crate::descriptors::check_launcher(plan.nproc_per_node, world_size, plan.node_rank == 0)?;
    if let Some(warning) = oversubscription_warning(plan.nproc_per_node) {
        eprintln!("{warning}");
    }
    Ok(world_size)
}

impl SpawnPlan {
    /// `nproc` ranks of `program args` on this machine alone, at a free port, under a fresh run
    /// id: how a program starts its own ranks (self-spawn, comm-bench's runs).
    pub fn local(program: PathBuf, args: Vec<OsString>, nproc: usize) -> Result<SpawnPlan> {
        Ok(SpawnPlan {
            program,
            args,
            nproc_per_node: nproc,
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: free_port()?,
            prefix_output: false,
            grace: Duration::from_secs(3),
            run_id: Some(crate::topology::fresh_run_id()),
        })
    }

    /// The job's rank of this node's `local_rank`.
    pub(super) fn rank(&self, local_rank: usize) -> usize {
        self.node_rank * self.nproc_per_node + local_rank
    }

    /// Where local rank `local_rank` sits in the job, as its variables will tell it.
    pub(super) fn topology(&self, world_size: usize, local_rank: usize) -> Topology {
        Topology {
            rank: self.rank(local_rank),
            world_size,
            local_rank,
            local_world_size: self.nproc_per_node,
            node_rank: self.node_rank,
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            launcher: Launcher::Torchrun,
            run_id: self.run_id.clone(),
            // A worker reads GLOO_SOCKET_IFNAME itself, from the environment it inherits.
            socket_ifname: None,
            store: StoreHost::RankZero,
        }
    }
}
