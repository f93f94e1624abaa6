//! `comm-bench report`: result files from any machines (a laptop's CPU run beside a cluster's GPU
//! run, as the course compares them) → PNG and SVG plots, markdown tables and observations
//! computed from the numbers.
//!
//! Per collective: time vs size and busbw vs size (log axes), one line per backend and
//! world size; the time of each at the size nearest 100 MB; a table of every row; and a few
//! sentences: where bandwidth saturates, how it scales with ranks, how the backends compare.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use comm_core::Collective;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use rayon::prelude::*;

use crate::alpha_beta;
use crate::error::BenchError;
use crate::record::{self, Row};
use crate::units::human_bytes;

/// Two sizes count as the same point when they differ by less than this (all_gather rounds the
/// size to whole elements per rank, so 2 and 3 ranks measure 524288 and 524280 bytes).
const SAME_SIZE: f64 = 0.01;

fn same_size(a: u64, b: u64) -> bool {
    (a as f64 - b as f64).abs() <= SAME_SIZE * a.max(b) as f64
}

/// The size the backend comparison is made at, as in the course (100 MB all-reduce).
pub const COMPARE_BYTES: f64 = 1e8;
const WIDTH: u32 = 960;
const HEIGHT: u32 = 600;

/// What a report wrote and concluded.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub files: Vec<PathBuf>,
    pub observations: Vec<String>,
}

/// One line of a plot: the rows of one backend, world size (and type, reduction, placement).
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub backend: String,
    pub world_size: usize,
    /// One row per size, sorted by size.
    pub points: Vec<Row>,
    /// The latency-bandwidth model fitted to the points, once for the plots and the words.
    pub fit: Option<alpha_beta::Fit>,
}

fn register_fonts() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The font is compiled in (ttf-noto-sans): no system fonts, fontconfig or freetype needed.
        let _ =
            plotters::style::register_font("sans-serif", FontStyle::Normal, ttf_noto_sans::REGULAR);
    });
}

/// The row of the median time among measurements of one point.
pub(crate) fn median_row(mut rows: Vec<Row>) -> Row {
    rows.sort_by(|a, b| a.time_us.total_cmp(&b.time_us));
    rows.swap_remove((rows.len() - 1) / 2)
}

/// The series of one collective's rows. All series show one placement where they all measured
/// it (out-of-place first, nccl-tests' headline), else each series its own (out-of-place where
/// measured). The same point measured by several files is shown by the row with the median time.
pub fn series(rows: &[&Row]) -> Vec<Series> {
    let differ = |f: fn(&Row) -> &str| {
        rows.iter()
            .map(|r| f(r))
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 1
    };
    let (many_dtypes, many_ops) = (differ(|r| &r.dtype), differ(|r| &r.redop));
    let mut groups: BTreeMap<(String, usize, usize, String, String), Vec<&Row>> = BTreeMap::new();
    for r in rows {
        let key = (
            r.backend.clone(),
            r.world_size,
            r.nodes,
            r.dtype.clone(),
            r.redop.clone(),
        );
        groups.entry(key).or_default().push(r);
    }
    let everywhere = |p: &str| groups.values().all(|g| g.iter().any(|r| r.placement == p));
    let common = ["out-of-place", "in-place"]
        .into_iter()
        .find(|p| everywhere(p));
    let mut out = Vec::new();
    for ((backend, world_size, nodes, dtype, redop), group) in groups {
        let placement = common.unwrap_or(if group.iter().any(|r| r.placement == "out-of-place") {
            "out-of-place"
        } else {
            "in-place"
        });
        let mut by_size: BTreeMap<u64, Vec<Row>> = BTreeMap::new();
        for r in group.into_iter().filter(|r| r.placement == placement) {
            by_size.entry(r.bytes).or_default().push(r.clone());
        }
        let mut label = format!("{backend}, {world_size} ranks");
        if nodes > 1 {
            let _ = write!(label, " on {nodes} nodes");
        }
        if many_dtypes {
            let _ = write!(label, ", {dtype}");
        }
        if many_ops {
            let _ = write!(label, ", {redop}");
        }
        let _ = write!(label, " ({placement})");
        let points: Vec<Row> = by_size.into_values().map(median_row).collect();
        out.push(Series {
            label,
            backend,
            world_size,
            fit: alpha_beta::fit_rows(&points),
            points,
        });
    }
    out
}

