//! A node's launcher present at the job's store while its ranks start. A rank's own connections
//! tell the store when its node goes silent (`membership.rs`), but only once the rank has
//! joined; before that, a node is invisible, and a cut there was found only at `--timeout`.
//! torchrun's agents keep a heartbeat in their rendezvous for the same reason.
//!
//! So commrun, on every node but node 0 (whose rank 0 serves the store), [`attend`]s: it
//! connects as soon as the store answers, claims its node (`job/node/<n>`, naming its ranks),
//! and waits on that connection, which the heartbeat probes both ways, until all of its ranks
//! have joined. Then their connections speak for the node and it lets go. Meanwhile:
//!
//! - this node goes silent: the store's server ends the job for every rank, naming the node
//!   (`membership::node_silent`);
//! - the store's node goes silent: the launcher hears it here ([`Attended::StoreSilent`]) and
//!   stops its ranks, which have no connection of their own yet to hear it by; likewise when
//!   the store closes (rank 0 ended the job) before they joined ([`Attended::StoreClosed`]).
//!
//! It attends only a store our rank 0 serves: PyTorch's, under a torch program, knows nothing
//! of our ranks' claims.

use std::io::ErrorKind;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::connection::Conn;
use super::membership::{node_key, rank_key, RUN_ID_KEY, WORLD_SIZE_KEY};
use super::wire::{wire_key, Answer, Command, Shape};
use crate::heartbeat::{went_silent, Heartbeat};

/// Which node a launcher speaks for, in which job.
#[derive(Debug, Clone)]
pub struct NodeClaim<'a> {
    /// The node, 1..nnodes.
    pub node: usize,
    /// Its ranks.
    pub ranks: Range<usize>,
    /// Ranks in the job, compared with the store's.
    pub world_size: usize,
    /// The run's id, compared with the store's (None: compare nothing).
    pub run_id: Option<&'a str>,
}

/// How attending the store ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attended {
    /// Every rank of the node joined: their connections speak for it now.
    RanksJoined,
    /// `stop` was set (the launcher's ranks ended).
    Stopped,
    /// The store answered nothing, not even the heartbeat's probes, for this long.
    StoreSilent(Duration),
    /// The store closed the connection before the node's ranks had all joined: rank 0 ended,
    /// and the job with it (it cannot have finished without them).
    StoreClosed,
    /// The store is not one our rank 0 serves (PyTorch's, under a torch program, knows nothing
    /// of our ranks' claims), it is another job's (another run id or world size), or another
    /// launcher holds this node's claim: nothing to attend; the ranks will say what is wrong
    /// as they join.
    NotOurs,
}

/// How often a waiting launcher looks at `stop`, and pauses between attempts to connect.
const LOOK: Duration = Duration::from_millis(250);

/// Attends the store at `endpoint` for `claim`'s node, probed as `beat` says, until one of
/// [`Attended`] happens. A store that is not up yet is tried again until `stop`.
pub fn attend(
    endpoint: &str,
    claim: &NodeClaim<'_>,
    beat: Heartbeat,
    stop: &AtomicBool,
) -> Attended {
    loop {
        if stop.load(Ordering::Relaxed) {
            return Attended::Stopped;
        }
        let Ok(mut conn) = Conn::open(endpoint, Duration::from_secs(1), beat) else {
            std::thread::sleep(LOOK);
            continue;
        };
        match claim_node(&mut conn, claim) {
            Ok(true) => {}
            Ok(false) => return Attended::NotOurs,
            Err(_) => {
                std::thread::sleep(LOOK);
                continue;
            }
        }
        return wait_for_ranks(&mut conn, claim, beat, stop).unwrap_or(Attended::StoreClosed);
    }
}

/// Compares the job's run id and world size with the store's, then claims the node: false if
/// the store is not our rank 0's (it seeds the world size before anyone connects), another
/// job's, or the node another launcher's. Nothing is written into a store that is not ours.
fn claim_node(conn: &mut Conn, claim: &NodeClaim<'_>) -> std::io::Result<bool> {
    conn.stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.send(&[Command::Check {
        keys: vec![wire_key("", WORLD_SIZE_KEY)],
    }])?;
    if !conn.ready()? {
        return Ok(false);
    }
    let compare = |key: &str, value: &str| Command::CompareSet {
        key: wire_key("", key),
        expected: Vec::new(),
        desired: value.as_bytes().to_vec(),
    };
    let world = claim.world_size.to_string();
    let mut facts = vec![(WORLD_SIZE_KEY, world.as_str())];
    facts.extend(claim.run_id.map(|run| (RUN_ID_KEY, run)));
    conn.send(&facts.iter().map(|(k, v)| compare(k, v)).collect::<Vec<_>>())?;
    for (_, ours) in &facts {
        if conn.value()? != ours.as_bytes() {
            return Ok(false);
        }
    }
    let me = format!(
        "{} (pid {} on {}) ranks {}-{}",
        conn.stream.local_addr()?,
        std::process::id(),
        crate::host::hostname(),
        claim.ranks.start,
        claim.ranks.end.saturating_sub(1)
    );
    let key = node_key(claim.node);
    conn.send(&[compare(&key, &me)])?;
    let holder = String::from_utf8_lossy(&conn.value()?).into_owned();
    if holder == me {
        return Ok(true);
    }
    // This process's own claim from an earlier connection (its answer lost, it tried again):
    // taken over, so that the live connection is the claimant the server watches.
    // The claim without its address: "(pid <pid> on <host>) ranks <a>-<b>".
    let (theirs, ours) = (holder.split_once(' '), me.split_once(' '));
    if theirs.is_some() && theirs.map(|t| t.1) == ours.map(|o| o.1) {
        conn.send(&[Command::CompareSet {
            key: wire_key("", &key),
            expected: holder.into_bytes(),
            desired: me.clone().into_bytes(),
        }])?;
        return Ok(conn.value()? == me.as_bytes());
    }
    Ok(false)
}

/// WAITs for every rank of the node to have claimed its rank, looking at `stop` meanwhile. An
/// error is the store closing the connection (or answering nonsense).
fn wait_for_ranks(
    conn: &mut Conn,
    claim: &NodeClaim<'_>,
    beat: Heartbeat,
    stop: &AtomicBool,
) -> std::io::Result<Attended> {
    let keys = claim
        .ranks
        .clone()
        .map(|r| wire_key("", &rank_key(r)))
        .collect();
    conn.send(&[Command::Wait { keys }])?;
    conn.stream.set_read_timeout(Some(LOOK))?;
    loop {
        match conn.read(Shape::Waited) {
            Ok(Answer::StopWaiting) => return Ok(Attended::RanksJoined),
            Ok(_) => return Err(ErrorKind::InvalidData.into()),
            // Before the read timeout's kinds: ETIMEDOUT reads as TimedOut too.
            Err(e) if went_silent(&e) => return Ok(Attended::StoreSilent(beat.silence())),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(Attended::Stopped);
        }
    }
}
