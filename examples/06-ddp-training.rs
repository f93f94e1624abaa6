//! 06 — data-parallel training: why all-reduce exists. Seed 003's job, DDP's way.
//!
//!     cargo run --release --example 06-ddp-training            # 4 ranks on the CPU
//!     cargo run --release --example 06-ddp-training -- -n 2 --no-overlap --trace t.json
//!
//! Every rank holds the same small byte-level language model (rank 0's weights, broadcast), reads
//! its own quarter of every batch of the course's text, and computes gradients on it. Summed by
//! all-reduce and divided by the world size, they are the mean over the whole batch: every rank
//! takes the same step and the weights stay equal. As DDP does, the gradients travel in buckets,
//! last layer first, each all-reduced as soon as backward has filled it while backward goes on.

use clap::Parser;
use comm_core::{launch, Collective, LaunchArgs};
use training::{Ddp, TrainArgs};

#[derive(Parser)]
#[command(about = "Train a byte-level language model data-parallel, with bucketed all-reduce")]
struct Args {
    #[command(flatten)]
    launch: LaunchArgs,
    #[command(flatten)]
    train: TrainArgs,
}

// ANCHOR: main
fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runs = [Collective::Broadcast, Collective::AllReduce];
    let config = match args.train.config() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2); // refused before any rank starts
        }
    };
    launch::run_job(&args.launch, &runs, None, |job| {
        let comm = launch::announced(job.communicator(args.launch.backend)?);
        let rank = comm.rank();
        let mut ddp = Ddp::new(comm, &config)?; // rank 0's weights everywhere
        if rank == 0 {
            println!("{}", ddp.describe());
        }
        for step in 0..config.iters {
            let loss = ddp.step(step)?; // forward, backward + bucket all-reduces, SGD
            if rank == 0 && args.train.logs(step) {
                println!("step {step:>4}  loss {loss:.4}");
            }
        }
        let (comm, r) = ddp.finish()?;
        let wait = r.waited.as_secs_f64() / r.step.as_secs_f64();
        println!(
            "Rank {rank}: weights {:08x}, {:.1} tokens/s, step {:.2} ms, waiting for communication {:.1}%",
            r.checksum,
            r.tokens_per_s,
            r.step.as_secs_f64() * 1e3,
            100.0 * wait
        );
        comm.close()
    })
}
// ANCHOR_END: main
