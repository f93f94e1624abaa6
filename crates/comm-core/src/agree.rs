//! One backend for the whole job where a rank may fall back: `--backend auto` in example 03 runs
//! NCCL "where it can", and "where" must be the job's answer, not each rank's. A rank that falls
//! back alone leaves the others inside NCCL waiting for it until their timeout (300 s by
//! default); so every rank posts to the store whether it got the backend, reads every other
//! rank's post, and all use it only if all got it. Otherwise all leave it, and each says which
//! rank could not, on which host, and why.
//!
//! Two rounds for NCCL ([`Job::agreed_communicator`]): first whether each rank *can* try
//! (its selection found a GPU and libnccl, and it has a GPU of its own), so that no rank enters
//! NCCL's collective init unless every rank will; then whether the communicator was built, so
//! that a rank whose init failed takes the others off NCCL with it. A failure inside NCCL's init
//! that leaves the other ranks inside `ncclCommInitRank` is not seen by them until the
//! backend's own init deadline: NCCL's init is collective, and only the backend can end it.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::{nccl, BackendChoice, BackendKind};
use crate::comm::Communicator;
use crate::error::Result;
use crate::job::Job;
use crate::store::Store;

/// What a rank posts when it got the backend.
const OK: &str = "ok";

/// One rank that did not get the backend: who, where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The rank.
    pub rank: usize,
    /// Its host.
    pub host: String,
    /// Why it could not, in its own words.
    pub reason: String,
}

/// Why the job leaves a backend: the ranks that could not use it, in rank order (never empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disagreement {
    /// Every rank that could not.
    pub refusals: Vec<Refusal>,
    /// How many ranks the job has.
    pub world_size: usize,
}

impl Disagreement {
    /// The reason in one line, for `backend` (`"NCCL"`): every rank for the same reason is
    /// `NCCL cannot run here: REASON` (the line a CPU-only machine has always shown); otherwise
    /// the first rank that could not is named with its host, and the others counted.
    pub fn describe(&self, backend: &str) -> String {
        let first = &self.refusals[0];
        let everyone = self.refusals.len() == self.world_size;
        if everyone && self.refusals.iter().all(|r| r.reason == first.reason) {
            return format!("{backend} cannot run here: {}", first.reason);
        }
        let others = match self.refusals.len() - 1 {
            0 => String::new(),
            1 => " (and 1 other rank)".to_string(),
            n => format!(" (and {n} other ranks)"),
        };
        format!(
            "{backend} cannot run on rank {} (host {}): {}{others}; every rank of the job takes \
             the CPU path instead",
            first.rank, first.host, first.reason
        )
    }
}

/// Each agreement of a process gets keys of its own; every rank makes the same agreements in the
/// same order, so the n-th of every rank meets under the same keys.
static AGREEMENTS: AtomicU64 = AtomicU64::new(0);

/// The next agreement's scope in the store.
pub fn next_scope() -> String {
    format!("agree{}", AGREEMENTS.fetch_add(1, Ordering::SeqCst))
}

/// Every rank of the job calls it with what it got (`mine`: its value, or why not): posts
/// whether it got it under `scope`/`round`, reads every rank's post (waiting up to the store's
/// timeout; a rank that dies meanwhile ends the job through the store's watcher), and returns
/// its value only if every rank got one, else the disagreement, the same on every rank. The
/// value of a rank is dropped when another rank failed.
pub fn agree<T>(
    store: &Store,
    scope: &str,
    round: &str,
    host: &str,
    mine: std::result::Result<T, String>,
) -> Result<std::result::Result<T, Disagreement>> {
    let scoped = store.scoped(scope);
    let post = match &mine {
        Ok(_) => OK.to_string(),
        // A tab cannot be in a host name; the reason may hold anything.
        Err(reason) => format!("no\t{host}\t{reason}"),
    };
    let (rank, world_size) = (store.rank(), store.world_size());
    scoped.set_at(round, rank, post.as_bytes())?;
    let posts = scoped.get_at(round, 0..world_size)?;
    let refusals: Vec<Refusal> = posts
        .iter()
        .enumerate()
        .filter_map(|(rank, post)| refusal(rank, &String::from_utf8_lossy(post)))
        .collect();
    Ok(match refusals.is_empty() {
        true => Ok(mine.map_err(|_| ()).expect("this rank posted ok")),
        false => Err(Disagreement {
            refusals,
            world_size,
        }),
    })
}

