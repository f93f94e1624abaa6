//! Why the curve bends: Hockney's latency–bandwidth (α–β) model fitted to a sweep, through each
//! algorithm's step structure (`comm-bench model`, and the dashed curves of `comm-bench report`).
//!
//! A call's time is its critical path: `steps` messages one after another, each paying the
//! latency α, and `bytes` through one rank's link at bandwidth B:
//!
//! ```text
//! t(s) = steps(s) · α + bytes(s) / B
//! ```
//!
//! The structures are those of Thakur, Rabenseifner and Gropp, "Optimization of Collective
//! Communication Operations in MPICH" (IJHPCA 2005), for the algorithms comm-core runs
//! (`comm_core::backend::cpu::chosen` says which runs at which size): ring all-reduce 2(n−1)
//! steps of s/n; direct all-reduce n−1 steps of s; ring all-gather and reduce-scatter n−1 steps
//! of s/n; binomial-tree broadcast ⌈log2 n⌉ steps of s; pipelined chain broadcast n−2+k steps of
//! one segment for k segments. The reduction's own cost (Thakur's γ) is folded into B.
//!
//! On a CPU B is not one number: while the ranks' buffers fit in a cache, copies run at cache
//! speed; past it, from memory. So the bandwidth term has two rates and a knee, the size C of
//! buffers at which the cache stops holding them, with a fraction 1 − C/W of the traffic from
//! memory when the buffers take W bytes (a streaming working set larger than the cache):
//!
//! ```text
//! bytes / B  =  bytes / B_cache  +  bytes · max(0, 1 − C/W) · (1/B_memory − 1/B_cache)
//! ```
//!
//! The fit: for each C on a log grid, a least-squares fit of (α, 1/B_cache, the memory
//! difference) with none negative, on *relative* errors (a 1 µs error at 8 B counts as much as
//! 1 ms at 100 MB), made robust to outliers by Huber's weights (iteratively reweighted: a point
//! further than 1.345 robust standard deviations from the curve counts less, so one point a
//! busy machine slowed cannot bend the line); the C with the least robust error wins.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use comm_core::backend::cpu::{chosen, Algo, CHAIN_SEGMENT_BYTES};
use comm_core::Collective;

use crate::record::Row;
use crate::units::human_bytes;

/// The critical path of one call: messages one after another, bytes through one rank's link,
/// and bytes it reduces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Path {
    /// The algorithm, as `--algo` names it.
    pub algo: &'static str,
    pub steps: f64,
    pub bytes: f64,
    pub reduced: f64,
}

/// The critical path of `collective` on `bytes` (the table's size) over `n` ranks, with the
/// algorithm the CPU backend runs there (`asked`: `--algo`); `None` for a collective this model
/// has no structure for.
pub fn path(collective: Collective, bytes: u64, n: usize, asked: Option<Algo>) -> Option<Path> {
    let (s, k) = (bytes as f64, n.saturating_sub(1) as f64);
    if n < 2 {
        return None;
    }
    let algo = chosen(collective, bytes as usize, n, asked)?;
    let block = s / n as f64;
    let (steps, through, reduced) = match (collective, algo) {
        // n−1 exchanges of the whole buffer, its two local copies (into the scratch and out, each
        // half a transfer's copy in and copy out), n−1 reductions of it.
        (Collective::AllReduce, Algo::Direct) => (k, k * s + s, k * s),
        (Collective::AllReduce, _) => (2.0 * k, 2.0 * k * block, k * block),
        (Collective::AllGather, _) => (k, k * block, 0.0),
        (Collective::ReduceScatter, _) => (k, k * block, k * block),
        (Collective::Broadcast, Algo::Tree) => {
            let rounds = (n as f64).log2().ceil();
            (rounds, rounds * s, 0.0)
        }
        (Collective::Broadcast, _) => {
            let segment = (CHAIN_SEGMENT_BYTES as f64).min(s.max(1.0));
            let segments = (s / segment).ceil().max(1.0);
            (segments + k - 1.0, s + (k - 1.0) * segment, 0.0)
        }
        _ => return None,
    };
    Some(Path {
        algo: algo.name(),
        steps,
        bytes: through,
        reduced,
    })
}

/// Bytes the ranks' buffers of one call take on a host: what a cache must hold.
pub fn working_set(collective: Collective, bytes: u64, n: usize, in_place: bool) -> f64 {
    let per_rank = match (collective, in_place) {
        (_, true) => 1.0,
        // all_gather reads 1/n and writes the whole; reduce_scatter the other way round.
        (Collective::AllGather | Collective::ReduceScatter, false) => 1.0 + 1.0 / n as f64,
        (_, false) => 2.0,
    };
    bytes as f64 * per_rank * n as f64
}

