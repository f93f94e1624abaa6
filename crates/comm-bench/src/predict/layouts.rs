//! `comm-bench predict --layouts MODEL`: where the groups go, predicted. A transformer of the
//! size named (Megatron-LM's layout: `--tp` ranks of a tensor-parallel group, data parallel over
//! the rest) on 2 to 64 nodes of the system, its groups laid out both ways:
//!
//! - `dp,tp` (Megatron's, `init_device_mesh((dp, tp))`): each tensor-parallel group on
//!   consecutive ranks, i.e. inside a node; the data-parallel groups across the nodes;
//! - `tp,dp` (swapped): the data-parallel groups on consecutive ranks, each tensor-parallel group
//!   spread over nodes.
//!
//! Per training step (one micro-batch of `--micro-batch` sequences of `--seq` tokens), each GPU
//! takes part in 4 all-reduces per layer in its tensor-parallel group (Megatron's `g` after
//! attention and after the MLP in forward, its `f` before them in backward), each of the
//! activations, micro-batch × seq × hidden in bf16, none of them hidden behind compute; and in one
//! all-reduce of its shard's gradients (parameters / tp, bf16) in its data-parallel group, which
//! DDP's buckets can hide behind backward. Each all-reduce's time is NCCL's cost model for that
//! group: the nodes it spans and its GPUs in each, the node's NICs shared by the groups there.
//! Compute: 6 × (parameters / tp) × tokens FLOPs a GPU, at a stated fraction of the GPU's peak.

use comm_core::{Collective, CommError, Order};

use super::system::System;
use crate::error::BenchError;
use crate::model::nccl;

/// A transformer's size: layers and hidden width (parameters ≈ 12 × layers × hidden²).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelSize {
    pub layers: usize,
    pub hidden: usize,
}

/// The sizes `--layouts` knows by name: (name, layers, hidden), GPT-3's and Llama 2's shapes.
pub const NAMED: [(&str, usize, usize); 5] = [
    ("1.3B", 24, 2048),
    ("7B", 32, 4096),
    ("13B", 40, 5120),
    ("30B", 60, 6656),
    ("70B", 80, 8192),
];

impl ModelSize {
    /// `7B` (one of [`NAMED`]) or `LAYERSxHIDDEN` (`32x4096`).
    pub fn parse(text: &str) -> Result<ModelSize, BenchError> {
        if let Some(&(_, layers, hidden)) = NAMED.iter().find(|n| n.0.eq_ignore_ascii_case(text)) {
            return Ok(ModelSize { layers, hidden });
        }
        let parsed = text
            .split_once(['x', 'X'])
            .and_then(|(l, h)| Some((l.parse().ok()?, h.parse().ok()?)))
            .filter(|&(l, h): &(usize, usize)| l > 0 && h > 0 && l <= 1000 && h <= 1 << 17);
        match parsed {
            Some((layers, hidden)) => Ok(ModelSize { layers, hidden }),
            None => Err(BenchError::Comm(CommError::Usage(format!(
                "--layouts {text}: name a model size ({}) or give LAYERSxHIDDEN, e.g. 32x4096",
                NAMED.map(|n| n.0).join(", ")
            )))),
        }
    }

    /// Parameters: 12 × layers × hidden² (attention's 4h² and the MLP's 8h² a layer).
    pub fn parameters(&self) -> f64 {
        12.0 * self.layers as f64 * (self.hidden as f64).powi(2)
    }
}

/// What a step of one layout costs a GPU, µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// 4 all-reduces a layer in the tensor-parallel group, exposed.
    pub tp_us: f64,
    /// The gradients' all-reduce in the data-parallel group (hideable behind backward).
    pub dp_us: f64,
    /// The model's arithmetic on this GPU.
    pub compute_us: f64,
}

impl StepCost {
    /// The step: compute, the tensor-parallel all-reduces, and the part of the gradients'
    /// all-reduce that backward (2/3 of the compute) cannot hide.
    pub fn step_us(&self) -> f64 {
        self.compute_us + self.tp_us + (self.dp_us - self.compute_us * 2.0 / 3.0).max(0.0)
    }
}

