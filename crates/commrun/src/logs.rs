//! Where the workers' output goes, as torchrun's `--redirects`, `--tee`, `--local-ranks-filter`
//! and `--log-dir` say. A stream that is redirected goes to its log file only, one that is teed
//! to its file and the console; a local rank outside the filter reaches the console not at all
//! (its files are still written). The files are laid out as torchrun 2.x lays them out:
//!
//! ```text
//! <log-dir>/<run id>_<8 random characters>/attempt_<restart count>/<local rank>/stdout.log
//!                                                                           .../stderr.log
//! ```
//!
//! Without `--log-dir`, torchrun makes a directory under the temporary folder and does not say
//! where; commrun makes one too when there are files to write, and says where on stderr.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use comm_core::spawn::{RankOutput, Route};

use crate::error::LaunchError;

/// Streams of a worker as torchrun numbers them: 0 none, 1 stdout, 2 stderr, 3 both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Std(u8);

impl Std {
    pub fn stdout(self) -> bool {
        self.0 & 1 != 0
    }

    pub fn stderr(self) -> bool {
        self.0 & 2 != 0
    }
}

/// A `--redirects` or `--tee` value: one [`Std`] for every local rank (`3`), or one per local
/// rank (`0:1,1:2`; a rank not named: 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StdSpec {
    All(Std),
    PerRank(BTreeMap<usize, Std>),
}

impl Default for StdSpec {
    fn default() -> StdSpec {
        StdSpec::All(Std::default())
    }
}

impl StdSpec {
    /// The streams of `local_rank`.
    pub fn of(&self, local_rank: usize) -> Std {
        match self {
            StdSpec::All(std) => *std,
            StdSpec::PerRank(map) => map.get(&local_rank).copied().unwrap_or_default(),
        }
    }

    /// The local ranks it names (none for one value for all).
    fn ranks(&self) -> Vec<usize> {
        match self {
            StdSpec::All(_) => vec![],
            StdSpec::PerRank(map) => map.keys().copied().collect(),
        }
    }
}

/// `--redirects` and `--tee`: `0`-`3`, or `LOCAL_RANK:0-3,…`.
pub fn parse_std_spec(value: &str) -> Result<StdSpec, LaunchError> {
    let std = |v: &str, local_rank| match v.trim() {
        "0" => Ok(Std(0)),
        "1" => Ok(Std(1)),
        "2" => Ok(Std(2)),
        "3" => Ok(Std(3)),
        other => Err(LaunchError::NotStreams {
            value: other.into(),
            local_rank,
        }),
    };
    if !value.contains(':') {
        return std(value, None).map(StdSpec::All);
    }
    let mut map = BTreeMap::new();
    for pair in value.split(',') {
        let (rank, v) = pair
            .split_once(':')
            .ok_or_else(|| LaunchError::NotARankPair(pair.into()))?;
        let rank = local_rank(rank)?;
        if map.insert(rank, std(v, Some(rank))?).is_some() {
            return Err(LaunchError::RankGivenTwice(rank));
        }
    }
    Ok(StdSpec::PerRank(map))
}

/// `--local-ranks-filter`: the local ranks whose output reaches the console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankFilter(BTreeSet<usize>);

/// `0` or `0,2`.
pub fn parse_rank_filter(value: &str) -> Result<RankFilter, LaunchError> {
    let ranks = value
        .split(',')
        .map(local_rank)
        .collect::<Result<BTreeSet<usize>, LaunchError>>()?;
    Ok(RankFilter(ranks))
}

fn local_rank(text: &str) -> Result<usize, LaunchError> {
    text.trim()
        .parse()
        .map_err(|_| LaunchError::NotALocalRank(text.into()))
}

/// The output choices of the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputPlan {
    pub log_dir: Option<PathBuf>,
    pub redirects: StdSpec,
    pub tee: StdSpec,
    pub filter: Option<RankFilter>,
}

impl OutputPlan {
    /// Refuses a local rank that this node does not have, named in a per-rank value.
    pub fn check(&self, nproc: usize) -> Result<(), LaunchError> {
        let named = [
            ("--redirects", self.redirects.ranks()),
            ("--tee", self.tee.ranks()),
            (
                "--local-ranks-filter",
                self.filter.iter().flat_map(|f| f.0.clone()).collect(),
            ),
        ];
        for (flag, ranks) in named {
            if let Some(rank) = ranks.into_iter().find(|&r| r >= nproc) {
                return Err(LaunchError::NoSuchLocalRank { flag, rank, nproc });
            }
        }
        Ok(())
    }