/// One point to fit: the call's path, its buffers' bytes, its measured time.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub size: u64,
    pub path: Path,
    pub working_set: f64,
    pub time_us: f64,
}

/// The fitted constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Model {
    /// Latency per step, µs.
    pub alpha_us: f64,
    /// Bandwidth while the buffers fit in the cache, GB/s (infinite if the fit found none).
    pub cache_gbps: f64,
    /// Bytes reduced per second in cache, GB/s (Thakur's 1/γ; infinite: no cost the fit sees).
    pub reduce_gbps: f64,
    /// Where the transport changes how it moves a message (as MPI's eager and rendezvous
    /// protocols, or NCCL's LL and Simple): from this call size on, bytes move at
    /// `switched_gbps` instead of `cache_gbps`. `None`: one way at every size.
    pub switch_bytes: Option<u64>,
    pub switched_gbps: f64,
    /// What every byte moved or reduced pays extra from memory, µs (memory's rate less the
    /// cache's, as time).
    pub memory_extra_us: f64,
    /// The knee: buffers of this many bytes on the host still fit.
    pub knee_bytes: f64,
}

/// µs per byte at `gbps`.
fn per_byte(gbps: f64) -> f64 {
    1e-3 / gbps
}

impl Model {
    /// The model's time for a point, µs: α per step, β per byte moved, γ per byte reduced, and
    /// past the knee every byte moved or reduced pays memory's extra.
    pub fn time_us(&self, p: &Point) -> f64 {
        let beta = match self.switch_bytes {
            Some(at) if p.size >= at => per_byte(self.switched_gbps),
            _ => per_byte(self.cache_gbps),
        };
        let memory = from_memory(self.knee_bytes, p.working_set) * self.memory_extra_us;
        p.path.steps * self.alpha_us
            + p.path.bytes * beta
            + p.path.reduced * per_byte(self.reduce_gbps)
            + (p.path.bytes + p.path.reduced) * memory
    }

    /// The rate in cache of the largest messages (past the switch, if there is one).
    pub fn large_gbps(&self) -> f64 {
        match self.switch_bytes {
            Some(_) => self.switched_gbps,
            None => self.cache_gbps,
        }
    }

    /// Bandwidth from memory, GB/s: the largest messages' rate with memory's extra (as
    /// [`large_gbps`](Self::large_gbps) where the fit found no knee).
    pub fn memory_gbps(&self) -> f64 {
        let beta = per_byte(self.large_gbps()) + self.memory_extra_us;
        if beta > 0.0 {
            1e-3 / beta
        } else {
            f64::INFINITY
        }
    }

    /// Whether the knee matters: memory slower than cache by more than 5%.
    pub fn has_knee(&self) -> bool {
        self.memory_gbps() < 0.95 * self.large_gbps()
    }
}

/// The fraction of the traffic that comes from memory when the buffers take `w` bytes and the
/// cache holds `knee`.
fn from_memory(knee: f64, w: f64) -> f64 {
    (1.0 - knee / w).max(0.0)
}

/// What every point of a series shares: the call's shape, from which its path at any size follows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    pub collective: Collective,
    pub world_size: usize,
    pub in_place: bool,
    /// `--algo`, if the sweep named one.
    pub asked: Option<Algo>,
    /// The CPU backend: its copies run from the host's caches or its memory (NCCL's do not).
    pub on_cpu: bool,
}

impl Shape {
    /// A point of this shape at `size` bytes, its time `time_us` (NaN: to be modelled).
    pub fn point(&self, size: u64, time_us: f64) -> Option<Point> {
        let (c, n) = (self.collective, self.world_size);
        Some(Point {
            size,
            path: path(c, size, n, self.asked)?,
            working_set: working_set(c, size, n, self.in_place),
            time_us,
        })
    }
}

/// A fit and how well it holds, point by point.
#[derive(Debug, Clone)]
pub struct Fit {
    pub shape: Shape,
    pub model: Model,
    pub points: Vec<Point>,
    /// (model − measured) / measured, per point.
    pub errors: Vec<f64>,
}

