//! The root-cause summary printed when a worker fails: which rank, how it ended, its last words,
//! and, when its error record blames ranks of another node or the store on node 0, which node
//! that is: on a multi-node job the error seen here is often the echo of a node lost elsewhere.
//!
//! The hints come from the fields of the rank's [`ErrorRecord`] (blamed rank, missing ranks,
//! lost store endpoint), never from matching the sentences of its stderr.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::os::unix::process::ExitStatusExt;

use comm_core::spawn::{Failure, SpawnPlan};
use comm_core::ErrorRecord;

/// The lines commrun prints to stderr after `failure` ended the job on this node.
pub fn root_cause(failure: &Failure, plan: &SpawnPlan, host: &str) -> String {
    let nproc = plan.nproc_per_node;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "commrun: error: {}{}",
        failure.describe(),
        failure.others()
    );
    let _ = writeln!(out, "Root cause (first worker to fail on this node):");
    let _ = writeln!(
        out,
        "  rank       : {} (local rank {} of {nproc}, node {} of {}, host {host})",
        failure.rank,
        failure.rank % nproc,
        plan.node_rank,
        plan.nnodes
    );
    let how = match (failure.status.code(), failure.status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!(
            "killed by signal {sig}{}",
            signal_name(sig).map_or(String::new(), |n| format!(" ({n})"))
        ),
        _ => format!("{:?}", failure.status),
    };
    let _ = writeln!(out, "  ended      : {how}");
    if failure.last_stderr.is_empty() {
        let _ = writeln!(out, "  stderr     : (nothing)");
    } else {
        let _ = writeln!(out, "  stderr     : (its last lines)");
        for line in &failure.last_stderr {
            let _ = writeln!(out, "    | {line}");
        }
    }
    for hint in node_hints(failure.record.as_ref(), failure.rank, plan) {
        let _ = writeln!(out, "  hint       : {hint}");
    }
    let _ = write!(
        out,
        "commrun: stopped the other workers of this node (SIGTERM, then SIGKILL after {:?}); \
         exit code {}",
        plan.grace,
        failure.exit_code()
    );
    out
}

/// Names the other nodes that the failed rank's error record points at: the node serving the
/// store it lost, and the nodes of the ranks it blames or waited for in vain.
pub fn node_hints(
    record: Option<&ErrorRecord>,
    failed_rank: usize,
    plan: &SpawnPlan,
) -> Vec<String> {
    let nproc = plan.nproc_per_node;
    let world = nproc * plan.nnodes;
    let mut hints = Vec::new();
    let Some(record) = record else {
        return hints;
    };
    if plan.nnodes < 2 {
        return hints;
    }
    let store_gone = record.store_endpoint.is_some();
    if store_gone && plan.node_rank != 0 {
        hints.push(format!(
            "node 0 (ranks 0-{}, at {}:{}) serves the rendezvous store and could not be reached: \
             it was lost, failed, or has not started (check its output, and that every node \
             was given the same --master-addr and --master-port)",
            nproc - 1,
            plan.master_addr,
            plan.master_port
        ));
    }
    let named = record
        .blamed_rank
        .into_iter()
        .chain(record.missing_ranks.iter().copied());
    let mut nodes = BTreeSet::new();
    for rank in named {
        if rank < world && rank != failed_rank && rank / nproc != plan.node_rank {
            nodes.insert(rank / nproc);
        }
    }
    for node in nodes {
        if node == 0 && store_gone {
            continue;
        }
        let (first, last) = (node * nproc, node * nproc + nproc - 1);
        hints.push(format!(
            "the ranks named above include ranks of node {node} (ranks {first}-{last}): \
             node {node} was lost or never joined (its commrun was killed or failed, or was given \
             another --master-addr/--master-port); its own output says why"
        ));
    }
    hints
}

fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use comm_core::CommError;
    use std::process::ExitStatus;
    use std::time::Duration;

    fn plan(nnodes: usize, node_rank: usize) -> SpawnPlan {
        SpawnPlan {
            program: "p".into(),
            args: vec![],
            nproc_per_node: 2,
            nnodes,
            node_rank,
            master_addr: "h0".into(),
            master_port: 29500,
            prefix_output: true,
            grace: Duration::from_secs(5),
            run_id: None,
        }
    }

    fn lines(text: &[&str]) -> Vec<String> {
        text.iter().map(|s| s.to_string()).collect()
    }

    fn record(rank: usize, error: CommError) -> ErrorRecord {
        ErrorRecord::new(rank, &error)
    }

    fn barrier_timeout(rank: usize, missing: Vec<usize>) -> CommError {
        CommError::Timeout {
            what: format!("barrier 'finish' on rank {rank}"),
            timeout: Duration::from_secs(3),
            detail:
                "; arrived: ranks 0, 1 of 4; missing: ranks 2, 3 (did they fail or start late?)"
                    .into(),
            missing,
        }
    }

    #[test]
    fn a_lost_node_is_named() {
        let timeout = record(1, barrier_timeout(1, vec![2, 3]));
        let hints = node_hints(Some(&timeout), 1, &plan(2, 0));
        assert_eq!(hints.len(), 1, "{hints:?}");
        assert!(hints[0].contains("node 1 (ranks 2-3)"), "{hints:?}");
        // On one node there is no other node to blame; without a record, nothing to read.
        assert!(node_hints(Some(&timeout), 1, &plan(1, 0)).is_empty());
        assert!(node_hints(None, 1, &plan(2, 0)).is_empty());
        // Losing the store from node 1 points at node 0.
        let lost = record(
            3,
            CommError::StoreLost {
                rank: 3,
                endpoint: "h0:29500".into(),
                key: "k".into(),
                source: std::io::ErrorKind::UnexpectedEof.into(),
            },
        );
        let hints = node_hints(Some(&lost), 3, &plan(2, 1));
        assert_eq!(hints.len(), 1, "{hints:?}");
        assert!(
            hints[0].starts_with("node 0 (ranks 0-1, at h0:29500)"),
            "{hints:?}"
        );
    }

    #[test]
    fn the_hints_read_fields_not_sentences() {
        // A peer on node 1 closed its connection: node 1 is named.
        let closed = record(
            0,
            CommError::PeerClosed {
                rank: 0,
                peer: 2,
                doing: "receiving from",
            },
        );
        let hints = node_hints(Some(&closed), 0, &plan(2, 0));
        assert_eq!(hints.len(), 1, "{hints:?}");
        assert!(hints[0].contains("of node 1 (ranks 2-3)"), "{hints:?}");
        // Ranks of this node, and the failed rank itself, name no other node.
        let local = record(1, barrier_timeout(1, vec![0, 1]));
        assert!(node_hints(Some(&local), 1, &plan(2, 0)).is_empty());
        // The record's fields decide, whatever its text says: a message naming node 1's ranks
        // but carrying no rank names no node.
        let mut reworded = record(0, CommError::Usage("ranks 2, 3 are fine".into()));
        assert!(node_hints(Some(&reworded), 0, &plan(2, 0)).is_empty());
        reworded.missing_ranks = vec![3];
        let hints = node_hints(Some(&reworded), 0, &plan(2, 0));
        assert!(hints[0].contains("of node 1 (ranks 2-3)"), "{hints:?}");
    }

    #[test]
    fn the_summary_names_rank_node_host_status_and_last_lines() {
        let failure = Failure {
            rank: 3,
            status: ExitStatus::from_raw(libc::SIGSEGV),
            last_stderr: lines(&["about to crash"]),
            others_failed: 0,
            record: None,
        };
        let text = root_cause(&failure, &plan(2, 1), "lrdn0102");
        assert!(
            text.contains("rank 3 was killed by signal 11 (SIGSEGV)"),
            "{text}"
        );
        assert!(
            text.contains("rank       : 3 (local rank 1 of 2, node 1 of 2, host lrdn0102)"),
            "{text}"
        );
        assert!(text.contains("killed by signal 11 (SIGSEGV)"), "{text}");
        assert!(text.contains("    | about to crash"), "{text}");
        assert!(text.ends_with("exit code 139"), "{text}");
        assert!(!text.contains("also failed"), "{text}");
        let many = Failure {
            others_failed: 699,
            ..failure
        };
        let text = root_cause(&many, &plan(2, 1), "lrdn0102");
        assert!(
            text.contains("rank 3 was killed by signal 11 (SIGSEGV) (699 other ranks also failed)"),
            "{text}"
        );
    }
}
