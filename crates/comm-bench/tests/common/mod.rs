//! How the tests start comm-bench: this build's binary, plainly (no colour, no inherited job
//! variables).

use std::process::{Command, Output};

use test_support::process::Plainly;

pub fn comm_bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_comm-bench"));
    c.plainly();
    c
}

/// Runs comm-bench with `args` to the end: its output, stdout and stderr.
pub fn run(args: &[&str]) -> (Output, String, String) {
    let out = comm_bench().args(args).output().expect("comm-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}