/// How a report names its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Naming {
    /// `COLLECTIVE-time`, `COLLECTIVE-busbw`, `COLLECTIVE-100MB` (.png, .svg) and report.md.
    #[default]
    Report,
    /// The course's names (seeds/004) where it names them: all_reduce's plots are
    /// `allreduce_time_vs_datasize`, `allreduce_bandwidth_vs_datasize` and
    /// `allreduce_backend_comparison_100mb`, and beside report.md come `full_results.md`,
    /// `summary_by_config.md` and `analysis.txt`.
    Course,
}

/// A plot's file stem: `{collective}-{kind}`, or the course's name for all_reduce's plots.
fn plot_stem(naming: Naming, collective: &str, kind: &str) -> String {
    let course = match kind {
        "time" => "allreduce_time_vs_datasize",
        "busbw" => "allreduce_bandwidth_vs_datasize",
        _ => "allreduce_backend_comparison_100mb",
    };
    if naming == Naming::Course && collective == "all_reduce" {
        course.to_string()
    } else {
        format!("{collective}-{kind}")
    }
}

/// Reads `files`, writes plots and report.md into `out`, and returns what it wrote and observed.
pub fn report(files: &[PathBuf], out: &Path) -> Result<Report, BenchError> {
    report_as(files, out, Naming::Report)
}

/// [`report`], naming the files as `naming` says (and, for the course, writing its extra files).
pub fn report_as(files: &[PathBuf], out: &Path, naming: Naming) -> Result<Report, BenchError> {
    let (rows, sources) = read_rows(files)?;
    std::fs::create_dir_all(out).map_err(|source| BenchError::CreateDir {
        path: out.to_path_buf(),
        source,
    })?;
    let sections = sections(&rows, naming);
    let charts: Vec<&Chart> = sections.iter().flat_map(|s| &s.charts).collect();
    let mut report = Report {
        files: draw_charts(&charts, out)?,
        observations: sections
            .iter()
            .flat_map(|s| s.observations.iter().cloned())
            .collect(),
    };
    let sources = sources.join(", ");
    let mut texts = vec![("report.md", report_md(&sources, &rows, &sections))];
    if naming == Naming::Course {
        texts.extend(course_texts(&sources, &sections));
    }
    for (file, text) in texts {
        let path = out.join(file);
        std::fs::write(&path, text).map_err(|source| BenchError::WriteFile {
            path: path.clone(),
            source,
        })?;
        report.files.push(path);
    }
    Ok(report)
}

/// Every row of `files`, and each file as report.md names it: `` `r.csv` (108 rows) ``.
fn read_rows(files: &[PathBuf]) -> Result<(Vec<Row>, Vec<String>), BenchError> {
    let mut rows = Vec::new();
    let mut sources = Vec::new();
    for f in files {
        let read = record::read(f)?;
        sources.push(format!("`{}` ({} rows)", f.display(), read.len()));
        rows.extend(read);
    }
    if rows.is_empty() {
        return Err(BenchError::NoRows);
    }
    Ok((rows, sources))
}

/// One collective's part of the report: its rows, its plot lines, the charts drawn from them
/// and the sentences computed from them.
struct Section<'a> {
    name: String,
    rows: Vec<&'a Row>,
    series: Vec<Series>,
    charts: Vec<Chart>,
    observations: Vec<String>,
}

/// One section per collective in the rows: comm-core's in its order, then names it does not
/// know (from a newer comm-bench, say) in the order they first appear.
fn sections(rows: &[Row], naming: Naming) -> Vec<Section<'_>> {
    let mut names: Vec<String> = Collective::ALL
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    for r in rows {
        if !names.contains(&r.collective) {
            names.push(r.collective.clone());
        }
    }
    let mut stems = Vec::new();
    let mut sections = Vec::new();
    for name in names {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.collective == name).collect();
        if mine.is_empty() {
            continue;
        }
        let series = series(&mine);
        let stem = file_stem(&name, &stems);
        stems.push(stem.clone());
        sections.push(Section {
            charts: charts(&name, &stem, &series, naming),
            observations: observe(&name, &series),
            name,
            rows: mine,
            series,
        });
    }
    sections
}

