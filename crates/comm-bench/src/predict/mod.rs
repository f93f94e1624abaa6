//! `comm-bench predict`: what NCCL's own cost model (tuning.cc of NCCL v2.21.5-1) says a
//! collective takes on a described cluster, printed as nccl-tests' table with the algorithm and
//! protocol NCCL would choose, written as comm-bench's CSV so `comm-bench report` plots it beside
//! measurements, and fitted to a real sweep with `--calibrate`.
//!
//! - `crate::model::nccl`: the port of tuning.cc (latencies, bandwidths, the choice), beside the
//!   α–β fit among comm-bench's models
//! - [`system`]: the cluster's description (TOML) and the stand-in for NCCL's topology search
//! - [`calibrate`]: the least-squares fit of the two scales to a measured CSV
//! - [`layouts`]: where a tensor- and data-parallel job's groups go, inside nodes or across

pub mod calibrate;
pub mod layouts;
pub mod system;

use std::path::PathBuf;

use clap::Args;
use comm_core::collective::Span;
use comm_core::Collective;

use self::system::System;
use crate::error::BenchError;
use crate::model::nccl::{self, Choice, NCCL_TAG};
use crate::units::{self, SweepArgs, SweepDefaults};

use crate::record::{self, Row};

/// The most GPUs the model is offered for (the range; NCCL's tables were tuned well
/// below Leonardo's 13824).
pub const MAX_GPUS: usize = 4096;

/// What the model leaves out, printed under every table.
pub const LEFT_OUT: &str = "\
# Left out: congestion and other jobs sharing the network; the network's taper (Leonardo's
#   Dragonfly+ is not a full fat tree) and adaptive routing; NVLS, CollNet/SHARP and PAT; NCCL's
#   real topology search (a simple stand-in picks channels and speeds); the tuner plugin, chunk
#   and thread-count choices; per-call launch cost of nccl-tests' loop; GPU clocks and memory.";

#[derive(Debug, Clone, Args)]
pub struct PredictArgs {
    /// `leonardo` (built in), or a TOML file describing a cluster (see
    /// crates/comm-bench/systems/leonardo.toml for the fields).
    #[arg(long, value_name = "NAME|FILE", default_value = "leonardo")]
    pub system: String,

    /// Nodes (1 to 4096 GPUs in all).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub nodes: usize,

    /// GPUs per node [default: the system's].
    #[arg(long, value_name = "G")]
    pub gpus_per_node: Option<usize>,

    /// NIC ports per node [default: the system's].
    #[arg(long, value_name = "N")]
    pub nics_per_node: Option<usize>,

    /// Line rate per NIC port, Gbit/s [default: the system's].
    #[arg(long, value_name = "GBITS")]
    pub nic_gbps: Option<f64>,

    #[arg(long, value_delimiter = ',', value_name = "LIST", help = collectives_help())]
    pub collectives: Option<Vec<String>>,

    #[command(flatten)]
    pub sweep: SweepArgs,

    /// Plot the predictions (and the --calibrate sweep) with `comm-bench report`'s charts into
    /// this folder.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,

    /// A comm-bench CSV of a real sweep on this cluster: fit the bandwidth and latency scales
    /// to it, print them with each point's error, then predict with them.
    #[arg(long, value_name = "CSV")]
    pub calibrate: Option<PathBuf>,

    /// Multiply every bandwidth of the model by this [default: the system's, 1].
    #[arg(long, value_name = "X")]
    pub bw_scale: Option<f64>,

    /// Multiply every latency of the model by this [default: the system's, 1].
    #[arg(long, value_name = "X")]
    pub lat_scale: Option<f64>,

    /// Compare where a tensor- and data-parallel job's groups go, for a transformer of this size
    /// (1.3B, 7B, 13B, 30B, 70B, or LAYERSxHIDDEN): tensor parallel inside each node or across
    /// nodes, at 2 to 64 nodes, per training step.
    #[arg(long, value_name = "MODEL")]
    pub layouts: Option<String>,

    /// With --layouts: ranks in each tensor-parallel group [default: the node's GPUs].
    #[arg(long, value_name = "N", requires = "layouts")]
    pub tp: Option<usize>,

    /// With --layouts: tokens in a sequence.
    #[arg(long, value_name = "TOKENS", default_value_t = 4096)]
    pub seq: usize,

    /// With --layouts: sequences per data-parallel rank in a step.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub micro_batch: usize,
}

