//! NCCL 2.21.5's cost model, ported from `src/graph/tuning.cc` at tag `v2.21.5-1` of
//! github.com/NVIDIA/nccl (the version CI's wheel carries). Line numbers below are that file's.
//! Only ring and tree with LL, LL128 and Simple: CollNet, NVLS and PAT need hardware
//! (SHARP switches, NVSwitch multicast) the described clusters do not declare.

use comm_core::backend::cpu;
use comm_core::Collective;

/// The tag whose numbers these are, for the output's footer and the CSV's backend name.
pub const NCCL_TAG: &str = "v2.21.5-1";
/// Where each piece comes from, printed under the table.
pub const CITATIONS: &[&str] = &[
    "baseLat, hwLat: src/graph/tuning.cc:54-78",
    "llMaxBws, perChMaxRingLL128Bws, perChMaxTreeLL128Bws, perChMaxTreeBws: tuning.cc:85-106",
    "net overhead (Intel 1 us, AMD 2 us): tuning.cc:108-118",
    "ncclTopoTuneModel: indexes 139-151, nsteps/nInterSteps 157-163, bandwidths 171-223, \
     latencies 225-263, LL128 enablement 303-320",
    "treeCorrectionFactor, ncclTopoGetAlgoTime (ring plateau x1.4, time = lat + bytes/bw): \
     tuning.cc:410-445",
    "channel search stand-in: speedArrayIntra/Inter and ncclTopoDupChannels in \
     src/graph/search.cc:835-851; SM80_NVLINK_BW 20 GB/s in src/graph/topo.h:16",
];

/// The collectives tuning.cc has a cost for, by NCCL's names for them (`ncclFunc_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllReduce,
}

/// NCCL's function for a collective of the table; `None` where tuning.cc has no cost for it
/// (NCCL runs those as groups of sends and receives, which it does not tune), and
/// `comm-bench predict` refuses those by name. No `_`: a new collective does not build until it
/// is placed here.
pub fn func(coll: Collective) -> Option<Func> {
    match coll {
        Collective::AllReduce => Some(Func::AllReduce),
        Collective::AllGather => Some(Func::AllGather),
        Collective::ReduceScatter => Some(Func::ReduceScatter),
        Collective::Broadcast => Some(Func::Broadcast),
        Collective::Reduce => Some(Func::Reduce),
        Collective::SendRecv | Collective::AllToAll | Collective::Gather | Collective::Scatter => {
            None
        }
    }
}

impl Func {
    /// The CPU algorithm whose steps NCCL's ring takes for this function in its bandwidth
    /// regime, which `comm-bench model` fits an NCCL series through: a ring, and for broadcast
    /// a pipelined chain.
    pub fn ring_as_cpu(self) -> cpu::Algo {
        match self {
            Func::Broadcast => cpu::Algo::Chain,
            Func::Reduce | Func::AllGather | Func::ReduceScatter | Func::AllReduce => {
                cpu::Algo::Ring
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    Tree,
    Ring,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Ll,
    Ll128,
    Simple,
}

impl Algo {
    /// NCCL's order (NCCL_ALGO_TREE = 0, NCCL_ALGO_RING = 1): on equal times the first wins.
    pub const ALL: [Algo; 2] = [Algo::Tree, Algo::Ring];
    pub fn name(self) -> &'static str {
        match self {
            Algo::Tree => "tree",
            Algo::Ring => "ring",
        }
    }
}

impl Proto {
    pub const ALL: [Proto; 3] = [Proto::Ll, Proto::Ll128, Proto::Simple];
    pub fn name(self) -> &'static str {
        match self {
            Proto::Ll => "LL",
            Proto::Ll128 => "LL128",
            Proto::Simple => "Simple",
        }
    }
}

/// Intra-node hardware, tuning.cc:61-63 (the network row is used between nodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hw {
    NvLink = 0,
    Pci = 1,
    Net = 2,
}

/// tuning.cc:56-59, rows Tree, Ring; columns LL, LL128, Simple (us).
const BASE_LAT: [[f64; 3]; 2] = [[6.8, 14.0, 0.0], [6.6, 14.0, 8.4]];
/// tuning.cc:65-78, [hw][algo][proto] (us).
const HW_LAT: [[[f64; 3]; 2]; 3] = [
    [[0.6, 1.25, 28.0], [0.6, 1.9, 3.4]],
    [[1.0, 1.9, 28.0], [1.0, 2.5, 5.7]],
    [[5.0, 8.5, 28.0], [2.7, 4.0, 14.0]],
];
/// tuning.cc:86-90 (GB/s): [GPU generation or CPU vendor][1 node, 2 nodes, more].
const LL_MAX_BWS: [[f64; 3]; 3] = [[39.0, 39.0, 20.4], [87.7, 22.5, 19.0], [141.0, 45.0, 35.0]];
/// tuning.cc:92-96.
const PER_CH_MAX_RING_LL128_BWS: [[f64; 3]; 3] =
    [[20.0, 20.0, 20.0], [20.0, 20.0, 20.0], [36.7, 36.7, 36.7]];
