//! Host memory: how much this node has available (MemAvailable), and the check that refuses a
//! buffer that cannot fit with a usage error naming both sizes, before anything is allocated
//! (instead of the allocator's abort or the OOM killer).

use crate::dtype::Element;
use crate::error::{CommError, Result};
use crate::units::human_bytes;

/// Host memory below which a buffer is not checked against MemAvailable (reading it costs more
/// than such a buffer).
const UNCHECKED_BYTES: u64 = 64 << 20;

/// Refuses, as a usage error, `copies` host copies of `len` elements of `T` that cannot fit: more
/// bytes than the machine addresses, or more than this rank's share of MemAvailable (divided
/// among the node's ranks). Nothing is allocated.
pub fn check_fits<T: Element>(len: usize, copies: u64) -> Result<()> {
    let what = || format!("a buffer of {len} {} elements", std::any::type_name::<T>());
    let need = (len as u64)
        .checked_mul(std::mem::size_of::<T>() as u64)
        .and_then(|b| b.checked_mul(copies))
        .filter(|&b| b <= isize::MAX as u64)
        .ok_or_else(|| {
            CommError::Usage(format!("{}: more bytes than memory can address", what()))
        })?;
    if need <= UNCHECKED_BYTES {
        return Ok(());
    }
    let Some(available) = available() else {
        return Ok(());
    };
    let ranks = crate::topology::local_ranks_from_env() as u64;
    let share = available / ranks;
    if need > share {
        let ranks_text = match ranks {
            1 => String::new(),
            n => format!(", {} for each of its {n} ranks", human_bytes(share as f64)),
        };
        return Err(CommError::Usage(format!(
            "{} needs {} of host memory on this rank, but this node has {} available \
             (MemAvailable){ranks_text}: ask for fewer elements",
            what(),
            human_bytes(need as f64),
            human_bytes(available as f64),
        )));
    }
    Ok(())
}

/// MemAvailable from /proc/meminfo, in bytes; None where there is none.
pub fn available() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))?
        .split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()?
        .checked_mul(1024)
}
