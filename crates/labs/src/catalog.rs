//! The labs: each one's number, title, the file the student edits, the rank counts its cases
//! run on, and its page in the book, where its hints are (the checker prints the first for a lab
//! not written yet: the hints live in one place, the page).

use comm_core::backend::cpu::Algo;
use comm_core::Collective;

/// One lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lab {
    /// 1: ping-pong, and the α–β model fitted by hand.
    PingPong,
    /// 2: broadcast as a binomial tree, from send and recv.
    Broadcast,
    /// 3: the ring all-reduce, from send_recv.
    AllReduce,
    /// 4: all-gather and reduce-scatter as rings.
    Rings,
    /// 5: DDP by hand: naive, flattened, bucketed and overlapped.
    Ddp,
    /// 6: ZeRO-1, SGD's momentum sharded.
    Zero,
    /// 7: a deadlock to find.
    Deadlock,
    /// 8: a mesh's data-parallel and tensor-parallel groups, with split.
    Groups,
}

/// Ranks of the timing and of `--steps` when `-n` does not say (lab 1 times ranks 0 and 1).
pub const DEFAULT_RANKS: usize = comm_core::launch::DEFAULT_CPU_RANKS;

impl Lab {
    /// Every lab, in the book's order.
    pub const ALL: [Lab; 8] = [
        Lab::PingPong,
        Lab::Broadcast,
        Lab::AllReduce,
        Lab::Rings,
        Lab::Ddp,
        Lab::Zero,
        Lab::Deadlock,
        Lab::Groups,
    ];

    /// The lab numbered `n`.
    pub fn numbered(n: usize) -> Option<Lab> {
        Lab::ALL.into_iter().find(|lab| lab.number() == n)
    }

    /// Its number, as `cargo lab N` names it.
    pub fn number(self) -> usize {
        match self {
            Lab::PingPong => 1,
            Lab::Broadcast => 2,
            Lab::AllReduce => 3,
            Lab::Rings => 4,
            Lab::Ddp => 5,
            Lab::Zero => 6,
            Lab::Deadlock => 7,
            Lab::Groups => 8,
        }
    }

