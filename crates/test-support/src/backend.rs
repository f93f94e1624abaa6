//! The `backend: <kind> (<reason>)` line the course's programs print first, read back so that
//! tests assert what holds on the machine they run on (CPU only, or GPUs with NCCL) instead of
//! assuming one.

use crate::process::Plainly;
use std::path::Path;
use std::process::Command;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Cpu,
    Nccl,
}

/// What a program said runs its collectives, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub kind: Kind,
    /// `requested`, why NCCL cannot run (`no CUDA driver found`), or what NCCL runs on
    /// (`1 GPU, NCCL 2.21.5`).
    pub reason: String,
}

impl Backend {
    /// `backend: cpu (no CUDA driver found)` or `backend: nccl (2 GPUs, NCCL 2.21.5)`.
    pub fn parse(line: &str) -> Option<Backend> {
        let rest = line.strip_prefix("backend: ")?;
        let (kind, reason) = rest.split_once(" (")?;
        let kind = match kind {
            "cpu" => Kind::Cpu,
            "nccl" => Kind::Nccl,
            _ => return None,
        };
        Some(Backend {
            kind,
            reason: reason.strip_suffix(')')?.to_string(),
        })
    }

    /// The backend line that starts `stdout`; fails the test without one.
    pub fn first_line_of(stdout: &str) -> Backend {
        stdout
            .lines()
            .next()
            .and_then(Backend::parse)
            .unwrap_or_else(|| panic!("no `backend: KIND (REASON)` first line in:\n{stdout}"))
    }

    /// The line as the programs print it.
    pub fn line(&self) -> String {
        let kind = match self.kind {
            Kind::Cpu => "cpu",
            Kind::Nccl => "nccl",
        };
        format!("backend: {kind} ({})", self.reason)
    }

    /// GPUs NCCL runs on (the reason starts with their number); 0 on the CPU backend.
    pub fn gpus(&self) -> usize {
        match self.kind {
            Kind::Cpu => 0,
            Kind::Nccl => self
                .reason
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no GPU count in {:?}", self.line())),
        }
    }
}

/// What `--backend auto` picks here, as one rank of `program` (a course example) says it.
/// `envs` are set for it (e.g. `CUDA_VISIBLE_DEVICES` to hide GPUs).
pub fn on_this_machine(program: &Path, envs: &[(&str, &str)]) -> Backend {
    let mut command = Command::new(program);
    command
        .args(["-n", "1", "--backend", "auto", "--timeout", "60"])
        .envs(envs.iter().copied());
    command.plainly();
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{} -n 1 failed:\n{stdout}\n{}",
        program.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Backend::first_line_of(&stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_back() {
        let cpu = Backend::parse("backend: cpu (no CUDA driver found)").unwrap();
        assert_eq!(
            (cpu.kind, cpu.reason.as_str()),
            (Kind::Cpu, "no CUDA driver found")
        );
        assert_eq!(cpu.gpus(), 0);
        let line = "backend: nccl (2 GPUs, NCCL 2.21.5, libnccl.so.2 linked as libnccl.so)";
        let nccl = Backend::parse(line).unwrap();
        assert_eq!((nccl.kind, nccl.gpus()), (Kind::Nccl, 2));
        assert_eq!(nccl.line(), line);
        assert_eq!(Backend::parse("backend: gpu (x)"), None);
        assert_eq!(Backend::parse("Rank 0 using device: cpu:0"), None);
    }
}
