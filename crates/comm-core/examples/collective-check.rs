//! Every collective of comm-core's table, in place and out of place, every dtype and reduction,
//! checked against a sequential reference on whichever backend runs: the GPU check script runs
//! it on NCCL.
//!
//!     cargo run -p comm-core --example collective-check -- --backend cpu -n 3
//!
//! Prints one line per check (wrong elements summed over ranks) and exits non-zero on any.

use clap::Parser;
use comm_core::check::{all_collectives, Verdict};
use comm_core::{Collective, CommError, Communicator, LaunchArgs, ReduceOp};

#[derive(Parser)]
#[command(about = "Check every collective against a sequential reference")]
struct Args {
    #[command(flatten)]
    launch: LaunchArgs,
    /// Elements per rank (per block for all_gather and reduce_scatter), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [0, 1, 1001, 1 << 20])]
    lens: Vec<usize>,
}

fn checks(comm: &Communicator, len: usize) -> comm_core::Result<Vec<Verdict>> {
    let mut all = all_collectives::<f32>(comm, len, 1)?;
    all.extend(all_collectives::<f64>(comm, len, 2)?);
    all.extend(all_collectives::<i32>(comm, len, 3)?);
    all.extend(all_collectives::<i64>(comm, len, 4)?);
    Ok(all)
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    // Every collective of the table runs: --algo applies to those that have it.
    comm_core::run(&args.launch, &Collective::ALL, |comm| {
        let (mut passed, mut failed) = (0, 0);
        if comm.rank() == 0 {
            println!("{:<44} {:>9} {:>7}  result", "check", "len", "#wrong");
        }
        for &len in &args.lens {
            let mine = checks(comm, len)?;
            for verdict in &mine {
                if let Some(first) = &verdict.first {
                    eprintln!(
                        "rank {}: {} (len {len}): {first}",
                        comm.rank(),
                        verdict.name
                    );
                }
            }
            // #wrong is the sum over ranks, as in nccl-tests.
            let wrong: Vec<i64> = mine.iter().map(|v| v.wrong as i64).collect();
            let mut totals = comm.buffer(&wrong)?;
            comm.all_reduce(&mut totals, ReduceOp::Sum)?;
            let totals = comm.to_host(&totals)?;
            if comm.rank() != 0 {
                continue;
            }
            for (verdict, total) in mine.iter().zip(totals) {
                let result = if total == 0 { "PASS" } else { "FAIL" };
                println!("{:<44} {len:>9} {total:>7}  {result}", verdict.name);
                if total == 0 {
                    passed += 1
                } else {
                    failed += 1
                }
            }
        }
        if comm.rank() == 0 {
            println!(
                "checks: {passed} passed, {failed} failed on {} ranks ({})",
                comm.world_size(),
                comm.backend()
            );
            if failed > 0 {
                return Err(CommError::Peer(format!(
                    "{failed} collective checks failed"
                )));
            }
        }
        Ok(())
    })
}