/// tuning.cc:97-101.
const PER_CH_MAX_TREE_LL128_BWS: [[f64; 3]; 3] =
    [[20.0, 20.0, 20.0], [20.0, 20.0, 20.0], [36.7, 36.7, 29.0]];
/// tuning.cc:102-106.
const PER_CH_MAX_TREE_BWS: [[f64; 3]; 3] =
    [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [38.7, 41.4, 36.0]];
/// tuning.cc:412-416, per protocol, by log2(bytes / 64) from 0 to 22.
const TREE_CORRECTION: [[f64; 23]; 3] = [
    [
        1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8,
        0.9, 1.0, 1.0, 1.0, 1.0,
    ],
    [
        1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9,
        0.9, 0.9, 0.9, 1.0, 1.0,
    ],
    [
        0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8,
        0.7, 0.7, 0.8, 0.9, 0.9,
    ],
];

/// What `ncclTopoTuneModel` reads from the communicator and the topology search, in NCCL's
/// units (GB/s, us). [`super::system`] derives it from a cluster's description.
#[derive(Debug, Clone, PartialEq)]
pub struct Topo {
    pub nodes: usize,
    pub ranks: usize,
    /// minCompCap: 70 Volta, 80 Ampere, 90 Hopper (tuning.cc:139).
    pub compute_capability: u32,
    /// cpuVendor: AMD picks the AMD row of llMaxBws between nodes (tuning.cc:144).
    pub amd_cpu: bool,
    /// The ring and tree graphs' typeIntra: NVLink or PCI (tuning.cc:154).
    pub intra_hw: Hw,
    /// graph->nChannels, bwIntra, bwInter (the same graph stands in for ring and tree).
    pub channels: usize,
    pub bw_intra: f64,
    pub bw_inter: f64,
    /// graph->latencyInter (us): the net plugin's latency, 0 for InfiniBand verbs.
    pub latency_inter: f64,
    /// LL128 allowed: NVLink inside nodes and the NIC under the GPU's PCIe switch
    /// (tuning.cc:305-316).
    pub ll128: bool,
    /// Calibration: every bandwidth times this, every latency times that (1 and 1 = NCCL's).
    pub bw_scale: f64,
    pub lat_scale: f64,
}

/// One (algorithm, protocol) for one collective: NCCL's `comm->latencies` and `bandwidths`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    pub algo: Algo,
    pub proto: Proto,
    /// us
    pub latency: f64,
    /// algorithm bandwidth, GB/s
    pub bandwidth: f64,
}

/// NCCL's choice for one call: the fastest combination and its time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub algo: Algo,
    pub proto: Proto,
    pub time_us: f64,
}

/// Steps of a ring and of them those crossing nodes, tuning.cc:158-163.
fn steps(f: Func, ranks: usize, nodes: usize) -> (f64, f64) {
    let (n, m) = (ranks as f64, nodes as f64);
    match f {
        Func::AllReduce => (2.0 * (n - 1.0), if nodes > 1 { 2.0 * m } else { 0.0 }),
        Func::AllGather | Func::ReduceScatter => (n - 1.0, m - 1.0),
        Func::Broadcast | Func::Reduce => (n, m),
    }
}

/// Whether NCCL's model has a cost for `coll` ([`func`]).
pub fn supported(coll: Collective) -> bool {
    func(coll).is_some()
}

/// The collectives NCCL's model covers, in the table's order: `comm-bench predict` offers these
/// and refuses the others by name.
pub fn modelled() -> impl Iterator<Item = Collective> {
    Collective::ALL.into_iter().filter(|&c| supported(c))
}

/// all_reduce runs by ring or tree; broadcast, reduce, all_gather and reduce_scatter only by ring
/// here (tuning.cc:166-169).
fn runs(f: Func, algo: Algo) -> bool {
    algo == Algo::Ring || f == Func::AllReduce
}

