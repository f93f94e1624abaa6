//! torchrun's `--max-restarts`: when a worker fails, the whole worker group of this node is
//! stopped (spawn does that) and started again, up to N times. Each start's workers learn which
//! one they are from torchrun's variables. An interrupt (Ctrl-C, Slurm cancelling the job) never
//! restarts. On several nodes the commruns would have to agree to restart together, which they
//! cannot: resolve refuses `--max-restarts` there.

use comm_core::spawn::{self, Extras, Outcome, SpawnPlan};
use comm_core::topology::RESTART_COUNT_VAR;
use crossbeam_channel::Receiver;

use crate::error::LaunchError;
use crate::logs::RunLogs;

/// `--max-restarts`, as torchrun passes it to its workers.
pub const MAX_RESTARTS_VAR: &str = "TORCHELASTIC_MAX_RESTARTS";

/// Starts the worker group, and again after each failure while restarts are left. Returns how
/// the last start ended.
pub fn run(
    plan: &SpawnPlan,
    max_restarts: u32,
    logs: &RunLogs,
    stop: Option<&Receiver<String>>,
) -> Result<Outcome, LaunchError> {
    let mut attempt = 0;
    loop {
        let extras = Extras {
            env: vec![
                (RESTART_COUNT_VAR.into(), attempt.to_string()),
                (MAX_RESTARTS_VAR.into(), max_restarts.to_string()),
            ],
            outputs: logs.attempt(attempt)?,
            stop: stop.cloned(),
        };
        let outcome = spawn::run_with(plan, &extras)?;
        let Outcome::Failed(failure) = &outcome else {
            return Ok(outcome);
        };
        if max_restarts == 0 {
            return Ok(outcome);
        }
        if let Some(sig) = spawn::interrupted() {
            eprintln!("commrun: interrupted by signal {sig}: the worker group is not restarted");
            return Ok(outcome);
        }
        if attempt == max_restarts {
            eprintln!(
                "commrun: the worker group failed {} times, no restart left (--max-restarts \
                 {max_restarts})",
                attempt + 1
            );
            return Ok(outcome);
        }
        attempt += 1;
        eprintln!(
            "commrun: {}{}; restarting the worker group (attempt {} of {})",
            failure.describe(),
            failure.others(),
            attempt + 1,
            max_restarts + 1
        );
    }
}
