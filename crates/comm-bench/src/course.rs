//! The course's own outputs, beside nccl-tests' table, from the same rows.
//!
//! - `--preset profiler` (seeds/002, the micro-profiler): after the tables, a block per backend
//!   and world size in the profiler's format (`Configuration: World Size=N`, then per size
//!   `Tensor Size: 1,048,576 elements (4.00 MB)` and one `  AllReduce:     0.090 ms | AlgBW: …
//!   GB/s | BusBW: … GB/s` line per collective), printed and written to
//!   `profile_{backend}_world{N}_{timestamp}.txt`.
//! - `--preset allreduce-sweep` (seeds/004, benchmark_allreduce.py and visualize_results.py): the
//!   rows as `{backend}_{device}_benchmark.csv` per backend and `combined_benchmark.csv`, then
//!   [`report::report_as`] with the course's names: the time, bandwidth and 100 MB comparison
//!   plots, full_results.md, summary_by_config.md and analysis.txt (and comm-bench's report.md).
//!   Those CSVs carry comm-bench's columns and then the ones the course's `visualize_results.py`
//!   reads ([`CourseColumns`]), so the course's plotting reads them as they are.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::cli::{BenchArgs, Preset};
use crate::error::BenchError;
use crate::plan::Plan;
use crate::record::{self, Row};
use crate::report::{self, Naming};

/// Where the course's folder of the sweep is, relative to the current directory (the course
/// writes to `../../results/distributed_communication/` from its script's folder).
pub const SWEEP_DIR: &str = "results/distributed_communication";

/// `1048576` as `1,048,576`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One profiler line: `  AllReduce:     0.090 ms | AlgBW: 64.78 GB/s | BusBW: 43.19 GB/s`.
pub fn profiler_line(name: &str, row: &Row) -> String {
    format!(
        "  {:<15}{:.3} ms | AlgBW: {:.2} GB/s | BusBW: {:.2} GB/s",
        format!("{name}:"),
        row.time_us / 1e3,
        row.algbw_gbps,
        row.busbw_gbps
    )
}

/// The placement PyTorch's calls use, shown where it was measured: in place for all_reduce
/// (`dist.all_reduce(tensor)`), out of place for the others (into another tensor).
fn preferred(collective: &str) -> [&'static str; 2] {
    match collective {
        "all_reduce" => ["in-place", "out-of-place"],
        _ => ["out-of-place", "in-place"],
    }
}

/// The profiler's block for the rows of one backend and world size.
pub fn profile_block(plan: &Plan, rows: &[&Row]) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let mut out = String::new();
    let rule = "=".repeat(80);
    let _ = writeln!(out, "{rule}");
    let _ = writeln!(out, "Configuration: World Size={}", first.world_size);
    let _ = writeln!(
        out,
        "Backend: {} ({})",
        first.backend, first.backend_version
    );
    let _ = writeln!(out, "{rule}");
    // The size each row was asked for (all_gather and reduce_scatter round to whole elements
    // per rank).
    let requested = |bytes: u64| {
        plan.sizes
            .iter()
            .copied()
            .min_by_key(|&s| s.abs_diff(bytes))
            .unwrap_or(bytes)
    };
    for &size in &plan.sizes {
        let at: Vec<&Row> = rows
            .iter()
            .copied()
            .filter(|r| requested(r.bytes) == size)
            .collect();
        let Some(sample) = at.first() else { continue };
        // The element's size from its type (the count column is the call's count, one rank's
        // block for the gathering and scattering collectives, as in nccl-tests).
        let element = sample
            .dtype
            .parse::<comm_core::DType>()
            .map_or(4, |d| d.size() as u64);
        let _ = writeln!(
            out,
            "\nTensor Size: {} elements ({:.2} MB)",
            thousands(size / element),
            size as f64 / (1024.0 * 1024.0)
        );
        for c in &plan.collectives {
            let name = c.name();
            let mine: Vec<&Row> = at
                .iter()
                .copied()
                .filter(|r| r.collective == name)
                .collect();
            let mut kinds: Vec<(&str, &str)> = Vec::new();
            for r in &mine {
                if !kinds.contains(&(r.dtype.as_str(), r.redop.as_str())) {
                    kinds.push((&r.dtype, &r.redop));
                }
            }
            for &(dtype, redop) in &kinds {
                let Some(row) = preferred(name).iter().find_map(|p| {
                    mine.iter()
                        .find(|r| r.dtype == dtype && r.redop == redop && r.placement == *p)
                }) else {
                    continue;
                };
                let mut label = c.describe().title.to_string();
                if plan.dtypes.len() > 1 || plan.ops.len() > 1 {
                    let _ = write!(label, " ({dtype}, {redop})");
                }
                let _ = writeln!(out, "{}", profiler_line(&label, row));
            }
        }
    }
    out
}

