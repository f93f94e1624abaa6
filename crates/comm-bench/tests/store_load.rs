//! `comm-bench store-load` as a user runs it: simulated ranks through our store's rendezvous, and
//! through PyTorch's TCPStore where the torch environment is installed; a rank count the
//! descriptor limit cannot hold is refused at once with the number it needs. No time is asserted:
//! the figures are the user's to read.

mod common;

use common::{comm_bench, run};

/// The table's rows: (ranks, store, seconds).
fn rows(stdout: &str) -> Vec<(usize, String, f64)> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let ranks = f.next()?.parse().ok()?;
            let store = f.next()?.to_string();
            let seconds = f.next()?.parse().ok()?;
            Some((ranks, store, seconds))
        })
        .collect()
}

#[test]
fn simulated_ranks_pass_our_stores_rendezvous() {
    let (out, stdout, stderr) = run(&[
        "store-load",
        "--store",
        "ours",
        "--ranks",
        "1,7,64",
        "--rounds",
        "1",
    ]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let rows = rows(&stdout);
    let ranks: Vec<usize> = rows.iter().map(|r| r.0).collect();
    assert_eq!(ranks, [1, 7, 64], "{stdout}");
    // A time is printed for each (one rank's may round to 0.000).
    assert!(rows.iter().all(|r| r.1 == "ours" && r.2 >= 0.0), "{stdout}");
}

#[test]
fn the_same_driver_passes_pytorchs_store() {
    let Some(torch) = test_support::torch::or_skip("store-load against torch's TCPStore") else {
        return;
    };
    let python = torch.python();
    let (out, stdout, stderr) = run(&[
        "store-load",
        "--ranks",
        "16",
        "--rounds",
        "1",
        "--python",
        python.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let stores: Vec<String> = rows(&stdout).into_iter().map(|r| r.1).collect();
    assert_eq!(stores, ["ours", "torch"], "{stdout}");
    assert!(stdout.contains("x the time"), "{stdout}");
}

#[test]
fn more_ranks_than_descriptors_is_refused_with_the_number_needed() {
    let bench = comm_bench().get_program().to_owned();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(r#"ulimit -n 256 && exec "$0" store-load --store ours --ranks 4096"#)
        .arg(bench)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("needs 8256 file descriptors") && stderr.contains("ulimit -n 8256"),
        "{stderr}"
    );
}
