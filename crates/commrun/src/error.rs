//! What can stop commrun before or while it starts the workers, one variant per cause. Each
//! message is the sentence commrun prints after `commrun: error: ` (for a flag's value, after
//! clap's `invalid value … for '--flag'`), saying what to change; a worker's own failure is not
//! an error here but the run's outcome (summary.rs).

use std::io;
use std::path::PathBuf;

use comm_core::CommError;

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    // Flag values, refused by clap's value parsers.
    #[error("start at least one worker")]
    NoWorkers,
    #[error("give a number of workers, or gpu, cpu or auto")]
    NotAWorkerCount,
    #[error("give a number of restarts, 0 or more")]
    NotARestartCount,
    #[error("a job needs at least one node")]
    NoNodes,
    #[error("give a number of nodes")]
    NotANodeCount,
    #[error("elastic ranges ({min} to {max} nodes) are not supported: give one number")]
    ElasticNodes { min: usize, max: usize },
    /// A `--redirects`/`--tee` value that is not 0-3; `local_rank` when it was one rank's.
    #[error("{}", not_streams(value, *local_rank))]
    NotStreams {
        value: String,
        local_rank: Option<usize>,
    },
    #[error("{0:?} is not LOCAL_RANK:VALUE (such as 0:3)")]
    NotARankPair(String),
    #[error("local rank {0} is given twice")]
    RankGivenTwice(usize),
    #[error("{0:?} is not a local rank (0, 1, …)")]
    NotALocalRank(String),

    // Flags that contradict each other or this machine.
    #[error(
        "--rdzv-backend {0}: commrun's rendezvous is the store rank 0 serves (torchrun's c10d or \
         static); drop the flag or give one of those"
    )]
    RdzvBackend(String),
    #[error(
        "--nproc-per-node gpu: this machine shows no GPU (no CUDA_VISIBLE_DEVICES, nothing in \
         /proc/driver/nvidia/gpus); give a number"
    )]
    NoGpu,
    #[error("--shutdown-timeout {0}: give a number of seconds, 0 or more")]
    ShutdownTimeout(f64),
    #[error(
        "under srun commrun runs once per node, but this step has {tasks} tasks on node {node} \
         (SLURM_NTASKS_PER_NODE): start it with srun --ntasks-per-node=1 --ntasks=$SLURM_NNODES \
         commrun ..."
    )]
    TasksPerNode { tasks: usize, node: usize },
    #[error(
        "--standalone is one node on this machine, but --nnodes {0}: give --master-addr (and \
         --node-rank) instead"
    )]
    StandaloneNodes(usize),
    #[error(
        "--nnodes {nnodes} needs --node-rank on every node (0 on the node that runs rank 0, then \
         1 to {}): two nodes that both think they are node 0 fail in confusing ways",
        nnodes - 1
    )]
    NodeRankNeeded { nnodes: usize },
    #[error(
        "--node-rank {node_rank} but --nnodes {nnodes}: node ranks go from 0 to {}",
        nnodes - 1
    )]
    NodeRankOutOfRange { node_rank: usize, nnodes: usize },
    #[error(
        "--max-restarts {max_restarts} with {nnodes} nodes: commrun restarts the workers of one \
         node only, and the commruns of several nodes cannot agree to restart together; drop \
         --max-restarts (or run on one node), and restart the whole job instead (e.g. a loop \
         around srun, or sbatch --requeue)"
    )]
    RestartsOnNodes { max_restarts: u32, nnodes: usize },
    #[error("{flag} names local rank {rank}, but this node runs local ranks 0 to {}", nproc - 1)]
    NoSuchLocalRank {
        flag: &'static str,
        rank: usize,
        nproc: usize,
    },
    #[error("--master-addr is empty")]
    EmptyMasterAddr,
    #[error(
        "--nnodes {nnodes} needs the address of node 0 on every node: --master-addr HOST (or \
         --rdzv-endpoint HOST:PORT); under Slurm that is the first host of $SLURM_JOB_NODELIST"
    )]
    MasterAddrNeeded { nnodes: usize },
    #[error("--rdzv-endpoint {0:?}: give HOST or HOST:PORT")]
    BadEndpoint(String),
    #[error("--rdzv-endpoint {endpoint:?}: {port:?} is not a port (1-65535)")]
    BadEndpointPort { endpoint: String, port: String },

    // The program to start.
    #[error("no program given")]
    NoProgram,
    #[error("program {}: {source}", path.display())]
    ProgramUnreadable { path: PathBuf, source: io::Error },
    #[error("program {} is a directory", .0.display())]
    ProgramIsDirectory(PathBuf),
    #[error(
        "program {} is not executable (chmod +x it, or run it through its interpreter)",
        .0.display()
    )]
    ProgramNotExecutable(PathBuf),
    #[error(
        "program {shown} not found on PATH (give a path such as ./{shown} or \
         target/release/{shown})",
        shown = .0.display()
    )]
    ProgramNotFound(PathBuf),

    // The node and its files.
    #[error(
        "port {0} is already in use on this host (another job, or a leftover worker?): rank 0 \
         serves the rendezvous store there; pick another with --master-port"
    )]
    PortInUse(u16),
    #[error("--log-dir {} is a file, not a directory", .0.display())]
    LogDirIsFile(PathBuf),
    #[error("--log-dir {}: cannot make it: {source}", path.display())]
    MakeLogDir { path: PathBuf, source: io::Error },
    #[error("cannot make a log directory in the temporary folder: {0}")]
    MakeTempLogDir(#[source] io::Error),
    /// The run's own folder inside the log directory.
    #[error("--log-dir {}: {source}", path.display())]
    MakeRunDir { path: PathBuf, source: io::Error },
    /// A local rank's folder of one attempt.
    #[error("cannot make log folder {}: {source}", path.display())]
    MakeRankLogDir { path: PathBuf, source: io::Error },

    /// Slurm's variables contradict themselves or are missing one.
    #[error("{0} (commrun under srun reads SLURM_* variables)")]
    Slurm(#[source] CommError),
    /// From comm-core: a rank count it refuses, no free port, a spawn that failed.
    #[error(transparent)]
    Comm(#[from] CommError),
}

fn not_streams(value: &str, local_rank: Option<usize>) -> String {
    let what = format!("{value:?} is not 0 (none), 1 (stdout), 2 (stderr) or 3 (both)");
    match local_rank {
        Some(rank) => format!("local rank {rank}: {what}"),
        None => format!("{what}, nor LOCAL_RANK:VALUE pairs such as 0:3,1:2"),
    }
}
