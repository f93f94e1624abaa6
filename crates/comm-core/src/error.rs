//! One error type for the whole library. Every message says what happened, where (rank, key,
//! host:port, variable) and, where the user can act, what to do.
//!
//! The facts a message names (which peer, which ranks were missing, which store) are also fields,
//! so code that must decide something (the root cause of a failed job, which node to blame) reads
//! them instead of matching sentences that a later rewording would silently break.

use std::time::Duration;

/// Result with the library's error.
pub type Result<T, E = CommError> = std::result::Result<T, E>;

/// Everything that can go wrong, one variant per kind of failure ([`CommError::kind`] names it).
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// The environment (torchrun's or Slurm's variables) is missing something or contradicts
    /// itself. `var` is the variable at fault; `message` is the whole sentence, variable included.
    #[error("environment: {message}")]
    Env {
        /// The variable at fault, e.g. `RANK`.
        var: String,
        /// The whole sentence, the variable named in it.
        message: String,
    },

    /// A flag or argument that cannot work (e.g. a root outside the world, a bad backend name).
    #[error("{0}")]
    Usage(String),

    /// Something timed out: `what` names the key or peer, `detail` says who had arrived, and
    /// `missing` lists the ranks that were waited for and never came (empty when unknown).
    #[error("timed out after {:.0?} waiting for {what}{detail}", timeout)]
    Timeout {
        /// The key, peer or call that was waited for.
        what: String,
        /// How long it was waited for.
        timeout: Duration,
        /// Who had arrived, or a hint; appended to the message as it is.
        detail: String,
        /// Ranks waited for that never came; empty when unknown.
        missing: Vec<usize>,
    },

    /// A socket could not be bound, connected, read or written.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, and with whom.
        context: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// A peer's connection closed under rank `rank` while it was `doing` ("sending to",
    /// "receiving from") `peer`: the peer failed or exited first.
    #[error(
        "rank {peer} closed its connection while rank {rank} was {doing} it \
         (it probably failed: look at its output)"
    )]
    PeerClosed {
        /// The rank that saw the connection close.
        rank: usize,
        /// The rank whose end closed: the likely root cause.
        peer: usize,
        /// What `rank` was doing with `peer`: "sending to" or "receiving from".
        doing: &'static str,
    },

    /// Rank `peer`, on host `host`, went silent while rank `rank` was `doing` it: not a byte,
    /// not even an answer to the heartbeat's probes, for `silence`. Its node is down, or its
    /// network is cut (no FIN or RST ever comes from a node that lost power or its cable).
    #[error(
        "rank {peer} (on {host}) went silent while rank {rank} was {doing} it, {phase}: nothing \
         heard from it for {silence:?}, not even an answer to the heartbeat (its node is down, or \
         cut off from this one's network; --heartbeat and --heartbeat-misses set how soon this is \
         said)"
    )]
    PeerSilent {
        /// The rank that noticed.
        rank: usize,
        /// The rank that went silent: the likely root cause.
        peer: usize,
        /// The host it runs on, as its hello said.
        host: String,
        /// What `rank` was doing with `peer`: "sending to", "receiving from", "connecting to".
        doing: &'static str,
        /// How long it went unheard (the heartbeat's bound).
        silence: Duration,
        /// What `rank` was doing then ([`crate::phase`]).
        phase: String,
    },

    /// Threads as ranks: `peer`'s end of the channel is gone, so its thread ended first.
    #[error("rank {peer} is gone (its thread ended)")]
    PeerGone {
        /// The rank that found its peer gone.
        rank: usize,
        /// The rank whose thread ended: the likely root cause.
        peer: usize,
    },

    /// Rank `rank` could not connect to `peer` at the address `peer` published.
    #[error("rank {rank} cannot connect to rank {peer} at {addr}: {source}")]
    PeerUnreachable {
        /// The rank that tried to connect.
        rank: usize,
        /// The rank it could not reach.
        peer: usize,
        /// The `host:port` that `peer` published in the store.
        addr: String,
        /// Why the connection failed.
        #[source]
        source: std::io::Error,
    },

    /// Rank `rank` never reached the rendezvous store at `endpoint` (rank 0 serves it).
    #[error(
        "rank {rank} could not reach the rendezvous store at {endpoint} within {timeout:?} \
         (is rank 0 running? are MASTER_ADDR and MASTER_PORT the same on every rank?): {source}"
    )]
    StoreUnreachable {
        /// The rank that tried to connect.
        rank: usize,
        /// The store's `host:port` (MASTER_ADDR:MASTER_PORT).
        endpoint: String,
        /// How long it kept trying.
        timeout: Duration,
        /// The last attempt's error.
        #[source]
        source: std::io::Error,
    },

    /// Rank `rank` lost its connection to the store at `endpoint` during the request for `key`.
    #[error(
        "rank {rank} lost the rendezvous store at {endpoint} during '{key}' \
         (did rank 0 exit or fail?): {source}"
    )]
    StoreLost {
        /// The rank that lost the store.
        rank: usize,
        /// The store's `host:port`.
        endpoint: String,
        /// The key (or request) in flight when the connection broke.
        key: String,
        /// The error that broke it.
        #[source]
        source: std::io::Error,
    },

    /// Rank `rank` heard nothing from the store at `endpoint` for `silence`, not even an answer
    /// to the heartbeat's probes: the node that serves it (rank 0's) is down or cut off.
    #[error(
        "rank {rank} heard nothing from the rendezvous store at {endpoint} (rank 0's node) for \
         {silence:?} while it was {phase}, not even an answer to the heartbeat: that node is down, \
         or cut off from this one's network (--heartbeat and --heartbeat-misses set how soon this \
         is said)"
    )]
    StoreSilent {
        /// The rank that noticed.
        rank: usize,
        /// The store's `host:port`.
        endpoint: String,
        /// How long it went unheard (the heartbeat's bound).
        silence: Duration,
        /// What `rank` was doing then ([`crate::phase`]).
        phase: String,
    },

    /// The store at `endpoint` serves another run than rank `rank`'s: two jobs share a
    /// MASTER_PORT, and this rank found the other job's store. Refused at its hello.
    #[error(
        "rank {rank} of run {run_id} belongs to another job than the store at {endpoint} \
         (run {store_run_id}): two jobs are using the same MASTER_PORT; give one another port \
         (--master-port or MASTER_PORT)"
    )]
    ForeignRank {
        /// The refused rank.
        rank: usize,
        /// Its run id (TORCHELASTIC_RUN_ID, Slurm's job.step, or commrun's).
        run_id: String,
        /// The store's `host:port`.
        endpoint: String,
        /// The run id the store serves.
        store_run_id: String,
    },

    /// A connection of rank `rank` was already open at the store when another one said hello
    /// with the same rank: two processes were given one RANK, or a job without run ids shares
    /// this MASTER_PORT.
    #[error(
        "rank {rank} already joined this job from {first_from} (store at {endpoint}): two \
         processes have RANK={rank}; check RANK/--node-rank, or, if another job uses the same \
         MASTER_PORT, give one another port"
    )]
    DuplicateRank {
        /// The refused rank.
        rank: usize,
        /// The store's `host:port`.
        endpoint: String,
        /// The address the first connection of this rank came from.
        first_from: String,
    },

    /// The ranks disagree on the world size: rank 0 serves the store for `store_world_size`
    /// ranks, rank `other_rank` says `other_world_size`. Every rank of the job gets this at once
    /// (its hello, or its next wait at the store), not after the timeout.
    #[error(
        "rank {rank}: the ranks disagree on the world size: the store at {endpoint} (rank 0) \
         was started for {store_world_size} ranks, but rank {other_rank} says \
         {other_world_size}; give every rank the same WORLD_SIZE (--nnodes × --nproc-per-node)"
    )]
    WorldSizeMismatch {
        /// The rank reporting it.
        rank: usize,
        /// The store's `host:port`.
        endpoint: String,
        /// Rank 0's world size.
        store_world_size: usize,
        /// The rank whose hello disagreed.
        other_rank: usize,
        /// The world size it said.
        other_world_size: usize,
    },

    /// The store refused rank `rank`'s request for `key` because `what` would exceed one of its
    /// bounds (`max`): connections, keys, value size or stored bytes.
    #[error(
        "the rendezvous store at {endpoint} refused '{key}' from rank {rank}: {what} would \
         exceed its bound of {max} (the store holds rendezvous data: ids, addresses; is \
         something storing bulk data, or is a stranger's job using this MASTER_PORT?)"
    )]
    StoreLimit {
        /// The rank refused.
        rank: usize,
        /// The store's `host:port`.
        endpoint: String,
        /// The key (or request) refused.
        key: String,
        /// What was bounded: "open connections", "keys", "value bytes", "stored bytes"…
        what: String,
        /// The bound.
        max: u64,
    },

    /// Rank `by` ended the job and said why (in the store, under the job's abort key): the
    /// ranks still setting up or waiting stop at once instead of waiting out their timeout.
    #[error("rank {rank} stops because rank {by} ended the job: {reason}")]
    JobAborted {
        /// The rank that stops.
        rank: usize,
        /// The rank that ended the job.
        by: usize,
        /// Its error, as it printed it.
        reason: String,
    },

    /// Rank `gone` vanished: its connection to the store closed before it finished or said
    /// why, so it was killed or crashed. The store's server saw it (our own store only: under
    /// torchrun, its agent watches the workers) and ended the job for every rank at once.
    #[error(
        "rank {gone} ({claim}) vanished while rank {rank} was {phase}: its connection to the \
         store closed before it finished (killed, out of memory, or crashed? look at its output, \
         and at `dmesg` on its host)"
    )]
    RankVanished {
        /// The rank that stops.
        rank: usize,
        /// The rank that vanished.
        gone: usize,
        /// Which process it was: "pid <pid> at <its store connection's address>".
        claim: String,
        /// What this rank was doing then ([`crate::phase`]).
        phase: String,
    },

    /// Rank `gone` went silent: the store's server heard nothing from it, not even an answer to
    /// the heartbeat's probes, for `silence`, so it ended the job for every rank (our own store
    /// only, as for [`CommError::RankVanished`]).
    #[error(
        "rank {gone} ({claim}) went silent while rank {rank} was {phase}: the store heard nothing \
         from it for {silence:?}, not even an answer to the heartbeat (its node is down, or cut \
         off from the store's network; --heartbeat and --heartbeat-misses set how soon this is \
         said)"
    )]
    RankSilent {
        /// The rank that stops.
        rank: usize,
        /// The rank that went silent.
        gone: usize,
        /// Which process it was: "pid <pid> at <address> on <host>".
        claim: String,
        /// What this rank was doing then ([`crate::phase`]).
        phase: String,
        /// How long the store heard nothing from it.
        silence: Duration,
    },

    /// Node `node`'s launcher went silent before any of its ranks had joined: the store's
    /// server heard nothing from it for `silence` (our own store only).
    #[error(
        "node {node} ({claim}) went silent while rank {rank} was {phase}: the store heard \
         nothing from it for {silence:?}, not even an answer to the heartbeat, and none of its \
         ranks had joined yet (the node is down, or cut off from the store's network; the \
         store's --heartbeat and --heartbeat-misses set how soon this is said)"
    )]
    NodeSilent {
        /// The rank that stops.
        rank: usize,
        /// The node that went silent.
        node: usize,
        /// Its first rank, the one a launcher's summary blames.
        first_rank: usize,
        /// Who held the node's claim: "its commrun, pid <pid> at <address> on <host>; ranks
        /// <a>-<b>".
        claim: String,
        /// What this rank was doing then ([`crate::phase`]).
        phase: String,
        /// How long the store heard nothing from it.
        silence: Duration,
    },

    /// Node `node`'s launcher ended before any of its ranks had joined: its connection to the
    /// store closed (our own store only).
    #[error(
        "node {node} ({claim}) ended before any of its ranks joined, while rank {rank} was \
         {phase}: its commrun closed its connection to the store (its workers failed or were \
         stopped before they joined; node {node}'s own output says why)"
    )]
    NodeGone {
        /// The rank that stops.
        rank: usize,
        /// The node whose launcher ended.
        node: usize,
        /// Its first rank, the one a launcher's summary blames.
        first_rank: usize,
        /// Who held the node's claim, as for [`CommError::NodeSilent`].
        claim: String,
        /// What this rank was doing then ([`crate::phase`]).
        phase: String,
    },

    /// Rank `rank` refused a connection to its peer port from `from`: it came from another run
    /// (`their_run` differs from `our_run`), from a job of another size, or claimed a rank that
    /// is already connected or cannot connect to this one. Another job is most likely using the
    /// same rendezvous port. Run ids are compared only when both sides have one (ranks started
    /// by hand have none).
    #[error("{}", foreign_peer_message(*.rank, .from, *.claimed, .their_run.as_deref(), .our_run.as_deref(), *.their_world, *.our_world))]
    ForeignPeer {
        /// The rank that refused the connection.
        rank: usize,
        /// The `host:port` the connection came from.
        from: String,
        /// The rank the connection said it was.
        claimed: usize,
        /// The run id it gave, if any.
        their_run: Option<String>,
        /// This rank's run id, if any.
        our_run: Option<String>,
        /// The world size it gave.
        their_world: usize,
        /// This job's world size.
        our_world: usize,
    },

    /// A peer broke the protocol or disagreed on sizes.
    #[error("{0}")]
    Peer(String),

    /// The requested backend cannot run here.
    #[error("{0}")]
    Backend(String),
}

