//! File descriptors: how many a process of a job needs, and the check that refuses a job the
//! limit (`ulimit -n`, RLIMIT_NOFILE) cannot hold before it starts, naming the number and how to
//! raise it, instead of a connection failing halfway through the rendezvous with "too many open
//! files". Rank 0 serves the store, two connections per rank; every rank may link to every peer
//! (one socket each, connected when the pair first talks, so a job that talks to every peer
//! holds them all); a process that starts ranks holds two pipes per rank for their output.
//!
//! A soft limit below the need but a hard limit above it is raised, as any process may do for
//! itself (Go's runtime raises it at start the same way); ranks a process starts inherit it.

use crate::error::{CommError, Result};

/// Descriptors a process needs besides those counted: standard streams, the store client's
/// connections, listeners, epoll sets, shared-memory and trace files, libraries.
const BASE: u64 = 64;

/// What rank `rank` of `world_size` ranks needs: rank 0's store (when it serves it) two per
/// rank, and a link to every peer.
pub fn for_rank(rank: usize, world_size: usize, serves_store: bool) -> u64 {
    let peers = world_size.saturating_sub(1) as u64;
    let store = match (rank, serves_store) {
        (0, true) => 2 * world_size as u64,
        _ => 0,
    };
    BASE + store + peers
}

/// What a process that starts `ranks` ranks and relays their output needs.
pub fn for_launcher(ranks: usize) -> u64 {
    BASE + 3 * ranks as u64
}

/// Makes sure rank `rank` of `world_size` ranks may open what it needs ([`for_rank`]).
pub fn check_rank(rank: usize, world_size: usize, serves_store: bool) -> Result<()> {
    let need = for_rank(rank, world_size, serves_store);
    let store = match (rank, serves_store) {
        (0, true) => "2 per rank for the store it serves, ",
        _ => "",
    };
    let who = format!("rank {rank} of a job of {world_size} ranks ({store}1 per peer link)");
    ensure(need, &who)
}

/// Makes sure a process starting `ranks` ranks of a job of `world_size` may open what it and
/// the ranks need (they inherit its limit): its pipes, and the most any of them needs (rank 0
/// when `store_here`, for the store it serves).
pub fn check_launcher(ranks: usize, world_size: usize, store_here: bool) -> Result<()> {
    let need = for_launcher(ranks).max(for_rank(0, world_size, store_here));
    let who = match store_here {
        true => format!(
            "a job of {world_size} ranks whose rank 0 runs here (2 per rank for the store it \
             serves, 1 per peer link)"
        ),
        false => format!("a job of {world_size} ranks (1 per peer link, 3 per rank started here)"),
    };
    ensure(need, &who)
}

/// Makes sure this process may open `need` descriptors, `who` being what needs them ("rank 0 of
/// a job of 4096 ranks (2 per rank for the store it serves, 1 per peer)"): raises the soft
/// limit up to the hard one if that is enough, else refuses with a usage error saying how to
/// raise it.
pub fn ensure(need: u64, who: &str) -> Result<()> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Ok(()); // Nothing to go by: the job finds out as it runs.
    }
    if limit.rlim_cur >= need {
        return Ok(());
    }
    if limit.rlim_max >= need {
        let raised = libc::rlimit {
            rlim_cur: need as libc::rlim_t,
            ..limit
        };
        // SAFETY: `raised` is a valid rlimit within the hard limit, which any process may set.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Ok(());
        }
    }
    Err(CommError::Usage(format!(
        "{who} needs {need} file descriptors, and this process may open {} (`ulimit -n`; hard \
         limit {}): raise the limit before starting the job (`ulimit -n {need}` in the shell or \
         the batch script, which needs a hard limit of at least {need}: ask the admins, or see \
         /etc/security/limits.conf and Slurm's PropagateResourceLimits), or run fewer ranks",
        limit.rlim_cur, limit.rlim_max
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_zero_counts_the_store_and_everyone_the_links() {
        assert_eq!(for_rank(0, 4096, true), 64 + 8192 + 4095);
        assert_eq!(for_rank(0, 4096, false), 64 + 4095);
        assert_eq!(for_rank(7, 4096, true), 64 + 4095);
        assert_eq!(for_rank(0, 1, true), 64 + 2);
        assert_eq!(for_launcher(8), 64 + 24);
    }

    #[test]
    fn what_the_limit_allows_passes_and_more_than_the_hard_limit_says_how_to_raise_it() {
        ensure(16, "a test").unwrap();
        let e = ensure(u64::MAX / 2, "rank 0 of a test")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("rank 0 of a test needs "), "{e}");
        assert!(e.contains("ulimit -n"), "{e}");
    }
}
