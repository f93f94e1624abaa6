//! Tensor parallelism, Megatron-LM's way, under data parallelism (example 07). The model's MLP
//! block (its two hidden layers) is split over the ranks of a tensor-parallel group of size `tp`,
//! as Megatron splits a transformer's MLP:
//!
//! ```text
//!            column-parallel                     row-parallel
//! e [B, c·d] ─ w1[:, j] ─► h1_j [B, h/tp] ─ w2[j, :] ─► partial [B, h] ─ all-reduce ─► + b2, tanh ─► h2
//!  (every rank)   no communication              (rank j's rows)     (sum over the group)
//! ```
//!
//! Rank `j` of the group holds columns `j·h/tp ..` of `w1` (and that slice of `b1`) and the same
//! rows of `w2`: its `h1_j` is its own slice of the hidden layer, computed from the whole input
//! with no communication; its product with its rows of `w2` is one term of `h1 @ w2`, and an
//! all-reduce over the group sums the terms (Megatron's `g`). In backward the same layers give
//! each rank its shard's gradients and a term of the gradient at their input `e`, which a second
//! all-reduce sums (Megatron's `f`, whose forward is the identity). The embedding, `b2` and the
//! output layer are whole on every rank of the group, which all read the same batch; their
//! gradients come out equal on every rank of it.
//!
//! Data parallelism goes over the other dimension of the mesh: the ranks that hold the same shard,
//! one per tensor-parallel group, are a data-parallel group; each reads its own share of the
//! global batch, and [`Ddp`] all-reduces the shard's gradients in buckets over it, on its own
//! thread, while backward (and its tensor-parallel all-reduces) goes on.

use std::time::Instant;

use comm_core::trace::Span;
use comm_core::{CommError, Communicator, Mesh, Order, ReduceOp, Result};

use crate::ddp::{Config, Ddp, Layers, Report};
use crate::model::{Model, Shape, VOCAB};
use crate::traffic::Traffic;

/// Rank `j`'s shard of the model over a tensor-parallel group of `tp` ([`Model::shard`]),
/// whose two sums are all-reduces over the group.
pub struct TpModel {
    model: Model,
    tp: Communicator,
    traffic: Traffic,
}

/// The width of one rank's slice of the hidden layer, or why `tp` cannot split it.
fn slice_width(shape: &Shape, tp: usize) -> Result<usize> {
    match tp > 0 && shape.hidden.is_multiple_of(tp) {
        true => Ok(shape.hidden / tp),
        false if tp == 0 => Err(CommError::Usage(
            "--tp 0: a tensor-parallel group has one rank or more".into(),
        )),
        false => Err(CommError::Usage(format!(
            "--tp {tp}: the hidden layer's {} units must split evenly over the tensor-parallel \
             group; give a --hidden that --tp divides",
            shape.hidden
        ))),
    }
}

/// One shard's parameter lengths, in [`NAMES`](crate::model::NAMES) order: emb, w1 and b1's
/// columns, w2's rows, b2, w3, b3.
pub fn shard_lengths(shape: &Shape, tp: usize) -> Result<[usize; 7]> {
    Ok(shape.shard_lengths(slice_width(shape, tp)?))
}

/// Shard `j` of `tp` out of the whole model's parameters `full`.
pub fn shard(shape: &Shape, tp: usize, j: usize, full: &[f32]) -> Result<Vec<f32>> {
    let (offsets, _) = shape.offsets();
    let (c, d, h) = (shape.context, shape.embed, shape.hidden);
    let w = slice_width(shape, tp)?;
    let part = |p: usize, len: usize| &full[offsets[p]..offsets[p] + len];
    let mut out = part(0, VOCAB * d).to_vec();
    let w1 = part(1, c * d * h);
    for row in w1.chunks(h) {
        out.extend_from_slice(&row[j * w..(j + 1) * w]);
    }
    out.extend_from_slice(&part(2, h)[j * w..(j + 1) * w]);
    out.extend_from_slice(&part(3, h * h)[j * w * h..(j + 1) * w * h]);
    for (p, len) in [(4, h), (5, h * VOCAB), (6, VOCAB)] {
        out.extend_from_slice(part(p, len));
    }
    Ok(out)
}

