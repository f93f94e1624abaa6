//! What commrun's test files share: commrun as a user starts it, outside any launcher.

use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};

use test_support::process::Plainly;

const COMMRUN: &str = env!("CARGO_BIN_EXE_commrun");

/// commrun with `args`, none of a launcher's variables inherited (nor torchrun's restart
/// counters or OMP_NUM_THREADS, which commrun sets itself), output collected.
pub fn commrun(args: &[&str]) -> Command {
    let mut command = Command::new(COMMRUN);
    command
        .args(args)
        .plainly()
        .env_remove("OMP_NUM_THREADS")
        .env_remove("TORCHELASTIC_RESTART_COUNT")
        .env_remove("TORCHELASTIC_MAX_RESTARTS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

pub fn run(args: &[&str]) -> Output {
    commrun(args).output().unwrap()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Held by a test for its whole run: commrun checks that its master port (29500 unless told
/// otherwise) is free, so two of its runs at once in one test binary would refuse each other.
#[allow(dead_code)] // not every test file needs it
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static PORT: Mutex<()> = Mutex::new(());
    PORT.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
