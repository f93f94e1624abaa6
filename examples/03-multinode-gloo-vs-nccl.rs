//! 03 — the course's multi-node lesson: the same 100 MB all-reduce two ways, CPU-mediated (what
//! PyTorch's Gloo backend does: host memory, TCP) and GPU-direct (NCCL: device memory, NVLink or
//! InfiniBand), and how far apart they are.
//!
//!     cargo run --release --example 03-multinode-gloo-vs-nccl            # ranks on this machine
//!     # the course's way, one rank per host, started by hand on each (its spellings work too):
//!     ./03-multinode-gloo-vs-nccl --world_size 2 --rank 0 --master_addr 10.0.0.1 --master_port 29502
//!     ./03-multinode-gloo-vs-nccl --world_size 2 --rank 1 --master_addr 10.0.0.1 --master_port 29502
//!
//! `--backend auto` (the default) times both paths, NCCL where every rank can run it (the job
//! agrees through the store: one rank without NCCL takes all of them off it, and rank 0 says
//! which rank and why); `--backend cpu` the CPU path alone, `--backend nccl` NCCL alone. It also
//! runs under srun and commrun. Each measurement warms up first, then times several all-reduces;
//! an iteration's time is the slowest rank's (comm_core::timing).

use clap::Parser;
use comm_core::launch::announced;
use comm_core::timing::{busbw, time_iterations};
use comm_core::{BackendChoice, Collective, Communicator, LaunchArgs, ReduceOp};
use comm_core::{Result, Topology};

#[derive(Parser)]
#[command(
    about = "Time a 100 MB all-reduce the Gloo way (through the CPU) and on NCCL, and compare"
)]
struct Args {
    #[command(flatten)]
    launch: LaunchArgs,
    /// Megabytes (10^6 bytes) of f32 per all-reduce.
    #[arg(long, default_value_t = 100)]
    size_mb: usize,
    /// Timed iterations (after the warm-up).
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// Untimed iterations first.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Start this process as one rank by hand (the course's flags): the number of ranks...
    #[arg(long, visible_alias = "world_size", requires = "rank")]
    world_size: Option<usize>,
    /// ...and this one's. By hand, rank 0 serves the store at --master-addr (127.0.0.1 unless
    /// given) and --master-port (the course's 29502 unless given).
    #[arg(long, requires = "world_size")]
    rank: Option<usize>,
}

/// One half's median seconds, and the bytes each all-reduce of it reduced.
struct Timed {
    median: f64,
    bytes: usize,
}

/// Rank 0 prints the course's line for one half.
fn report(label: &str, comm: &Communicator, args: &Args, median: f64, bytes: usize) -> Timed {
    if comm.rank() == 0 {
        println!(
            "Rank 0 ({label}): all-reduce {} MB took {:.2} ms (median of {}, busbw {:.2} GB/s)",
            args.size_mb,
            median * 1e3,
            args.iters,
            busbw(Collective::AllReduce, comm.world_size(), bytes, median)
        );
    }
    Timed { median, bytes }
}

