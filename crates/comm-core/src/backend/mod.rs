//! Backends: who does the collectives. `cpu` moves host memory with Gloo-style algorithms; `nccl`
//! (GPUs through cudarc) plugs in behind the same communicator. `auto` picks NCCL where a GPU
//! and libnccl are usable, else the CPU, and says which and why.

pub mod cpu;

use std::fmt;

/// What the user asked for with `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    Auto,
    Cpu,
    Nccl,
}

/// What actually runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    Nccl,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Nccl => "nccl",
        })
    }
}

/// The decision and the reason for it, as the first line of output shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub kind: BackendKind,
    pub reason: String,
    /// GPUs this node can give ranks (0 on the CPU backend).
    pub gpus: usize,
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "backend: {} ({})", self.kind, self.reason)
    }
}

/// Decides the backend. Never panics: a missing driver or library is a reason, not a crash.
pub fn select(choice: BackendChoice) -> crate::Result<Selection> {
    match choice {
        BackendChoice::Cpu => Ok(Selection {
            kind: BackendKind::Cpu,
            reason: "asked for with --backend cpu".into(),
            gpus: 0,
        }),
        BackendChoice::Auto => Ok(Selection {
            kind: BackendKind::Cpu,
            reason: "this build has no NCCL backend yet".into(),
            gpus: 0,
        }),
        BackendChoice::Nccl => Err(crate::CommError::Backend(
            "--backend nccl: this build has no NCCL backend yet; use --backend cpu (or auto)"
                .into(),
        )),
    }
}

/// Where a rank's buffers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// Host memory of CPU rank `n` (named after the rank, as `cuda:n` is after the GPU).
    Cpu(usize),
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu(n) => write!(f, "cpu:{n}"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}
