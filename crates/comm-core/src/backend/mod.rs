//! Backends: who does the collectives. `cpu` moves host memory with Gloo-style algorithms; `nccl`
//! (GPUs through cudarc) plugs in behind the same communicator. `auto` picks NCCL where a GPU
//! and libnccl are usable, else the CPU, and says which and why.

pub mod cpu;
pub mod nccl;

use std::fmt;

/// What the user asked for with `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// NCCL where a GPU and libnccl are usable, else the CPU.
    #[default]
    Auto,
    /// The CPU backend, even where a GPU is present.
    Cpu,
    /// NCCL on GPUs; an error where it cannot run.
    Nccl,
}

impl crate::named::Named for BackendChoice {
    const ALL: &'static [Self] = &[Self::Auto, Self::Cpu, Self::Nccl];

    fn name(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Cpu => "cpu",
            BackendChoice::Nccl => "nccl",
        }
    }
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

/// Call first thing in `main`, before any socket or rank exists ([`crate::launch`]'s entry points
/// do): where the only NCCL is `libnccl.so.2` (pip's wheels, runtime packages) and a CUDA driver
/// is present, it links it as `libnccl.so` in a private folder and restarts the program with
/// that folder on LD_LIBRARY_PATH, once (see [`nccl::relink::link_at_start`]). Elsewhere it
/// returns at once. A failure is remembered and becomes [`select`]'s reason.
pub fn prepare() -> crate::Result<()> {
    nccl::relink::link_at_start(nccl::relink::When::DriverPresent)
}

/// Decides the backend. Never panics: a missing driver or library is a reason, not a crash; and
/// has no side effects: where the only NCCL is a `libnccl.so.2` that [`prepare`] did not link,
/// the reason says how to fix it.
pub fn select(choice: BackendChoice) -> crate::Result<Selection> {
    let var = crate::topology::library_var;
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
        nccl::Probe::Relink(library) => unavailable(choice, unlinked(&library)),
        nccl::Probe::Unavailable(reason) => unavailable(choice, reason),
    }
}

/// Why an unlinked `libnccl.so.2` at `library` cannot be used, and how to fix that.
fn unlinked(library: &std::path::Path) -> String {
    match nccl::relink::start_failure() {
        Some(failure) => format!("libnccl.so.2 was found but could not be linked: {failure}"),
        None => format!(
            "only {} was found and cudarc loads libnccl.so; call \
             comm_core::backend::prepare() first thing in main (comm_core::launch does), or \
             link it yourself: `ln -s {} DIR/libnccl.so` with DIR on LD_LIBRARY_PATH",
            library.display(),
            library.display()
        ),
    }
}

/// NCCL cannot run: the CPU under `auto`, an error under `nccl`.
fn unavailable(choice: BackendChoice, reason: String) -> crate::Result<Selection> {
    match choice {
        BackendChoice::Nccl => Err(crate::CommError::Backend(format!(
            "NCCL cannot run here: {reason} (--backend cpu or auto runs on the CPU)"
        ))),
        _ => Ok(Selection {
            kind: BackendKind::Cpu,
            reason,
            gpus: 0,
        }),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unlinked_libnccl_so2_is_a_reason_with_the_fix_not_a_restart() {
        let so2 = std::path::Path::new("/venv/nvidia/nccl/lib/libnccl.so.2");
        let reason = unlinked(so2);
        assert!(
            reason.contains("comm_core::backend::prepare()")
                && reason.contains("ln -s /venv/nvidia/nccl/lib/libnccl.so.2 DIR/libnccl.so"),
            "{reason}"
        );
        let auto = unavailable(BackendChoice::Auto, reason.clone()).unwrap();
        assert_eq!((auto.kind, auto.gpus), (BackendKind::Cpu, 0));
        let nccl = unavailable(BackendChoice::Nccl, reason)
            .unwrap_err()
            .to_string();
        assert!(nccl.contains("NCCL cannot run here: only "), "{nccl}");
    }
}
