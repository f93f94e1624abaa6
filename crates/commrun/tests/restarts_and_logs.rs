//! torchrun's `--max-restarts`, `--log-dir`, `--redirects`, `--tee` and `--local-ranks-filter`,
//! run as a user runs them: workers that are shell scripts (`sh -c`), and, where the ranks must
//! really meet at rank 0's store, this test binary as the worker (started by commrun with
//! `RESTART_TEST_WORKER` set, the test function runs `comm_core::launch` instead of checking).

use std::path::{Path, PathBuf};

use std::time::Duration;

use clap::Parser;
use comm_core::launch;
use comm_core::LaunchArgs;
use test_support::process::{assert_all_gone, scratch, start, wait_for_pid_files};

mod common;
use common::{commrun, run, text};

/// Runs commrun and checks its exit code; returns stdout and stderr.
fn expect(code: i32, args: &[&str]) -> (String, String) {
    let out = run(args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(code),
        "commrun {args:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    (stdout, stderr)
}

/// `commrun FLAGS [--log-dir LOG_DIR] sh -c SCRIPT`, expecting exit code `code`; FLAGS is split
/// at spaces.
fn sh(code: i32, flags: &str, log_dir: Option<&Path>, script: &str) -> (String, String) {
    let mut args: Vec<&str> = flags.split_whitespace().collect();
    if let Some(dir) = log_dir {
        args.extend(["--log-dir", dir.to_str().unwrap()]);
    }
    args.extend(["sh", "-c", script]);
    expect(code, &args)
}

/// Lines of `text` that contain `needle`.
fn lines_with<'a>(text: &'a str, needle: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.contains(needle)).collect()
}

/// Says which start it is on stdout and stderr; local rank 1 fails (code 3) on the first start.
const FAILS_ONCE: &str = "echo \"out $LOCAL_RANK start $TORCHELASTIC_RESTART_COUNT of \
     max $TORCHELASTIC_MAX_RESTARTS\"; echo \"err $LOCAL_RANK start $TORCHELASTIC_RESTART_COUNT\" >&2; \
     if [ $LOCAL_RANK = 1 ] && [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exit 3; fi";

#[test]
fn a_worker_that_fails_on_its_first_start_finishes_on_the_second() {
    let _port = common::one_at_a_time();
    let (stdout, stderr) = sh(0, "--nproc-per-node 2 --max-restarts 2", None, FAILS_ONCE);
    assert_eq!(
        lines_with(&stderr, "restarting"),
        ["commrun: rank 1 exited with code 3; restarting the worker group (attempt 2 of 3)"],
        "{stderr}"
    );
    // Every worker of both starts ran, and knew which start it was.
    for rank in 0..2 {
        for start in 0..2 {
            let line = format!("[{rank}]: out {rank} start {start} of max 2");
            assert_eq!(lines_with(&stdout, &line).len(), 1, "{line}:\n{stdout}");
        }
    }
    // Without --max-restarts the same worker fails the job, and the workers are told 0 and 0.
    let (stdout, stderr) = sh(3, "--nproc-per-node 2", None, FAILS_ONCE);
    assert!(stdout.contains("[1]: out 1 start 0 of max 0"), "{stdout}");
    assert!(!stderr.contains("restart"), "{stderr}");
}

#[test]
fn when_the_restarts_run_out_the_summary_is_the_last_failures() {
    let _port = common::one_at_a_time();
    let script = "echo \"failing on start $TORCHELASTIC_RESTART_COUNT\" >&2; \
                  if [ $RANK = 1 ]; then exit 7; fi; exec sleep 60";
    let (_, stderr) = sh(7, "--nproc-per-node 2 --max-restarts 2", None, script);
    let restarts = lines_with(&stderr, "restarting the worker group");
    assert_eq!(
        restarts,
        [
            "commrun: rank 1 exited with code 7; restarting the worker group (attempt 2 of 3)",
            "commrun: rank 1 exited with code 7; restarting the worker group (attempt 3 of 3)",
        ],
        "{stderr}"
    );
    let after = stderr
        .split_once(
            "commrun: the worker group failed 3 times, no restart left (--max-restarts 2)\n",
        )
        .unwrap_or_else(|| panic!("no giving-up line:\n{stderr}"))
        .1;
    // The summary of the last start, as without restarts.
    assert!(
        after.starts_with("commrun: error: rank 1 exited with code 7\nRoot cause"),
        "{after}"
    );
    assert!(after.contains("  ended      : exit code 7"), "{after}");
    assert!(after.contains("    | failing on start 2"), "{after}");
    assert!(after.ends_with("exit code 7\n"), "{after}");
}

