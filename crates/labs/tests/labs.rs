//! Every lab's checker, run three ways as the student runs it (`lab N` is what `cargo lab N`
//! runs): on the reference solution, which must pass every case; on the pristine skeleton, which
//! must say "not written yet" (lab 7's skeleton is the program that hangs: the checker must end
//! it at `--timeout` with the library's message naming the rank waited for); and on the bug
//! planted in each lab, which must fail naming the first wrong rank and element. None runs the
//! student's own files (`crates/labs/src/labN_*.rs`): a lab written, or half written, changes no
//! test's outcome.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use test_support::build::binary;
use test_support::process::{self, scratch, Finished, Plainly, Tag};

/// Runs `lab ARGS` to its end (within 3 minutes), checking that no rank is left behind.
fn lab(args: &[&str]) -> Finished {
    let tag = Tag::new("labs");
    let mut command = Command::new(binary("labs", "lab"));
    command.args(args).plainly();
    tag.mark(&mut command);
    let done = process::start(&mut command).finish(Duration::from_secs(180));
    tag.assert_all_gone(&format!("lab {args:?}"));
    done
}

fn says(done: &Finished, what: &str) {
    let all = format!("{}{}", done.stdout, done.stderr);
    assert!(all.contains(what), "expected {what:?} in:\n{all}");
}

/// Each lab: its number, title, and how many cases the solution passes.
const LABS: [(&str, &str, usize); 8] = [
    ("1", "ping-pong and the α–β model", 22),
    ("2", "binomial-tree broadcast", 264),
    ("3", "ring all-reduce", 80),
    ("4", "all-gather and reduce-scatter rings", 240),
    ("5", "DDP by hand", 9),
    ("6", "ZeRO-1: the optimizer's state sharded", 3),
    ("7", "a deadlock to find", 3),
    ("8", "data-parallel and tensor-parallel groups", 13),
];

#[test]
fn every_solution_passes_every_case_and_is_timed() {
    for (n, title, cases) in LABS {
        let done = lab(&[n, "--solution"]);
        done.assert_success(&format!("lab {n} --solution"));
        says(
            &done,
            &format!("lab {n}: {title} — {cases} of {cases} cases right"),
        );
        // Then the timing beside the library's (lab 7 has none): its table, not its numbers.
        // Lab 8 shows the groups of the workshop's layout instead.
        let timed = match n {
            "1" => "your fit (least squares on the times):",
            "5" | "6" => "the library's DDP (bucketed, overlapped)",
            "7" => "",
            "8" => "   5  4 5 6 7   rank 1 of 4  1 5       rank 1 of 2",
            _ => "α–β model of the",
        };
        says(&done, timed);
    }
}

#[test]
fn every_pristine_skeleton_is_not_written_yet() {
    // Lab 7's skeleton is written: it hangs (the next test).
    let files = [
        (1, "lab1_ping_pong.rs"),
        (2, "lab2_tree_broadcast.rs"),
        (3, "lab3_ring_all_reduce.rs"),
        (4, "lab4_rings.rs"),
        (5, "lab5_ddp.rs"),
        (6, "lab6_zero.rs"),
        (8, "lab8_groups.rs"),
    ];
    for (n, file) in files {
        let done = lab(&[&n.to_string(), "--code", "skeleton"]);
        assert_eq!(done.code_or_signal(), 1, "lab {n}: {done:?}");
        says(
            &done,
            &format!("lab {n} is not written yet: open crates/labs/src/{file}"),
        );
        says(&done, "hint 1 (more on the lab's page");
    }
}