/// Knees tried: from 16 KB to 16 GB, 8 per decade, each with two measured sizes or more on
/// either side of it (the buffers within it, and twice past it); none (an infinite knee) where
/// the backend has no host cache to outgrow (NCCL) or there are too few sizes to place one.
fn knees(shape: &Shape, points: &[Point]) -> Vec<f64> {
    if !shape.on_cpu || points.len() < 6 {
        return vec![f64::INFINITY];
    }
    let within = |knee: f64| points.iter().filter(|p| p.working_set <= knee).count();
    let past = |knee: f64| {
        points
            .iter()
            .filter(|p| p.working_set >= 2.0 * knee)
            .count()
    };
    let mut knees: Vec<f64> = (0..=48)
        .map(|i| 16e3 * 10f64.powf(i as f64 / 8.0))
        .filter(|&knee| within(knee) >= 2 && past(knee) >= 2)
        .collect();
    knees.push(f64::INFINITY);
    knees
}

/// A protocol switch is looked for only in a sweep of this many sizes or more.
const SWITCH_FROM_POINTS: usize = 8;

/// Fits the model to `points` of one `shape` (at least 3); `None` if there are fewer.
pub fn fit(shape: Shape, points: &[Point]) -> Option<Fit> {
    if points.len() < 3 {
        return None;
    }
    let knees = knees(&shape, points);
    let best_with = |switch: Option<u64>| {
        knees
            .iter()
            .map(|&knee| fit_at(points, knee, switch))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .expect("knees")
    };
    let (mut cost, mut model) = best_with(None);
    // A switch between two measured sizes, two or more on each side, is tried only where one
    // rate leaves errors beyond a run's repeatability, and kept only where it explains the
    // curve far better (a third less robust error): not to chase noise.
    let worst = points
        .iter()
        .map(|p| (model.time_us(p) / p.time_us - 1.0).abs())
        .fold(0.0, f64::max);
    let switches = if worst > 3.0 * MIN_SCALE && points.len() >= SWITCH_FROM_POINTS {
        points.len().saturating_sub(3)
    } else {
        0
    };
    for at in points.iter().skip(2).take(switches) {
        let (c, m) = best_with(Some(at.size));
        if c < SWITCH_GAIN * cost && m.switch_bytes.is_some() {
            (cost, model) = (c, m);
        }
    }
    let errors = points
        .iter()
        .map(|p| (model.time_us(p) - p.time_us) / p.time_us)
        .collect();
    Some(Fit {
        shape,
        model,
        points: points.to_vec(),
        errors,
    })
}

/// Huber's constant: full weight within 1.345 robust standard deviations (95% efficiency on
/// normal errors).
const HUBER: f64 = 1.345;
/// The robust scale never goes below 2%: a run's own repeatability.
const MIN_SCALE: f64 = 0.02;

/// A fit with a switch is kept where its robust error is below this share of the best so far.
const SWITCH_GAIN: f64 = 0.67;

/// The robust fit with the knee and the switch fixed: (its robust cost, the model).
fn fit_at(points: &[Point], knee: f64, switch: Option<u64>) -> (f64, Model) {
    // Each point's equation, divided by its time:
    // u · (α, β below the switch, β from it, γ, memory's extra) = 1.
    let rows: Vec<[f64; COLUMNS]> = points
        .iter()
        .map(|p| {
            let m = from_memory(knee, p.working_set);
            let (bytes, reduced) = (p.path.bytes, p.path.reduced);
            let switched = switch.is_some_and(|at| p.size >= at);
            let (below, above) = if switched { (0.0, bytes) } else { (bytes, 0.0) };
            [p.path.steps, below, above, reduced, (bytes + reduced) * m].map(|v| v / p.time_us)
        })
        .collect();
    let mut weights = vec![1.0; rows.len()];
    let mut x = [0.0; COLUMNS];
    let mut scale = MIN_SCALE;
    for _ in 0..20 {
        x = nonnegative_least_squares(&rows, &weights);
        let residuals: Vec<f64> = rows.iter().map(|u| 1.0 - dot(u, &x)).collect();
        scale = (1.4826 * median(residuals.iter().map(|r| r.abs()))).max(MIN_SCALE);
        for (w, r) in weights.iter_mut().zip(&residuals) {
            *w = if r.abs() <= HUBER * scale {
                1.0
            } else {
                HUBER * scale / r.abs()
            };
        }
    }
    // Huber's loss of the final residuals, in units of the scale.
    let cost = rows
        .iter()
        .map(|u| {
            let r = (1.0 - dot(u, &x)).abs() / scale;
            if r <= HUBER {
                r * r / 2.0
            } else {
                HUBER * (r - HUBER / 2.0)
            }
        })
        .sum::<f64>()
        * scale;
    let gbps = |beta: f64| {
        if beta > 0.0 {
            1e-3 / beta
        } else {
            f64::INFINITY
        }
    };
    let model = Model {
        alpha_us: x[0],
        cache_gbps: gbps(x[1]),
        reduce_gbps: gbps(x[3]),
        switch_bytes: switch,
        switched_gbps: gbps(x[2]),
        memory_extra_us: x[4],
        knee_bytes: knee,
    };
    (cost, model)
}

