//! Correctness checks any backend can run on itself, read from the collective table
//! ([`crate::collective`]): every collective, each reduction, in place and out of place, against
//! a sequential reference. `collective-check` (which the GPU check script runs on NCCL), the
//! collective tests and comm-bench's `#wrong` column all use it.
//!
//! Inputs are small whole numbers derived from (seed, rank), so every rank can compute every
//! other rank's input, and float sums and products are exact whatever order a ring adds in.

use crate::collective::{Call, Collective, Counts, Origin, Place};
use crate::comm::Buffers;
use crate::comm::Communicator;
use crate::dtype::{finish, reduce_into, DType, Element, ReduceOp};
use crate::error::Result;

/// Rank `rank`'s input: `len` small whole numbers (only ±1 and 2 for Prod, so products stay exact).
pub fn input<T: Element>(seed: u64, rank: usize, len: usize, op: ReduceOp) -> Vec<T> {
    let mut state = seed ^ (rank as u64 + 1).wrapping_mul(0x9e3779b97f4a7c15);
    (0..len)
        .map(|_| {
            // xorshift64*: cheap, deterministic, good enough for test data.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let r = state.wrapping_mul(0x2545f4914f6cdd1d) >> 33;
            match op {
                ReduceOp::Prod => T::from_i64([1, 2, -1][(r % 3) as usize]),
                _ => T::from_i64((r % 100) as i64 - 50),
            }
        })
        .collect()
}

/// The sequential reduction: every rank's value folded in rank order, then Avg's division.
pub fn reference<T: Element>(inputs: &[Vec<T>], op: ReduceOp) -> Vec<T> {
    let mut acc = inputs[0].clone();
    for other in &inputs[1..] {
        reduce_into(op, &mut acc, other);
    }
    finish(op, &mut acc, inputs.len());
    acc
}

/// One call to check: which collective, on how many elements, how it is called, on what data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Case {
    /// The collective.
    pub collective: Collective,
    /// The call's count (per block for all_gather, reduce_scatter and alltoall).
    pub count: usize,
    /// The reduction (ignored by collectives that do not reduce; it still shapes the inputs).
    pub op: ReduceOp,
    /// The root, for rooted collectives.
    pub root: usize,
    /// One buffer (true) or a send and a receive buffer.
    pub in_place: bool,
    /// Makes the inputs: the same seed gives the same inputs on every rank.
    pub seed: u64,
}

impl Case {
    /// How a table or a report names it: `all_reduce sum float in-place`.
    pub fn name(&self, dtype: DType) -> String {
        let op = match self.collective.describe().reduces {
            true => format!(" {}", self.op),
            false => String::new(),
        };
        let placement = if self.in_place {
            "in-place"
        } else {
            "out-of-place"
        };
        format!("{}{op} {dtype} {placement}", self.collective)
    }

    /// Buffer lengths on `rank` of `world_size`.
    pub fn counts(&self, rank: usize, world_size: usize) -> Counts {
        self.collective.counts(self.count, world_size, rank)
    }

    /// Rank `rank`'s input: as long as its send buffer.
    pub fn input<T: Element>(&self, rank: usize, world_size: usize) -> Vec<T> {
        input(self.seed, rank, self.counts(rank, world_size).send, self.op)
    }

    /// The one buffer of an in-place call before the call: the input at its offset, zeros around.
    fn in_place_buffer<T: Element>(&self, rank: usize, world_size: usize) -> Vec<T> {
        let counts = self.counts(rank, world_size);
        let mut buf = vec![T::default(); counts.whole()];
        let at = counts.in_place_send_offset;
        buf[at..at + counts.send].copy_from_slice(&self.input(rank, world_size));
        buf
    }

