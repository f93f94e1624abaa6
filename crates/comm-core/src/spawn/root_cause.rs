//! The root cause: when ranks fail together, which one to blame. Each rank writes its failure
//! record (an [`ErrorRecord`]) to a file of its own in a private directory; the earliest failure
//! is followed along the blame in the records to a rank that failed too, and the summary gets
//! that rank, its status, its last lines of stderr and how many others failed with it.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use super::relay::Tail;
use crate::failure_record::{unix_us, ErrorRecord};

/// How one rank ended, as its waiter thread reports it: its local rank, its status, and when
/// (microseconds since the Unix epoch).
pub(super) type Exit = (usize, std::io::Result<ExitStatus>, u64);

/// How a rank ended, for the summary.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The rank blamed as the root cause among those that failed together, as the job numbers
    /// ranks.
    pub rank: usize,
    /// How its process ended: an exit code or a signal.
    pub status: ExitStatus,
    /// Its last lines of stderr (up to 10, each cut to 2 KiB), for the summary.
    pub last_stderr: Vec<String>,
    /// How many other ranks of this node failed too (with it, or reporting an error of their
    /// own while being stopped): counted, not listed, so a large job ends with one line.
    pub others_failed: usize,
    /// What the rank wrote at `TORCHELASTIC_ERROR_FILE` when it failed; None when it wrote
    /// nothing (killed by a signal, or a program that does not report through this library).
    pub record: Option<ErrorRecord>,
}

impl Failure {
    /// The exit code a launcher passes on: the rank's own, or 128 + signal as a shell reports it.
    pub fn exit_code(&self) -> i32 {
        exit_code(self.status)
    }

    /// One line for the summary: the rank and its exit code, or the signal that killed it.
    pub fn describe(&self) -> String {
        match (self.status.code(), self.status.signal()) {
            (Some(code), _) => format!("rank {} exited with code {code}", self.rank),
            (None, Some(libc::SIGPIPE)) => format!(
                "rank {} stopped: its output was closed (SIGPIPE; the reader of a pipe such as \
                 `| head` ended before the program did)",
                self.rank
            ),
            (None, Some(sig)) => format!(
                "rank {} was killed by signal {sig} ({})",
                self.rank,
                super::signals::signal_name(sig)
            ),
            _ => format!("rank {} ended with {:?}", self.rank, self.status),
        }
    }

    /// ` (N other ranks also failed)`, or nothing when it failed alone: ends a summary line.
    pub fn others(&self) -> String {
        match self.others_failed {
            0 => String::new(),
            1 => " (1 other rank also failed)".into(),
            n => format!(" ({n} other ranks also failed)"),
        }
    }
}

/// A status as a shell reports it: the exit code, or 128 + the signal that ended it.
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// A rank that failed, as the root-cause choice sees it.
struct FailedRank {
    rank: usize,
    status: ExitStatus,
    /// When its waiter thread saw it exit, in microseconds since the Unix epoch.
    exited_us: u64,
    record: Option<ErrorRecord>,
}

impl FailedRank {
    /// When it failed: when it reported the failure if it wrote a record, else when it exited.
    fn failed_us(&self) -> u64 {
        self.record
            .as_ref()
            .and_then(ErrorRecord::at_us)
            .unwrap_or(self.exited_us)
    }

    /// The ranks its record says it failed because of: the one it blames, then those it waited
    /// for in vain.
    fn blames(&self) -> impl Iterator<Item = usize> + '_ {
        self.record.iter().flat_map(|r| {
            r.blamed_rank
                .into_iter()
                .chain(r.missing_ranks.iter().copied())
        })
    }
}

/// Among ranks that failed together, the index of the root cause: start from the earliest
/// failure (a record's time, or the exit time of a rank that wrote none, so with no records at
/// all this is the exit order), then follow the blame in the records to a rank that failed too.
/// A rank that blames a rank that did not fail (yet) stays the root; so does the earliest
/// failure when the blame goes round in a circle.
fn root_cause(failed: &[FailedRank]) -> usize {
    let Some(start) = (0..failed.len()).min_by_key(|&i| (failed[i].failed_us(), i)) else {
        return 0;
    };
    let mut chain = vec![start];
    let mut current = start;
    loop {
        let next = failed[current]
            .blames()
            .filter_map(|rank| failed.iter().position(|f| f.rank == rank))
            .find(|&i| i != current);
        match next {
            None => return current,
            Some(i) if chain.contains(&i) => return start,
            Some(i) => {
                chain.push(i);
                current = i;
            }
        }
    }
}

/// The directory of this launch's error records, one file per rank; removed when dropped.
pub(super) struct ErrorDir(PathBuf);

