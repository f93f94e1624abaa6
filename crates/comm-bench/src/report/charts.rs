//! The report's pictures: time and busbw against size per collective (log axes, a line per
//! series, the fitted model dashed beside it) and the time near 100 MB as bars, each drawn as PNG
//! and SVG with plotters and a compiled-in font; and how their files are named.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use rayon::prelude::*;

use super::series::{near_100mb, Series};
use crate::error::BenchError;
use crate::record::Row;
use crate::units::human_bytes;

const WIDTH: u32 = 960;
const HEIGHT: u32 = 600;

fn register_fonts() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The font is compiled in (ttf-noto-sans): no system fonts, fontconfig or freetype needed.
        let _ =
            plotters::style::register_font("sans-serif", FontStyle::Normal, ttf_noto_sans::REGULAR);
    });
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

fn plot_error(e: impl std::error::Error + Send + Sync + 'static) -> BenchError {
    BenchError::Plot(Box::new(e))
}

/// A chart of the report and the stem of its files (`{stem}.png`, `{stem}.svg`).
pub struct Chart {
    pub stem: String,
    pub plot: Plot,
}

/// What a chart shows.
pub enum Plot {
    Lines(Lines),
    /// (label, time in ms, size in bytes) per bar.
    Bars {
        title: String,
        bars: Vec<(String, f64, u64)>,
    },
}

impl Plot {
    pub fn title(&self) -> &str {
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
pub struct Lines {
    title: String,
    y_desc: &'static str,
    lines: Vec<(String, Vec<(f64, f64)>)>,
    models: Vec<Vec<(f64, f64)>>,
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
pub fn draw_charts(charts: &[&Chart], out: &Path) -> Result<Vec<PathBuf>, BenchError> {
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
pub fn charts(name: &str, file: &str, series: &[Series], naming: Naming) -> Vec<Chart> {
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
    let has_model = plot.models.iter().any(|m| !m.is_empty());
    let mut legend: Vec<(String, ShapeStyle, bool)> = Vec::new();
    if has_model {
        // One legend entry for all the dashed lines.
        let note = "dashed: the model, steps x alpha + bytes / B (comm-bench model)";
        legend.push((note.into(), BLACK.mix(0.6).stroke_width(1), true));
    }
    for (i, (label, _)) in plot.lines.iter().enumerate() {
        legend.push((label.clone(), color(i).stroke_width(2), false));
    }
    // The legend gets a strip of its own under the chart, so it never covers a point.
    let (chart_area, legend_area) = root.split_vertically(HEIGHT - legend_height(legend.len()));
    let points = || plot.lines.iter().flat_map(|(_, p)| p.iter());
    let (x0, x1) = decades(points().map(|p| p.0));
    let (y0, y1) = decades(points().map(|p| p.1));
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(&plot.title, ("sans-serif", 24))
        .margin(16)
        // Room for the last size's label ("100 MB") right of the axis's end.
        .margin_right(40)
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
    for (i, (_, pts)) in plot.lines.iter().enumerate() {
        let style = color(i).stroke_width(2);
        let pts: Vec<(f64, f64)> = pts.iter().copied().filter(|p| p.1 > 0.0).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), style))
            .map_err(plot_error)?;
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color(i).filled())))
            .map_err(plot_error)?;
    }
    draw_legend(&legend_area, &legend)?;
    root.present().map_err(plot_error)
}

/// Legend rows: two entries to a row, the model's note alone on the first.
const LEGEND_ROW: u32 = 22;

fn legend_rows(entries: usize) -> u32 {
    entries.div_ceil(2) as u32 + 1
}

fn legend_height(entries: usize) -> u32 {
    legend_rows(entries) * LEGEND_ROW + 8
}

/// The legend under the chart: a line sample (dashed for the model) and its label, in two
/// columns; the model's note, when there is one, on a row of its own.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(String, ShapeStyle, bool)],
) -> Result<(), BenchError>
where
    DB::ErrorType: 'static,
{
    let font = ("sans-serif", 15).into_font().color(&BLACK);
    let column = (WIDTH as i32 - 100) / 2;
    let mut slots = (0..).map(|k: i32| (86 + (k % 2) * column, 4 + (k / 2) * LEGEND_ROW as i32));
    for (label, style, dashed) in entries {
        let (x, y) = if *dashed {
            // The note is long: a row of its own.
            let at = slots.next().unwrap();
            slots.next();
            at
        } else {
            slots.next().unwrap()
        };
        let mid = y + LEGEND_ROW as i32 / 2;
        let sample = if *dashed {
            vec![((x, mid), (x + 8, mid)), ((x + 14, mid), (x + 22, mid))]
        } else {
            vec![((x, mid), (x + 22, mid))]
        };
        for (a, b) in sample {
            area.draw(&PathElement::new(vec![a, b], *style))
                .map_err(plot_error)?;
        }
        let pos = Pos::new(HPos::Left, VPos::Center);
        area.draw_text(label, &font.pos(pos), (x + 30, mid))
            .map_err(plot_error)?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(number(0.01), "0.01");
        assert_eq!(number(1000.0), "1000");
        assert_eq!(number(2.5), "2.5");
    }
}
