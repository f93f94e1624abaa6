//! One section of the report per collective: its rows, its series, the charts drawn from them
//! and the sentences computed from them.

use comm_core::Collective;

use super::charts::{charts, file_stem, Chart, Naming};
use super::observations::observe;
use super::series::{series, Series};
use crate::record::Row;

/// One collective's part of the report: its rows, its plot lines, the charts drawn from them
/// and the sentences computed from them.
pub struct Section<'a> {
    pub name: String,
    pub rows: Vec<&'a Row>,
    pub series: Vec<Series>,
    pub charts: Vec<Chart>,
    pub observations: Vec<String>,
}

/// One section per collective in the rows: comm-core's in its order, then names it does not
/// know (from a newer comm-bench, say) in the order they first appear.
pub fn sections(rows: &[Row], naming: Naming) -> Vec<Section<'_>> {
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
