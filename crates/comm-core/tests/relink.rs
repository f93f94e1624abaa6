//! The ranks of a node relink libnccl at the same moment (each finds only pip's `libnccl.so.2`
//! and links it as `libnccl.so` in the same private folder before restarting): every one must
//! succeed, the link must point at the wheel's library, and no temporary name may be left.
//!
//! Eight processes (this test binary, re-executed with `NCCL_WORKSHOP_RELINK_PROCESS` set) share
//! a fresh TMPDIR and relink together, round after round: into a fresh folder, over a missing
//! link, over a link to the wrong file, and over the right link (which must be left as it is).
//!
//! The library is the real one from pip's wheel, as in `nccl_probe.rs`: its folder comes
//! from NCCL_WORKSHOP_TEST_LIBNCCL (`.ci/run` installs it); without it the test says it skipped,
//! unless NCCL_WORKSHOP_REQUIRE_LIBNCCL=1.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use comm_core::backend::nccl::library::link_folder;
use test_support::process::{scratch, start, Plainly, Running};

const PROCESSES: usize = 8;
const ROUNDS: usize = 300;
/// Set on the re-executed processes: their index.
const ROLE: &str = "NCCL_WORKSHOP_RELINK_PROCESS";
/// The folder through which the test and the processes say when to go and what happened.
const SYNC: &str = "NCCL_WORKSHOP_RELINK_SYNC";
/// The `libnccl.so.2` to link.
const LIBRARY: &str = "NCCL_WORKSHOP_RELINK_LIBRARY";
/// How long anyone waits for the others.
const LIMIT: Duration = Duration::from_secs(60);

/// One rank of the node: each round it says it is ready, waits for the go (spinning, so that all
/// start within a moment), relinks, and writes `ok FOLDER` or `error MESSAGE`.
fn as_process(index: &str) -> ! {
    let sync = PathBuf::from(std::env::var_os(SYNC).unwrap());
    let library = PathBuf::from(std::env::var_os(LIBRARY).unwrap());
    for round in 0..ROUNDS {
        std::fs::write(sync.join(format!("ready-{round}-{index}")), "").unwrap();
        let go = sync.join(format!("go-{round}"));
        let deadline = Instant::now() + LIMIT;
        while !go.exists() {
            if Instant::now() > deadline {
                eprintln!("process {index}: no go for round {round} within {LIMIT:?}");
                std::process::exit(2);
            }
            std::thread::yield_now();
        }
        let said = match link_folder(&library) {
            Ok(folder) => format!("ok {}", folder.display()),
            Err(e) => format!("error {e}"),
        };
        // Written whole under another name, then renamed: the test never reads half of it.
        let partial = sync.join(format!(".done-{round}-{index}"));
        std::fs::write(&partial, said).unwrap();
        std::fs::rename(&partial, sync.join(format!("done-{round}-{index}"))).unwrap();
    }
    std::process::exit(0)
}

/// The wheel's `libnccl.so.2` (its real path), or None when the test is to skip.
fn wheel_library() -> Option<PathBuf> {
    test_support::libnccl::wheel_or_skip().map(|wheel| test_support::libnccl::so2(&wheel))
}

/// Waits until `dir` has every one of `names` (a process that died fails the test here, at the
/// deadline; the processes are killed as the test unwinds).
fn wait_for_files(dir: &Path, names: &[String]) {
    let deadline = Instant::now() + LIMIT;
    while !names.iter().all(|n| dir.join(n).exists()) {
        assert!(
            Instant::now() < deadline,
            "not all of {names:?} appeared in {} within {LIMIT:?}",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn eight_processes_relinking_at_once_all_succeed() {
    if let Ok(index) = std::env::var(ROLE) {
        as_process(&index);
    }
    let Some(library) = wheel_library() else {
        return;
    };
    let dir = scratch("relink");
    let tmpdir = dir.join("tmp");
    let sync = dir.join("sync");
    std::fs::create_dir(&tmpdir).unwrap();
    std::fs::create_dir(&sync).unwrap();
    let wrong = tmpdir.join("not-libnccl.so.2");
    std::fs::write(&wrong, b"not the library").unwrap();
    let processes: Vec<Running> = (0..PROCESSES)
        .map(|index| {
            start(
                Command::new(std::env::current_exe().unwrap())
                    .args([
                        "eight_processes_relinking_at_once_all_succeed",
                        "--exact",
                        "--nocapture",
                        "--test-threads=1",
                    ])
                    .plainly()
                    .env(ROLE, index.to_string())
                    .env(SYNC, &sync)
                    .env(LIBRARY, &library)
                    .env("TMPDIR", &tmpdir),
            )
        })
        .collect();
    let mut folder: Option<PathBuf> = None;
    for round in 0..ROUNDS {
        let ready: Vec<String> = (0..PROCESSES)
            .map(|i| format!("ready-{round}-{i}"))
            .collect();
        wait_for_files(&sync, &ready);
        // Round 0 links into a fresh TMPDIR; then, in turn, over no link, over a link to the
        // wrong file, and over the right link, which must stay the very same link.
        let link = folder.as_ref().map(|f| f.join("libnccl.so"));
        let kept_inode = match (&link, round % 3) {
            (None, _) => None,
            (Some(link), 1) => {
                std::fs::remove_file(link).unwrap();
                None
            }
            (Some(link), 2) => {
                std::fs::remove_file(link).unwrap();
                std::os::unix::fs::symlink(&wrong, link).unwrap();
                None
            }
            (Some(link), _) => Some(std::fs::symlink_metadata(link).unwrap().ino()),
        };
        std::fs::write(sync.join(format!("go-{round}")), "").unwrap();
        let done: Vec<String> = (0..PROCESSES)
            .map(|i| format!("done-{round}-{i}"))
            .collect();
        wait_for_files(&sync, &done);
        for (index, name) in done.iter().enumerate() {
            let said = std::fs::read_to_string(sync.join(name)).unwrap();
            let Some(reported) = said.strip_prefix("ok ").map(PathBuf::from) else {
                panic!("round {round}: process {index} failed to relink: {said}");
            };
            let expected = folder.get_or_insert_with(|| reported.clone());
            assert_eq!(&reported, expected, "round {round}: process {index}");
        }
        let folder = folder.as_ref().unwrap();
        assert!(folder.starts_with(&tmpdir), "{}", folder.display());
        let link = folder.join("libnccl.so");
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            library,
            "round {round}: the link points at the wheel's libnccl.so.2"
        );
        if let Some(inode) = kept_inode {
            assert_eq!(
                std::fs::symlink_metadata(&link).unwrap().ino(),
                inode,
                "round {round}: the right link was made again"
            );
        }
        // Nothing but the link: no temporary name left, in its folder or above it.
        assert_eq!(names_in(folder), ["libnccl.so"], "round {round}");
        let mine = folder.parent().unwrap();
        assert_eq!(
            names_in(mine),
            [folder.file_name().unwrap().to_string_lossy().into_owned()],
            "round {round}"
        );
        assert_eq!(
            names_in(&tmpdir),
            [
                mine.file_name().unwrap().to_string_lossy().into_owned(),
                "not-libnccl.so.2".into()
            ],
            "round {round}"
        );
    }
    for (index, process) in processes.into_iter().enumerate() {
        process
            .finish(LIMIT)
            .assert_success(&format!("process {index}"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
