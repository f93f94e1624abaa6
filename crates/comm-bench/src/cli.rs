//! The command line: nccl-tests' flags where they fit, the course's runs as presets, and
//! `comm-bench report` to turn result files into plots and tables.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use comm_core::settings::backend_choices;
use comm_core::{BackendChoice, JobArgs};

use crate::units::SweepArgs;

/// What is timed, for `--help` (docs/src/benchmarking.md says the same at more length).
pub const TIMING_HELP: &str = "\
WHAT IS TIMED
  As nccl-tests times it. For each collective, size and placement (out-of-place, then in-place)
  every rank sets up its buffers, runs -w warm-up iterations untimed, meets the others at a
  barrier, then runs -n timed iterations, each of -m calls (one NCCL group when -m > 1). Waits are
  for the device's work: on NCCL the stream is waited for, so times include the GPU's work.
  A rank's time is the host clock's (a steady clock, as nccl-tests' timer), per call:
  -z 0 (default, nccl-tests' default): from the first launch to the end of the last call's work,
    the iterations enqueued back to back and waited for once; / (iterations x -m). Launch costs
    hide behind the previous call's work, as in a training loop.
  -z 1: the whole loop, each iteration waited for and followed by a barrier that is counted;
    / (iterations x -m).
  -z 3: each iteration from its launch to the end of its work, summed, the barrier between
    iterations not counted; / (iterations x -m): the latency of one collective on its own.
  (nccl-tests' -z 2, a wait and no barrier, is not offered.) The table's time is the ranks' times
  combined as -a says, as nccl-tests' -a: 0 rank 0's, 1 (default) the mean over ranks, 2 the
  fastest rank's, 3 the slowest rank's. The ranks' times travel after the loop, outside it.
  Per iteration: each iteration's time is the slowest rank's; with -I 1 (nccl-tests'
  per-iteration timing) it is read between marks on the rank's own clock of its work, CUDA events
  on the rank's stream on NCCL (cuEventElapsedTime: with -z 0 and -z 1 one mark before each
  iteration and one after the last, so -z 1's includes the barrier; with -z 3 a pair around each
  iteration's calls), the host clock on the CPU backend. Without -I they come from the host clock
  where the loop waits for each iteration (-z 1, -z 3); -z 0 then has one, the loop's. Their
  median (the upper middle, nccl-tests' p50), min and max are in --csv and --json
  (time_us_median, time_us_min, time_us_max, and iter_clock says which clock), beside time_us,
  the table's time.
  The CPU backend's collectives complete before they return, so -z 0 there means back to back
  with no barrier between calls, and -m just repeats the call. CUDA graphs (nccl-tests' -G) are
  not used.

  algbw = size / time (GB/s, 10^9 bytes per second), size being the whole buffer a rank sends or
  receives: the gathered buffer for all_gather, the buffer before scattering for reduce_scatter.
  busbw = algbw x a factor that makes it comparable to a link's speed whatever the world size n
  (nccl-tests' PERFORMANCE.md; BUS FACTORS below lists each collective's).

  #wrong: after the timing, the collective runs -c more times on fresh inputs (small whole numbers,
  so float sums are exact in any order) and each rank compares every element of its result with a
  sequential reference; the column is the sum over ranks. Any wrong element makes the exit code 1.

RANKS
  Started plainly, comm-bench starts one process per rank on this machine for each --world-sizes
  entry (capped by the GPUs when NCCL runs) and prints one table per collective and world size.
  Started by srun, torchrun or commrun it is one rank of that launch, and --world-sizes is ignored.

EXAMPLES
  comm-bench -b 8 -e 128M -f 2                           # all_reduce_perf's sweep, one table
  comm-bench --collectives all --world-sizes 2,4 --csv r.csv
  comm-bench --preset allreduce-sweep --csv cpu.csv      # the course's 1 MB-1 GB x 2/4/6 sweep
  comm-bench report cpu.csv gpu.csv -o report/           # plots, tables, observations";

/// [`TIMING_HELP`], then every collective's bus factor from the table.
fn timing_help() -> String {
    let mut help = format!("{TIMING_HELP}\n\nBUS FACTORS (busbw / algbw on n ranks)\n");
    for c in comm_core::Collective::ALL {
        help += &format!("  {:<16}{}\n", c.name(), c.describe().bus_rule);
    }
    help
}

#[derive(Debug, Parser)]
#[command(
    name = "comm-bench",
    version,
    about = "Times collectives on any backend the way nccl-tests does: size, count, time, algbw, busbw, #wrong",
    after_long_help = timing_help(),
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub bench: BenchArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Combines result files (--csv or --json output, from any machines) into PNG and SVG plots,
    /// markdown tables and observations.
    Report(ReportArgs),
    /// Draws the grids an example printed (run it with --steps to get every step of the
    /// algorithm) as one SVG: changed cells orange, final ones green.
    Grids(GridsArgs),
    /// Draws a trace (--trace FILE) as an SVG timeline: a lane per rank, a box per call, send
    /// and receive, an arrow per message.
    Timeline(TimelineArgs),
    /// Predicts nccl-tests' table for a described cluster from NCCL's own cost model (tuning.cc
    /// of NCCL v2.21.5), with the algorithm and protocol NCCL would choose; `--calibrate` fits it
    /// to a real sweep, `--csv` and `--plot` put it beside measurements.
    Predict(Box<crate::predict::PredictArgs>),
    /// Fits Hockney's latency-bandwidth model (t = steps x alpha + bytes / B, B from cache below a
    /// knee and from memory above it) to result files, through each algorithm's steps: per series
    /// alpha, B, the half-peak size, the error and what the fit shows in words; --table adds each
    /// size's error and regime.
    Model(ModelArgs),
    /// Plays the rendezvous of N ranks (two connections each: join, a barrier, rank 0's value)
    /// against our store and against PyTorch's TCPStore (libuv), from a few threads, and prints
    /// the time until every rank is through, with each server's CPU time and peak memory.
    StoreLoad(StoreLoadArgs),
}

#[derive(Debug, Clone, Args)]
pub struct StoreLoadArgs {
    /// Numbers of simulated ranks, comma-separated, one rendezvous each.
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_values_t = [256, 1024, 4096])]
    pub ranks: Vec<usize>,

    /// Which stores: ours, torch, or both (torch from scripts/torch-env.sh's environment, or
    /// --python).
    #[arg(long, value_name = "WHICH", default_value = "both",
          value_parser = ["ours", "torch", "both"])]
    pub store: String,

    /// Threads driving the simulated ranks.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub threads: usize,

    /// Rounds per store and rank count, alternating between the stores; each store's best is
    /// reported.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub rounds: usize,

    /// The python with torch [default: the torch environment's, ~/.cache/nccl-workshop/torch-venv].
    #[arg(long, value_name = "PYTHON")]
    pub python: Option<PathBuf>,

    /// Seconds one rendezvous may take.
    #[arg(long, value_name = "SECONDS", default_value_t = 120.0)]
    pub timeout: f64,

    /// Internal: serve our store for a job of N ranks, print its port, serve until stdin closes.
    #[arg(long, hide = true, value_name = "N")]
    pub serve: Option<usize>,
}

