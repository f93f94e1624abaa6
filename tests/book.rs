//! The book (`docs/`) never drifts from the code: every chapter listed in `docs/src/SUMMARY.md`
//! is read, its links checked, and every output block marked `<!-- output: COMMAND -->` is
//! produced again by running COMMAND (an example, or a `torchrun …` command: see `run`) and
//! compared. The convention is in `docs/README.md`.
//! The book shows a machine without GPUs: where there are some, the commands run with them hidden.
//!
//! `cargo test --test book -- --nocapture` also prints the figure: code blocks (and how many are
//! included from the real files), output blocks (and how many are checked).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use test_support::backend::{self, Kind};
use test_support::book::{chapters, src};
use test_support::build::{binary, example, package_example, the_one_build};
use test_support::process::{self, Plainly, Tag};
use test_support::torch;

const CHECKED: &str = "<!-- output: ";
const ILLUSTRATIVE: &str = "<!-- output-illustrative: ";

#[derive(Debug, PartialEq)]
enum Mark {
    /// `<!-- output: COMMAND -->`: the block is COMMAND's output, checked here.
    Checked(String),
    /// `<!-- output-illustrative: WHY -->`: output that cannot be produced here (GPUs, Slurm).
    Illustrative,
    None,
}

struct Block {
    chapter: String,
    line: usize,
    lang: String,
    mark: Mark,
    body: String,
}

impl Block {
    /// Output blocks are fenced without a language or as `text`; the rest is code or commands.
    fn is_output(&self) -> bool {
        self.lang.is_empty() || self.lang == "text"
    }
    /// Code from a file: included (any language), or a block in a language other than shell
    /// commands. The rest (`bash` commands to type) are command blocks.
    fn is_source(&self) -> bool {
        !self.is_output()
            && (self.is_included() || !matches!(self.lang.as_str(), "bash" | "sh" | "console"))
    }
    fn is_included(&self) -> bool {
        self.body.trim_start().starts_with("{{#include")
    }
}

fn blocks(chapter: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(src().join(chapter))
        .unwrap_or_else(|e| panic!("{chapter} (listed in SUMMARY.md): {e}"));
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    let mut previous = "";
    while let Some((i, line)) = lines.next() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            let indent = line.len() - trimmed.len();
            let mut body = String::new();
            for (_, l) in lines.by_ref() {
                if l.trim_start().starts_with("```") {
                    break;
                }
                body.push_str(l.get(indent..).unwrap_or(l.trim_start()));
                body.push('\n');
            }
            let prev = previous.trim();
            let mark = if let Some(c) = prev.strip_prefix(CHECKED) {
                Mark::Checked(c.trim_end_matches("-->").trim().to_string())
            } else if prev.starts_with(ILLUSTRATIVE) {
                Mark::Illustrative
            } else {
                Mark::None
            };
            out.push(Block {
                chapter: chapter.to_string(),
                line: i + 1,
                lang: info.split(',').next().unwrap().trim().to_string(),
                mark,
                body,
            });
            previous = "";
        } else if !line.trim().is_empty() {
            previous = line;
        }
    }
    out
}

/// The book's output blocks come from a machine without GPUs, whose programs say
/// `backend: cpu (no CUDA driver found)`.
const BOOK_CPU_REASON: &str = "no CUDA driver found";

/// How the book's commands run here so that they print what the book shows.
struct AsInTheBook {
    /// Set for every command: on a machine with GPUs, `CUDA_VISIBLE_DEVICES=` hides them.
    envs: Vec<(&'static str, &'static str)>,
    /// Why the programs run on the CPU here, read as [`BOOK_CPU_REASON`] when it differs.
    cpu_reason: String,
}