/// Rank `rank`'s post read back: None when it got the backend.
fn refusal(rank: usize, post: &str) -> Option<Refusal> {
    if post == OK {
        return None;
    }
    let mut parts = post.splitn(3, '\t').skip(1);
    Some(Refusal {
        rank,
        host: parts.next().unwrap_or("?").to_string(),
        reason: parts.next().unwrap_or(post).to_string(),
    })
}

impl Job {
    /// A communicator of `choice` if every rank of the job can have one, else why not (in one
    /// line, naming the rank that could not): the whole job's choice, agreed through the store,
    /// where [`Job::communicator`] fails on the rank that cannot and leaves the others to wait.
    /// Every rank must call it, in the same order as its other communicators. What example 03
    /// does for `--backend auto`'s NCCL half.
    pub fn agreed_communicator(
        &self,
        choice: BackendChoice,
    ) -> Result<std::result::Result<Communicator, String>> {
        let scope = next_scope();
        let host = crate::host::hostname();
        let name = match choice {
            BackendChoice::Cpu => "the CPU backend",
            _ => "NCCL",
        };
        // Round 1: can this rank try? Nobody enters NCCL's collective init unless all will.
        let can = self.can_try(choice);
        if let Err(no) = agree(self.store(), &scope, "can", &host, can)? {
            return Ok(Err(no.describe(name)));
        }
        // Round 2: did it work? A rank whose build failed takes every rank off it.
        let built = self.communicator(choice).map_err(|e| e.to_string());
        Ok(agree(self.store(), &scope, "built", &host, built)?.map_err(|no| no.describe(name)))
    }

    /// Whether this rank can try to build a communicator of `choice`, from what it found at
    /// launch (no side effects, nothing collective).
    fn can_try(&self, choice: BackendChoice) -> std::result::Result<(), String> {
        let selection = match choice == BackendChoice::Cpu {
            true => return Ok(()),
            false => self.selection(),
        };
        match selection.kind {
            BackendKind::Cpu if choice == BackendChoice::Nccl => Err(selection.reason.clone()),
            BackendKind::Cpu => Ok(()),
            BackendKind::Nccl => nccl::device_for(self.topology().local_rank, selection.gpus)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no(rank: usize, host: &str, reason: &str) -> Refusal {
        Refusal {
            rank,
            host: host.into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn a_post_reads_back_as_who_where_and_why() {
        assert_eq!(refusal(3, OK), None);
        assert_eq!(
            refusal(
                1,
                "no\tnode7\tNCCL error: unhandled cuda error\t(tab inside)"
            ),
            Some(no(
                1,
                "node7",
                "NCCL error: unhandled cuda error\t(tab inside)"
            ))
        );
    }

    #[test]
    fn the_reason_names_the_rank_unless_every_rank_has_the_same_one() {
        let same = Disagreement {
            refusals: vec![
                no(0, "a", "no CUDA driver found"),
                no(1, "b", "no CUDA driver found"),
            ],
            world_size: 2,
        };
        assert_eq!(
            same.describe("NCCL"),
            "NCCL cannot run here: no CUDA driver found"
        );
        let one = Disagreement {
            refusals: vec![no(1, "b", "no GPU visible to this rank")],
            world_size: 2,
        };
        assert_eq!(
            one.describe("NCCL"),
            "NCCL cannot run on rank 1 (host b): no GPU visible to this rank; every rank of the \
             job takes the CPU path instead"
        );
        let several = Disagreement {
            refusals: vec![no(2, "c", "x"), no(3, "c", "y"), no(5, "d", "x")],
            world_size: 8,
        };
        assert!(several
            .describe("NCCL")
            .starts_with("NCCL cannot run on rank 2 (host c): x (and 2 other ranks);"));
    }
}
