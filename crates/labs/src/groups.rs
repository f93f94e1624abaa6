//! Lab 8 checked: the student's data-parallel and tensor-parallel groups of a `dp × tp` mesh,
//! beside the library's [`Mesh::new`] on the same ranks. On each rank count, every layout that
//! fits it (1 × n to n × 1), then the workshop's 2 × 4 where it does not fit, which the student's
//! code must refuse on every rank. For each kind of group, every rank's members in the order of
//! their ranks there are compared (who is in it and where, at once); then an all-reduce over the
//! student's groups beside one over the library's, every element compared.

use comm_core::check::input;
use comm_core::error::rank_list;
use comm_core::{CommError, Communicator, Mesh, ReduceOp, Result};

use crate::code::Code;
use crate::compare::{agree, exactly, Shown};
use crate::panics;
use crate::report::{self, Verdict};

/// The workshop's layout, dp × tp: two copies of a model split four ways, on two nodes of four
/// GPUs (tensor parallelism inside each node).
pub const WORKSHOP: (usize, usize) = (2, 4);

/// Elements of each rank's input to a group's all-reduce: few enough that its grid shows them.
const LEN: usize = 3;

/// A mesh's shape on a number of ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The job's ranks.
    pub ranks: usize,
    /// Rows: the data-parallel groups' size.
    pub dp: usize,
    /// Columns: the tensor-parallel groups' size.
    pub tp: usize,
}

impl Layout {
    /// Whether a mesh of this shape fits the ranks (else it must be refused).
    pub fn fits(&self) -> bool {
        self.dp * self.tp == self.ranks
    }

    /// `8 ranks as dp 2 × tp 4`; a shape that does not fit says so.
    pub fn describe(&self) -> String {
        let shape = format!("{} ranks as dp {} × tp {}", self.ranks, self.dp, self.tp);
        match self.fits() {
            true => shape,
            false => format!("{shape}, which needs {} ranks", self.dp * self.tp),
        }
    }
}

/// The layouts checked on `ranks` ranks, in order.
pub fn layouts(ranks: usize) -> Vec<Layout> {
    let mut out: Vec<Layout> = (1..=ranks)
        .filter(|dp| ranks.is_multiple_of(*dp))
        .map(|dp| Layout {
            ranks,
            dp,
            tp: ranks / dp,
        })
        .collect();
    let (dp, tp) = WORKSHOP;
    if dp * tp != ranks {
        out.push(Layout { ranks, dp, tp });
    }
    out
}

/// The two kinds of group in a mesh.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Tp,
    Dp,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Tp => "tp",
            Kind::Dp => "dp",
        }
    }

    fn words(self) -> &'static str {
        match self {
            Kind::Tp => "tensor-parallel",
            Kind::Dp => "data-parallel",
        }
    }

    fn of(self, mesh: &Mesh) -> &Communicator {
        match self {
            Kind::Tp => &mesh.tp,
            Kind::Dp => &mesh.dp,
        }
    }
}

/// Every case on this communicator's ranks, until one is wrong.
pub fn cases<C: Code>(comm: &Communicator, before: usize, total: usize) -> Result<Verdict> {
    let layouts = layouts(comm.world_size());
    for (k, layout) in layouts.iter().enumerate() {
        report::in_case(k);
        let headline = format!(
            "case {} of {total} is wrong: {}",
            before + k + 1,
            layout.describe()
        );
        let wrong = match layout.fits() {
            true => mesh::<C>(comm, layout, &headline)?,
            false => refused::<C>(comm, layout, &headline)?,
        };
        if wrong {
            return Ok(Verdict::Wrong(k));
        }
    }
    Ok(Verdict::Right(layouts.len()))
}