fn as_in_the_book() -> &'static AsInTheBook {
    static HERE: OnceLock<AsInTheBook> = OnceLock::new();
    HERE.get_or_init(|| {
        let hello = example("00-hello-world");
        let here = backend::on_this_machine(&hello, &[]);
        if here.kind == Kind::Cpu {
            return AsInTheBook {
                envs: vec![],
                cpu_reason: here.reason,
            };
        }
        let envs = vec![("CUDA_VISIBLE_DEVICES", "")];
        let hidden = backend::on_this_machine(&hello, &envs);
        assert_eq!(hidden.kind, Kind::Cpu, "CUDA_VISIBLE_DEVICES= hides no GPU");
        AsInTheBook {
            envs,
            cpu_reason: hidden.reason,
        }
    })
}

/// Runs `cargo run [--release] [-p PACKAGE] --example NAME [-- ARGS]` with the debug example
/// binary (the output is the same but for timings, which are normalized), on the CPU as in the
/// book. Returns stdout and stderr. A `torchrun …` command runs as [`run_torchrun`] does, a
/// `cargo lab …` as [`run_lab`].
fn run(command: &str) -> Option<String> {
    if command.starts_with("torchrun ") {
        return run_torchrun(command);
    }
    if let Some(args) = command.strip_prefix("cargo lab ") {
        return Some(run_lab(args));
    }
    let words: Vec<&str> = command.split_whitespace().collect();
    let (cargo, args) =
        words.split_at(words.iter().position(|w| *w == "--").unwrap_or(words.len()));
    let args = args.get(1..).unwrap_or(&[]);
    let program = match cargo {
        ["cargo", "run", "--example", name] | ["cargo", "run", "--release", "--example", name] => {
            example(name)
        }
        ["cargo", "run", "-p", package, "--example", name] => package_example(package, name),
        _ => {
            panic!("cannot run `{command}`: only `cargo run [--release] [-p PACKAGE] --example NAME [-- ARGS]`, `cargo lab ARGS` or `torchrun …`")
        }
    };
    let book = as_in_the_book();
    let output = Command::new(program)
        .args(args)
        .plainly()
        .envs(book.envs.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "`{command}` failed:\n{stdout}\n{stderr}"
    );
    Some(format!("{stdout}{stderr}").replace(&book.cpu_reason, BOOK_CPU_REASON))
}

/// Runs `cargo lab ARGS` (the alias of `.cargo/config.toml`: the labs' checker, `lab ARGS`) with
/// the debug binary, on the CPU as in the book. A lab's page shows wrong and unwritten labs too:
/// the output is held whatever the exit status (crates/labs/tests/labs.rs holds the statuses).
fn run_lab(args: &str) -> String {
    let book = as_in_the_book();
    let output = Command::new(binary("labs", "lab"))
        .args(args.split_whitespace())
        .plainly()
        .envs(book.envs.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    format!("{stdout}{stderr}").replace(&book.cpu_reason, BOOK_CPU_REASON)
}

/// Runs a `torchrun …` command as written, after the one build command (its program is
/// `target/release/NAME`), with the torch of `scripts/torch-env.sh`; returns what the workers
/// printed on stdout (torchrun's own log lines go to stderr). Without torch: None, saying the
/// block was skipped (a failure with NCCL_WORKSHOP_REQUIRE_TORCH=1).
fn run_torchrun(command: &str) -> Option<String> {
    let torch = torch::or_skip(&format!("the book's `{command}`"))?;
    let book = as_in_the_book();
    let tag = Tag::new("book-torchrun");
    let mut torchrun = torch.as_written(command, &the_one_build());
    torchrun.plainly().envs(book.envs.iter().copied());
    tag.mark(&mut torchrun);
    let done = process::start(&mut torchrun).finish(Duration::from_secs(120));
    done.assert_success(command);
    tag.assert_all_gone(command);
    Some(done.stdout.replace(&book.cpu_reason, BOOK_CPU_REASON))
}

/// Lines that each rank prints on its own, in whatever order the processes get there.
fn per_rank(line: &str) -> bool {
    let rank_line = |rest: &str| rest.starts_with(|c: char| c.is_ascii_digit());
    line.strip_prefix("Hello from rank ").is_some_and(rank_line)
        || line.strip_prefix("Rank ").is_some_and(|r| {
            rank_line(r) && (r.contains(" using device: ") || r.contains(": weights "))
        })
}

/// Decimal numbers (timings, bandwidths) become `#.#`, a minus sign before one included (a fit's
/// latency may come out either side of zero).
fn numbers(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let digits = |mut j: usize| {
            while j < chars.len() && chars[j].is_ascii_digit() {
                j += 1;
            }
            j
        };
        if chars[i].is_ascii_digit() && (i == 0 || !chars[i - 1].is_alphanumeric()) {
            let j = digits(i);
            if j + 1 < chars.len() && chars[j] == '.' && chars[j + 1].is_ascii_digit() {
                if i > 0 && chars[i - 1] == '-' {
                    out.pop();
                }
                out.push_str("#.#");
                i = digits(j + 1);
                continue;
            }
            out.extend(&chars[i..j]);
            i = j;
            continue;
        }
        out.push(chars[i]);
        i += 1;
    }
    out
}

