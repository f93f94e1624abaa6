//! Results as rows: one per (backend, collective, world size, bytes, dtype, reduction, placement),
//! each carrying the machine, backend and versions it was measured with. The same rows go to
//! CSV and JSON, and `comm-bench report` reads either back.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;

use comm_core::timing::{algbw, busbw, median_index, Average, Clock};
use comm_core::Collective;
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::measure::{Measured, Outcome, Placement};

/// What a CPU row's backend adds after its transport when the ranks read each other's
/// registered buffers (`shm transport, registered buffers from 8K`): the model then takes the
/// registered algorithm's path for the sizes that do.
pub const REGISTERED_BUFFERS: &str = "registered buffers";

/// The backend's words for registered buffers that calls of `from` bytes or more read (nccl-tests'
/// size; 0: every call, `--copy registered`): `registered buffers from 128K`, as `-b` writes it.
pub fn registered_words(from: usize) -> String {
    match from {
        0 => REGISTERED_BUFFERS.to_string(),
        from if from.is_multiple_of(1024) => format!("{REGISTERED_BUFFERS} from {}K", from >> 10),
        from => format!("{REGISTERED_BUFFERS} from {from}"),
    }
}

/// From which size a CPU row's calls read registered buffers, as [`registered_words`] wrote it
/// in its backend (`None`: they never do).
pub fn registered_from(backend_version: &str) -> Option<u64> {
    let (_, after) = backend_version.split_once(REGISTERED_BUFFERS)?;
    let Some(size) = after.strip_prefix(" from ") else {
        return Some(0);
    };
    let size = size.split([' ', ',', ')']).next().unwrap_or_default();
    crate::units::parse_bytes(size).ok()
}

/// One measured point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub backend: String,
    pub collective: String,
    pub world_size: usize,
    pub nodes: usize,
    /// The size column: the whole buffer (gathered for all_gather, before scattering for
    /// reduce_scatter), in bytes.
    pub bytes: u64,
    /// The call's count, nccl-tests' count column: the whole buffer's elements for
    /// all_reduce, broadcast, reduce and sendrecv, one rank's block for all_gather,
    /// reduce_scatter, alltoall, gather and scatter (files written before it followed
    /// nccl-tests there hold the whole buffer's; nothing but the table reads the column).
    pub count: u64,
    pub dtype: String,
    /// The reduction, or "none".
    pub redop: String,
    /// The root rank, or -1.
    pub root: i64,
    /// "out-of-place" or "in-place".
    pub placement: String,
    pub warmup: usize,
    pub iters: usize,
    /// nccl-tests' -z: 0 back to back with one wait, 1 each iteration waited for then a barrier
    /// (timed), 3 each iteration waited for and timed alone (rows written before -z existed were
    /// timed as 3 is; rows written before -z 3 existed have 1 for that way).
    #[serde(default = "each_call")]
    pub blocking: u8,
    /// Calls per timed iteration (-m).
    #[serde(default = "one")]
    pub agg_iters: usize,
    /// nccl-tests' -a, how the ranks' times became `time_us`: 0 rank 0's, 1 the mean over ranks,
    /// 2 the fastest rank's, 3 the slowest rank's. Empty in rows written before -a existed, whose
    /// time was the median below.
    #[serde(default)]
    pub average: Option<u8>,
    /// nccl-tests' -I: 1 when each iteration was timed between marks (CUDA events on NCCL).
    #[serde(default)]
    pub per_iter_timing: u8,
    /// The table's time, per call, in microseconds: each rank's host-clock time over the loop
    /// (as -z says) over its calls, combined over ranks as `average` says. Rows written before
    /// it existed get their median here when read.
    #[serde(default = "missing")]
    pub time_us: f64,
    /// Per call, in microseconds, over the timed iterations, each iteration the slowest rank's:
    /// the median (nccl-tests' p50, the upper middle), min and max. One iteration time for the
    /// whole loop with -z 0 and no -I (min = median = max).
    pub time_us_median: f64,
    pub time_us_min: f64,
    pub time_us_max: f64,
    /// Where the iteration times come from: "host clock" or "CUDA events".
    #[serde(default = "host_clock")]
    pub iter_clock: String,
    /// GB/s from `time_us`, nccl-tests' formulas.
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
    /// Wrong elements summed over ranks; empty when the check was off.
    pub wrong: Option<u64>,
    pub host: String,
    /// CPU model and cores, or GPU model.
    pub machine: String,
    /// "tcp (comm-core x.y.z)" for the CPU backend, "NCCL x.y.z" for NCCL.
    pub backend_version: String,
    pub comm_bench_version: String,
    /// When the run of this backend and world size started (UTC).
    pub started: String,
}