/// `2026-01-31T12:00:00Z` as `20260131_120000`, the profiler's timestamp.
fn timestamp(utc: &str) -> String {
    let digits: String = utc.chars().filter(char::is_ascii_digit).collect();
    if digits.len() >= 14 {
        format!("{}_{}", &digits[..8], &digits[8..14])
    } else {
        digits
    }
}

/// Keeps a backend's name to `[A-Za-z0-9_-]` for a file name.
fn clean(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '_' | '-' => c,
            _ => '_',
        })
        .collect()
}

/// (backend, world size) in the order the rows came.
fn runs(rows: &[Row]) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for r in rows {
        if !out
            .iter()
            .any(|(b, w)| *b == r.backend && *w == r.world_size)
        {
            out.push((r.backend.clone(), r.world_size));
        }
    }
    out
}

/// Prints the profiler's blocks and writes one file per backend and world size.
fn profiler(plan: &Plan, rows: &[Row], dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
    let stamp = timestamp(&record::utc_now());
    let mut files = Vec::new();
    for (backend, ws) in runs(rows) {
        let mine: Vec<&Row> = rows
            .iter()
            .filter(|r| r.backend == backend && r.world_size == ws)
            .collect();
        let block = profile_block(plan, &mine);
        println!("\n{block}");
        let path = dir.join(format!("profile_{}_world{ws}_{stamp}.txt", clean(&backend)));
        std::fs::write(&path, &block).map_err(|source| BenchError::WriteFile {
            path: path.clone(),
            source,
        })?;
        files.push(path);
    }
    Ok(files)
}

/// The course's name of a backend's CSV: `nccl_gpu_benchmark.csv` and, for the CPU backend,
/// which stands where the course ran Gloo, the course's `gloo_cpu_benchmark.csv`.
pub fn sweep_csv_name(backend: &str) -> String {
    match backend {
        "nccl" => "nccl_gpu_benchmark.csv".into(),
        "cpu" => "gloo_cpu_benchmark.csv".into(),
        other => format!("{}_benchmark.csv", clean(other)),
    }
}

/// The columns the course's `visualize_results.py` (seed 004) reads, after comm-bench's own:
/// `backend` and `world_size` are comm-bench's already; these are the rest. The seed holds the
/// script's README, not its code: the names are those of a public copy of the script that goes
/// with that README.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CourseColumns {
    /// The course's torch device: `cuda` for NCCL, `cpu` otherwise.
    pub device: &'static str,
    /// The size in the course's MB, 10^6 bytes: the sweep's 1 MB ... 1 GB are 1, 10, 100, 1000
    /// (the course's plot of one size picks the rows where this is 100).
    pub data_size_mb: f64,
    /// The table's time (`time_us`), in seconds.
    pub avg_time_s: f64,
    /// Empty: comm-bench keeps the median, min and max over iterations, not a standard deviation.
    /// The script only copies it into its tables.
    pub std_time_s: Option<f64>,
    /// algbw, the buffer over the time (GB/s, 10^9 bytes a second).
    pub bandwidth_gb_s: f64,
}

