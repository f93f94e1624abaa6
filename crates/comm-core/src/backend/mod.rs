//! Backends: who does the collectives. `cpu` moves host memory with Gloo-style algorithms; `nccl`
//! (GPUs through cudarc) plugs in behind the same communicator. `auto` picks NCCL where a GPU
//! and libnccl are usable, else the CPU, and says which and why.

pub mod cpu;
pub mod nccl;

use std::fmt;

/// What the user asked for with `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// NCCL where a GPU and libnccl are usable, else the CPU.
    Auto,
    /// The CPU backend, even where a GPU is present.
    Cpu,
    /// NCCL on GPUs; an error where it cannot run.
    Nccl,
}

/// What actually runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Host memory, with Gloo-style algorithms over TCP or channels.
    Cpu,
    /// GPUs, one per rank, through NCCL.
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
    /// The backend that runs.
    pub kind: BackendKind,
    /// Why: "requested", the GPUs and NCCL version found, or what NCCL lacks here.
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
///
/// When the only NCCL around is `libnccl.so.2` (pip's wheels, runtime packages), this restarts
/// the program with a `libnccl.so` link to it on LD_LIBRARY_PATH (see [`nccl::library`]); the
/// restarted program decides again and finds it.
pub fn select(choice: BackendChoice) -> crate::Result<Selection> {
    let var = |name: &str| std::env::var(name).ok();
    let cpu = |reason: String| Selection {
        kind: BackendKind::Cpu,
        reason,
        gpus: 0,
    };
    if choice == BackendChoice::Cpu {
        return Ok(cpu("requested".into()));
    }
    match nccl::probe(&nccl::ThisMachine(var)) {
        nccl::Probe::Ready { gpus, version } => Ok(Selection {
            kind: BackendKind::Nccl,
            reason: format!(
                "{gpus} GPU{}, NCCL {version}{}",
                if gpus == 1 { "" } else { "s" },
                if nccl::library::relinked(&var) {
                    ", libnccl.so.2 linked as libnccl.so"
                } else {
                    ""
                }
            ),
            gpus,
        }),
        nccl::Probe::Relink(library) => Err(nccl::library::restart_with_link(&library, &var)),
        nccl::Probe::Unavailable(reason) if choice == BackendChoice::Auto => Ok(cpu(reason)),
        nccl::Probe::Unavailable(reason) => Err(crate::CommError::Backend(format!(
            "NCCL cannot run here: {reason} (--backend cpu or auto runs on the CPU)"
        ))),
    }
}

/// Where a rank's buffers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// Host memory of CPU rank `n` (named after the rank, as `cuda:n` is after the GPU).
    Cpu(usize),
    /// GPU `n` as CUDA numbers the GPUs this process sees (after CUDA_VISIBLE_DEVICES).
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
