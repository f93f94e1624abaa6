//! The report's text files: report.md (sources, machines, what the numbers mean, per collective
//! its plots, observations and every row) and, for the course, full_results.md,
//! summary_by_config.md and analysis.txt.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use comm_core::Collective;

use super::sections::Section;
use super::series::Series;
use crate::record::Row;
use crate::units::human_bytes;

/// report.md: where the rows come from, the machines, what the numbers mean, then per
/// collective its plots, observations and every row.
pub fn report_md(sources: &str, rows: &[Row], sections: &[Section]) -> String {
    let mut md = String::from("# comm-bench report\n\n");
    let _ = writeln!(md, "From {sources}.\n");
    md.push_str(&machines_table(rows));
    let _ = write!(
        md,
        "\nTime: nccl-tests' time, per call: each rank's host-clock time over the timed loop (as the \
         row's `blocking`, nccl-tests' -z, says), combined over ranks as its `average` (nccl-tests' \
         -a) says: 0 rank 0's, 1 the mean, 2 the fastest rank's, 3 the slowest's; rows written \
         before comm-bench had -a hold the median over iterations of the slowest rank. median, min \
         and max: over iterations, each the slowest rank's. algbw = size / time; busbw = \
         algbw × the collective's bus factor ({}). Plots show out-of-place results where they \
         were measured, else in-place.\n",
        bus_rules()
    );
    for s in sections {
        let _ = writeln!(md, "\n## {}\n", s.name);
        for chart in &s.charts {
            let _ = writeln!(md, "![{}]({}.png)", chart.plot.title(), chart.stem);
        }
        if !s.observations.is_empty() {
            md.push_str("\nObservations:\n\n");
            for o in &s.observations {
                let _ = writeln!(md, "- {o}");
            }
        }
        md.push('\n');
        md.push_str(&rows_table(&s.rows));
    }
    md
}

/// The course's files beside report.md: full_results.md, summary_by_config.md, analysis.txt.
pub fn course_texts(sources: &str, sections: &[Section]) -> [(&'static str, String); 3] {
    let mut full = String::from("# Full results\n\n");
    let _ = writeln!(full, "From {sources}.");
    let mut summary = String::from("# Summary by configuration\n\n");
    let _ = writeln!(summary, "From {sources}.");
    for s in sections {
        let _ = write!(full, "\n## {}\n\n{}", s.name, rows_table(&s.rows));
        let _ = write!(summary, "\n## {}\n\n{}", s.name, summary_table(&s.series));
    }
    [
        ("full_results.md", full),
        ("summary_by_config.md", summary),
        ("analysis.txt", analysis(sources, sections)),
    ]
}

/// analysis.txt: per collective the sizes each series measured, then its observations.
fn analysis(sources: &str, sections: &[Section]) -> String {
    let mut text = format!(
        "Analysis of {}\n\nTimes are nccl-tests' time column: per call, on the host clock, \
         combined over ranks as each row's -a says (the mean over ranks by default); algbw = \
         size / time, busbw = algbw x the collective's bus factor (nccl-tests' bus \
         bandwidth: {}). Observations are computed from the numbers.\n\n",
        sources.replace('`', ""),
        bus_rules()
    );
    for s in sections {
        let _ = writeln!(text, "{}:", s.name);
        for line in &s.series {
            let sizes: Vec<String> = line
                .points
                .iter()
                .map(|r| human_bytes(r.bytes as f64))
                .collect();
            let _ = writeln!(text, "  measured: {}: {}", line.label, sizes.join(", "));
        }
        if s.observations.is_empty() {
            text.push_str(
                "  (no observations: too few sizes, world sizes or backends to compare)\n",
            );
        }
        for o in &s.observations {
            let _ = writeln!(text, "  - {o}");
        }
        text.push('\n');
    }
    text
}

/// One line per series (backend, ranks, …): the sizes, the time at the smallest and the
/// largest, and the peak and mean busbw.
fn summary_table(series: &[Series]) -> String {
    let mut t = String::from(
        "| configuration | sizes | time at smallest (ms) | time at largest (ms) | peak busbw GB/s (at) | mean busbw GB/s |\n\
         | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for s in series {
        let (Some(first), Some(last)) = (s.points.first(), s.points.last()) else {
            continue;
        };
        let peak = s
            .points
            .iter()
            .max_by(|a, b| a.busbw_gbps.total_cmp(&b.busbw_gbps))
            .expect("points");
        let mean = s.points.iter().map(|r| r.busbw_gbps).sum::<f64>() / s.points.len() as f64;
        let _ = writeln!(
            t,
            "| {} | {} to {} ({}) | {:.3} | {:.3} | {:.2} ({}) | {:.2} |",
            s.label,
            human_bytes(first.bytes as f64),
            human_bytes(last.bytes as f64),
            s.points.len(),
            first.time_us / 1e3,
            last.time_us / 1e3,
            peak.busbw_gbps,
            human_bytes(peak.bytes as f64),
            mean
        );
    }
    t
}

fn machines_table(rows: &[Row]) -> String {
    // Runs per machine, backend and versions, with when the first and last one started.
    let mut runs: BTreeMap<[&str; 5], std::collections::BTreeSet<&str>> = BTreeMap::new();
    for r in rows {
        let key = [
            r.backend.as_str(),
            &r.backend_version,
            &r.machine,
            &r.host,
            &r.comm_bench_version,
        ];
        runs.entry(key).or_default().insert(&r.started);
    }
    let mut t = String::from(
        "| backend | version | machine | host | comm-bench | runs | started |\n| --- | --- | --- | --- | --- | ---: | --- |\n",
    );
    for ([backend, version, machine, host, tool], started) in runs {
        let first = started.first().copied().unwrap_or_default();
        let last = started.last().copied().unwrap_or_default();
        let when = if first == last {
            first.to_string()
        } else {
            format!("{first} to {last}")
        };
        let _ = writeln!(
            t,
            "| {backend} | {version} | {machine} | {host} | {tool} | {} | {when} |",
            started.len()
        );
    }
    t
}

fn rows_table(rows: &[&Row]) -> String {
    let mut sorted: Vec<&Row> = rows.to_vec();
    sorted.sort_by(|a, b| {
        (
            &a.backend,
            a.world_size,
            &a.dtype,
            &a.redop,
            a.bytes,
            &b.placement,
        )
            .cmp(&(
                &b.backend,
                b.world_size,
                &b.dtype,
                &b.redop,
                b.bytes,
                &a.placement,
            ))
    });
    let mut t = String::from(
        "| backend | ranks | size | type | redop | placement | time ms | median ms | min ms | max ms | algbw GB/s | busbw GB/s | #wrong |\n\
         | --- | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in sorted {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {} |",
            r.backend,
            r.world_size,
            human_bytes(r.bytes as f64),
            r.dtype,
            r.redop,
            r.placement,
            r.time_us / 1e3,
            r.time_us_median / 1e3,
            r.time_us_min / 1e3,
            r.time_us_max / 1e3,
            r.algbw_gbps,
            r.busbw_gbps,
            r.wrong.map_or("N/A".into(), |w| w.to_string())
        );
    }
    t
}

/// Every collective's bus factor as the table writes it: `all_reduce 2(n-1)/n, ...`.
fn bus_rules() -> String {
    let rule = |c: Collective| format!("{} {}", c.name(), c.describe().bus_rule);
    Collective::ALL.map(rule).join(", ")
}
