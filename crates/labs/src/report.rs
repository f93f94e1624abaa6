//! What the ranks tell the checker, through files in a folder the checker made for the job:
//! rank 0's verdict, a rank's note that it reached a `todo!()` (the lab is not written yet), and
//! the case a failing rank was in. Each rank's own output goes to files there too (the checker
//! shows it after the job); these are the facts the checker decides on.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// How a job of cases ended, as rank 0 saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every case right: how many.
    Right(usize),
    /// The case (its index in the job) where the student's result differs from the library's.
    Wrong(usize),
}

/// This rank's folder and number, set once when the rank starts.
static HERE: OnceLock<(PathBuf, usize)> = OnceLock::new();

/// The case this rank is in, for a failure's report.
static CASE: AtomicUsize = AtomicUsize::new(0);

/// Whether this rank's failure came out of the student's code (not the library's or the checker's).
static IN_YOURS: AtomicBool = AtomicBool::new(false);

/// Where this rank reports: `dir`, as rank `rank`.
pub fn init(dir: &Path, rank: usize) {
    let _ = HERE.set((dir.to_path_buf(), rank));
}

/// This rank is now in case `index` of the job.
pub fn in_case(index: usize) {
    CASE.store(index, Ordering::Relaxed);
}

fn write(name: &str, text: &str) {
    if let Some((dir, rank)) = HERE.get() {
        // Best effort: a report that cannot be written leaves the checker with the rank's output.
        let _ = std::fs::write(dir.join(format!("{name}.{rank}")), text);
    }
}

/// Runs `code`, the student's; if it fails, the rank's failure is reported as the student's.
pub fn in_yours<R, E>(code: impl FnOnce() -> Result<R, E>) -> Result<R, E> {
    let done = code();
    IN_YOURS.store(done.is_err(), Ordering::Relaxed);
    done
}

/// This rank failed: the case it was in, and whether inside the student's code.
pub fn failed() {
    let inside = if IN_YOURS.load(Ordering::Relaxed) {
        " yours"
    } else {
        ""
    };
    write(
        "failed",
        &format!("{}{inside}", CASE.load(Ordering::Relaxed)),
    );
}

/// This rank reached a `todo!()`: the lab is not written yet.
pub fn not_written() {
    write("not-written", "");
}

/// Rank 0's verdict on the job.
pub fn verdict(v: Verdict) {
    let text = match v {
        Verdict::Right(cases) => format!("right {cases}"),
        Verdict::Wrong(case) => format!("wrong {case}"),
    };
    write("verdict", &text);
}

/// What the checker reads back from a job's folder.
#[derive(Debug, Default)]
pub struct Found {
    /// Rank 0's verdict, if it gave one.
    pub verdict: Option<Verdict>,
    /// Whether some rank reached a `todo!()`.
    pub not_written: bool,
    /// The case a failed rank was in (the last one written).
    pub failed_in: Option<usize>,
    /// The ranks that failed inside the student's code (the others failed waiting for them).
    pub failed_inside: Vec<usize>,
}

/// Reads the reports in `dir`.
pub fn read(dir: &Path) -> Found {
    let mut found = Found::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let number = |word: &str| text.strip_prefix(word)?.trim().parse().ok();
        if name.starts_with("not-written.") {
            found.not_written = true;
        } else if let Some(rank) = name.strip_prefix("failed.") {
            let mut words = text.split_whitespace();
            found.failed_in = words
                .next()
                .and_then(|w| w.parse().ok())
                .or(found.failed_in);
            if words.next() == Some("yours") {
                found.failed_inside.extend(rank.parse::<usize>().ok());
            }
        } else if name == "verdict.0" {
            found.verdict = number("right ")
                .map(Verdict::Right)
                .or_else(|| number("wrong ").map(Verdict::Wrong));
        }
    }
    found
}