    /// What the result (the receive buffer, or the result's place in an in-place buffer) must
    /// hold on `rank` after the call. Holds one rank's input at a time, never all of them.
    pub fn expected<T: Element>(&self, rank: usize, world_size: usize) -> Vec<T> {
        let counts = self.counts(rank, world_size);
        let place = Place {
            rank,
            world_size,
            root: self.root,
            count: self.count,
        };
        let pieces = self.collective.result(&place);
        let mut out = vec![T::default(); counts.recv];
        if pieces.iter().any(|p| p.origin == Origin::Unchanged) && self.in_place {
            let before = self.in_place_buffer::<T>(rank, world_size);
            let at = counts.in_place_recv_offset;
            out.copy_from_slice(&before[at..at + counts.recv]);
        }
        let needs = |r: usize| {
            pieces
                .iter()
                .any(|p| p.origin == Origin::Reduced || p.origin == Origin::Rank(r))
        };
        for r in (0..world_size).filter(|&r| needs(r)) {
            let theirs = self.input::<T>(r, world_size);
            for p in &pieces {
                let from = &theirs[p.src..p.src + p.dst.len()];
                match p.origin {
                    Origin::Reduced if r > 0 => reduce_into(self.op, &mut out[p.dst.clone()], from),
                    Origin::Reduced => out[p.dst.clone()].copy_from_slice(from),
                    Origin::Rank(source) if source == r => out[p.dst.clone()].copy_from_slice(from),
                    _ => {}
                }
            }
        }
        for p in pieces.iter().filter(|p| p.origin == Origin::Reduced) {
            finish(self.op, &mut out[p.dst.clone()], world_size);
        }
        out
    }

    /// This rank's buffers, filled as the case says, on the communicator's device.
    pub fn buffers<T: Element>(&self, comm: &Communicator) -> Result<Buffers<T>> {
        let (rank, n) = (comm.rank(), comm.world_size());
        Ok(match self.in_place {
            true => Buffers::InPlace(comm.buffer(&self.in_place_buffer::<T>(rank, n))?),
            false => Buffers::OutOfPlace {
                send: comm.buffer(&self.input::<T>(rank, n))?,
                recv: comm.zeros(self.counts(rank, n).recv)?,
            },
        })
    }

    /// The call itself, on buffers from [`Case::buffers`].
    pub fn call<T: Element>(&self, comm: &Communicator, buffers: &mut Buffers<T>) -> Result<()> {
        let call = Call::new(self.collective).op(self.op).root(self.root);
        let (send, recv) = buffers.parts();
        comm.collective(call, send, recv)
    }

    /// The result on this rank, on the host.
    pub fn result<T: Element>(&self, comm: &Communicator, buffers: &Buffers<T>) -> Result<Vec<T>> {
        match buffers {
            Buffers::InPlace(buf) => {
                let counts = self.counts(comm.rank(), comm.world_size());
                let mut all = comm.to_host(buf)?;
                all.truncate(counts.in_place_recv_offset + counts.recv);
                all.drain(..counts.in_place_recv_offset);
                Ok(all)
            }
            Buffers::OutOfPlace { recv, .. } => comm.to_host(recv),
        }
    }

    /// Checks this rank's buffers after the call against the reference: the result, and out of
    /// place that the send buffer was left alone.
    pub fn verify<T: Element>(
        &self,
        comm: &Communicator,
        buffers: &Buffers<T>,
    ) -> Result<Mismatch> {
        let (rank, n) = (comm.rank(), comm.world_size());
        let mut mismatch = Mismatch::between(
            "result",
            &self.result(comm, buffers)?,
            &self.expected::<T>(rank, n),
        );
        if let Buffers::OutOfPlace { send, .. } = buffers {
            let send = Mismatch::between("send buffer", &comm.to_host(send)?, &self.input(rank, n));
            mismatch.add(send);
        }
        Ok(mismatch)
    }

    /// Fills, calls and verifies: what one check is.
    pub fn run<T: Element>(&self, comm: &Communicator) -> Result<Mismatch> {
        let mut buffers = self.buffers::<T>(comm)?;
        self.call(comm, &mut buffers)?;
        self.verify(comm, &buffers)
    }
}

/// How far a rank's buffers are from the reference.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mismatch {
    /// Elements that differ (a length mismatch counts the longer length).
    pub wrong: u64,
    /// The first difference, said for a person: `result element 7 is 3, expected 4`.
    pub first: Option<String>,
}

impl Mismatch {
    /// Compares `got` with `want`, element by element.
    pub fn between<T: Element>(what: &str, got: &[T], want: &[T]) -> Mismatch {
        if got.len() != want.len() {
            return Mismatch {
                wrong: got.len().max(want.len()) as u64,
                first: Some(format!(
                    "{what} has {} elements, expected {}",
                    got.len(),
                    want.len()
                )),
            };
        }
        let first = (0..got.len())
            .find(|&i| got[i] != want[i])
            .map(|i| format!("{what} element {i} is {:?}, expected {:?}", got[i], want[i]));
        Mismatch {
            wrong: count_wrong(got, want),
            first,
        }
    }

