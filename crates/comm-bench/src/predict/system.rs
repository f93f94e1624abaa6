//! A cluster as `comm-bench predict` reads it (a TOML file, or `leonardo` built in), and the
//! stand-in for NCCL's topology search that turns it into the model's [`Topo`].

use std::path::Path;

use serde::Deserialize;

use crate::error::BenchError;
use crate::model::nccl::{Hw, Topo};

/// The built-in description of Leonardo's Booster, with its sources.
pub const LEONARDO: &str = include_str!("../../systems/leonardo.toml");

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct System {
    pub name: String,
    /// One line for the output's header.
    pub description: String,
    /// 70 Volta, 80 Ampere, 90 Hopper: picks NCCL's per-generation rows.
    pub compute_capability: u32,
    pub gpus_per_node: usize,
    /// "intel", "amd" or "other": NCCL's network overhead and LL rows depend on it.
    pub cpu_vendor: String,
    pub intra: Intra,
    pub net: Net,
    /// GB/s of the GPU's memory: one GPU's "collective" is a copy (read and write) through it
    /// [default: 1555, the A100 40 GB datasheet's].
    #[serde(default = "a100_memory")]
    pub gpu_memory_gbs: f64,
    #[serde(default)]
    pub calibration: Calibration,
    /// Where the numbers come from, printed in the footer.
    #[serde(default)]
    pub sources: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Intra {
    /// "nvlink" or "pci": the graph's typeIntra.
    pub kind: String,
    /// Links per GPU (NVLink) or 1 (PCI).
    pub links_per_gpu: usize,
    /// GB/s per link and direction as NCCL counts it (topo.h: SM80_NVLINK_BW = 20).
    pub link_gbs: f64,
    /// Links from a GPU to each other GPU when they are wired directly (no NVSwitch): a ring
    /// through n GPUs of a node then reaches at most (n - 1) x this many links. Absent: a
    /// switch, every link usable whatever the GPU count.
    #[serde(default)]
    pub links_per_peer: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Net {
    /// NIC ports per node (each its own NCCL net device).
    pub nics_per_node: usize,
    /// Line rate per port, Gbit/s (NCCL reads the port's speed: GB/s = Gbit/s / 8).
    pub nic_gbps: f64,
    /// The net plugin's latency (graph->latencyInter), us: 0 for InfiniBand verbs.
    #[serde(default)]
    pub latency_us: f64,
    /// The NIC under the GPU's PCIe switch (path PXB or closer): NCCL then allows LL128 between
    /// nodes (tuning.cc:308).
    pub nic_near_gpu: bool,
}

/// Scales fitted by `--calibrate` (1 and 1: NCCL's model as it stands).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    #[serde(default = "one")]
    pub bw_scale: f64,
    #[serde(default = "one")]
    pub lat_scale: f64,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration {
            bw_scale: 1.0,
            lat_scale: 1.0,
        }
    }
}

fn a100_memory() -> f64 {
    1555.0
}

fn one() -> f64 {
    1.0
}

/// search.cc:850-851: the per-channel speeds NCCL's search tries, fastest first.
const SPEED_INTRA: [f64; 13] = [
    40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0,
];
const SPEED_INTER: [f64; 19] = [
    48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2,
    0.24, 0.12,
];
/// The search's channel limit (MAXCHANNELS / 2) before ncclTopoDupChannels doubles them.
const SEARCH_MAX_CHANNELS: usize = 16;

impl System {
    /// `leonardo`, or a TOML file's path.
    pub fn load(name: &str) -> Result<System, BenchError> {
        if name.eq_ignore_ascii_case("leonardo") {
            return System::parse(LEONARDO, Path::new("leonardo.toml"));
        }
        let path = Path::new(name);
        if !path.is_file() {
            return Err(BenchError::UnknownSystem(name.into()));
        }
        let text = std::fs::read_to_string(path).map_err(|source| BenchError::ReadFile {
            path: path.to_path_buf(),
            source,
        })?;
        System::parse(&text, path)
    }

