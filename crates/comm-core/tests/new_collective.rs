//! A new collective is placed by following the compiler. In a scratch copy of the workspace this
//! adds a variant to `Collective`, then runs `cargo check` round after round, each time placing
//! the collective where the errors point, as a maintainer would: at a `match` that no longer
//! covers every collective, the arm the compiler itself suggests (`=> todo!()`); in
//! collective.rs, the table entry its length error asks for. Once the copy builds, the files the
//! errors named must be exactly those that collective.rs's top comment lists: no `match` on a
//! collective hides the new one behind a `_` arm, and the comment names no file the compiler
//! does not lead to.
//!
//! Its cost is `cargo check` of the copy, three rounds (comm-core, then the crates that use it,
//! then comm-bench's dependants), with the workspace's own target folder, so that the
//! dependencies are those `cargo clippy` or `cargo check` checked already (CI runs clippy
//! first). The copy's crates are renamed to version 0.1.0-new-collective: cargo names a workspace
//! crate's files by its path inside the workspace (the same in the copy) and its version, so the
//! copy's files sit beside the workspace's instead of replacing them, and each run replaces the
//! last run's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use test_support::build::{profile_dir, workspace_root};
use test_support::process::{scratch, start};

const COLLECTIVE_RS: &str = "crates/comm-core/src/collective.rs";
const NEW: &str = "NewCollective";
/// Rounds of `cargo check` before the test gives up: one per crate the errors can stop in.
const ROUNDS: usize = 6;
/// One round's limit: a first check of every dependency, on 2 busy cores, stays well within.
const ROUND_LIMIT: Duration = Duration::from_secs(1200);

#[test]
fn a_new_collective_is_placed_by_following_the_compiler() {
    let root = workspace_root();
    let listed = listed_files(&root);
    let copy = scratch("new-collective").join("workspace");
    copy_tree(&root, &copy);
    rename_version(&copy);
    add_variant(&copy);
    let started = Instant::now();
    let mut named = BTreeSet::new();
    for round in 1..=ROUNDS {
        let errors = check(&copy);
        eprintln!(
            "round {round}: {} errors in {:?} ({:.0?} so far)",
            errors.len(),
            errors.iter().map(|e| &e.file).collect::<BTreeSet<_>>(),
            started.elapsed()
        );
        if errors.is_empty() {
            assert_eq!(
                named, listed,
                "the files the compiler named (left) are not those {COLLECTIVE_RS}'s top \
                 comment lists (right)"
            );
            let _ = std::fs::remove_dir_all(copy.parent().unwrap());
            return;
        }
        named.extend(errors.iter().map(|e| e.file.clone()));
        place(&copy, &errors);
    }
    panic!("the copy still fails to build after {ROUNDS} rounds; named so far: {named:?}");
}

/// The files collective.rs's top comment lists (`//! - `path`: ...`), but for the one with a
/// `<placeholder>`: the algorithm's file, which the maintainer writes and the dispatch's error
/// leads to.
fn listed_files(root: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root.join(COLLECTIVE_RS)).unwrap();
    let listed: BTreeSet<String> = text
        .lines()
        .take_while(|line| line.starts_with("//!"))
        .filter_map(|line| line.strip_prefix("//! - `"))
        .filter_map(|item| item.split('`').next())
        .filter(|path| !path.contains('<'))
        .map(str::to_string)
        .collect();
    assert!(
        listed.contains(COLLECTIVE_RS) && listed.len() > 3,
        "{COLLECTIVE_RS}'s top comment lists no files as `//! - `path`: ...`: {listed:?}"
    );
    for path in &listed {
        assert!(root.join(path).is_file(), "{path}, listed, is not a file");
    }
    listed
}

/// Copies the workspace's sources, every folder but `.git` and the build's `target`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == ".git" || name == "target" {
            continue;
        }
        let (source, dest) = (entry.path(), to.join(&name));
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&source, &dest);
        } else if entry.file_type().unwrap().is_file() {
            std::fs::copy(&source, &dest)
                .unwrap_or_else(|e| panic!("{} to {}: {e}", source.display(), dest.display()));
        }
    }
}

/// Every crate of the copy at version 0.1.0-new-collective (the root package's own and the one
/// the others inherit), so that its files in the shared target folder have names of their own.
fn rename_version(copy: &Path) {
    let manifest = copy.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let renamed = text.replace(
        "\nversion = \"0.1.0\"\n",
        "\nversion = \"0.1.0-new-collective\"\n",
    );
    assert_eq!(
        renamed.matches("0.1.0-new-collective").count(),
        2,
        "the root Cargo.toml sets version = \"0.1.0\" for its package and [workspace.package]"
    );
    std::fs::write(&manifest, renamed).unwrap();
}

/// The maintainer's first step: a variant at the end of the list `collectives!` declares.
fn add_variant(copy: &Path) {
    let path = copy.join(COLLECTIVE_RS);
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text
        .find("\ncollectives! {\n")
        .expect("collective.rs declares its variants in `collectives! { ... }`");
    let end = start
        + text[start..]
            .find("\n}\n")
            .expect("the end of collectives!");
    let variant = format!("\n    /// A collective the test adds.\n    {NEW},");
    std::fs::write(&path, format!("{}{variant}{}", &text[..end], &text[end..])).unwrap();
}

