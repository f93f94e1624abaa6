//! 03 — the same 100 MB all-reduce two ways: CPU-mediated (the Gloo way: host memory, TCP) and
//! GPU-direct (NCCL: device memory, NVLink or InfiniBand), and how far apart they are.
//!
//!     cargo run --release --example 03-multinode-gloo-vs-nccl            # ranks on this machine
//!     # the course's way, one rank per host, started by hand on each:
//!     ./03-multinode-gloo-vs-nccl --world-size 2 --rank 0 --master-addr 10.0.0.1 --master-port 29502
//!     ./03-multinode-gloo-vs-nccl --world-size 2 --rank 1 --master-addr 10.0.0.1 --master-port 29502
//!
//! It also runs under srun and commrun. Each measurement warms up first, then times several
//! all-reduces; an iteration's time is the slowest rank's (comm_core::timing).

use clap::Parser;
use comm_core::timing::{busbw, time_iterations};
use comm_core::{BackendChoice, Collective, Communicator, LaunchArgs, ReduceOp, Topology};

#[derive(Parser)]
#[command(about = "Time a 100 MB all-reduce on the CPU backend and on NCCL, and compare")]
struct Args {
    /// Ranks to start on this machine when nobody else started them.
    #[arg(short = 'n', long, value_name = "N")]
    nproc_per_node: Option<usize>,
    /// Seconds any wait may take before the job fails.
    #[arg(long, default_value_t = 300.0)]
    timeout: f64,
    /// Megabytes (10^6 bytes) of f32 per all-reduce.
    #[arg(long, default_value_t = 100)]
    size_mb: usize,
    /// Timed iterations (after the warm-up).
    #[arg(long, default_value_t = 10)]
    iters: usize,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Start this process as one rank by hand (the course's flags): the number of ranks...
    #[arg(long, requires = "rank")]
    world_size: Option<usize>,
    /// ...and this one's.
    #[arg(long, requires = "world_size")]
    rank: Option<usize>,
    #[arg(long, default_value = "127.0.0.1")]
    master_addr: String,
    #[arg(long, default_value_t = 29502)]
    master_port: u16,
}

// ANCHOR: measure
/// Times the all-reduce on `comm`; rank 0 prints the course's line. Returns the median seconds.
fn measure(comm: &Communicator, args: &Args) -> comm_core::Result<f64> {
    let bytes = args.size_mb * 1_000_000;
    let mut buf = comm.buffer(&vec![1.0f32; bytes / 4])?;
    let timing = time_iterations(comm, args.warmup, args.iters, || {
        comm.all_reduce(&mut buf, ReduceOp::Sum)
    })?;
    let median = timing.median();
    if comm.rank() == 0 {
        println!(
            "Rank 0 ({}): all-reduce {} MB took {:.2} ms (median of {}, busbw {:.2} GB/s)",
            comm.backend(),
            args.size_mb,
            median * 1e3,
            args.iters,
            busbw(Collective::AllReduce, comm.world_size(), bytes, median)
        );
    }
    Ok(median)
}
// ANCHOR_END: measure

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let launch = LaunchArgs {
        nproc_per_node: args.nproc_per_node,
        backend: BackendChoice::Cpu,
        timeout: args.timeout,
    };
    let by_hand = match (args.rank, args.world_size) {
        (Some(rank), Some(world)) => {
            match Topology::by_hand(rank, world, &args.master_addr, args.master_port) {
                Ok(t) => Some(t),
                Err(e) => {
                    eprintln!("error: {e}");
                    return std::process::ExitCode::from(2);
                }
            }
        }
        _ => None,
    };
    // ANCHOR: job
    // One job, two communicators over the same ranks and store: the CPU one first (it works
    // everywhere), then NCCL where this machine can run it.
    let code = comm_core::launch::run_job(&launch, by_hand, |job| {
        let cpu = job.communicator(BackendChoice::Cpu)?;
        let cpu_time = measure(&cpu, &args)?;
        match job.communicator(BackendChoice::Nccl) {
            Ok(gpu) => {
                let gpu_time = measure(&gpu, &args)?;
                if job.topology().rank == 0 {
                    println!(
                        "NCCL was {:.1}x faster than the CPU path",
                        cpu_time / gpu_time
                    );
                }
            }
            Err(why) if job.topology().rank == 0 => println!("Rank 0 (nccl): skipped: {why}"),
            Err(_) => {}
        }
        Ok(())
    });
    // ANCHOR_END: job
    std::process::ExitCode::from(code.clamp(0, 255) as u8)
}
