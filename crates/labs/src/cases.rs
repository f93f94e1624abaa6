//! The cases a collective lab is checked on: beyond the easy one. On each rank count, lengths
//! shorter than the rank count and not divisible by it, every root of a rooted collective, each
//! element type, in place and out of place where the lab has both. Each case is one of the
//! library's own correctness checks ([`check::Case`]): its inputs (small whole numbers, so float
//! sums are exact in any order), its buffers as NCCL lays them out, its result.

use comm_core::check;
use comm_core::{Collective, DType, ReduceOp};

use crate::catalog::Lab;

/// One case: a check of the library's on `ranks` ranks, with an element type.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// Ranks it runs on.
    pub ranks: usize,
    /// The collective, count, root, placement and inputs.
    pub check: check::Case,
    /// The element type.
    pub dtype: DType,
}

impl Case {
    /// `4 ranks, 10 float elements, in place` (`all_gather, 4 ranks, 3 float elements a block,
    /// out of place, root 2` as the lab needs).
    pub fn describe(&self, lab: Lab) -> String {
        let c = &self.check;
        let what = match lab.collectives().len() {
            1 => String::new(),
            _ => format!("{}, ", c.collective),
        };
        let blocked = c.collective.describe().send != c.collective.describe().recv;
        let each = if blocked { " a block" } else { "" };
        let placement = if c.in_place {
            "in place"
        } else {
            "out of place"
        };
        let root = match c.collective.describe().rooted {
            true => format!(", root {}", c.root),
            false => String::new(),
        };
        let s = if c.count == 1 { "" } else { "s" };
        format!(
            "{what}{} ranks, {} {} element{s}{each}, {placement}{root}",
            self.ranks, c.count, self.dtype
        )
    }
}

/// The element counts a lab tries (per block where the buffers are blocked): shorter than the
/// rank count, not divisible by it, and long.
fn counts(lab: Lab) -> &'static [usize] {
    match lab {
        Lab::Broadcast => &[1, 5, 1001],
        Lab::AllReduce => &[1, 3, 10, 1001],
        Lab::Rings => &[1, 3, 100],
        _ => &[],
    }
}

/// Whether the lab's function(s) for `collective` come in place (true) and out of place.
fn placements(lab: Lab) -> &'static [bool] {
    match lab {
        Lab::Rings => &[true, false],
        _ => &[true],
    }
}

/// Every case of `lab` (a collective lab: [`Lab::is_collective`]) on `ranks` ranks, in the
/// order they run.
pub fn cases(lab: Lab, ranks: usize) -> Vec<Case> {
    let mut out = Vec::new();
    for &count in counts(lab) {
        for &collective in lab.collectives() {
            let roots = match collective.describe().rooted {
                true => 0..ranks,
                false => 0..1,
            };
            for root in roots {
                for &in_place in placements(lab) {
                    for dtype in DType::ALL {
                        let seed = out.len() as u64 * 7919 + ranks as u64;
                        let check = case(collective, count, root, in_place, seed);
                        out.push(Case {
                            ranks,
                            check,
                            dtype,
                        });
                    }
                }
            }
        }
    }
    out
}

fn case(
    collective: Collective,
    count: usize,
    root: usize,
    in_place: bool,
    seed: u64,
) -> check::Case {
    check::Case {
        collective,
        count,
        op: ReduceOp::Sum,
        root,
        in_place,
        seed,
    }
}

/// The case `--steps` and `--trace` show, one per function of the lab, on `ranks` ranks: short
/// enough that every cell of its grids shows.
pub fn watched(lab: Lab, ranks: usize) -> Vec<Case> {
    let (count, collectives): (usize, &[Collective]) = match lab {
        Lab::Broadcast => (4, &[Collective::Broadcast]),
        Lab::AllReduce => (2 * ranks, &[Collective::AllReduce]),
        Lab::Rings => (2, &[Collective::AllGather, Collective::ReduceScatter]),
        _ => (0, &[]),
    };
    let case = |c: Collective| Case {
        ranks,
        check: case(c, count, 0, true, 1),
        dtype: DType::I32,
    };
    collectives.iter().map(|&c| case(c)).collect()
}
