//! `comm-bench model FILES [--table]`: every series of the files fitted and described, a short
//! summary each (constants, accuracy, regimes in words), each size's row with `--table`; a series
//! of a collective the model has no steps for is named as skipped, not left out in silence.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::fit::Fit;
use super::machine::Machine;
use super::paths;
use super::series::{fit_rows, series};
use super::words::describe;
use crate::error::BenchError;
use crate::record;

/// The text of `comm-bench model`: with `table`, each size's row under its series' summary.
pub fn run(files: &[PathBuf], table: bool) -> Result<String, BenchError> {
    let mut rows = Vec::new();
    for file in files {
        rows.extend(record::read(file)?);
    }
    let here = record::host();
    let machine = rows.iter().any(|r| r.host == here).then(Machine::here);
    let mut out = String::from(
        "# comm-bench model: t(s) = steps(s) x alpha + bytes(s) / B, Hockney's latency-bandwidth model through\n\
         # each algorithm's steps; B from cache while the ranks' buffers fit, from memory past the knee.\n\
         # Fitted by Huber-weighted least squares on relative errors; error = (model - measured) / measured.\n",
    );
    if !table {
        out.push_str("# Per series a summary; --table adds each size's times, error and regime.\n");
    }
    let mut fitted = 0;
    for s in series(&rows) {
        if let Some(c) = s.rows[0].collective().filter(|&c| !paths::modelled(c)) {
            let _ = write!(
                out,
                "\n{}: skipped, not modelled: the model has no step structure for {}\n",
                s.label,
                c.name()
            );
            continue;
        }
        let Some(fit) = fit_rows(&s.rows) else {
            continue;
        };
        out.push('\n');
        out.push_str(&series_text(
            &s.label,
            &fit,
            &s.rows,
            &here,
            machine.as_ref(),
            table,
        ));
        fitted += 1;
    }
    if fitted == 0 {
        return Err(BenchError::NothingToFit);
    }
    Ok(out)
}

/// One series described; this machine's caches and copy speed only for rows measured here.
fn series_text(
    label: &str,
    fit: &Fit,
    rows: &[record::Row],
    here: &str,
    machine: Option<&Machine>,
    table: bool,
) -> String {
    let same_host = rows.iter().all(|r| r.host == here);
    let mut out = describe(label, fit, machine.filter(|_| same_host), table);
    if let Some(nodes) = Some(rows[0].nodes).filter(|&n| n > 1) {
        // Across nodes the large sizes' rate is the slowest link's: the network's, far below a
        // memory copy (a cluster in a box's shaped veth, Leonardo's InfiniBand).
        if let Some(b) = link_gbps(fit) {
            let _ = writeln!(
                out,
                "  Between the {nodes} nodes the largest sizes move at {b:.3} GB/s = {:.2} Gbit/s: \
                 the slowest link on the path (a network link's line rate, less its headers).",
                b * 8.0
            );
        }
    }
    if !same_host {
        let _ = writeln!(
            out,
            "  (measured on {}, not here: this machine's caches say nothing of it)",
            rows[0].host
        );
    }
    out
}

/// The rate at which the path's bytes cross between the two largest sizes of a fit: the extra
/// bytes over the extra time, so the steps' fixed costs cancel. Across nodes, the link's rate.
fn link_gbps(fit: &Fit) -> Option<f64> {
    let [.., small, large] = fit.points.as_slice() else {
        return None;
    };
    let (bytes, us) = (
        large.path.bytes - small.path.bytes,
        large.time_us - small.time_us,
    );
    (bytes > 0.0 && us > 0.0).then(|| bytes / us / 1e3)
}
