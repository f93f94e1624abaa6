//! The report's sentences, computed from the numbers: where each series' bandwidth saturates,
//! what the α–β fit says of it, how each backend scales with ranks, how the backends compare
//! near 100 MB.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::series::{near_100mb, same_size, Series};
use crate::model::words;
use crate::record::Row;
use crate::units::human_bytes;

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
            "{name}, {}: busbw saturates from {} on, within 10% of its peak {} (at {}); the smallest size ({}) takes {}, {}.",
            s.label,
            sized(first.bytes),
            gbps(peak.busbw_gbps),
            sized(peak.bytes),
            sized(smallest.bytes),
            ms(smallest.time_us),
            floor(s, smallest, first.bytes)
        )
    })
}

/// What the smallest size's time is: the latency floor only where it is latency-bound (by the
/// fit's regime there; without one, where busbw has not yet saturated), so the sentence never
/// contradicts the model's regimes beside it.
fn floor(s: &Series, smallest: &Row, saturated_from: u64) -> &'static str {
    let fitted = s.fit.as_ref().and_then(|fit| {
        let p = fit.points.iter().find(|p| p.size == smallest.bytes)?;
        Some(fit.regime(p) == "latency")
    });
    match fitted.unwrap_or(saturated_from > smallest.bytes) {
        true => "the latency floor",
        false => "already bandwidth-bound",
    }
}

/// The latency-bandwidth model fitted to one series, in words: its constants, the regimes, and
/// where it stops holding (`crate::model::words`).
fn modelled(name: &str, s: &Series) -> Option<String> {
    let fit = s.fit.as_ref()?;
    let m = &fit.model;
    // As `comm-bench model` words it: no "0.00 us", memory only where a size runs from it.
    let alpha = match m.alpha_us >= 0.005 {
        true => format!("{:.2} us per step", m.alpha_us),
        false => "0 us per step (no latency the fit can see)".into(),
    };
    let mut text = format!(
        "{name}, {}: the model t = steps x alpha + bytes / B fits alpha = {alpha} and B = {:.2} GB/s",
        s.label,
        m.large_gbps()
    );
    if fit.in_regime("memory") {
        let _ = write!(text, " ({:.2} GB/s from memory)", m.memory_gbps());
    }
    let words = words::in_words(fit, None);
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

#[cfg(test)]
mod tests {
    use super::super::series::{series, test_row as row};
    use super::*;

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
    }

    /// A series already bandwidth-bound at its smallest size is not said to sit on a latency
    /// floor there, while the fit beside it calls it bandwidth-bound.
    #[test]
    fn the_latency_floor_only_where_the_fit_finds_latency() {
        // all_reduce on 2 ranks (bus factor 1) at 4 GB/s, with `alpha_us` per call.
        let timed = |bytes: u64, alpha_us: f64| {
            let us = alpha_us + bytes as f64 / 4e3;
            row("cpu", 2, bytes, us, bytes as f64 / us / 1e3)
        };
        // From 1 MiB with no latency: bandwidth-bound throughout, saturated from the smallest.
        let bandwidth: Vec<Row> = (20..=24).map(|e| timed(1 << e, 0.0)).collect();
        // From 1 KiB with 20 us: latency-bound at first, saturated from about 1 MiB.
        let latency: Vec<Row> = (10..=24).step_by(2).map(|e| timed(1 << e, 20.0)).collect();
        for (rows, floor) in [(bandwidth, false), (latency, true)] {
            let refs: Vec<&Row> = rows.iter().collect();
            let s = series(&refs);
            let fit = s[0].fit.as_ref().expect("a fit");
            let smallest = fit.regime(&fit.points[0]);
            assert_eq!(smallest == "latency", floor, "{:?}", fit.regimes());
            let all = observe("all_reduce", &s).join("\n");
            assert!(all.contains("busbw saturates from"), "{all}");
            assert_eq!(all.contains("the latency floor"), floor, "{all}");
            assert_eq!(all.contains("already bandwidth-bound"), !floor, "{all}");
            assert_eq!(all.contains("latency-bound"), floor, "{all}");
            assert!(!all.contains("alpha = 0.00"), "{all}");
        }
    }
}
