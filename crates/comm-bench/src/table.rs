//! nccl-tests' table, column for column: size, count, type, redop, root, then time, algbw, busbw
//! and #wrong out-of-place and in-place; a block per collective and world size, closed by the
//! average bus bandwidth.

use comm_core::backend::nccl;
use comm_core::timing::{Average, Waiting};
use comm_core::Collective;

use crate::plan::Plan;
use crate::record::{Row, RunInfo};

/// The lines that open a block: what ran, then exactly what the time column is.
pub fn header(info: &RunInfo, collective: &str, plan: &Plan) -> String {
    let nodes = match info.nodes {
        1 => "1 node".to_string(),
        n => format!("{n} nodes"),
    };
    format!(
        "# comm-bench {}: {collective} on {} ranks ({nodes}), backend {} ({}), host {}, {}\n\
         # minBytes {} maxBytes {} warmup iters: {} iters: {} agg iters: {} blocking: {} average: {} per-iter timing: {} check: {}\n\
         {}{}\
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
        info.average,
        info.per_iter_timing,
        plan.checks,
        what_is_timed(info),
        nccl_call_note(collective, &info.backend_version).unwrap_or_default(),
    )
}

/// NCCL 2.28 has calls of its own for alltoall, gather and scatter (`ncclAlltoAll`,
/// `ncclGather`, `ncclScatter`), which nccl-tests calls where it was built against 2.28 or
/// later. comm-core's NCCL backend enqueues the grouped ncclSend/ncclRecv that nccl-tests uses
/// before 2.28, on every version (its `collectives.rs`): a `#` line under such a table's header
/// says so where the NCCL that ran has the call, so that its rows are compared with nccl-tests
/// knowingly. None elsewhere. `backend_version` is the rows' (`NCCL 2.28.3`).
pub fn nccl_call_note(collective: &str, backend_version: &str) -> Option<String> {
    let call = nccl::own_call_since_2_28(collective.parse::<Collective>().ok()?)?;
    let version = backend_version.strip_prefix("NCCL ")?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next()??, parts.next()??);
    ((major, minor) >= (2, 28)).then(|| {
        format!(
            "# calls: grouped ncclSend/ncclRecv (nccl-tests' {collective} before NCCL 2.28); \
             nccl-tests built against NCCL {version} calls {call} instead\n"
        )
    })
}

/// Two comment lines: what the time column is (-a over the ranks' host-clock times, as -z
/// says), and where the per-iteration statistics of --csv and --json come from (-I).
pub fn what_is_timed(info: &RunInfo) -> String {
    let average = Average::from_flag(info.average).unwrap_or_default();
    let waiting = Waiting::from_flag(info.blocking).unwrap_or(Waiting::BackToBack);
    let iterations = match (info.per_iter_timing, waiting) {
        (1, Waiting::EachCall) if info.backend == "nccl" => {
            "CUDA events on the rank's stream, one before each iteration's calls and one after the \
             wait for them"
        }
        (1, _) if info.backend == "nccl" => {
            "CUDA events on the rank's stream, one before each iteration and one after the last"
        }
        (1, _) => "host clock, a mark before and after each iteration",
        (_, Waiting::BackToBack) => {
            "-z 0 times the loop only (min = median = max); -I 1 marks each"
        }
        (_, Waiting::BarrierEach) => "host clock, each iteration with the barrier after it",
        (_, Waiting::EachCall) => {
            "host clock, each iteration from its launch to the end of its work"
        }
    };
    // Two numbers, each said once: the table's time combines the ranks' times as -a says; the
    // CSV's per-iteration statistics take each iteration's slowest rank.
    format!(
        "# time: per call on the host clock, {} (-z {}); of the ranks' times, {} (-a {})\n\
         # median, min, max over iterations (--csv/--json): each iteration timed as its slowest \
         rank; {iterations}\n{}",
        waiting.describe(),
        waiting.flag(),
        average.describe(),
        average.flag(),
        barrier_note(waiting, &info.backend),
    )
}