/// The sentence of [`CommError::ForeignPeer`]: which fact differs, and what to do.
fn foreign_peer_message(
    rank: usize,
    from: &str,
    claimed: usize,
    their_run: Option<&str>,
    our_run: Option<&str>,
    their_world: usize,
    our_world: usize,
) -> String {
    const FIX: &str = "give each job its own MASTER_PORT (or let commrun, torchrun or srun \
                       choose one)";
    let what = match (their_run, our_run) {
        (Some(theirs), Some(ours)) if theirs != ours => format!(
            "rank {claimed} of run '{theirs}', but this is run '{ours}': \
             two jobs are meeting on the same port"
        ),
        _ if their_world != our_world => format!(
            "rank {claimed} of a job of {their_world} ranks, but this job has {our_world}: \
             two jobs are meeting on the same port, or the ranks disagree on WORLD_SIZE"
        ),
        _ if claimed >= our_world => {
            format!("rank {claimed}, which is outside this job of {our_world} ranks")
        }
        _ if claimed == rank => format!(
            "rank {claimed}, this rank's own: \
             two ranks were given the same RANK, or two jobs are meeting on the same port"
        ),
        _ => format!(
            "rank {claimed}, which is already connected: two jobs are meeting on the same port, \
             or two ranks were given RANK={claimed}"
        ),
    };
    format!("rank {rank} refused a peer connection from {from} claiming to be {what}; {FIX}")
}

