//! Who belongs to the job, checked with the store's own commands through the key-value client, so
//! that it holds on any TCPStore server: ours (rank 0's) or torchrun's agent store. Part of the
//! session (`session.rs`). The job's keys (all under its namespace, see `client.rs`):
//!
//! | key | value | written by |
//! |---|---|---|
//! | `job/run_id` | the run id | our server at start, or the first rank to join |
//! | `job/world_size` | the world size | our server at start, or the first rank to join |
//! | `job/rank/<r>` | `<address> (pid <pid>)` | rank r, as it joins |
//! | `job/abort` | `<rank>\n<its error>` | the first rank to end the job, or our server for a rank that vanished |
//! | `job/left/<r>` | empty | rank r, as it leaves knowingly (finished, or failed and said why) |
//! | `job/node/<n>` | `<address> (pid <pid> on <host>) ranks <a>-<b>` | node n's launcher (commrun), present while its ranks start (`presence.rs`) |
//! | `job/keys` | one `<rank> <key>` line per `set` | every rank (the index readers outside use) |
//!
//! Joining is three COMPARE_SETs, each of which either writes this rank's fact or answers the
//! fact already there: another run's id means a rank of another job found this port; another
//! world size, that the ranks disagree; another process's claim on `job/rank/<r>`, that two
//! processes were given one rank. The last two write `job/abort`, which every rank's watcher
//! waits for (`watcher.rs`): the whole job stops at once. A rank of another run does not: that job
//! is not its own.
//!
//! A rank that vanishes (killed, crashed) tells nobody, but its connections to the store close.
//! Our server (not torchrun's agent store, whose agent watches its workers itself) remembers
//! which connection made which rank's claim ([`claimed`]); when one closes and its address
//! is the claim's, unless that rank said it was leaving
//! (`job/left/<r>`), writes the abort key for it ([`vanished`]): every rank's watcher hears of it
//! within milliseconds, in whatever phase it is, as torchrun's agent hears of a dead worker.
//!
//! A node's launcher claims its node the same way (`job/node/<n>`, see `presence.rs`), so that a
//! node whose ranks have not joined yet is not invisible: when that connection goes silent for
//! the heartbeat's bound and none of the node's ranks has claimed its rank, the server writes
//! the abort key for the node ([`node_lost`]); likewise when it closes (the launcher ended:
//! its workers failed, or it was stopped, before any joined; ranks that never joined have no
//! connection whose closing would tell). Once a rank of the node has joined, its own connection
//! speaks for the node.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::client::Client;
use super::wire::wire_key;
use crate::error::{rank_list, CommError, Result};

/// Who joins the store: which rank of how many, of which run, and under which namespace.
#[derive(Debug, Clone, Copy)]
pub struct Membership<'a> {
    /// This rank, 0..world_size.
    pub rank: usize,
    /// Ranks in the job.
    pub world_size: usize,
    /// The run's id, compared with the job's (None: ranks started by hand compare nothing).
    pub run_id: Option<&'a str>,
    /// A prefix for every key ("" for our own store; `/worker/attempt_<n>` under torchrun).
    pub namespace: &'a str,
}

pub const RUN_ID_KEY: &str = "job/run_id";
pub const WORLD_SIZE_KEY: &str = "job/world_size";
pub const ABORT_KEY: &str = "job/abort";
/// The job's index of keys: who set which (see [`super::Store::set`]).
pub const INDEX_KEY: &str = "job/keys";

/// The key rank `rank` sets as it leaves knowingly: its connections closing is not news then.
pub fn left_key(rank: usize) -> String {
    format!("job/left/{rank}")
}

/// How an abort written by the server for a vanished rank starts its reason (after `<rank>\n`).
const VANISHED: &str = "vanished: ";
/// How an abort written by the server for a silent rank starts its reason (after `<rank>\n`),
/// before the seconds it went unheard and `: `.
const SILENT: &str = "silent ";

/// The key rank `rank` claims as it joins.
pub fn rank_key(rank: usize) -> String {
    format!("job/rank/{rank}")
}

/// The key node `node`'s launcher claims while its ranks start (`presence.rs`).
pub fn node_key(node: usize) -> String {
    format!("job/node/{node}")
}

/// How an abort written by the server for a silent node starts its reason (after `<rank>\n`),
/// before `<node> <seconds>s: <claim>`.
const NODE_SILENT: &str = "node silent ";
/// How an abort written by the server for a node whose launcher ended starts its reason (after
/// `<rank>\n`), before `<node>: <claim>`.
const NODE_GONE: &str = "node gone ";

/// What our server stores before anyone connects, as (wire key, value).
pub fn seed(world_size: usize, run_id: Option<&str>) -> Vec<(String, Vec<u8>)> {
    let mut facts = vec![(
        wire_key("", WORLD_SIZE_KEY),
        world_size.to_string().into_bytes(),
    )];
    if let Some(run_id) = run_id {
        facts.push((wire_key("", RUN_ID_KEY), run_id.as_bytes().to_vec()));
    }
    facts
}