/// 06's `Rank R: weights 1a2b3c4d, …`: the checksum becomes `<checksum>` (its bits depend on the
/// machine's float kernels; the tests check that the ranks agree).
fn checksum(line: &str) -> String {
    match line.split_once(": weights ") {
        Some((head, rest)) if head.starts_with("Rank ") && rest.len() > 8 => {
            format!("{head}: weights <checksum>{}", &rest[8..])
        }
        _ => line.to_string(),
    }
}

/// The lines in order, but per-rank lines as a sorted set of their own, numbers normalized. A
/// fit's bandwidth that came out unbounded (the times fell with size in that range, as they may
/// on a busy machine) is a measured number like any other.
fn normalize(text: &str) -> (Vec<String>, Vec<String>) {
    let lines: Vec<String> = text
        .lines()
        .map(|l| numbers(&checksum(l.trim_end())).replace("unbounded", "#.# GB/s"))
        .collect();
    let (mut ranks, rest): (Vec<String>, Vec<String>) =
        lines.into_iter().partition(|l| per_rank(l));
    ranks.sort();
    let mut rest = rest;
    while rest.last().is_some_and(|l| l.is_empty()) {
        rest.pop();
    }
    (rest, ranks)
}

/// The ids mdbook gives a page's headings: lower case, letters, digits, `-` and `_` kept,
/// spaces as `-`, the rest dropped; a repeated id gets `-1`, `-2`, ….
fn heading_ids(page: &str) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    let mut in_code = false;
    for line in page.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        let Some(title) = line.strip_prefix('#').filter(|_| !in_code) else {
            continue;
        };
        let title = title.trim_start_matches('#').trim();
        let id: String = title
            .chars()
            .filter_map(|c| match c {
                c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c.to_lowercase().next()?),
                c if c.is_whitespace() => Some('-'),
                _ => None,
            })
            .collect();
        let repeats = ids.iter().filter(|i| i.as_str() == id).count();
        let unique = match repeats {
            0 => id.clone(),
            k => format!("{id}-{k}"),
        };
        ids.push(id);
        ids.push(unique);
    }
    ids
}