#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// CSV or JSON files written by comm-bench --csv/--json.
    #[arg(required = true, value_name = "FILES")]
    pub files: Vec<PathBuf>,

    /// Print each size's measured and modelled time, error, algorithm and regime under its
    /// series' summary.
    #[arg(long)]
    pub table: bool,
}

#[derive(Debug, Clone, Args)]
pub struct TimelineArgs {
    /// The trace, as --trace wrote it.
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,

    /// The SVG to write.
    #[arg(short, long, value_name = "FILE", default_value = "timeline.svg")]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct GridsArgs {
    /// A file holding what the example printed.
    #[arg(value_name = "OUTPUT")]
    pub output: PathBuf,

    /// The SVG to write.
    #[arg(short, long, value_name = "FILE", default_value = "grids.svg")]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// CSV or JSON files written by comm-bench --csv/--json.
    #[arg(required = true, value_name = "FILES")]
    pub files: Vec<PathBuf>,

    /// Folder for the plots and report.md (created if missing).
    #[arg(short, long, value_name = "DIR", default_value = "comm-bench-report")]
    pub out: PathBuf,
}

/// The course's three measurements, one flag each; explicit flags override a preset's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// The course's micro-profiler: all_reduce, all_gather and reduce_scatter of 1M, 4M and 16M
    /// floats (4, 16 and 64 MiB). After the tables it prints the course's lines (`AllReduce:
    /// 0.090 ms | AlgBW: … | BusBW: …`) and writes them to
    /// profile_{backend}_world{N}_{timestamp}.txt in --out-dir.
    Profiler,
    /// The course's all-reduce benchmark: 1 MB, 10 MB, 100 MB and 1 GB, in place, on 2, 4 and 6
    /// ranks (capped by the GPUs on NCCL and by this machine's memory). Writes the course's files
    /// into --out-dir: the CSVs, the time, bandwidth and 100 MB plots, full_results.md,
    /// summary_by_config.md and analysis.txt.
    AllreduceSweep,
    /// The course's Gloo vs NCCL timing: a 100 MB all-reduce on 2 ranks, on the CPU backend and on NCCL
    /// (where it can run).
    CpuVsNccl,
}

