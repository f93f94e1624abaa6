//! The processes a test starts (a job, the ranks of a job, launchers acting as nodes), run so
//! that a hang fails the test instead of hanging it, with everything they printed in the
//! message, and checks that they leave nothing behind.
//!
//! Each process started here leads a process group of its own: at a deadline the whole group
//! (the process and the ranks it started) is killed, and so is a group a panicking test drops.

use std::io::Read;
use std::ops::Range;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long output may stay open after its process ended (a rank it started may still hold it
/// while it exits) before the test goes on with what it has.
const OUTPUT_GRACE: Duration = Duration::from_secs(10);

/// A started process whose stdout and stderr are being read (a full pipe cannot block it).
pub struct Running {
    child: Option<Child>,
    what: String,
    stdout: Collector,
    stderr: Collector,
}

/// How a process ended and what it printed.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// The exit code, or 128 + the signal that killed it, as a shell reports it.
    pub fn code_or_signal(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| 128 + self.status.signal().unwrap_or(0))
    }

    /// Fails the test, showing both outputs, unless the process exited with 0.
    pub fn assert_success(&self, what: &str) {
        assert!(
            self.status.success(),
            "{what}: {}\n--- stdout\n{}\n--- stderr\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
    }
}

/// The variables a launcher (torchrun, commrun, srun) gives its workers. A program the tests
/// start must not inherit them from whatever launched the tests: it would believe itself a rank.
pub const LAUNCHER_VARS: [&str; 12] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_STEP_ID",
    "SLURM_NTASKS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
];

/// Starting a program plainly, as a user types it: without the launcher's variables.
pub trait Plainly {
    /// Removes [`LAUNCHER_VARS`] from the command's environment.
    fn plainly(&mut self) -> &mut Self;
}

impl Plainly for Command {
    fn plainly(&mut self) -> &mut Self {
        for var in LAUNCHER_VARS {
            self.env_remove(var);
        }
        self
    }
}

/// Starts `command` in a process group of its own, stdin empty, stdout and stderr collected.
pub fn start(command: &mut Command) -> Running {
    let what = format!("{command:?}");
    let mut child = command
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let stdout = Collector::new(child.stdout.take());
    let stderr = Collector::new(child.stderr.take());
    Running {
        child: Some(child),
        what,
        stdout,
        stderr,
    }
}

/// Starts every command at once (the processes of one job) and waits for all of them, each
/// within `limit`. Checking how each ended is the caller's.
pub fn run_together(commands: Vec<Command>, limit: Duration) -> Vec<Finished> {
    let running: Vec<Running> = commands.into_iter().map(|mut c| start(&mut c)).collect();
    running.into_iter().map(|r| r.finish(limit)).collect()
}

impl Running {
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// Sends `signal` to this process alone, as a user's `kill -SIGNAL PID` (or Ctrl-C to a
    /// launcher that forwards it) would.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a child of ours that has not been reaped, so its pid is still ours.
        let sent = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(sent, 0, "kill({}, {signal}) failed", self.pid());
    }

    /// SIGKILL to this process alone (nothing to catch, no chance to clean up: what its ranks
    /// must survive), then reaps it.
    pub fn kill(mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
    }

    /// What it has printed on stdout so far, while it runs.
    pub fn stdout_so_far(&self) -> String {
        String::from_utf8_lossy(&self.stdout.bytes.lock().unwrap()).into_owned()
    }

    /// Waits until it ends. Past `limit`, kills its process group and fails the test with what
    /// it printed.
    pub fn finish(mut self, limit: Duration) -> Finished {
        let deadline = Instant::now() + limit;
        let mut child = self.child.take().expect("running");
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return Finished {
                    status,
                    stdout: self.stdout.text(),
                    stderr: self.stderr.text(),
                };
            }
            if Instant::now() > deadline {
                kill_group(&mut child);
                panic!(
                    "{} ran past {limit:?} and was killed\n--- stdout\n{}\n--- stderr\n{}",
                    self.what,
                    self.stdout.text(),
                    self.stderr.text()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    /// A test that panicked before finishing leaves no process of it running.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&mut child);
        }
    }
}

fn kill_group(child: &mut Child) {
    // SAFETY: killpg(2) on the group our child leads (start made it a leader); should it have
    // left it, no group has that id and the child alone is killed below.
    unsafe { libc::killpg(child.id() as i32, libc::SIGKILL) };
    let _ = child.kill();
    let _ = child.wait();
}

/// One output of a process, read to its end on a thread of its own.
struct Collector {
    bytes: Arc<Mutex<Vec<u8>>>,
    reader: Option<JoinHandle<()>>,
}

impl Collector {
    fn new(pipe: Option<impl Read + Send + 'static>) -> Collector {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let reader = pipe.map(|mut pipe| {
            let bytes = bytes.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                    bytes.lock().unwrap().extend_from_slice(&chunk[..n]);
                }
            })
        });
        Collector { bytes, reader }
    }

    /// What was printed, once the pipe closed or, at most, [`OUTPUT_GRACE`] from now.
    fn text(&mut self) -> String {
        let deadline = Instant::now() + OUTPUT_GRACE;
        if let Some(reader) = self.reader.take() {
            while !reader.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if reader.is_finished() {
                let _ = reader.join();
            }
        }
        String::from_utf8_lossy(&self.bytes.lock().unwrap()).into_owned()
    }
}

/// Whether `pid` runs: a zombie has been killed but not yet reaped, and runs nothing.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.contains(") Z "),
        Err(_) => false,
    }
}