    /// Where `local_rank`'s stdout and stderr go, its files (if any) in `rank_dir`.
    pub fn rank_output(&self, local_rank: usize, rank_dir: &Path) -> RankOutput {
        let (redirect, tee) = (self.redirects.of(local_rank), self.tee.of(local_rank));
        let shown = self
            .filter
            .as_ref()
            .is_none_or(|f| f.0.contains(&local_rank));
        let route = |redirected: bool, teed: bool, name: &str| Route {
            console: shown && (teed || !redirected),
            file: (redirected || teed).then(|| rank_dir.join(name)),
        };
        RankOutput {
            stdout: route(redirect.stdout(), tee.stdout(), "stdout.log"),
            stderr: route(redirect.stderr(), tee.stderr(), "stderr.log"),
        }
    }

    /// Whether any local rank has a log file.
    fn writes_files(&self, nproc: usize) -> bool {
        (0..nproc).any(|r| {
            let files = self.rank_output(r, Path::new(""));
            files.stdout.file.is_some() || files.stderr.file.is_some()
        })
    }
}

/// This run's log directory, made once: each start of the worker group gets an `attempt_<k>`
/// folder in it.
#[derive(Debug)]
pub struct RunLogs {
    output: OutputPlan,
    nproc: usize,
    /// `<log-dir>/<run id>_<random>`; None when no file is written.
    run_dir: Option<PathBuf>,
}

impl RunLogs {
    /// Makes the run's directory if there are files to write (under a new temporary one without
    /// `--log-dir`), and says on stderr where the files will be.
    pub fn create(
        output: &OutputPlan,
        nproc: usize,
        run_id: Option<&str>,
    ) -> Result<RunLogs, LaunchError> {
        let mut logs = RunLogs {
            output: output.clone(),
            nproc,
            run_dir: None,
        };
        if !output.writes_files(nproc) {
            if let Some(dir) = &output.log_dir {
                eprintln!(
                    "commrun: warning: --log-dir {} without --redirects or --tee: no log file is \
                     written (--tee 3 keeps both streams of every worker)",
                    dir.display()
                );
            }
            return Ok(logs);
        }
        let root = match &output.log_dir {
            Some(dir) => log_dir(dir)?,
            None => {
                fresh_dir(&std::env::temp_dir(), "commrun_").map_err(LaunchError::MakeTempLogDir)?
            }
        };
        let run_dir =
            fresh_dir(&root, &format!("{}_", run_dir_name(run_id))).map_err(|source| {
                LaunchError::MakeRunDir {
                    path: root.clone(),
                    source,
                }
            })?;
        let given = match output.log_dir {
            Some(_) => "",
            None => " (no --log-dir given: a new directory)",
        };
        eprintln!(
            "commrun: log files in {}/attempt_<restart>/<local rank>/{given}",
            run_dir.display()
        );
        logs.run_dir = Some(run_dir);
        Ok(logs)
    }

    /// The outputs of the local ranks for start `attempt` (0 the first), making its folders.
    pub fn attempt(&self, attempt: u32) -> Result<Vec<RankOutput>, LaunchError> {
        let Some(run_dir) = &self.run_dir else {
            return Ok((0..self.nproc)
                .map(|r| self.output.rank_output(r, Path::new("")))
                .collect());
        };
        let attempt_dir = run_dir.join(format!("attempt_{attempt}"));
        let mut outputs = Vec::with_capacity(self.nproc);
        for local_rank in 0..self.nproc {
            let rank_dir = attempt_dir.join(local_rank.to_string());
            let output = self.output.rank_output(local_rank, &rank_dir);
            if output.stdout.file.is_some() || output.stderr.file.is_some() {
                std::fs::create_dir_all(&rank_dir).map_err(|source| {
                    LaunchError::MakeRankLogDir {
                        path: rank_dir.clone(),
                        source,
                    }
                })?;
            }
            outputs.push(output);
        }
        Ok(outputs)
    }
}

/// `--log-dir`, made if it does not exist.
fn log_dir(dir: &Path) -> Result<PathBuf, LaunchError> {
    if dir.is_file() {
        return Err(LaunchError::LogDirIsFile(dir.to_path_buf()));
    }
    std::fs::create_dir_all(dir).map_err(|source| LaunchError::MakeLogDir {
        path: dir.to_path_buf(),
        source,
    })?;
    Ok(dir.to_path_buf())
}

/// The run id as a folder name: torchrun's `none` when there is none, `/` and other oddities
/// made `_`.
fn run_dir_name(run_id: Option<&str>) -> String {
    run_id
        .unwrap_or("none")
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => c,
            _ => '_',
        })
        .collect()
}

