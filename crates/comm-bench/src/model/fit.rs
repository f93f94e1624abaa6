//! Hockney's latency–bandwidth (α–β) model fitted to one series, through each algorithm's steps
//! ([`super::paths`]). A call's time is its critical path: `steps` messages one after another,
//! each paying the latency α, and `bytes` through one rank's link at bandwidth B:
//!
//! ```text
//! t(s) = steps(s) · α + bytes(s) / B
//! ```
//!
//! The reduction's own cost (Thakur's γ) is a term of its own, on the bytes reduced.
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

use comm_core::backend::cpu::Algo;
use comm_core::timing::median;
use comm_core::Collective;

use super::paths::{path, registered_path, working_set, Path};
use super::solver::{dot, nonnegative_least_squares, COLUMNS};

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
    /// From this size the ranks read each other's registered buffers (the row's backend says
    /// "registered buffers from 8K"; 0: every size): the registered algorithm's path there,
    /// not the messages'.
    pub registered_from: Option<u64>,
    /// The CPU backend: its copies run from the host's caches or its memory (NCCL's do not).
    pub on_cpu: bool,
}

impl Shape {
    /// A point of this shape at `size` bytes, its time `time_us` (NaN: to be modelled).
    pub fn point(&self, size: u64, time_us: f64) -> Option<Point> {
        let (c, n) = (self.collective, self.world_size);
        Some(Point {
            size,
            path: match self.registered_from {
                Some(from) if size >= from => registered_path(c, size, n)?,
                _ => path(c, size, n, self.asked)?,
            },
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

    /// The regimes of the measured sizes in order, each with the first size in it: what every
    /// sentence about a regime is drawn from.
    pub fn regimes(&self) -> Vec<(&'static str, u64)> {
        self.points.iter().fold(Vec::new(), |mut v, p| {
            let r = self.regime(p);
            if v.last().is_none_or(|(last, _)| *last != r) {
                v.push((r, p.size));
            }
            v
        })
    }

    /// Whether some measured size is in `regime`.
    pub fn in_regime(&self, regime: &str) -> bool {
        self.points.iter().any(|p| self.regime(p) == regime)
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

/// Series made from known constants, for the tests of the fit and of its words.
#[cfg(test)]
pub(crate) mod synthetic {
    use super::*;

    pub fn shape(collective: Collective, world_size: usize) -> Shape {
        Shape {
            collective,
            world_size,
            in_place: false,
            asked: None,
            registered_from: None,
            on_cpu: true,
        }
    }

    /// Points of `shape` from 1 KiB to 64 MiB timed by `truth`.
    pub fn sweep(shape: Shape, truth: &Model) -> Vec<Point> {
        sweep_over(shape, truth, 10..=26)
    }

    /// Points of `shape` at 2^e bytes for each e of `exponents`, timed by `truth`.
    pub fn sweep_over(
        shape: Shape,
        truth: &Model,
        exponents: std::ops::RangeInclusive<u32>,
    ) -> Vec<Point> {
        exponents
            .filter_map(|e| {
                let p = shape.point(1 << e, f64::NAN)?;
                Some(Point {
                    time_us: truth.time_us(&p),
                    ..p
                })
            })
            .collect()
    }

    pub fn truth() -> Model {
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
}

#[cfg(test)]
mod tests {
    use super::synthetic::{shape, sweep, truth};
    use super::*;

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
