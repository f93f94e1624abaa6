//! 02 — all-reduce: every rank ends with the sum over all ranks.
//!
//!     cargo run --example 02-allreduce               # 4 ranks on the CPU, or one per GPU
//!     cargo run --example 02-allreduce -- -n 3
//!
//! Each rank fills its buffer with ones; after a sum all-reduce every cell holds the world size.
//! This is how data-parallel training averages gradients. For large buffers the CPU backend
//! runs the ring: a reduce-scatter (each rank ends owning the sum of one block), then an
//! all-gather (every block travels once around the ring); NCCL does the same on the GPUs.

use clap::Parser;
use comm_core::{Collective, LaunchArgs, ReduceOp};

#[derive(Parser)]
#[command(about = "Sum every rank's buffer with all_reduce and show the grids")]
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
    comm_core::run(&args.launch, &[Collective::AllReduce], |comm| {
        println!("Rank {} using device: {}", comm.rank(), comm.device());

        let mut buf = comm.filled(1.0f32, args.len)?;
        comm.print_grid("Before reduce:", &buf)?;

        // In place: the sum replaces each rank's ones.
        comm.all_reduce(&mut buf, ReduceOp::Sum)?;
        comm.print_grid("After reduce:", &buf)?;
        Ok(())
    })
}
// ANCHOR_END: main
