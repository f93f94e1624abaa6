//! The line relay: each rank's stdout and stderr copied a whole line at a time (never a torn
//! line, a line of any length costing at most [`LINE_CAP`]) to its sinks: the console, labelled
//! `[rank]: ` or not, a log file (commrun's `--log-dir`), both (`--tee`), or neither; the last
//! lines of each rank's stderr kept for the failure summary.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};

/// How many of a failed rank's last stderr lines the summary shows.
const KEPT_LINES: usize = 10;

/// The most of one relayed line that is shown; the rest, up to its newline, is discarded (never
/// buffered) and a marker says how many bytes were cut.
pub const LINE_CAP: usize = 64 * 1024;

/// The most of one line kept for the summary's stderr tail (10 lines per rank, for every rank
/// of the node until the job ends).
const TAIL_LINE_CAP: usize = 2 * 1024;

/// Where one output stream of a rank goes: the console, a log file, both, or neither. Its
/// stderr's last lines reach the failure summary wherever it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Shown on this process's own stdout or stderr (labelled `[rank]: ` if the plan says so).
    pub console: bool,
    /// Written to this file too, line by line without the label (created, or emptied).
    pub file: Option<PathBuf>,
}

impl Default for Route {
    /// The console only, as [`run`](super::run) shows every rank.
    fn default() -> Route {
        Route {
            console: true,
            file: None,
        }
    }
}

/// Where a rank's stdout and stderr go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RankOutput {
    /// Its stdout's way.
    pub stdout: Route,
    /// Its stderr's way.
    pub stderr: Route,
}

/// How a rank's stdout is connected: straight to ours when only the console shows it unlabelled,
/// to nothing when nothing shows it, else to a pipe that a relay reads.
pub(super) fn stdout_mode(prefix_output: bool, route: &Route) -> Stdio {
    match (route.console, &route.file) {
        (false, None) => Stdio::null(),
        // Unlabelled, the ranks write straight to our stdout: one file, so the kernel keeps
        // their lines in the order they were written, and a rank's line printed before it sent
        // its row comes before rank 0's grid. (Through a relay per rank that order is lost.) A
        // line longer than a pipe's atomic write (4 KiB) could interleave with another rank's;
        // the course's lines are short.
        (true, None) if !prefix_output => Stdio::inherit(),
        _ => Stdio::piped(),
    }
}

/// The log files of every local rank (stdout's, stderr's), created or emptied before any rank
/// starts.
pub(super) fn open_log_files(outputs: &[RankOutput], nproc: usize) -> Result<Vec<LogFiles>> {
    let open = |route: &Route| -> Result<Option<File>> {
        let Some(path) = &route.file else {
            return Ok(None);
        };
        File::create(path)
            .map(Some)
            .map_err(|e| CommError::io(format!("cannot create log file {}", path.display()), e))
    };
    outputs
        .iter()
        .take(nproc)
        .map(|o| Ok((open(&o.stdout)?, open(&o.stderr)?)))
        .collect()
}

/// Which of our own streams a relayed stream is shown on.
#[derive(Clone, Copy)]
enum Console {
    Stdout,
    Stderr,
}

/// Where a relay copies one stream of one rank: our console (labelled or not), a log file,
/// both, or neither.
struct Sink {
    console: Option<Console>,
    prefix: Option<String>,
    file: Option<File>,
}

impl Sink {
    /// Writes one whole line. Fails only when the console is closed (the relay then stops); a
    /// log file that cannot be written is said once on stderr and then left out.
    fn write(&mut self, line: &[u8], lock: &Mutex<()>) -> std::io::Result<()> {
        if let Some(file) = &mut self.file {
            if let Err(e) = file.write_all(line) {
                eprintln!("warning: a log file could not be written ({e}); its lines are lost");
                self.file = None;
            }
        }
        let Some(console) = self.console else {
            return Ok(());
        };
        let prefix = self.prefix.as_deref();
        let _guard = lock.lock().unwrap();
        match console {
            Console::Stdout => write_line(&mut std::io::stdout().lock(), prefix, line),
            Console::Stderr => write_line(&mut std::io::stderr().lock(), prefix, line),
        }
    }
}