/// The table's row indexes: GPU generation, node-count bucket (tuning.cc:139-145).
fn indexes(t: &Topo) -> (usize, usize, usize) {
    let cc = match t.compute_capability {
        90.. => 2,
        80.. => 1,
        _ => 0,
    };
    let by_nodes = if t.nodes <= 2 { t.nodes - 1 } else { 2 };
    let ll_row = if t.nodes == 1 {
        cc
    } else {
        usize::from(t.amd_cpu)
    };
    (cc, by_nodes, ll_row)
}

/// Bus bandwidth, then algorithm bandwidth, of one combination: tuning.cc:174-219.
fn bandwidth(t: &Topo, f: Func, algo: Algo, proto: Proto) -> f64 {
    let (cc, by_nodes, ll_row) = indexes(t);
    let ll_max = LL_MAX_BWS[ll_row][by_nodes];
    let ch = t.channels as f64;
    let ppn = t.ranks as f64 / t.nodes as f64;
    let bw = if t.nodes <= 2 { t.bw_intra } else { t.bw_inter };
    let mut bus = ch * bw;
    match (algo, proto) {
        (Algo::Ring, Proto::Ll) => bus = ll_max.min(bus * 0.5),
        (Algo::Ring, Proto::Ll128) => {
            let eff = if ppn < 2.0 { 0.7 } else { 0.92 };
            bus = (bus * eff).min(ch * PER_CH_MAX_RING_LL128_BWS[cc][by_nodes]);
        }
        (Algo::Ring, Proto::Simple) => {}
        (Algo::Tree, _) => {
            bus = (bus * 0.92).min(ch * PER_CH_MAX_TREE_BWS[cc][by_nodes]);
            if proto == Proto::Ll {
                bus = (bus / 3.8).min(ll_max);
            } else if proto == Proto::Ll128 {
                let eff = if t.nodes == 1 {
                    7.0 / 9.0
                } else {
                    120.0 / 128.0
                };
                bus = (bus * eff).min(ch * PER_CH_MAX_TREE_LL128_BWS[cc][by_nodes]);
            }
        }
    }
    let (nsteps, _) = steps(f, t.ranks, t.nodes);
    let ratio = match algo {
        Algo::Ring => t.ranks as f64 / nsteps,
        Algo::Tree => 0.5,
    };
    bus * ratio * t.bw_scale
}

/// Latency of one combination, tuning.cc:225-263 (CPU overhead per step from 108-118).
fn latency(t: &Topo, f: Func, algo: Algo, proto: Proto) -> f64 {
    let (a, p) = (algo as usize, proto as usize);
    let mut intra = HW_LAT[t.intra_hw as usize][a][p];
    let mut inter = HW_LAT[Hw::Net as usize][a][p] + t.latency_inter;
    if proto == Proto::Simple {
        inter += t.latency_inter; // the flush, tuning.cc:229
    }
    let ppn = t.ranks / t.nodes;
    let lat = BASE_LAT[a][p]
        + match algo {
            Algo::Ring => {
                let (nsteps, inter_steps) = steps(f, t.ranks, t.nodes);
                let hw = if t.nodes == 1 { t.intra_hw } else { Hw::Net };
                if matches!(f, Func::Broadcast | Func::Reduce) {
                    // sameChannels is 1 for the rings NCCL searches: one hop's latency.
                    HW_LAT[hw as usize][a][p]
                } else {
                    let overhead = match (t.nodes > 1, t.amd_cpu) {
                        (false, _) => 0.0,
                        (true, amd) => {
                            if amd {
                                2.0
                            } else {
                                1.0
                            }
                        }
                    } * if proto == Proto::Simple { 3.0 } else { 1.0 };
                    intra = intra.max(overhead);
                    (nsteps - inter_steps) * intra + inter_steps * inter
                }
            }
            Algo::Tree => 2.0 * ((ppn as f64 - 1.0) * intra + log2i(t.nodes as u64) as f64 * inter),
        };
    lat * t.lat_scale
}

/// NCCL's log2i: floor(log2(n)), 0 for 0 and 1.
fn log2i(mut n: u64) -> u32 {
    let mut l = 0;
    while n > 1 {
        n >>= 1;
        l += 1;
    }
    l
}

/// Every combination NCCL would consider for `coll` on `t`, enabled ones only (none for a
/// collective tuning.cc has no cost for).
pub fn costs(t: &Topo, coll: Collective) -> Vec<Cost> {
    let Some(f) = func(coll) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for algo in Algo::ALL.into_iter().filter(|&a| runs(f, a)) {
        for proto in Proto::ALL {
            if proto == Proto::Ll128 && !t.ll128 {
                continue;
            }
            out.push(Cost {
                algo,
                proto,
                latency: latency(t, f, algo, proto),
                bandwidth: bandwidth(t, f, algo, proto),
            });
        }
    }
    out
}

