//! Splitting a communicator, with NCCL's meaning (`ncclCommSplit`) and torch's uses of it
//! (`new_group`, `split_group`, `init_device_mesh`): every rank of the parent calls
//! [`Communicator::split`] with a color and a key; the ranks of one color form a new
//! communicator, ranked by key, then by their rank in the parent; a rank that passes
//! [`NO_COLOR`] (NCCL_SPLIT_NOCOLOR) takes part and gets none.
//!
//! How: each rank posts its color and key in the store, under the split's own keys
//! (`comm0/split0/post/<rank>`), and reads every rank's: all of them then know every group, and
//! a rank that gave a color NCCL does not define (negative, not -1), or ranks that split for
//! different purposes (two meshes of different shapes), fail at once on every rank, saying which.
//! A rank that never calls split fails the others at their timeout, naming it. Only then does
//! each group come up: on NCCL by `ncclCommSplit` (every rank of the parent, [`NO_COLOR`]
//! ones too), on the CPU with links of its own, connected through the store under the group's
//! prefix (`comm0/split0/1/cpu`), so that its collectives and the parent's can be in flight at
//! once without their bytes meeting.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{Communicator, Engine};
use crate::backend::cpu::link_plan::LinkPlan;
use crate::deadline::Deadline;
use crate::error::{rank_list, CommError, Result};
use crate::store::Scoped;

/// The color of a rank that takes part in a split and joins no group: NCCL's
/// `NCCL_SPLIT_NOCOLOR`, torch's rank left out of every `split_group` list.
pub const NO_COLOR: i32 = -1;

/// One rank's post: what it splits for, its color and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Post {
    /// What every rank must agree on: "split", or a mesh's shape.
    pub what: String,
    /// The group it joins ([`NO_COLOR`]: none).
    pub color: i32,
    /// Its place in the group, before ties by parent rank.
    pub key: i32,
}

impl Post {
    fn encode(&self) -> String {
        format!("{}\t{}\t{}", self.color, self.key, self.what)
    }

    fn decode(text: &str) -> Option<Post> {
        let mut parts = text.splitn(3, '\t');
        let color = parts.next()?.parse().ok()?;
        let key = parts.next()?.parse().ok()?;
        let what = parts.next()?.to_string();
        Some(Post { what, color, key })
    }
}

/// Every rank's post, checked the same way on every rank: the first disagreement, named.
pub(crate) fn check_posts(posts: &[Post]) -> std::result::Result<(), String> {
    let bad: Vec<String> = (posts.iter().enumerate())
        .filter(|(_, p)| p.color < 0 && p.color != NO_COLOR)
        .map(|(r, p)| format!("rank {r} gave color {}", p.color))
        .collect();
    if !bad.is_empty() {
        return Err(format!(
            "{}: a color is 0 or more, or NO_COLOR ({NO_COLOR}, NCCL_SPLIT_NOCOLOR) for a rank \
             that joins no group",
            bad.join(", ")
        ));
    }
    let first = &posts[0].what;
    if let Some(other) = posts.iter().position(|p| &p.what != first) {
        return Err(format!(
            "rank 0 splits for {first} but rank {other} for {}: every rank must make the same \
             splits in the same order (give every rank the same flags)",
            posts[other].what
        ));
    }
    Ok(())
}

/// Where `rank` lands: (its rank in its group, the group's size), NCCL's order (key, then
/// parent rank); `None` for [`NO_COLOR`].
pub(crate) fn seat_of(posts: &[Post], rank: usize) -> Option<(usize, usize)> {
    let color = posts[rank].color;
    if color == NO_COLOR {
        return None;
    }
    let mut members: Vec<usize> = (0..posts.len())
        .filter(|&r| posts[r].color == color)
        .collect();
    members.sort_by_key(|&r| (posts[r].key, r));
    let at = members.iter().position(|&r| r == rank)?;
    Some((at, members.len()))
}