    fn add(&mut self, other: Mismatch) {
        self.wrong += other.wrong;
        self.first = self.first.take().or(other.first);
    }
}

/// Elements of `got` that differ from `want` (a length mismatch counts the longer length).
pub fn count_wrong<T: PartialEq>(got: &[T], want: &[T]) -> u64 {
    if got.len() != want.len() {
        return got.len().max(want.len()) as u64;
    }
    got.iter().zip(want).filter(|(a, b)| a != b).count() as u64
}

/// Every case of the table for a world of `world_size` at `count`: each collective that runs on
/// that many ranks, at each reduction where it reduces, in each placement it has.
pub fn cases(world_size: usize, count: usize, seed: u64) -> Vec<Case> {
    let mut cases = Vec::new();
    for collective in Collective::ALL {
        let d = collective.describe();
        if world_size < d.min_ranks {
            continue;
        }
        let ops: &[ReduceOp] = match d.reduces {
            true => &ReduceOp::ALL,
            false => &[ReduceOp::Sum],
        };
        for (i, &op) in ops.iter().enumerate() {
            for in_place in [true, false].into_iter().filter(|&p| d.in_place || !p) {
                cases.push(Case {
                    collective,
                    count,
                    op,
                    // The last rank: a root other than 0 catches code that assumes rank 0.
                    root: world_size - 1,
                    in_place,
                    seed: seed.wrapping_add(i as u64 * 7919),
                });
            }
        }
    }
    cases
}

/// One check's verdict on this rank.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// What was checked: `all_reduce sum float in-place`.
    pub name: String,
    /// Elements that differ from the reference on this rank.
    pub wrong: u64,
    /// The first difference, if any.
    pub first: Option<String>,
}

/// The names of the checks [`all_collectives`] runs, in order, for `dtype` on `world_size` ranks.
pub fn names(world_size: usize, dtype: DType) -> Vec<String> {
    let mut names: Vec<String> = cases(world_size, 0, 0)
        .iter()
        .map(|c| c.name(dtype))
        .collect();
    if world_size > 1 {
        names.push(format!("send/recv {dtype}"));
    }
    names.push(format!("barrier {dtype}"));
    names
}

