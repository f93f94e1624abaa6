//! `--steps`, run as a user runs it: every cell of every step's grid checked against the
//! algorithm's schedule, simulated here from its definition (which rank sends which block to
//! whom at each step), at several world sizes and lengths, lengths not divisible by the world
//! size included. The CPU backend is asked for by name: steps are the CPU algorithms'.

use std::process::Command;

use test_support::build::example;
use test_support::grid::{Grid, Rows};
use test_support::process::{scratch, Plainly};

/// Runs example `name` with `args` and `--backend cpu`; its stdout.
fn run(name: &str, args: &[&str]) -> String {
    let output = Command::new(example(name))
        .args(args)
        .args(["--backend", "cpu"])
        .plainly()
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{name} {args:?}: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Every rank's buffer, as the grids print its cells (at most 8 cells: the tests stay short).
type Buffers = Vec<Vec<u64>>;

fn cells(buffers: &Buffers) -> Rows {
    let row = |b: &Vec<u64>| b.iter().map(u64::to_string).collect();
    buffers.iter().map(row).collect()
}

fn expect(stdout: &str, title: &str, want: &Buffers) {
    let got = Grid::titled(title).read(stdout);
    assert_eq!(got, cells(want), "{title}\n{stdout}");
}

/// Block `i` of `n` nearly equal blocks of `len` (the CPU ring's split).
fn block(len: usize, n: usize, i: usize) -> std::ops::Range<usize> {
    i * len / n..(i + 1) * len / n
}

/// The ring's two halves, as `ring_reduce_scatter` and `ring_all_gather` run them.
#[derive(Clone, Copy)]
enum Half {
    ReduceScatter,
    AllGather,
}

/// Step `step` of `half` on every rank at once, over the whole buffer's blocks: rank r takes,
/// from what rank r-1 held before the step, block r-step-2 and adds it in (reduce-scatter), or
/// block r-step-1 and copies it (all-gather). Returns the title the program gives the step.
fn ring_step(state: &mut Buffers, half: Half, step: usize) -> String {
    let (n, len) = (state.len(), state[0].len());
    let before = state.clone();
    for (r, buf) in state.iter_mut().enumerate() {
        let prev = &before[(r + n - 1) % n];
        match half {
            Half::ReduceScatter => {
                block(len, n, (r + 2 * n - step - 2) % n).for_each(|i| buf[i] += prev[i])
            }
            Half::AllGather => {
                block(len, n, (r + 2 * n - step - 1) % n).for_each(|i| buf[i] = prev[i])
            }
        }
    }
    let (step, steps) = (step + 1, n - 1);
    match half {
        Half::ReduceScatter => format!(
            "reduce-scatter, step {step} of {steps}: each rank sent one block to the next and \
             added the block it got"
        ),
        Half::AllGather if step == 1 => {
            format!("all-gather, step 1 of {steps}: each rank sent its own block to the next")
        }
        Half::AllGather => format!(
            "all-gather, step {step} of {steps}: each rank sent the block it got in step {} to \
             the next",
            step - 1
        ),
    }
}

#[test]
fn ring_all_reduce_shows_partial_sums_grow_then_spread() {
    for (n, len) in [(2, 4), (3, 5), (4, 4), (4, 7)] {
        let stdout = run(
            "02-allreduce",
            &[
                "-n",
                &n.to_string(),
                "--len",
                &len.to_string(),
                "--steps",
                "--algo",
                "ring",
            ],
        );
        let mut state: Buffers = vec![vec![1; len]; n];
        for step in 0..n - 1 {
            let title = ring_step(&mut state, Half::ReduceScatter, step);
            expect(&stdout, &title, &state);
        }
        for step in 0..n - 1 {
            let title = ring_step(&mut state, Half::AllGather, step);
            expect(&stdout, &title, &state);
        }
        assert_eq!(state, vec![vec![n as u64; len]; n]);
        expect(&stdout, "After reduce:", &state);
    }
}

#[test]
fn the_direct_all_reduce_is_one_step() {
    let stdout = run("02-allreduce", &["-n", "3", "--steps"]);
    let title = "direct all-reduce, step 1 of 1: every rank sent its whole buffer to every other \
                 and reduced all of them";
    expect(&stdout, title, &vec![vec![3; 4]; 3]);
    assert!(!stdout.contains("reduce-scatter"), "{stdout}");
}

#[test]
fn a_tree_broadcast_doubles_the_ranks_that_hold_the_buffer() {
    for n in [2usize, 3, 5, 8] {
        let stdout = run(
            "01-broadcast",
            &["-n", &n.to_string(), "--len", "3", "--steps"],
        );
        let rounds = n.next_power_of_two().trailing_zeros() as usize;
        let mut state: Buffers = (0..n)
            .map(|r| vec![if r == 0 { 42 } else { 0 }; 3])
            .collect();
        for round in 0..rounds {
            let far = 1 << (rounds - 1 - round);
            for vr in (0..n).filter(|vr| vr % (2 * far) == 0 && vr + far < n) {
                state[vr + far] = state[vr].clone();
            }
            let title = format!(
                "tree broadcast, round {} of {rounds}: every rank that held the buffer sent it \
                 {far} rank{} further",
                round + 1,
                if far == 1 { "" } else { "s" }
            );
            expect(&stdout, &title, &state);
        }
        assert_eq!(state, vec![vec![42; 3]; n]);
    }
}

#[test]
fn a_chain_broadcast_moves_one_hop_a_round() {
    for n in [2usize, 4] {
        let stdout = run(
            "01-broadcast",
            &[
                "-n",
                &n.to_string(),
                "--len",
                "2",
                "--steps",
                "--algo",
                "chain",
            ],
        );
        let mut state: Buffers = (0..n)
            .map(|r| vec![if r == 0 { 42 } else { 0 }; 2])
            .collect();
        // One segment: in round r it goes from rank r to rank r+1.
        for round in 0..n - 1 {
            state[round + 1] = state[round].clone();
            let title = format!(
                "chain broadcast, round {} of {}: each rank passed the segment it had to the next",
                round + 1,
                n - 1
            );
            expect(&stdout, &title, &state);
        }
    }
}

#[test]
fn all_gather_passes_each_block_once_around_the_ring() {
    for (n, len) in [(2, 2), (3, 2), (4, 1)] {
        let stdout = run(
            "04-allgather",
            &["-n", &n.to_string(), "--len", &len.to_string(), "--steps"],
        );
        // Each rank starts with its own block (rank + 1) in place, zeros elsewhere.
        let mut state: Buffers = (0..n)
            .map(|r| {
                (0..n * len)
                    .map(|i| if i / len == r { r as u64 + 1 } else { 0 })
                    .collect()
            })
            .collect();
        for step in 0..n - 1 {
            let title = ring_step(&mut state, Half::AllGather, step);
            expect(&stdout, &title, &state);
        }
        let gathered: Vec<u64> = (0..n * len).map(|i| (i / len) as u64 + 1).collect();
        expect(&stdout, "After all-gather:", &vec![gathered; n]);
    }
}

#[test]
fn reduce_scatter_adds_each_block_up_around_the_ring() {
    for (n, len) in [(2, 2), (3, 2), (4, 1)] {
        let stdout = run(
            "05-reduce-scatter",
            &["-n", &n.to_string(), "--len", &len.to_string(), "--steps"],
        );
        let values: Vec<u64> = (1..=(n * len) as u64).collect();
        let mut state: Buffers = vec![values.clone(); n];
        for step in 0..n - 1 {
            let title = ring_step(&mut state, Half::ReduceScatter, step);
            expect(&stdout, &title, &state);
        }
        let mine: Buffers = (0..n)
            .map(|r| {
                values[r * len..(r + 1) * len]
                    .iter()
                    .map(|v| v * n as u64)
                    .collect()
            })
            .collect();
        expect(&stdout, "After reduce-scatter (block r on rank r):", &mine);
    }
}

/// The README's command, on whatever this machine runs by default: the ring's steps on the CPU
/// backend, NCCL's one line where it runs.
#[test]
fn the_readme_command_shows_the_steps_this_machine_can_show() {
    // cargo run --example 02-allreduce -- --steps --algo ring
    let output = Command::new(example("02-allreduce"))
        .args(["--steps", "--algo", "ring"])
        .plainly()
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(output.status.success(), "{stdout}");
    match stdout.starts_with("backend: nccl") {
        true => assert!(
            stdout.contains("every step runs inside one kernel"),
            "{stdout}"
        ),
        false => assert!(stdout.contains("reduce-scatter, step 1 of 3"), "{stdout}"),
    }
}

#[test]
fn without_steps_no_step_is_shown() {
    for name in [
        "01-broadcast",
        "02-allreduce",
        "04-allgather",
        "05-reduce-scatter",
    ] {
        let stdout = run(name, &["-n", "3"]);
        for word in ["step", "round"] {
            assert!(!stdout.contains(word), "{name}: {stdout}");
        }
    }
}

/// The book's pictures of the tree broadcast and the ring all-reduce, all-gather and
/// reduce-scatter are drawn from real runs, by the commands docs/src/01-broadcast.md,
/// watching.md, 04-allgather.md and 05-reduce-scatter.md show,
/// and must be what they draw now: the pictures cannot drift from the code.
/// `NCCL_WORKSHOP_UPDATE_PICTURES=1` writes the new ones instead of failing.
#[test]
fn the_books_ring_pictures_are_drawn_from_real_runs() {
    let dir = scratch("ring-picture");
    let pictures = [
        // cargo run --example 01-broadcast -- -n 4 --len 2 --steps --backend cpu > out/broadcast-steps.txt
        // target/release/comm-bench grids out/broadcast-steps.txt -o out/broadcast-tree-steps.svg
        (
            "01-broadcast",
            &["-n", "4", "--len", "2", "--steps"][..],
            "broadcast-tree-steps.svg",
        ),
        // cargo run --example 02-allreduce -- -n 3 --len 3 --steps --algo ring --backend cpu > out/ring-steps.txt
        // target/release/comm-bench grids out/ring-steps.txt -o out/ring-allreduce.svg
        (
            "02-allreduce",
            &["-n", "3", "--len", "3", "--steps", "--algo", "ring"][..],
            "ring-allreduce.svg",
        ),
        // cargo run --example 04-allgather -- -n 3 --steps --backend cpu > out/allgather-steps.txt
        // target/release/comm-bench grids out/allgather-steps.txt -o out/ring-allgather.svg
        (
            "04-allgather",
            &["-n", "3", "--steps"][..],
            "ring-allgather.svg",
        ),
        // cargo run --example 05-reduce-scatter -- -n 3 --steps --backend cpu > out/reduce-scatter-steps.txt
        // target/release/comm-bench grids out/reduce-scatter-steps.txt -o out/ring-reduce-scatter.svg
        (
            "05-reduce-scatter",
            &["-n", "3", "--steps"][..],
            "ring-reduce-scatter.svg",
        ),
    ];
    for (example, args, name) in pictures {
        let stdout = run(example, args);
        std::fs::write(dir.join("steps.txt"), &stdout).unwrap();
        let drawn = Command::new(test_support::build::binary("comm-bench", "comm-bench"))
            .args(["grids", "steps.txt", "-o", name])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(drawn.status.success(), "{drawn:?}");
        let picture = std::fs::read_to_string(dir.join(name)).unwrap();
        let book = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("docs/src/images")
            .join(name);
        if std::env::var_os("NCCL_WORKSHOP_UPDATE_PICTURES").is_some() {
            std::fs::write(&book, &picture).unwrap();
        }
        let committed = std::fs::read_to_string(&book).unwrap_or_default();
        assert!(
            committed == picture,
            "{} differs from what the commands draw now: rerun this test with \
             NCCL_WORKSHOP_UPDATE_PICTURES=1 and commit the picture",
            book.display()
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