impl ErrorDir {
    /// A fresh private directory under the system's temporary directory; None if none can be
    /// made (the ranks then write no records and the root cause falls back to the exit order).
    pub(super) fn create() -> Option<ErrorDir> {
        use std::os::unix::fs::DirBuilderExt;
        for attempt in 0..16 {
            let path = std::env::temp_dir().join(format!(
                "comm-core-errors-{}-{}-{attempt}",
                std::process::id(),
                unix_us()
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Some(ErrorDir(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(_) => return None,
            }
        }
        None
    }

    /// What `rank` wrote, if it wrote a record.
    pub(super) fn read(&self, rank: usize) -> Option<ErrorRecord> {
        ErrorRecord::read(&self.file(rank))
    }

    /// Where `rank` writes its record.
    pub(super) fn file(&self, rank: usize) -> PathBuf {
        self.path().join(format!("rank-{rank}.json"))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ErrorDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The failure to report once a rank of this node (the first of which is `first_rank`) has
/// failed (`first`): gives the relays a moment to pass on its last words, and the ranks that
/// failed with it time to exit and report (the order waiter threads report in is not the order
/// ranks died), then picks the root cause among them. Ranks seen exiting are marked not
/// `running`.
pub(super) fn gather(
    first_rank: usize,
    first: (usize, ExitStatus, u64),
    exited: &crossbeam_channel::Receiver<Exit>,
    running: &mut [bool],
    records: Option<&ErrorDir>,
    tails: &[Tail],
) -> Failure {
    std::thread::sleep(Duration::from_millis(50));
    let failed_rank = |local_rank: usize, status, exited_us| FailedRank {
        rank: first_rank + local_rank,
        status,
        exited_us,
        record: records.and_then(|r| r.read(first_rank + local_rank)),
    };
    let (local_rank, status, exited_us) = first;
    let mut failed = vec![failed_rank(local_rank, status, exited_us)];
    while let Ok((other, status, exited_us)) = exited.try_recv() {
        running[other] = false;
        match status {
            Ok(status) if !status.success() => failed.push(failed_rank(other, status, exited_us)),
            _ => {}
        }
    }
    let root = failed.swap_remove(root_cause(&failed));
    let last_stderr = tails[root.rank - first_rank]
        .lock()
        .unwrap()
        .iter()
        .cloned()
        .collect();
    Failure {
        rank: root.rank,
        status: root.status,
        last_stderr,
        others_failed: failed.len(),
        record: root.record,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::CommError;
    use std::time::Duration;

    fn code(c: i32) -> ExitStatus {
        ExitStatus::from_raw(c << 8)
    }

    /// A rank that failed with `error` (reported at `at_us`) and exited at `exited_us`.
    fn failed(rank: usize, error: Option<CommError>, at_us: u64, exited_us: u64) -> FailedRank {
        FailedRank {
            rank,
            status: code(1),
            exited_us,
            record: error.map(|e| ErrorRecord {
                at_unix_us: Some(at_us),
                ..ErrorRecord::new(rank, &e)
            }),
        }
    }

    fn closed(rank: usize, peer: usize) -> Option<CommError> {
        Some(CommError::PeerClosed {
            rank,
            peer,
            doing: "receiving from",
        })
    }

    #[test]
    fn the_rank_others_blame_is_the_root_cause() {
        // Rank 1 left first (on purpose, no record); rank 2 blames 1, rank 0 blames 2.
        // Reported in the wrong order: 2, then 0, then 1.
        let ranks = [
            failed(2, closed(2, 1), 20, 21),
            failed(0, closed(0, 2), 30, 31),
            failed(1, None, 0, 15),
        ];
        assert_eq!(ranks[root_cause(&ranks)].rank, 1);
        // Even when the records' clocks say rank 0 was first, the blame leads to rank 1.
        let ranks = [
            failed(2, closed(2, 1), 20, 21),
            failed(0, closed(0, 2), 5, 31),
            failed(1, None, 0, 40),
        ];
        assert_eq!(ranks[root_cause(&ranks)].rank, 1);
        // The blamed rank did not fail (yet): the earliest failure stands.
        let ranks = [
            failed(2, closed(2, 1), 20, 21),
            failed(0, closed(0, 2), 30, 31),
        ];
        assert_eq!(ranks[root_cause(&ranks)].rank, 2);
    }

    #[test]
    fn the_earliest_record_wins_when_nobody_is_blamed() {
        let usage = || Some(CommError::Usage("bad".into()));
        let ranks = [failed(0, usage(), 50, 51), failed(3, usage(), 10, 60)];
        assert_eq!(ranks[root_cause(&ranks)].rank, 3);
    }

    #[test]
    fn without_records_the_exit_order_decides() {
        let ranks = [failed(1, None, 0, 100), failed(0, None, 0, 90)];
        assert_eq!(ranks[root_cause(&ranks)].rank, 0);
        let ranks = [failed(1, None, 0, 100), failed(0, None, 0, 100)];
        assert_eq!(
            ranks[root_cause(&ranks)].rank,
            1,
            "a tie keeps the report order"
        );
    }

    #[test]
    fn a_timeout_leads_to_the_missing_rank_and_a_lost_store_to_rank_0() {
        let timeout = CommError::Timeout {
            what: "barrier 'b' on rank 1".into(),
            timeout: Duration::from_secs(1),
            detail: String::new(),
            missing: vec![2, 3],
        };
        // Rank 3 was killed (no record, exited later than rank 1 wrote its record).
        let ranks = [failed(1, Some(timeout), 10, 11), failed(3, None, 0, 20)];
        assert_eq!(ranks[root_cause(&ranks)].rank, 3);

        let lost = CommError::StoreLost {
            rank: 1,
            endpoint: "h:1".into(),
            key: "k".into(),
            source: std::io::ErrorKind::UnexpectedEof.into(),
        };
        let ranks = [
            failed(1, Some(lost), 10, 11),
            failed(0, Some(CommError::Usage("bad".into())), 12, 13),
        ];
        assert_eq!(ranks[root_cause(&ranks)].rank, 0);
    }

    #[test]
    fn blame_in_a_circle_keeps_the_earliest() {
        let ranks = [
            failed(0, closed(0, 1), 20, 21),
            failed(1, closed(1, 0), 10, 11),
        ];
        assert_eq!(ranks[root_cause(&ranks)].rank, 1);
    }

    #[test]
    fn the_error_dir_is_private_and_removed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = ErrorDir::create().unwrap();
        let path = dir.path().to_path_buf();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(dir.file(3), path.join("rank-3.json"));
        std::fs::write(dir.file(3), "{}").unwrap();
        drop(dir);
        assert!(!path.exists());
    }
}