/// Runs every case of the table for element type `T` with `count` elements (per block where the
/// buffers are blocked), then blocking send/recv and a barrier, and returns this rank's verdicts.
pub fn all_collectives<T: Element>(
    comm: &Communicator,
    count: usize,
    seed: u64,
) -> Result<Vec<Verdict>> {
    let (n, rank) = (comm.world_size(), comm.rank());
    let mut verdicts = Vec::new();
    for case in cases(n, count, seed) {
        let Mismatch { wrong, first } = case.run::<T>(comm)?;
        verdicts.push(Verdict {
            name: case.name(T::DTYPE),
            wrong,
            first,
        });
    }
    if n > 1 {
        // Separate blocking calls: even ranks send first, odd ranks receive first, so no cycle of
        // waiting senders forms.
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        let send = comm.buffer(&input::<T>(seed, rank, count, ReduceOp::Sum))?;
        let mut recv = comm.zeros::<T>(count)?;
        if rank % 2 == 0 {
            comm.send(&send, next)?;
            comm.recv(&mut recv, prev)?;
        } else {
            comm.recv(&mut recv, prev)?;
            comm.send(&send, next)?;
        }
        let want = input::<T>(seed, prev, count, ReduceOp::Sum);
        let Mismatch { wrong, first } = Mismatch::between("recv", &comm.to_host(&recv)?, &want);
        verdicts.push(Verdict {
            name: format!("send/recv {}", T::DTYPE),
            wrong,
            first,
        });
    }
    comm.barrier()?;
    verdicts.push(Verdict {
        name: format!("barrier {}", T::DTYPE),
        wrong: 0,
        first: None,
    });
    Ok(verdicts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_results_match_a_direct_computation() {
        for n in 1..5 {
            let case = |collective, in_place| Case {
                collective,
                count: 6,
                op: ReduceOp::Avg,
                root: n - 1,
                in_place,
                seed: 3,
            };
            let all_reduce = case(Collective::AllReduce, true);
            let inputs: Vec<Vec<f32>> = (0..n).map(|r| all_reduce.input(r, n)).collect();
            assert_eq!(
                all_reduce.expected::<f32>(0, n),
                reference(&inputs, ReduceOp::Avg)
            );
            // reduce_scatter: block `rank` of the reduction of each rank's whole buffer.
            let rs = case(Collective::ReduceScatter, false);
            let whole: Vec<Vec<f32>> = (0..n).map(|r| rs.input(r, n)).collect();
            let all = reference(&whole, ReduceOp::Avg);
            for rank in 0..n {
                assert_eq!(rs.expected::<f32>(rank, n), all[rank * 6..(rank + 1) * 6]);
            }
            // alltoall: block j of rank i's input lands in block i of rank j.
            let a2a = case(Collective::AllToAll, false);
            for j in 0..n {
                let got = a2a.expected::<i32>(j, n);
                for i in 0..n {
                    let theirs = a2a.input::<i32>(i, n);
                    assert_eq!(got[i * 6..(i + 1) * 6], theirs[j * 6..(j + 1) * 6]);
                }
            }
            // reduce in place: the root's result, the others' input untouched.
            let reduce = case(Collective::Reduce, true);
            for rank in 0..n - 1 {
                assert_eq!(
                    reduce.expected::<i64>(rank, n),
                    reduce.input::<i64>(rank, n)
                );
            }
        }
    }

    #[test]
    fn the_cases_come_from_the_table() {
        // Counted from the descriptions, not by hand, so a new collective needs no edit here:
        // each that runs on this many ranks, at each reduction where it reduces, in each
        // placement it has, once and in the table's order.
        let triples = |n| -> Vec<(Collective, ReduceOp, bool)> {
            let cases = cases(n, 1, 0).into_iter();
            cases.map(|c| (c.collective, c.op, c.in_place)).collect()
        };
        for n in 1..=4 {
            let mut want = Vec::new();
            for c in Collective::ALL {
                let d = c.describe();
                let ops: &[ReduceOp] = if d.reduces {
                    &ReduceOp::ALL
                } else {
                    &[ReduceOp::Sum]
                };
                let placements: &[bool] = if d.in_place { &[true, false] } else { &[false] };
                for &op in ops.iter().filter(|_| n >= d.min_ranks) {
                    want.extend(placements.iter().map(|&p| (c, op, p)));
                }
            }
            assert_eq!(triples(n), want, "{n} ranks");
            let count: usize = (Collective::ALL.iter().map(|c| c.describe()))
                .filter(|d| n >= d.min_ranks)
                .map(
                    |d| if d.reduces { ReduceOp::ALL.len() } else { 1 } * (1 + d.in_place as usize),
                )
                .sum();
            assert_eq!(cases(n, 1, 0).len(), count, "{n} ranks");
        }
        // Every collective is checked on two ranks; on one, sendrecv alone drops out (no peer).
        let (one, two) = (triples(1), triples(2));
        for c in Collective::ALL {
            assert!(two.iter().any(|t| t.0 == c), "{c} on 2 ranks");
        }
        assert!(two
            .iter()
            .all(|t| one.contains(t) || t.0 == Collective::SendRecv));
        assert!(!one.iter().any(|t| t.0 == Collective::SendRecv));
        let names = names(2, DType::F32);
        assert!(names.contains(&"alltoall float out-of-place".to_string()));
        assert!(names.contains(&"reduce_scatter prod float in-place".to_string()));
        assert_eq!(names.last().unwrap(), "barrier float");
    }

    #[test]
    fn mismatches_name_the_first_wrong_element() {
        let m = Mismatch::between("result", &[1, 5, 3], &[1, 2, 4]);
        assert_eq!(m.wrong, 2);
        assert_eq!(
            m.first.as_deref(),
            Some("result element 1 is 5, expected 2")
        );
        assert_eq!(Mismatch::between("x", &[1, 2], &[1, 2, 3]).wrong, 3);
        assert_eq!(
            Mismatch::between("x", &[1.0f32], &[1.0]),
            Mismatch::default()
        );
    }
}
