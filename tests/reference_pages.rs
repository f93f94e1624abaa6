//! The book's reference pages stay true to the code:
//! - `environment-variables.md` lists every variable a chapter or the README names, every variable
//!   comm-core reads (crates/comm-core/src/topology.rs names them all), and every switch CI sets;
//! - `troubleshooting.md` quotes only messages the code still prints: each quoted ```text message, cut
//!   at its placeholders (`<port>`), must be found piece by piece in the sources.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use test_support::book::{chapters, src};

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Words shaped like environment variables: capitals, digits and underscores, with an
/// underscore inside (`MASTER_ADDR`), plus the few without one that launchers set.
fn variable_names(text: &str) -> BTreeSet<String> {
    const PLAIN: [&str; 3] = ["RANK", "PYTHON", "SIZES"];
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| {
            let shaped = w.starts_with(|c: char| c.is_ascii_uppercase())
                && w.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                && w.contains('_')
                && !w.starts_with('_')
                && !w.ends_with('_');
            shaped || PLAIN.contains(w)
        })
        .map(String::from)
        .collect()
}

/// Capital words with underscores in the book that are not environment variables.
const NOT_VARIABLES: &[&str] = &[
    "YYYYMMDD_HHMMSS",
    "TIME_WAIT",
    "THRESHOLD_BYTES",
    "SO_REUSEADDR",
    "PR_SET_PDEATHSIG",
    "NODE0_IP",
    "YOUR_ACCOUNT",
    "MPI_IN_PLACE",
    "ERR_NVGPUCTRPERM",
    "COMPARE_SET",
    "MPI_COMM_WORLD",
    // settings.rs's constant, the default of --timeout (architecture.md).
    "DEFAULT_TIMEOUT",
    // slurm/07-torchrun.sbatch's own shell variable (its knob is NPROC_PER_NODE), in the line
    // the Leonardo chapter shows.
    "PER_NODE",
    // comm-core's and NCCL's constant for a rank that joins no group (tensor-parallel.md).
    "NCCL_SPLIT_NOCOLOR",
    "NO_COLOR",
    // Linux's flags: memfd_create's huge pages, and a descriptor passed over a Unix socket
    // (engineering-notes.md's registered buffers).
    "MFD_HUGETLB",
    "SCM_RIGHTS",
];

/// The names the environment page lists: those it shows as code (`NAME`).
fn listed() -> BTreeSet<String> {
    let page = read(&src().join("environment-variables.md"));
    page.split('`')
        .skip(1)
        .step_by(2)
        .flat_map(variable_names)
        .collect()
}

#[test]
fn every_variable_a_chapter_names_is_listed() {
    let listed = listed();
    let mut missing = Vec::new();
    let mut texts: Vec<(String, String)> = chapters()
        .into_iter()
        .filter(|c| c != "environment-variables.md")
        .map(|c| (read(&src().join(&c)), c))
        .collect();
    texts.push((read(&repo().join("README.md")), "README.md".into()));
    for (text, chapter) in texts {
        for name in variable_names(&text) {
            if !listed.contains(&name) && !NOT_VARIABLES.contains(&name.as_str()) {
                missing.push(format!("{name} (named in {chapter})"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/src/environment-variables.md does not list: {missing:?} \
         (or add the word to NOT_VARIABLES if it is no variable)"
    );
}

#[test]
fn every_variable_comm_core_reads_is_listed() {
    let topology = read(&repo().join("crates/comm-core/src/topology.rs"));
    // The module's own code, not its tests.
    let code = topology.split("#[cfg(test)]").next().unwrap();
    // Each variable is a literal of its own: `var("MASTER_ADDR")`, `const …: &str = "RANK"`.
    let read_here: BTreeSet<String> = code
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|literal| variable_names(literal).contains(*literal))
        .map(String::from)
        .collect();
    assert!(
        read_here.contains("MASTER_ADDR") && read_here.contains("NCCL_LIBRARY"),
        "topology.rs no longer names the variables as string literals: {read_here:?}"
    );
    let listed = listed();
    let missing: Vec<_> = read_here.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "comm-core reads {missing:?} (crates/comm-core/src/topology.rs), \
         which docs/src/environment-variables.md does not list"
    );
    let ci = read(&repo().join(".ci/run"));
    let switches: Vec<String> = variable_names(&ci)
        .into_iter()
        .filter(|n| n.starts_with("NCCL_WORKSHOP_REQUIRE_"))
        .filter(|n| !listed.contains(n))
        .collect();
    assert!(switches.is_empty(), ".ci/run sets {switches:?}, not listed");
}

/// Every `.rs` file's text under `dir`, with Rust's string continuations (`\` at a line's
/// end and the next line's indent) joined, as the program prints them.
fn sources(dir: &Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = read(&path);
            let mut lines = text.lines().peekable();
            while let Some(line) = lines.next() {
                match line.strip_suffix('\\') {
                    Some(joined) => {
                        out.push_str(joined);
                        if let Some(next) = lines.peek_mut() {
                            *next = next.trim_start();
                        }
                    }
                    None => {
                        out.push_str(line);
                        out.push('\n');
                    }
                }
            }
        }
    }
}

/// A quoted message cut where the program fills in values: at `<placeholders>`, `…`, numbers,
/// variables' names, and where a message is made of parts written in several places (after
/// `: `, `; ` and a timeout's `waiting for `).
fn pieces(message: &str) -> Vec<String> {
    let mut message = message.to_string();
    for name in variable_names(&message) {
        message = message.replace(&name, "<name>");
    }
    let mut text = String::new();
    let mut in_placeholder = false;
    for c in message.chars() {
        match c {
            '<' => in_placeholder = true,
            '>' if in_placeholder => {
                in_placeholder = false;
                text.push('\u{0}');
            }
            _ if in_placeholder => {}
            '…' => text.push('\u{0}'),
            c if c.is_ascii_digit() => text.push('\u{0}'),
            c => text.push(c),
        }
    }
    text.replace(": ", "\u{0}")
        .replace("; ", "\u{0}")
        .replace("waiting for ", "waiting for\u{0}")
        .split('\u{0}')
        .map(|p| p.trim().to_string())
        .filter(|p| p.len() >= 12)
        .collect()
}

#[test]
fn troubleshooting_quotes_messages_the_code_prints() {
    let page = read(&src().join("troubleshooting.md"));
    let mut code = String::new();
    for dir in ["crates", "examples"] {
        sources(&repo().join(dir), &mut code);
    }
    let mut quoted = 0;
    let mut unknown = Vec::new();
    for block in page.split("```text\n").skip(1) {
        let message = block.split("```").next().unwrap();
        for piece in pieces(message) {
            quoted += 1;
            if !code.contains(&piece) {
                unknown.push(piece);
            }
        }
    }
    assert!(quoted >= 20, "only {quoted} pieces of messages found");
    assert!(
        unknown.is_empty(),
        "troubleshooting.md quotes words no source prints (a message changed?): {unknown:#?}"
    );
}

#[test]
fn a_message_is_cut_at_its_values() {
    assert_eq!(
        pieces("error: rank 0: timed out after <t> waiting for rank <r> to connect to rank 0"),
        ["timed out after", "to connect to rank"]
    );
    assert_eq!(
        variable_names("set `MASTER_ADDR`, RANK and LL128; not Rank or _X_"),
        BTreeSet::from(["MASTER_ADDR".to_string(), "RANK".to_string()])
    );
}