/// What every row of one run (one backend, one world size) shares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub backend: String,
    pub backend_version: String,
    pub machine: String,
    pub host: String,
    pub world_size: usize,
    pub nodes: usize,
    pub warmup: usize,
    pub iters: usize,
    /// nccl-tests' -z (0: back to back, one wait; 1: each iteration waited for, then a barrier,
    /// timed; 3: each iteration waited for and timed alone).
    pub blocking: u8,
    /// Calls per timed iteration (-m).
    pub agg_iters: usize,
    /// nccl-tests' -a (0 rank 0, 1 mean, 2 min, 3 max over ranks).
    pub average: u8,
    /// nccl-tests' -I (1: iterations timed between marks).
    pub per_iter_timing: u8,
    pub started: String,
}

fn each_call() -> u8 {
    1
}

fn missing() -> f64 {
    f64::NAN
}

fn host_clock() -> String {
    Clock::Host.name().into()
}

fn one() -> usize {
    1
}

impl Row {
    /// The rows of one table line: out-of-place first, then in-place, for those measured.
    pub fn of(info: &RunInfo, m: &Measured) -> Vec<Row> {
        [
            (Placement::OutOfPlace, &m.out_of_place),
            (Placement::InPlace, &m.in_place),
        ]
        .into_iter()
        .filter_map(|(p, o)| o.as_ref().map(|o| Row::one(info, m, p, o)))
        .collect()
    }

    fn one(info: &RunInfo, m: &Measured, placement: Placement, o: &Outcome) -> Row {
        let average = info.average;
        let time = o
            .timing
            .time(Average::from_flag(average).unwrap_or_default());
        Row {
            backend: info.backend.clone(),
            collective: m.collective.name().into(),
            world_size: info.world_size,
            nodes: info.nodes,
            bytes: m.bytes,
            count: m.count,
            dtype: m.dtype.name().into(),
            redop: m.op.map_or("none", |op| op.name()).into(),
            root: m.root.map_or(-1, |r| r as i64),
            placement: placement.name().into(),
            warmup: info.warmup,
            iters: info.iters,
            blocking: info.blocking,
            agg_iters: info.agg_iters,
            average: Some(average),
            per_iter_timing: info.per_iter_timing,
            time_us: time * 1e6,
            time_us_median: o.timing.median() * 1e6,
            time_us_min: o.timing.min() * 1e6,
            time_us_max: o.timing.max() * 1e6,
            iter_clock: o.timing.clock.name().into(),
            algbw_gbps: algbw(m.bytes as usize, time),
            busbw_gbps: busbw(m.collective, info.world_size, m.bytes as usize, time),
            wrong: o.wrong,
            host: info.host.clone(),
            machine: info.machine.clone(),
            backend_version: info.backend_version.clone(),
            comm_bench_version: env!("CARGO_PKG_VERSION").into(),
            started: info.started.clone(),
        }
    }

    /// The collective this row measured, when comm-core knows its name.
    pub fn collective(&self) -> Option<Collective> {
        self.collective.parse().ok()
    }
}

pub fn write_csv(path: &Path, rows: &[Row]) -> Result<(), BenchError> {
    write_csv_records(path, rows)
}

/// A CSV of `records`, one line each, the header from the first: rows, or rows with columns
/// added after theirs (a tuple `(row, extra)`).
pub fn write_csv_records<R: serde::Serialize>(
    path: &Path,
    records: impl IntoIterator<Item = R>,
) -> Result<(), BenchError> {
    let fail = |source| BenchError::WriteCsv {
        path: path.to_path_buf(),
        source,
    };
    let mut w = csv::Writer::from_path(path).map_err(fail)?;
    for record in records {
        w.serialize(record).map_err(fail)?;
    }
    w.flush().map_err(|e| fail(e.into()))
}

pub fn write_json(path: &Path, rows: &[Row]) -> Result<(), BenchError> {
    let io = |source| BenchError::WriteFile {
        path: path.to_path_buf(),
        source,
    };
    let mut w = BufWriter::new(File::create(path).map_err(io)?);
    serde_json::to_writer_pretty(&mut w, rows).map_err(|source| BenchError::WriteJson {
        path: path.to_path_buf(),
        source,
    })?;
    writeln!(w).and_then(|_| w.flush()).map_err(io)
}

