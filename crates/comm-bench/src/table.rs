//! nccl-tests' table, column for column: size, count, type, redop, root, then time, algbw, busbw
//! and #wrong out-of-place and in-place; a block per collective and world size, closed by the
//! average bus bandwidth.

use crate::plan::Plan;
use crate::record::{Row, RunInfo};

/// The lines that open a block.
pub fn header(info: &RunInfo, collective: &str, plan: &Plan) -> String {
    let nodes = match info.nodes {
        1 => "1 node".to_string(),
        n => format!("{n} nodes"),
    };
    format!(
        "# comm-bench {}: {collective} on {} ranks ({nodes}), backend {} ({}), host {}, {}\n\
         # minBytes {} maxBytes {} warmup iters: {} iters: {} agg iters: {} blocking: {} check: {}; time = {}\n\
         #\n\
         #                                                              out-of-place                       in-place\n\
         #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n\
         #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
        env!("CARGO_PKG_VERSION"),
        info.world_size,
        info.backend,
        info.backend_version,
        info.host,
        info.machine,
        plan.sizes.first().unwrap_or(&0),
        plan.sizes.last().unwrap_or(&0),
        info.warmup,
        info.iters,
        info.agg_iters,
        info.blocking,
        plan.checks,
        match info.blocking {
            0 => "total / calls, enqueued back to back and waited for once, slowest rank",
            _ => "median over iterations, each call waited for, slowest rank",
        },
    )
}

/// A time in microseconds as nccl-tests prints it: fewer decimals as it grows.
fn time(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

fn placement(row: Option<&Row>) -> String {
    match row {
        Some(r) => format!(
            "  {}  {:6.2}  {:6.2}  {:>5}",
            time(r.time_us_median),
            r.algbw_gbps,
            r.busbw_gbps,
            r.wrong.map_or("N/A".to_string(), |w| w.to_string())
        ),
        None => format!("  {:>7}  {:>6}  {:>6}  {:>5}", "n/a", "n/a", "n/a", "n/a"),
    }
}

/// One line from the rows of one size (out-of-place and/or in-place).
pub fn line(rows: &[Row]) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let find = |p: &str| rows.iter().find(|r| r.placement == p);
    format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}{}{}",
        first.bytes,
        first.count,
        first.dtype,
        first.redop,
        first.root,
        placement(find("out-of-place")),
        placement(find("in-place")),
    )
}

/// The lines that close a block: the wrong-element total and the average bus bandwidth over
/// every size and placement, as nccl-tests ends its output.
pub fn footer(rows: &[Row]) -> String {
    let wrong: u64 = rows.iter().filter_map(|r| r.wrong).sum();
    let avg = if rows.is_empty() {
        0.0
    } else {
        rows.iter().map(|r| r.busbw_gbps).sum::<f64>() / rows.len() as f64
    };
    format!(
        "# Wrong elements       : {wrong} {}\n# Avg bus bandwidth    : {avg:.4}\n#",
        if wrong == 0 { "OK" } else { "FAILED" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::sample_row;

    #[test]
    fn columns_line_up_with_the_header() {
        let mut out = sample_row();
        out.time_us_median = 123.45;
        out.algbw_gbps = 8.5;
        out.busbw_gbps = 12.75;
        let mut inp = out.clone();
        inp.placement = "in-place".into();
        inp.time_us_median = 12345.6;
        inp.wrong = None;
        let l = line(&[out.clone(), inp]);
        assert_eq!(
            l,
            "     1048576        262144     float     sum      -1    123.5    8.50   12.75      0    12346    8.50   12.75    N/A"
        );
        let info = RunInfo {
            backend: "cpu".into(),
            backend_version: "tcp".into(),
            machine: "m".into(),
            host: "h".into(),
            world_size: 2,
            nodes: 1,
            warmup: 5,
            iters: 20,
            blocking: 0,
            agg_iters: 1,
            started: String::new(),
        };
        let args = crate::cli::BenchArgs {
            ..<crate::cli::Cli as clap::Parser>::parse_from(["comm-bench"]).bench
        };
        let h = header(&info, "all_reduce", &Plan::resolve(&args).unwrap());
        let titles = h.lines().nth(4).unwrap();
        // Every column title ends where its values end.
        for (title, value) in [("size", "1048576"), ("root", "-1"), ("busbw", "12.75")] {
            let t = titles.find(title).unwrap() + title.len();
            let v = l.find(value).unwrap() + value.len();
            assert_eq!(t, v, "{title}\n{titles}\n{l}");
        }
        assert_eq!(titles.len(), l.len());
        let only_out = line(&[out]);
        assert!(
            only_out.ends_with("    n/a     n/a     n/a    n/a"),
            "{only_out}"
        );
    }

    #[test]
    fn average_bus_bandwidth() {
        let mut a = sample_row();
        a.busbw_gbps = 1.0;
        let mut b = sample_row();
        b.busbw_gbps = 2.0;
        b.wrong = Some(3);
        let f = footer(&[a, b]);
        assert!(f.contains("Avg bus bandwidth    : 1.5000"), "{f}");
        assert!(f.contains(": 3 FAILED"), "{f}");
    }
}
