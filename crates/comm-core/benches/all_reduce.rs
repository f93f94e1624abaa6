//! All-reduce over the TCP transport between processes on this machine: median time and bus
//! bandwidth (nccl-tests' busbw = bytes / time × 2(n-1)/n), per size.
//!
//!     cargo bench -p comm-core --bench all_reduce            # 2 ranks
//!     NPROC=4 cargo bench -p comm-core --bench all_reduce
//!
//! Each iteration starts after a barrier; its time is the slowest rank's.

use std::time::Instant;

use comm_core::launch::{run_to_code, LaunchArgs};
use comm_core::{BackendChoice, ReduceOp};

const SIZES: [usize; 3] = [1 << 20, 10 << 20, 100 << 20];
const WARMUP: usize = 3;
const ITERS: usize = 10;

fn main() {
    let nproc = std::env::var("NPROC")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);
    let args = LaunchArgs {
        nproc_per_node: Some(nproc),
        backend: BackendChoice::Cpu,
        timeout: 120.0,
    };
    let code = run_to_code(&args, |comm| {
        let n = comm.world_size();
        if comm.rank() == 0 {
            println!(
                "{:>12} {:>12} {:>12} {:>12}",
                "bytes", "median ms", "min ms", "busbw GB/s"
            );
        }
        for bytes in SIZES {
            let mut buf = comm.buffer(&vec![1.0f32; bytes / 4])?;
            let mut times = Vec::new();
            for i in 0..WARMUP + ITERS {
                comm.barrier()?;
                let start = Instant::now();
                comm.all_reduce(&mut buf, ReduceOp::Sum)?;
                let mut slowest = comm.buffer(&[start.elapsed().as_secs_f64()])?;
                comm.all_reduce(&mut slowest, ReduceOp::Max)?;
                if i >= WARMUP {
                    times.push(comm.to_host(&slowest)?[0]);
                }
            }
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            let busbw = bytes as f64 / median / 1e9 * 2.0 * (n - 1) as f64 / n as f64;
            if comm.rank() == 0 {
                println!(
                    "{bytes:>12} {:>12.2} {:>12.2} {busbw:>12.2}",
                    median * 1e3,
                    times[0] * 1e3
                );
            }
        }
        Ok(())
    });
    std::process::exit(code)
}
