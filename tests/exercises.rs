//! The exercises at the end of the lesson chapters (`## Exercise`, a ```bash block of commands,
//! the answer folded in `<details>`) stay true: every lesson has one, and each exercise's
//! commands run here exactly as written (after the one build command: `target/release/NAME` and
//! `cargo run --release --example NAME -- ARGS` are the built program), and a check written for
//! that exercise reads their output and asserts what the answer claims. An answer's claim about
//! speed (which is faster) is never asserted: a slow or busy machine must pass. There the test
//! checks that both runs measured every size, and prints the times for whoever reads the log.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use test_support::book::{chapters, src};
use test_support::build::the_one_build;
use test_support::grid::{expect_cells, grid};
use test_support::process::{self, Plainly};
use test_support::torch;

/// Every lesson chapter: each must end with an exercise and its answer.
const LESSONS: &[&str] = &[
    "00-hello-world.md",
    "nccl.md",
    "01-broadcast.md",
    "02-allreduce.md",
    "watching.md",
    "04-allgather.md",
    "05-reduce-scatter.md",
    "running-on-leonardo.md",
    "03-gloo-vs-nccl.md",
    "benchmarking.md",
    "curve.md",
    "profiling.md",
    "transports.md",
    "training.md",
    "tensor-parallel.md",
    "cluster-in-a-box.md",
];

/// Exercises this test does not run, and why.
const SKIPPED: &[(&str, &str)] = &[(
    "cluster-in-a-box.md",
    "it needs root and the box itself (network namespaces, a shaped link): tests/cluster.rs runs the box where it can",
)];

/// A chapter's exercise: the commands of its ```bash block and the answer's text.
struct Exercise {
    commands: Vec<String>,
    answer: String,
}

fn exercise(chapter: &str) -> Result<Exercise, String> {
    let text = std::fs::read_to_string(src().join(chapter)).map_err(|e| format!("{e}"))?;
    let (_, rest) = text
        .split_once("\n## Exercise\n")
        .ok_or("no `## Exercise` section")?;
    let rest = rest.split("\n## ").next().unwrap();
    let (task, answer) = rest
        .split_once("<details>")
        .ok_or("no answer folded in <details>")?;
    let answer = answer
        .split_once("</details>")
        .ok_or("<details> is not closed")?
        .0;
    if !answer.trim_start().starts_with("<summary>Answer</summary>") {
        return Err("the <details> does not start with <summary>Answer</summary>".into());
    }
    let commands = match task.split_once("```bash\n") {
        Some((_, block)) => block
            .split_once("```")
            .ok_or("the ```bash block is not closed")?
            .0
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(String::from)
            .collect(),
        None => vec![],
    };
    Ok(Exercise {
        commands,
        answer: answer.to_string(),
    })
}