/// `--collectives`' help: the collectives NCCL's model covers, as its table names them.
fn collectives_help() -> String {
    let names: Vec<&str> = nccl::modelled().map(|c| c.name()).collect();
    format!(
        "Collectives, comma-separated: {}, or \"all\" [default: all_reduce]",
        names.join(", ")
    )
}

/// One predicted line of the table.
struct Line {
    row: Row,
    choice: Option<Choice>,
}

/// Runs `comm-bench predict`: prints the tables, writes what was asked for.
pub fn run(args: &PredictArgs) -> Result<(), BenchError> {
    let mut system = resolve(args)?;
    if let Some(model) = &args.layouts {
        let table = layouts::comparison(&system, model, args.tp, args.seq, args.micro_batch)?;
        print!("{table}{}", footer(&system));
        return Ok(());
    }
    let collectives = collectives(args)?;
    let sizes = units::sizes(
        &args.sweep,
        SweepDefaults {
            min: 8,
            max: 8 << 30,
            factor: 2,
        },
    )?;
    let calibrated = match &args.calibrate {
        Some(path) => {
            let fit = calibrate::calibrate(&system, path)?;
            print_fit(&fit, path);
            system.calibration = fit.calibration.clone();
            true
        }
        None => false,
    };
    print!("{}", header(&system, args.nodes));
    let mut rows = Vec::new();
    for &coll in &collectives {
        let lines = predict(&system, args.nodes, coll, &sizes, calibrated);
        print!("{}", table(coll, &lines));
        rows.extend(lines.into_iter().map(|l| l.row));
    }
    print!("{}", footer(&system));
    if let Some(path) = &args.sweep.csv {
        record::write_csv(path, &rows)?;
        println!("wrote {}", path.display());
    }
    if let Some(dir) = &args.plot {
        plot(dir, &rows, args.calibrate.as_ref())?;
    }
    Ok(())
}

/// The system with the flags applied, checked.
fn resolve(args: &PredictArgs) -> Result<System, BenchError> {
    let mut s = System::load(&args.system)?;
    if let Some(g) = args.gpus_per_node {
        s.gpus_per_node = g;
    }
    let positive = |v: Option<usize>, flag: &'static str| match v {
        Some(0) => Err(BenchError::PredictZero { flag }),
        _ => Ok(()),
    };
    positive(Some(args.nodes), "--nodes")?;
    positive(Some(s.gpus_per_node), "--gpus-per-node")?;
    positive(args.nics_per_node, "--nics-per-node")?;
    let gpus = args.nodes.saturating_mul(s.gpus_per_node);
    if gpus > MAX_GPUS {
        return Err(BenchError::PredictTooManyGpus {
            nodes: args.nodes,
            gpus_per_node: s.gpus_per_node,
        });
    }
    if let Some(n) = args.nics_per_node {
        s.net.nics_per_node = n;
    }
    let scales = [
        (args.nic_gbps, "--nic-gbps"),
        (args.bw_scale, "--bw-scale"),
        (args.lat_scale, "--lat-scale"),
    ];
    for (value, flag) in scales {
        if value.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
            return Err(BenchError::PredictNotPositive { flag });
        }
    }
    s.net.nic_gbps = args.nic_gbps.unwrap_or(s.net.nic_gbps);
    s.calibration.bw_scale = args.bw_scale.unwrap_or(s.calibration.bw_scale);
    s.calibration.lat_scale = args.lat_scale.unwrap_or(s.calibration.lat_scale);
    Ok(s)
}

fn collectives(args: &PredictArgs) -> Result<Vec<Collective>, BenchError> {
    let names = args
        .collectives
        .clone()
        .unwrap_or(vec!["all_reduce".into()]);
    if names.iter().any(|n| n == "all") {
        return Ok(Collective::ALL
            .into_iter()
            .filter(|&c| nccl::supported(c))
            .collect());
    }
    names
        .iter()
        .map(|n| {
            let c: Collective = n.parse().map_err(BenchError::UnknownName)?;
            if nccl::supported(c) {
                Ok(c)
            } else {
                Err(BenchError::PredictUnsupported(c.name().into()))
            }
        })
        .collect()
}

/// nccl-tests' element count and size for a requested size: floats; a collective with a buffer
/// of the world's blocks (the table's spans: all_gather, reduce_scatter) counts per rank, the size
/// being the whole buffer (so rounded to n × 4 bytes).
fn shape(coll: Collective, bytes: u64, ranks: usize) -> (u64, u64) {
    let d = coll.describe();
    let blocked = [d.send, d.recv].contains(&Span::WorldBlocks);
    let per = if blocked { 4 * ranks as u64 } else { 4 };
    // The count column is the call's, as comm-bench's and nccl-tests' tables print it.
    let count = bytes / per;
    (count, count * per)
}