/// Copies a child's output to its [`Sink`] a whole line at a time, optionally keeping the last
/// lines.
///
/// A line longer than [`LINE_CAP`] is shown cut, with a marker saying how many bytes were cut;
/// the rest is read and dropped as it comes, so a line of any length costs at most the cap.
fn relay(
    source: impl Read + Send + 'static,
    mut sink: Sink,
    lock: Arc<Mutex<()>>,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(source);
        let mut line = Vec::new();
        let mut cut = 0u64;
        loop {
            let complete = match read_capped_line(&mut reader, &mut line, &mut cut) {
                Ok(0) | Err(_) => return,
                Ok(_) => line.ends_with(b"\n"),
            };
            if !complete {
                line.push(b'\n');
            }
            if cut > 0 {
                line.pop();
                line.extend_from_slice(format!(" \u{2026} [{cut} bytes cut]\n").as_bytes());
            }
            if let Some(tail) = &tail {
                let mut tail = tail.lock().unwrap();
                if tail.len() == KEPT_LINES {
                    tail.pop_front();
                }
                tail.push_back(tail_line(&line));
            }
            if sink.write(&line, &lock).is_err() {
                return;
            }
        }
    })
}

/// Reads one line into `line` (cleared first), keeping at most [`LINE_CAP`] bytes of it, then
/// its newline if it had one, and counting the bytes dropped in `cut`. Returns the bytes read
/// (0 at the end). A cut line ends on a whole UTF-8 character.
fn read_capped_line(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    cut: &mut u64,
) -> std::io::Result<usize> {
    line.clear();
    *cut = 0;
    let mut read = 0;
    let mut newline = false;
    while !newline {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            break;
        }
        let (used, content) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                newline = true;
                (i + 1, &buf[..i])
            }
            None => (buf.len(), buf),
        };
        let take = content.len().min(LINE_CAP - line.len());
        line.extend_from_slice(&content[..take]);
        *cut += (content.len() - take) as u64;
        reader.consume(used);
        read += used;
    }
    if *cut > 0 {
        // Do not end a cut line in the middle of a character.
        if let Err(e) = std::str::from_utf8(line) {
            if e.error_len().is_none() {
                *cut += (line.len() - e.valid_up_to()) as u64;
                line.truncate(e.valid_up_to());
            }
        }
    }
    if newline {
        line.push(b'\n');
    }
    Ok(read)
}

/// A relayed line as the summary keeps it: without its newline, at most [`TAIL_LINE_CAP`]
/// bytes (on a character boundary).
fn tail_line(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end();
    if text.len() <= TAIL_LINE_CAP {
        return text.to_string();
    }
    let mut end = TAIL_LINE_CAP;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} \u{2026} [{} bytes cut]", &text[..end], text.len() - end)
}

fn write_line(out: &mut impl Write, prefix: Option<&str>, line: &[u8]) -> std::io::Result<()> {
    if let Some(prefix) = prefix {
        out.write_all(prefix.as_bytes())?;
    }
    out.write_all(line)?;
    out.flush()
}

/// A rank's log files, stdout's and stderr's, where its routes name them.
pub(super) type LogFiles = (Option<File>, Option<File>);

/// The last lines of a rank's stderr, for the summary.
pub(super) type Tail = Arc<Mutex<VecDeque<String>>>;

/// Starts the relays of a rank just started: its stdout (when piped) and its stderr, each to its
/// route's sinks, labelled with `prefix`. Returns the relay threads and the stderr's tail.
pub(super) fn attach(
    child: &mut Child,
    prefix: Option<String>,
    output: &RankOutput,
    (stdout_file, stderr_file): LogFiles,
    lock: &Arc<Mutex<()>>,
) -> (Vec<JoinHandle<()>>, Tail) {
    let mut relays = Vec::new();
    let tail = Tail::default();
    if let Some(stdout) = child.stdout.take() {
        let sink = Sink {
            console: output.stdout.console.then_some(Console::Stdout),
            prefix: prefix.clone(),
            file: stdout_file,
        };
        relays.push(relay(stdout, sink, lock.clone(), None));
    }
    let sink = Sink {
        console: output.stderr.console.then_some(Console::Stderr),
        prefix,
        file: stderr_file,
    };
    let stderr = child.stderr.take().unwrap();
    relays.push(relay(stderr, sink, lock.clone(), Some(tail.clone())));
    (relays, tail)
}

/// Waits for the relays to pass on the ranks' last lines, at most `within`: the pipes close when
/// the ranks exit, but a process that left its group holding one open must not hang us.
pub(super) fn wait_for(relays: Vec<JoinHandle<()>>, within: Duration) {
    let deadline = Instant::now() + within;
    for relay in relays {
        while !relay.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