#[test]
fn every_lesson_ends_with_an_exercise_and_its_answer() {
    let mut missing = Vec::new();
    for chapter in LESSONS {
        match exercise(chapter) {
            Err(why) => missing.push(format!("{chapter}: {why}")),
            Ok(ex) => {
                if ex
                    .answer
                    .split("</summary>")
                    .nth(1)
                    .unwrap()
                    .trim()
                    .is_empty()
                {
                    missing.push(format!("{chapter}: the answer is empty"));
                }
                let skipped = SKIPPED.iter().any(|(c, _)| c == chapter);
                if ex.commands.is_empty() && !skipped {
                    missing.push(format!(
                        "{chapter}: no ```bash block with the commands to run"
                    ));
                }
            }
        }
    }
    // A chapter that has an exercise but is not a lesson here would go unchecked.
    for chapter in chapters() {
        let text = std::fs::read_to_string(src().join(&chapter)).unwrap();
        if text.contains("\n## Exercise\n") && !LESSONS.contains(&chapter.as_str()) {
            missing.push(format!("{chapter}: has an exercise; add it to LESSONS"));
        }
    }
    for chapter in LESSONS {
        assert!(
            chapters().iter().any(|c| c == chapter),
            "{chapter} is not in SUMMARY.md"
        );
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// Where an exercise's commands run, as from the clone's root: a folder of this test's own,
/// with the clone's `out/` (the book's commands write their files there), so that nothing the
/// exercises write lands in the clone.
fn workdir() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = process::scratch(&format!(
        "exercise-{}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(dir.join("out")).unwrap();
    dir
}

/// The bullets (`- …`, continuation lines joined) of `text` up to its first heading.
fn bullets(text: &str) -> usize {
    text.split("\n#")
        .next()
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("- "))
        .count()
}

/// A lesson's words, outputs included: what has a letter or a digit, HTML comments left out.
fn words(text: &str) -> usize {
    let mut plain = String::new();
    let mut rest = text;
    while let Some((before, after)) = rest.split_once("<!--") {
        plain.push_str(before);
        rest = after.split_once("-->").map_or("", |(_, a)| a);
    }
    plain.push_str(rest);
    plain
        .split_whitespace()
        .filter(|w| w.chars().any(|c| c.is_alphanumeric()))
        .count()
}

/// The most words a lesson may have, outputs included (the book's promise is about 1,500).
const MOST_WORDS: usize = 1_800;

/// Every lesson opens with three objectives, and closes with three key points just before its
/// exercise; it fits in about 1,500 words, outputs included.
#[test]
fn every_lesson_opens_with_objectives_and_closes_with_key_points() {
    let mut wrong = Vec::new();
    for chapter in LESSONS {
        let text = std::fs::read_to_string(src().join(chapter)).unwrap();
        let after_title = text.split_once('\n').map_or("", |(_, r)| r).trim_start();
        // The objectives: the bullets after the mark, up to the first blank line after them.
        let objectives = after_title
            .strip_prefix("**Objectives**\n")
            .map(|o| bullets(o.trim_start().split("\n\n").next().unwrap()));
        if objectives != Some(3) {
            wrong.push(format!(
                "{chapter}: does not open with **Objectives** and three bullets"
            ));
        }
        let key = text
            .split_once("\n## Key points\n")
            .map(|(_, r)| r.split_once("\n## ").map_or(r, |(k, _)| k));
        let next = text
            .split_once("\n## Key points\n")
            .and_then(|(_, r)| r.split_once("\n## "))
            .map(|(_, n)| n.lines().next().unwrap_or(""));
        if key.map(bullets) != Some(3) || next != Some("Exercise") {
            wrong.push(format!(
                "{chapter}: no `## Key points` of three bullets just before `## Exercise`"
            ));
        }
        let n = words(&text);
        if n > MOST_WORDS {
            wrong.push(format!("{chapter}: {n} words, more than {MOST_WORDS}"));
        }
        println!("{chapter}: {n} words");
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A command of an exercise as it will run: in `dir` (see [`workdir`]), on the CPU as the book
/// shows it (GPUs hidden), every `target/release/NAME` (the program's, or an argument naming a
/// program for a launcher to start) being the build's, and a relative path to a file of the
/// clone (`python/…`) that file.
fn command_of(command: &str, dir: &Path) -> Command {
    let build = the_one_build();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let word = |word: &str| match word.strip_prefix("target/release/") {
        Some(name) => build.join(name).into_os_string(),
        None if !word.starts_with(['-', '/'])
            && !word.starts_with("out/")
            && repo.join(word).exists() =>
        {
            repo.join(word).into_os_string()
        }
        None => word.into(),
    };
    let words: Vec<&str> = command.split_whitespace().collect();
    let (program, args): (PathBuf, &[&str]) = match words.as_slice() {
        ["cargo", "run", "--release", "--example", name, "--", args @ ..]
        | ["cargo", "run", "--example", name, "--", args @ ..] => (build.join(name), args),
        [program, args @ ..] if program.starts_with("target/release/") => (word(program).into(), args),
        _ => panic!(
            "cannot run `{command}`: only `target/release/NAME ARGS` or `cargo run [--release] --example NAME -- ARGS`"
        ),
    };
    let mut cmd = Command::new(&program);
    cmd.args(args.iter().map(|a| word(a)))
        .plainly()
        .env("CUDA_VISIBLE_DEVICES", "")
        .current_dir(dir);
    cmd
}

/// A command of an exercise, run in `dir` as [`command_of`] prepares it. Returns whether it
/// succeeded, and stdout then stderr. `source …/activate` is torch's environment, which a
/// `torchrun …` line gets here (from the repository root, where the course's scripts are);
/// without torch that line is skipped, saying so, and its output is empty.
fn run(command: &str, dir: &Path) -> (bool, String) {
    if command.starts_with("source ") && command.ends_with("/bin/activate\"") {
        return (true, String::new());
    }
    let mut prepared = if command.starts_with("torchrun ") {
        let Some(torch) = torch::or_skip(&format!("the exercise's `{command}`")) else {
            return (true, String::new());
        };
        let mut c = torch.as_written(command, &the_one_build());
        c.plainly().env("CUDA_VISIBLE_DEVICES", "");
        c
    } else {
        command_of(command, dir)
    };
    let done = process::start(&mut prepared).finish(Duration::from_secs(60));
    (
        done.status.success(),
        format!("{}{}", done.stdout, done.stderr),
    )
}

/// Runs every command in `dir`, each required to succeed; their outputs in order.
fn run_all_in(dir: &Path, commands: &[String]) -> Result<Vec<String>, String> {
    commands
        .iter()
        .map(|c| match run(c, dir) {
            (true, out) => Ok(out),
            (false, out) => Err(format!("`{c}` failed:\n{out}")),
        })
        .collect()
}

/// Runs every command in a [`workdir`] of its own, as [`run_all_in`] does.
fn run_all(commands: &[String]) -> Result<Vec<String>, String> {
    run_all_in(&workdir(), commands)
}

/// One row of a comm-bench table: the collective and the ranks (from the header above it),
/// size, and per placement (out-of-place, in-place) time, algbw, busbw and #wrong where measured.
#[derive(Debug)]
struct Row {
    collective: String,
    ranks: usize,
    size: u64,
    placements: Vec<[f64; 4]>,
}

fn bench_rows(output: &str) -> Vec<Row> {
    let (mut collective, mut ranks) = (String::new(), 0);
    let mut rows = Vec::new();
    for line in output.lines() {
        if let Some(rest) = line.strip_prefix("# comm-bench ") {
            // # comm-bench 0.1.0: all_reduce on 4 ranks (1 node), backend …
            let after: Vec<&str> = rest
                .split_once(": ")
                .map(|(_, a)| a)
                .unwrap_or("")
                .split_whitespace()
                .collect();
            collective = after.first().unwrap_or(&"").to_string();
            ranks = after.get(2).and_then(|n| n.parse().ok()).unwrap_or(0);
            continue;
        }
        let cols: Vec<&str> = line.split_whitespace().collect();
        if line.starts_with('#') || cols.len() != 13 || cols[0].parse::<u64>().is_err() {
            continue;
        }
        let placements = [&cols[5..9], &cols[9..13]]
            .iter()
            .filter(|p| p[0] != "n/a")
            .map(|p| {
                let v: Vec<f64> = p.iter().map(|c| c.parse().unwrap()).collect();
                [v[0], v[1], v[2], v[3]]
            })
            .collect();
        rows.push(Row {
            collective: collective.clone(),
            ranks,
            size: cols[0].parse().unwrap(),
            placements,
        });
    }
    assert!(!rows.is_empty(), "no comm-bench rows in:\n{output}");
    rows
}

/// The time of the first placement measured at `size`.
fn time_at(rows: &[Row], size: u64) -> f64 {
    rows.iter()
        .find(|r| r.size == size)
        .unwrap_or_else(|| panic!("no row of {size} B in {rows:?}"))
        .placements[0][0]
}

fn no_wrong(rows: &[Row]) -> Result<(), String> {
    match rows
        .iter()
        .find(|r| r.placements.iter().any(|p| p[3] != 0.0))
    {
        Some(r) => Err(format!("wrong elements: {r:?}")),
        None => Ok(()),
    }
}

/// The title line that starts with `start` (the steps' titles go on to say what moved).
fn title<'a>(output: &'a str, start: &str) -> &'a str {
    output
        .lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starting {start:?} in:\n{output}"))
}

fn titles(output: &str, start: &str) -> usize {
    output.lines().filter(|l| l.starts_with(start)).count()
}

/// The ranks whose every cell in the grid under `title` is `value`.
fn holding(output: &str, title: &str, value: &str) -> BTreeSet<usize> {
    grid(output, title)
        .iter()
        .enumerate()
        .filter(|(_, row)| row.iter().all(|c| c == value))
        .map(|(rank, _)| rank)
        .collect()
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

/// Each exercise's claim, checked on its commands' outputs. Deterministic claims panic;
/// claims about speed return Err (and are tried again).
fn check(chapter: &str, commands: &[String]) -> Result<(), String> {
    match chapter {
        "00-hello-world.md" => hello_world_exercise(commands)?,
        "01-broadcast.md" => broadcast_exercise(commands)?,
        "02-allreduce.md" => allreduce_exercise(commands)?,
        "watching.md" => watching_exercise(commands)?,
        "04-allgather.md" => allgather_exercise(commands)?,
        "05-reduce-scatter.md" => reduce_scatter_exercise(commands)?,
        "03-gloo-vs-nccl.md" => gloo_vs_nccl_exercise(commands)?,
        "benchmarking.md" => benchmarking_exercise(commands)?,
        "curve.md" => curve_exercise(commands)?,
        "profiling.md" => profiling_exercise(commands)?,
        "transports.md" => transports_exercise(commands)?,
        "training.md" => training_exercise(commands)?,
        "tensor-parallel.md" => tensor_parallel_exercise(commands),
        "nccl.md" => nccl_probe_and_backend_nccl(commands),
        "running-on-leonardo.md" => two_nodes_then_node_0_alone(commands),
        other => panic!("{other}: write the check of its exercise here"),
    }
    Ok(())
}

/// The check of 00-hello-world.md's exercise.
fn hello_world_exercise(commands: &[String]) -> Result<(), String> {
    let out = &run_all(commands)?[0];
    let ranks: BTreeSet<usize> = out
        .lines()
        .filter_map(|l| l.strip_prefix("Hello from rank "))
        .map(|rest| {
            let rank: usize = rest.split_whitespace().next().unwrap().parse().unwrap();
            assert!(
                rest.starts_with(&format!("{rank} of 5 (local rank {rank}) on cpu:{rank} ")),
                "{rest}"
            );
            rank
        })
        .collect();
    assert_eq!(titles(out, "Hello from rank "), 5, "{out}");
    assert_eq!(ranks, (0..5).collect(), "{out}");
    assert!(
        out.lines().any(|l| l == "transport: tcp (requested)"),
        "{out}"
    );
    Ok(())
}

/// The check of 01-broadcast.md's exercise.
fn broadcast_exercise(commands: &[String]) -> Result<(), String> {
    let out = &run_all(commands)?[0];
    assert_eq!(titles(out, "tree broadcast, round "), 3, "{out}");
    let round = |k| title(out, &format!("tree broadcast, round {k} of 3:"));
    assert_eq!(holding(out, round(1), "42"), BTreeSet::from([0, 4]));
    assert_eq!(holding(out, round(2), "42"), BTreeSet::from([0, 2, 4]));
    expect_cells(&grid(out, "After broadcast:"), 5, 2, |_| "42");
    Ok(())
}

/// The check of 02-allreduce.md's exercise.
fn allreduce_exercise(commands: &[String]) -> Result<(), String> {
    let out = &run_all(commands)?[0];
    assert_eq!(titles(out, "reduce-scatter, step "), 3, "{out}");
    assert_eq!(titles(out, "all-gather, step "), 3, "{out}");
    let rows = grid(out, title(out, "reduce-scatter, step 3 of 3"));
    assert_eq!(rows.len(), 4);
    for (r, row) in rows.iter().enumerate() {
        for (i, cell) in row.iter().enumerate() {
            assert_eq!(cell == "4", i / 2 == r, "rank {r}: {row:?}");
        }
    }
    expect_cells(&grid(out, "After reduce:"), 4, 8, |_| "4");
    Ok(())
}

/// The check of watching.md's exercise.
fn watching_exercise(commands: &[String]) -> Result<(), String> {
    let outs = run_all(commands)?;
    let (direct, ring) = (bench_rows(&outs[0]), bench_rows(&outs[1]));
    no_wrong(&direct)?;
    no_wrong(&ring)?;
    for size in [1024, 4 << 20] {
        let (d, r) = (time_at(&direct, size), time_at(&ring, size));
        ensure(d > 0.0 && r > 0.0, || format!("no time at {size} B"))?;
        println!("watching.md: at {size} B direct {d} us, ring {r} us (not asserted)");
    }
    Ok(())
}

/// The check of 04-allgather.md's exercise.
fn allgather_exercise(commands: &[String]) -> Result<(), String> {
    let out = &run_all(commands)?[0];
    assert_eq!(titles(out, "all-gather, step "), 3, "{out}");
    let rows = grid(out, title(out, "all-gather, step 1 of 3"));
    assert_eq!(rows[0], ["1", "1", "0", "0", "0", "0", "4", "4"], "{out}");
    let all = grid(out, "After all-gather:");
    assert_eq!(all.len(), 4);
    for row in all {
        assert_eq!(row, ["1", "1", "2", "2", "3", "3", "4", "4"], "{out}");
    }
    Ok(())
}

/// The check of 05-reduce-scatter.md's exercise.
fn reduce_scatter_exercise(commands: &[String]) -> Result<(), String> {
    let out = &run_all(commands)?[0];
    let before = grid(out, "Before reduce-scatter:");
    assert_eq!(before.len(), 4);
    for row in before {
        assert_eq!(row, ["1", "2", "3", "4"], "{out}");
    }
    let after = grid(out, "After reduce-scatter (block r on rank r):");
    expect_cells(&after, 4, 1, |r| (4 * (r + 1)).to_string());
    Ok(())
}

/// The check of 03-gloo-vs-nccl.md's exercise: our CPU path over TCP and over shared memory,
/// PyTorch's Gloo (where torch is), each with a time, side by side (which is faster is not
/// asserted); and NCCL's model for 8 MB on two Leonardo nodes of one A100: the ring with Simple,
/// under a millisecond, as the answer says.
fn gloo_vs_nccl_exercise(commands: &[String]) -> Result<(), String> {
    let outs = run_all(commands)?;
    let took = |out: &str, start: &str| -> f64 {
        let line = title(out, start);
        let ms = line.split(" took ").nth(1).unwrap();
        ms.split_whitespace().next().unwrap().parse().unwrap()
    };
    let tcp = took(
        &outs[0],
        "Rank 0 (CPU, Gloo-style over tcp): all-reduce 8 MB took ",
    );
    let shm = took(
        &outs[1],
        "Rank 0 (CPU, Gloo-style over shm): all-reduce 8 MB took ",
    );
    let gloo = match outs[3].is_empty() {
        true => None,
        false => Some(took(&outs[3], "Rank 0 (Gloo): all-reduce 8 MB took ")),
    };
    ensure(
        tcp > 0.0 && shm > 0.0 && gloo.is_none_or(|g| g > 0.0),
        || "no time measured".into(),
    )?;
    let row: Vec<&str> = outs[4]
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|c| c.len() == 10 && c[0] == "8000000")
        .unwrap_or_else(|| panic!("no 8000000 row in:\n{}", outs[4]));
    let predicted: f64 = row[5].parse().unwrap();
    assert_eq!((row[8], row[9]), ("ring", "Simple"), "{row:?}");
    assert!((500.0..1000.0).contains(&predicted), "{row:?}");
    println!("03: tcp {tcp} ms, shm {shm} ms, Gloo {gloo:?} ms; NCCL predicted {predicted} us (not asserted)");
    Ok(())
}

/// The check of benchmarking.md's exercise: seed 004's sweep on 2 and 4 ranks, busbw = algbw ×
/// 2(n−1)/n on every line, and the course's files (the commentary's material) in `out/sweep/`.
fn benchmarking_exercise(commands: &[String]) -> Result<(), String> {
    let dir = workdir();
    let rows = bench_rows(&run_all_in(&dir, commands)?[0]);
    no_wrong(&rows)?;
    let ranks: BTreeSet<usize> = rows.iter().map(|r| r.ranks).collect();
    assert_eq!(ranks, BTreeSet::from([2, 4]), "{rows:?}");
    for row in &rows {
        assert_eq!(row.collective, "all_reduce", "{row:?}");
        let factor = 2.0 * (row.ranks as f64 - 1.0) / row.ranks as f64;
        for p in &row.placements {
            // Both printed to 2 decimals.
            assert!(
                (p[2] - factor * p[1]).abs() <= 0.02,
                "{row:?}: busbw {} is not {factor} × algbw {}",
                p[2],
                p[1]
            );
        }
    }
    for file in ["analysis.txt", "allreduce_bandwidth_vs_datasize.png"] {
        assert!(
            dir.join("out/sweep").join(file).is_file(),
            "no out/sweep/{file}"
        );
    }
    Ok(())
}

/// The check of curve.md's exercise.
fn curve_exercise(commands: &[String]) -> Result<(), String> {
    let out = &run_all(commands)?[0];
    let rows: Vec<(u64, String, String)> = out
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|c| c.len() == 10 && c[0].parse::<u64>().is_ok())
        .map(|c| (c[0].parse().unwrap(), c[8].to_string(), c[9].to_string()))
        .collect();
    assert_eq!(rows.len(), 11, "8 B to 8 GiB by 8:\n{out}");
    let last_tree = rows.iter().rposition(|r| r.1 == "tree").unwrap();
    let first_ring = rows.iter().position(|r| r.1 == "ring").unwrap();
    assert_eq!(last_tree + 1, first_ring, "one switch:\n{out}");
    assert_eq!(
        (rows[last_tree].0, rows[first_ring].0),
        (128 << 20, 1 << 30),
        "{out}"
    );
    let order = ["LL", "LL128", "Simple"];
    let protos: Vec<usize> = rows
        .iter()
        .map(|r| order.iter().position(|p| *p == r.2).unwrap())
        .collect();
    assert!(protos.windows(2).all(|w| w[0] <= w[1]), "{out}");
    assert_eq!((protos[0], protos[protos.len() - 1]), (0, 2), "{out}");
    Ok(())
}

/// The check of profiling.md's exercise.
fn profiling_exercise(commands: &[String]) -> Result<(), String> {
    let dir = workdir();
    let outs = run_all_in(&dir, commands)?;
    assert!(outs[1].contains("wrote out/profile.svg ("), "{}", outs[1]);
    let text = std::fs::read_to_string(dir.join("out/profile.json")).unwrap();
    let trace: serde_json::Value = serde_json::from_str(&text).unwrap();
    let slices: Vec<&serde_json::Value> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect();
    for rank in 0..2 {
        let mine = |cat: &'static str| {
            slices
                .iter()
                .filter(move |e| e["pid"] == rank && e["cat"] == cat)
        };
        let calls: Vec<(u64, f64)> = mine("call")
            .map(|e| {
                (
                    e["args"]["bytes"].as_u64().unwrap(),
                    e["dur"].as_f64().unwrap(),
                )
            })
            .collect();
        let sizes: Vec<u64> = calls.iter().map(|c| c.0).collect();
        assert_eq!(
            sizes,
            [vec![1_000_000; 7], vec![48]].concat(),
            "rank {rank}"
        );
        // The barriers: exchanges outside every call (on 2 ranks, one each).
        // Its middle inside a call's span (a barrier may start the instant a call ends).
        let inside = |e: &&&serde_json::Value| {
            let t = e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap() / 2.0;
            mine("call").any(|c| {
                let from = c["ts"].as_f64().unwrap();
                from < t && t < from + c["dur"].as_f64().unwrap()
            })
        };
        let barriers = mine("sendrecv").filter(|e| !inside(e)).count();
        assert_eq!(barriers, 7, "rank {rank}'s barriers");
        let times: Vec<f64> = calls.iter().map(|c| c.1).collect();
        println!("profiling.md: rank {rank}'s calls took {times:?} us (not asserted)");
    }
    Ok(())
}