/// Ranks as a message lists them: runs of three or more as ranges, and at most 16 items, so a
/// thousand missing ranks make one short line (`0, 2, 5-699, … (40 more)`); "none" when empty.
pub fn rank_list(ranks: impl IntoIterator<Item = usize>) -> String {
    const SHOWN: usize = 16;
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for r in ranks {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == r => *end = r,
            _ => runs.push((r, r)),
        }
    }
    let mut items: Vec<String> = Vec::new();
    for &(start, end) in &runs {
        match end - start {
            0 => items.push(start.to_string()),
            1 => items.extend([start.to_string(), end.to_string()]),
            _ => items.push(format!("{start}-{end}")),
        }
    }
    if items.is_empty() {
        return "none".into();
    }
    let more = items.len().saturating_sub(SHOWN);
    items.truncate(SHOWN);
    let mut text = items.join(", ");
    if more > 0 {
        text.push_str(&format!(", … ({more} more)"));
    }
    text
}

/// The rank that serves the rendezvous store (see [`crate::store::StoreServer`]).
const STORE_RANK: usize = 0;

impl CommError {
    /// The exit code of a program this error stops before any rank starts: 2 for a usage error
    /// (a flag or variable that cannot be obeyed, as clap and torchrun exit on a bad flag), 1
    /// for anything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            CommError::Usage(_) | CommError::Env { .. } => 2,
            _ => 1,
        }
    }

    /// Wraps an I/O error with the place it happened.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        CommError::Io {
            context: context.into(),
            source,
        }
    }

    /// An environment error about `var`; `message` is the whole sentence.
    pub fn env(var: impl Into<String>, message: impl Into<String>) -> Self {
        CommError::Env {
            var: var.into(),
            message: message.into(),
        }
    }

    /// The rank this error says failed first, so a launcher can follow the blame to the root
    /// cause: the peer that closed its connection, is gone, could not be reached, or the one
    /// rank a timeout waited for; rank 0 when the store it serves was lost or never answered.
    /// A refusal by the store (another run, a duplicate rank, disagreeing world sizes, a bound)
    /// blames no rank: the launch is at fault, not a failed process.
    pub fn blamed_rank(&self) -> Option<usize> {
        match self {
            CommError::PeerClosed { peer, .. }
            | CommError::PeerSilent { peer, .. }
            | CommError::PeerGone { peer, .. }
            | CommError::PeerUnreachable { peer, .. } => Some(*peer),
            CommError::Timeout { missing, .. } if missing.len() == 1 => Some(missing[0]),
            CommError::JobAborted { by, .. } => Some(*by),
            CommError::RankVanished { gone, .. } | CommError::RankSilent { gone, .. } => {
                Some(*gone)
            }
            CommError::NodeSilent { first_rank, .. } | CommError::NodeGone { first_rank, .. } => {
                Some(*first_rank)
            }
            CommError::StoreUnreachable { .. }
            | CommError::StoreLost { .. }
            | CommError::StoreSilent { .. } => Some(STORE_RANK),
            _ => None,
        }
    }

    /// The ranks a timeout waited for and that never came (empty for other errors).
    pub fn missing_ranks(&self) -> &[usize] {
        match self {
            CommError::Timeout { missing, .. } => missing,
            _ => &[],
        }
    }

    /// The store endpoint (`host:port`) this rank lost or never reached, so a multi-node summary
    /// can point at the node serving it.
    pub fn lost_store(&self) -> Option<&str> {
        match self {
            CommError::StoreUnreachable { endpoint, .. }
            | CommError::StoreLost { endpoint, .. }
            | CommError::StoreSilent { endpoint, .. } => Some(endpoint),
            _ => None,
        }
    }

    /// A short, stable name for the kind of error, for machine-readable failure records.
    pub fn kind(&self) -> &'static str {
        match self {
            CommError::Env { .. } => "env",
            CommError::Usage(_) => "usage",
            CommError::Timeout { .. } => "timeout",
            CommError::Io { .. } => "io",
            CommError::PeerClosed { .. } => "peer_closed",
            CommError::PeerSilent { .. } => "peer_silent",
            CommError::PeerGone { .. } => "peer_gone",
            CommError::PeerUnreachable { .. } => "peer_unreachable",
            CommError::StoreUnreachable { .. } => "store_unreachable",
            CommError::StoreLost { .. } => "store_lost",
            CommError::StoreSilent { .. } => "store_silent",
            CommError::ForeignRank { .. } => "foreign_rank",
            CommError::DuplicateRank { .. } => "duplicate_rank",
            CommError::WorldSizeMismatch { .. } => "world_size_mismatch",
            CommError::StoreLimit { .. } => "store_limit",
            CommError::ForeignPeer { .. } => "foreign_peer",
            CommError::JobAborted { .. } => "job_aborted",
            CommError::RankVanished { .. } => "rank_vanished",
            CommError::RankSilent { .. } => "rank_silent",
            CommError::NodeSilent { .. } => "node_silent",
            CommError::NodeGone { .. } => "node_gone",
            CommError::Peer(_) => "peer",
            CommError::Backend(_) => "backend",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_lists_stay_short() {
        assert_eq!(rank_list([2, 3]), "2, 3");
        assert_eq!(rank_list([0, 2, 3, 4, 9]), "0, 2-4, 9");
        assert_eq!(rank_list([]), "none");
        assert_eq!(rank_list(1..700), "1-699");
        let scattered = rank_list((0..1000).step_by(2));
        assert!(scattered.ends_with(", … (484 more)"), "{scattered}");
        assert!(scattered.len() < 120, "{scattered}");
    }

    fn io() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused")
    }

    #[test]
    fn silence_names_the_rank_its_node_and_the_phase() {
        let e = CommError::PeerSilent {
            rank: 0,
            peer: 3,
            host: "node1".into(),
            doing: "receiving from",
            silence: Duration::from_secs(15),
            phase: "in all_reduce".into(),
        };
        assert!(e.to_string().starts_with(
            "rank 3 (on node1) went silent while rank 0 was receiving from it, in all_reduce: \
             nothing heard from it for 15s"
        ));
        assert_eq!((e.blamed_rank(), e.kind()), (Some(3), "peer_silent"));
        let e = CommError::StoreSilent {
            rank: 2,
            endpoint: "node0:29500".into(),
            silence: Duration::from_secs(15),
            phase: "in a barrier".into(),
        };
        assert!(e.to_string().starts_with(
            "rank 2 heard nothing from the rendezvous store at node0:29500 (rank 0's node) for \
             15s while it was in a barrier"
        ));
        assert_eq!(e.blamed_rank(), Some(0));
        assert_eq!(e.lost_store(), Some("node0:29500"));
        let e = CommError::RankSilent {
            rank: 0,
            gone: 2,
            claim: "pid 7 at 10.0.0.2:4 on node1".into(),
            phase: "in all_reduce".into(),
            silence: Duration::from_secs(15),
        };
        assert!(e.to_string().starts_with(
            "rank 2 (pid 7 at 10.0.0.2:4 on node1) went silent while rank 0 was in all_reduce"
        ));
        assert_eq!((e.blamed_rank(), e.kind()), (Some(2), "rank_silent"));
    }

    #[test]
    fn the_sentences_stay_and_the_facts_are_fields() {
        let e = CommError::PeerClosed {
            rank: 2,
            peer: 1,
            doing: "receiving from",
        };
        assert_eq!(
            e.to_string(),
            "rank 1 closed its connection while rank 2 was receiving from it \
             (it probably failed: look at its output)"
        );
        assert_eq!(e.blamed_rank(), Some(1));
        assert_eq!(e.lost_store(), None);

        let e = CommError::PeerGone { rank: 0, peer: 3 };
        assert_eq!(e.to_string(), "rank 3 is gone (its thread ended)");
        assert_eq!(e.blamed_rank(), Some(3));

        let e = CommError::StoreLost {
            rank: 3,
            endpoint: "h0:29500".into(),
            key: "k".into(),
            source: io(),
        };
        assert_eq!(
            e.to_string(),
            "rank 3 lost the rendezvous store at h0:29500 during 'k' (did rank 0 exit or fail?): \
             refused"
        );
        assert_eq!(e.lost_store(), Some("h0:29500"));
        assert_eq!(e.blamed_rank(), Some(0));

        let e = CommError::StoreUnreachable {
            rank: 1,
            endpoint: "h0:1".into(),
            timeout: Duration::from_secs(3),
            source: io(),
        };
        assert!(e.to_string().starts_with(
            "rank 1 could not reach the rendezvous store at h0:1 within 3s (is rank 0"
        ));
        assert_eq!(e.lost_store(), Some("h0:1"));

        let e = CommError::Timeout {
            what: "barrier 'b' on rank 1".into(),
            timeout: Duration::from_secs(4),
            detail: "; missing: ranks 2, 3".into(),
            missing: vec![2, 3],
        };
        assert_eq!(
            e.to_string(),
            "timed out after 4s waiting for barrier 'b' on rank 1; missing: ranks 2, 3"
        );
        assert_eq!(e.missing_ranks(), [2, 3]);
        assert_eq!(
            e.blamed_rank(),
            None,
            "two missing ranks: no single culprit"
        );

        let e = CommError::env("RANK", "RANK is not set");
        assert_eq!(e.to_string(), "environment: RANK is not set");
        assert_eq!(e.kind(), "env");
    }
}