/// Checks this rank's run, world size and rank against the job's; on a refusal that is the
/// job's own business (size, duplicate) tells every rank through the abort key. Two round trips:
/// the run id first (a rank of another run must claim nothing in this job), then the other two
/// COMPARE_SETs and a CHECK of the abort key together.
pub(super) fn join(client: &Client, who: &Membership<'_>) -> Result<()> {
    let (rank, world_size) = (who.rank, who.world_size);
    let endpoint = client.endpoint().to_string();
    if let Some(ours) = who.run_id {
        let theirs = client.compare_set(RUN_ID_KEY, b"", ours.as_bytes())?;
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
    let me = format!(
        "{} (pid {} on {})",
        client.local_addr(),
        std::process::id(),
        crate::host::hostname()
    );
    let claim = rank_key(rank);
    let facts: [(&str, &[u8]); 2] = [(WORLD_SIZE_KEY, world.as_bytes()), (&claim, me.as_bytes())];
    let (now, ended) = client.compare_sets_then_check(&facts, ABORT_KEY, "joining")?;
    if ended {
        // A rank arriving after the job was ended hears why, whatever else it finds.
        let timeout = Duration::from_secs(5);
        if !client.wait(&[ABORT_KEY], timeout)? {
            return Err(wait_timed_out(client, world_size, ABORT_KEY, timeout));
        }
        return Err(reason(rank, &client.get(ABORT_KEY)?));
    }
    let mut now = now.into_iter();
    let theirs = now.next().unwrap_or_default();
    if theirs != world.as_bytes() {
        let store_world_size = String::from_utf8_lossy(&theirs).trim().parse().unwrap_or(0);
        return Err(abort_with(
            client,
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
            client,
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
fn abort_with(client: &Client, error: CommError) -> CommError {
    abort(client, &error);
    error
}

/// Ends the job for every rank: writes this rank's error under the abort key, unless another
/// rank's is there already. Best effort: the store may be gone, and the caller fails anyway.
pub(super) fn abort(client: &Client, error: &CommError) {
    if matches!(error, CommError::JobAborted { .. }) {
        return; // Someone else's reason is there already.
    }
    let reason = format!("{}\n{error}", client.rank());
    let _ = client.compare_set(ABORT_KEY, b"", reason.as_bytes());
}

/// The error of a wait for `what` that ran out of `timeout`: it names the ranks that never
/// joined the job, whose absence is the likeliest cause.
pub(super) fn wait_timed_out(
    client: &Client,
    world_size: usize,
    what: &str,
    timeout: Duration,
) -> CommError {
    let (detail, missing) = who_joined(client, world_size);
    CommError::Timeout {
        what: format!("key '{what}' on rank {}", client.rank()),
        timeout,
        detail: format!(" ({detail})"),
        missing,
    }
}

/// Who had joined the job, for a timeout's message: the text and the ranks that never did.
fn who_joined(client: &Client, world_size: usize) -> (String, Vec<usize>) {
    let keys: Vec<String> = (0..world_size).map(rank_key).collect();
    match client.present(&keys) {
        Ok((joined, missing)) => (
            format!(
                "ranks connected to the store: {} of {}; never connected: {}",
                rank_list(joined),
                world_size,
                rank_list(missing.iter().copied())
            ),
            missing,
        ),
        Err(_) => ("the store did not say who had connected".into(), Vec::new()),
    }
}

/// The abort key's value as the error rank `rank` stops with.
pub(super) fn reason(rank: usize, value: &[u8]) -> CommError {
    let text = String::from_utf8_lossy(value);
    let (by, reason) = text.split_once('\n').unwrap_or(("?", &text));
    let by = by.trim().parse().unwrap_or(usize::MAX);
    let silent = reason.strip_prefix(SILENT).and_then(|rest| {
        let (seconds, claim) = rest.split_once("s: ")?;
        Some((Duration::from_secs(seconds.parse().ok()?), claim))
    });
    let node_silent = reason.strip_prefix(NODE_SILENT).and_then(|rest| {
        let (node, rest) = rest.split_once(' ')?;
        let (seconds, claim) = rest.split_once("s: ")?;
        Some((node.parse().ok()?, seconds.parse().ok()?, claim))
    });
    if let Some((node, claim)) = reason
        .strip_prefix(NODE_GONE)
        .and_then(|r| r.split_once(": "))
    {
        if let Ok(node) = node.parse() {
            return CommError::NodeGone {
                rank,
                node,
                first_rank: by,
                claim: claim.to_string(),
                phase: crate::phase::now(),
            };
        }
    }
    if let Some((node, seconds, claim)) = node_silent {
        return CommError::NodeSilent {
            rank,
            node,
            first_rank: by,
            claim: claim.to_string(),
            phase: crate::phase::now(),
            silence: Duration::from_secs(seconds),
        };
    }
    if let Some((silence, claim)) = silent {
        return CommError::RankSilent {
            rank,
            gone: by,
            claim: claim.to_string(),
            phase: crate::phase::now(),
            silence,
        };
    }
    match reason.strip_prefix(VANISHED) {
        Some(claim) => CommError::RankVanished {
            rank,
            gone: by,
            claim: claim.to_string(),
            phase: crate::phase::now(),
        },
        None => CommError::JobAborted {
            rank,
            by,
            reason: reason.to_string(),
        },
    }
}

/// What a connection speaks for, once it claimed it: the server remembers it on the
/// connection, and its closing or silence may be news.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Claim {
    /// A rank (`job/rank/<r>`).
    Rank(usize),
    /// A node's launcher (`job/node/<n>`).
    Node(usize),
}

/// The claim a COMPARE_SET on `key` (a wire key of our server's empty namespace) makes, if it
/// is one.
pub(super) fn claimed(key: &str) -> Option<Claim> {
    if let Some(rank) = key.strip_prefix(&wire_key("", "job/rank/")) {
        return rank.parse().ok().map(Claim::Rank);
    }
    let node = key.strip_prefix(&wire_key("", "job/node/"))?;
    node.parse().ok().map(Claim::Node)
}

/// The claim stored under `key` and who made it, if the job has not ended and the claim is
/// the connection's from `peer`. A claim's value, "<address> (pid <pid> on <host>)…", is said
/// as "pid <pid> at <address> on <host>"; one made from another address (a refused
/// duplicate's) is another's.
fn open_claim<'a>(
    values: &'a HashMap<String, Vec<u8>>,
    key: &str,
    peer: SocketAddr,
) -> Option<(&'a str, String)> {
    if values.contains_key(&wire_key("", ABORT_KEY)) {
        return None;
    }
    let claim = std::str::from_utf8(values.get(&wire_key("", key))?).ok()?;
    let address = peer.to_string();
    if claim.split(' ').next() != Some(address.as_str()) {
        return None;
    }
    let inside = claim
        .split_once("(pid ")
        .and_then(|(_, p)| p.split_once(')'))
        .map_or("", |(p, _)| p);
    let who = match inside.split_once(" on ") {
        Some((pid, host)) => format!("pid {pid} at {address} on {host}"),
        None => format!("pid {inside} at {address}"),
    };
    Some((claim, who))
}

/// What our server writes when a connection from `peer` that claimed rank `rank` closes
/// (`values`: what it stores, under wire keys of the empty namespace, its own), or went silent
/// for `silent` (the heartbeat's bound): the abort key and its value when the claim is that
/// connection's (it starts with its address: the claim of a duplicate that was refused is
/// another's) and the rank neither said it was leaving nor did the job end already. A few
/// lookups, whatever the job's size.
pub(super) fn vanished(
    values: &HashMap<String, Vec<u8>>,
    rank: usize,
    peer: SocketAddr,
    silent: Option<Duration>,
) -> Option<(String, Vec<u8>)> {
    if values.contains_key(&wire_key("", &left_key(rank))) {
        return None;
    }
    let (_, who) = open_claim(values, &rank_key(rank), peer)?;
    let why = match silent {
        Some(silence) => format!("{SILENT}{}s: {who}", silence.as_secs()),
        None => format!("{VANISHED}{who}"),
    };
    Some((
        wire_key("", ABORT_KEY),
        format!("{rank}\n{why}").into_bytes(),
    ))
}

/// What our server writes when the connection from `peer` that claimed node `node` closed, or
/// went silent for `silent` (the heartbeat's bound): the abort key and its value, when the claim
/// is that connection's, the job has not ended, and none of the node's ranks (the claim's
/// `ranks <a>-<b>`) has joined (a rank that did speaks for the node through its own
/// connection; a launcher lets go once they all have). The abort names the node's first rank.
pub(super) fn node_lost(
    values: &HashMap<String, Vec<u8>>,
    node: usize,
    peer: SocketAddr,
    silent: Option<Duration>,
) -> Option<(String, Vec<u8>)> {
    let (claim, who) = open_claim(values, &node_key(node), peer)?;
    let (first, last) = claim.rsplit_once(" ranks ")?.1.split_once('-')?;
    let (first, last): (usize, usize) = (first.parse().ok()?, last.parse().ok()?);
    if (first..=last).any(|r| values.contains_key(&wire_key("", &rank_key(r)))) {
        return None;
    }
    let claim = format!("its commrun, {who}; ranks {first}-{last}");
    let why = match silent {
        Some(silence) => format!("{NODE_SILENT}{node} {}s: {claim}", silence.as_secs()),
        None => format!("{NODE_GONE}{node}: {claim}"),
    };
    Some((
        wire_key("", ABORT_KEY),
        format!("{first}\n{why}").into_bytes(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(pairs: &[(&str, &str)]) -> HashMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (wire_key("", k), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn a_ranks_connection_closing_before_it_left_ends_the_job_naming_it() {
        let peer: SocketAddr = "127.0.0.1:40280".parse().unwrap();
        let claim = "127.0.0.1:40280 (pid 1797 on node1)";
        let values = stored(&[
            (&rank_key(0), "127.0.0.1:40100 (pid 1)"),
            (&rank_key(2), claim),
        ]);
        assert_eq!(claimed(&wire_key("", &rank_key(2))), Some(Claim::Rank(2)));
        assert_eq!(claimed(&wire_key("", &node_key(1))), Some(Claim::Node(1)));
        assert_eq!(claimed(&wire_key("", "job/run_id")), None);
        let (key, value) = vanished(&values, 2, peer, None).expect("rank 2 vanished");
        assert_eq!(key, wire_key("", ABORT_KEY));
        match reason(1, &value) {
            CommError::RankVanished {
                rank,
                gone,
                claim: c,
                ..
            } => assert_eq!(
                (rank, gone, c.as_str()),
                (1, 2, "pid 1797 at 127.0.0.1:40280 on node1")
            ),
            other => panic!("{other}"),
        }
        // Silent for the heartbeat's bound instead: said so, with how long.
        let silence = Some(Duration::from_secs(15));
        let (_, value) = vanished(&values, 2, peer, silence).expect("rank 2 went silent");
        match reason(1, &value) {
            CommError::RankSilent {
                gone: 2,
                claim,
                silence,
                ..
            } => {
                assert_eq!(claim, "pid 1797 at 127.0.0.1:40280 on node1");
                assert_eq!(silence, Duration::from_secs(15));
            }
            other => panic!("{other}"),
        }
        // Not news: a refused duplicate's connection (the claim is another's), a rank that said
        // it was leaving, a job already ended.
        assert!(vanished(&values, 2, "127.0.0.1:9".parse().unwrap(), None).is_none());
        let left = stored(&[(&rank_key(2), claim), (&left_key(2), "")]);
        assert!(vanished(&left, 2, peer, None).is_none());
        let ended = stored(&[(&rank_key(2), claim), (ABORT_KEY, "0\nwhy")]);
        assert!(vanished(&ended, 2, peer, None).is_none());
    }

    #[test]
    fn a_node_lost_before_its_ranks_joined_ends_the_job_naming_it() {
        let peer: SocketAddr = "10.0.0.2:41000".parse().unwrap();
        let claim = "10.0.0.2:41000 (pid 77 on node1) ranks 2-3";
        let silence = Some(Duration::from_secs(15));
        let values = stored(&[
            (&rank_key(0), "10.0.0.1:40100 (pid 1)"),
            (&node_key(1), claim),
        ]);
        let (key, value) = node_lost(&values, 1, peer, silence).expect("node 1 went silent");
        assert_eq!(key, wire_key("", ABORT_KEY));
        match reason(0, &value) {
            CommError::NodeSilent {
                rank: 0,
                node: 1,
                first_rank: 2,
                claim,
                silence,
                ..
            } => {
                assert_eq!(
                    claim,
                    "its commrun, pid 77 at 10.0.0.2:41000 on node1; ranks 2-3"
                );
                assert_eq!(silence, Duration::from_secs(15));
            }
            other => panic!("{other}"),
        }
        // Not news: a rank of the node joined (its own connection speaks for it), the claim
        // came from another connection, the job already ended.
        let joined = stored(&[
            (&node_key(1), claim),
            (&rank_key(3), "10.0.0.2:41002 (pid 80)"),
        ]);
        assert!(node_lost(&joined, 1, peer, silence).is_none());
        assert!(node_lost(&joined, 1, peer, None).is_none());
        assert!(node_lost(&values, 1, "10.0.0.2:9".parse().unwrap(), silence).is_none());
        let ended = stored(&[(&node_key(1), claim), (ABORT_KEY, "0\nwhy")]);
        assert!(node_lost(&ended, 1, peer, silence).is_none());
        // Its launcher's connection closed before any rank joined: its workers failed or were
        // stopped, and ranks that never joined have no connection whose closing would tell.
        let (_, value) = node_lost(&values, 1, peer, None).expect("node 1 ended");
        match reason(0, &value) {
            CommError::NodeGone {
                node: 1,
                first_rank: 2,
                claim,
                ..
            } => assert_eq!(
                claim,
                "its commrun, pid 77 at 10.0.0.2:41000 on node1; ranks 2-3"
            ),
            other => panic!("{other}"),
        }
    }
}