/// A layout that fits: the student's groups beside [`Mesh::new`]'s. Whether they differ.
fn mesh<C: Code>(comm: &Communicator, layout: &Layout, headline: &str) -> Result<bool> {
    let library = Mesh::new(comm, layout.dp, layout.tp)?;
    let yours = panics::caught(|| C::mesh_groups(comm, layout.dp, layout.tp))?;
    let mut seats = Vec::new();
    let mut wrong = false;
    for kind in [Kind::Tp, Kind::Dp] {
        let (got, want) = (kind.of(&yours), kind.of(&library));
        let (mine, right) = (members(comm, got)?, members(comm, want)?);
        let headline = format!("{headline}: the {} groups", kind.words());
        wrong = same_members(comm, kind, &mine, &right, &headline)?
            || all_reduce(comm, kind, got, want, &headline)?;
        if wrong {
            break;
        }
        seats.push(mine);
    }
    if !wrong && (layout.dp, layout.tp) == WORKSHOP {
        table(comm, layout, &seats[0], &seats[1])?;
    }
    for mesh in [yours, library] {
        mesh.tp.close()?;
        mesh.dp.close()?;
    }
    Ok(wrong)
}

/// The members of `group`, as ranks of `comm`, in the order of their ranks in `group`: who is in
/// it, and where.
fn members(comm: &Communicator, group: &Communicator) -> Result<Vec<i64>> {
    let mut all = group.zeros::<i64>(group.world_size())?;
    group.all_gather_into(&group.buffer(&[comm.rank() as i64])?, &mut all)?;
    group.to_host(&all)
}

/// Every rank's `lists` (each at most as long as the rank count), gathered to every rank
/// through `comm`'s all-gather: `[rank][list]`.
fn gathered(comm: &Communicator, lists: &[&[i64]]) -> Result<Vec<Vec<Vec<i64>>>> {
    let n = comm.world_size();
    let mut mine = Vec::with_capacity(lists.len() * n);
    for list in lists {
        mine.extend_from_slice(list);
        mine.resize(mine.len() + n - list.len(), -1);
    }
    let mut all = comm.zeros::<i64>(mine.len() * n)?;
    comm.all_gather_into(&comm.buffer(&mine)?, &mut all)?;
    let all = comm.to_host(&all)?;
    let unpadded = |list: &[i64]| list.iter().copied().filter(|&m| m >= 0).collect();
    Ok(all
        .chunks(mine.len())
        .map(|rank| rank.chunks(n).map(unpadded).collect())
        .collect())
}

/// `ranks 0 1 2 3, where it is rank 1`: a group, and `rank`'s place in it.
fn seat(rank: usize, members: &[i64]) -> String {
    let list: Vec<String> = members.iter().map(i64::to_string).collect();
    let place = match members.iter().position(|&m| m == rank as i64) {
        Some(at) => format!("where it is rank {at} of {}", members.len()),
        None => "without it".into(),
    };
    format!("ranks {} ({place})", list.join(" "))
}

/// Compares this rank's group (`got`, its members in order) with the library's (`want`), and
/// agrees with the other ranks. If some rank's differs, rank 0 prints the first one's two groups,
/// and every rank's in grids. Whether some rank's differs (every rank answers alike).
fn same_members(
    comm: &Communicator,
    kind: Kind,
    got: &[i64],
    want: &[i64],
    headline: &str,
) -> Result<bool> {
    let all = gathered(comm, &[got, want])?;
    let wrong: Vec<usize> = (0..all.len()).filter(|&r| all[r][0] != all[r][1]).collect();
    let Some(&first) = wrong.first() else {
        return Ok(false);
    };
    if comm.rank() == 0 {
        let (got, want) = (&all[first][0], &all[first][1]);
        println!("{headline}");
        println!(
            "rank {first}, its {} group: expected {}, got {}; wrong on ranks {}",
            kind.name(),
            seat(first, want),
            seat(first, got),
            rank_list(wrong.iter().copied())
        );
    }
    let yours = format!(
        "Your {} groups (each rank's members, in the order of their ranks there):",
        kind.name()
    );
    comm.print_grid(&yours, &comm.buffer(got)?)?;
    comm.print_grid("The library's (Mesh::new):", &comm.buffer(want)?)?;
    Ok(true)
}

/// An all-reduce over the student's group (`got`) beside one over the library's (`want`), on
/// the same inputs, every element compared. Whether some rank's differs.
fn all_reduce(
    comm: &Communicator,
    kind: Kind,
    got: &Communicator,
    want: &Communicator,
    headline: &str,
) -> Result<bool> {
    let values = input::<i64>(8, comm.rank(), LEN, ReduceOp::Sum);
    let (mut yours, mut library) = (got.buffer(&values)?, want.buffer(&values)?);
    got.all_reduce(&mut yours, ReduceOp::Sum)?;
    want.all_reduce(&mut library, ReduceOp::Sum)?;
    let shown = Shown {
        headline: format!("{headline}: an all-reduce over each rank's {}", kind.name()),
        element: "element",
        titles: ["Over your groups:", "Over the library's:"],
    };
    let (got, want) = (got.to_host(&yours)?, want.to_host(&library)?);
    agree(comm, &got, &want, exactly, &shown)
}