/// report.md: where the rows come from, the machines, what the numbers mean, then per
/// collective its plots, observations and every row.
fn report_md(sources: &str, rows: &[Row], sections: &[Section]) -> String {
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
fn course_texts(sources: &str, sections: &[Section]) -> [(&'static str, String); 3] {
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

fn plot_error(e: impl std::error::Error + Send + Sync + 'static) -> BenchError {
    BenchError::Plot(Box::new(e))
}

/// A chart of the report and the stem of its files (`{stem}.png`, `{stem}.svg`).
struct Chart {
    stem: String,
    plot: Plot,
}

/// What a chart shows.
enum Plot {
    Lines(Lines),
    /// (label, time in ms, size in bytes) per bar.
    Bars {
        title: String,
        bars: Vec<(String, f64, u64)>,
    },
}

impl Plot {
    fn title(&self) -> &str {
        match self {
            Plot::Lines(lines) => &lines.title,
            Plot::Bars { title, .. } => title,
        }
    }

    fn draw(&self, format: Format, path: &Path) -> Result<(), BenchError> {
        match format {
            Format::Png => {
                self.draw_on(BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area())
            }
            Format::Svg => self.draw_on(SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area()),
        }
    }

    fn draw_on<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), BenchError>
    where
        DB::ErrorType: 'static,
    {
        match self {
            Plot::Lines(lines) => draw_lines(root, lines),
            Plot::Bars { title, bars } => draw_bars(root, title, bars),
        }
    }
}

/// The files each chart is drawn to.
#[derive(Debug, Clone, Copy)]
enum Format {
    Png,
    Svg,
}

impl Format {
    fn extension(self) -> &'static str {
        match self {
            Format::Png => "png",
            Format::Svg => "svg",
        }
    }
}

/// A plot's data: lines of (x, y) points, and beside each the fitted model's (dashed; empty
/// where it has none).
struct Lines {
    title: String,
    y_desc: &'static str,
    lines: Vec<(String, Vec<(f64, f64)>)>,
    models: Vec<Vec<(f64, f64)>>,
}

/// The point nearest [`COMPARE_BYTES`] in a series, if one lies within a factor of 2.
pub fn near_100mb(s: &Series) -> Option<&Row> {
    s.points
        .iter()
        .map(|r| (r, (r.bytes as f64 / COMPARE_BYTES).log2().abs()))
        .filter(|(_, d)| *d <= 1.0)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(r, _)| r)
}

/// The start of the file names of a collective's plots: its name with every character outside
/// `[A-Za-z0-9_-]` replaced by `_` (a name from a CSV such as `../x` must never lead outside
/// `-o`), made different from the stems already `taken`.
pub fn file_stem(name: &str, taken: &[String]) -> String {
    let mut clean: String = name
        .chars()
        .take(64)
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '_' | '-' => c,
            _ => '_',
        })
        .collect();
    if clean.is_empty() {
        clean = "unnamed".into();
    }
    let mut stem = clean.clone();
    let mut n = 2;
    while taken.contains(&stem) {
        stem = format!("{clean}-{n}");
        n += 1;
    }
    stem
}

/// Draws each chart as PNG and SVG into `out`, in parallel: every file is independent, and
/// drawing (above all rasterizing and encoding the PNGs) is most of a report's work. Returns the
/// files in the charts' order, each PNG before its SVG.
fn draw_charts(charts: &[&Chart], out: &Path) -> Result<Vec<PathBuf>, BenchError> {
    register_fonts();
    let files: Vec<(&Chart, Format, PathBuf)> = charts
        .iter()
        .flat_map(|&chart| {
            [Format::Png, Format::Svg].map(|format| {
                let path = out.join(format!("{}.{}", chart.stem, format.extension()));
                (chart, format, path)
            })
        })
        .collect();
    files
        .par_iter()
        .try_for_each(|(chart, format, path)| chart.plot.draw(*format, path))?;
    Ok(files.into_iter().map(|(_, _, path)| path).collect())
}