impl TpModel {
    /// This rank's shard of a model of `shape` for batches of `batch`, over the group `tp`.
    pub fn new(shape: Shape, batch: usize, tp: Communicator) -> Result<TpModel> {
        let width = slice_width(&shape, tp.world_size())?;
        Ok(TpModel {
            model: Model::shard(shape, batch, width),
            tp,
            traffic: Traffic::default(),
        })
    }

    /// The tensor-parallel group.
    pub fn group(&self) -> &Communicator {
        &self.tp
    }

    /// What the group's all-reduces moved and cost this rank so far.
    pub fn traffic(&self) -> Traffic {
        self.traffic
    }

    /// Gives the group's communicator back.
    pub fn into_group(self) -> Communicator {
        self.tp
    }
}

/// Sums `values` over the group `tp` (an all-reduce on its links), counted in `traffic` and
/// shown in the trace as a wait named `what`.
fn all_reduce(
    tp: &Communicator,
    traffic: &mut Traffic,
    what: &str,
    values: &mut [f32],
) -> Result<()> {
    let _span = Span::slice("wait", format!("tp all-reduce ({what})"));
    let start = Instant::now();
    let mut buf = tp.buffer(values)?;
    tp.all_reduce(&mut buf, ReduceOp::Sum)?;
    values.copy_from_slice(&tp.to_host(&buf)?);
    traffic.calls += 1;
    traffic.bytes += std::mem::size_of_val(values) as u64;
    traffic.waited += start.elapsed();
    Ok(())
}

impl Layers for TpModel {
    fn lengths(&self) -> [usize; 7] {
        self.model.lengths()
    }

    fn forward(&mut self, params: &[f32], samples: &[&[u8]]) -> Result<f32> {
        let TpModel { model, tp, traffic } = self;
        let mut sum = |v: &mut [f32]| all_reduce(tp, traffic, "forward", v);
        model.forward_shard(params, samples, &mut sum)
    }

    fn backward(
        &mut self,
        params: &[f32],
        grads: &mut [f32],
        ready: &mut dyn FnMut(&[usize], &[f32]),
    ) -> Result<()> {
        let TpModel { model, tp, traffic } = self;
        let mut sum = |v: &mut [f32]| all_reduce(tp, traffic, "backward", v);
        model.backward_shard(params, grads, ready, &mut sum)
    }
}

/// One rank of example 07: its shard, trained data-parallel over its data-parallel group.
pub struct Trainer {
    ddp: Ddp<TpModel>,
    mesh: (usize, usize),
    names: (String, String),
    /// What moves each group's bytes, for rank 0 to print.
    lines: Vec<String>,
}

/// What a step moved in each group, and its loss.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    /// The global batch's mean loss.
    pub loss: f32,
    /// The tensor-parallel group's all-reduces (forward and backward).
    pub tp: Traffic,
    /// The data-parallel group's (the buckets and the loss).
    pub dp: Traffic,
}

impl Step {
    /// What each group moved and cost, named (`names`: the dp group's, the tp group's).
    pub fn traffic(&self, (dp, tp): (&str, &str)) -> String {
        format!("{}; {}", self.tp.describe(tp), self.dp.describe(dp))
    }
}

impl Trainer {
    /// Sets a rank of `mesh` up: the whole model made from `config.seed` on every rank (what one
    /// rank would train), this rank's shard cut out of it, DDP over the data-parallel group.
    /// With `config.dump`, each tensor-parallel rank `j` dumps into `DIR/tp<j>`.
    pub fn new(mesh: Mesh, config: &Config) -> Result<Trainer> {
        let (tp_size, j) = (mesh.tp.world_size(), mesh.tp.rank());
        let names = (
            mesh.dp.group_name().unwrap_or("dp").to_string(),
            mesh.tp.group_name().unwrap_or("tp").to_string(),
        );
        let coordinates = mesh.coordinates();
        let lines = [&mesh.tp, &mesh.dp]
            .iter()
            .filter_map(|g| g.transport_line().map(str::to_string))
            .collect();
        let full = config.shape.init(config.seed);
        let mine = shard(&config.shape, tp_size, j, &full)?;
        let mut config = config.clone();
        config.dump = config.dump.map(|dir| dir.join(format!("tp{j}")));
        let model = TpModel::new(config.shape, config.batch, mesh.tp)?;
        let ddp = Ddp::with_layers(mesh.dp, &config, model, mine)?;
        Ok(Trainer {
            ddp,
            mesh: coordinates,
            names,
            lines,
        })
    }

