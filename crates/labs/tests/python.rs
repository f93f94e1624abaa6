//! The PyTorch twins of labs 2, 3 and 5 (`python/labs/`), checked by the rules of the Rust labs,
//! under the real torchrun on Gloo: `python/labs/check.py` on the reference solutions passes
//! every case, on the pristine skeletons says "not written yet", and on the planted bugs fails
//! naming the first wrong rank and element. Three ranks: a rank count that is no power of two,
//! and that the lengths 1 and 10 do not divide. The student's own files are never run.
//!
//! The lab pages show these commands as written ([`the_lab_pages_show_the_twins_run_here`]);
//! tests/torchrun.rs leaves `python/labs/` lines to this file. Without torch the tests say they
//! skipped, unless NCCL_WORKSHOP_REQUIRE_TORCH=1 (as `.ci/run` sets).

use std::path::Path;
use std::time::Duration;

use test_support::book::src;
use test_support::process::{self, Finished, Plainly, Tag};
use test_support::torch;

/// The check of all three twins, as the lab pages show it (the student's files), and with the
/// switch each run adds.
const CHECK: &str = "torchrun --standalone --nproc_per_node=3 python/labs/check.py 2 3 5";
const SOLUTION: &str =
    "torchrun --standalone --nproc_per_node=3 python/labs/check.py 2 3 5 --solution";

/// Runs `line` as written (GPUs hidden: Gloo on CPU tensors, as the Rust labs' CPU backend);
/// `None` where there is no torch.
fn run(line: &str) -> Option<Finished> {
    let torch = torch::or_skip(&format!("the labs' python twins: {line}"))?;
    let tag = Tag::new("python-labs");
    // No `target/release/` program in these lines: nothing to build.
    let mut command = torch.as_written(line, Path::new("target/release"));
    command.plainly().env("CUDA_VISIBLE_DEVICES", "");
    tag.mark(&mut command);
    let done = process::start(&mut command).finish(Duration::from_secs(300));
    tag.assert_all_gone(line);
    Some(done)
}

fn says(done: &Finished, what: &str) {
    assert!(
        done.stdout.contains(what),
        "expected {what:?} in:\n{}\n{}",
        done.stdout,
        done.stderr
    );
}

#[test]
fn the_solutions_pass_every_case() {
    let Some(done) = run(SOLUTION) else { return };
    done.assert_success(SOLUTION);
    says(
        &done,
        "lab 2: binomial-tree broadcast — 36 of 36 cases right (3 ranks)",
    );
    says(
        &done,
        "lab 3: ring all-reduce — 16 of 16 cases right (3 ranks)",
    );
    says(&done, "lab 5: DDP by hand — 3 of 3 cases right (3 ranks)");
}

#[test]
fn the_skeletons_are_not_written_yet() {
    let line = format!("{CHECK} --code skeleton");
    let Some(done) = run(&line) else { return };
    assert!(!done.status.success(), "{line}: {done:?}");
    for (n, file) in [
        (2, "lab2_tree_broadcast"),
        (3, "lab3_ring_all_reduce"),
        (5, "lab5_ddp"),
    ] {
        says(
            &done,
            &format!("lab {n} is not written yet: open python/labs/{file}.py"),
        );
    }
    says(
        &done,
        "hint 1 (more on the lab's page, docs/src/lab3-ring-all-reduce.md)",
    );
}

#[test]
fn the_planted_bugs_are_caught_at_their_first_wrong_rank_and_element() {
    let line = format!("{CHECK} --code planted");
    let Some(done) = run(&line) else { return };
    assert!(!done.status.success(), "{line}: {done:?}");
    // Lab 2: rooted at 0 whatever the root, so the first case with root 1 is wrong, first on
    // rank 0 (it keeps its own values). Lab 3: one reduce-scatter step short, wrong from the
    // first case. Lab 5: the naive sums never divided.
    says(
        &done,
        "case 5 of 36 is wrong: 3 ranks, 1 float element, in place, root 1",
    );
    says(
        &done,
        "case 1 of 16 is wrong: 3 ranks, 1 float element, in place",
    );
    says(
        &done,
        "case 1 of 3 is wrong: naive on 3 ranks, step 0: the gradients after your code",
    );
    says(&done, "rank 0, element 0: expected");
    says(&done, "rank 0, gradient 0: expected");
    says(&done, "Gpu 2  |");
}

/// The torchrun lines of the lab pages' `bash` blocks are the check this file runs, as written.
#[test]
fn the_lab_pages_show_the_twins_run_here() {
    let mut shown = Vec::new();
    for entry in std::fs::read_dir(src()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("lab") || !name.ends_with(".md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        shown.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| l.starts_with("torchrun ") && l.contains("python/labs/"))
                .map(|l| (name.clone(), l.to_string())),
        );
    }
    assert!(
        !shown.is_empty(),
        "no lab page shows the python twins' check"
    );
    for (page, line) in shown {
        assert!(
            line == CHECK || line == SOLUTION,
            "{page}: `{line}` is not the check this test runs ({CHECK}, or with --solution)"
        );
    }
}
