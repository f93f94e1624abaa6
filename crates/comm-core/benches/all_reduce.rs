//! All-reduce over the TCP transport between processes on this machine: median time and bus
//! bandwidth (nccl-tests' busbw = bytes / time × 2(n-1)/n), per size.
//!
//!     cargo bench -p comm-core --bench all_reduce            # 2 ranks
//!     NPROC=4 cargo bench -p comm-core --bench all_reduce
//!
//! Each iteration starts after a barrier; its time is the slowest rank's.

use comm_core::launch::run_settings;
use comm_core::timing::{busbw, time_iterations};
use comm_core::Collective;
use comm_core::Settings;
use comm_core::{BackendChoice, ReduceOp};

const SIZES: [usize; 3] = [1 << 20, 10 << 20, 100 << 20];
const WARMUP: usize = 3;
const ITERS: usize = 10;

fn main() {
    let nproc = std::env::var("NPROC")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);
    let settings = Settings {
        ranks: Some(nproc),
        backend: BackendChoice::Cpu,
        timeout: std::time::Duration::from_secs(120),
        ..Settings::default()
    };
    let code = run_settings(&settings, |comm| {
        let n = comm.world_size();
        if comm.rank() == 0 {
            println!(
                "{:>12} {:>12} {:>12} {:>12}",
                "bytes", "median ms", "min ms", "busbw GB/s"
            );
        }
        for bytes in SIZES {
            let mut buf = comm.buffer(&vec![1.0f32; bytes / 4])?;
            let timing = time_iterations(comm, WARMUP, ITERS, || {
                comm.all_reduce(&mut buf, ReduceOp::Sum)
            })?;
            let busbw = busbw(Collective::AllReduce, n, bytes, timing.median());
            if comm.rank() == 0 {
                println!(
                    "{bytes:>12} {:>12.2} {:>12.2} {busbw:>12.2}",
                    timing.median() * 1e3,
                    timing.min() * 1e3
                );
            }
        }
        Ok(())
    });
    std::process::exit(code)
}