/// A layout that does not fit: the student's code must refuse it on every rank. Whether some
/// rank returned groups instead.
fn refused<C: Code>(comm: &Communicator, layout: &Layout, headline: &str) -> Result<bool> {
    // A refusal is the student's own usage error; any other (a split left waiting for ranks
    // that refused) fails the rank, as the student's code's failure.
    let answer = panics::caught(|| match C::mesh_groups(comm, layout.dp, layout.tp) {
        Err(refusal @ CommError::Usage(_)) => Ok(Err(refusal)),
        Err(failure) => Err(failure),
        Ok(mesh) => Ok(Ok(mesh)),
    })?;
    let mut flags = comm.zeros::<i64>(comm.world_size())?;
    let grouped = comm.buffer(&[answer.is_ok() as i64])?;
    comm.all_gather_into(&grouped, &mut flags)?;
    if let Ok(mesh) = answer {
        mesh.tp.close()?;
        mesh.dp.close()?;
    }
    let flags = comm.to_host(&flags)?;
    let grouped: Vec<usize> = (0..flags.len()).filter(|&r| flags[r] == 1).collect();
    if grouped.is_empty() {
        return Ok(false);
    }
    if comm.rank() == 0 {
        println!("{headline}");
        println!(
            "rank {}: expected an error (no dp × tp mesh fits {} ranks), got two groups (on \
             ranks {}). Return an error on every rank, before any split.",
            grouped[0],
            layout.ranks,
            rank_list(grouped.iter().copied())
        );
    }
    Ok(true)
}

/// The workshop's layout, right: every rank's two groups, as rank 0 prints them.
fn table(comm: &Communicator, layout: &Layout, tp: &[i64], dp: &[i64]) -> Result<()> {
    let all = gathered(comm, &[tp, dp])?;
    if comm.rank() != 0 {
        return Ok(());
    }
    println!("your groups on {}, right on every rank:", layout.describe());
    println!("rank  tp group  where        dp group  where");
    for (rank, groups) in all.iter().enumerate() {
        let column = |members: &[i64]| {
            let list: Vec<String> = members.iter().map(i64::to_string).collect();
            let at = members.iter().position(|&m| m == rank as i64).unwrap_or(0);
            (list.join(" "), format!("rank {at} of {}", members.len()))
        };
        let ((tp, tp_at), (dp, dp_at)) = (column(&groups[0]), column(&groups[1]));
        println!("{rank:>4}  {tp:<8}  {tp_at:<11}  {dp:<8}  {dp_at}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shape that fits, 1 × n to n × 1, then the workshop's where it does not fit.
    #[test]
    fn the_layouts_of_a_rank_count() {
        let shapes = |n: usize| -> Vec<(usize, usize, bool)> {
            layouts(n).iter().map(|l| (l.dp, l.tp, l.fits())).collect()
        };
        let fit = |dp, tp| (dp, tp, true);
        assert_eq!(shapes(4), [fit(1, 4), fit(2, 2), fit(4, 1), (2, 4, false)]);
        assert_eq!(
            shapes(6),
            [fit(1, 6), fit(2, 3), fit(3, 2), fit(6, 1), (2, 4, false)]
        );
        assert_eq!(shapes(8), [fit(1, 8), fit(2, 4), fit(4, 2), fit(8, 1)]);
        let refused = layouts(6)[4].describe();
        assert_eq!(refused, "6 ranks as dp 2 × tp 4, which needs 8 ranks");
    }

    #[test]
    fn a_seat_names_the_group_and_the_place() {
        assert_eq!(
            seat(5, &[4, 5, 6, 7]),
            "ranks 4 5 6 7 (where it is rank 1 of 4)"
        );
        assert_eq!(seat(1, &[0, 2]), "ranks 0 2 (without it)");
    }
}