/// The check of transports.md's exercise: the same all-reduce over TCP and over shared memory,
/// no wrong element either way, each transport named; which is faster is printed, not asserted.
fn transports_exercise(commands: &[String]) -> Result<(), String> {
    let outs = run_all(commands)?;
    assert!(
        outs[0].contains("\ntransport: tcp (requested)\n"),
        "{}",
        outs[0]
    );
    assert!(
        outs[1].contains("\ntransport: shm (shared memory between the 2 ranks of this host)\n"),
        "{}",
        outs[1]
    );
    let (tcp, shm) = (bench_rows(&outs[0]), bench_rows(&outs[1]));
    no_wrong(&tcp)?;
    no_wrong(&shm)?;
    for size in [1 << 20, 16 << 20] {
        let (t, m) = (time_at(&tcp, size), time_at(&shm, size));
        ensure(t > 0.0 && m > 0.0, || format!("no time at {size} B"))?;
        println!("transports.md: at {size} B tcp {t} us, shm {m} us (not asserted)");
    }
    Ok(())
}

/// The check of training.md's exercise.
fn training_exercise(commands: &[String]) -> Result<(), String> {
    let outs = run_all(commands)?;
    let weights = |out: &str| -> String {
        let all: BTreeSet<&str> = out
            .lines()
            .filter_map(|l| l.split_once(": weights "))
            .filter(|(head, _)| head.starts_with("Rank "))
            .map(|(_, rest)| rest.split(',').next().unwrap())
            .collect();
        assert_eq!(all.len(), 1, "every rank's weights the same: {out}");
        all.into_iter().next().unwrap().to_string()
    };
    for (i, buckets) in [(0, "buckets: 4,"), (2, "buckets: 1,")] {
        assert!(outs[i].contains(buckets), "{}", outs[i]);
        assert!(outs[i + 1].contains("overlap off"), "{}", outs[i + 1]);
        assert_eq!(weights(&outs[i]), weights(&outs[i + 1]), "overlap or not");
    }
    Ok(())
}