/// The charts of one collective: time and busbw against size, and the time near 100 MB by
/// backend and ranks where some series measured near it.
fn charts(name: &str, file: &str, series: &[Series], naming: Naming) -> Vec<Chart> {
    let line_chart = |kind: &str, title: String, y_desc, y: fn(&Row) -> f64| Chart {
        stem: plot_stem(naming, file, kind),
        plot: Plot::Lines(Lines {
            title,
            y_desc,
            lines: series
                .iter()
                .map(|s| {
                    let p = s.points.iter().map(|r| (r.bytes as f64, y(r)));
                    (s.label.clone(), p.collect())
                })
                .collect(),
            // A row's y scaled by the model's time over the measured one: the model's y.
            models: series
                .iter()
                .map(|s| {
                    let Some(fit) = &s.fit else { return Vec::new() };
                    s.points
                        .iter()
                        .filter_map(|r| {
                            let at = fit.points.iter().position(|p| p.size == r.bytes)?;
                            let ratio = fit.points[at].time_us / fit.model.time_us(&fit.points[at]);
                            let y = y(r);
                            let modelled = if kind == "time" { y / ratio } else { y * ratio };
                            Some((r.bytes as f64, modelled))
                        })
                        .collect()
                })
                .collect(),
        }),
    };
    let mut charts = vec![
        line_chart("time", format!("{name}: time vs size"), "time (ms)", |r| {
            r.time_us / 1e3
        }),
        line_chart(
            "busbw",
            format!("{name}: bus bandwidth vs size"),
            "busbw (GB/s)",
            |r| r.busbw_gbps,
        ),
    ];
    let bars: Vec<(String, f64, u64)> = series
        .iter()
        .filter_map(|s| {
            near_100mb(s).map(|r| {
                (
                    format!("{}, {} ranks", s.backend, s.world_size),
                    r.time_us / 1e3,
                    r.bytes,
                )
            })
        })
        .collect();
    if !bars.is_empty() {
        charts.push(Chart {
            stem: plot_stem(naming, file, "100MB"),
            plot: Plot::Bars {
                title: format!("{name} at 100 MB: time by backend and ranks"),
                bars,
            },
        });
    }
    charts
}

/// Decade bounds around positive values, for a log axis.
fn decades(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return (1.0, 10.0);
    }
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf(hi.log10().ceil());
    (lo, if hi > lo { hi } else { lo * 10.0 })
}

/// An axis label: `1000`, `2.5`, `0.01`.
fn number(v: f64) -> String {
    if v >= 1.0 || v <= 0.0 {
        return crate::units::trim(format!("{v:.2}"));
    }
    let decimals = (-v.log10()).ceil() as usize + 1;
    crate::units::trim(format!("{v:.decimals$}"))
}

fn color(i: usize) -> RGBColor {
    const COLORS: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    COLORS[i % COLORS.len()]
}

fn draw_lines<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    plot: &Lines,
) -> Result<(), BenchError>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_error)?;
    let points = || plot.lines.iter().flat_map(|(_, p)| p.iter());
    let (x0, x1) = decades(points().map(|p| p.0));
    let (y0, y1) = decades(points().map(|p| p.1));
    let mut chart = ChartBuilder::on(&root)
        .caption(&plot.title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("size (bytes, log)")
        .y_desc(format!("{} (log)", plot.y_desc))
        .x_label_formatter(&|v| human_bytes(*v))
        .y_label_formatter(&|v| number(*v))
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(plot_error)?;
    for (i, model) in plot.models.iter().enumerate() {
        let model: Vec<(f64, f64)> = model.iter().copied().filter(|p| p.1 > 0.0).collect();
        if model.is_empty() {
            continue;
        }
        let style = color(i).stroke_width(1);
        chart
            .draw_series(DashedLineSeries::new(model, 6, 4, style))
            .map_err(plot_error)?;
    }
    if plot.models.iter().any(|m| !m.is_empty()) {
        // One legend entry for all the dashed lines.
        chart
            .draw_series(std::iter::empty::<PathElement<(f64, f64)>>())
            .map_err(plot_error)?
            .label("dashed: the model, steps x alpha + bytes / B (comm-bench model)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], BLACK.mix(0.6)));
    }
    for (i, (label, pts)) in plot.lines.iter().enumerate() {
        let style = color(i).stroke_width(2);
        let pts: Vec<(f64, f64)> = pts.iter().copied().filter(|p| p.1 > 0.0).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), style))
            .map_err(plot_error)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color(i).filled())))
            .map_err(plot_error)?;
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(plot_error)?;
    root.present().map_err(plot_error)
}

