//! 07 — tensor parallel × data parallel: the model split over one group, the batch over another.
//!
//!     cargo run --release --example 07-tensor-parallel -- -n 4 --tp 2
//!
//! The ranks form a dp × tp mesh (torch's init_device_mesh): each tensor-parallel group of `--tp`
//! consecutive ranks holds one copy of the model with its MLP split Megatron's way (w1 by columns,
//! w2 by rows: one all-reduce in forward, one in backward); the ranks at the same place in every
//! tp group form a data-parallel group, each reading its share of the batch, DDP over it.

use clap::Parser;
use comm_core::{launch, Collective, LaunchArgs, Mesh, Named, Order};
use training::tensor_parallel::{shard_lengths, Trainer};
use training::tp_picture::{save, Split};
use training::TrainArgs;

#[derive(Parser)]
#[command(about = "Train the byte-level model tensor-parallel within groups, data-parallel across")]
struct Args {
    #[command(flatten)]
    launch: LaunchArgs,
    #[command(flatten)]
    train: TrainArgs,
    /// Ranks in each tensor-parallel group (consecutive ranks: within a node); the job's ranks
    /// must be a multiple of it, and --hidden too.
    #[arg(long, default_value_t = 2)]
    tp: usize,
    /// The mesh's dimensions, outermost first (init_device_mesh's mesh_dim_names): dp,tp puts
    /// each tensor-parallel group on consecutive ranks; tp,dp puts it across them (across nodes).
    #[arg(long, default_value = "dp,tp", value_parser = ["dp,tp", "tp,dp"])]
    mesh: String,
    /// Draw the split (layers, collectives, bytes) of this run on N ranks into FILE.svg, and exit.
    #[arg(long, value_name = "FILE")]
    draw: Option<std::path::PathBuf>,
}

// ANCHOR: main
fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let config = match args.train.config() {
        Ok(c) => shard_lengths(&c.shape, args.tp).map(|_| c),
        Err(e) => Err(e),
    };
    let Ok(config) = config.inspect_err(|e| eprintln!("error: {e}")) else {
        return std::process::ExitCode::from(2); // refused before any rank starts
    };
    if let Some(file) = &args.draw {
        let n = args.launch.nproc_per_node.unwrap_or(4);
        let split = Split {
            shape: config.shape,
            batch: config.batch,
            tp: args.tp,
            dp: n / args.tp,
        };
        let saved = save(file, &split).inspect_err(|e| eprintln!("error: {e}"));
        return launch::exit_code(saved.map_or(1, |_| 0));
    }
    let runs = [Collective::Broadcast, Collective::AllReduce];
    launch::run_job(&args.launch, &runs, None, |job| {
        let comm = launch::announced(job.communicator(args.launch.backend)?);
        let (rank, n, tp) = (comm.rank(), comm.world_size(), args.tp);
        let order = Order::from_name(&args.mesh).unwrap_or_default();
        let mesh = Mesh::ordered(&comm, n / tp, tp, order)?; // dp,tp: tp groups within a node
        let mut trainer = Trainer::new(mesh, &config)?; // my shard; DDP over my dp group
        if rank == 0 {
            println!("{}", trainer.describe(n / tp, tp, order));
        }
        let ((i, j), names) = trainer.place();
        let names = (names.0.to_string(), names.1.to_string());
        for step in 0..config.iters {
            let s = trainer.step(step)?; // 2 tp all-reduces inside; buckets over dp
            if rank == 0 && args.train.logs(step) {
                let moved = s.traffic((&names.0, &names.1));
                println!("step {step:>4}  loss {:.4}  ({moved})", s.loss);
            }
        }
        let (r, a_step, groups) = trainer.finish()?;
        println!(
            "Rank {rank} (dp rank {i}, tp rank {j}): weights {:08x}, step {:.2} ms; a step: {}",
            r.checksum,
            r.step.as_secs_f64() * 1e3,
            a_step.traffic((&names.0, &names.1))
        );
        groups.into_iter().try_for_each(|g| g.close())?;
        comm.close()
    })
}
// ANCHOR_END: main
