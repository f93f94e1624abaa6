//! 05 — reduce-scatter: the sum over all ranks, cut in blocks; block r lands on rank r.
//!
//!     cargo run --example 05-reduce-scatter          # 4 ranks on the CPU, or one per GPU
//!     cargo run --example 05-reduce-scatter -- -n 3 --steps
//!
//! Every rank holds the same n blocks of `--len` elements, 1, 2, 3, ... After a sum
//! reduce-scatter rank r holds block r of the sum: n times its values. This is the first half of
//! a ring all-reduce, and how sharded optimizers (ZeRO, FSDP) get each rank's part of the
//! gradients. The CPU backend runs the ring: in n-1 steps each block collects every rank's
//! contribution (`--steps` shows the partial sums grow); NCCL does the same on the GPUs.

use clap::Parser;
use comm_core::{Collective, LaunchArgs, ReduceOp};

#[derive(Parser)]
#[command(about = "Sum every rank's buffer and scatter its blocks with reduce_scatter")]
struct Args {
    #[command(flatten)]
    launch: LaunchArgs,
    /// Elements in each rank's block of the result.
    #[arg(long, default_value_t = 2)]
    len: usize,
}

// ANCHOR: main
fn main() -> std::process::ExitCode {
    let args = Args::parse();
    // Start the ranks (or be one), with the flags' settings; the one collective named here
    // is what --algo may choose an algorithm for.
    comm_core::run(&args.launch, &[Collective::ReduceScatter], |comm| {
        println!("Rank {} using device: {}", comm.rank(), comm.device());

        // n blocks on every rank: 1, 2, 3, ... so each block is told apart.
        let values: Vec<f32> = (1..=args.len * comm.world_size())
            .map(|v| v as f32)
            .collect();
        let all = comm.buffer(&values)?;
        let mut mine = comm.zeros::<f32>(args.len)?;
        comm.print_grid("Before reduce-scatter:", &all)?;

        // Out of place, as PyTorch's reduce_scatter_tensor: this rank's block of the sum.
        comm.reduce_scatter_into(&all, &mut mine, ReduceOp::Sum)?;
        comm.print_grid("After reduce-scatter (block r on rank r):", &mine)?;
        Ok(())
    })
}
// ANCHOR_END: main
