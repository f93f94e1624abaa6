//! Who belongs to the job, checked with the store's own commands, so that it holds on any
//! TCPStore server: ours (rank 0's) or torchrun's agent store. The job's keys (all under its
//! namespace, see `client.rs`):
//!
//! | key | value | written by |
//! |---|---|---|
//! | `job/run_id` | the run id | our server at start, or the first rank to join |
//! | `job/world_size` | the world size | our server at start, or the first rank to join |
//! | `job/rank/<r>` | `<address> (pid <pid>)` | rank r, as it joins |
//! | `job/abort` | `<rank>\n<its error>` | the first rank to end the job |
//! | `job/keys` | one `<rank> <key>` line per `set` | every rank (the index readers outside use) |
//!
//! Joining is three COMPARE_SETs, each of which either writes this rank's fact or answers the
//! fact already there: another run's id means a rank of another job found this port; another
//! world size, that the ranks disagree; another process's claim on `job/rank/<r>`, that two
//! processes were given one rank. The last two write `job/abort`, which every rank's watcher
//! waits for (`client.rs`): the whole job stops at once. A rank of another run does not: that job
//! is not its own.

use std::time::Duration;

use super::client::Store;
use crate::error::{CommError, Result};

pub const RUN_ID_KEY: &str = "job/run_id";
pub const WORLD_SIZE_KEY: &str = "job/world_size";
pub const ABORT_KEY: &str = "job/abort";
/// The job's index of keys: who set which (see [`Store::set`]).
pub const INDEX_KEY: &str = "job/keys";

/// The key rank `rank` claims as it joins.
pub fn rank_key(rank: usize) -> String {
    format!("job/rank/{rank}")
}

/// What our server stores before anyone connects, as (wire key, value).
pub fn seed(world_size: usize, run_id: Option<&str>) -> Vec<(String, Vec<u8>)> {
    let mut facts = vec![(
        super::client::wire_key("", WORLD_SIZE_KEY),
        world_size.to_string().into_bytes(),
    )];
    if let Some(run_id) = run_id {
        facts.push((
            super::client::wire_key("", RUN_ID_KEY),
            run_id.as_bytes().to_vec(),
        ));
    }
    facts
}

/// Checks this rank's run, world size and rank against the job's; on a refusal that is the
/// job's own business (size, duplicate) tells every rank through the abort key. Two round trips:
/// the run id first (a rank of another run must claim nothing in this job), then the other two
/// COMPARE_SETs and a CHECK of the abort key together.
pub(super) fn join(store: &Store, run_id: Option<&str>) -> Result<()> {
    let (rank, world_size) = (store.rank(), store.world_size());
    let endpoint = store.endpoint().to_string();
    if let Some(ours) = run_id {
        let theirs = store.compare_set(RUN_ID_KEY, b"", ours.as_bytes())?;
        if theirs != ours.as_bytes() {
            return Err(CommError::ForeignRank {
                rank,
                run_id: ours.to_string(),
                endpoint,
                store_run_id: String::from_utf8_lossy(&theirs).into_owned(),
            });
        }
    }
    let world = world_size.to_string();
    let me = format!("{} (pid {})", store.local_addr(), std::process::id());
    let claim = rank_key(rank);
    let facts: [(&str, &[u8]); 2] = [(WORLD_SIZE_KEY, world.as_bytes()), (&claim, me.as_bytes())];
    let (now, ended) = store.compare_sets_then_check(&facts, ABORT_KEY)?;
    if ended {
        // A rank arriving after the job was ended hears why, whatever else it finds.
        let why = store.get_within(ABORT_KEY, Duration::from_secs(5))?;
        return Err(reason(rank, &why));
    }
    let mut now = now.into_iter();
    let theirs = now.next().unwrap_or_default();
    if theirs != world.as_bytes() {
        let store_world_size = String::from_utf8_lossy(&theirs).trim().parse().unwrap_or(0);
        return Err(abort_with(
            store,
            CommError::WorldSizeMismatch {
                rank,
                endpoint,
                store_world_size,
                other_rank: rank,
                other_world_size: world_size,
            },
        ));
    }
    let holder = now.next().unwrap_or_default();
    if holder != me.as_bytes() {
        let first_from = String::from_utf8_lossy(&holder).into_owned();
        return Err(abort_with(
            store,
            CommError::DuplicateRank {
                rank,
                endpoint,
                first_from,
            },
        ));
    }
    Ok(())
}

/// Writes `error` as the job's reason to stop (if none is there yet) and returns it.
fn abort_with(store: &Store, error: CommError) -> CommError {
    abort(store, &error);
    error
}

/// Ends the job for every rank: writes this rank's error under the abort key, unless another
/// rank's is there already. Best effort: the store may be gone, and the caller fails anyway.
pub fn abort(store: &Store, error: &CommError) {
    if matches!(error, CommError::JobAborted { .. }) {
        return; // Someone else's reason is there already.
    }
    let reason = format!("{}\n{error}", store.rank());
    let _ = store.compare_set(ABORT_KEY, b"", reason.as_bytes());
}

/// The abort key's value as the error rank `rank` stops with.
pub(super) fn reason(rank: usize, value: &[u8]) -> CommError {
    let text = String::from_utf8_lossy(value);
    let (by, reason) = text.split_once('\n').unwrap_or(("?", &text));
    CommError::JobAborted {
        rank,
        by: by.trim().parse().unwrap_or(usize::MAX),
        reason: reason.to_string(),
    }
}
