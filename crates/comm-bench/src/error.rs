//! What can go wrong in comm-bench, one variant per cause. Each message is the sentence the
//! program prints after `comm-bench: error: ` (or clap's `invalid value` for a size), so a
//! variant says what to change; the values it names travel with it for callers and tests.

use std::path::PathBuf;

use comm_core::backend::BackendKind;
use comm_core::spawn::Outcome;
use comm_core::CommError;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// `comm-bench store-load` could not start, drive or read a store.
    #[error("store-load: {0}")]
    Store(String),
    /// A size flag's value that is not a whole number with a known suffix.
    #[error(
        "{text:?} is not a size: write bytes as a whole number with K, M, G (x1024) or KB, MB, \
         GB (x1000), e.g. 64M or 100MB"
    )]
    NotASize { text: String },
    /// A size that does not fit in 64 bits.
    #[error("{text:?} is too large")]
    SizeTooLarge { text: String },
    #[error("-b/--minbytes must be at least 1 byte")]
    ZeroMinBytes,
    #[error("-b/--minbytes ({min}) is larger than -e/--maxbytes ({max})")]
    MinAboveMax { min: u64, max: u64 },
    #[error("-f/--stepfactor {0}: use 2 or more")]
    StepFactorBelowTwo(u64),
    #[error("-i/--stepbytes 0: use 1 or more")]
    ZeroStepBytes,
    #[error(
        "{min} to {max} bytes with that step makes more than 10000 sizes: use a larger -f or -i"
    )]
    TooManySizes { min: u64, max: u64 },
    /// A name in --collectives, -d or -o that comm-core does not know; its parser's sentence,
    /// which lists the names it knows.
    #[error("{0}")]
    UnknownName(String),
    #[error("--collectives, -d and -o each need at least one value")]
    EmptyList,
    #[error("--world-sizes: give one or more numbers of ranks, each at least 1")]
    NoWorldSize,
    #[error("--trace records one job: give one --world-sizes value (or none: the default)")]
    TraceOfSeveralJobs,
    #[error("-n/--iters 0: time at least one iteration")]
    ZeroIters,
    #[error(
        "-z/--blocking {0}: give 0 (back to back, one wait), 1 (wait for each iteration, then a \
         barrier, all timed) or 3 (wait for each iteration, the barrier not timed)"
    )]
    Blocking(u8),
    #[error(
        "-a/--average {0}: give 0 (rank 0's time), 1 (the mean over ranks), 2 (the fastest \
         rank's) or 3 (the slowest rank's)"
    )]
    Average(u8),
    #[error("-I/--per_iter_timing {0}: give 0 (off) or 1 (time each iteration)")]
    PerIterTiming(u8),
    #[error("-m/--agg_iters 0: aggregate at least one call per iteration")]
    ZeroAggIters,
    /// Every backend and world size asked for was skipped (the notes before it say why).
    #[error("nothing to run: every backend and world size was skipped")]
    NothingToRun,
    /// The ranks of one backend and world size failed or were interrupted; the others were
    /// stopped. Its exit code is the launch's. (Boxed: a failure's record is large, and every
    /// Result of comm-bench carries this enum.)
    #[error("{backend} with {world_size} ranks: {}", ranks_failed(outcome))]
    RanksFailed {
        backend: BackendKind,
        world_size: usize,
        outcome: Box<Outcome>,
    },
    /// From comm-core: a backend that cannot run, a rank count it refuses, a spawn that failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error("cannot create {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {}: {source}", path.display())]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    WriteFile {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A CSV file that could not be written (csv wraps the I/O error).
    #[error("cannot write {}: {source}", path.display())]
    WriteCsv { path: PathBuf, source: csv::Error },
    #[error("cannot write {}: {source}", path.display())]
    WriteJson {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// A CSV row that is not a result row; `line` is the file's line, where csv knows it (its
    /// message says it too).
    #[error("cannot read {}: {source}", path.display())]
    MalformedRow {
        path: PathBuf,
        line: Option<u64>,
        source: csv::Error,
    },
    #[error("cannot read {}: {source}", path.display())]
    MalformedJson {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("the files hold no rows: nothing to report")]
    NoRows,
    /// `comm-bench model` found no series it can fit.
    #[error("no series to fit: the model needs all_reduce, all_gather, reduce_scatter or broadcast measured at 3 sizes or more on 2 ranks or more")]
    NothingToFit,
    /// `comm-bench timeline` found no slice in a trace.
    #[error("no slice in {}: give a trace written by --trace", path.display())]
    NoSlices { path: PathBuf },
    /// `comm-bench grids` found no grid in a program's output.
    #[error("no grid in {}: give the output of an example (run with --steps to get every step)", path.display())]
    NoGrids { path: PathBuf },
    /// `comm-bench predict --system` names neither the built-in system nor a file.
    #[error(
        "--system {0:?}: no such system; give `leonardo` or the path of a TOML file \
         (crates/comm-bench/systems/leonardo.toml shows the fields)"
    )]
    UnknownSystem(String),
    /// A system's TOML that does not parse or holds an impossible value.
    #[error("--system {}: {why}", path.display())]
    BadSystem { path: PathBuf, why: String },
    #[error("{flag} 0: give at least 1")]
    PredictZero { flag: &'static str },
    #[error("{flag}: give a positive number")]
    PredictNotPositive { flag: &'static str },
    #[error(
        "--nodes {nodes} x --gpus-per-node {gpus_per_node} is more than 4096 GPUs, the most \
         the model is offered for: use fewer --nodes"
    )]
    PredictTooManyGpus { nodes: usize, gpus_per_node: usize },
    #[error(
        "--collectives {0}: the model covers all_reduce, all_gather, reduce_scatter, broadcast \
         and reduce"
    )]
    PredictUnsupported(String),
    /// `--calibrate` found no row the model covers.
    #[error(
        "--calibrate {}: no row of all_reduce, all_gather, reduce_scatter, broadcast or reduce \
         on 2 or more ranks with a time",
        path.display()
    )]
    NothingToCalibrate { path: PathBuf },
    /// plotters could not draw or save a chart.
    #[error("drawing a plot: {0}")]
    Plot(Box<dyn std::error::Error + Send + Sync>),
}

impl BenchError {
    /// The exit code of a failed launch of ranks, 1 for anything else that stops a run.
    pub fn exit_code(&self) -> i32 {
        match self {
            BenchError::RanksFailed { outcome, .. } => outcome.exit_code(),
            _ => 1,
        }
    }
}

fn ranks_failed(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Failed(f) => format!(
            "{}; the other ranks were stopped{}",
            f.describe(),
            f.others()
        ),
        Outcome::Stopped(reason) => format!("{reason}; the ranks were stopped"),
        _ => "interrupted: the ranks were stopped".into(),
    }
}