fn draw_bars<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    bars: &[(String, f64, u64)],
) -> Result<(), BenchError>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_error)?;
    let (y0, y1) = decades(bars.iter().map(|b| b.1));
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(70)
        // An integer range's segments include its end: n bars take 0..n-1.
        .build_cartesian_2d(
            // (one bar gets an empty neighbour: a range 0..0 has no width)
            (0..bars.len().max(2) - 1).into_segmented(),
            (y0..y1).log_scale(),
        )
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len().max(2))
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("time (ms, log)")
        .y_label_formatter(&|v| number(*v))
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(plot_error)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let mut bar = Rectangle::new(
                [
                    (SegmentValue::Exact(i), y0),
                    (SegmentValue::Exact(i + 1), b.1),
                ],
                color(i).filled(),
            );
            bar.set_margin(0, 0, 12, 12);
            bar
        }))
        .map_err(plot_error)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            Text::new(
                format!("{:.2} ms ({})", b.1, human_bytes(b.2 as f64)),
                (SegmentValue::CenterOf(i), b.1 * 1.08),
                ("sans-serif", 15)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Bottom)),
            )
        }))
        .map_err(plot_error)?;
    root.present().map_err(plot_error)
}

fn ms(us: f64) -> String {
    let ms = us / 1e3;
    if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else if ms >= 1.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{:.1} us", us)
    }
}

/// A few sentences computed from the numbers: where each series' bandwidth saturates, how each
/// backend scales with ranks, and how the backends compare near 100 MB.
pub fn observe(name: &str, series: &[Series]) -> Vec<String> {
    let mut out: Vec<String> = series.iter().filter_map(|s| saturation(name, s)).collect();
    out.extend(series.iter().filter_map(|s| modelled(name, s)));
    out.extend(scaling(name, series));
    out.extend(backends_compared(name, series));
    out
}

/// Where one series' busbw comes within 10% of its peak, if it measured 3 sizes or more.
fn saturation(name: &str, s: &Series) -> Option<String> {
    if s.points.len() < 3 {
        return None;
    }
    let sized = |b: u64| human_bytes(b as f64);
    let peak = s
        .points
        .iter()
        .max_by(|a, b| a.busbw_gbps.total_cmp(&b.busbw_gbps))
        .expect("points");
    if peak.busbw_gbps <= 0.0 {
        return None;
    }
    let first = s
        .points
        .iter()
        .find(|r| r.busbw_gbps >= 0.9 * peak.busbw_gbps)
        .expect("the peak itself");
    let last = s.points.last().expect("points");
    let smallest = &s.points[0];
    Some(if first.bytes == last.bytes {
        format!(
            "{name}, {}: busbw is still rising at the largest size measured ({} at {}): not saturated yet; try a larger -e.",
            s.label,
            gbps(last.busbw_gbps),
            sized(last.bytes)
        )
    } else if last.busbw_gbps < 0.9 * peak.busbw_gbps {
        format!(
            "{name}, {}: busbw peaks at {} ({}) and falls to {} at {} (the model below says where and why).",
            s.label,
            sized(peak.bytes),
            gbps(peak.busbw_gbps),
            gbps(last.busbw_gbps),
            sized(last.bytes)
        )
    } else {
        format!(
            "{name}, {}: busbw saturates from {} on, within 10% of its peak {} (at {}); the smallest size ({}) takes {}, the latency floor.",
            s.label,
            sized(first.bytes),
            gbps(peak.busbw_gbps),
            sized(peak.bytes),
            sized(smallest.bytes),
            ms(smallest.time_us)
        )
    })
}

/// The latency-bandwidth model fitted to one series, in words: its constants, the regimes, and
/// where it stops holding (alpha_beta).
fn modelled(name: &str, s: &Series) -> Option<String> {
    let fit = s.fit.as_ref()?;
    let m = &fit.model;
    let mut text = format!(
        "{name}, {}: the model t = steps x alpha + bytes / B fits alpha = {:.2} us per step and B = {:.2} GB/s",
        s.label, m.alpha_us, m.large_gbps()
    );
    if m.has_knee() {
        let _ = write!(text, " ({:.2} GB/s from memory)", m.memory_gbps());
    }
    let words = alpha_beta::in_words(fit, None);
    let _ = write!(text, "; {}", words.trim().replace("\n  ", " "));
    Some(text)
}