#[test]
fn an_interrupt_never_restarts() {
    let _port = common::one_at_a_time();
    for (signal, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let dir = scratch(&format!("restart-interrupt-{signal}"));
        // The workers fail when interrupted (exit 1): an interrupt still does not restart them.
        let script = format!(
            "trap 'exit 1' INT TERM; echo $$ > {0}/$RANK.tmp && mv {0}/$RANK.tmp {0}/$RANK; \
             while :; do sleep 0.1; done",
            dir.display()
        );
        let job = start(&mut commrun(&[
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "3",
            "sh",
            "-c",
            &script,
        ]));
        let pids = wait_for_pid_files(&dir, 0..2, Duration::from_secs(30));
        job.signal(signal);
        let done = job.finish(Duration::from_secs(60));
        assert_eq!(done.code_or_signal(), code, "{}", done.stderr);
        assert!(!done.stderr.contains("restarting"), "{}", done.stderr);
        assert!(
            done.stderr
                .contains(&format!("interrupted by signal {signal}")),
            "{}",
            done.stderr
        );
        assert_all_gone(&pids);
    }
}

/// What a worker does in `restarted_ranks_meet_again_at_the_same_port` (this test binary,
/// started by commrun): meet the others, say so, and on the first start rank 1 fails.
fn as_worker() -> ! {
    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        launch: LaunchArgs,
    }
    let args = Args::parse_from(["worker", "--backend", "cpu", "--timeout", "60"]);
    let start = std::env::var("TORCHELASTIC_RESTART_COUNT").unwrap();
    let settings = args.launch.settings(&[]).unwrap();
    let code = launch::run_settings(&settings, |comm| {
        println!("rank {} met the others on start {start}", comm.rank());
        // Every rank has said so before rank 1 leaves: a rank that vanishes ends the others at
        // once, wherever they are.
        comm.barrier()?;
        if comm.rank() == 1 && start == "0" {
            eprintln!("rank 1 fails after the rendezvous");
            std::process::exit(3);
        }
        Ok(())
    });
    std::process::exit(code)
}