/// The row of the median time among measurements of one size: the upper middle of an even count
/// (comm-core's `median_index`, the workspace's one convention), for the report and the model.
pub fn median_row(mut rows: Vec<Row>) -> Row {
    rows.sort_by(|a, b| a.time_us.total_cmp(&b.time_us));
    rows.swap_remove(median_index(rows.len()))
}

/// Reads rows written by [`write_csv`] or [`write_json`] (told apart by the first character).
/// Rows written before `time_us` existed get their median as `time_us` (what their table showed).
pub fn read(path: &Path) -> Result<Vec<Row>, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|source| BenchError::ReadFile {
        path: path.to_path_buf(),
        source,
    })?;
    let mut rows: Vec<Row> = if text.trim_start().starts_with('[') {
        serde_json::from_str(&text).map_err(|source| BenchError::MalformedJson {
            path: path.to_path_buf(),
            source,
        })?
    } else {
        let mut rows = Vec::new();
        for row in csv::Reader::from_reader(BufReader::new(text.as_bytes())).deserialize() {
            rows.push(row.map_err(|source: csv::Error| BenchError::MalformedRow {
                path: path.to_path_buf(),
                line: source.position().map(|p| p.line()),
                source,
            })?);
        }
        rows
    };
    for r in &mut rows {
        if r.time_us.is_nan() {
            r.time_us = r.time_us_median;
        }
    }
    Ok(rows)
}

/// This machine's name.
pub fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The CPU model and how many cores this process may use.
pub fn cpu_model() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{model} ({cores} cores)")
}

/// Now, as `2026-01-31T12:00:00Z`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

#[cfg(test)]
pub(crate) fn sample_row() -> Row {
    Row {
        backend: "cpu".into(),
        collective: "all_reduce".into(),
        world_size: 2,
        nodes: 1,
        bytes: 1 << 20,
        count: 1 << 18,
        dtype: "float".into(),
        redop: "sum".into(),
        root: -1,
        placement: "out-of-place".into(),
        warmup: 5,
        iters: 20,
        blocking: 0,
        agg_iters: 1,
        average: Some(1),
        per_iter_timing: 0,
        time_us: 1234.5678901234,
        time_us_median: 1200.0,
        time_us_min: 1000.0,
        time_us_max: 2000.0,
        iter_clock: "host clock".into(),
        algbw_gbps: 0.1 + 0.2,
        busbw_gbps: 1.0 / 3.0,
        wrong: Some(0),
        host: "laptop, \"quoted\"".into(),
        machine: "Some CPU (2 cores)".into(),
        backend_version: "tcp".into(),
        comm_bench_version: "0.1.0".into(),
        started: "2026-01-31T12:00:00Z".into(),
    }
}