/// The fit's unknowns: α, β below and from the switch, γ, memory's extra.
const COLUMNS: usize = 5;

fn dot(a: &[f64; COLUMNS], b: &[f64; COLUMNS]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n => v[n / 2],
    }
}

/// Weighted least squares of `rows · x = 1` with every x ≥ 0: the unconstrained solution on
/// each subset of the columns, the best one with none negative (five columns: 31 subsets).
fn nonnegative_least_squares(rows: &[[f64; COLUMNS]], weights: &[f64]) -> [f64; COLUMNS] {
    let mut best = ([0.0; COLUMNS], f64::INFINITY);
    for subset in 1u8..(1 << COLUMNS) {
        let cols: Vec<usize> = (0..COLUMNS).filter(|c| subset >> c & 1 == 1).collect();
        let Some(solution) = solve_normal(rows, weights, &cols) else {
            continue;
        };
        if solution.iter().any(|v| *v < 0.0) {
            continue;
        }
        let mut x = [0.0; COLUMNS];
        for (c, v) in cols.iter().zip(&solution) {
            x[*c] = *v;
        }
        let cost: f64 = rows
            .iter()
            .zip(weights)
            .map(|(u, w)| w * (1.0 - dot(u, &x)).powi(2))
            .sum();
        if cost < best.1 {
            best = (x, cost);
        }
    }
    best.0
}

/// The normal equations of the weighted fit on columns `cols`, solved by Gaussian elimination
/// with partial pivoting; `None` if they are singular.
fn solve_normal(rows: &[[f64; COLUMNS]], weights: &[f64], cols: &[usize]) -> Option<Vec<f64>> {
    let k = cols.len();
    let mut a = vec![vec![0.0; k + 1]; k];
    for (u, w) in rows.iter().zip(weights) {
        for i in 0..k {
            for j in 0..k {
                a[i][j] += w * u[cols[i]] * u[cols[j]];
            }
            a[i][k] += w * u[cols[i]];
        }
    }
    for i in 0..k {
        let pivot = (i..k).max_by(|&p, &q| a[p][i].abs().total_cmp(&a[q][i].abs()))?;
        a.swap(i, pivot);
        if a[i][i].abs() < 1e-300 {
            return None;
        }
        let pivot_row = a[i].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != i {
                let f = row[i] / pivot_row[i];
                for (cell, p) in row.iter_mut().zip(&pivot_row).skip(i) {
                    *cell -= f * p;
                }
            }
        }
    }
    Some((0..k).map(|i| a[i][k] / a[i][i]).collect())
}

impl Fit {
    /// The size at which the model's busbw (here: bytes on the path per second) reaches half its
    /// peak over the measured sizes, on a fine grid between them.
    pub fn half_peak_bytes(&self) -> Option<u64> {
        let (first, last) = (self.points.first()?, self.points.last()?);
        let grid: Vec<(u64, f64)> = (0..=400)
            .map(|i| {
                let f = i as f64 / 400.0;
                let size = (first.size as f64).powf(1.0 - f) * (last.size as f64).powf(f);
                (size as u64, self.rate_at(size as u64))
            })
            .filter_map(|(size, rate)| Some((size, rate?)))
            .collect();
        let peak = grid.iter().map(|(_, r)| *r).fold(0.0, f64::max);
        grid.iter().find(|(_, r)| *r >= peak / 2.0).map(|(s, _)| *s)
    }

    /// The model's rate (size / time, GB/s) at `size`.
    fn rate_at(&self, size: u64) -> Option<f64> {
        let p = self.shape.point(size, f64::NAN)?;
        Some(size as f64 / self.model.time_us(&p) / 1e3)
    }

    /// The model's time at `size`, µs.
    pub fn time_at(&self, size: u64) -> Option<f64> {
        Some(self.model.time_us(&self.shape.point(size, f64::NAN)?))
    }

