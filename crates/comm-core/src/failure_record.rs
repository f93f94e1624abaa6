//! Machine-readable failure records, as torchrun's workers write them.
//!
//! Why: a launcher that must say which rank failed first, and which rank or node it blames,
//! cannot do so reliably from the ranks' stderr: sentences get reworded, interleaved, cut off.
//! So when a rank fails it also writes a small JSON file at the path in `TORCHELASTIC_ERROR_FILE`
//! (torchrun sets that variable per worker; [`crate::spawn`] does the same per rank), and the
//! launcher reads the facts back from it.
//!
//! The top level is torchrun's own format, so torchrun's agent can read our records too:
//!
//! ```json
//! {"message": {"message": "<text>", "extraInfo": {"timestamp": "<unix seconds>", "py_callstack": ""}},
//!  "rank": 2, "kind": "peer_closed", "blamed_rank": 1, "missing_ranks": [],
//!  "store_endpoint": null, "at_unix_us": 1718000000123456}
//! ```
//!
//! The fields after `message` are ours; all of them may be absent (a record torch wrote).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::CommError;

/// The variable torchrun sets to the path where a worker writes its failure record (read by
/// [`crate::topology::error_file`]).
pub const ERROR_FILE_ENV: &str = crate::topology::ERROR_FILE_VAR;

/// What one rank wrote when it failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorRecord {
    /// torchrun's part: the error text and when (in whole seconds, as a string).
    pub message: TorchMessage,
    /// The rank that failed.
    #[serde(default)]
    pub rank: Option<usize>,
    /// [`CommError::kind`]: what went wrong, as a stable word.
    #[serde(default)]
    pub kind: Option<String>,
    /// [`CommError::blamed_rank`]: the rank this one says failed first.
    #[serde(default)]
    pub blamed_rank: Option<usize>,
    /// [`CommError::missing_ranks`]: ranks a timeout waited for in vain.
    #[serde(default)]
    pub missing_ranks: Vec<usize>,
    /// [`CommError::lost_store`]: the store endpoint this rank lost or never reached.
    #[serde(default)]
    pub store_endpoint: Option<String>,
    /// When the rank reported the failure, in microseconds since the Unix epoch, so the
    /// earliest of several failures within one second can be told.
    #[serde(default)]
    pub at_unix_us: Option<u64>,
}

/// torchrun's `message` object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TorchMessage {
    /// The error's text, as the rank printed it.
    pub message: String,
    /// When the record was written, and torch's (here empty) call stack.
    #[serde(rename = "extraInfo")]
    pub extra_info: ExtraInfo,
}

/// torchrun's `extraInfo` object; `py_callstack` stays empty (there is no Python stack).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtraInfo {
    /// Unix time in whole seconds, as a string, as torch writes it.
    pub timestamp: String,
    /// Torch's Python stack; always empty in our records.
    #[serde(default)]
    pub py_callstack: String,
}

/// Now, in microseconds since the Unix epoch: when a failure happened, to tell the earliest.
pub(crate) fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl ErrorRecord {
    /// The record of `error` on `rank`, stamped now.
    pub fn new(rank: usize, error: &CommError) -> ErrorRecord {
        let now_us = unix_us();
        ErrorRecord {
            message: TorchMessage {
                message: error.to_string(),
                extra_info: ExtraInfo {
                    timestamp: (now_us / 1_000_000).to_string(),
                    py_callstack: String::new(),
                },
            },
            rank: Some(rank),
            kind: Some(error.kind().to_string()),
            blamed_rank: error.blamed_rank(),
            missing_ranks: error.missing_ranks().to_vec(),
            store_endpoint: error.lost_store().map(str::to_string),
            at_unix_us: Some(now_us),
        }
    }

    /// When the failure was reported, in microseconds; from torch's whole seconds when the
    /// record has no `at_unix_us` (written by torch), None when it has neither.
    pub fn at_us(&self) -> Option<u64> {
        self.at_unix_us.or_else(|| {
            let secs: u64 = self.message.extra_info.timestamp.trim().parse().ok()?;
            secs.checked_mul(1_000_000)
        })
    }

    /// Reads a record; None if the file is missing or is not a record.
    pub fn read(path: &Path) -> Option<ErrorRecord> {
        let text = std::fs::read(path).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Writes the record to `path` whole: to a temporary file first, then renamed, so a reader
    /// never sees half of it.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let json = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        std::fs::write(&partial, json)?;
        std::fs::rename(&partial, path)
    }
}