/// A new private folder `<parent>/<prefix><8 random characters>`, as Python's `mkdtemp`.
fn fresh_dir(parent: &Path, prefix: &str) -> std::io::Result<PathBuf> {
    let mut last = None;
    for _ in 0..16 {
        let path = parent.join(format!("{prefix}{}", random_suffix()));
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("tried at least once"))
}

/// Eight characters of `[a-z0-9_]`.
fn random_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789_";
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let mut bits = hasher.finish();
    (0..8)
        .map(|_| {
            let c = CHARS[(bits % CHARS.len() as u64) as usize];
            bits /= CHARS.len() as u64;
            c as char
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(redirects: &str, tee: &str, filter: Option<&str>) -> OutputPlan {
        OutputPlan {
            log_dir: None,
            redirects: parse_std_spec(redirects).unwrap(),
            tee: parse_std_spec(tee).unwrap(),
            filter: filter.map(|f| parse_rank_filter(f).unwrap()),
        }
    }

    fn route(console: bool, file: Option<&str>) -> Route {
        Route {
            console,
            file: file.map(|f| Path::new("d").join(f)),
        }
    }

    #[test]
    fn torchruns_values_parse_and_bad_ones_are_named() {
        assert_eq!(parse_std_spec("3").unwrap().of(5), Std(3));
        let per_rank = parse_std_spec("0:1,1:2").unwrap();
        assert_eq!(
            (per_rank.of(0), per_rank.of(1), per_rank.of(2)),
            (Std(1), Std(2), Std(0))
        );
        let message = |value: &str| parse_std_spec(value).unwrap_err().to_string();
        assert_eq!(
            message("7"),
            "\"7\" is not 0 (none), 1 (stdout), 2 (stderr) or 3 (both), nor LOCAL_RANK:VALUE \
             pairs such as 0:3,1:2"
        );
        assert_eq!(
            message("0:9"),
            "local rank 0: \"9\" is not 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"
        );
        assert!(matches!(
            parse_std_spec("x:1"),
            Err(LaunchError::NotALocalRank(text)) if text == "x"
        ));
        assert!(matches!(
            parse_std_spec("0:1,0:2"),
            Err(LaunchError::RankGivenTwice(0))
        ));
        assert_eq!(
            message("0:1,2"),
            "\"2\" is not LOCAL_RANK:VALUE (such as 0:3)"
        );
        assert_eq!(parse_rank_filter("0, 2").unwrap().0, BTreeSet::from([0, 2]));
        assert!(parse_rank_filter("0,")
            .unwrap_err()
            .to_string()
            .contains("not a local rank"));
    }

    #[test]
    fn redirect_tee_and_filter_route_each_stream() {
        let dir = Path::new("d");
        // Nothing asked: the console, no file.
        let none = plan("0", "0", None).rank_output(0, dir);
        assert_eq!(none, RankOutput::default());
        // Redirected stdout: its file only; teed stderr: file and console.
        let out = plan("1", "2", None).rank_output(0, dir);
        assert_eq!(out.stdout, route(false, Some("stdout.log")));
        assert_eq!(out.stderr, route(true, Some("stderr.log")));
        // Per rank: rank 1 redirects stderr, the others nothing.
        let p = plan("1:2", "0", None);
        assert_eq!(p.rank_output(0, dir), RankOutput::default());
        assert_eq!(
            p.rank_output(1, dir).stderr,
            route(false, Some("stderr.log"))
        );
        // Filtered out: never the console, files still written.
        let p = plan("0", "3", Some("0"));
        assert_eq!(
            p.rank_output(0, dir).stdout,
            route(true, Some("stdout.log"))
        );
        assert_eq!(
            p.rank_output(1, dir).stdout,
            route(false, Some("stdout.log"))
        );
        assert_eq!(
            plan("0", "0", Some("1")).rank_output(0, dir).stderr,
            route(false, None)
        );
    }

    #[test]
    fn ranks_this_node_lacks_are_refused() {
        assert!(plan("0:3,1:3", "0", None).check(2).is_ok());
        let e = plan("0", "3:1", None).check(2).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--tee names local rank 3, but this node runs local ranks 0 to 1"
        );
        let e = plan("0", "0", Some("0,4"))
            .check(4)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--local-ranks-filter names local rank 4"),
            "{e}"
        );
    }

    #[test]
    fn run_dir_names_are_folder_names() {
        assert_eq!(run_dir_name(None), "none");
        assert_eq!(run_dir_name(Some("job-1/2 x")), "job-1_2_x");
        let suffix = random_suffix();
        assert_eq!(suffix.len(), 8);
        assert!(suffix
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_'));
    }
}