/// The nodes a group spans and its GPUs on each: the group of rank 0 in `dim` ("tp" or "dp").
fn span(order: Order, dp: usize, tp: usize, gpus_per_node: usize, dim: &str) -> (usize, usize) {
    let (row0, column0) = order.place(0, dp, tp);
    let members: Vec<usize> = (0..dp * tp)
        .filter(|&r| {
            let (row, column) = order.place(r, dp, tp);
            match dim {
                "tp" => row == row0,
                _ => column == column0,
            }
        })
        .collect();
    let mut nodes: Vec<usize> = members.iter().map(|r| r / gpus_per_node).collect();
    nodes.dedup();
    (nodes.len(), members.len() / nodes.len())
}

/// NCCL's predicted all-reduce of `bytes` in a group of `per_node` GPUs on each of `nodes` nodes
/// of `system`, sharing the node's NICs with the node's other groups; 0 for a group of one.
fn all_reduce_us(system: &System, (nodes, per_node): (usize, usize), bytes: f64) -> f64 {
    if nodes * per_node <= 1 {
        return 0.0;
    }
    let mut group = system.clone();
    group.gpus_per_node = per_node;
    let share = system.net.nics_per_node * per_node / system.gpus_per_node.max(1);
    group.net.nics_per_node = share.max(1);
    let topo = group.topo(nodes);
    nccl::choose(&topo, Collective::AllReduce, bytes as u64).map_or(0.0, |c| c.time_us)
}

/// Assumptions of the step's arithmetic, printed with the table.
pub struct Step {
    pub seq: usize,
    pub micro_batch: usize,
    /// The GPU's dense bf16 peak, TFLOP/s, and the fraction of it reached.
    pub peak_tflops: f64,
    pub efficiency: f64,
}

/// One layout's step on `nodes` nodes of `system`: tp = the system's GPUs per node.
pub fn step_cost(
    system: &System,
    model: ModelSize,
    step: &Step,
    nodes: usize,
    tp: usize,
    order: Order,
) -> StepCost {
    let dp = nodes * system.gpus_per_node / tp;
    let gpus = system.gpus_per_node;
    let tokens = (step.seq * step.micro_batch) as f64;
    let activations = tokens * model.hidden as f64 * 2.0;
    let gradients = model.parameters() / tp as f64 * 2.0;
    let tp_us = 4.0
        * model.layers as f64
        * all_reduce_us(system, span(order, dp, tp, gpus, "tp"), activations);
    let dp_us = all_reduce_us(system, span(order, dp, tp, gpus, "dp"), gradients);
    let flops = 6.0 * model.parameters() / tp as f64 * tokens;
    let compute_us = flops / (step.peak_tflops * 1e12 * step.efficiency) * 1e6;
    StepCost {
        tp_us,
        dp_us,
        compute_us,
    }
}

/// The nodes the comparison is made at: 2, 4, ... 64.
pub const NODES: [usize; 6] = [2, 4, 8, 16, 32, 64];

/// The comparison, as printed: a row per node count and layout.
pub fn table(system: &System, model: ModelSize, step: &Step, tp: usize) -> String {
    let mut out = format!(
        "# Where the groups go: a {:.1}B-parameter transformer ({} layers, hidden {}) on {}, \
         tensor parallel {tp}, data parallel over the rest\n\
         # A step: {} sequence(s) of {} tokens a data-parallel rank; tp: 4 all-reduces a layer of \
         {:.1} MB (bf16 activations), not hidden; dp: one all-reduce of {:.0} MB (bf16 \
         gradients of a shard), hideable behind backward; compute at {:.0}% of {} TFLOP/s\n\
         # step = compute + tp + the part of dp longer than backward (2/3 of compute): what \
         the step would take, if nothing else were in the way\n\
         #\n",
        model.parameters() / 1e9,
        model.layers,
        model.hidden,
        system.name,
        step.micro_batch,
        step.seq,
        (step.seq * step.micro_batch * model.hidden * 2) as f64 / 1e6,
        model.parameters() / tp as f64 * 2.0 / 1e6,
        step.efficiency * 100.0,
        step.peak_tflops,
    );
    out += &format!(
        "#{:>5}  {:>5}  {:<36}  {:>9}  {:>9}  {:>12}  {:>9}  {:>10}\n",
        "nodes", "GPUs", "layout", "tp (ms)", "dp (ms)", "compute (ms)", "step (ms)", "tp/compute"
    );
    for nodes in NODES {
        for (order, what) in [
            (Order::TpInner, "dp,tp: tp inside each node (NVLink)"),
            (Order::TpOuter, "tp,dp: tp across nodes (network)"),
        ] {
            let c = step_cost(system, model, step, nodes, tp, order);
            out += &format!(
                "{:>6}  {:>5}  {:<36}  {:>9.1}  {:>9.1}  {:>12.1}  {:>9.1}  {:>9.0}%\n",
                nodes,
                nodes * system.gpus_per_node,
                what,
                c.tp_us / 1e3,
                c.dp_us / 1e3,
                c.compute_us / 1e3,
                c.step_us() / 1e3,
                100.0 * c.tp_us / c.compute_us
            );
        }
    }
    out
}

