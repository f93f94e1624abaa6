//! The binaries a test runs, brought up to date before it runs them.
//!
//! `cargo test -p X` builds X's tests but not the examples or other packages' binaries they
//! start, and a binary left over from an earlier build would test old code. So every request
//! runs cargo (quick when nothing changed), once per test process for each build command, with
//! the test's own profile and target folder, and returns the binary's path.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// An example of the root package (`examples/NAME.rs`); builds all of them.
pub fn example(name: &str) -> PathBuf {
    package_example("nccl-workshop", name)
}

/// An example of `package` (e.g. comm-core's `collective-check`); builds all of its examples.
pub fn package_example(package: &str, name: &str) -> PathBuf {
    cargo_build(&["--examples", "-p", package]);
    let path = profile_dir().join("examples").join(name);
    assert!(
        path.is_file(),
        "cargo built {package}'s examples but there is no {}",
        path.display()
    );
    path
}

/// The binary `name` of `package` (e.g. commrun's `commrun`).
pub fn binary(package: &str, name: &str) -> PathBuf {
    cargo_build(&["-p", package, "--bin", name]);
    let path = profile_dir().join(name);
    assert!(
        path.is_file(),
        "cargo built {package} but there is no {}",
        path.display()
    );
    path
}

/// The one build command, as README.md shows it (and slurm/common.sh tells a job to run).
pub const THE_BUILD: &str = "cargo build --release";

/// Runs [`THE_BUILD`] as a user would before running `target/release/<program>`, once per test
/// process, in this test's target folder; returns where it puts the binaries (the folder the
/// README and the scripts call `target/release`). Checks that README.md and slurm/common.sh
/// still name that command.
pub fn the_one_build() -> PathBuf {
    static DONE: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut done = DONE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(dir) = done.as_ref() {
        return dir.clone();
    }
    let root = workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        readme.contains(&format!("\n{THE_BUILD}\n")),
        "README.md does not show `{THE_BUILD}`"
    );
    let common = std::fs::read_to_string(root.join("slurm/common.sh")).unwrap();
    assert!(
        common.contains(&format!("BUILD_COMMAND=\"{THE_BUILD}\"")),
        "slurm/common.sh tells jobs another build command than `{THE_BUILD}`"
    );
    let target = profile_dir()
        .parent()
        .expect("the target folder")
        .to_path_buf();
    let mut words = THE_BUILD.split_whitespace();
    assert_eq!(words.next(), Some("cargo"));
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo
        .args(words)
        .arg("--quiet")
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(&root);
    let status = cargo
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cargo:?}: {e}"));
    assert!(status.success(), "{cargo:?} failed");
    let dir = target.join("release");
    *done = Some(dir.clone());
    dir
}

/// Where cargo put this test's profile: `target/<profile>`, the test being
/// `target/<profile>/deps/<test>-<hash>`. Binaries are here, examples in `examples/`.
pub fn profile_dir() -> PathBuf {
    let test_exe = std::env::current_exe().expect("the test executable's path");
    let deps = test_exe.parent().expect("the test's folder");
    assert!(
        deps.ends_with("deps"),
        "{} is not in target/<profile>/deps",
        test_exe.display()
    );
    deps.parent().expect("target/<profile>").to_path_buf()
}

/// `cargo build ARGS` in this test's profile and target folder, unless this process ran it.
fn cargo_build(args: &[&str]) {
    static DONE: Mutex<BTreeSet<Vec<String>>> = Mutex::new(BTreeSet::new());
    let key: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    // Held while cargo runs: a second test asking for the same thing waits for it. A panic
    // while held (a failed build) leaves it poisoned, and the next caller simply tries again.
    let mut done = DONE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if done.contains(&key) {
        return;
    }
    let profile_dir = profile_dir();
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo
        .arg("build")
        .arg("--quiet")
        .args(profile_args(&profile_dir))
        .arg("--target-dir")
        .arg(profile_dir.parent().expect("the target folder"))
        .args(args)
        .current_dir(workspace_root());
    let status = cargo
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cargo:?}: {e}"));
    assert!(status.success(), "{cargo:?} failed");
    done.insert(key);
}

/// The flags that build into `profile_dir` again: its folder is named after the profile,
/// except the dev (and test) profile's, `debug`.
fn profile_args(profile_dir: &Path) -> Vec<String> {
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => vec![],
        Some("release") => vec!["--release".into()],
        Some(other) => vec!["--profile".into(), other.into()],
    }
}

/// The workspace's root (where the root Cargo.toml is), from this crate's place in it.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root")
}