/// Where the barrier -z 1 times differs from nccl-tests': on NCCL it goes through the
/// communicator (an all-reduce of one int32, a kernel on the rank's stream, and a wait for it),
/// where nccl-tests' `Barrier` (`src/common.cu`) is its threads' and MPI's, on the host, with
/// no GPU work. Said under the header so that a -z 1 row is compared with nccl-tests knowingly.
fn barrier_note(waiting: Waiting, backend: &str) -> &'static str {
    match (waiting, backend) {
        (Waiting::BarrierEach, "nccl") => {
            "# barrier (-z 1): an NCCL all-reduce of one int32 and a wait for it, counted: each \
             iteration adds a kernel and a GPU round trip that nccl-tests' host barrier does not; \
             -z 3 leaves the barrier out\n"
        }
        _ => "",
    }
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
            time(r.time_us),
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
        out.time_us = 123.45;
        out.algbw_gbps = 8.5;
        out.busbw_gbps = 12.75;
        let mut inp = out.clone();
        inp.placement = "in-place".into();
        inp.time_us = 12345.6;
        inp.wrong = None;
        let l = line(&[out.clone(), inp]);
        assert_eq!(
            l,
            "     1048576        262144     float     sum      -1    123.5    8.50   12.75      0    12346    8.50   12.75    N/A"
        );
        let info = crate::record::sample_info();
        let args = crate::cli::BenchArgs {
            ..<crate::cli::Cli as clap::Parser>::parse_from(["comm-bench"]).bench
        };
        let h = header(&info, "all_reduce", &Plan::resolve(&args).unwrap());
        let titles = h.lines().nth(6).unwrap();
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

    /// The header says what the time column is, for every -z, -a and -I.
    #[test]
    fn the_header_says_exactly_what_is_timed() {
        let said = |blocking, average, per_iter_timing, backend: &str| {
            what_is_timed(&RunInfo {
                blocking,
                average,
                per_iter_timing,
                backend: backend.into(),
                ..crate::record::sample_info()
            })
        };
        let z0 = said(0, 1, 0, "cpu");
        assert!(
            z0.starts_with(
                "# time: per call on the host clock, from a barrier to the end of the last call's \
                 work, calls enqueued back to back and waited for once (-z 0); of the ranks' times, \
                 the mean (-a 1)\n# median, min, max over iterations"
            ),
            "{z0}"
        );
        assert!(z0.contains("-z 0 times the loop only"), "{z0}");
        let z1 = said(1, 0, 0, "cpu");
        assert!(
            z1.contains(
                "followed by a barrier (counted) (-z 1); of the ranks' times, rank 0's (-a 0)"
            ),
            "{z1}"
        );
        let z3 = said(3, 3, 0, "cpu");
        assert!(
            z3.contains("the barrier between iterations not counted (-z 3); of the ranks' times, the slowest rank's (-a 3)"),
            "{z3}"
        );
        assert!(
            z3.contains("host clock, each iteration from its launch"),
            "{z3}"
        );
        assert!(said(0, 2, 0, "cpu").contains("of the ranks' times, the fastest rank's (-a 2)"));
        // -I 1: CUDA events on NCCL (pairs with -z 3), host-clock marks on the CPU.
        let z3_events = said(3, 1, 1, "nccl");
        assert!(
            z3_events.contains(
                "CUDA events on the rank's stream, one before each iteration's calls and one \
                 after the wait for them"
            ),
            "{z3_events}"
        );
        assert!(said(0, 1, 1, "nccl").contains("one before each iteration and one after the last"));
        // -z 1 on NCCL: the barrier is a collective on the GPU, unlike nccl-tests' host barrier.
        let z1_nccl = said(1, 1, 0, "nccl");
        assert!(
            z1_nccl.ends_with(
                "# barrier (-z 1): an NCCL all-reduce of one int32 and a wait for it, counted: \
                 each iteration adds a kernel and a GPU round trip that nccl-tests' host barrier \
                 does not; -z 3 leaves the barrier out\n"
            ),
            "{z1_nccl}"
        );
        assert_eq!(said(3, 1, 0, "nccl").lines().count(), 2);
        assert!(said(0, 1, 1, "cpu").contains("host clock, a mark before and after each"));
        for text in [z0, z1, z3] {
            assert_eq!(text.lines().count(), 2, "{text}");
            assert!(text.lines().all(|l| l.starts_with("# ")), "{text}");
        }
    }

    /// Only alltoall, gather and scatter, and only on an NCCL that has their own calls.
    #[test]
    fn the_header_says_where_nccl_tests_would_call_ncclalltoall() {
        let note = nccl_call_note("alltoall", "NCCL 2.28.3").unwrap();
        assert_eq!(
            note,
            "# calls: grouped ncclSend/ncclRecv (nccl-tests' alltoall before NCCL 2.28); \
             nccl-tests built against NCCL 2.28.3 calls ncclAlltoAll instead\n"
        );
        assert!(nccl_call_note("gather", "NCCL 3.0.1")
            .unwrap()
            .contains("calls ncclGather instead"));
        assert!(nccl_call_note("scatter", "NCCL 2.29.0").is_some());
        for (collective, version) in [
            ("alltoall", "NCCL 2.27.7"),
            ("alltoall", "NCCL 2.21.5"),
            ("all_reduce", "NCCL 2.28.3"),
            ("alltoall", "NCCL (version unknown)"),
            ("alltoall", "tcp transport (comm-core 0.1.0)"),
        ] {
            assert_eq!(
                nccl_call_note(collective, version),
                None,
                "{collective} {version}"
            );
        }
        let mut info = crate::record::sample_info();
        info.backend_version = "NCCL 2.28.3".into();
        let args = <crate::cli::Cli as clap::Parser>::parse_from(["comm-bench"]).bench;
        let plan = Plan::resolve(&args).unwrap();
        assert!(header(&info, "scatter", &plan).contains("calls ncclScatter instead\n#\n"));
        assert!(!header(&info, "all_gather", &plan).contains("# calls:"));
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