/// One combination's time for one call, split as ncclTopoGetAlgoTime adds it up
/// (tuning.cc:418-445): `latency_us + transfer_us`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Term {
    pub algo: Algo,
    pub proto: Proto,
    pub latency_us: f64,
    pub transfer_us: f64,
}

impl Term {
    pub fn time_us(&self) -> f64 {
        self.latency_us + self.transfer_us
    }
}

/// Every combination's terms for one call of `bytes` (NCCL's nBytes: the whole buffer for
/// all_gather and reduce_scatter, as nccl-tests' size column).
pub fn terms(t: &Topo, coll: Collective, bytes: u64) -> Vec<Term> {
    let log_size = log2i(bytes >> 6) as usize;
    let per_channel_rank = bytes / (t.channels as u64 * t.ranks as u64).max(1);
    costs(t, coll)
        .into_iter()
        .map(|cost| {
            let mut bw = cost.bandwidth;
            if cost.algo == Algo::Tree && log_size < 23 {
                bw *= TREE_CORRECTION[cost.proto as usize][log_size];
            }
            let mut lat = cost.latency;
            // The ring's plateau (tuning.cc:437-440).
            if cost.algo == Algo::Ring
                && cost.proto == Proto::Simple
                && t.nodes > 1
                && func(coll) == Some(Func::AllReduce)
                && per_channel_rank >= 64
            {
                lat *= if t.compute_capability < 80 { 1.9 } else { 1.4 };
            }
            Term {
                algo: cost.algo,
                proto: cost.proto,
                latency_us: lat,
                transfer_us: bytes as f64 / (1000.0 * bw),
            }
        })
        .collect()
}

/// The fastest combination, ties to the first in NCCL's order (topoGetAlgoInfo's strict `<`).
/// None for one rank (tuning.cc:137 stops there: NCCL copies locally) or a collective this
/// model does not cover.
pub fn choose(t: &Topo, coll: Collective, bytes: u64) -> Option<Choice> {
    if t.ranks <= 1 || !supported(coll) {
        return None;
    }
    fastest(&terms(t, coll, bytes), 1.0, 1.0)
}

/// The fastest of `terms` with latencies times `lat_scale` and bandwidths times `bw_scale`
/// (how `--calibrate` tries scales without recomputing the model).
pub fn fastest(terms: &[Term], bw_scale: f64, lat_scale: f64) -> Option<Choice> {
    let mut best: Option<Choice> = None;
    for term in terms {
        let time_us = term.latency_us * lat_scale + term.transfer_us / bw_scale;
        if best.is_none_or(|b| time_us < b.time_us) {
            best = Some(Choice {
                algo: term.algo,
                proto: term.proto,
                time_us,
            });
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(nodes: usize, ppn: usize) -> Topo {
        Topo {
            nodes,
            ranks: nodes * ppn,
            compute_capability: 80,
            amd_cpu: false,
            intra_hw: Hw::NvLink,
            channels: if nodes == 1 { 12 } else { 4 },
            bw_intra: if nodes == 1 { 20.0 } else { 12.0 },
            bw_inter: if nodes == 1 { 20.0 } else { 12.0 },
            latency_inter: 0.0,
            ll128: true,
            bw_scale: 1.0,
            lat_scale: 1.0,
        }
    }

    #[test]
    fn ring_latency_on_one_node_is_base_plus_steps() {
        // 4 ranks, all_reduce, Simple: 8.4 + 2*3 steps * 3.4 us (tuning.cc:248).
        let t = topo(1, 4);
        let c = costs(&t, Collective::AllReduce);
        let ring_simple = c
            .iter()
            .find(|c| c.algo == Algo::Ring && c.proto == Proto::Simple)
            .unwrap();
        assert!((ring_simple.latency - (8.4 + 6.0 * 3.4)).abs() < 1e-9);
        // busBw 12 * 20 = 240, algbw = 240 * 4 / 6.
        assert!((ring_simple.bandwidth - 160.0).abs() < 1e-9);
    }

    #[test]
    fn small_is_ll_large_is_simple() {
        let t = topo(4, 4);
        let small = choose(&t, Collective::AllReduce, 8).unwrap();
        let large = choose(&t, Collective::AllReduce, 1 << 30).unwrap();
        assert_eq!(small.proto, Proto::Ll);
        assert_eq!(large.proto, Proto::Simple);
        assert_eq!(large.algo, Algo::Ring);
    }
}