#[test]
fn lab_7s_program_hangs_and_the_timeout_names_who_waited_for_whom() {
    let dir = scratch("labs-hang");
    let trace = dir.join("lab7.json");
    let done = lab(&[
        "7",
        "--code",
        "skeleton",
        "--timeout",
        "2",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(done.code_or_signal(), 1, "{done:?}");
    says(&done, "timed out after 2s waiting for rank");
    says(&done, "lab 7: the program did not finish on 2 ranks");
    says(
        &done,
        "hint 1 (more on the lab's page, docs/src/lab7-deadlock.md)",
    );
    // The ranks' trace up to the failure: rank 0 last in a broadcast, rank 1 in a reduce.
    let json = std::fs::read_to_string(&trace).unwrap_or_else(|e| panic!("{e}: {done:?}"));
    assert!(
        json.contains("\"broadcast\"") && json.contains("\"reduce\""),
        "{json}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// Each planted bug, and where it must be caught: the case, and the first wrong rank and
/// element (the inputs are fixed, so the place is too; each follows from the bug, see the
/// planted file's comment).
const PLANTED: [(&str, &str, &str); 8] = [
    (
        "1",
        "case 1 of 22 is wrong: 2 ranks, 2 floats, 1 round trip",
        "rank 0, element 0: expected -13, got 0",
    ),
    (
        "2",
        "case 5 of 264 is wrong: 2 ranks, 1 float element, in place, root 1",
        "rank 0, element 0: expected -3, got 6",
    ),
    (
        "3",
        "case 1 of 80 is wrong: 2 ranks, 1 float element, in place",
        "rank 0, element 0: expected -21, got 0",
    ),
    (
        "4",
        "case 49 of 240 is wrong: all_gather, 3 ranks, 1 float element a block, in place",
        "rank 0, element 0: expected -13, got 0",
    ),
    (
        "5",
        "case 1 of 9 is wrong: naive (an all-reduce per tensor) on 2 ranks, step 0",
        "rank 0, gradient 160: expected",
    ),
    (
        "6",
        "case 1 of 3 is wrong: ZeRO-1 on 2 ranks, step 0",
        "rank 0, parameter 0: expected",
    ),
    (
        "7",
        "case 1 of 3 is wrong: 2 ranks: the stats",
        "rank 1, element 0: expected 46, got 24",
    ),
    (
        "8",
        "case 2 of 13 is wrong: 4 ranks as dp 2 × tp 2: the tensor-parallel groups",
        "rank 0, its tp group: expected ranks 0 1 (where it is rank 0 of 2), got ranks 0 2",
    ),
];

#[test]
fn every_planted_bug_is_caught_at_its_first_wrong_rank_and_element() {
    for (n, case, place) in PLANTED {
        let done = lab(&[n, "--code", "planted"]);
        assert_eq!(done.code_or_signal(), 1, "lab {n}: {done:?}");
        says(&done, case);
        says(&done, place);
        // Both grids, in the course's format.
        says(&done, "Gpu 0  |");
        says(&done, &format!("run `cargo lab {n}` again"));
    }
}

#[test]
fn steps_show_the_students_own_steps_and_trace_records_them() {
    let done = lab(&["3", "--solution", "-n", "3", "--steps"]);
    done.assert_success("lab 3 --steps");
    for title in [
        "Before:",
        "reduce-scatter, step 1 of 2",
        "all-gather, step 2 of 2",
        "Yours, right on every rank:",
    ] {
        says(&done, title);
    }
    // No step of the checker's own calls shows.
    assert!(!done.stdout.contains("each rank sent"), "{}", done.stdout);
    let dir = scratch("labs-trace");
    let trace: PathBuf = dir.join("lab2.json");
    let done = lab(&["2", "--solution", "--trace", trace.to_str().unwrap()]);
    done.assert_success("lab 2 --trace");
    says(&done, &format!("trace: {}", trace.display()));
    let json = std::fs::read_to_string(&trace).unwrap();
    assert!(json.contains("\"send\""), "no send in the trace: {json}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_labs_are_listed_and_bad_flags_refused() {
    let done = lab(&[]);
    done.assert_success("lab");
    for (n, title, _) in LABS {
        says(&done, &format!("  {n}  {title}"));
    }
    let done = lab(&["9"]);
    assert_eq!(done.code_or_signal(), 2, "{done:?}");
    says(&done, "there is no lab 9");
    let done = lab(&["3", "-n", "0"]);
    assert_eq!(done.code_or_signal(), 2, "{done:?}");
    says(&done, "give a number of ranks from 1 to 64");
}
