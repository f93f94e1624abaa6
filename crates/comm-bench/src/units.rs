//! Sizes as people write them (`-b 1M`, `--maxbytes 1GB`) and as tables show them.

use std::path::PathBuf;

use clap::Args;

use crate::error::BenchError;

/// Parses a byte count: a whole number with an optional suffix. As in nccl-tests, `K`, `M`, `G`
/// and `T` are powers of 1024 (`1M` = 1048576); `KB`, `MB`, `GB` and `TB` are powers of 1000, as
/// the course writes its sizes (`100MB` = 100000000); `KiB`, `MiB`, `GiB` and `TiB` are powers of
/// 1024 again. Letters are case-insensitive except for that `B`/`iB` distinction.
pub fn parse_bytes(text: &str) -> Result<u64, BenchError> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits);
    let bad = || BenchError::NotASize { text: text.into() };
    let value: u64 = number.parse().map_err(|_| bad())?;
    let (letter, unit) = suffix.split_at(suffix.len().min(1));
    let power = match letter.to_ascii_uppercase().as_str() {
        "" => 0,
        "K" => 1,
        "M" => 2,
        "G" => 3,
        "T" => 4,
        "B" if unit.is_empty() => 0,
        _ => return Err(bad()),
    };
    let base: u64 = match unit {
        "" | "iB" | "ib" | "IB" => 1024,
        "B" | "b" => 1000,
        _ => return Err(bad()),
    };
    value
        .checked_mul(base.pow(power))
        .ok_or_else(|| BenchError::SizeTooLarge { text: text.into() })
}

/// How sizes grow from `-b` to `-e`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// `-f`: multiply by this factor.
    Factor(u64),
    /// `-i`: add this many bytes.
    Bytes(u64),
}

/// The sizes of a sweep: `min`, then stepped, up to and including `max`.
pub fn sweep(min: u64, max: u64, step: Step) -> Result<Vec<u64>, BenchError> {
    if min == 0 {
        return Err(BenchError::ZeroMinBytes);
    }
    if min > max {
        return Err(BenchError::MinAboveMax { min, max });
    }
    let mut sizes = vec![min];
    let mut size = min;
    loop {
        size = match step {
            Step::Factor(f) if f >= 2 => size.saturating_mul(f),
            Step::Factor(f) => return Err(BenchError::StepFactorBelowTwo(f)),
            Step::Bytes(0) => return Err(BenchError::ZeroStepBytes),
            Step::Bytes(i) => size.saturating_add(i),
        };
        if size > max {
            return Ok(sizes);
        }
        sizes.push(size);
        if sizes.len() > 10_000 {
            return Err(BenchError::TooManySizes { min, max });
        }
    }
}

// One way to write a byte count for people, shared with the library's messages.
pub use comm_core::units::{human_bytes, trim};

/// The sizes of a sweep and where its rows go, as nccl-tests takes them: a benchmark run and
/// `comm-bench predict` share them (each with its own defaults, [`SweepDefaults`]).
#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    /// Smallest size in bytes: K, M, G are x1024 as in nccl-tests (1M = 1048576); KB, MB, GB are
    /// x1000 as the course writes sizes (100MB = 100000000) [default: 1K; predict: 8].
    #[arg(short = 'b', long = "minbytes", value_parser = parse_bytes, value_name = "SIZE")]
    pub min_bytes: Option<u64>,

    /// Largest size in bytes (same suffixes) [default: 64M; predict: 8G].
    #[arg(short = 'e', long = "maxbytes", value_parser = parse_bytes, value_name = "SIZE")]
    pub max_bytes: Option<u64>,

    /// Multiply the size by this factor from one step to the next [default: 4; predict: 2].
    #[arg(
        short = 'f',
        long = "stepfactor",
        value_name = "FACTOR",
        conflicts_with = "step_bytes"
    )]
    pub step_factor: Option<u64>,

    /// Add this many bytes from one step to the next, instead of -f.
    #[arg(short = 'i', long = "stepbytes", value_parser = parse_bytes, value_name = "SIZE")]
    pub step_bytes: Option<u64>,

    /// Also write the rows as CSV: one per backend, collective, world size, size, type,
    /// reduction and placement: the table's time (time_us) and the median, min and max over
    /// iterations (time_us_median, …), with the machine, backend and versions (predictions:
    /// backend "model:nccl-…").
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
}

/// What a sweep measures where -b, -e and -f are silent.
#[derive(Debug, Clone, Copy)]
pub struct SweepDefaults {
    pub min: u64,
    pub max: u64,
    pub factor: u64,
}

/// -b, -e and -f or -i as the sizes of the sweep, `d` where they are silent.
pub fn sizes(args: &SweepArgs, d: SweepDefaults) -> Result<Vec<u64>, BenchError> {
    let min = args.min_bytes.unwrap_or(d.min);
    // Without -e, a -b above the default maximum measures that one size.
    let max = args.max_bytes.unwrap_or(d.max.max(min));
    let step = match (args.step_bytes, args.step_factor) {
        (Some(i), _) => Step::Bytes(i),
        (None, Some(f)) => Step::Factor(f),
        (None, None) => Step::Factor(d.factor),
    };
    sweep(min, max, step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_nccl_tests_and_the_course_write_them() {
        assert_eq!(parse_bytes("1024").unwrap(), 1024);
        assert_eq!(parse_bytes("8").unwrap(), 8);
        assert_eq!(parse_bytes("1K").unwrap(), 1024);
        assert_eq!(parse_bytes("1k").unwrap(), 1024);
        assert_eq!(parse_bytes("32M").unwrap(), 32 << 20);
        assert_eq!(parse_bytes("1G").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("100MB").unwrap(), 100_000_000);
        assert_eq!(parse_bytes("1GB").unwrap(), 1_000_000_000);
        assert_eq!(parse_bytes("1gb").unwrap(), 1_000_000_000);
        assert_eq!(parse_bytes("5B").unwrap(), 5);
        for bad in ["", "M", "1.5M", "1X", "1MX", "-1", "1 M"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_bytes("99999999999T").unwrap_err().to_string(),
            "\"99999999999T\" is too large"
        );
        assert_eq!(
            parse_bytes("1X").unwrap_err().to_string(),
            "\"1X\" is not a size: write bytes as a whole number with K, M, G (x1024) or KB, MB, \
             GB (x1000), e.g. 64M or 100MB"
        );
    }

    #[test]
    fn sweeps() {
        assert_eq!(
            sweep(1_000_000, 1_000_000_000, Step::Factor(10)).unwrap(),
            vec![1_000_000, 10_000_000, 100_000_000, 1_000_000_000]
        );
        assert_eq!(
            sweep(4 << 20, 64 << 20, Step::Factor(4)).unwrap(),
            vec![4 << 20, 16 << 20, 64 << 20]
        );
        assert_eq!(sweep(1, 10, Step::Bytes(4)).unwrap(), vec![1, 5, 9]);
        assert_eq!(sweep(7, 7, Step::Factor(2)).unwrap(), vec![7]);
        assert!(sweep(8, 4, Step::Factor(2)).is_err());
        assert!(sweep(8, 64, Step::Factor(1)).is_err());
        assert!(sweep(8, 64, Step::Bytes(0)).is_err());
        assert!(sweep(0, 64, Step::Factor(2)).is_err());
        assert!(sweep(1, 1 << 40, Step::Bytes(1)).is_err());
    }
}