impl CourseColumns {
    pub fn of(row: &Row) -> CourseColumns {
        CourseColumns {
            device: if row.backend == "nccl" { "cuda" } else { "cpu" },
            data_size_mb: row.bytes as f64 / 1e6,
            avg_time_s: row.time_us / 1e6,
            std_time_s: None,
            bandwidth_gb_s: row.algbw_gbps,
        }
    }
}

/// Writes rows as [`record::write_csv`] does, each followed by its [`CourseColumns`].
/// `comm-bench report` reads the file as any other (it ignores the columns it does not know).
pub fn write_course_csv(path: &Path, rows: &[Row]) -> Result<(), BenchError> {
    record::write_csv_records(path, rows.iter().map(|row| (row, CourseColumns::of(row))))
}

/// Writes the CSVs and runs the report with the course's names; prints its observations.
fn sweep(rows: &[Row], dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
    let mut files = Vec::new();
    let mut backends: Vec<&str> = Vec::new();
    for r in rows {
        if !backends.contains(&r.backend.as_str()) {
            backends.push(&r.backend);
        }
    }
    for backend in backends {
        let mine: Vec<Row> = rows
            .iter()
            .filter(|r| r.backend == backend)
            .cloned()
            .collect();
        let path = dir.join(sweep_csv_name(backend));
        write_course_csv(&path, &mine)?;
        files.push(path);
    }
    let combined = dir.join("combined_benchmark.csv");
    write_course_csv(&combined, rows)?;
    files.push(combined.clone());
    let report = report::report_as(&[combined], dir, Naming::Course)?;
    if !report.observations.is_empty() {
        println!("\nObservations:");
        for o in &report.observations {
            println!("- {o}");
        }
    }
    files.extend(report.files);
    Ok(files)
}

/// Writes one preset's files into a folder; returns the files written.
type Writer = fn(&Plan, &[Row], &Path) -> Result<Vec<PathBuf>, BenchError>;