impl Communicator {
    /// Splits this communicator as `ncclCommSplit(comm, color, key, &new, NULL)` does: every rank
    /// of it must call this, the same splits in the same order. Ranks that pass the same `color`
    /// (0 or more) form a new communicator, ranked by `key`, ties by their rank here; a rank that
    /// passes [`NO_COLOR`] gets `None`. Its group is named `group <color>`
    /// ([`group_name`](Self::group_name)). On the CPU the group has links of its own: its calls
    /// and this communicator's may run at the same time (from two threads, or an
    /// [`AsyncComm`](crate::AsyncComm) and this thread).
    ///
    /// Errors, on every rank: a negative color other than [`NO_COLOR`] (at once, naming the
    /// rank); ranks that split for different purposes (at once); a rank that never calls split
    /// (at the timeout, naming it).
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Communicator>> {
        self.split_for("split", "group", color, key)
    }

    /// [`split`](Self::split), for `what` (every rank must give the same: a mesh's shape), the
    /// group named `<prefix> <color>` (`tp 0`).
    pub(crate) fn split_for(
        &self,
        what: &str,
        prefix: &str,
        color: i32,
        key: i32,
    ) -> Result<Option<Communicator>> {
        let store = self.store().ok_or_else(|| {
            CommError::Usage("split needs a communicator built by a Job (through the store)".into())
        })?;
        let (name, n) = self.next_split();
        let scope = store.scoped(&format!("{name}/split{n}"));
        let (rank, size) = (self.rank(), self.world_size());
        let ours = Post {
            what: what.to_string(),
            color,
            key,
        };
        scope.set_at("post", rank, ours.encode().as_bytes())?;
        let posts = read_posts(&scope, size).map_err(|e| match e {
            Waited::Missing(timeout, missing) => never_split(name, n, size, timeout, missing),
            Waited::Failed(e) => e,
        })?;
        check_posts(&posts).map_err(|why| CommError::Usage(format!("split of {name}: {why}")))?;
        let seat = seat_of(&posts, rank).unwrap_or((0, 0));
        let group_keys = format!("{name}/split{n}/{}", color.max(0));
        let group = format!("{prefix} {color}");
        self.member((color, key), seat, &group_keys, &group)
    }

    /// Keeps how its links were made (`plan`), so that its splits' groups link up the same way.
    pub(crate) fn with_links(mut self, plan: Arc<LinkPlan>) -> Communicator {
        self.links = Some(plan);
        self
    }