/// How it scales with ranks, per backend, at the largest size every world size measured.
fn scaling(name: &str, series: &[Series]) -> Vec<String> {
    let mut by_backend: BTreeMap<&str, Vec<&Series>> = BTreeMap::new();
    for s in series {
        by_backend.entry(&s.backend).or_default().push(s);
    }
    let mut out = Vec::new();
    for (backend, list) in &by_backend {
        let mut sizes: Vec<usize> = list.iter().map(|s| s.world_size).collect();
        sizes.sort();
        sizes.dedup();
        if sizes.len() < 2 || list.len() != sizes.len() {
            continue; // several types or reductions per world size: no single line to compare
        }
        let common = list[0]
            .points
            .iter()
            .map(|r| r.bytes)
            .filter(|&b| {
                list.iter()
                    .all(|s| s.points.iter().any(|r| same_size(r.bytes, b)))
            })
            .max();
        let Some(bytes) = common else { continue };
        let mut at: Vec<&Row> = list
            .iter()
            .filter_map(|s| s.points.iter().find(|r| same_size(r.bytes, bytes)))
            .collect();
        at.sort_by_key(|r| r.world_size);
        let (lo, hi) = (at[0], at[at.len() - 1]);
        let join =
            |f: &dyn Fn(&Row) -> String| at.iter().map(|r| f(r)).collect::<Vec<_>>().join(" → ");
        let verdict = scaling_verdict(hi.busbw_gbps / lo.busbw_gbps - 1.0);
        out.push(format!(
            "{name} on {backend} at {}, {} ranks: time {}, busbw {}{}{verdict}.",
            human_bytes(bytes as f64),
            join(&|r| r.world_size.to_string()),
            join(&|r| ms(r.time_us)),
            join(&|r| gbps(r.busbw_gbps)),
            if verdict.is_empty() { "" } else { "; " },
        ));
    }
    out
}

/// What a change of busbw from the fewest ranks to the most says (empty when not a number).
fn scaling_verdict(change: f64) -> String {
    if !change.is_finite() {
        String::new()
    } else if change.abs() <= 0.15 {
        "busbw holds within 15%: time grows as the bus model predicts for more ranks".into()
    } else if change < 0.0 {
        format!(
            "busbw falls {:.0}%: the ranks share something that does not grow with them (cores, memory bandwidth, a link)",
            -change * 100.0
        )
    } else {
        format!("busbw rises {:.0}% with more ranks", change * 100.0)
    }
}

/// The backends side by side near 100 MB, per world size.
fn backends_compared(name: &str, series: &[Series]) -> Vec<String> {
    let mut by_ws: BTreeMap<usize, Vec<(&Series, &Row)>> = BTreeMap::new();
    for s in series {
        if let Some(r) = near_100mb(s) {
            by_ws.entry(s.world_size).or_default().push((s, r));
        }
    }
    let mut out = Vec::new();
    for (ws, mut list) in by_ws {
        let backends: std::collections::BTreeSet<&str> =
            list.iter().map(|(s, _)| s.backend.as_str()).collect();
        if backends.len() < 2 {
            continue;
        }
        list.sort_by(|a, b| a.1.time_us.total_cmp(&b.1.time_us));
        let (fast, slow) = (list[0], list[list.len() - 1]);
        out.push(format!(
            "{name} near 100 MB on {ws} ranks: {} takes {} ({} busbw), {} takes {} ({} busbw): {} is {:.1}x faster.",
            fast.0.backend,
            ms(fast.1.time_us),
            gbps(fast.1.busbw_gbps),
            slow.0.backend,
            ms(slow.1.time_us),
            gbps(slow.1.busbw_gbps),
            fast.0.backend,
            slow.1.time_us / fast.1.time_us
        ));
    }
    out
}

fn gbps(v: f64) -> String {
    format!("{v:.2} GB/s")
}

