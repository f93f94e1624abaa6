//! The lesson's ring (`comm_core::ring_lesson`, shown in the 02 chapter) sums what the CPU
//! backend's `all_reduce` sums, bit for bit, for several world sizes and lengths, lengths that
//! do not divide evenly and shorter than the world included.
//!
//! This test binary is its own distributed program: started with `LESSON_RANKS`, the test
//! function runs the job (which re-executes it once per rank) instead of checking.

use std::process::Command;

use comm_core::launch::run_settings;
use comm_core::ring_lesson::ring_all_reduce;
use comm_core::Settings;
use comm_core::{BackendChoice, CommError, ReduceOp};
use test_support::process::Plainly;

const TEST: &str = "the_lesson_ring_sums_as_all_reduce_does";

/// A rank's input: small whole numbers, so that float sums are exact in any order.
fn input(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((rank * 7 + i * 3) % 13) as f32).collect()
}

/// Lengths below, at and above the world size, and not multiples of it.
const LENS: [usize; 6] = [0, 1, 3, 10, 1000, 100_003];

fn as_job(ranks: usize) -> i32 {
    let settings = Settings {
        ranks: Some(ranks),
        backend: BackendChoice::Cpu,
        timeout: std::time::Duration::from_secs(60),
        ..Settings::default()
    };
    run_settings(&settings, |comm| {
        LENS.iter().try_for_each(|&len| {
            let mut lesson = input(comm.rank(), len);
            ring_all_reduce(comm, &mut lesson)?;
            let mut real = comm.buffer(&input(comm.rank(), len))?;
            comm.all_reduce(&mut real, ReduceOp::Sum)?;
            let real = comm.to_host(&real)?;
            let inputs: Vec<Vec<f32>> = (0..ranks).map(|r| input(r, len)).collect();
            let expected: Vec<f32> = (0..len)
                .map(|i| inputs.iter().map(|v| v[i]).sum())
                .collect();
            if lesson != real || lesson != expected {
                return Err(CommError::Usage(format!(
                    "rank {}: lesson {lesson:?}, all_reduce {real:?}, expected {expected:?}",
                    comm.rank()
                )));
            }
            Ok(())
        })
    })
}

#[test]
fn the_lesson_ring_sums_as_all_reduce_does() {
    if let Ok(ranks) = std::env::var("LESSON_RANKS") {
        std::process::exit(as_job(ranks.parse().unwrap()));
    }
    for ranks in [1, 2, 3, 4] {
        let output = Command::new(std::env::current_exe().unwrap())
            .args([TEST, "--exact", "--nocapture", "--test-threads", "1"])
            .env("LESSON_RANKS", ranks.to_string())
            .plainly()
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{ranks} ranks:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
