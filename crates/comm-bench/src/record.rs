//! Results as rows: one per (backend, collective, world size, bytes, dtype, reduction, placement),
//! each carrying the machine, backend and versions it was measured with. The same rows go to
//! CSV and JSON, and `comm-bench report` reads either back.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;

use comm_core::timing::{algbw, busbw};
use comm_core::Collective;
use serde::{Deserialize, Serialize};

use crate::measure::{Measured, Outcome, Placement};

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
    /// Elements in those bytes.
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
    /// nccl-tests' -z: 0 back to back with one wait, 1 each call waited for (rows written before
    /// the flag existed were timed as 1).
    #[serde(default = "each_call")]
    pub blocking: u8,
    /// Calls per timed iteration (-m).
    #[serde(default = "one")]
    pub agg_iters: usize,
    /// Per call, in microseconds: the median over iterations with -z 1 (min and max beside it),
    /// the loop's total over its calls with -z 0 (min = median = max). The slowest rank's.
    pub time_us_median: f64,
    pub time_us_min: f64,
    pub time_us_max: f64,
    /// GB/s from the median time.
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
    /// nccl-tests' -z (0: back to back, one wait; 1: each call waited for).
    pub blocking: u8,
    /// Calls per timed iteration (-m).
    pub agg_iters: usize,
    pub started: String,
}

fn each_call() -> u8 {
    1
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
        let median = o.timing.median();
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
            time_us_median: median * 1e6,
            time_us_min: o.timing.min() * 1e6,
            time_us_max: o.timing.max() * 1e6,
            algbw_gbps: algbw(m.bytes as usize, median),
            busbw_gbps: busbw(m.collective, info.world_size, m.bytes as usize, median),
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

pub fn write_csv(path: &Path, rows: &[Row]) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot write {}: {e}", path.display());
    let mut w = csv::Writer::from_path(path).map_err(|e| fail(&e))?;
    for row in rows {
        w.serialize(row).map_err(|e| fail(&e))?;
    }
    w.flush().map_err(|e| fail(&e))
}

pub fn write_json(path: &Path, rows: &[Row]) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot write {}: {e}", path.display());
    let mut w = BufWriter::new(File::create(path).map_err(|e| fail(&e))?);
    serde_json::to_writer_pretty(&mut w, rows).map_err(|e| fail(&e))?;
    writeln!(w).and_then(|_| w.flush()).map_err(|e| fail(&e))
}

/// Reads rows written by [`write_csv`] or [`write_json`] (told apart by the first character).
pub fn read(path: &Path) -> Result<Vec<Row>, String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot read {}: {e}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| fail(&e))?;
    if text.trim_start().starts_with('[') {
        return serde_json::from_str(&text).map_err(|e| fail(&e));
    }
    let mut rows = Vec::new();
    for row in csv::Reader::from_reader(BufReader::new(text.as_bytes())).deserialize() {
        rows.push(row.map_err(|e| fail(&e))?);
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
        time_us_median: 1234.5678901234,
        time_us_min: 1000.0,
        time_us_max: 2000.0,
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
mod tests {
    use super::*;

    #[test]
    fn csv_and_json_round_trip() {
        let dir = std::env::temp_dir().join(format!("comm-bench-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut rows = vec![sample_row(), sample_row()];
        rows[1].wrong = None;
        rows[1].placement = "in-place".into();
        rows[1].time_us_median = 1e-3;
        for (name, write) in [
            (
                "r.csv",
                write_csv as fn(&Path, &[Row]) -> Result<(), String>,
            ),
            ("r.json", write_json),
        ] {
            let path = dir.join(name);
            write(&path, &rows).unwrap();
            assert_eq!(read(&path).unwrap(), rows, "{name}");
        }
        let csv = std::fs::read_to_string(dir.join("r.csv")).unwrap();
        assert!(csv.starts_with("backend,collective,world_size,nodes,bytes,count,dtype"));
        assert!(read(&dir.join("missing.csv"))
            .unwrap_err()
            .contains("missing.csv"));
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