    /// The regime a point is in: which term of the model dominates its time.
    pub fn regime(&self, p: &Point) -> &'static str {
        let m = &self.model;
        let latency = p.path.steps * m.alpha_us;
        if latency >= 0.5 * m.time_us(p) {
            "latency"
        } else if m.has_knee() && from_memory(m.knee_bytes, p.working_set) >= 0.5 {
            "memory"
        } else if m.has_knee() {
            "cache"
        } else {
            "bandwidth"
        }
    }
}

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
        return Some(match row.collective() {
            Some(Collective::Broadcast) => Algo::Chain,
            _ => Algo::Ring,
        });
    }
    ["ring", "direct", "tree", "chain"]
        .into_iter()
        .find(|name| row.backend_version.contains(&format!("{name} algorithm")))
        .and_then(|name| clap::ValueEnum::from_str(name, true).ok())
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
                let rows = by_size
                    .into_values()
                    .map(crate::report::median_row)
                    .collect();
                Series { label, rows }
            },
        )
        .collect()
}

/// How each algorithm's path is counted, for the reader of a fit.
pub fn structure_text(collective: Collective, algos: &[&str]) -> String {
    let one = |algo: &str| match (collective, algo) {
        (Collective::AllReduce, "direct") => "direct: n−1 steps of s",
        (Collective::AllReduce, _) => "ring: 2(n−1) steps of s/n",
        (Collective::Broadcast, "tree") => "tree: ⌈log2 n⌉ steps of s",
        (Collective::Broadcast, _) => "chain: n−2+k steps of a 1 MiB segment, k segments",
        _ => "ring: n−1 steps of s/n",
    };
    algos.iter().map(|a| one(a)).collect::<Vec<_>>().join("; ")
}

/// A size in words: a measured size as the sweep names it (64 KiB), a fitted one to three
/// figures (2.13 MB).
pub fn size(bytes: f64) -> String {
    if bytes >= 1.0 && (bytes as u64).is_power_of_two() {
        return human_bytes(bytes);
    }
    let (value, unit) = [(1e9, "GB"), (1e6, "MB"), (1e3, "KB")]
        .into_iter()
        .find(|(scale, _)| bytes >= *scale)
        .map_or((bytes, "B"), |(scale, unit)| (bytes / scale, unit));
    let decimals = if value >= 100.0 {
        0
    } else if value >= 10.0 {
        1
    } else {
        2
    };
    format!("{value:.decimals$} {unit}")
}

/// What this machine offers that a knee or a bandwidth can be compared with.
#[derive(Debug, Clone, Default)]
pub struct Machine {
    /// (name, bytes) of each data cache, "L2" etc., from /sys.
    pub caches: Vec<(String, f64)>,
    /// One core copying a 64 MiB buffer, GB/s (the best of three).
    pub copy_gbps: f64,
}

impl Machine {
    /// This machine's caches (Linux's /sys/devices/system/cpu/cpu0/cache) and copy speed.
    pub fn here() -> Machine {
        let mut caches = Vec::new();
        for index in 0..8 {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{index}");
            let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
            let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
            else {
                continue;
            };
            if kind.trim() == "Instruction" {
                continue;
            }
            let size = size.trim();
            let bytes = match size.strip_suffix('K') {
                Some(k) => k.parse::<f64>().ok().map(|k| k * 1024.0),
                None => size
                    .strip_suffix('M')
                    .and_then(|m| m.parse::<f64>().ok())
                    .map(|m| m * 1048576.0),
            };
            if let Some(bytes) = bytes {
                caches.push((format!("L{}", level.trim()), bytes));
            }
        }
        Machine {
            caches,
            copy_gbps: copy_gbps(),
        }
    }

    /// The cache within a factor of 2 of `bytes`, if one is.
    fn cache_near(&self, bytes: f64) -> Option<&(String, f64)> {
        self.caches
            .iter()
            .filter(|(_, c)| bytes / c <= 2.0 && c / bytes <= 2.0)
            .min_by(|a, b| {
                (bytes / a.1)
                    .ln()
                    .abs()
                    .total_cmp(&(bytes / b.1).ln().abs())
            })
    }
}

