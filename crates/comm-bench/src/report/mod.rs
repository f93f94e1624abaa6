//! `comm-bench report`: result files from any machines (a laptop's CPU run beside a cluster's GPU
//! run, as the course compares them) → PNG and SVG plots, markdown tables and observations
//! computed from the numbers.
//!
//! Per collective: time vs size and busbw vs size (log axes), one line per backend and
//! world size; the time of each at the size nearest 100 MB; a table of every row; and a few
//! sentences: where bandwidth saturates, how it scales with ranks, how the backends compare.
//!
//! - [`series`]: a collective's rows as plot lines, each with its α–β fit
//! - [`sections`]: one part per collective: its series, charts and observations
//! - [`charts`]: the plots (plotters, PNG and SVG) and their file names
//! - [`observations`]: the sentences computed from the numbers
//! - [`markdown`]: report.md and the course's text files

pub mod charts;
pub mod markdown;
pub mod observations;
pub mod sections;
pub mod series;

use std::path::{Path, PathBuf};

use self::charts::{draw_charts, Chart};
pub use self::charts::{file_stem, Naming};
use self::markdown::{course_texts, report_md};
use self::sections::sections;
pub use self::series::{near_100mb, series, Series, COMPARE_BYTES};
use crate::error::BenchError;
use crate::record::{self, Row};

/// What a report wrote and concluded.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub files: Vec<PathBuf>,
    pub observations: Vec<String>,
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
