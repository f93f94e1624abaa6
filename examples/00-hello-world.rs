//! 00 — hello world: start several ranks and build a communicator.
//!
//!     cargo run --example 00-hello-world            # 4 ranks on the CPU, or one per GPU
//!     cargo run --example 00-hello-world -- -n 2
//!
//! What happens, step by step:
//! 1. Spawn: started plainly, the program re-executes itself once per rank with torchrun's
//!    variables set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Under srun,
//!    torchrun or commrun it is already one rank and skips this step.
//! 2. Rendezvous: rank 0 serves a small key-value store at MASTER_ADDR:MASTER_PORT (under
//!    torchrun, torchrun's agent on node 0 does); every rank connects to it, and that is how the
//!    ranks find each other.
//! 3. Communicator: the ranks exchange what their backend needs through the store (NCCL: rank
//!    0's unique Id; CPU: every rank's address) and connect.
//! 4. Device: one rank per GPU, `cuda:{local_rank % gpus}`; on the CPU backend, `cpu:{rank}`.

use clap::Parser;
use comm_core::LaunchArgs;

#[derive(Parser)]
#[command(about = "Every rank says hello: rank, world size, local rank, device and backend")]
struct Args {
    #[command(flatten)]
    launch: LaunchArgs,
}

// ANCHOR: main
fn main() -> std::process::ExitCode {
    let args = Args::parse();
    // Start the ranks (or be one), with the flags' settings; no collective runs here, so
    // --algo has nothing to choose for.
    comm_core::run(&args.launch, &[], |comm| {
        // `comm` is ready: the rendezvous is done and every rank is connected.
        println!(
            "Hello from rank {} of {} (local rank {}) on {} with the {} backend",
            comm.rank(),
            comm.world_size(),
            comm.local_rank(),
            comm.device(),
            comm.backend()
        );
        Ok(())
    })
}
// ANCHOR_END: main
