//! `comm-bench`: see `comm-bench --help` and docs/src/benchmarking.md.

use std::process::ExitCode;

use clap::Parser;
use comm_bench::cli::{Cli, Command};

fn main() -> ExitCode {
    // First thing: link pip's libnccl.so.2 and restart if needed, before any socket or rank
    // (a failure becomes the NCCL backend's reason, as in comm_core::launch).
    let _ = comm_core::backend::prepare();
    // `comm-bench … | head` ends quietly, as Unix tools do, instead of panicking in a print.
    comm_core::launch::end_on_closed_output();
    let cli = Cli::parse();
    let code = match &cli.command {
        Some(Command::Report(args)) => match comm_bench::report::report(&args.files, &args.out) {
            Ok(report) => {
                for file in &report.files {
                    println!("wrote {}", file.display());
                }
                if !report.observations.is_empty() {
                    println!("\nObservations:");
                    for o in &report.observations {
                        println!("- {o}");
                    }
                }
                0
            }
            Err(e) => {
                eprintln!("comm-bench report: error: {e}");
                1
            }
        },
        Some(Command::Grids(args)) => match comm_bench::grids::draw(&args.output, &args.out) {
            Ok(count) => {
                println!("wrote {} ({count} grids)", args.out.display());
                0
            }
            Err(e) => {
                eprintln!("comm-bench grids: error: {e}");
                1
            }
        },
        Some(Command::Timeline(args)) => match comm_bench::timeline::draw(&args.trace, &args.out) {
            Ok(count) => {
                println!("wrote {} ({count} slices)", args.out.display());
                0
            }
            Err(e) => {
                eprintln!("comm-bench timeline: error: {e}");
                1
            }
        },
        Some(Command::Model(args)) => {
            match comm_bench::model::command::run(&args.files, args.table) {
                Ok(text) => {
                    print!("{text}");
                    0
                }
                Err(e) => {
                    eprintln!("comm-bench model: error: {e}");
                    1
                }
            }
        }
        Some(Command::Predict(args)) => match comm_bench::predict::run(args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("comm-bench predict: error: {e}");
                1
            }
        },
        Some(Command::StoreLoad(args)) => match comm_bench::store_load::run(args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("comm-bench store-load: error: {e}");
                1
            }
        },
        None => comm_bench::driver::run(&cli.bench),
    };
    ExitCode::from(code.clamp(0, 255) as u8)
}
