//! `comm-bench predict` run as a user runs it: the table's shape, NCCL's choices, the CSV that
//! `report` reads, refusals, `--calibrate`, and the predictions against published measurements
//! of NCCL on Leonardo and similar A100 systems.

use std::path::{Path, PathBuf};

use comm_bench::record;
mod common;

use common::run;
use test_support::process::scratch;

/// One predicted line: size, count, type, redop, root, time, algbw, busbw, algo, proto.
#[derive(Debug)]
struct Line {
    bytes: u64,
    time_us: f64,
    busbw: f64,
    algo: String,
    proto: String,
}

fn lines(stdout: &str) -> Vec<Line> {
    stdout
        .lines()
        .filter(|l| l.starts_with(' ') && l.trim().starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 10, "ten columns in {l:?}");
            Line {
                bytes: f[0].parse().unwrap(),
                time_us: f[5].parse().unwrap(),
                busbw: f[7].parse().unwrap(),
                algo: f[8].into(),
                proto: f[9].into(),
            }
        })
        .collect()
}

fn predict(args: &[&str]) -> Vec<Line> {
    let mut all = vec!["predict"];
    all.extend_from_slice(args);
    let (out, stdout, stderr) = run(&all);
    assert!(out.status.success(), "{all:?} failed: {stderr}");
    lines(&stdout)
}

fn system_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn table_covers_8_bytes_to_8_gib_with_times_that_grow() {
    let (out, stdout, _) = run(&["predict", "--system", "leonardo", "--nodes", "2"]);
    assert!(out.status.success());
    let l = lines(&stdout);
    assert_eq!(l.len(), 31, "8 B to 8 GiB by 2");
    assert_eq!((l[0].bytes, l[30].bytes), (8, 8 << 30));
    assert!(l.windows(2).all(|w| w[1].bytes == 2 * w[0].bytes));
    assert!(l.windows(2).all(|w| w[1].time_us >= w[0].time_us));
    // The footer cites the model and says what it leaves out.
    assert!(stdout.contains("tuning.cc:54-78") && stdout.contains("v2.21.5-1"));
    assert!(stdout.contains("Left out: congestion"));
    assert!(stdout.contains("leonardo-supercomputer.cineca.eu"));
}

#[test]
fn nccl_choices_switch_with_size() {
    let many = predict(&["--nodes", "16"]);
    let (first, last) = (&many[0], &many[many.len() - 1]);
    assert_eq!((first.algo.as_str(), first.proto.as_str()), ("tree", "LL"));
    assert_eq!(
        (last.algo.as_str(), last.proto.as_str()),
        ("ring", "Simple")
    );
    let one = predict(&["--nodes", "1"]);
    assert_eq!(one[0].proto, "LL");
    assert_eq!(one[one.len() - 1].proto, "Simple");
    // Only ring runs all_gather (tuning.cc:169).
    let gather = predict(&["--nodes", "16", "--collectives", "all_gather"]);
    assert!(gather.iter().all(|l| l.algo == "ring"));
}