/// Fails the test unless every one of `pids` is gone within 5 s: no orphan survives its job.
pub fn assert_all_gone(pids: &[i32]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let running: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if running.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "orphans still running: {running:?} of {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Processes that leave the group of the process that started them, found again by a mark in
/// their environment: torchrun starts each worker in a session of its own, so killing torchrun's
/// group misses its workers. Every process started from a marked command inherits the mark
/// (torchrun passes its environment on); dropping the tag kills whatever still carries it.
pub struct Tag {
    value: String,
}

/// The variable that carries a [`Tag`].
const TAG_VAR: &str = "NCCL_WORKSHOP_TEST_TAG";

impl Tag {
    /// A mark no other tag of any test process has.
    pub fn new(name: &str) -> Tag {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Tag {
            value: format!("{name}-{}-{n}", std::process::id()),
        }
    }

    /// Marks `command`, so that it and everything it starts carry this tag.
    pub fn mark<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        command.env(TAG_VAR, &self.value)
    }

    /// The processes still running that carry this tag.
    pub fn running(&self) -> Vec<i32> {
        let needle = format!("{TAG_VAR}={}", self.value);
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| {
                std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
                    environ
                        .split(|&b| b == 0)
                        .any(|var| var == needle.as_bytes())
                })
            })
            .filter(|&pid| alive(pid))
            .collect()
    }

    /// Fails the test unless every process with this tag is gone within 5 s (killing those
    /// left, so that the failure leaves nothing behind).
    pub fn assert_all_gone(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let running = self.running();
            if running.is_empty() {
                return;
            }
            if Instant::now() > deadline {
                self.kill_all();
                panic!("{what} left processes running: {running:?} (now killed)");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL to every process that carries this tag.
    pub fn kill_all(&self) {
        for pid in self.running() {
            // SAFETY: kill(2) on a pid read from /proc just now; at worst it has exited since.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

impl Drop for Tag {
    /// A test that failed halfway leaves none of its processes running.
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// An empty folder of this test process's own under the temporary folder.
pub fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("nccl-workshop-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// The pids that `ranks` wrote, each in `dir/RANK`, waiting up to `limit` for all of them.
pub fn wait_for_pid_files(dir: &Path, ranks: Range<usize>, limit: Duration) -> Vec<i32> {
    let names: Vec<String> = ranks.map(|r| r.to_string()).collect();
    wait_for_pids_in(dir, &names, limit)
}

/// The pids written into the files `names` of `dir` (e.g. a worker's `w0` beside its rank's
/// `0`), waiting up to `limit` for all of them.
pub fn wait_for_pids_in(dir: &Path, names: &[impl AsRef<str>], limit: Duration) -> Vec<i32> {
    let deadline = Instant::now() + limit;
    loop {
        let pids: Vec<i32> = names
            .iter()
            .filter_map(|name| {
                std::fs::read_to_string(dir.join(name.as_ref()))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            })
            .collect();
        if pids.len() == names.len() {
            return pids;
        }
        let names: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
        assert!(
            Instant::now() < deadline,
            "{names:?} did not all get a pid written into {} within {limit:?}",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `name` found in a folder of PATH, as the shell finds it: an executable file.
pub fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| {
            path.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_and_codes_come_back() {
        let done = start(Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]))
            .finish(Duration::from_secs(10));
        assert_eq!((done.status.code(), done.code_or_signal()), (Some(3), 3));
        assert_eq!(
            (done.stdout.as_str(), done.stderr.as_str()),
            ("out\n", "err\n")
        );
    }

    #[test]
    fn a_hang_is_killed_with_its_group() {
        let dir = scratch("hang");
        let script = format!(
            "sleep 60 & echo $! > {}/0; echo started; wait",
            dir.display()
        );
        let running = start(Command::new("sh").args(["-c", &script]));
        let pids = wait_for_pid_files(&dir, 0..1, Duration::from_secs(10));
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            running.finish(Duration::from_millis(300))
        }))
        .unwrap_err();
        let message = panic.downcast_ref::<String>().unwrap();
        assert!(
            message.contains("was killed") && message.contains("started"),
            "{message}"
        );
        assert_all_gone(&pids);
    }

    #[test]
    fn a_tag_finds_what_left_the_group() {
        let tag = Tag::new("tag-test");
        let dir = scratch("tag");
        // setsid: the sleep leaves the group of the shell that started it, as torchrun's
        // workers leave torchrun's. Its pid is written from inside its new session, so the
        // group's kill below cannot catch it before it left.
        let script = format!(
            "setsid sh -c 'echo $$ > {}/0; exec sleep 60' & wait",
            dir.display()
        );
        let running = start(tag.mark(Command::new("sh").args(["-c", &script])));
        let pids = wait_for_pid_files(&dir, 0..1, Duration::from_secs(10));
        let shell = running.pid();
        assert!(tag.running().contains(&shell), "the shell carries the tag");
        drop(running);
        let deadline = Instant::now() + Duration::from_secs(5);
        while tag.running() != pids {
            assert!(
                Instant::now() < deadline,
                "only the sleep, which outlives its group's kill, should be left: {:?}",
                tag.running()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(tag);
        assert_all_gone(&pids);
    }

    #[test]
    fn a_signal_reaches_the_process() {
        let running = start(Command::new("sleep").arg("60"));
        running.signal(libc::SIGTERM);
        let done = running.finish(Duration::from_secs(10));
        assert_eq!(done.code_or_signal(), 128 + libc::SIGTERM);
    }
}
