//! The PyTorch that tests run our programs under: torchrun and the Python that has torch, from
//! the virtual environment `scripts/torch-env.sh` installs (its `dir` says where, so the folder
//! is named in that script alone; `NCCL_WORKSHOP_TORCH_VENV` overrides it).
//!
//! Where torch is missing a test says it skipped, unless `NCCL_WORKSHOP_REQUIRE_TORCH=1` (as
//! `.ci/run` sets), where that fails it — as `NCCL_WORKSHOP_REQUIRE_SLURM` does for Slurm.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::build::workspace_root;

/// The variable that turns a missing torch into a failure.
pub const REQUIRE: &str = "NCCL_WORKSHOP_REQUIRE_TORCH";

/// A virtual environment with torch installed.
#[derive(Debug, Clone)]
pub struct Torch {
    pub venv: PathBuf,
}

impl Torch {
    pub fn torchrun(&self) -> PathBuf {
        self.venv.join("bin/torchrun")
    }

    pub fn python(&self) -> PathBuf {
        self.venv.join("bin/python")
    }

    /// `PATH` with the environment's `bin` first, as after `source VENV/bin/activate`: a
    /// command written `torchrun …` finds this torchrun.
    pub fn path(&self) -> OsString {
        let mut dirs = vec![self.venv.join("bin")];
        dirs.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        std::env::join_paths(dirs).expect("PATH entries without ':'")
    }
}

/// Where `scripts/torch-env.sh dir` says the environment is.
pub fn venv_dir() -> PathBuf {
    let script = workspace_root().join("scripts/torch-env.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("dir")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} dir: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// torch, or why there is none here.
pub fn find() -> Result<Torch, String> {
    static FOUND: OnceLock<Result<Torch, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let venv = venv_dir();
            let torch = Torch { venv };
            if is_executable(&torch.torchrun()) && is_executable(&torch.python()) {
                Ok(torch)
            } else {
                Err(format!(
                    "no torch: {} is missing (bash scripts/torch-env.sh install)",
                    torch.torchrun().display()
                ))
            }
        })
        .clone()
}

/// torch for the test `what`; without it, says `skipped: what: why` and gives `None`, or fails
/// when torch is required here.
pub fn or_skip(what: &str) -> Option<Torch> {
    match find() {
        Ok(torch) => Some(torch),
        Err(why) => {
            assert!(!required(), "{REQUIRE}=1 but {why}");
            let _ = writeln!(std::io::stderr(), "skipped: {what}: {why}");
            None
        }
    }
}

/// Whether a missing torch fails the tests (`NCCL_WORKSHOP_REQUIRE_TORCH=1`).
pub fn required() -> bool {
    std::env::var(REQUIRE).is_ok_and(|v| v == "1")
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl Torch {
    /// A command as the docs write it (`torchrun …`, the program `target/release/NAME`, other
    /// paths relative to the repository root), to run here as written: its words (the docs'
    /// torchrun commands have no quotes), `target/release/` replaced by `bin` (where the build
    /// is), started from the repository root with this environment's `bin` first on `PATH`.
    pub fn as_written(&self, line: &str, bin: &Path) -> Command {
        let here = format!("{}/", bin.display());
        let words: Vec<String> = line
            .split_whitespace()
            .map(|w| match w.strip_prefix("target/release/") {
                Some(name) => format!("{here}{name}"),
                None => w.to_string(),
            })
            .collect();
        let (program, args) = words
            .split_first()
            .unwrap_or_else(|| panic!("an empty command: {line:?}"));
        // `torchrun`: this environment's, as PATH finds it after `source VENV/bin/activate`.
        let mut command = match program.as_str() {
            "torchrun" => Command::new(self.torchrun()),
            _ => Command::new(program),
        };
        command
            .args(args)
            .env("PATH", self.path())
            .current_dir(workspace_root());
        command
    }
}