/// Where a rank reports that it failed: prints `error: rank R: <error>` to stderr and, when
/// `TORCHELASTIC_ERROR_FILE` is set, writes the [`ErrorRecord`] there. Returns the exit code
/// a failed rank exits with (1).
///
/// Only the first failure of a process is reported: when the store's watcher and the main thread
/// both see the job end, one line says so.
pub fn report_failure(rank: usize, error: &CommError) -> i32 {
    if REPORTED.swap(true, Ordering::SeqCst) {
        return 1;
    }
    eprintln!("error: rank {rank}: {error}");
    if let Some(path) = crate::topology::error_file() {
        if let Err(e) = ErrorRecord::new(rank, error).write(&path) {
            eprintln!(
                "warning: rank {rank} could not write its error record to {}: {e}",
                path.display()
            );
        }
    }
    1
}

/// Whether this process has reported its failure.
static REPORTED: AtomicBool = AtomicBool::new(false);

/// Whether this process has already reported a failure (see [`report_failure`]).
pub fn reported() -> bool {
    REPORTED.load(Ordering::SeqCst)
}

/// Ends the process with `code` at once, as PyTorch's watchdog does: `_exit`, never `exit`,
/// because another thread may be inside NCCL or CUDA, and `exit` would run libnccl's and
/// libcuda's atexit handlers and static destructors under that live call. Only stdout is flushed
/// first, if that can be done within 100 ms (the main thread may hold its lock, blocked on a
/// full pipe).
pub fn exit_now(code: i32) -> ! {
    let (flushed, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let _ = flushed.send(());
    });
    let _ = done.recv_timeout(std::time::Duration::from_millis(100));
    // SAFETY: `_exit` has no preconditions; it ends the process at once, on purpose without
    // running destructors of a library that another thread may be inside.
    unsafe { libc::_exit(code) }
}

/// Reports `error` as this rank's failure (the record included), then [`exit_now`]: for a
/// thread stuck inside NCCL (the watchdog's end, an init that outlived the timeout).
pub fn end_process(rank: usize, error: &CommError) -> ! {
    exit_now(report_failure(rank, error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("comm-core-record-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_record_round_trips_and_has_torchruns_layout() {
        let error = CommError::Timeout {
            what: "barrier 'finish' on rank 1".into(),
            timeout: Duration::from_secs(4),
            detail: "; arrived: ranks 0, 1 of 4; missing: ranks 2, 3".into(),
            missing: vec![2, 3],
        };
        let record = ErrorRecord::new(1, &error);
        let dir = scratch("round-trip");
        let path = dir.join("error.json");
        record.write(&path).unwrap();
        assert_eq!(ErrorRecord::read(&path), Some(record.clone()));

        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(json["message"]["message"], error.to_string());
        let stamp = json["message"]["extraInfo"]["timestamp"].as_str().unwrap();
        assert!(stamp.parse::<u64>().is_ok(), "{stamp}");
        assert_eq!(json["message"]["extraInfo"]["py_callstack"], "");
        assert_eq!(json["rank"], 1);
        assert_eq!(json["kind"], "timeout");
        assert_eq!(json["missing_ranks"], serde_json::json!([2, 3]));
        assert!(json["blamed_rank"].is_null());
        assert!(json["at_unix_us"].as_u64().unwrap() / 1_000_000 >= stamp.parse().unwrap());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_record_torch_wrote_is_read_too() {
        let dir = scratch("torch");
        let path = dir.join("error.json");
        std::fs::write(
            &path,
            r#"{"message": {"message": "RuntimeError: foobar",
                "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1605774851"}}}"#,
        )
        .unwrap();
        let record = ErrorRecord::read(&path).unwrap();
        assert_eq!(record.message.message, "RuntimeError: foobar");
        assert_eq!(record.rank, None);
        assert_eq!(record.at_us(), Some(1_605_774_851_000_000));
        assert_eq!(ErrorRecord::read(&dir.join("absent.json")), None);
        std::fs::write(&path, "not json").unwrap();
        assert_eq!(ErrorRecord::read(&path), None);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_record_carries_the_errors_facts() {
        let error = CommError::StoreLost {
            rank: 3,
            endpoint: "h0:29500".into(),
            key: "k".into(),
            source: std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
        };
        let record = ErrorRecord::new(3, &error);
        assert_eq!(record.rank, Some(3));
        assert_eq!(record.kind.as_deref(), Some("store_lost"));
        assert_eq!(record.store_endpoint.as_deref(), Some("h0:29500"));
        assert_eq!(record.blamed_rank, Some(0));
        let error = CommError::PeerClosed {
            rank: 0,
            peer: 2,
            doing: "sending to",
        };
        assert_eq!(ErrorRecord::new(0, &error).blamed_rank, Some(2));
    }
}