    /// The name of the split's group this communicator is (`tp 0`, `dp 1`), if it is one.
    pub fn group_name(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// Its keys' prefix in the store (`comm0`), and the number of the next split made of it.
    pub(crate) fn next_split(&self) -> (&str, u64) {
        (&self.name, self.splits.fetch_add(1, Ordering::SeqCst))
    }

    /// This rank's communicator in a split every rank agreed on (above): none for a
    /// negative `color` (NCCL still takes part in ncclCommSplit), else group `group`, this rank
    /// at `seat` (rank, size), its keys under `name`: CPU links of its own, or ncclCommSplit's.
    pub(crate) fn member(
        &self,
        (color, key): (i32, i32),
        seat: (usize, usize),
        name: &str,
        group: &str,
    ) -> Result<Option<Communicator>> {
        let needs_a_job = || CommError::Usage("split needs a communicator built by a Job".into());
        let store = self.store.clone().ok_or_else(needs_a_job)?;
        let (engine, line) = match &self.engine {
            Engine::Cpu(_) if color < 0 => return Ok(None),
            Engine::Cpu(_) => {
                let scope = store.scoped(name).among(seat.0, seat.1).scoped("cpu");
                let plan = self.links.as_ref().ok_or_else(needs_a_job)?;
                let linked = plan.connect(&scope, Some(group))?;
                (Engine::Cpu(linked.transport), Some(linked.line))
            }
            Engine::Nccl(nccl) => match nccl.split(color, key, seat)? {
                Some(child) => (Engine::Nccl(Box::new(child)), None),
                None => return Ok(None),
            },
        };
        let comm = Communicator {
            transport_line: line,
            links: self.links.clone(),
            group: Some(group.to_string()),
            algo: self.algo,
            steps: self.steps,
            ..Communicator::new(seat.0, seat.1, self.local_rank, self.device, engine)
        };
        Ok(Some(comm.with_store(store, name)))
    }
}

/// Why the posts could not be read.
enum Waited {
    /// These ranks posted nothing in this long.
    Missing(Duration, Vec<usize>),
    /// The store failed.
    Failed(CommError),
}

/// Every rank's post, waited for at most nine tenths of the store's timeout: a rank that never
/// calls split is most likely inside a call of the parent whose deadline began a moment before
/// ours, and this error (which names it) should reach the user first, not that call's timeout.
fn read_posts(scope: &Scoped, size: usize) -> std::result::Result<Vec<Post>, Waited> {
    let store = scope.store();
    let patience = store.timeout().mul_f64(0.9);
    let deadline = Deadline::after(patience);
    let mut posts = Vec::with_capacity(size);
    for r in 0..size {
        let key = scope.key_at("post", r);
        let left = deadline.remaining().unwrap_or(patience);
        match store.get_within(&key, left) {
            Ok(post) => {
                let post = String::from_utf8_lossy(&post).into_owned();
                let decoded = Post::decode(&post).ok_or_else(|| {
                    CommError::Peer(format!("rank {r} posted {post:?} under {key}"))
                });
                posts.push(decoded.map_err(Waited::Failed)?);
            }
            Err(CommError::Timeout { .. }) => {
                let posted = |r: &usize| store.check(&[&scope.key_at("post", r)]);
                let missing = (r..size).filter(|r| !posted(r).unwrap_or(false));
                return Err(Waited::Missing(patience, missing.collect()));
            }
            Err(e) => return Err(Waited::Failed(e)),
        }
    }
    Ok(posts)
}

/// The error of a rank whose split waited `timeout` for ranks `missing` of `size` that never
/// called it.
fn never_split(
    name: &str,
    n: u64,
    size: usize,
    timeout: Duration,
    missing: Vec<usize>,
) -> CommError {
    let came = (0..size).filter(|r| !missing.contains(r));
    CommError::Timeout {
        what: format!("every rank of {name} to call split (its split {n})"),
        timeout,
        detail: format!(
            "; rank{} {} never did (ranks {} did): every rank of a communicator calls split, the \
             same splits in the same order, and a rank that wants no group passes NO_COLOR (-1)",
            if missing.len() > 1 { "s" } else { "" },
            rank_list(missing.iter().copied()),
            rank_list(came)
        ),
        missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn posts(colors_keys: &[(i32, i32)]) -> Vec<Post> {
        colors_keys
            .iter()
            .map(|&(color, key)| Post {
                what: "split".into(),
                color,
                key,
            })
            .collect()
    }

    /// NCCL's order: by key, ties by parent rank; each color its own group.
    #[test]
    fn ranks_are_ordered_by_key_then_by_parent_rank() {
        let p = posts(&[(0, 5), (1, 0), (0, 1), (1, 0), (0, 1)]);
        assert_eq!(seat_of(&p, 2), Some((0, 3)));
        assert_eq!(seat_of(&p, 4), Some((1, 3)));
        assert_eq!(seat_of(&p, 0), Some((2, 3)));
        assert_eq!(seat_of(&p, 1), Some((0, 2)));
        assert_eq!(seat_of(&p, 3), Some((1, 2)));
    }

    #[test]
    fn a_rank_with_no_color_has_no_seat_and_is_no_member() {
        let p = posts(&[(0, 0), (NO_COLOR, 0), (0, 0)]);
        assert_eq!(seat_of(&p, 1), None);
        assert_eq!(seat_of(&p, 2), Some((1, 2)));
        assert!(check_posts(&p).is_ok());
    }

    #[test]
    fn a_negative_color_other_than_no_color_is_named() {
        let e = check_posts(&posts(&[(0, 0), (-2, 0), (-5, 0)])).unwrap_err();
        assert!(
            e.starts_with("rank 1 gave color -2, rank 2 gave color -5: a color is 0 or more"),
            "{e}"
        );
    }

    #[test]
    fn ranks_that_split_for_different_purposes_are_named() {
        let mut p = posts(&[(0, 0), (0, 1)]);
        p[1].what = "a mesh of dp 1 x tp 2".into();
        let e = check_posts(&p).unwrap_err();
        assert!(
            e.contains("rank 0 splits for split but rank 1 for a mesh"),
            "{e}"
        );
    }

    #[test]
    fn a_post_survives_its_encoding() {
        let p = Post {
            what: "a mesh\tof tabs".into(),
            color: -1,
            key: -7,
        };
        assert_eq!(Post::decode(&p.encode()), Some(p));
        assert_eq!(Post::decode("x\t1\tsplit"), None);
    }
}