/// tensor-parallel.md: with --tp 4 the tensor-parallel all-reduces move what they move with
/// --tp 2 (48 KB a step: activations), the shard shrinks to 94784 parameters, and the
/// data-parallel groups of one move nothing.
fn tensor_parallel_exercise(commands: &[String]) {
    let (ok, out) = run(&commands[0], &workdir());
    assert!(ok, "{out}");
    assert!(
        out.contains("64 of the 256 hidden units and 94784 parameters a rank"),
        "{out}"
    );
    assert!(
        out.contains("(tp 0: 2 all-reduces, 48.0 KB, waited "),
        "{out}"
    );
    assert!(
        out.contains("dp 0: 3 all-reduces, 370.3 KB, waited "),
        "{out}"
    );
    assert!(
        out.contains("transport (dp 0): none (one rank: nothing to move)"),
        "{out}"
    );
}

/// nccl.md: the probe's last line is `--backend auto`'s choice, the CPU (the GPUs are hidden),
/// a `unique Id` line comes exactly when libnccl loads, and `--backend nccl` stops with the
/// reason instead of falling back.
fn nccl_probe_and_backend_nccl(commands: &[String]) {
    let dir = workdir();
    let (ok, probe) = run(&commands[0], &dir);
    assert!(ok, "{probe}");
    let row = |step: &str| probe.lines().find(|l| l.starts_with(step));
    for step in ["CUDA driver ", "GPUs ", "libnccl ", "--backend "] {
        assert!(row(step).is_some(), "no {step:?} line:\n{probe}");
    }
    assert!(
        row("--backend ")
            .unwrap()
            .contains("auto gives backend: cpu ("),
        "{probe}"
    );
    let loaded = row("libnccl ").unwrap().contains(" NCCL ");
    let id = row("unique Id ");
    assert_eq!(
        loaded,
        id.is_some(),
        "a unique Id line iff libnccl loads:\n{probe}"
    );
    if let Some(id) = id {
        assert!(
            id.contains("128 bytes; rank 0 would wait for the others at "),
            "{id}"
        );
    } else {
        assert!(row("libnccl ").unwrap().contains("not found"), "{probe}");
    }
    let (ok, nccl) = run(&commands[1], &dir);
    assert!(!ok, "--backend nccl ran without a GPU:\n{nccl}");
    assert!(
        nccl.contains("NCCL cannot run here: ")
            && nccl.contains("(--backend cpu or auto runs on the CPU)"),
        "{nccl}"
    );
}