#[test]
fn csv_is_read_by_report_as_its_own_series() {
    let dir = scratch("predict-csv");
    let csv = dir.join("model.csv");
    let plot = dir.join("plots");
    let (out, _, stderr) = run(&[
        "predict",
        "--nodes",
        "2",
        "--collectives",
        "all",
        "-e",
        "64M",
        "--csv",
        csv.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{stderr}");
    let rows = record::read(&csv).unwrap();
    assert!(rows.iter().all(|r| r.backend == "model:nccl-2.21.5"));
    assert!(rows.iter().all(|r| r.world_size == 8 && r.nodes == 2));
    assert!(plot.join("report.md").is_file());
    let (out, stdout, stderr) =
        run(&["report", csv.to_str().unwrap(), "-o", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("wrote"));
}

#[test]
fn bad_flags_are_refused_in_one_line() {
    let dir = scratch("predict-bad");
    let bad_toml = system_file(&dir, "bad.toml", "name = \"x\"\ngpus_per_node = \"four\"\n");
    let bad = bad_toml.to_str().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (&["--nodes", "0"], "--nodes 0"),
        (&["--nodes", "1250"], "4096"),
        (&["--gpus-per-node", "0"], "--gpus-per-node 0"),
        (&["--system", "nosuch"], "--system \"nosuch\""),
        (&["--system", bad], "line 2"),
        (&["--collectives", "alltoall"], "--collectives"),
    ];
    for (args, says) in cases {
        let mut all = vec!["predict"];
        all.extend_from_slice(args);
        let (out, _, stderr) = run(&all);
        assert_eq!(out.status.code(), Some(1), "{all:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{all:?}: {stderr}");
        assert!(stderr.contains(says), "{all:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{all:?}: {stderr}");
    }
}

#[test]
fn calibrate_recovers_the_scales_a_sweep_was_made_with() {
    let dir = scratch("predict-calibrate");
    let csv = dir.join("sweep.csv");
    let (out, _, stderr) = run(&[
        "predict",
        "--nodes",
        "4",
        "--bw-scale",
        "0.7",
        "--lat-scale",
        "1.8",
        "-b",
        "8",
        "-e",
        "1G",
        "-f",
        "4",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{stderr}");
    let (out, stdout, stderr) = run(&["predict", "--calibrate", csv.to_str().unwrap(), "-e", "1M"]);
    assert!(out.status.success(), "{stderr}");
    let value = |key: &str| -> f64 {
        let at = stdout.find(key).expect(key) + key.len();
        let text: String = stdout[at..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        text.parse().unwrap()
    };
    let (bw, lat) = (value("bw_scale = "), value("lat_scale = "));
    assert!((bw / 0.7 - 1.0).abs() < 0.01, "bw_scale {bw}\n{stdout}");
    assert!((lat / 1.8 - 1.0).abs() < 0.01, "lat_scale {lat}\n{stdout}");
}

/// 3 nodes of 8 x A100-SXM4-40GB, 4 HDR (200 Gb/s) adapters each, Xeon Platinum 8358, as in
/// github.com/NVIDIA/nccl-tests/issues/119.
const A100_4HDR: &str = r#"
name = "a100-4hdr"
description = "8 x A100 SXM4 40 GB (NVSwitch), 4 x HDR 200 Gb/s, Xeon 8358"
compute_capability = 80
gpus_per_node = 8
cpu_vendor = "intel"
[intra]
kind = "nvlink"
links_per_gpu = 12
link_gbs = 20.0
[net]
nics_per_node = 4
nic_gbps = 200.0
nic_near_gpu = true
"#;

/// Published NCCL all_reduce measurements (nccl-tests, out-of-place): the system, nodes, GPUs
/// per node, size, the published time (us) or busbw (GB/s), and where it was published.
struct Published {
    system: &'static str,
    nodes: usize,
    gpus_per_node: usize,
    bytes: u64,
    time_us: Option<f64>,
    busbw: Option<f64>,
    source: &'static str,
}

const PUBLISHED: &[Published] = &[
    Published {
        system: "leonardo",
        nodes: 1,
        gpus_per_node: 2,
        bytes: 8,
        time_us: Some(9.85),
        busbw: None,
        source: "Leonardo node lrdn2296, 2 GPUs: github.com/NVIDIA/nccl-tests/issues/331",
    },
    Published {
        system: "dgx-a100",
        nodes: 1,
        gpus_per_node: 2,
        bytes: 32,
        time_us: Some(10.14),
        busbw: None,
        source: "2 x A100-SXM4-40GB: github.com/NVIDIA/nccl/issues/583",
    },
    Published {
        system: "dgx-a100",
        nodes: 1,
        gpus_per_node: 8,
        bytes: 8 << 30,
        time_us: None,
        busbw: Some(230.0),
        source: "NCCL maintainer, 8 x A100 NVSwitch at 8G: github.com/NVIDIA/nccl-tests/issues/149",
    },
    Published {
        system: "a100-4hdr",
        nodes: 3,
        gpus_per_node: 8,
        bytes: 128 << 20,
        time_us: None,
        busbw: Some(96.0),
        source: "3 x (8 x A100, 4 x HDR) peak busbw: github.com/NVIDIA/nccl-tests/issues/119",
    },
];

#[test]
fn predictions_match_published_measurements() {
    let dir = scratch("predict-published");
    let a100_4hdr = system_file(&dir, "a100-4hdr.toml", A100_4HDR);
    let dgx = concat!(env!("CARGO_MANIFEST_DIR"), "/systems/dgx-a100.toml");
    let mut report = String::new();
    for p in PUBLISHED {
        let system = match p.system {
            "dgx-a100" => dgx.to_string(),
            "a100-4hdr" => a100_4hdr.to_str().unwrap().to_string(),
            other => other.to_string(),
        };
        let (nodes, gpn, size) = (
            p.nodes.to_string(),
            p.gpus_per_node.to_string(),
            p.bytes.to_string(),
        );
        let l = predict(&[
            "--system",
            &system,
            "--nodes",
            &nodes,
            "--gpus-per-node",
            &gpn,
            "-b",
            &size,
            "-e",
            &size,
        ]);
        let l = &l[0];
        let (ratio, what) = match (p.time_us, p.busbw) {
            (Some(t), _) => (l.time_us / t, format!("time {} us vs {t} us", l.time_us)),
            (_, Some(b)) => (l.busbw / b, format!("busbw {} vs {b} GB/s", l.busbw)),
            _ => unreachable!(),
        };
        let ok = if p.bytes >= 128 << 20 {
            (0.7..=1.3).contains(&ratio)
        } else {
            (0.5..=2.0).contains(&ratio)
        };
        report += &format!(
            "{} {}x{} {} B: {what} ({})\n",
            p.system, p.nodes, p.gpus_per_node, p.bytes, p.source
        );
        assert!(ok, "off by {ratio:.2}x:\n{report}");
    }
    println!("{report}");
}

/// `predict --layouts`: the comparison the book's tensor-parallel chapter shows, row for row,
/// with tensor parallelism inside a node cheaper at every node count; and a size it does not
/// know, refused by name.
#[test]
fn layouts_compare_tensor_parallel_inside_and_across_nodes() {
    let (out, stdout, stderr) = run(&["predict", "--layouts", "7B"]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with(' ') && l.contains(": tp "))
        .collect();
    assert_eq!(
        rows.len(),
        12,
        "2, 4 ... 64 nodes, two layouts each:\n{stdout}"
    );
    for pair in rows.chunks(2) {
        let step = |row: &str| -> f64 {
            let cells: Vec<&str> = row.split_whitespace().collect();
            cells[cells.len() - 2].parse().unwrap()
        };
        assert!(
            pair[0].contains("dp,tp") && pair[1].contains("tp,dp"),
            "{pair:?}"
        );
        assert!(step(pair[0]) < step(pair[1]), "{pair:?}");
    }
    let chapter = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/tensor-parallel.md");
    let chapter = std::fs::read_to_string(chapter).unwrap();
    let shown: Vec<&str> = chapter
        .lines()
        .filter(|l| l.starts_with(' ') && l.contains(": tp "))
        .collect();
    assert!(shown.len() >= 2, "the chapter shows the table");
    for line in shown {
        assert!(
            rows.contains(&line),
            "the chapter shows {line:?}; predict prints:\n{stdout}"
        );
    }
    let (out, _, stderr) = run(&["predict", "--layouts", "huge"]);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--layouts huge: name a model size"),
        "{stderr}"
    );
}
