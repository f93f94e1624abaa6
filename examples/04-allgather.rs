//! 04 — all-gather: every rank ends with every rank's block, in rank order.
//!
//!     cargo run --example 04-allgather               # 4 ranks on the CPU, or one per GPU
//!     cargo run --example 04-allgather -- -n 3 --steps
//!
//! Each rank fills a block of `--len` elements with its rank number + 1; after all-gather every
//! rank holds rank 0's block, then rank 1's, and so on. This is how sharded weights are put back
//! together before a layer runs (FSDP, tensor parallelism). The CPU backend runs a ring: in n-1
//! steps every block goes once around it (`--steps` shows each); NCCL does the same on the GPUs.

use clap::Parser;
use comm_core::{Collective, LaunchArgs};

#[derive(Parser)]
#[command(about = "Gather every rank's block on every rank with all_gather and show the grids")]
struct Args {
    #[command(flatten)]
    launch: LaunchArgs,
    /// Elements in each rank's block.
    #[arg(long, default_value_t = 2)]
    len: usize,
}

// ANCHOR: main
fn main() -> std::process::ExitCode {
    let args = Args::parse();
    // Start the ranks (or be one), with the flags' settings; the one collective named here
    // is what --algo may choose an algorithm for.
    comm_core::run(&args.launch, &[Collective::AllGather], |comm| {
        println!("Rank {} using device: {}", comm.rank(), comm.device());

        // This rank's block, and room for everyone's.
        let mine = comm.filled(comm.rank() as f32 + 1.0, args.len)?;
        let mut all = comm.zeros::<f32>(args.len * comm.world_size())?;
        comm.print_grid("Before all-gather (each rank's block):", &mine)?;

        // Out of place, as PyTorch's all_gather_into_tensor: blocks land in rank order.
        comm.all_gather_into(&mine, &mut all)?;
        comm.print_grid("After all-gather:", &all)?;
        Ok(())
    })
}
// ANCHOR_END: main
