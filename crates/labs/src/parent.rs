//! The checker: the process the student starts. It starts one job of ranks per rank count (each
//! rank this same program, given the job's work: [`crate::rank`]), shows what rank 0 printed,
//! and decides from the ranks' reports ([`crate::report`]): every case right (then the timing
//! job), a wrong case (rank 0 has printed where), a lab not written yet (the first hint), or a
//! job that failed (the library's messages: a rank that waited past `--timeout` names the peer
//! it waited for).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use comm_core::launch;
use comm_core::spawn::{Extras, Outcome, RankOutput, Route};
use comm_core::{Named, Settings};

use crate::catalog::{Lab, DEFAULT_RANKS};
use crate::code::Whose;
use crate::rank::{case_count, rank_counts, Work};
use crate::report::{self, Verdict};

/// A folder of this checker's own under the system's temporary folder, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> std::io::Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("nccl-workshop-lab-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }

    /// Empties it for the next job.
    fn clear(&self) {
        for entry in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How a job ended, for the checker.
enum Ended {
    Right,
    Wrong,
    NotWritten,
    /// A rank failed (an error, a panic, a timeout), in this case of the job if known; the
    /// ranks that failed inside the student's code.
    Failed(Option<usize>, Vec<usize>),
    Interrupted,
}

/// One check of `lab` with `whose` code; the exit code.
pub fn check(lab: Lab, whose: Whose, only: Option<usize>, settings: &Settings) -> i32 {
    let scratch = match Scratch::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot make a folder for the ranks' reports: {e}");
            return 1;
        }
    };
    let job = |work: Work, ranks: usize| run_job(work, ranks, settings, &scratch);
    let watching = settings.steps || settings.trace.is_some();
    if watching && lab.is_collective() {
        let ranks = only.unwrap_or(DEFAULT_RANKS);
        return verdict(lab, whose, job(Work::Watch, ranks), ranks, Work::Watch);
    }
    // A trace is one job's: the other labs record their cases on one rank count.
    let counts = match watching {
        true => vec![only.unwrap_or(lab.rank_counts()[0])],
        false => rank_counts(lab, only),
    };
    let total: usize = counts.iter().map(|&n| case_count(lab, n)).sum();
    for &ranks in &counts {
        let code = verdict(lab, whose, job(Work::Cases, ranks), ranks, Work::Cases);
        if code != 0 {
            return code;
        }
    }
    println!(
        "lab {}: {} — {total} of {total} cases right ({})",
        lab.number(),
        lab.title(),
        ranks_in_words(&counts)
    );
    if !lab.is_timed() || watching {
        return 0;
    }
    // Lab 1 times the messages between ranks 0 and 1.
    let ranks = match lab {
        Lab::PingPong => 2,
        _ => only.unwrap_or(DEFAULT_RANKS),
    };
    verdict(lab, whose, job(Work::Timing, ranks), 0, Work::Timing)
}

/// `2, 3, 4, 5 and 8 ranks`.
fn ranks_in_words(counts: &[usize]) -> String {
    let words: Vec<String> = counts.iter().map(usize::to_string).collect();
    match words.split_last() {
        Some((last, [])) if last == "1" => "1 rank".into(),
        Some((last, [])) => format!("{last} ranks"),
        Some((last, rest)) => format!("{} and {last} ranks", rest.join(", ")),
        None => String::new(),
    }
}

/// What the student is told after a job; the exit code (0 to go on).
fn verdict(lab: Lab, whose: Whose, ended: std::io::Result<Ended>, ranks: usize, work: Work) -> i32 {
    // The file to fix: the student's (a skeleton run is a fresh clone's), or the one run.
    let file = match whose {
        Whose::Yours | Whose::Skeleton => lab.file().to_string(),
        Whose::Solution => lab.file().replace("/src/", "/solutions/"),
        Whose::Planted => lab.file().replace("/src/", "/planted/"),
    };
    let n = lab.number();
    match ended {
        Err(e) => {
            eprintln!("error: cannot start the ranks: {e}");
            1
        }
        Ok(Ended::Right) => 0,
        Ok(Ended::Wrong) if work == Work::Watch => 1,
        Ok(Ended::Wrong) => {
            match lab.is_collective() {
                true => println!(
                    "Fix {file} and run `cargo lab {n}` again; `cargo lab {n} -n {ranks} --steps` \
                     shows each of your steps."
                ),
                false => println!("Fix {file} and run `cargo lab {n}` again."),
            }
            1
        }
        Ok(Ended::NotWritten) => {
            println!("lab {n} is not written yet: open {file}");
            first_hint(lab);
            1
        }
        Ok(Ended::Failed(_, _)) if lab == Lab::Deadlock => {
            println!(
                "lab 7: the program did not finish on {ranks} ranks. Above, each rank's error: a \
                 rank that waited past --timeout names the rank it waited for. Why does each wait \
                 for the other? Fix {file} and run `cargo lab 7` again."
            );
            first_hint(lab);
            1
        }
        Ok(Ended::Failed(case, inside)) => {
            failed(lab, work, ranks, case, &inside);
            1
        }
        Ok(Ended::Interrupted) => {
            eprintln!("interrupted: the ranks were stopped");
            130
        }
    }
}

