//! A fit in words, for `comm-bench model` and the report's observations: its constants, its
//! accuracy, each size's error and regime on request, and what the fit shows. Every sentence about
//! a regime is drawn from the regimes the fit assigns ([`Fit::regimes`]), so none contradicts
//! another.

use std::fmt::Write as _;

use comm_core::timing::median;

use super::fit::{Fit, Model};
use super::machine::Machine;
use crate::units::human_bytes;

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

/// A fit as text: its constants, its accuracy, with `table` each size's error and regime, and in
/// words what the fit shows.
pub fn describe(label: &str, fit: &Fit, machine: Option<&Machine>, table: bool) -> String {
    let m = &fit.model;
    // Each algorithm's counts in words, as comm-core describes it, in the order the sizes meet them.
    let mut counted: Vec<&str> = fit.points.iter().map(|p| p.path.words).collect();
    counted.dedup();
    let mut out = format!("{label}: {}\n", counted.join("; "));
    let mut bandwidth = match m.switch_bytes {
        // Two rates need their reason where they are printed: a switch in how the transport
        // moves bytes, and a rate no memory gives comes from a cache.
        Some(at) if m.cache_gbps.is_finite() => format!(
            "B = {} below {}, {} from it on (a protocol switch: from that size the transport \
             moves bytes another way){}",
            gbps(m.cache_gbps),
            size(at as f64),
            gbps(m.switched_gbps),
            from_a_cache(m.cache_gbps.max(m.switched_gbps), machine)
        ),
        // Moving cost nothing the fit could tell from the steps and the reduction.
        Some(at) => format!(
            "B = {} from {} on (below it the steps and the reduction take all the time)",
            gbps(m.switched_gbps),
            size(at as f64)
        ),
        None => format!(
            "B = {}{}",
            gbps(m.cache_gbps),
            from_a_cache(m.cache_gbps, machine)
        ),
    };
    if fit.in_regime("memory") {
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
    let _ = writeln!(out, "  {}, {bandwidth}", alpha(m.alpha_us));
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
    if table {
        out.push_str(&size_table(fit));
    }
    out.push_str(&in_words(fit, machine));
    out
}

/// Each size's measured and modelled time, error, algorithm and regime.
fn size_table(fit: &Fit) -> String {
    let m = &fit.model;
    let mut out = String::new();
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
    out
}

/// How many of one core's copies each byte on the path costs, in each bandwidth regime the fit
/// reaches: its B against this machine's copy speed in cache and from memory.
fn copy_counts(fit: &Fit, machine: Option<&Machine>) -> Vec<String> {
    let m = &fit.model;
    let memory = fit.in_regime("memory");
    let mut words = Vec::new();
    let cache = fit.in_regime("cache");
    let bounded = m.large_gbps().is_finite();
    if let Some(mc) = machine.filter(|mc| cache && bounded && mc.cached_copy_gbps > 0.0) {
        words.push(format!(
            "In cache, one core of this machine copies at {}: B in cache is {:.0}% of it, {}.",
            gbps(mc.cached_copy_gbps),
            100.0 * m.large_gbps() / mc.cached_copy_gbps,
            copies(mc.cached_copy_gbps, m.large_gbps())
        ));
    }
    if let Some(mc) = machine.filter(|mc| memory && mc.copy_gbps > 0.0) {
        let b = m.memory_gbps().min(m.large_gbps());
        words.push(format!(
            "One core of this machine copies memory at {}: B from memory is {:.0}% of it, {}.",
            gbps(mc.copy_gbps),
            100.0 * b / mc.copy_gbps,
            copies(mc.copy_gbps, b)
        ));
    }
    if machine.is_some() && (cache || memory) {
        words.push(
            "(The shared-memory rings copy every byte twice, into the ring and out, on two cores at once; `--copy single` once, by the kernel; registered buffers once, by the rank that receives it; a reduction also reads what arrived.)".into(),
        );
    }
    words
}

/// The copies of one core at `copy_gbps` that moving each byte at `b` GB/s takes:
/// "the time of about 2.1 copies per byte".
fn copies(copy_gbps: f64, b: f64) -> String {
    format!("the time of about {:.1} copies per byte", copy_gbps / b)
}

/// Where a B beats one core copying memory on this machine: "; faster than … : from a cache".
fn from_a_cache(b: f64, machine: Option<&Machine>) -> String {
    match machine.filter(|mc| mc.copy_gbps > 0.0 && b.is_finite() && b > mc.copy_gbps) {
        Some(mc) => format!(
            "; faster than one core copies memory here ({}): those bytes come from a cache",
            gbps(mc.copy_gbps)
        ),
        None => String::new(),
    }
}

/// α as the constants line gives it; a fit that put no cost on the steps says so rather than
/// print "0.00 µs".
fn alpha(us: f64) -> String {
    if us >= 0.005 {
        format!("α = {us:.2} µs per step")
    } else {
        "α = 0 µs per step (no latency the fit can see)".into()
    }
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
    let spans: Vec<String> = fit
        .regimes()
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
    // The knee and memory's speed only where some size runs from memory: a sentence about a
    // regime the sizes never reach would contradict the regimes above.
    let memory = fit.in_regime("memory");
    if memory {
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
    words.extend(copy_counts(fit, machine));
    let off: Vec<String> = fit
        .points
        .iter()
        .zip(&fit.errors)
        .filter(|(p, e)| p.size >= HELD_FROM && e.abs() > 0.15)
        .map(|(p, e)| format!("{} ({})", size(p.size as f64), percent(*e)))
        .collect();
    // Held to 15% only from HELD_FROM: a sweep that stops below it is not said to hold there.
    let held = fit.points.last().is_some_and(|p| p.size >= HELD_FROM);
    if held && off.is_empty() {
        words.push(format!(
            "From {} on the model holds within 15% at every size.",
            size(HELD_FROM as f64)
        ));
    } else if held {
        words.push(format!(
            "The model stops holding (more than 15% off) at {}: a time the model's terms do not explain (a busy machine, ranks waiting for a core, or a change the sweep's sizes are too coarse to place).",
            off.join(", ")
        ));
    }
    format!("  {}\n", words.join("\n  "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fit::synthetic::{shape, sweep_over, truth};
    use crate::model::fit::{fit, Model};
    use comm_core::Collective;

    /// A fit of `collective` on 2 ranks to sizes 2^e, e in `exponents`, timed by `truth`.
    fn fitted(
        collective: Collective,
        truth: Model,
        exponents: std::ops::RangeInclusive<u32>,
    ) -> Fit {
        let s = shape(collective, 2);
        fit(s, &sweep_over(s, &truth, exponents)).expect("3 sizes or more")
    }

    /// Every sentence about a regime is there exactly when some size is in it (the comparison
    /// with this machine's copy speed only where a machine is given).
    fn agrees(fit: &Fit, text: &str, machine: bool) {
        let has = |r| fit.in_regime(r);
        let bandwidth = has("cache") || has("memory") || has("bandwidth");
        let says = |words| text.contains(words);
        let regimes = fit.regimes();
        assert_eq!(has("latency"), says("latency-bound"), "{regimes:?}\n{text}");
        assert_eq!(bandwidth, says("bandwidth-bound"), "{regimes:?}\n{text}");
        assert_eq!(has("cache"), says("in cache"), "{regimes:?}\n{text}");
        for memory in ["from memory", "knee"] {
            assert_eq!(has("memory"), says(memory), "{memory}: {regimes:?}\n{text}");
        }
        let compared = says("B from memory is");
        assert_eq!(has("memory") && machine, compared, "{regimes:?}\n{text}");
        let counted = text.matches("copies per byte").count();
        let cache_counted = has("cache") && fit.model.large_gbps().is_finite();
        assert_eq!(cache_counted && machine, says("B in cache is"), "{text}");
        let regimes_with_copies = [cache_counted, has("memory")]
            .iter()
            .filter(|&&r| r)
            .count();
        assert_eq!(
            counted,
            if machine { regimes_with_copies } else { 0 },
            "{text}"
        );
        assert!(!says("α = 0.00"), "{text}");
    }

    #[test]
    fn the_words_agree_with_the_fitted_regimes() {
        let machine = Machine {
            caches: vec![("L2".into(), 2.0 * 1048576.0)],
            copy_gbps: 5.0,
            cached_copy_gbps: 20.0,
        };
        let no_knee = Model {
            knee_bytes: 1e12,
            ..truth()
        };
        let no_alpha = Model {
            alpha_us: 0.0,
            ..truth()
        };
        let neither = Model {
            alpha_us: 0.0,
            ..no_knee
        };
        let slow_steps = Model {
            alpha_us: 50.0,
            ..no_knee
        };
        let cases = [
            // latency, cache and memory
            (Collective::AllReduce, truth(), 10..=26),
            // latency and bandwidth: no memory regime, nothing of memory said
            (Collective::AllGather, no_knee, 10..=26),
            // cache and memory: no latency regime, α said to be none
            (Collective::AllGather, no_alpha, 10..=26),
            // bandwidth only
            (Collective::Broadcast, neither, 20..=26),
            // latency only
            (Collective::AllGather, slow_steps, 10..=14),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for (collective, truth, exponents) in cases {
            let fit = fitted(collective, truth, exponents);
            seen.extend(fit.regimes().iter().map(|(r, _)| *r));
            for machine in [None, Some(&machine)] {
                for table in [false, true] {
                    let text = describe("series", &fit, machine, table);
                    agrees(&fit, &text, machine.is_some());
                }
            }
        }
        let all = ["bandwidth", "cache", "latency", "memory"];
        assert_eq!(
            seen,
            all.into_iter().collect(),
            "every regime, and none, tried"
        );
    }

    #[test]
    fn a_fit_with_no_step_cost_says_so() {
        let fit = fitted(
            Collective::AllGather,
            Model {
                alpha_us: 0.0,
                knee_bytes: 1e12,
                ..truth()
            },
            20..=26,
        );
        assert!(fit.model.alpha_us < 0.005, "{:?}", fit.model);
        let text = describe("series", &fit, None, false);
        assert!(
            text.contains("α = 0 µs per step (no latency the fit can see)"),
            "{text}"
        );
    }

    #[test]
    fn the_table_comes_on_request() {
        let fit = fitted(Collective::AllReduce, truth(), 10..=26);
        let short = describe("series", &fit, None, false);
        let long = describe("series", &fit, None, true);
        assert!(!short.contains("regime\n"), "{short}");
        assert_eq!(
            long.lines().count(),
            short.lines().count() + 1 + fit.points.len()
        );
        for line in short.lines() {
            assert!(long.lines().any(|l| l == line), "{line}");
        }
    }
}