/// A GPU's dense bf16 peak, TFLOP/s, by compute capability (V100 fp16, A100, H100 SXM).
pub fn peak_tflops(compute_capability: u32) -> f64 {
    match compute_capability {
        ..=79 => 125.0,
        80..=89 => 312.0,
        _ => 989.0,
    }
}

/// `--layouts MODEL`: the comparison for a transformer of that size on `system`, tensor-parallel
/// groups of `tp` (default: the node's GPUs), `seq` tokens and `micro_batch` sequences a step.
pub fn comparison(
    system: &System,
    model: &str,
    tp: Option<usize>,
    seq: usize,
    micro_batch: usize,
) -> Result<String, BenchError> {
    let model = ModelSize::parse(model)?;
    let tp = tp.unwrap_or(system.gpus_per_node);
    let usage = |m: String| BenchError::Comm(CommError::Usage(m));
    if tp == 0 || !system.gpus_per_node.is_multiple_of(tp) || !model.hidden.is_multiple_of(tp) {
        return Err(usage(format!(
            "--tp {tp}: give a tensor-parallel size that divides the node's {} GPUs and the \
             hidden width {}",
            system.gpus_per_node, model.hidden
        )));
    }
    if seq == 0 || micro_batch == 0 {
        return Err(usage("--seq and --micro-batch: give 1 or more".into()));
    }
    let step = Step {
        seq,
        micro_batch,
        peak_tflops: peak_tflops(system.compute_capability),
        efficiency: 0.5,
    };
    Ok(table(system, model, &step, tp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_named_or_given_as_layers_by_hidden() {
        assert_eq!(
            ModelSize::parse("7b").unwrap(),
            ModelSize {
                layers: 32,
                hidden: 4096
            }
        );
        assert_eq!(
            ModelSize::parse("2x64").unwrap().parameters(),
            12.0 * 2.0 * 4096.0
        );
        let e = ModelSize::parse("huge").unwrap_err().to_string();
        assert!(
            e.contains("--layouts huge: name a model size (1.3B, 7B"),
            "{e}"
        );
    }

    /// The groups' spans follow the mesh's order: on 2 nodes of 4 GPUs with tp 4, Megatron's
    /// layout keeps a tp group in one node and spreads a dp group over both; swapped, a tp
    /// group has 2 GPUs on each node and a dp group is 2 GPUs of one node.
    #[test]
    fn the_layouts_put_the_groups_where_the_mesh_says() {
        assert_eq!(span(Order::TpInner, 2, 4, 4, "tp"), (1, 4));
        assert_eq!(span(Order::TpInner, 2, 4, 4, "dp"), (2, 1));
        assert_eq!(span(Order::TpOuter, 2, 4, 4, "tp"), (2, 2));
        assert_eq!(span(Order::TpOuter, 2, 4, 4, "dp"), (1, 2));
        assert_eq!(span(Order::TpOuter, 16, 4, 4, "tp"), (4, 1));
    }

    /// On Leonardo, tensor parallelism over the network costs more than inside a node, at every
    /// node count: what the model says, not a measurement.
    #[test]
    fn tp_across_the_network_costs_more_in_the_model() {
        let system = System::load("leonardo").unwrap();
        let step = Step {
            seq: 4096,
            micro_batch: 1,
            peak_tflops: 312.0,
            efficiency: 0.5,
        };
        let model = ModelSize::parse("7B").unwrap();
        for nodes in NODES {
            let inner = step_cost(&system, model, &step, nodes, 4, Order::TpInner);
            let outer = step_cost(&system, model, &step, nodes, 4, Order::TpOuter);
            assert!(
                outer.tp_us > 2.0 * inner.tp_us,
                "{nodes}: {inner:?} {outer:?}"
            );
        }
    }
}
