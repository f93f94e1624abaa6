//! commrun: torchrun's job for any program. It starts `--nproc-per-node` workers on this node,
//! each with the variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
//! GROUP_RANK, MASTER_ADDR, MASTER_PORT), relays their output line by line, and when one fails
//! stops the others and says why. Run it once per node; under srun it reads the node layout from
//! Slurm's variables.
//!
//! The launching itself is comm-core's [`comm_core::spawn`], the same code an example uses when
//! it starts its own ranks: commrun adds the command line, the checks, restarts
//! (`--max-restarts`), log files (`--log-dir`, `--redirects`, `--tee`, `--local-ranks-filter`),
//! the root-cause summary, and, on every node but node 0, its presence at the store while the
//! workers start (`presence.rs`, torchrun's agent heartbeat).

mod cli;
mod error;
mod logs;
mod plan;
mod presence;
mod restart;
mod summary;

use std::process::ExitCode;

use clap::Parser;
use comm_core::spawn::Outcome;

fn main() -> ExitCode {
    // `commrun … | head` ends quietly, as Unix tools do (its workers die with it: PDEATHSIG),
    // instead of panicking while relaying a line.
    comm_core::launch::end_on_closed_output();
    let cli = cli::Cli::parse();
    let code = match launch(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("commrun: error: {e}");
            2
        }
    };
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// Plans the run, refusing what cannot work, then starts the workers (again, on failure, while
/// --max-restarts allows). Returns the exit code; an error is commrun's own, exit code 2.
fn launch(cli: &cli::Cli) -> Result<i32, error::LaunchError> {
    let machine = plan::Machine::probe()?;
    let resolved = plan::resolve(cli, &machine)?;
    let plan = &resolved.plan;
    if plan.node_rank == 0 {
        plan::check_port_free(plan.master_port)?;
    }
    let host = comm_core::host::hostname();
    if resolved.from_slurm {
        eprintln!(
            "commrun: node {} of {} on {host} (from srun's SLURM_* variables): ranks {}-{} of {}, \
             rendezvous at {}:{}",
            plan.node_rank,
            plan.nnodes,
            plan.node_rank * plan.nproc_per_node,
            (plan.node_rank + 1) * plan.nproc_per_node - 1,
            resolved.world_size(),
            plan.master_addr,
            plan.master_port
        );
    }
    // torchrun's habit, for the same reason: N workers each starting one OpenMP thread per core
    // would oversubscribe the node. Set before any thread exists; the workers inherit it.
    if plan.nproc_per_node > 1 && std::env::var_os("OMP_NUM_THREADS").is_none() {
        std::env::set_var("OMP_NUM_THREADS", "1");
    }
    let logs = logs::RunLogs::create(
        &resolved.output,
        plan.nproc_per_node,
        plan.run_id.as_deref(),
    )?;
    // Until this node's workers have joined, commrun holds the node's place at the store.
    let presence = presence::start(plan);
    let stop = presence.as_ref().map(|p| &p.reasons);
    match restart::run(plan, resolved.max_restarts, &logs, stop)? {
        Outcome::Success => Ok(0),
        Outcome::Failed(failure) => {
            eprintln!("{}", summary::root_cause(&failure, plan, &host));
            Ok(failure.exit_code())
        }
        outcome @ Outcome::Stopped(_) => {
            if let Outcome::Stopped(reason) = &outcome {
                eprintln!(
                    "commrun: error: {reason}; stopped this node's workers (SIGTERM, then \
                     SIGKILL after {:?})",
                    plan.grace
                );
            }
            Ok(outcome.exit_code())
        }
        outcome @ Outcome::Interrupted(sig) => {
            eprintln!(
                "commrun: interrupted by signal {sig}: passed it on to the workers of this node \
                 and stopped them"
            );
            Ok(outcome.exit_code())
        }
    }
}