/// One core's memory copy speed: a 64 MiB buffer copied (read and written), best of three.
fn copy_gbps() -> f64 {
    let from = vec![1u8; 64 << 20];
    let mut to = vec![0u8; 64 << 20];
    to.copy_from_slice(&from); // the pages are mapped before anything is timed
    (0..3)
        .map(|_| {
            let start = std::time::Instant::now();
            to.copy_from_slice(std::hint::black_box(&from));
            std::hint::black_box(&to);
            from.len() as f64 / start.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

/// Sizes from this many bytes on are held to the model's accuracy (below, a few microseconds of
/// scheduling noise are a large fraction of the time).
pub const HELD_FROM: u64 = 64 << 10;

fn percent(e: f64) -> String {
    format!("{:+.0}%", e * 100.0)
}

fn gbps(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2} GB/s")
    } else {
        "unbounded".into()
    }
}

/// A fit as text: its constants, each size's error and regime, and in words what the fit shows.
pub fn describe(label: &str, fit: &Fit, machine: Option<&Machine>) -> String {
    let m = &fit.model;
    let mut algos: Vec<&str> = fit.points.iter().map(|p| p.path.algo).collect();
    algos.dedup();
    let mut out = format!(
        "{label}: {}\n",
        structure_text(fit.shape.collective, &algos)
    );
    let mut bandwidth = match m.switch_bytes {
        Some(at) if m.cache_gbps.is_finite() => format!(
            "B = {} below {}, {} from it on",
            gbps(m.cache_gbps),
            size(at as f64),
            gbps(m.switched_gbps)
        ),
        // Moving cost nothing the fit could tell from the steps and the reduction.
        Some(at) => format!(
            "B = {} from {} on (below it the steps and the reduction take all the time)",
            gbps(m.switched_gbps),
            size(at as f64)
        ),
        None => format!("B = {}", gbps(m.cache_gbps)),
    };
    if m.has_knee() {
        let _ = write!(
            bandwidth,
            "; from memory {}, past a knee at {} of buffers on the host",
            gbps(m.memory_gbps()),
            size(m.knee_bytes)
        );
    }
    if m.reduce_gbps.is_finite() {
        let _ = write!(bandwidth, "; reduces {}", gbps(m.reduce_gbps));
    }
    let _ = writeln!(out, "  α = {:.2} µs per step, {bandwidth}", m.alpha_us);
    let held: Vec<(f64, u64)> = fit
        .points
        .iter()
        .zip(&fit.errors)
        .filter(|(p, _)| p.size >= HELD_FROM)
        .map(|(p, e)| (e.abs(), p.size))
        .collect();
    let half = fit.half_peak_bytes().map_or("-".into(), |b| size(b as f64));
    let _ = write!(out, "  half the peak rate at {half}");
    if let Some(&(worst, at)) = held.iter().max_by(|a, b| a.0.total_cmp(&b.0)) {
        let typical = median(held.iter().map(|h| h.0));
        let _ = write!(
            out,
            "; sizes from {}: error at most {:.0}% (at {}), median {:.0}%",
            size(HELD_FROM as f64),
            worst * 100.0,
            size(at as f64),
            typical * 100.0
        );
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "  {:>12} {:>14} {:>12} {:>7}  {:<6}  regime",
        "size (B)", "measured (us)", "model (us)", "error", "algo"
    );
    for (p, e) in fit.points.iter().zip(&fit.errors) {
        let _ = writeln!(
            out,
            "  {:>12} {:>14.2} {:>12.2} {:>7}  {:<6}  {}",
            p.size,
            p.time_us,
            m.time_us(p),
            percent(*e),
            p.path.algo,
            fit.regime(p)
        );
    }
    out.push_str(&in_words(fit, machine));
    out
}

/// How much slower bytes move past the knee: "3.8x slower", or their rate where before the knee
/// they cost nothing the fit could see.
fn slowdown(m: &Model) -> String {
    match m.large_gbps().is_finite() {
        true => format!("{:.1}x slower", m.large_gbps() / m.memory_gbps()),
        false => format!(
            "at {}, where before it they cost nothing the fit can see",
            gbps(m.memory_gbps())
        ),
    }
}

/// What the fit shows, in sentences: where each regime begins, where the model stops holding,
/// and what on this machine the knee and the bandwidths compare with.
pub fn in_words(fit: &Fit, machine: Option<&Machine>) -> String {
    let m = &fit.model;
    let mut words = Vec::new();
    let regimes: Vec<(&str, u64)> = fit.points.iter().fold(Vec::new(), |mut v, p| {
        let r = fit.regime(p);
        if v.last().is_none_or(|(last, _)| *last != r) {
            v.push((r, p.size));
        }
        v
    });
    let spans: Vec<String> = regimes
        .iter()
        .map(|(r, from)| {
            let why = match *r {
                "latency" => "latency-bound: the steps' α outweighs the bytes",
                "cache" => "bandwidth-bound, the buffers in cache",
                "memory" => "bandwidth-bound, most bytes from memory",
                _ => "bandwidth-bound",
            };
            format!("from {} {why}", size(*from as f64))
        })
        .collect();
    words.push(format!("Regimes: {}.", spans.join("; ")));
    if m.has_knee() {
        let cache = machine.and_then(|mc| mc.cache_near(m.knee_bytes));
        words.push(match (machine, cache) {
            (_, Some((name, bytes))) => format!(
                "The knee, {} of buffers, is about this machine's {name} cache ({}): past it the copies run from memory, {}.",
                size(m.knee_bytes),
                size(*bytes),
                slowdown(m)
            ),
            (Some(mc), None) => format!(
                "The knee, {} of buffers, matches none of this machine's caches ({}): something other than a cache's size slows the copies there ({}).",
                size(m.knee_bytes),
                mc.caches.iter().map(|(n, b)| format!("{n} {}", size(*b))).collect::<Vec<_>>().join(", "),
                slowdown(m)
            ),
            (None, _) => format!(
                "The knee, {} of buffers: past it the copies run {}.",
                size(m.knee_bytes),
                slowdown(m)
            ),
        });
    }
    if let Some(mc) = machine.filter(|mc| mc.copy_gbps > 0.0) {
        words.push(format!(
            "One core of this machine copies memory at {}: B from memory is {:.0}% of it (every byte on the path is copied into the transport and out again, and reduced).",
            gbps(mc.copy_gbps),
            100.0 * m.memory_gbps().min(m.large_gbps()) / mc.copy_gbps
        ));
    }
    let off: Vec<String> = fit
        .points
        .iter()
        .zip(&fit.errors)
        .filter(|(p, e)| p.size >= HELD_FROM && e.abs() > 0.15)
        .map(|(p, e)| format!("{} ({})", size(p.size as f64), percent(*e)))
        .collect();
    words.push(if off.is_empty() {
        format!("From {} on the model holds within 15% at every size.", size(HELD_FROM as f64))
    } else {
        format!(
            "The model stops holding (more than 15% off) at {}: a time the model's terms do not explain (a busy machine, ranks waiting for a core, or a change the sweep's sizes are too coarse to place).",
            off.join(", ")
        )
    });
    format!("  {}\n", words.join("\n  "))
}

/// `comm-bench model FILES`: every series of the files fitted and described.
pub fn run(files: &[std::path::PathBuf]) -> Result<String, crate::error::BenchError> {
    let mut rows = Vec::new();
    for file in files {
        rows.extend(crate::record::read(file)?);
    }
    let here = crate::record::host();
    let machine = rows.iter().any(|r| r.host == here).then(Machine::here);
    let mut out = String::from(
        "# comm-bench model: t(s) = steps(s) x alpha + bytes(s) / B, Hockney's latency-bandwidth model through\n\
         # each algorithm's steps; B from cache while the ranks' buffers fit, from memory past the knee.\n\
         # Fitted by Huber-weighted least squares on relative errors; error = (model - measured) / measured.\n",
    );
    let mut fitted = 0;
    for s in series(&rows) {
        let Some(fit) = fit_rows(&s.rows) else {
            continue;
        };
        let same_host = s.rows.iter().all(|r| r.host == here);
        out.push('\n');
        out.push_str(&describe(
            &s.label,
            &fit,
            machine.as_ref().filter(|_| same_host),
        ));
        if !same_host {
            let _ = writeln!(
                out,
                "  (measured on {}, not here: this machine's caches say nothing of it)",
                s.rows[0].host
            );
        }
        fitted += 1;
    }
    if fitted == 0 {
        return Err(crate::error::BenchError::NothingToFit);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(collective: Collective, world_size: usize) -> Shape {
        Shape {
            collective,
            world_size,
            in_place: false,
            asked: None,
            on_cpu: true,
        }
    }

    /// Points of `shape` from 1 KiB to 64 MiB timed by `truth`.
    fn sweep(shape: Shape, truth: &Model) -> Vec<Point> {
        (10..=26)
            .filter_map(|e| {
                let p = shape.point(1 << e, f64::NAN)?;
                Some(Point {
                    time_us: truth.time_us(&p),
                    ..p
                })
            })
            .collect()
    }

    fn truth() -> Model {
        Model {
            alpha_us: 2.0,
            cache_gbps: 8.0,
            reduce_gbps: 20.0,
            switch_bytes: None,
            switched_gbps: 8.0,
            memory_extra_us: per_byte(3.0) - per_byte(8.0),
            knee_bytes: 1.6e6, // on the grid of knees tried
        }
    }

    #[test]
    fn the_paths_follow_the_algorithms_steps() {
        let ring = path(Collective::AllReduce, 64 << 20, 4, None).unwrap();
        assert_eq!((ring.algo, ring.steps), ("ring", 6.0));
        assert_eq!(ring.bytes, 2.0 * 3.0 / 4.0 * (64 << 20) as f64);
        let direct = path(Collective::AllReduce, 1024, 4, None).unwrap();
        assert_eq!((direct.algo, direct.steps), ("direct", 3.0));
        let gather = path(Collective::AllGather, 4096, 4, None).unwrap();
        assert_eq!(
            (gather.steps, gather.bytes, gather.reduced),
            (3.0, 3072.0, 0.0)
        );
        let tree = path(Collective::Broadcast, 1024, 5, None).unwrap();
        assert_eq!((tree.algo, tree.steps), ("tree", 3.0));
        let chain = path(Collective::Broadcast, 8 << 20, 4, None).unwrap();
        assert_eq!((chain.algo, chain.steps), ("chain", 8.0 + 2.0));
        assert!(path(Collective::AllToAll, 1024, 4, None).is_none());
        assert!(path(Collective::AllReduce, 1024, 1, None).is_none());
    }

    #[test]
    fn a_fit_recovers_the_constants_that_made_the_times() {
        let truth = truth();
        // (On 2 ranks all_reduce moves and reduces bytes in the same proportion in both of its
        // algorithms, so β and γ cannot be told apart there: 4 ranks.)
        for (collective, n) in [(Collective::AllReduce, 4), (Collective::AllGather, 4)] {
            let fit = fit(shape(collective, n), &sweep(shape(collective, n), &truth)).unwrap();
            let m = fit.model;
            assert!((m.alpha_us - 2.0).abs() < 0.1, "{m:?}");
            assert!((m.large_gbps() / 8.0 - 1.0).abs() < 0.05, "{m:?}");
            assert!((m.memory_gbps() / 3.0 - 1.0).abs() < 0.1, "{m:?}");
            assert!(
                fit.errors.iter().all(|e| e.abs() < 0.05),
                "{:?}",
                fit.errors
            );
        }
    }

    #[test]
    fn one_slow_point_does_not_bend_the_fit() {
        let s = shape(Collective::ReduceScatter, 2);
        let mut points = sweep(s, &truth());
        points[12].time_us *= 3.0; // one iteration a busy machine slowed
        let fit = fit(s, &points).unwrap();
        assert!((fit.model.alpha_us - 2.0).abs() < 0.2, "{:?}", fit.model);
        let others = fit.errors.iter().enumerate().filter(|(i, _)| *i != 12);
        assert!(
            others.clone().all(|(_, e)| e.abs() < 0.1),
            "{:?}",
            fit.errors
        );
        assert!(
            fit.errors[12] < -0.5,
            "the slow point shows as off: {:?}",
            fit.errors
        );
    }

    #[test]
    fn a_protocol_switch_is_found_where_the_rate_changes() {
        let mut truth = truth();
        truth.switch_bytes = Some(256 << 10);
        truth.switched_gbps = 16.0;
        truth.knee_bytes = 1e12; // no knee in the measured sizes
        let s = shape(Collective::AllGather, 2);
        let fit = fit(s, &sweep(s, &truth)).unwrap();
        assert_eq!(fit.model.switch_bytes, Some(256 << 10), "{:?}", fit.model);
        assert!(
            fit.errors.iter().all(|e| e.abs() < 0.05),
            "{:?}",
            fit.errors
        );
    }

    #[test]
    fn no_knee_on_a_gpu_nor_from_a_few_sizes() {
        let truth = truth();
        let gpu = Shape {
            on_cpu: false,
            ..shape(Collective::AllGather, 4)
        };
        let fit = fit(gpu, &sweep(gpu, &truth)).unwrap();
        assert!(!fit.model.has_knee(), "{:?}", fit.model);
        let cpu = shape(Collective::AllGather, 4);
        let few: Vec<Point> = sweep(cpu, &truth).into_iter().step_by(4).collect();
        assert!(few.len() < 6);
        let fit = super::fit(cpu, &few).unwrap();
        assert!(!fit.model.has_knee(), "{:?}", fit.model);
        assert_eq!(fit.model.switch_bytes, None);
    }

    #[test]
    fn the_half_peak_size_is_where_latency_and_bandwidth_cost_the_same() {
        // No knee, no reduction: rate = s / (α + s/B) is half of B where s = α·B.
        let mut truth = truth();
        truth.knee_bytes = 1e12;
        truth.reduce_gbps = f64::INFINITY;
        let s = shape(Collective::AllGather, 2); // one step of s/2: s/2 = α·B at half peak
        let fit = fit(s, &sweep(s, &truth)).unwrap();
        let half = fit.half_peak_bytes().unwrap() as f64;
        let expected = 2.0 * 2.0e-6 * 8.0e9;
        assert!((half / expected - 1.0).abs() < 0.1, "{half} vs {expected}");
    }
}
