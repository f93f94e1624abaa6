//! comm-bench run as a user runs it: sweeps on the CPU backend with 2 and 3 ranks, a corrupted
//! result caught by the check, ranks started by a launcher, and `report` on a fixed CSV.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use comm_bench::record::{self, Row};
use comm_core::Collective;
mod common;

use common::{comm_bench, run};
use test_support::process::{run_together, scratch, Plainly};

/// Placements measured per size with `--collectives all`: out of place for every collective of
/// comm-core's table, in place where the table says it has that form.
fn placements() -> usize {
    Collective::ALL
        .iter()
        .map(|c| 1 + usize::from(c.describe().in_place))
        .sum()
}

/// Table lines (not comments) of stdout.
fn lines(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| {
            l.starts_with(' ') && l.trim().chars().next().is_some_and(|c| c.is_ascii_digit())
        })
        .collect()
}

#[test]
fn quick_sweep_on_two_and_three_ranks() {
    let dir = scratch("sweep");
    let (csv, json) = (dir.join("r.csv"), dir.join("r.json"));
    let (out, stdout, stderr) = run(&[
        "--backend",
        "cpu",
        "--world-sizes",
        "2,3",
        "--collectives",
        "all",
        "-b",
        "1K",
        "-e",
        "256K",
        "-f",
        "16",
        "-n",
        "3",
        "-w",
        "1",
        "--csv",
        csv.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for ws in [2, 3] {
        for c in Collective::ALL.map(Collective::name) {
            assert!(
                stdout.contains(&format!(
                    "# comm-bench {}: {c} on {ws} ranks (1 node), backend cpu",
                    env!("CARGO_PKG_VERSION")
                )),
                "{c} {ws}\n{stdout}"
            );
        }
    }
    assert!(stdout.contains("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"));
    // One table per collective of comm-core's table and world size.
    let tables = 2 * Collective::ALL.len();
    assert_eq!(
        stdout.matches("# Avg bus bandwidth    : ").count(),
        tables,
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("# Wrong elements       : 0 OK").count(),
        tables,
        "{stdout}"
    );
    // Every collective x 3 sizes x 2 world sizes.
    let table = lines(&stdout);
    assert_eq!(table.len(), Collective::ALL.len() * 3 * 2, "{stdout}");
    // all_gather on 3 ranks: 1K rounds down to 85 floats per rank, 255 in all; the size
    // column is the whole buffer and the count column the call's count, one rank's block, as
    // nccl-tests prints them. all_reduce's count is the whole buffer's.
    assert!(
        table
            .iter()
            .any(|l| l.starts_with("        1020            85     float    none      -1")),
        "{stdout}"
    );
    assert!(
        table
            .iter()
            .any(|l| l.starts_with("        1024           256     float     sum      -1")),
        "{stdout}"
    );

    let rows = record::read(&csv).unwrap();
    assert_eq!(rows, record::read(&json).unwrap());
    // A row per placement a collective has (sendrecv and alltoall: out-of-place only), size and
    // world size.
    assert_eq!(rows.len(), placements() * 3 * 2);
    for r in &rows {
        assert_eq!(r.wrong, Some(0), "{r:?}");
        assert_eq!(
            (r.backend.as_str(), r.nodes, r.iters, r.warmup),
            ("cpu", 1, 3, 1)
        );
        assert!(
            r.time_us_min <= r.time_us_median && r.time_us_median <= r.time_us_max,
            "{r:?}"
        );
        let c: Collective = r.collective.parse().unwrap();
        // nccl-tests' algbw, from the table's time (-a 1, the mean over ranks, by default).
        assert_eq!((r.average, r.blocking), (Some(1), 0), "{r:?}");
        let algbw = r.bytes as f64 / (r.time_us * 1e-6) / 1e9;
        assert!(
            (r.algbw_gbps - algbw).abs() <= 1e-9 * algbw.max(1.0),
            "{r:?}"
        );
        let busbw = algbw * c.bus_factor(r.world_size);
        assert!(
            (r.busbw_gbps - busbw).abs() <= 1e-9 * busbw.max(1.0),
            "{r:?}"
        );
        assert!(r.machine.contains("cores") && !r.host.is_empty() && r.started.ends_with('Z'));
    }
    assert!(rows
        .iter()
        .any(|r| r.collective == "broadcast" && r.root == 0 && r.redop == "none"));
    assert!(rows
        .iter()
        .all(|r| r.collective != "sendrecv" || r.placement == "out-of-place"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// alltoall, added through comm-core's collective table: every row checked (#wrong 0) and busbw
/// = algbw × (n-1)/n, nccl-tests' factor, at each world size.
#[test]
fn alltoall_on_two_three_and_four_ranks() {
    let (out, stdout, stderr) = run(&[
        "--backend",
        "cpu",
        "--collectives",
        "alltoall",
        "--world-sizes",
        "2,3,4",
    ]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let tables: Vec<&str> = stdout.split("# comm-bench ").skip(1).collect();
    assert_eq!(tables.len(), 3, "{stdout}");
    for (table, n) in tables.iter().zip([2usize, 3, 4]) {
        assert!(
            table.contains(&format!(": alltoall on {n} ranks (1 node), backend cpu")),
            "{table}"
        );
        let rows = lines(table);
        assert_eq!(rows.len(), 9, "1K to 64M by 4: {table}");
        for row in rows {
            let cols: Vec<&str> = row.split_whitespace().collect();
            let (bytes, count): (u64, u64) = (cols[0].parse().unwrap(), cols[1].parse().unwrap());
            // The size is the whole buffer of n blocks; the count one block's (nccl-tests').
            assert_eq!(bytes, count * 4 * n as u64, "whole blocks: {row}");
            let (algbw, busbw): (f64, f64) = (cols[6].parse().unwrap(), cols[7].parse().unwrap());
            let want = algbw * (n as f64 - 1.0) / n as f64;
            // Both columns are rounded to 0.01.
            assert!(
                (busbw - want).abs() <= 0.0101,
                "busbw {busbw} vs {want}: {row}"
            );
            assert_eq!(cols[8], "0", "#wrong: {row}");
            assert_eq!(cols[9..], ["n/a"; 4], "no in-place form: {row}");
        }
        assert!(table.contains("# Wrong elements       : 0 OK"), "{table}");
    }
}

/// nccl-tests' timing modes on the CPU backend, as a user runs them: -z 0 (the default: back to
/// back, one wait), -z 1 (each iteration waited for, the barrier after it timed) and -z 3 (each
/// iteration timed alone), with -m calls per iteration, -a's statistics over ranks and -I's
/// per-iteration marks. The header says what was timed; the CSV keeps it.
#[test]
fn every_timing_mode_runs_on_the_cpu_backend() {
    let dir = scratch("modes");
    for (flags, blocking, agg, average, per_iter, header) in [
        (
            vec![],
            0,
            1,
            1,
            0,
            "waited for once (-z 0); of the ranks' times, the mean (-a 1)",
        ),
        (
            vec!["-z", "1", "-m", "3", "-a", "0"],
            1,
            3,
            0,
            0,
            "followed by a barrier (counted) (-z 1); of the ranks' times, rank 0's (-a 0)",
        ),
        (
            vec!["--blocking", "3", "--average", "3", "-I", "1"],
            3,
            1,
            3,
            1,
            "the barrier between iterations not counted (-z 3); of the ranks' times, the slowest rank's (-a 3)",
        ),
    ] {
        let csv = dir.join(format!("z{blocking}.csv"));
        let mut args = vec![
            "--backend",
            "cpu",
            "--world-sizes",
            "2",
            "-b",
            "4K",
            "-e",
            "64K",
        ];
        args.extend(["-n", "4", "-w", "1", "--csv", csv.to_str().unwrap()]);
        args.extend(flags);
        let (out, stdout, stderr) = run(&args);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        let said = format!(
            "agg iters: {agg} blocking: {blocking} average: {average} per-iter timing: {per_iter} check: 1\n# time: per call on the host clock, "
        );
        assert!(stdout.contains(&said), "{said} in\n{stdout}");
        assert!(stdout.contains(header), "{header} in\n{stdout}");
        assert!(
            stdout.contains(
                "# median, min, max over iterations (--csv/--json): each iteration timed as its \
                 slowest rank; "
            ),
            "{stdout}"
        );
        let text = std::fs::read_to_string(&csv).unwrap();
        assert!(
            text.lines().next().unwrap().contains(
                ",blocking,agg_iters,average,per_iter_timing,time_us,time_us_median,time_us_min,\
                 time_us_max,iter_clock,algbw_gbps,busbw_gbps,"
            ),
            "{text}"
        );
        let rows = record::read(&csv).unwrap();
        assert_eq!(rows.len(), 3 * 2, "3 sizes, 2 placements");
        for r in &rows {
            assert_eq!(
                (r.blocking, r.agg_iters, r.average, r.per_iter_timing, r.wrong),
                (blocking, agg, Some(average), per_iter, Some(0))
            );
            assert_eq!(r.iter_clock, "host clock", "the CPU backend's clock");
            assert!(r.time_us > 0.0, "{r:?}");
            assert!(
                r.time_us_min <= r.time_us_median && r.time_us_median <= r.time_us_max,
                "{r:?}"
            );
            if blocking == 0 && per_iter == 0 {
                // One time for the whole loop: the slowest rank's.
                assert_eq!(
                    (r.time_us_min, r.time_us_max),
                    (r.time_us_median, r.time_us_median)
                );
                assert!(r.time_us <= r.time_us_median * (1.0 + 1e-9), "mean <= max: {r:?}");
            }
            if average == 3 && per_iter == 1 {
                // -a 3 is the slowest rank's mean: at most its slowest iteration. The mean is
                // read around each iteration's batch and the iterations between the stopwatch's
                // marks inside it, so the mean may exceed the max by those few instructions
                // (CI saw 27.4965 us against 27.491): 1% and 50 ns of slack.
                assert!(r.time_us <= r.time_us_max * 1.01 + 0.05, "{r:?}");
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_corrupted_result_is_counted_and_fails_the_run() {
    let (out, stdout, stderr) = run(&[
        "--backend",
        "cpu",
        "--world-sizes",
        "2",
        "--collectives",
        "all",
        "-b",
        "64K",
        "-e",
        "64K",
        "-n",
        "1",
        "-w",
        "0",
        "--inject-error",
    ]);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let table = lines(&stdout);
    assert_eq!(table.len(), Collective::ALL.len(), "{stdout}");
    for l in table {
        // One element of one rank's result per placement: #wrong 1 (n/a where no in-place).
        let cols: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(cols[8], "1", "{l}");
        assert!(cols[12] == "1" || cols[12] == "n/a", "{l}");
    }
    assert!(
        stdout.contains("# Wrong elements       : 2 FAILED"),
        "{stdout}"
    );
    // One per placement measured: out of place for every collective, in place where it exists.
    let wrong = format!("{} wrong elements", placements());
    assert!(stderr.contains(&wrong), "{wrong} in\n{stderr}");
}

#[test]
fn ranks_started_by_a_launcher_measure_together() {
    // As torchrun or commrun would start them: one process per rank with torchrun's variables.
    let port = comm_core::spawn::free_port().unwrap().to_string();
    let dir = scratch("launcher");
    let csv = dir.join("r.csv");
    let ranks = (0..2)
        .map(|rank| {
            let mut c = comm_bench();
            c.args([
                "--backend",
                "cpu,nccl",
                "-b",
                "1M",
                "-e",
                "1M",
                "-n",
                "2",
                "-w",
                "1",
            ])
            .args(["--timeout", "60"])
            .args(["--world-sizes", "4", "--csv", csv.to_str().unwrap()])
            .envs([
                ("RANK", rank.to_string()),
                ("LOCAL_RANK", rank.to_string()),
                ("WORLD_SIZE", "2".into()),
                ("LOCAL_WORLD_SIZE", "2".into()),
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", port.clone()),
            ]);
            c
        })
        .collect();
    let outs = run_together(ranks, Duration::from_secs(180));
    let (rank0, err0) = (&outs[0].stdout, &outs[0].stderr);
    for o in &outs {
        assert!(o.status.success(), "{rank0}\n{err0}\n{}", o.stderr);
    }
    assert!(
        rank0.contains("all_reduce on 2 ranks (1 node), backend cpu"),
        "{rank0}"
    );
    assert_eq!(lines(rank0).len(), 1, "{rank0}");
    assert!(
        err0.contains("--world-sizes applies only when comm-bench starts the ranks"),
        "{err0}"
    );
    assert!(err0.contains("skipping --backend nccl"), "{err0}");
    assert!(outs[1].stdout.is_empty(), "only rank 0 prints the table");
    assert_eq!(record::read(&csv).unwrap().len(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn mistakes_are_explained() {
    let (out, _, stderr) = run(&["--collectives", "scatter_gather"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr.contains("unknown collective \"scatter_gather\""),
        "{stderr}"
    );
    let (out, _, stderr) = run(&["-b", "1M", "-e", "1K"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("larger than -e/--maxbytes"), "{stderr}");
    let (out, _, stderr) = run(&["-b", "1.5M"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("is not a size"), "{stderr}");
    // nccl-tests' ranges: -a 0 to 3, -z 0, 1 or 3 (its 2 is not offered), -I 0 or 1; one line each.
    for (flags, said) in [
        (["-a", "7"], "comm-bench: error: -a/--average 7: give 0 (rank 0's time), 1 (the mean over ranks), 2 (the fastest rank's) or 3 (the slowest rank's)\n"),
        (["-z", "2"], "comm-bench: error: -z/--blocking 2: give 0 (back to back, one wait), 1 (wait for each iteration, then a barrier, all timed) or 3 (wait for each iteration, the barrier not timed)\n"),
        (["-I", "2"], "comm-bench: error: -I/--per_iter_timing 2: give 0 (off) or 1 (time each iteration)\n"),
    ] {
        let (out, stdout, stderr) = run(&flags);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
        assert_eq!(stderr, said, "{flags:?}");
        assert!(stdout.is_empty(), "{flags:?}: {stdout}");
    }
    let (out, stdout, _) = run(&["--help"]);
    assert!(out.status.success());
    for documented in [
        "WHAT IS TIMED",
        "slowest rank",
        "2(n-1)/n",
        "--inject-error",
        "--preset",
        "-z, --blocking <0|1|3>",
        "-a, --average <0|1|2|3>",
        "-I, --per_iter_timing <0|1>",
        "nccl-tests' -z 2",
        "the barrier between\n    iterations not counted",
        "time_us_median",
        "cuEventElapsedTime",
        "-m, --agg_iters",
        "back to back",
        "On the CPU backend",
    ] {
        assert!(stdout.contains(documented), "{documented}\n{stdout}");
    }
}

fn decode_png(path: &Path) -> (u32, u32) {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut buf).unwrap();
    // Not a blank canvas: some pixels are not white.
    assert!(
        buf[..frame.buffer_size()].iter().any(|&b| b < 200),
        "{}",
        path.display()
    );
    (frame.width, frame.height)
}

#[test]
fn report_turns_a_laptop_and_a_cluster_run_into_plots_and_tables() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/laptop-and-cluster.csv");
    let dir = scratch("report");
    let (out, stdout, stderr) = run(&[
        "report",
        data.to_str().unwrap(),
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for stem in [
        "all_reduce-time",
        "all_reduce-busbw",
        "all_reduce-100MB",
        "all_gather-time",
    ] {
        assert_eq!(
            decode_png(&dir.join(format!("{stem}.png"))),
            (960, 600),
            "{stem}"
        );
        let svg = std::fs::read_to_string(dir.join(format!("{stem}.svg"))).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{stem}"
        );
        assert!(svg.contains("all_") && svg.contains("<text"), "{stem}");
    }
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        md.contains("| backend | ranks | size | type | redop | placement | time ms | median ms |"),
        "{md}"
    );
    assert!(
        md.contains("| nccl | 2 | 100 MB | float | sum | in-place | 0.700 | 0.700 |"),
        "{md}"
    );
    assert!(
        md.contains("| NCCL 2.21.5 | NVIDIA A100-SXM-64GB |"),
        "{md}"
    );
    assert!(
        md.contains("![all_reduce at 100 MB: time by backend and ranks](all_reduce-100MB.png)"),
        "{md}"
    );
    // Observations computed from the numbers, in the report and on stdout.
    for said in [
        "all_reduce near 100 MB on 2 ranks: nccl takes 700.0 us (142.86 GB/s busbw), cpu takes 115 ms (0.87 GB/s busbw): nccl is 164.3x faster.",
        "all_reduce on cpu at 100 MB, 2 → 4 ranks: time 115 ms → 198 ms, busbw 0.87 GB/s → 0.76 GB/s",
        "all_reduce, cpu, 2 ranks (in-place): busbw saturates from 10 MB on",
        "all_reduce, nccl, 2 ranks (in-place): busbw is still rising at the largest size measured (142.86 GB/s at 100 MB)",
    ] {
        assert!(md.contains(said), "{said}\n{md}");
        assert!(stdout.contains(said), "{said}\n{stdout}");
    }
    let (out, _, stderr) = run(&["report", dir.join("nothing.csv").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("nothing.csv"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn rows_of_a_run_are_what_the_table_shows() {
    // The table line is built from the same rows the CSV keeps.
    let dir = scratch("rows");
    let csv = dir.join("r.csv");
    let (out, stdout, stderr) = run(&[
        "--backend",
        "cpu",
        "--world-sizes",
        "2",
        "-b",
        "32K",
        "-e",
        "32K",
        "-n",
        "2",
        "-w",
        "0",
        "-d",
        "int32,double",
        "-o",
        "max",
        "--placement",
        "in-place",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let rows: Vec<Row> = record::read(&csv).unwrap();
    assert_eq!(rows.len(), 2);
    for r in &rows {
        assert_eq!(
            (r.redop.as_str(), r.placement.as_str()),
            ("max", "in-place")
        );
        assert!(
            stdout.contains(&comm_bench::table::line(std::slice::from_ref(r))),
            "{stdout}"
        );
    }
    assert_eq!((rows[0].dtype.as_str(), rows[0].count), ("int32", 8192));
    assert_eq!((rows[1].dtype.as_str(), rows[1].count), ("double", 4096));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// scripts/nccl-vs-pytorch.sh (the NCCL-vs-PyTorch figure) on the CPU backend against Gloo.
/// It needs a Python with torch: NCCL_WORKSHOP_TEST_PYTHON names one, else the test skips.
#[test]
fn the_pytorch_comparison_script_runs_where_torch_is() {
    let Ok(python) = std::env::var("NCCL_WORKSHOP_TEST_PYTHON") else {
        eprintln!("skipped: set NCCL_WORKSHOP_TEST_PYTHON to a python3 that has torch");
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_comm-bench"))
        .parent()
        .unwrap();
    let mut script = Command::new("bash");
    script
        .arg(root.join("scripts/nccl-vs-pytorch.sh"))
        .envs([("BACKEND", "cpu"), ("SIZE_MB", "1"), ("ITERS", "3")])
        .env("PYTHON", python)
        .env("BIN_DIR", bin_dir);
    script.plainly();
    let out = script.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in ["  ours ", "  PyTorch ", "  PyTorch time / ours: "] {
        assert!(stdout.contains(line), "{line} in\n{stdout}");
    }
}

/// `comm-bench … | head -0`: the pipe's reader is gone before anything is printed. The run ends
/// by SIGPIPE as Unix tools do, says so, and panics nowhere.
#[test]
fn output_closed_early_ends_the_run_without_a_panic() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let output = comm_bench()
        .args([
            "--backend",
            "cpu",
            "--world-sizes",
            "2",
            "-b",
            "1K",
            "-e",
            "4K",
        ])
        .stdout(writer)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(141), "128 + SIGPIPE:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `--algo`, as docs/src/watching.md runs it: the header names the algorithm and every row of
/// both is checked (#wrong 0, in place and out of place).
#[test]
fn algo_picks_the_cpu_algorithm_and_the_header_names_it() {
    let mut checked = 0;
    for algo in ["ring", "direct"] {
        let args = [
            "--collectives",
            "all_reduce",
            "--world-sizes",
            "4",
            "-b",
            "64K",
            "-e",
            "4M",
            "-f",
            "4",
            "--algo",
            algo,
        ];
        let (out, stdout, stderr) = run(&args);
        assert!(out.status.success(), "{stderr}");
        if !stdout.contains("backend cpu") {
            return; // NCCL ran: --algo is the CPU backend's
        }
        assert!(stdout.contains(&format!("{algo} algorithm")), "{stdout}");
        let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('#')).collect();
        let sizes: Vec<&str> = rows
            .iter()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert!(sizes.contains(&"4194304"), "{stdout}");
        for row in &rows {
            let cols: Vec<&str> = row.split_whitespace().collect();
            if cols.len() == 13 {
                assert_eq!((cols[8], cols[12]), ("0", "0"), "#wrong in {row}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 8, "4 sizes for each algorithm");
}