    fn parse(text: &str, path: &Path) -> Result<System, BenchError> {
        let bad = |why: String| BenchError::BadSystem {
            path: path.to_path_buf(),
            why,
        };
        let s: System = toml::from_str(text).map_err(|e| {
            // toml's own message spans lines; one line with the line number instead.
            let line = e
                .span()
                .map_or(0, |r| text[..r.start].lines().count().max(1));
            bad(format!("line {line}: {}", e.message().trim()))
        })?;
        let positive = |v: f64| v.is_finite() && v > 0.0;
        let checks = [
            (s.gpus_per_node == 0, "gpus_per_node must be at least 1"),
            (
                !matches!(s.intra.kind.as_str(), "nvlink" | "pci"),
                "intra.kind must be \"nvlink\" or \"pci\"",
            ),
            (
                !matches!(s.cpu_vendor.as_str(), "intel" | "amd" | "other"),
                "cpu_vendor must be \"intel\", \"amd\" or \"other\"",
            ),
            (
                !(positive(s.intra.link_gbs) && s.intra.links_per_gpu > 0),
                "intra.links_per_gpu and intra.link_gbs must be positive",
            ),
            (
                !(positive(s.net.nic_gbps) && s.net.nics_per_node > 0),
                "net.nics_per_node and net.nic_gbps must be positive",
            ),
            (
                !positive(s.gpu_memory_gbs),
                "gpu_memory_gbs must be positive",
            ),
            (
                !(positive(s.calibration.bw_scale) && positive(s.calibration.lat_scale)),
                "calibration scales must be positive",
            ),
        ];
        match checks.iter().find(|(failed, _)| *failed) {
            Some((_, why)) => Err(bad((*why).into())),
            None => Ok(s),
        }
    }

    /// The model's inputs for `nodes` nodes of this system (gpus_per_node already applied).
    ///
    /// Stand-in for NCCL's topology search (search.cc): one node, each channel runs at the
    /// fastest speed in speedArrayIntra the GPU's links allow, as many channels as the links
    /// carry (at most 16), doubled at half speed when that speed is 25 GB/s or more
    /// (ncclTopoDupChannels). Between nodes, each channel uses one NIC at the fastest
    /// speedArrayInter speed a port allows, one channel per port (the port's bandwidth runs out),
    /// capped by what the GPU's links carry; bwIntra = bwInter as the search sets them.
    pub fn topo(&self, nodes: usize) -> Topo {
        let links = match self.intra.links_per_peer {
            Some(per_peer) => (per_peer * (self.gpus_per_node - 1)).min(self.intra.links_per_gpu),
            None => self.intra.links_per_gpu,
        };
        let intra_total = links.max(1) as f64 * self.intra.link_gbs;
        let fastest = |speeds: &[f64], cap: f64| {
            speeds
                .iter()
                .copied()
                .find(|&s| s <= cap)
                .unwrap_or(speeds[speeds.len() - 1])
        };
        let (channels, bw) = if nodes == 1 {
            let speed = fastest(&SPEED_INTRA, intra_total);
            let ch = ((intra_total / speed).floor() as usize).clamp(1, SEARCH_MAX_CHANNELS);
            if speed >= 25.0 {
                (ch * 2, speed / 2.0)
            } else {
                (ch, speed)
            }
        } else {
            let port = self.net.nic_gbps / 8.0;
            let speed = fastest(&SPEED_INTER, port.min(intra_total));
            let per_port = ((port / speed).floor() as usize).max(1);
            let ch = (self.net.nics_per_node * per_port).clamp(1, SEARCH_MAX_CHANNELS);
            let ch = ch.min(((intra_total / speed).floor() as usize).max(1));
            (ch, speed)
        };
        Topo {
            nodes,
            ranks: nodes * self.gpus_per_node,
            compute_capability: self.compute_capability,
            amd_cpu: self.cpu_vendor == "amd",
            intra_hw: if self.intra.kind == "nvlink" {
                Hw::NvLink
            } else {
                Hw::Pci
            },
            channels,
            bw_intra: bw,
            bw_inter: bw,
            latency_inter: self.net.latency_us,
            ll128: self.intra.kind == "nvlink" && (nodes == 1 || self.net.nic_near_gpu),
            bw_scale: self.calibration.bw_scale,
            lat_scale: self.calibration.lat_scale,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leonardo_parses_and_searches() {
        let s = System::load("leonardo").unwrap();
        assert_eq!(s.gpus_per_node, 4);
        let one = s.topo(1);
        assert_eq!((one.channels, one.bw_intra), (12, 20.0));
        let many = s.topo(8);
        assert_eq!((many.channels, many.bw_inter), (4, 12.0));
        assert_eq!(many.ranks, 32);
    }
}