    /// (its rank in the data-parallel group, in the tensor-parallel group), and their names.
    pub fn place(&self) -> ((usize, usize), (&str, &str)) {
        (self.mesh, (&self.names.0, &self.names.1))
    }

    /// What rank 0 prints first: the split and the sizes each group moves.
    pub fn describe(&self, dp: usize, tp: usize, order: Order) -> String {
        let lengths = self.ddp.layers().lengths();
        let shard: usize = lengths.iter().sum();
        let mut lines = self.lines.clone();
        lines.push(match order {
            Order::TpInner => format!(
                "mesh: dp {dp} x tp {tp} (dp,tp): tensor-parallel groups of {tp} consecutive \
                 ranks (within a node), data-parallel groups across them"
            ),
            Order::TpOuter => format!(
                "mesh: dp {dp} x tp {tp} (tp,dp): data-parallel groups of {dp} consecutive ranks \
                 (within a node), tensor-parallel groups across them"
            ),
        });
        lines.push(format!(
            "model: w1 column-parallel, w2 row-parallel over each tp group: {} of the {} hidden \
             units and {shard} parameters a rank",
            lengths[2], lengths[4]
        ));
        // DDP's own lines but its first: its model line counts this rank's shard.
        lines.extend(self.ddp.describe().lines().skip(1).map(str::to_string));
        lines.join("\n")
    }

    /// One step: forward and backward with the tensor-parallel all-reduces, the shard's gradient
    /// buckets over the data-parallel group, SGD.
    pub fn step(&mut self, step: usize) -> Result<Step> {
        let (tp_before, dp_before) = (self.ddp.layers().traffic(), self.ddp.traffic());
        let loss = self.ddp.step(step)?;
        Ok(Step {
            loss,
            tp: self.ddp.layers().traffic().since(&tp_before),
            dp: self.ddp.traffic().since(&dp_before),
        })
    }

    /// Ends the run: this rank's report, its per-step traffic in each group, the communicators.
    pub fn finish(self) -> Result<(Report, Step, Vec<Communicator>)> {
        let steps = self.ddp.steps().max(1) as u64;
        let dp = self.ddp.traffic();
        let (dp_comm, model, report) = self.ddp.finish_with_layers()?;
        let per_step = |t: Traffic| Traffic {
            calls: t.calls / steps,
            bytes: t.bytes / steps,
            waited: t.waited / steps as u32,
        };
        let step = Step {
            loss: f32::NAN,
            tp: per_step(model.traffic()),
            dp: per_step(dp),
        };
        Ok((report, step, vec![dp_comm, model.into_group()]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard of every tensor-parallel rank, laid side by side, is the whole model.
    #[test]
    fn the_shards_hold_every_weight_once() {
        let shape = Shape {
            context: 2,
            embed: 3,
            hidden: 4,
        };
        let full: Vec<f32> = (0..shape.parameters()).map(|v| v as f32).collect();
        let shards: Vec<Vec<f32>> = (0..2)
            .map(|j| shard(&shape, 2, j, &full).unwrap())
            .collect();
        let lengths = shard_lengths(&shape, 2).unwrap();
        assert_eq!(shards[0].len(), lengths.iter().sum::<usize>());
        let (offsets, _) = shape.offsets();
        // w1 is [6, 4]: rank 1 holds columns 2 and 3 of each row.
        let w1_1 = &shards[1][lengths[0]..lengths[0] + lengths[1]];
        let want: Vec<f32> = (0..6)
            .flat_map(|r| [2, 3].map(|c| (offsets[1] + r * 4 + c) as f32))
            .collect();
        assert_eq!(w1_1, want);
        // w2 is [4, 4]: rank 1 holds rows 2 and 3.
        let at = lengths[0] + lengths[1] + lengths[2];
        let w2_1 = &shards[1][at..at + lengths[3]];
        let want: Vec<f32> = (8..16).map(|i| (offsets[3] + i) as f32).collect();
        assert_eq!(w2_1, want);
        assert!(
            shard(&shape, 3, 0, &full).is_err(),
            "4 units do not split in 3"
        );
    }
}