// ANCHOR: gloo
/// The Gloo half: the CPU communicator reduces host memory over TCP. On GPUs (`gpu`, the NCCL
/// communicator) the data lives on the device, as a CUDA tensor does, and every timed iteration
/// stages it through the host as Gloo does: device→host copy, CPU all-reduce, host→device copy,
/// through a host buffer allocated once, outside the timed loop (PyTorch's Gloo keeps its
/// staging copies too, in page-locked memory; ours is pageable, which copies more slowly).
fn gloo(cpu: &Communicator, gpu: Option<&Communicator>, args: &Args) -> Result<Timed> {
    let values = vec![1.0f32; args.size_mb * 250_000];
    let mut host = cpu.buffer(&values)?;
    let timing = match gpu {
        Some(gpu) => {
            let mut data = gpu.buffer(&values)?;
            time_iterations(cpu, args.warmup, args.iters, || {
                gpu.copy_to_host(&data, &mut host)?; // device → host
                cpu.all_reduce(&mut host, ReduceOp::Sum)?; // CPU cores, TCP
                gpu.copy_from_host(&host, &mut data) // host → device
            })?
        }
        // No GPU (or --backend cpu): the data is in host memory already, as CPU tensors are.
        None => time_iterations(cpu, args.warmup, args.iters, || {
            cpu.all_reduce(&mut host, ReduceOp::Sum)
        })?,
    };
    // The line says what ran: our CPU path, Gloo's way, over this transport; not Gloo itself.
    let label = match cpu.transport() {
        Some(t) if t != "none" => format!("CPU, Gloo-style over {t}"),
        _ => "CPU, Gloo-style".to_string(),
    };
    Ok(report(&label, cpu, args, timing.median(), host.len() * 4))
}
// ANCHOR_END: gloo

/// The NCCL half: the data stays in device memory; NCCL's kernels reduce it there.
fn nccl(gpu: &Communicator, args: &Args) -> Result<Timed> {
    let mut data = gpu.buffer(&vec![1.0f32; args.size_mb * 250_000])?;
    let timing = time_iterations(gpu, args.warmup, args.iters, || {
        gpu.all_reduce(&mut data, ReduceOp::Sum)
    })?;
    Ok(report("NCCL", gpu, args, timing.median(), data.len() * 4))
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let by_hand = match (args.rank, args.world_size) {
        (Some(rank), Some(world)) => {
            let addr = args
                .launch
                .job
                .master_addr
                .as_deref()
                .unwrap_or("127.0.0.1");
            let port = args.launch.job.master_port.unwrap_or(29502);
            match Topology::by_hand(rank, world, addr, port) {
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
    // One job, two communicators over the same ranks and store (built in the same order on every
    // rank): the CPU one unless --backend nccl, then NCCL unless --backend cpu.
    comm_core::launch::run_job(&args.launch, &[Collective::AllReduce], by_hand, |job| {
        let choice = args.launch.backend;
        let cpu = match choice {
            BackendChoice::Nccl => None,
            _ => Some(announced(job.communicator(BackendChoice::Cpu)?)),
        };
        let (gpu, skipped) = match choice {
            BackendChoice::Cpu => (None, None),
            BackendChoice::Nccl => (Some(job.communicator(BackendChoice::Nccl)?), None),
            // auto: NCCL if every rank can run it, else the reason (naming the rank that
            // cannot): the job's choice, agreed through the store, never a rank's alone.
            BackendChoice::Auto => match job.agreed_communicator(BackendChoice::Nccl)? {
                Ok(gpu) => (Some(gpu), None),
                Err(why) => (None, Some(why)),
            },
        };
        let gloo_time = cpu.as_ref().map(|cpu| gloo(cpu, gpu.as_ref(), &args));
        let gloo_time = gloo_time.transpose()?;
        let nccl_time = gpu.as_ref().map(|gpu| nccl(gpu, &args)).transpose()?;
        if job.topology().rank == 0 {
            match (gloo_time, nccl_time, skipped) {
                // A ratio only of like with like: the same bytes reduced by both halves.
                (Some(g), Some(n), _) if g.bytes == n.bytes => {
                    println!(
                        "NCCL was {:.1}x faster than the CPU path",
                        g.median / n.median
                    )
                }
                (_, _, Some(why)) => println!("Rank 0 (NCCL): skipped: {why}"),
                _ => {}
            }
        }
        // Every rank is done with both: NCCL's clean end (a barrier, then finalize and
        // destroy), in the same order on every rank, so that no rank tears its communicator
        // down while a peer still runs the last all-reduce.
        if let Some(gpu) = gpu {
            gpu.close()?;
        }
        if let Some(cpu) = cpu {
            cpu.close()?;
        }
        Ok(())
    })
    // ANCHOR_END: job
}