/// Every collective's bus factor as the table writes it: `all_reduce 2(n-1)/n, ...`.
fn bus_rules() -> String {
    let rule = |c: Collective| format!("{} {}", c.name(), c.describe().bus_rule);
    Collective::ALL.map(rule).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::sample_row;

    fn row(backend: &str, ws: usize, bytes: u64, us: f64, busbw: f64) -> Row {
        Row {
            backend: backend.into(),
            world_size: ws,
            bytes,
            time_us: us,
            busbw_gbps: busbw,
            ..sample_row()
        }
    }

    #[test]
    fn saturation_scaling_and_comparison() {
        let rows = [
            row("cpu", 2, 1_000_000, 1800.0, 0.55),
            row("cpu", 2, 10_000_000, 12_000.0, 0.83),
            row("cpu", 2, 100_000_000, 115_000.0, 0.87),
            row("cpu", 4, 1_000_000, 3000.0, 0.5),
            row("cpu", 4, 10_000_000, 22_000.0, 0.68),
            row("cpu", 4, 100_000_000, 198_000.0, 0.76),
            row("nccl", 2, 1_000_000, 30.0, 33.0),
            row("nccl", 2, 10_000_000, 80.0, 125.0),
            row("nccl", 2, 100_000_000, 600.0, 166.0),
        ];
        let refs: Vec<&Row> = rows.iter().collect();
        let s = series(&refs);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].label, "cpu, 2 ranks (out-of-place)");
        let o = observe("all_reduce", &s);
        let all = o.join("\n");
        assert!(
            all.contains("cpu, 2 ranks (out-of-place): busbw saturates from 10 MB on"),
            "{all}"
        );
        assert!(
            all.contains("on cpu at 100 MB, 2 → 4 ranks: time 115 ms → 198 ms"),
            "{all}"
        );
        assert!(all.contains("busbw holds within 15%"), "{all}");
        assert!(all.contains("nccl takes 600.0 us"), "{all}");
        assert!(all.contains("191.7x faster"), "{all}");
    }

    #[test]
    fn duplicates_show_the_median_run() {
        let rows = [
            row("cpu", 2, 1000, 5.0, 1.0),
            row("cpu", 2, 1000, 9.0, 1.0),
            row("cpu", 2, 1000, 7.0, 1.0),
        ];
        let refs: Vec<&Row> = rows.iter().collect();
        let s = series(&refs);
        assert_eq!(s[0].points.len(), 1);
        assert_eq!(s[0].points[0].time_us, 7.0);
    }

    #[test]
    fn peaks_and_near_sizes() {
        let rows = [
            row("cpu", 2, 1024, 10.0, 0.1),
            row("cpu", 2, 65536, 50.0, 1.0),
            row("cpu", 2, 524288, 900.0, 0.5),
            row("cpu", 3, 1020, 10.0, 0.1),
            row("cpu", 3, 524280, 900.0, 0.5),
        ];
        let refs: Vec<&Row> = rows.iter().collect();
        let all = observe("all_gather", &series(&refs)).join("\n");
        assert!(
            all.contains("busbw peaks at 64 KiB (1.00 GB/s) and falls to 0.50 GB/s"),
            "{all}"
        );
        assert!(all.contains("at 512 KiB, 2 → 3 ranks"), "{all}");
        assert_eq!(number(0.01), "0.01");
        assert_eq!(number(1000.0), "1000");
        assert_eq!(number(2.5), "2.5");
    }

    #[test]
    fn one_placement_for_all_series_where_possible() {
        let mut rows = vec![row("cpu", 2, 1000, 5.0, 1.0), row("cpu", 4, 1000, 9.0, 1.0)];
        rows[1].placement = "in-place".into();
        let mut both = rows[0].clone();
        both.placement = "in-place".into();
        rows.push(both);
        let refs: Vec<&Row> = rows.iter().collect();
        let s = series(&refs);
        assert!(s.iter().all(|s| s.label.ends_with("(in-place)")), "{s:?}");
    }

    #[test]
    fn file_stems_stay_inside_the_folder() {
        assert_eq!(file_stem("all_reduce", &[]), "all_reduce");
        assert_eq!(file_stem("../x", &[]), "___x");
        assert_eq!(file_stem("a/b", &[]), "a_b");
        assert_eq!(file_stem("", &[]), "unnamed");
        assert_eq!(file_stem("a.b", &["a_b".into()]), "a_b-2");
    }

    #[test]
    fn decade_bounds() {
        assert_eq!(decades([3.0, 250.0].into_iter()), (1.0, 1000.0));
        assert_eq!(decades([0.0, -1.0].into_iter()), (1.0, 10.0));
        assert_eq!(decades([100.0].into_iter()), (100.0, 1000.0));
    }
}
