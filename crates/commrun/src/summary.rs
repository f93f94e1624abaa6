//! The root-cause summary printed when a worker fails: which rank, how it ended, its last words,
//! and, when those words point at ranks of another node or at the store on node 0, which node
//! that is: on a multi-node job the error seen here is often the echo of a node lost elsewhere.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::os::unix::process::ExitStatusExt;

use comm_core::spawn::{Failure, SpawnPlan};

/// The lines commrun prints to stderr after `failure` ended the job on this node.
pub fn root_cause(failure: &Failure, plan: &SpawnPlan, host: &str) -> String {
    let nproc = plan.nproc_per_node;
    let mut out = String::new();
    let _ = writeln!(out, "commrun: error: {}", failure.describe());
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
    for hint in node_hints(&failure.last_stderr, failure.rank, plan) {
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

/// Names the other nodes that the failed rank's last lines point at.
pub fn node_hints(lines: &[String], failed_rank: usize, plan: &SpawnPlan) -> Vec<String> {
    let nproc = plan.nproc_per_node;
    let world = nproc * plan.nnodes;
    let mut hints = Vec::new();
    if plan.nnodes < 2 {
        return hints;
    }
    let text = lines.join("\n");
    let store_gone = text.contains("could not reach the rendezvous store")
        || text.contains("lost the rendezvous store");
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
    let mut nodes = BTreeSet::new();
    for line in lines {
        for rank in mentioned_ranks(line) {
            if rank < world && rank != failed_rank && rank / nproc != plan.node_rank {
                nodes.insert(rank / nproc);
            }
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

/// The rank numbers a line names: `rank 3`, `ranks 2, 3`, `never connected: 2, 3`.
pub fn mentioned_ranks(line: &str) -> Vec<usize> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut ranks = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let word = words[i].to_ascii_lowercase();
        let introduces = matches!(word.as_str(), "rank" | "ranks" | "connected:" | "missing:");
        i += 1;
        if !introduces {
            continue;
        }
        if words.get(i) == Some(&"ranks") {
            i += 1;
        }
        while let Some(word) = words.get(i) {
            let number = word.trim_end_matches([',', ';', ':', ')', '.']);
            let Ok(rank) = number.parse::<usize>() else {
                break;
            };
            ranks.push(rank);
            i += 1;
            if !word.ends_with(',') {
                break;
            }
        }
    }
    ranks
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
        }
    }

    fn lines(text: &[&str]) -> Vec<String> {
        text.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn rank_lists_are_read_from_the_library_messages() {
        assert_eq!(
            mentioned_ranks("(ranks connected to the store: 0, 1 of 4; never connected: 2, 3)"),
            [2, 3]
        );
        assert_eq!(
            mentioned_ranks("; arrived: ranks 0, 1 of 4; missing: ranks 2, 3 (did they fail"),
            [0, 1, 2, 3]
        );
        assert_eq!(
            mentioned_ranks("error: rank 0: rank 2 closed its connection while rank 0 was"),
            [0, 2, 0]
        );
        assert_eq!(mentioned_ranks("Rank 7."), [7]);
        assert!(mentioned_ranks("no ranks here, ranked 3").is_empty());
    }

    #[test]
    fn a_lost_node_is_named() {
        let stderr = lines(&[
            "error: rank 1: timed out after 3s waiting for barrier 'finish' on rank 1; \
             arrived: ranks 0, 1 of 4; missing: ranks 2, 3 (did they fail or start late?)",
        ]);
        let hints = node_hints(&stderr, 1, &plan(2, 0));
        assert_eq!(hints.len(), 1, "{hints:?}");
        assert!(hints[0].contains("node 1 (ranks 2-3)"), "{hints:?}");
        // On one node there is no other node to blame.
        assert!(node_hints(&stderr, 1, &plan(1, 0)).is_empty());
        // Losing the store from node 1 points at node 0.
        let stderr = lines(&["error: rank 3: rank 3 lost the rendezvous store at h0:29500"]);
        let hints = node_hints(&stderr, 3, &plan(2, 1));
        assert_eq!(hints.len(), 1, "{hints:?}");
        assert!(
            hints[0].starts_with("node 0 (ranks 0-1, at h0:29500)"),
            "{hints:?}"
        );
    }

    #[test]
    fn the_summary_names_rank_node_host_status_and_last_lines() {
        let failure = Failure {
            rank: 3,
            status: ExitStatus::from_raw(libc::SIGSEGV),
            last_stderr: lines(&["about to crash"]),
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
    }
}
