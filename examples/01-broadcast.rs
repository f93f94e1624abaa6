//! 01 — broadcast: rank 0's data is copied to every rank.
//!
//!     cargo run --example 01-broadcast               # 4 ranks on the CPU, or one per GPU
//!     cargo run --example 01-broadcast -- -n 2 --len 8
//!
//! Every rank allocates a buffer on its device; rank 0 (the root) fills it with 42, the others
//! with 0. After `broadcast(root = 0)` every rank holds 42s. On NCCL the data moves GPU to GPU
//! (NVLink, PCIe or InfiniBand); the CPU backend sends it along a tree or a pipelined chain.

use clap::Parser;
use comm_core::{Collective, LaunchArgs};

#[derive(Parser)]
#[command(about = "Broadcast rank 0's buffer to every rank and show the grids")]
struct Args {
    #[command(flatten)]
    launch: LaunchArgs,
    /// Elements per buffer.
    #[arg(long, default_value_t = 4)]
    len: usize,
}

// ANCHOR: main
fn main() -> std::process::ExitCode {
    let args = Args::parse();
    // Start the ranks (or be one), with the flags' settings; the one collective named here
    // is what --algo may choose an algorithm for.
    comm_core::run(&args.launch, &[Collective::Broadcast], |comm| {
        println!("Rank {} using device: {}", comm.rank(), comm.device());

        // The root holds the data; everyone else starts empty.
        let value = if comm.rank() == 0 { 42.0f32 } else { 0.0 };
        let mut buf = comm.filled(value, args.len)?;
        comm.print_grid("Before broadcast:", &buf)?;

        // Every rank calls the same collective with the same root and size.
        comm.broadcast(&mut buf, 0)?;
        comm.print_grid("After broadcast:", &buf)?;
        Ok(())
    })
}
// ANCHOR_END: main
