//! `--calibrate FILE`: fits the model's two free scales (bandwidth and latency) to a real sweep
//! written by comm-bench (`--csv`), by least squares on the logarithm of the time, so a 10 us
//! point counts as much as a 10 ms one.

use std::path::Path;

use comm_core::Collective;

use super::system::{Calibration, System};
use crate::error::BenchError;
use crate::model::nccl::{self, Term};
use crate::record::{self, Row};

/// One measured point and what the fitted model says of it.
#[derive(Debug, Clone)]
pub struct Point {
    pub collective: Collective,
    pub world_size: usize,
    pub nodes: usize,
    pub bytes: u64,
    pub measured_us: f64,
    pub predicted_us: f64,
}

pub struct Fit {
    pub calibration: Calibration,
    /// Root mean square of ln(predicted / measured).
    pub rms_log: f64,
    pub points: Vec<Point>,
}

/// Reads `path` (record.rs' reader) and fits `system`'s scales to its rows.
pub fn calibrate(system: &System, path: &Path) -> Result<Fit, BenchError> {
    let rows = record::read(path)?;
    let usable = usable(system, &rows);
    if usable.is_empty() {
        return Err(BenchError::NothingToCalibrate {
            path: path.to_path_buf(),
        });
    }
    let cost = |bw: f64, lat: f64| -> f64 {
        usable
            .iter()
            .map(|(row, terms)| {
                let t = nccl::fastest(terms, bw, lat).map_or(f64::INFINITY, |c| c.time_us);
                (t / row.time_us).ln().powi(2)
            })
            .sum()
    };
    let (ln_bw, ln_lat) = search(cost);
    let (bw_scale, lat_scale) = (ln_bw.exp(), ln_lat.exp());
    let points: Vec<Point> = usable
        .iter()
        .map(|(row, terms)| Point {
            collective: row.collective().unwrap_or(Collective::AllReduce),
            world_size: row.world_size,
            nodes: row.nodes.max(1),
            bytes: row.bytes,
            measured_us: row.time_us,
            predicted_us: nccl::fastest(terms, bw_scale, lat_scale).map_or(f64::NAN, |c| c.time_us),
        })
        .collect();
    Ok(Fit {
        calibration: Calibration {
            bw_scale,
            lat_scale,
        },
        rms_log: (cost(bw_scale, lat_scale) / points.len() as f64).sqrt(),
        points,
    })
}

/// The rows the model covers (2 or more ranks, a collective it models, a time), out-of-place
/// ones only when there are any (in-place would count each size twice), each with the model's
/// terms at scale 1 for its world size and nodes.
fn usable<'a>(system: &System, rows: &'a [Row]) -> Vec<(&'a Row, Vec<Term>)> {
    let any_out = rows.iter().any(|r| r.placement == "out-of-place");
    rows.iter()
        .filter(|r| !any_out || r.placement == "out-of-place")
        .filter(|r| r.time_us.is_finite() && r.time_us > 0.0 && r.world_size >= 2)
        .filter(|r| r.world_size % r.nodes.max(1) == 0)
        .filter_map(|r| {
            let coll = r.collective().filter(|&c| nccl::supported(c))?;
            let nodes = r.nodes.max(1);
            let mut s = system.clone();
            s.gpus_per_node = r.world_size / nodes;
            s.calibration = Calibration::default();
            Some((r, nccl::terms(&s.topo(nodes), coll, r.bytes)))
        })
        .collect()
}

/// Minimum of `cost` over ln(scale) in [-5, 5]² (scales 1/150 to 150): a grid, then two finer
/// grids around the best point. The model is piecewise (the chosen algorithm changes with the
/// scales), so a grid is safer than a gradient.
fn search(cost: impl Fn(f64, f64) -> f64) -> (f64, f64) {
    let (mut best, mut half) = ((0.0, 0.0), 5.0);
    for _ in 0..4 {
        let steps = 40;
        let step = 2.0 * half / steps as f64;
        let mut best_cost = f64::INFINITY;
        let center = best;
        for i in 0..=steps {
            for j in 0..=steps {
                let p = (
                    center.0 - half + i as f64 * step,
                    center.1 - half + j as f64 * step,
                );
                let c = cost(p.0.exp(), p.1.exp());
                if c < best_cost {
                    (best, best_cost) = (p, c);
                }
            }
        }
        half = step;
    }
    best
}
