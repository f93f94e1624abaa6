//! The rows of result files as series to fit: one per backend (and transport), collective, world
//! size, nodes, placement, type and reduction, each size at its median time, and each row's
//! time and algorithm as the fit reads them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use comm_core::backend::cpu::Algo;
use comm_core::Named;

use super::fit::{fit, Fit, Point, Shape};
use super::nccl::{self, Func};
use crate::record::{self, Row};

/// A series to fit: the rows of one backend, transport, collective, world size and placement.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub rows: Vec<Row>,
}

/// The algorithm whose steps explain a row: on the CPU backend the `--algo` it was measured
/// with, from its backend version ("…, ring algorithm …"), else comm-core's choice by size; on
/// NCCL its ring (a pipelined chain for broadcast), the algorithm of its bandwidth regime.
fn asked_algo(row: &Row) -> Option<Algo> {
    if row.backend != "cpu" {
        let nccl = row.collective().and_then(nccl::func);
        return Some(nccl.map_or(Algo::Ring, Func::ring_as_cpu));
    }
    Algo::ALL.iter().copied().find(|a| {
        row.backend_version
            .contains(&format!("{} algorithm", a.name()))
    })
}

/// The shape of a series' rows and their points (those this model has a structure for).
pub fn points(rows: &[Row]) -> Option<(Shape, Vec<Point>)> {
    // Predictions (comm-bench predict's "model:…" rows) are a model already.
    let first = rows.first().filter(|r| !r.backend.starts_with("model:"))?;
    let shape = Shape {
        collective: first.collective()?,
        world_size: first.world_size,
        in_place: first.placement == "in-place",
        asked: asked_algo(first),
        registered_from: match first.backend == "cpu" {
            true => record::registered_from(&first.backend_version),
            false => None,
        },
        on_cpu: first.backend == "cpu",
    };
    let mut points: Vec<Point> = rows
        .iter()
        .map(|r| (r, robust_time(r)))
        .filter(|(_, t)| t.is_finite() && *t > 0.0)
        .filter_map(|(r, t)| shape.point(r.bytes, t))
        .collect();
    points.sort_by_key(|p| p.size);
    Some((shape, points))
}

/// The time a row's point is fitted to: the median iteration where each iteration was timed
/// (-z 1 or 3, or -I 1: one slow iteration cannot move it), else the table's time.
fn robust_time(r: &Row) -> f64 {
    let per_iteration = r.blocking != 0 || r.per_iter_timing == 1;
    match per_iteration && r.time_us_median > 0.0 {
        true => r.time_us_median,
        false => r.time_us,
    }
}

/// Fits one series' rows.
pub fn fit_rows(rows: &[Row]) -> Option<Fit> {
    let (shape, points) = points(rows)?;
    fit(shape, &points)
}

/// Groups rows into series: one per backend (and transport), collective, world size, nodes,
/// placement, type and reduction; the same size measured twice keeps the median time.
pub fn series(rows: &[Row]) -> Vec<Series> {
    type Key = (String, String, String, usize, usize, String, String, String);
    let mut groups: BTreeMap<Key, Vec<Row>> = BTreeMap::new();
    for r in rows {
        let transport = r
            .backend_version
            .split(" (")
            .next()
            .unwrap_or("")
            .to_string();
        let key = (
            r.backend.clone(),
            transport,
            r.collective.clone(),
            r.world_size,
            r.nodes,
            r.placement.clone(),
            r.dtype.clone(),
            r.redop.clone(),
        );
        groups.entry(key).or_default().push(r.clone());
    }
    groups
        .into_iter()
        .map(
            |((backend, transport, name, n, nodes, placement, ..), rows)| {
                let mut label = format!("{backend} ({transport}), {name}, {n} ranks");
                if nodes > 1 {
                    let _ = write!(label, " on {nodes} nodes");
                }
                let _ = write!(label, ", {placement}");
                let mut by_size: BTreeMap<u64, Vec<Row>> = BTreeMap::new();
                for r in rows {
                    by_size.entry(r.bytes).or_default().push(r);
                }
                let rows = by_size.into_values().map(record::median_row).collect();
                Series { label, rows }
            },
        )
        .collect()
}