/// The lab page's first hint, as the checker prints it.
fn first_hint(lab: Lab) {
    if let Some(hint) = lab.hints().first() {
        println!(
            "hint 1 (more on the lab's page, docs/src/{}): {hint}",
            lab.page_path()
        );
    }
}

/// A job that failed: in which case, and whose code (the ranks whose error came out of the
/// student's code; none: a rank waited past the timeout outside it, for one still inside).
fn failed(lab: Lab, work: Work, ranks: usize, case: Option<usize>, inside: &[usize]) {
    let which = match (work, case) {
        (Work::Cases, Some(k)) if lab.is_collective() => {
            let case = crate::cases::cases(lab, ranks)[k];
            format!(" in {}", case.describe(lab))
        }
        (Work::Cases, Some(k)) if lab == Lab::Groups => {
            format!(" in {}", crate::groups::layouts(ranks)[k].describe())
        }
        (Work::Cases, _) => format!(" on {ranks} ranks"),
        _ => String::new(),
    };
    let mut inside = inside.to_vec();
    inside.sort();
    let names: Vec<String> = inside.iter().map(usize::to_string).collect();
    let n = lab.number();
    match names.as_slice() {
        [] => println!(
            "lab {n}: the check did not finish{which}. Above, each rank's error: a rank that \
             waited past --timeout names the rank it waited for. Is that one still in your code, \
             waiting for a message no rank sends?"
        ),
        [one] => println!("lab {n}: your code failed on rank {one}{which} (its error is above)."),
        many => println!(
            "lab {n}: your code failed on ranks {}{which} (their errors are above).",
            many.join(", ")
        ),
    }
}

/// Starts `ranks` ranks doing `work`, waits for them, shows their output and reads their reports.
fn run_job(
    work: Work,
    ranks: usize,
    settings: &Settings,
    scratch: &Scratch,
) -> std::io::Result<Ended> {
    scratch.clear();
    let dir = &scratch.0;
    let settings = Settings {
        ranks: Some(ranks),
        ..settings.clone()
    };
    let args: Vec<OsString> = vec![
        "--child-work".into(),
        work.name().into(),
        "--child-dir".into(),
        dir.as_os_str().to_owned(),
    ];
    let route = |name: String| Route {
        console: false,
        file: Some(dir.join(name)),
    };
    let extras = Extras {
        env: Vec::new(),
        outputs: (0..ranks)
            .map(|r| RankOutput {
                stdout: route(format!("out.{r}")),
                stderr: route(format!("err.{r}")),
            })
            .collect(),
        stop: None,
    };
    let outcome = launch::start_ranks_with(&settings, &args, &extras);
    let found = report::read(dir);
    let ended = match &outcome {
        Ok(Outcome::Interrupted(_)) => Ended::Interrupted,
        _ if found.not_written => Ended::NotWritten,
        Ok(Outcome::Success) => match found.verdict {
            Some(Verdict::Wrong(_)) => Ended::Wrong,
            _ => Ended::Right,
        },
        _ => Ended::Failed(found.failed_in, found.failed_inside),
    };
    if !matches!(ended, Ended::NotWritten) {
        show_output(dir, ranks, !matches!(ended, Ended::Right | Ended::Wrong));
    }
    if let (Ended::Failed(..), Some(file)) = (&ended, &settings.trace) {
        merge_failed_trace(file, ranks);
    }
    if let Err(e) = outcome {
        eprintln!("error: {e}");
    }
    Ok(ended)
}

/// A failed job's trace: each rank wrote its part up to its failure; merged when every rank
/// did (a rank the launcher stopped first wrote none).
fn merge_failed_trace(file: &Path, ranks: usize) {
    let part = |r: usize| {
        let mut name = file.as_os_str().to_owned();
        name.push(format!(".rank{r}"));
        PathBuf::from(name)
    };
    if (0..ranks).all(|r| part(r).is_file()) && comm_core::trace::merge(file, ranks).is_ok() {
        println!(
            "trace: {} (up to the failure; draw it with `comm-bench timeline {}`)",
            file.display(),
            file.display()
        );
    } else {
        (0..ranks).for_each(|r| {
            let _ = std::fs::remove_file(part(r));
        });
    }
}

/// Prints what the ranks printed: rank 0's lines as they are (but the backend line every
/// program's rank 0 prints), then the other ranks' own lines labelled `[rank r]`; with
/// `errors`, every rank's stderr after them.
fn show_output(dir: &Path, ranks: usize, errors: bool) {
    let lines = |name: String| -> Vec<String> {
        std::fs::read_to_string(dir.join(name))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    };
    for line in lines("out.0".into()) {
        if !line.starts_with("backend: ") {
            println!("{line}");
        }
    }
    for r in 1..ranks {
        for line in lines(format!("out.{r}")) {
            println!("[rank {r}] {line}");
        }
    }
    if errors {
        for r in 0..ranks {
            for line in lines(format!("err.{r}")) {
                println!("{line}");
            }
        }
    }
}
