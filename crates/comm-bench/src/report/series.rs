//! The report's lines: one per backend, world size (and type, reduction, placement) of a
//! collective's rows, each size at its median row, with the α–β fit drawn and told beside it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::model::fit::Fit;
use crate::model::series::fit_rows;
use crate::record::{median_row, Row};

/// Two sizes count as the same point when they differ by less than this (all_gather rounds the
/// size to whole elements per rank, so 2 and 3 ranks measure 524288 and 524280 bytes).
const SAME_SIZE: f64 = 0.01;

pub fn same_size(a: u64, b: u64) -> bool {
    (a as f64 - b as f64).abs() <= SAME_SIZE * a.max(b) as f64
}

/// The size the backend comparison is made at, as in the course (100 MB all-reduce).
pub const COMPARE_BYTES: f64 = 1e8;

/// One line of a plot: the rows of one backend, world size (and type, reduction, placement).
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub backend: String,
    pub world_size: usize,
    /// One row per size, sorted by size.
    pub points: Vec<Row>,
    /// The latency-bandwidth model fitted to the points, once for the plots and the words.
    pub fit: Option<Fit>,
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
            fit: fit_rows(&points),
            points,
        });
    }
    out
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

/// A row of `backend` on `ws` ranks: `bytes` in `us`, at `busbw`.
#[cfg(test)]
pub(crate) fn test_row(backend: &str, ws: usize, bytes: u64, us: f64, busbw: f64) -> Row {
    Row {
        backend: backend.into(),
        world_size: ws,
        bytes,
        time_us: us,
        busbw_gbps: busbw,
        ..crate::record::sample_row()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(backend: &str, ws: usize, bytes: u64, us: f64, busbw: f64) -> Row {
        test_row(backend, ws, bytes, us, busbw)
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
}