/// The lines of one collective's table.
fn predict(
    system: &System,
    nodes: usize,
    coll: Collective,
    sizes: &[u64],
    calibrated: bool,
) -> Vec<Line> {
    let topo = system.topo(nodes);
    let mut seen = Vec::new();
    let mut lines = Vec::new();
    for &asked in sizes {
        let (count, bytes) = shape(coll, asked, topo.ranks);
        if count == 0 || seen.contains(&bytes) {
            continue;
        }
        seen.push(bytes);
        let choice = nccl::choose(&topo, coll, bytes);
        // One GPU: NCCL's model stops (tuning.cc:137); a copy through memory stands in.
        let time_us = choice.map_or(2.0 * bytes as f64 / (system.gpu_memory_gbs * 1000.0), |c| {
            c.time_us
        });
        let row = row(system, &topo, coll, count, bytes, time_us, calibrated);
        lines.push(Line { row, choice });
    }
    lines
}

fn row(
    system: &System,
    topo: &nccl::Topo,
    coll: Collective,
    count: u64,
    bytes: u64,
    time_us: f64,
    calibrated: bool,
) -> Row {
    let seconds = time_us * 1e-6;
    let d = coll.describe();
    let (reduces, rooted) = (d.reduces, d.rooted);
    Row {
        backend: backend_name(calibrated),
        collective: coll.name().into(),
        world_size: topo.ranks,
        nodes: topo.nodes,
        bytes,
        count,
        dtype: "float".into(),
        redop: if reduces { "sum" } else { "none" }.into(),
        root: if rooted { 0 } else { -1 },
        placement: "out-of-place".into(),
        warmup: 0,
        iters: 1,
        blocking: 0,
        agg_iters: 1,
        average: None,
        per_iter_timing: 0,
        time_us,
        time_us_median: time_us,
        time_us_min: time_us,
        time_us_max: time_us,
        iter_clock: "model".into(),
        algbw_gbps: comm_core::timing::algbw(bytes as usize, seconds),
        busbw_gbps: comm_core::timing::busbw(coll, topo.ranks, bytes as usize, seconds),
        wrong: None,
        host: record::host(),
        machine: system.description.clone(),
        backend_version: format!("NCCL {NCCL_TAG} tuning.cc model"),
        comm_bench_version: env!("CARGO_PKG_VERSION").into(),
        started: record::utc_now(),
    }
}

/// The CSV's backend: its own series in `comm-bench report`, apart from measurements.
pub fn backend_name(calibrated: bool) -> String {
    let tag = NCCL_TAG.trim_start_matches('v').trim_end_matches("-1");
    if calibrated {
        format!("model:nccl-{tag} (calibrated)")
    } else {
        format!("model:nccl-{tag}")
    }
}

fn header(system: &System, nodes: usize) -> String {
    let topo = system.topo(nodes);
    format!(
        "# comm-bench predict: NCCL {NCCL_TAG}'s cost model (src/graph/tuning.cc), not a \
         measurement\n\
         # System: {}\n\
         # {nodes} node(s) x {} GPUs = {} ranks; per GPU {} x {} GB/s {}; per node {} NIC port(s) \
         x {} Gbit/s\n\
         # NCCL's graph (stand-in): {} channels x {} GB/s; calibration: bandwidth x{:.3}, \
         latency x{:.3}\n#\n",
        system.description,
        system.gpus_per_node,
        topo.ranks,
        system.intra.links_per_gpu,
        system.intra.link_gbs,
        system.intra.kind,
        system.net.nics_per_node,
        system.net.nic_gbps,
        topo.channels,
        topo.bw_intra,
        system.calibration.bw_scale,
        system.calibration.lat_scale,
    )
}

/// nccl-tests' columns (out-of-place only: the model has no in-place), then NCCL's choice.
fn table(coll: Collective, lines: &[Line]) -> String {
    let mut out = format!(
        "# Collective: {}  (predicted)\n\
         #{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>10}  {:>8}  {:>8}  {:>5}  {:>6}\n\
         #{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>10}  {:>8}  {:>8}\n",
        coll.name(),
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "algo",
        "proto",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
    );
    for l in lines {
        let r = &l.row;
        let (algo, proto) = l
            .choice
            .map_or(("copy", "-"), |c| (c.algo.name(), c.proto.name()));
        out += &format!(
            "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {:>10.2}  {:>8.2}  {:>8.2}  {:>5}  {:>6}\n",
            r.bytes,
            r.count,
            r.dtype,
            r.redop,
            r.root,
            r.time_us,
            r.algbw_gbps,
            r.busbw_gbps,
            algo,
            proto
        );
    }
    let avg = lines.iter().map(|l| l.row.busbw_gbps).sum::<f64>() / lines.len().max(1) as f64;
    out + &format!("# Avg bus bandwidth    : {avg:.4}\n#\n")
}

