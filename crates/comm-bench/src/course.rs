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

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

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
        record::write_csv(&path, &mine)?;
        files.push(path);
    }
    let combined = dir.join("combined_benchmark.csv");
    record::write_csv(&combined, rows)?;
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