#[test]
fn summary_entries_and_links_resolve() {
    let mut broken = Vec::new();
    for chapter in chapters() {
        let path = src().join(&chapter);
        let Ok(text) = std::fs::read_to_string(&path) else {
            broken.push(format!("SUMMARY.md: {chapter} does not exist"));
            continue;
        };
        let dir = path.parent().unwrap();
        for (_, rest) in text.match_indices("](").map(|(i, _)| ((), &text[i + 2..])) {
            let Some((target, _)) = rest.split_once(')') else {
                continue;
            };
            let file = target.split('#').next().unwrap();
            if file.is_empty() || file.contains("://") || file.starts_with("mailto:") {
                continue;
            }
            if !dir.join(file).exists() {
                broken.push(format!("{chapter}: link to {target}: no such file"));
                continue;
            }
            // A link to a heading: mdbook's id of some heading of that page.
            if let Some((_, anchor)) = target.split_once('#') {
                let page = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
                if file.ends_with(".md") && !heading_ids(&page).contains(&anchor.to_string()) {
                    broken.push(format!("{chapter}: link to {target}: no such heading"));
                }
            }
        }
        for (n, line) in text.lines().enumerate() {
            if let Some(rest) = line.trim().strip_prefix("{{#include ") {
                // mdbook only logs a missing file, and shows nothing for a missing anchor.
                let spec = rest.trim().trim_end_matches("}}");
                let (file, anchor) = spec.split_once(':').unwrap_or((spec, ""));
                let Ok(source) = std::fs::read_to_string(dir.join(file)) else {
                    broken.push(format!(
                        "{chapter}:{}: include of {file}: no such file",
                        n + 1
                    ));
                    continue;
                };
                let is_name = anchor.chars().all(|c| c.is_alphanumeric() || c == '_');
                if !anchor.is_empty()
                    && is_name
                    && !(source.contains(&format!("ANCHOR: {anchor}\n"))
                        && source.contains(&format!("ANCHOR_END: {anchor}\n")))
                {
                    broken.push(format!(
                        "{chapter}:{}: include of {file}: no ANCHOR/ANCHOR_END {anchor}",
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken:\n{}", broken.join("\n"));
}

/// The programs the book, the README and the scripts run from `target/release` (or gpu-check's
/// `$BIN_DIR`, which is target/release by default).
fn programs_run_from_target_release() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut texts: Vec<(String, String)> = chapters()
        .into_iter()
        .map(|c| (c.clone(), std::fs::read_to_string(src().join(&c)).unwrap()))
        .collect();
    for file in [
        "README.md",
        "scripts/gpu-check.sh",
        "scripts/nccl-vs-pytorch.sh",
    ] {
        texts.push((
            file.into(),
            std::fs::read_to_string(root.join(file)).unwrap(),
        ));
    }
    let mut found = BTreeMap::new();
    for (file, text) in texts {
        for prefix in ["target/release/", "$BIN_DIR/"] {
            for (i, _) in text.match_indices(prefix) {
                let name: String = text[i + prefix.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                    .collect();
                if !name.is_empty() {
                    found.entry(name).or_insert_with(|| file.clone());
                }
            }
        }
    }
    found
}

/// The binaries `cargo build --release` builds: those of the workspace's default members.
fn built_by_the_one_build() -> Vec<String> {
    let output = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(output.status.success(), "cargo metadata failed");
    let meta: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let defaults: Vec<&str> = meta["workspace_default_members"]
        .as_array()
        .expect("cargo metadata lists the default members")
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    let mut bins = Vec::new();
    for package in meta["packages"].as_array().unwrap() {
        if !defaults.contains(&package["id"].as_str().unwrap()) {
            continue;
        }
        for target in package["targets"].as_array().unwrap() {
            if target["kind"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k == "bin")
            {
                bins.push(target["name"].as_str().unwrap().to_string());
            }
        }
    }
    bins
}

/// Every program the book runs from target/release is one that the one build command builds
/// (nccl-probe and collective-check included), so no reader needs a second build.
#[test]
fn the_one_build_builds_every_program_the_book_runs() {
    let built = built_by_the_one_build();
    let wanted = programs_run_from_target_release();
    for program in [
        "nccl-probe",
        "collective-check",
        "00-hello-world",
        "comm-bench",
    ] {
        assert!(
            wanted.contains_key(program),
            "the book no longer runs {program}?"
        );
    }
    let missing: Vec<String> = wanted
        .iter()
        .filter(|(name, _)| !built.contains(name))
        .map(|(name, file)| format!("{file}: target/release/{name}"))
        .collect();
    assert!(
        missing.is_empty(),
        "not built by `cargo build --release` (built: {built:?}):\n{}",
        missing.join("\n")
    );
}

/// The hand-made pictures (those the project cannot draw from a run): each exists, is an SVG
/// with a title (what a screen reader says), has every element it opens closed, and is shown
/// by a chapter of the book.
#[test]
fn hand_made_pictures_exist_and_are_shown() {
    let texts: String = chapters()
        .iter()
        .map(|c| std::fs::read_to_string(src().join(c)).unwrap())
        .collect();
    for picture in [
        "images/leonardo-two-nodes.svg",
        "images/nccl-startup.svg",
        "images/hello-startup.svg",
        "images/gloo-vs-nccl-path.svg",
    ] {
        let svg = std::fs::read_to_string(src().join(picture))
            .unwrap_or_else(|e| panic!("{picture}: {e}"));
        let svg = svg.trim();
        assert!(
            svg.starts_with("<svg ") && svg.ends_with("</svg>"),
            "{picture}"
        );
        assert!(svg.contains("<title>"), "{picture} has no <title>");
        let opened = svg.matches('<').count() - svg.matches("</").count();
        let closed = svg.matches("</").count() + svg.matches("/>").count();
        assert_eq!(opened, closed, "{picture}: an element is left open");
        assert!(
            texts.contains(&format!("]({picture})")),
            "no chapter shows {picture}"
        );
    }
}

#[test]
fn marked_output_blocks_are_what_the_commands_print() {
    let mut failures = Vec::new();
    for chapter in chapters() {
        for block in blocks(&chapter) {
            let Mark::Checked(command) = &block.mark else {
                continue;
            };
            assert!(
                block.is_output(),
                "{}:{}: an output mark before a `{}` block (output blocks are ``` or ```text)",
                block.chapter,
                block.line,
                block.lang
            );
            let Some(actual) = run(command) else {
                continue;
            };
            if normalize(&actual) != normalize(&block.body) {
                failures.push(format!(
                    "{}:{}: `{command}` now prints (update the book):\n{actual}\nthe book shows:\n{}",
                    block.chapter, block.line, block.body
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The figure: blocks per chapter, and how many the tests check. Unmarked output blocks are
/// listed by name (they are not checked); source blocks not included from a file too.
#[test]
fn figure() {
    let mut rows: BTreeMap<usize, (String, [usize; 6])> = BTreeMap::new();
    let mut unchecked = Vec::new();
    let mut total = [0usize; 6];
    for (i, chapter) in chapters().into_iter().enumerate() {
        let mut c = [0usize; 6]; // source, included, commands, output, checked, illustrative
        for b in blocks(&chapter) {
            if b.is_output() {
                c[3] += 1;
                match b.mark {
                    Mark::Checked(_) => c[4] += 1,
                    Mark::Illustrative => c[5] += 1,
                    Mark::None => unchecked.push(format!("{}:{} (output)", b.chapter, b.line)),
                }
            } else if b.is_source() {
                c[0] += 1;
                if b.is_included() {
                    c[1] += 1;
                } else {
                    unchecked.push(format!("{}:{} ({} copied)", b.chapter, b.line, b.lang));
                }
            } else {
                c[2] += 1;
            }
        }
        for k in 0..6 {
            total[k] += c[k];
        }
        rows.insert(i, (chapter, c));
    }
    println!("chapter: source blocks (included) / command blocks / output blocks (checked, illustrative)");
    for (chapter, c) in rows.values().chain([&("total".to_string(), total)]) {
        println!(
            "{chapter}: {} ({}) / {} / {} ({}, {})",
            c[0], c[1], c[2], c[3], c[4], c[5]
        );
    }
    for u in &unchecked {
        println!("not checked: {u}");
    }
}

#[test]
fn normalization() {
    let (rest, ranks) = normalize(
        "a\nRank 1 using device: cpu:1\nRank 0 using device: cpu:0\ntook 52.35 ms, 1.9 GB/s\n\n",
    );
    assert_eq!(rest, ["a", "took #.# ms, #.# GB/s"]);
    assert_eq!(
        ranks,
        ["Rank 0 using device: cpu:0", "Rank 1 using device: cpu:1"]
    );
    assert!(!per_rank("Rank 0 (cpu): all-reduce 100 MB took"));
    assert_eq!(
        normalize("α = 16.1 us a step, unbounded in cache").0,
        normalize("α = 10.7 us a step, 1.42 GB/s in cache").0
    );
}