fn footer(system: &System) -> String {
    let mut out = format!("# Model: NCCL {NCCL_TAG}, github.com/NVIDIA/nccl\n");
    for c in nccl::CITATIONS {
        out += &format!("#   {c}\n");
    }
    if !system.sources.is_empty() {
        out += &format!("# System's sources: {}\n", system.sources.join(", "));
    }
    out + LEFT_OUT + "\n"
}

fn print_fit(fit: &calibrate::Fit, path: &std::path::Path) {
    println!(
        "# Calibrated to {} ({} points): bw_scale = {:.4}, lat_scale = {:.4} \
         (rms of ln(predicted/measured) = {:.3})",
        path.display(),
        fit.points.len(),
        fit.calibration.bw_scale,
        fit.calibration.lat_scale,
        fit.rms_log
    );
    println!(
        "#{:>15}  {:>6}  {:>5}  {:>12}  {:>12}  {:>12}  {:>7}",
        "collective", "ranks", "nodes", "size (B)", "measured us", "model us", "error"
    );
    for p in &fit.points {
        println!(
            "{:>16}  {:>6}  {:>5}  {:>12}  {:>12.2}  {:>12.2}  {:>6.1}%",
            p.collective.name(),
            p.world_size,
            p.nodes,
            p.bytes,
            p.measured_us,
            p.predicted_us,
            (p.predicted_us / p.measured_us - 1.0) * 100.0
        );
    }
    println!("#");
}

/// `comm-bench report`'s charts of the predictions (and the calibration sweep beside them).
fn plot(dir: &std::path::Path, rows: &[Row], measured: Option<&PathBuf>) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir).map_err(|source| BenchError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let csv = dir.join("predict.csv");
    record::write_csv(&csv, rows)?;
    let mut files = vec![csv];
    files.extend(measured.cloned());
    let report = crate::report::report(&files, dir)?;
    for file in &report.files {
        println!("wrote {}", file.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nccl-tests' columns: the size is the whole buffer, the count the call's (one rank's block
    /// for all_gather and reduce_scatter), as comm-bench's measured tables print them.
    #[test]
    fn the_count_column_is_the_call_s_count() {
        assert_eq!(shape(Collective::AllReduce, 1 << 20, 8), (1 << 18, 1 << 20));
        assert_eq!(shape(Collective::AllGather, 1 << 20, 8), (1 << 15, 1 << 20));
        assert_eq!(shape(Collective::ReduceScatter, 1000, 8), (31, 992));
        assert_eq!(shape(Collective::AllGather, 16, 8), (0, 0));
    }

    /// Every collective of the table is predicted or refused by name, and the help lists exactly
    /// those predicted.
    #[test]
    fn every_collective_is_predicted_or_refused() {
        let help = collectives_help();
        for c in Collective::ALL {
            let args = <crate::cli::Cli as clap::Parser>::parse_from([
                "comm-bench",
                "predict",
                "--collectives",
                c.name(),
            ]);
            let Some(crate::cli::Command::Predict(args)) = args.command else {
                panic!("predict's arguments")
            };
            match collectives(&args) {
                Ok(list) => assert!(list == [c] && nccl::supported(c)),
                Err(e) => assert!(
                    !nccl::supported(c) && e.to_string().contains(c.name()),
                    "{e}"
                ),
            }
            let listed = help.contains(&format!(" {},", c.name()));
            assert_eq!(listed, nccl::supported(c), "{help}");
        }
    }

    /// A rooted collective's rows carry root 0, a reducing one's the sum: the table's facts.
    #[test]
    fn the_rows_take_root_and_reduction_from_the_table() {
        let system = System::load("leonardo").unwrap();
        for c in nccl::modelled() {
            let line = &predict(&system, 1, c, &[1 << 20], false)[0];
            let d = c.describe();
            assert_eq!(line.row.root, if d.rooted { 0 } else { -1 }, "{}", c.name());
            assert_eq!(line.row.redop == "sum", d.reduces, "{}", c.name());
        }
    }
}