/// Which of nccl-tests' two runs per size to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Placements {
    /// Out-of-place (separate send and receive buffers), then in-place.
    Both,
    OutOfPlace,
    InPlace,
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Run one of the course's measurements (explicit flags still override its values).
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,

    /// Collectives to time, comma-separated, or "all": nccl-tests' names, listed under BUS
    /// FACTORS below (all_reduce, all_gather, alltoall, gather, ...) [default: all_reduce].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub collectives: Option<Vec<String>>,

    #[command(flatten)]
    pub sweep: SweepArgs,

    /// Timed iterations per size and placement [default: 20].
    #[arg(short = 'n', long = "iters", value_name = "N")]
    pub iters: Option<usize>,

    /// Untimed warm-up iterations before them [default: 5].
    #[arg(short = 'w', long = "warmup_iters", value_name = "N")]
    pub warmup: Option<usize>,

    /// How the timed iterations wait, as nccl-tests' -z: 0 enqueues them back to back and waits
    /// once; 1 waits for each iteration, then a barrier, the barriers timed too; 3 waits for
    /// each iteration and times it alone, the barrier between iterations not timed. Time = the
    /// host clock's over the calls (see WHAT IS TIMED below). On the CPU backend every call completes before it
    /// returns: 0 runs the calls back to back with no barrier between them [default: 0].
    #[arg(short = 'z', long = "blocking", value_name = "0|1|3")]
    pub blocking: Option<u8>,

    /// How the ranks' times become the table's, as nccl-tests' -a: 0 rank 0's, 1 the mean over
    /// ranks (of each rank's mean over iterations), 2 the fastest rank's, 3 the slowest rank's
    /// [default: 1].
    #[arg(short = 'a', long = "average", value_name = "0|1|2|3")]
    pub average: Option<u8>,

    /// Per-iteration timing, as nccl-tests' -I 1: each iteration timed between CUDA events on
    /// the rank's stream (NCCL; the host clock on the CPU backend), the slowest rank's per
    /// iteration; their median, min and max go to --csv and --json [default: 0].
    #[arg(short = 'I', long = "per_iter_timing", value_name = "0|1")]
    pub per_iter_timing: Option<u8>,

    /// Calls per timed iteration, enqueued as one NCCL group (nccl-tests' -m); times are per
    /// call. On the CPU backend the calls simply run one after another [default: 1].
    #[arg(short = 'm', long = "agg_iters", value_name = "N")]
    pub agg_iters: Option<usize>,

    /// Correctness checks after the timing: 0 turns them off [default: 1].
    #[arg(short = 'c', long = "check", value_name = "N")]
    pub check: Option<usize>,

    /// Element types, comma-separated, or "all": float, double, int32, int64 [default: float].
    #[arg(
        short = 'd',
        long = "datatype",
        value_delimiter = ',',
        value_name = "LIST"
    )]
    pub dtypes: Option<Vec<String>>,

    /// Reductions for all_reduce, reduce and reduce_scatter, comma-separated, or "all": sum,
    /// prod, min, max, avg [default: sum].
    #[arg(short = 'o', long = "op", value_delimiter = ',', value_name = "LIST")]
    pub ops: Option<Vec<String>>,

    /// Root rank of broadcast and reduce [default: 0].
    #[arg(short = 'r', long = "root", value_name = "RANK")]
    pub root: Option<usize>,

    /// Backends, comma-separated: auto (NCCL where a GPU and libnccl are usable, else the CPU),
    /// cpu, nccl. Each is measured in turn [default: auto].
    #[arg(long, value_parser = backend_choices(), value_delimiter = ',', value_name = "LIST")]
    pub backend: Option<Vec<BackendChoice>>,

    /// Numbers of ranks to start on this machine, comma-separated, one run each
    /// [default: one per GPU, or 4 on the CPU backend].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub world_sizes: Option<Vec<usize>>,

    /// Measure on groups of this many consecutive ranks (Communicator::split, the
    /// tensor-parallel groups of a mesh), every group at once: on 8 ranks, 2 makes four groups
    /// and four collectives in flight together. The table is group 0's.
    #[arg(long, value_name = "N")]
    pub group_size: Option<usize>,

    /// Out-of-place, in-place or both (nccl-tests times both) [default: both].
    #[arg(long, value_enum, value_name = "WHICH")]
    pub placement: Option<Placements>,

    /// Also write the same rows as a JSON array.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Folder for the course's files that --preset profiler and --preset allreduce-sweep write
    /// (created if missing) [default: the current directory for profiler,
    /// results/distributed_communication for allreduce-sweep, as the course names it].
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,

    /// The job flags every program shares: --transport, --copy, --timeout, --algo, --trace,
    /// --master-addr, --master-port.
    #[command(flatten)]
    pub job: JobArgs,

    /// Test hook: after each checked collective, add 1 to one element of one rank's result, so
    /// the check must count it and the exit code be non-zero.
    #[arg(long, hide_short_help = true)]
    pub inject_error: bool,

    /// Internal: set by comm-bench on the ranks it starts (rank 0 reports to this file).
    #[arg(long, hide = true, value_name = "FILE")]
    pub child_events: Option<PathBuf>,

    /// Internal: the one backend a rank started by comm-bench measures.
    #[arg(long, hide = true, value_parser = backend_choices())]
    pub child_backend: Option<BackendChoice>,
}
