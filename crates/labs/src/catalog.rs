//! The labs: each one's number, title, the file the student edits, the rank counts its cases
//! run on, and its page in the book, where its hints are (the checker prints the first for a lab
//! not written yet: the hints live in one place, the page).

use comm_core::backend::cpu::Algo;
use comm_core::Collective;

/// One lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lab {
    /// 2: broadcast as a binomial tree, from send and recv.
    Broadcast,
    /// 3: the ring all-reduce, from send_recv.
    AllReduce,
    /// 4: all-gather and reduce-scatter as rings.
    Rings,
}

/// The rank counts a lab's cases run on when `-n` does not pick one.
pub const RANK_COUNTS: [usize; 5] = [2, 3, 4, 5, 8];

/// Ranks of the timing and of `--steps` when `-n` does not say.
pub const DEFAULT_RANKS: usize = comm_core::launch::DEFAULT_CPU_RANKS;

impl Lab {
    /// Every lab, in the book's order.
    pub const ALL: [Lab; 3] = [Lab::Broadcast, Lab::AllReduce, Lab::Rings];

    /// The lab numbered `n`.
    pub fn numbered(n: usize) -> Option<Lab> {
        Lab::ALL.into_iter().find(|lab| lab.number() == n)
    }

    /// Its number, as `cargo lab N` names it.
    pub fn number(self) -> usize {
        match self {
            Lab::Broadcast => 2,
            Lab::AllReduce => 3,
            Lab::Rings => 4,
        }
    }

    /// What the student writes.
    pub fn title(self) -> &'static str {
        match self {
            Lab::Broadcast => "binomial-tree broadcast",
            Lab::AllReduce => "ring all-reduce",
            Lab::Rings => "all-gather and reduce-scatter rings",
        }
    }

    /// The file the student edits, from the repository's root.
    pub fn file(self) -> &'static str {
        match self {
            Lab::Broadcast => "crates/labs/src/lab2_tree_broadcast.rs",
            Lab::AllReduce => "crates/labs/src/lab3_ring_all_reduce.rs",
            Lab::Rings => "crates/labs/src/lab4_rings.rs",
        }
    }

    /// The library's collectives it is compared with (what `--algo` may choose for).
    pub fn collectives(self) -> &'static [Collective] {
        match self {
            Lab::Broadcast => &[Collective::Broadcast],
            Lab::AllReduce => &[Collective::AllReduce],
            Lab::Rings => &[Collective::AllGather, Collective::ReduceScatter],
        }
    }

    /// The library's algorithm that does what the student's does: the timing runs it, and the
    /// α–β model predicts it.
    pub fn algo(self) -> Algo {
        match self {
            Lab::Broadcast => Algo::Tree,
            Lab::AllReduce | Lab::Rings => Algo::Ring,
        }
    }

    /// The lab's page in the book, from `docs/src`.
    pub fn page_path(self) -> String {
        format!("labs/lab{}.md", self.number())
    }

    fn page(self) -> &'static str {
        match self {
            Lab::Broadcast => include_str!("../../../docs/src/labs/lab2.md"),
            Lab::AllReduce => include_str!("../../../docs/src/labs/lab3.md"),
            Lab::Rings => include_str!("../../../docs/src/labs/lab4.md"),
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