#[test]
fn restarted_ranks_meet_again_at_the_same_port() {
    let _port = common::one_at_a_time();
    if std::env::var_os("RESTART_TEST_WORKER").is_some() {
        as_worker();
    }
    // Rank 0 serves the store at MASTER_PORT on each start: the second binds it again while the
    // first's connections may linger in TIME_WAIT (std's listeners set SO_REUSEADDR).
    let port = comm_core::spawn::free_port().unwrap().to_string();
    let out = commrun(&[
        "--nproc-per-node",
        "2",
        "--master-port",
        &port,
        "--max-restarts",
        "1",
        "--",
    ])
    .arg(std::env::current_exe().unwrap())
    .args([
        "restarted_ranks_meet_again_at_the_same_port",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("RESTART_TEST_WORKER", "1")
    .output()
    .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    // (The test harness of each worker prints its own words before the worker's.)
    for (rank, start) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let said = format!("rank {rank} met the others on start {start}");
        let lines = stdout
            .lines()
            .filter(|l| l.starts_with(&format!("[{rank}]: ")) && l.ends_with(&said));
        assert_eq!(lines.count(), 1, "{said}:\n{stdout}");
    }
    // Rank 0 may fail too (rank 1 vanished under it), after rank 1: the root cause is rank 1's.
    assert!(
        stderr.contains("rank 1 exited with code 3")
            && stderr.contains("restarting the worker group (attempt 2 of 2)"),
        "{stderr}"
    );
}

/// The one run directory commrun made in `log_dir`, checked to be named `<run_id>_XXXXXXXX`.
fn run_dir(log_dir: &Path, run_id: &str) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(log_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let name = dirs[0].file_name().unwrap().to_str().unwrap();
    let suffix = name
        .strip_prefix(&format!("{run_id}_"))
        .unwrap_or_else(|| panic!("{name} is not {run_id}_XXXXXXXX"));
    assert_eq!(suffix.len(), 8, "{name}");
    dirs[0].clone()
}

/// Every file under `dir`, relative to it, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, base, out);
            } else {
                out.push(path.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn tee_writes_torchruns_layout_for_every_start_and_shows_the_lines_too() {
    let _port = common::one_at_a_time();
    let logs = scratch("logs-tee");
    let (stdout, stderr) = sh(
        0,
        "--nproc-per-node 2 --max-restarts 1 --rdzv-id run-42 --tee 3",
        Some(&logs),
        FAILS_ONCE,
    );
    let run = run_dir(&logs, "run-42");
    assert!(
        stderr.contains(&format!(
            "commrun: log files in {}/attempt_<restart>/<local rank>/\n",
            run.display()
        )),
        "{stderr}"
    );
    let mut expected = Vec::new();
    for start in 0..2 {
        for rank in 0..2 {
            let dir = format!("attempt_{start}/{rank}");
            expected.extend([format!("{dir}/stderr.log"), format!("{dir}/stdout.log")]);
            // The files have the lines, without the console's prefix; the console has them too.
            let out = read(run.join(&dir).join("stdout.log"));
            assert_eq!(out, format!("out {rank} start {start} of max 1\n"));
            assert!(stdout.contains(&format!("[{rank}]: {out}")), "{stdout}");
            let err = read(run.join(&dir).join("stderr.log"));
            assert_eq!(err, format!("err {rank} start {start}\n"));
            assert!(stderr.contains(&format!("[{rank}]: {err}")), "{stderr}");
        }
    }
    assert_eq!(files_under(&run), expected);
}

#[test]
fn redirects_write_only_the_files_per_stream_and_per_rank() {
    let _port = common::one_at_a_time();
    let logs = scratch("logs-redirect");
    let script = "echo out-$LOCAL_RANK; echo err-$LOCAL_RANK >&2";
    // Local rank 0's stdout and rank 1's stderr go to files only; the rest to the console.
    let (stdout, stderr) = sh(
        0,
        "--nproc-per-node 3 --rdzv-id r -r 0:1,1:2",
        Some(&logs),
        script,
    );
    let run = run_dir(&logs, "r");
    assert_eq!(
        files_under(&run),
        ["attempt_0/0/stdout.log", "attempt_0/1/stderr.log"]
    );
    assert_eq!(read(run.join("attempt_0/0/stdout.log")), "out-0\n");
    assert_eq!(read(run.join("attempt_0/1/stderr.log")), "err-1\n");
    let mut shown: Vec<&str> = stdout.lines().collect();
    shown.sort();
    assert_eq!(shown, ["[1]: out-1", "[2]: out-2"]);
    let mut shown = lines_with(&stderr, "]: err-");
    shown.sort();
    assert_eq!(shown, ["[0]: err-0", "[2]: err-2"]);
}

#[test]
fn the_filter_keeps_other_ranks_off_the_console_but_in_their_files() {
    let _port = common::one_at_a_time();
    let logs = scratch("logs-filter");
    let script = "echo out-$LOCAL_RANK; echo err-$LOCAL_RANK >&2";
    let (stdout, stderr) = sh(
        0,
        "--nproc-per-node 3 --local-ranks-filter 0,2 --rdzv-id f --tee 3",
        Some(&logs),
        script,
    );
    let mut shown: Vec<&str> = stdout.lines().collect();
    shown.sort();
    assert_eq!(shown, ["[0]: out-0", "[2]: out-2"]);
    assert!(!stderr.contains("err-1"), "{stderr}");
    assert_eq!(lines_with(&stderr, "]: err-").len(), 2, "{stderr}");
    let run = run_dir(&logs, "f");
    assert_eq!(read(run.join("attempt_0/1/stdout.log")), "out-1\n");
    assert_eq!(read(run.join("attempt_0/1/stderr.log")), "err-1\n");

    // Without files, the filter alone; a filtered rank that fails still has its summary.
    let script = "echo out-$LOCAL_RANK; if [ $LOCAL_RANK = 1 ]; then echo why >&2; exit 5; fi";
    let (stdout, stderr) = sh(5, "--nproc-per-node 2 --local_ranks_filter 0", None, script);
    assert!(
        !stdout.contains("out-1") && !stderr.contains("[1]: why"),
        "{stdout}{stderr}"
    );
    assert!(
        stderr.contains("commrun: error: rank 1 exited with code 5"),
        "{stderr}"
    );
    assert!(stderr.contains("    | why"), "{stderr}");
}

#[test]
fn without_log_dir_the_files_go_to_a_new_folder_that_commrun_names() {
    let _port = common::one_at_a_time();
    let (_, stderr) = sh(
        0,
        "--nproc-per-node 2 --redirects 3 --rdzv-id t",
        None,
        "echo hi",
    );
    let line = lines_with(&stderr, "commrun: log files in ");
    assert_eq!(line.len(), 1, "{stderr}");
    let path = line[0]
        .strip_prefix("commrun: log files in ")
        .and_then(|l| {
            l.strip_suffix("/attempt_<restart>/<local rank>/ (no --log-dir given: a new directory)")
        })
        .unwrap_or_else(|| panic!("{}", line[0]));
    let run = PathBuf::from(path);
    let temp_root = run.parent().unwrap();
    assert_eq!(temp_root.parent().unwrap(), std::env::temp_dir());
    assert!(
        temp_root
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("commrun_"),
        "{}",
        temp_root.display()
    );
    assert_eq!(read(run.join("attempt_0/1/stdout.log")), "hi\n");
    std::fs::remove_dir_all(temp_root).unwrap();
}

#[test]
fn bad_values_get_one_clear_line_and_exit_code_2() {
    let _port = common::one_at_a_time();
    let fails = |args: &str, expected: &str| {
        let (_, stderr) = expect(2, &args.split_whitespace().collect::<Vec<_>>());
        let first = stderr.lines().next().unwrap_or_default();
        assert!(
            first.contains(expected),
            "commrun {args}: {expected:?} not in the first line of\n{stderr}"
        );
    };
    fails(
        "--max-restarts -1 true",
        "invalid value '-1' for '--max-restarts <N>': give a number of restarts, 0 or more",
    );
    fails(
        "--redirects 7 true",
        "\"7\" is not 0 (none), 1 (stdout), 2 (stderr) or 3 (both)",
    );
    fails(
        "--tee 0:9 true",
        "local rank 0: \"9\" is not 0 (none), 1 (stdout)",
    );
    fails(
        "--local-ranks-filter zero true",
        "\"zero\" is not a local rank",
    );
    fails(
        "--nproc-per-node 2 --tee 2:3 true",
        "commrun: error: --tee names local rank 2, but this node runs local ranks 0 to 1",
    );
    fails(
        "--max-restarts 1 --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 true",
        "commrun: error: --max-restarts 1 with 2 nodes: commrun restarts the workers of one \
         node only",
    );
    // A --log-dir that cannot be made, or is a file: said before any worker starts.
    let dir = scratch("logs-bad");
    let file = dir.join("a-file");
    std::fs::write(&file, "").unwrap();
    let under_file = file.join("logs");
    let (_, stderr) = sh(2, "--tee 3", Some(&under_file), "echo ran");
    assert_eq!(
        stderr,
        format!(
            "commrun: error: --log-dir {}: cannot make it: Not a directory (os error 20)\n",
            under_file.display()
        )
    );
    let (stdout, stderr) = sh(2, "-t 3", Some(&file), "echo ran");
    assert_eq!(
        stderr,
        format!(
            "commrun: error: --log-dir {} is a file, not a directory\n",
            file.display()
        )
    );
    assert_eq!(stdout, "");
}

/// The workspace's root, where README.md and docs/ are.
fn workspace_file(path: &str) -> String {
    read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(path),
    )
}

const BOOK: &str = "docs/src/commrun-reference.md";

/// The restart example of the book, run as it is shown there.
const BOOK_RESTART: &str = "commrun --nproc-per-node 2 --max-restarts 2 sh -c 'echo \"rank $RANK, \
     start $TORCHELASTIC_RESTART_COUNT\"; [ \"$RANK$TORCHELASTIC_RESTART_COUNT\" != 10 ] || exit 3'";

#[test]
fn the_books_restart_example_prints_what_the_book_shows() {
    let _port = common::one_at_a_time();
    let book = workspace_file(BOOK);
    let (_, after) = book
        .split_once(&format!("```bash\n{BOOK_RESTART}\n```"))
        .unwrap_or_else(|| panic!("{BOOK} no longer shows `{BOOK_RESTART}`"));
    let shown = after
        .split("```text\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let script = BOOK_RESTART
        .split_once("sh -c '")
        .unwrap()
        .1
        .strip_suffix('\'')
        .unwrap();
    let (stdout, stderr) = sh(0, "--nproc-per-node 2 --max-restarts 2", None, script);
    // The ranks' lines come in any order, and stdout and stderr apart: compared as sets.
    let mut printed: Vec<&str> = stdout.lines().chain(stderr.lines()).collect();
    let mut shown: Vec<&str> = shown.lines().collect();
    printed.sort();
    shown.sort();
    assert_eq!(printed, shown);
}

/// The log example of the README and the book, run as shown there (in a scratch folder, with
/// the example built for the tests, its GPUs hidden as in the book).
const LOG_EXAMPLE: &str = "commrun --nproc-per-node 4 --max-restarts 2 --log-dir out/logs --tee 3 \
     --local-ranks-filter 0 target/release/02-allreduce";

#[test]
fn the_log_example_of_the_readme_and_the_book_writes_every_ranks_files() {
    let _port = common::one_at_a_time();
    for doc in ["README.md", BOOK] {
        assert!(
            workspace_file(doc).contains(LOG_EXAMPLE),
            "{doc} no longer shows `{LOG_EXAMPLE}`"
        );
    }
    let here = scratch("logs-example");
    let allreduce = test_support::build::example("02-allreduce");
    let args: Vec<&str> = LOG_EXAMPLE.split_whitespace().skip(1).collect();
    let (program, flags) = args.split_last().unwrap();
    assert_eq!(*program, "target/release/02-allreduce");
    let out = commrun(flags)
        .arg(&allreduce)
        .current_dir(&here)
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.lines().all(|l| l.starts_with("[0]: ")), "{stdout}");
    assert!(stdout.contains("[0]: After reduce:"), "{stdout}");
    let run = std::fs::read_dir(here.join("out/logs"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut expected = Vec::new();
    for rank in 0..4 {
        expected.extend([
            format!("attempt_0/{rank}/stderr.log"),
            format!("attempt_0/{rank}/stdout.log"),
        ]);
        let own = read(run.join(format!("attempt_0/{rank}/stdout.log")));
        assert!(
            own.contains(&format!("Rank {rank} using device: cpu:{rank}")),
            "{own}"
        );
    }
    assert_eq!(files_under(&run), expected);
    assert!(read(run.join("attempt_0/0/stdout.log")).contains("After reduce:"));
}