#[cfg(test)]
pub(crate) fn sample_info() -> RunInfo {
    RunInfo {
        backend: "cpu".into(),
        backend_version: "tcp".into(),
        machine: "m".into(),
        host: "h".into(),
        world_size: 2,
        nodes: 1,
        warmup: 5,
        iters: 20,
        blocking: 0,
        agg_iters: 1,
        average: 1,
        per_iter_timing: 0,
        started: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use comm_core::timing::Timing;
    use comm_core::{DType, ReduceOp};

    /// The header says from which size calls read registered buffers; the model reads it back.
    #[test]
    fn registered_buffers_bound_goes_through_the_header() {
        let line = |from| {
            format!(
                "shm transport, {} (comm-core 0.1.0)",
                registered_words(from)
            )
        };
        assert_eq!(
            line(128 << 10),
            "shm transport, registered buffers from 128K (comm-core 0.1.0)"
        );
        assert_eq!(registered_from(&line(128 << 10)), Some(128 << 10));
        assert_eq!(registered_from(&line(0)), Some(0));
        assert_eq!(registered_from("shm transport (comm-core 0.1.0)"), None);
    }

    /// The row's time is nccl-tests' (-a over the ranks' times), its bandwidths from it, and the
    /// iteration statistics beside it.
    #[test]
    fn a_row_holds_the_time_average_asks_for_and_the_iterations_beside_it() {
        let timing = Timing {
            ranks: vec![2e-3, 4e-3],
            iterations: vec![5e-3, 3e-3, 4e-3, 6e-3],
            clock: Clock::CudaEvents,
        };
        let m = Measured {
            collective: Collective::AllReduce,
            dtype: DType::F32,
            op: Some(ReduceOp::Sum),
            root: None,
            bytes: 1_000_000,
            count: 250_000,
            out_of_place: None,
            in_place: Some(Outcome {
                timing,
                wrong: Some(0),
            }),
        };
        for (average, us) in [(0, 2000.0), (1, 3000.0), (2, 2000.0), (3, 4000.0)] {
            let info = RunInfo {
                average,
                ..sample_info()
            };
            let rows = Row::of(&info, &m);
            assert_eq!(rows.len(), 1);
            let r = &rows[0];
            assert_eq!(
                (r.placement.as_str(), r.average),
                ("in-place", Some(average))
            );
            assert!((r.time_us - us).abs() < 1e-9, "-a {average}: {}", r.time_us);
            let algbw = 1e6 / (us * 1e-6) / 1e9;
            assert!((r.algbw_gbps - algbw).abs() < 1e-9, "{r:?}");
            // all_reduce on 2 ranks: busbw = algbw x 2(n-1)/n = algbw.
            assert!((r.busbw_gbps - algbw).abs() < 1e-9, "{r:?}");
            // Sorted 3, 4, 5, 6 ms: p50 is sorted[2].
            let stats = (r.time_us_median, r.time_us_min, r.time_us_max);
            assert!((stats.0 - 5000.0).abs() < 1e-9, "{stats:?}");
            assert!((stats.1 - 3000.0).abs() < 1e-9 && (stats.2 - 6000.0).abs() < 1e-9);
            assert_eq!(r.iter_clock, "CUDA events");
        }
    }

    /// Files written before -a and -z 3: their time was the median, and `read` says so.
    #[test]
    fn rows_written_before_the_time_column_read_their_median_as_the_time() {
        let dir = std::env::temp_dir().join(format!("comm-bench-old-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("old.csv");
        std::fs::write(
            &path,
            "backend,collective,world_size,nodes,bytes,count,dtype,redop,root,placement,warmup,\
             iters,blocking,agg_iters,time_us_median,time_us_min,time_us_max,algbw_gbps,\
             busbw_gbps,wrong,host,machine,backend_version,comm_bench_version,started\n\
             cpu,all_reduce,2,1,1000000,250000,float,sum,-1,in-place,5,20,1,1,1800,1700,2100,\
             0.5556,0.5556,0,laptop,CPU (2 cores),tcp,0.1.0,2026-01-01T00:00:00Z\n",
        )
        .unwrap();
        let rows = read(&path).unwrap();
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!((r.time_us, r.time_us_median), (1800.0, 1800.0));
        assert_eq!((r.average, r.per_iter_timing), (None, 0));
        assert_eq!(r.iter_clock, "host clock");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn csv_and_json_round_trip() {
        let dir = std::env::temp_dir().join(format!("comm-bench-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut rows = vec![sample_row(), sample_row()];
        rows[1].wrong = None;
        rows[1].placement = "in-place".into();
        rows[1].time_us = 1e-3;
        rows[1].average = Some(3);
        for (name, write) in [
            (
                "r.csv",
                write_csv as fn(&Path, &[Row]) -> Result<(), BenchError>,
            ),
            ("r.json", write_json),
        ] {
            let path = dir.join(name);
            write(&path, &rows).unwrap();
            assert_eq!(read(&path).unwrap(), rows, "{name}");
        }
        let csv = std::fs::read_to_string(dir.join("r.csv")).unwrap();
        assert!(csv.starts_with("backend,collective,world_size,nodes,bytes,count,dtype"));
        let missing = read(&dir.join("missing.csv")).unwrap_err();
        assert!(
            matches!(missing, BenchError::ReadFile { .. }),
            "{missing:?}"
        );
        assert!(missing.to_string().contains("missing.csv"), "{missing}");
        // A row that is not a result: the file and the line it is on.
        let bad = dir.join("bad.csv");
        let mut text = std::fs::read_to_string(dir.join("r.csv")).unwrap();
        text.push_str("cpu,all_reduce,two\n");
        std::fs::write(&bad, text).unwrap();
        match read(&bad).unwrap_err() {
            BenchError::MalformedRow { path, line, .. } => {
                assert_eq!((path, line), (bad.clone(), Some(4)));
            }
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn clock_and_machine() {
        let now = utc_now();
        assert_eq!(now.len(), 20, "{now}");
        assert!(now.starts_with("20") && now.ends_with('Z'), "{now}");
        assert!(cpu_model().contains("cores"));
        assert!(!host().is_empty());
    }
}