/// The course's outputs of the preset in `args`, if it has any; says on stderr what it wrote.
/// False when something could not be written.
pub fn write(args: &BenchArgs, plan: &Plan, rows: &[Row]) -> bool {
    let (default_dir, run): (&str, Writer) = match args.preset {
        Some(Preset::Profiler) => (".", profiler),
        Some(Preset::AllreduceSweep) => (SWEEP_DIR, |_, rows, dir| sweep(rows, dir)),
        _ => return true,
    };
    if rows.is_empty() {
        return true;
    }
    let dir = args
        .out_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(default_dir));
    let result = std::fs::create_dir_all(&dir)
        .map_err(|source| BenchError::CreateDir {
            path: dir.clone(),
            source,
        })
        .and_then(|()| run(plan, rows, &dir));
    match result {
        Ok(files) => {
            for f in files {
                eprintln!("comm-bench: wrote {}", f.display());
            }
            true
        }
        Err(e) => {
            eprintln!("comm-bench: error: {e}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::sample_row;

    #[test]
    fn the_profilers_format() {
        let mut r = sample_row();
        r.time_us = 90.0;
        r.algbw_gbps = 64.784;
        r.busbw_gbps = 43.186;
        assert_eq!(
            profiler_line("AllReduce", &r),
            "  AllReduce:     0.090 ms | AlgBW: 64.78 GB/s | BusBW: 43.19 GB/s"
        );
        assert_eq!(
            profiler_line("ReduceScatter", &r),
            "  ReduceScatter: 0.090 ms | AlgBW: 64.78 GB/s | BusBW: 43.19 GB/s"
        );
        assert_eq!(thousands(1_048_576), "1,048,576");
        assert_eq!(thousands(999), "999");
        assert_eq!(timestamp("2026-01-31T12:03:04Z"), "20260131_120304");
        // The profiler's names are the collective table's titles.
        assert_eq!(
            comm_core::Collective::ReduceScatter.describe().title,
            "ReduceScatter"
        );
    }

    /// The sweep's CSVs hold comm-bench's columns, then the ones the course's
    /// visualize_results.py reads, and `comm-bench report` still reads them.
    #[test]
    fn the_sweeps_csv_has_the_columns_the_courses_plotting_reads() {
        let dir = std::env::temp_dir().join(format!("comm-bench-course-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut rows = vec![sample_row(), sample_row()];
        rows[0].bytes = 100_000_000;
        rows[0].time_us = 50_000.0;
        rows[0].algbw_gbps = 2.0;
        rows[1].backend = "nccl".into();
        let path = dir.join("gloo_cpu_benchmark.csv");
        write_course_csv(&path, &rows).unwrap();
        let mut reader = csv::Reader::from_path(&path).unwrap();
        let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
        // What visualize_results.py reads: backend, device, world_size, data_size_mb,
        // avg_time_s, std_time_s, bandwidth_gb_s.
        for column in [
            "backend",
            "device",
            "world_size",
            "data_size_mb",
            "avg_time_s",
            "std_time_s",
            "bandwidth_gb_s",
        ] {
            assert_eq!(
                header.iter().filter(|h| *h == column).count(),
                1,
                "{column} in {header:?}"
            );
        }
        assert!(header[0] == "backend" && header.ends_with(&["bandwidth_gb_s".to_string()]));
        let at = |name: &str| header.iter().position(|h| h == name).unwrap();
        let records: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
        let first = &records[0];
        assert_eq!(&first[at("device")], "cpu");
        assert_eq!(first[at("data_size_mb")].parse::<f64>().unwrap(), 100.0);
        assert_eq!(first[at("avg_time_s")].parse::<f64>().unwrap(), 0.05);
        assert_eq!(&first[at("std_time_s")], "");
        assert_eq!(first[at("bandwidth_gb_s")].parse::<f64>().unwrap(), 2.0);
        assert_eq!(&records[1][at("device")], "cuda");
        // comm-bench's own reader takes the file as it is.
        assert_eq!(record::read(&path).unwrap(), rows);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_block_per_run_with_a_heading_per_size() {
        let cli = <crate::cli::Cli as clap::Parser>::parse_from([
            "comm-bench",
            "--preset",
            "profiler",
            "-b",
            "4M",
            "-e",
            "16M",
        ]);
        let plan = Plan::resolve(&cli.bench).unwrap();
        let mut rows = Vec::new();
        for (c, bytes) in [
            ("all_reduce", 4u64 << 20),
            ("all_reduce", 16 << 20),
            ("all_gather", (4 << 20) - 4),
        ] {
            for p in ["out-of-place", "in-place"] {
                let mut r = sample_row();
                r.collective = c.into();
                r.bytes = bytes;
                r.count = bytes / 4;
                r.placement = p.into();
                r.time_us = if p == "in-place" { 1000.0 } else { 2000.0 };
                rows.push(r);
            }
        }
        let refs: Vec<&Row> = rows.iter().collect();
        let block = profile_block(&plan, &refs);
        let lines: Vec<&str> = block.lines().collect();
        assert_eq!(lines[1], "Configuration: World Size=2");
        assert_eq!(lines[2], "Backend: cpu (tcp)");
        assert_eq!(lines[5], "Tensor Size: 1,048,576 elements (4.00 MB)");
        // all_reduce in place, all_gather out of place, as PyTorch's calls.
        assert!(lines[6].starts_with("  AllReduce:     1.000 ms"), "{block}");
        assert!(lines[7].starts_with("  AllGather:     2.000 ms"), "{block}");
        assert_eq!(lines[9], "Tensor Size: 4,194,304 elements (16.00 MB)");
        assert_eq!(lines.len(), 11, "{block}");
    }
}