/// One error of a round: the file its primary span is in, and the compiler's suggested edits.
#[derive(Debug)]
struct Error {
    file: String,
    code: String,
    rendered: String,
    suggestions: Vec<Edit>,
}

/// Replace bytes `start..end` of `file` with `text`.
#[derive(Debug)]
struct Edit {
    file: String,
    start: usize,
    end: usize,
    text: String,
}

/// `cargo check` of every target of the copy: its errors (none once it builds).
fn check(copy: &Path) -> Vec<Error> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = profile_dir().parent().unwrap().to_path_buf();
    let mut command = Command::new(cargo);
    command
        .args(["check", "--workspace", "--all-targets", "--offline"])
        .arg("--message-format=json")
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(copy);
    let finished = start(&mut command).finish(ROUND_LIMIT);
    let errors: Vec<Error> = finished.stdout.lines().filter_map(error_of).collect();
    assert_eq!(
        errors.is_empty(),
        finished.status.success(),
        "cargo check {} without an error message:\n{}",
        finished.status,
        finished.stderr
    );
    errors
}

/// The error a line of cargo's JSON reports, if it reports one with a place in a file.
fn error_of(line: &str) -> Option<Error> {
    let message: Value = serde_json::from_str(line).ok()?;
    let message = message.get("message").filter(|_| {
        message["reason"] == "compiler-message" && message["message"]["level"] == "error"
    })?;
    let spans = message["spans"].as_array()?;
    let primary = spans.iter().find(|s| s["is_primary"] == true)?;
    let mut suggestions = Vec::new();
    for child in message["children"].as_array().into_iter().flatten() {
        for span in child["spans"].as_array().into_iter().flatten() {
            if let Some(text) = span["suggested_replacement"].as_str() {
                suggestions.push(Edit {
                    file: span["file_name"].as_str()?.to_string(),
                    start: span["byte_start"].as_u64()? as usize,
                    end: span["byte_end"].as_u64()? as usize,
                    text: text.to_string(),
                });
            }
        }
    }
    Some(Error {
        file: primary["file_name"].as_str()?.to_string(),
        code: message["code"]["code"].as_str().unwrap_or("").to_string(),
        rendered: message["rendered"].as_str().unwrap_or("").to_string(),
        suggestions,
    })
}

/// Places the new collective where `errors` point: the compiler's own arm at a `match` that
/// misses it (E0004), its entry in collective.rs's table. Any other error fails the test.
fn place(copy: &Path, errors: &[Error]) {
    // One edit per place: a crate checked twice (as a library and as its tests) reports each
    // error twice, its suggested arm spelt with the path each build finds.
    let mut edits = BTreeMap::new();
    for error in errors {
        match (error.code.as_str(), error.file.as_str()) {
            ("E0004", _) if !error.suggestions.is_empty() => {
                for edit in &error.suggestions {
                    let place = (edit.file.clone(), edit.start, edit.end);
                    edits.entry(place).or_insert_with(|| plain_path(&edit.text));
                }
            }
            (_, COLLECTIVE_RS) => {
                let (at, entry) = table_entry(copy);
                edits.insert((COLLECTIVE_RS.to_string(), at, at), entry);
            }
            _ => panic!(
                "an error that does not say where the new collective goes:\n{}",
                error.rendered
            ),
        }
    }
    // From the end of each file backwards, so that an edit moves no later one's offsets.
    for ((file, start, end), text) in edits.iter().rev() {
        let path: PathBuf = copy.join(file);
        let mut source = std::fs::read_to_string(&path).unwrap();
        source.replace_range(*start..*end, text);
        std::fs::write(&path, source).unwrap();
    }
}

/// `text` with the new variant named `Collective::NewCollective` wherever the compiler wrote a
/// longer path to it (`collective::Collective::NewCollective`), as every file that matches on
/// a collective imports the enum.
fn plain_path(text: &str) -> String {
    let variant = format!("Collective::{NEW}");
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(&variant) {
        let path_start = rest[..at]
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .map_or(0, |i| i + 1);
        out.push_str(&rest[..path_start]);
        out.push_str(&variant);
        rest = &rest[at + variant.len()..];
    }
    out + rest
}

/// The new collective's entry at the end of collective.rs's `TABLE`: where it goes, and its text.
fn table_entry(copy: &Path) -> (usize, String) {
    let text = std::fs::read_to_string(copy.join(COLLECTIVE_RS)).unwrap();
    let table = text.find("\nconst TABLE").expect("collective.rs's TABLE");
    let end = table + text[table..].find("\n];").expect("the end of TABLE") + 1;
    let entry = format!(
        "    Description {{\n        collective: Collective::{NEW},\n        name: \
         \"new_collective\",\n        title: \"{NEW}\",\n        ..BASE\n    }},\n"
    );
    (end, entry)
}