/// running-on-leonardo.md: node 1 (in the background) and node 0 form one job of 4 ranks,
/// node 1 printing only its own ranks' lines and node 0 the grids of all four over shared
/// memory; node 0 alone times out after 3 s, and commrun blames node 1. The chapter's two-node
/// commands are these.
fn two_nodes_then_node_0_alone(commands: &[String]) {
    let text = std::fs::read_to_string(src().join("running-on-leonardo.md")).unwrap();
    let lesson = text.split("\n## Exercise\n").next().unwrap();
    let node1 = commands[0]
        .strip_suffix(" &")
        .expect("node 1 goes to the background");
    let node0 = &commands[1];
    let dir = workdir();
    for node in [node0.as_str(), node1] {
        assert!(
            lesson.contains(&format!("\n{node}\n")),
            "the chapter's two nodes are not the exercise's: `{node}`"
        );
    }
    let ran = process::run_together(
        vec![command_of(node1, &dir), command_of(node0, &dir)],
        Duration::from_secs(60),
    );
    for node in &ran {
        node.assert_success("a node of the exercise");
    }
    let output = |n: usize| format!("{}{}", ran[n].stdout, ran[n].stderr);
    let (one, zero) = (output(0), output(1));
    let lines: BTreeSet<&str> = one.lines().collect();
    assert_eq!(
        lines,
        BTreeSet::from([
            "[2]: Rank 2 using device: cpu:2",
            "[3]: Rank 3 using device: cpu:3"
        ]),
        "node 1:\n{one}"
    );
    assert!(
        zero.lines()
            .any(|l| l == "[0]: transport: shm (shared memory between the 4 ranks of this host)"),
        "{zero}"
    );
    let rank0: String = zero
        .lines()
        .filter_map(|l| l.strip_prefix("[0]: "))
        .map(|l| format!("{l}\n"))
        .collect();
    expect_cells(&grid(&rank0, "Before reduce:"), 4, 4, |_| "1");
    expect_cells(&grid(&rank0, "After reduce:"), 4, 4, |_| "4");
    let (ok, alone) = run(&commands[2], &dir);
    assert!(!ok, "node 0 alone succeeded:\n{alone}");
    for says in [
        "timed out after 3s waiting for ",
        "never connected: 2, 3)",
        "node 1 was lost or never joined",
    ] {
        assert!(
            alone.contains(says),
            "node 0 alone does not say {says:?}:\n{alone}"
        );
    }
}

#[test]
fn every_exercise_runs_and_its_answer_holds() {
    let mut failures = Vec::new();
    for chapter in LESSONS {
        if let Some((_, why)) = SKIPPED.iter().find(|(c, _)| c == chapter) {
            println!("skipped {chapter}: {why}");
            continue;
        }
        let ex = exercise(chapter).unwrap_or_else(|e| panic!("{chapter}: {e}"));
        if let Err(why) = check(chapter, &ex.commands) {
            failures.push(format!("{chapter}: {why}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
