//! `comm-bench --group-size`: collectives measured on sub-communicators, every group at once,
//! run as a user runs it. The table is group 0's (on the group's ranks); #wrong counts every
//! group's wrong elements; a size that does not divide the job is refused on every rank.

mod common;

use common::run;

/// Table lines (not comments) of stdout.
fn lines(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| {
            l.starts_with(' ') && l.trim().chars().next().is_some_and(|c| c.is_ascii_digit())
        })
        .collect()
}

const SMALL: [&str; 10] = [
    "--backend",
    "cpu",
    "-b",
    "64K",
    "-e",
    "256K",
    "-n",
    "2",
    "-w",
    "1",
];

#[test]
fn groups_of_two_on_four_ranks_measure_at_once() {
    let (out, stdout, stderr) =
        run(&[&SMALL[..], &["--world-sizes", "4", "--group-size", "2"]].concat());
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(
            "groups: 2 groups of 2 consecutive ranks, each case measured in all of them at once"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("transport (group 0): "), "{stdout}");
    assert!(stdout.contains("all_reduce on 2 ranks"), "{stdout}");
    assert_eq!(lines(&stdout).len(), 2, "{stdout}");
}

/// Each group's check catches its own corrupted element; the table sums both groups'.
#[test]
fn wrong_elements_of_every_group_are_counted() {
    let flags = [
        &SMALL[..],
        &["--world-sizes", "4", "--group-size", "2", "--inject-error"],
    ];
    let (out, stdout, stderr) = run(&flags.concat());
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    for l in lines(&stdout) {
        let cols: Vec<&str> = l.split_whitespace().collect();
        assert_eq!((cols[8], cols[12]), ("2", "2"), "{l}\n{stdout}");
    }
}

#[test]
fn a_group_size_that_does_not_divide_the_job_is_refused() {
    let (out, stdout, stderr) =
        run(&[&SMALL[..], &["--world-sizes", "3", "--group-size", "2"]].concat());
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("--group-size 2 on 3 ranks: give a size that divides 3"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