    /// What the student writes.
    pub fn title(self) -> &'static str {
        match self {
            Lab::PingPong => "ping-pong and the α–β model",
            Lab::Broadcast => "binomial-tree broadcast",
            Lab::AllReduce => "ring all-reduce",
            Lab::Rings => "all-gather and reduce-scatter rings",
            Lab::Ddp => "DDP by hand",
            Lab::Zero => "ZeRO-1: the optimizer's state sharded",
            Lab::Deadlock => "a deadlock to find",
            Lab::Groups => "data-parallel and tensor-parallel groups",
        }
    }

    /// The file the student edits, from the repository's root.
    pub fn file(self) -> &'static str {
        match self {
            Lab::PingPong => "crates/labs/src/lab1_ping_pong.rs",
            Lab::Broadcast => "crates/labs/src/lab2_tree_broadcast.rs",
            Lab::AllReduce => "crates/labs/src/lab3_ring_all_reduce.rs",
            Lab::Rings => "crates/labs/src/lab4_rings.rs",
            Lab::Ddp => "crates/labs/src/lab5_ddp.rs",
            Lab::Zero => "crates/labs/src/lab6_zero.rs",
            Lab::Deadlock => "crates/labs/src/lab7_deadlock.rs",
            Lab::Groups => "crates/labs/src/lab8_groups.rs",
        }
    }

    /// The rank counts its cases run on when `-n` does not pick one.
    pub fn rank_counts(self) -> &'static [usize] {
        match self {
            Lab::PingPong => &[2, 3],
            Lab::Broadcast | Lab::AllReduce | Lab::Rings => &[2, 3, 4, 5, 8],
            Lab::Ddp | Lab::Zero | Lab::Deadlock => &[2, 3, 4],
            Lab::Groups => &[4, 6, 8],
        }
    }

    /// Whether it is one of the collectives written from send and recv (labs 2 to 4), whose
    /// cases are [`crate::cases`]'s and whose steps `--steps` shows.
    pub fn is_collective(self) -> bool {
        matches!(self, Lab::Broadcast | Lab::AllReduce | Lab::Rings)
    }

    /// Whether a right run is then timed beside the library's (lab 7 runs a given program, and
    /// lab 8's groups are the library's communicators: nothing of the student's to time).
    pub fn is_timed(self) -> bool {
        !matches!(self, Lab::Deadlock | Lab::Groups)
    }

    /// Its `--timeout` unless given: short, so that a hang is found soon; long enough for 8
    /// ranks on 2 busy cores. Lab 7 hangs on purpose: 5 seconds.
    pub fn timeout(self) -> f64 {
        match self {
            Lab::Deadlock => 5.0,
            _ => 20.0,
        }
    }

    /// The library's collectives it is compared with (what `--algo` may choose for).
    pub fn collectives(self) -> &'static [Collective] {
        match self {
            Lab::PingPong | Lab::Broadcast => &[Collective::Broadcast],
            Lab::AllReduce | Lab::Ddp | Lab::Groups => &[Collective::AllReduce],
            Lab::Rings | Lab::Zero => &[Collective::AllGather, Collective::ReduceScatter],
            Lab::Deadlock => &[Collective::Reduce, Collective::Broadcast],
        }
    }

    /// The library's algorithm that does what the student's does: the timing runs it, and the
    /// α–β model predicts it.
    pub fn algo(self) -> Algo {
        match self {
            Lab::PingPong | Lab::Broadcast | Lab::Deadlock => Algo::Tree,
            _ => Algo::Ring,
        }
    }

    /// The lab's page in the book, from `docs/src`: named as its file, `lab3-ring-all-reduce.md`.
    pub fn page_path(self) -> String {
        let stem = self.file().rsplit('/').next().unwrap_or_default();
        stem.replace(".rs", ".md").replace('_', "-")
    }

    fn page(self) -> &'static str {
        match self {
            Lab::PingPong => include_str!("../../../docs/src/lab1-ping-pong.md"),
            Lab::Broadcast => include_str!("../../../docs/src/lab2-tree-broadcast.md"),
            Lab::AllReduce => include_str!("../../../docs/src/lab3-ring-all-reduce.md"),
            Lab::Rings => include_str!("../../../docs/src/lab4-rings.md"),
            Lab::Ddp => include_str!("../../../docs/src/lab5-ddp.md"),
            Lab::Zero => include_str!("../../../docs/src/lab6-zero.md"),
            Lab::Deadlock => include_str!("../../../docs/src/lab7-deadlock.md"),
            Lab::Groups => include_str!("../../../docs/src/lab8-groups.md"),
        }
    }

    /// The page's hints, in order: the text of each `<details><summary>Hint …</summary>` block.
    pub fn hints(self) -> Vec<String> {
        let mut hints = Vec::new();
        let mut rest = self.page();
        while let Some((_, after)) = rest.split_once("<summary>Hint") {
            let body = after.split_once("</summary>").map_or("", |(_, b)| b);
            let (text, next) = body.split_once("</details>").unwrap_or((body, ""));
            hints.push(unwrap_paragraphs(text));
            rest = next;
        }
        hints
    }
}

/// Markdown text as lines for a terminal: paragraphs joined into one line each, blank lines kept.
fn unwrap_paragraphs(text: &str) -> String {
    let paragraphs: Vec<String> = text
        .trim()
        .split("\n\n")
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    paragraphs.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lab_has_hints_and_its_file() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../");
        for lab in Lab::ALL {
            assert_eq!(Lab::numbered(lab.number()), Some(lab));
            assert!(!lab.hints().is_empty(), "lab {}: no hint", lab.number());
            assert!(
                std::path::Path::new(root).join(lab.file()).is_file(),
                "{}",
                lab.file()
            );
        }
    }
}
