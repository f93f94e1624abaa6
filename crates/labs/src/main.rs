//! `lab`, the labs' checker: `cargo lab 3` (an alias, in `.cargo/config.toml`, for `cargo run
//! --release -p labs -- 3`) checks lab 3. It starts the ranks itself, 2 to 8 of them, runs your
//! function and the library's collective on the same inputs, and compares every element; then
//! it times both. Each lab has a page in the book (docs/src/lab1-ping-pong.md and on).
//!
//! The files you edit are `src/labN_*.rs`, one per lab, each holding only the functions you
//! write. `solutions/` holds a solution of each (`--solution` runs it); `skeletons/` and
//! `planted/` are for the tests that keep this checker honest: the pristine skeletons, and one
//! wrong solution per lab, planted on purpose.

mod cases;
mod catalog;
mod code;
mod compare;
mod ddp;
mod deadlock;
mod groups;
mod panics;
mod parent;
mod pingpong;
mod rank;
mod report;
mod timing;

// Your files: each holds a lab's functions; until written, a `todo!()` (unused arguments and
// imports are fine there).
#[allow(unused_imports, unused_variables)]
mod lab1_ping_pong;
#[allow(unused_imports, unused_variables)]
mod lab2_tree_broadcast;
#[allow(unused_imports, unused_variables)]
mod lab3_ring_all_reduce;
#[allow(unused_imports, unused_variables)]
mod lab4_rings;
#[allow(unused_imports, unused_variables)]
mod lab5_ddp;
#[allow(unused_imports, unused_variables)]
mod lab6_zero;
mod lab7_deadlock;
#[allow(unused_imports, unused_variables)]
mod lab8_groups;

/// The student's files, as one set of lab files ([`Yours`]).
mod yours {
    pub(crate) use crate::{
        lab1_ping_pong, lab2_tree_broadcast, lab3_ring_all_reduce, lab4_rings, lab5_ddp, lab6_zero,
        lab7_deadlock, lab8_groups,
    };
}

/// The reference solutions.
#[path = "../solutions"]
mod solutions {
    pub mod lab1_ping_pong;
    pub mod lab2_tree_broadcast;
    pub mod lab3_ring_all_reduce;
    pub mod lab4_rings;
    pub mod lab5_ddp;
    pub mod lab6_zero;
    pub mod lab7_deadlock;
    pub mod lab8_groups;
}

/// The skeletons as a fresh clone has them, kept apart from the student's files.
#[path = "../skeletons"]
#[allow(unused_imports, unused_variables)]
mod skeletons {
    pub mod lab1_ping_pong;
    pub mod lab2_tree_broadcast;
    pub mod lab3_ring_all_reduce;
    pub mod lab4_rings;
    pub mod lab5_ddp;
    pub mod lab6_zero;
    pub mod lab7_deadlock;
    pub mod lab8_groups;
}

/// One wrong solution per lab, planted on purpose: the checker must catch it and say where.
#[path = "../planted"]
mod planted {
    pub mod lab1_ping_pong;
    pub mod lab2_tree_broadcast;
    pub mod lab3_ring_all_reduce;
    pub mod lab4_rings;
    pub mod lab5_ddp;
    pub mod lab6_zero;
    pub mod lab7_deadlock;
    pub mod lab8_groups;
}

code::code!(Yours, crate::yours);
code::code!(Solution, crate::solutions);
code::code!(Skeleton, crate::skeletons);
code::code!(Planted, crate::planted);

use std::path::PathBuf;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use comm_core::launch::{self, Role};
use comm_core::{BackendChoice, JobArgs, Named, Settings};

use catalog::Lab;
use code::Whose;
use rank::Work;

#[derive(Parser)]
#[command(
    name = "lab",
    about = "Check a lab: your function and the library's on the same inputs, on 2 to 8 ranks, every element compared",
    after_help = "The labs run on the CPU backend: any number of ranks on one machine."
)]
struct Args {
    /// The lab to check, 1 to 8 (without one, the labs are listed).
    #[arg(value_name = "LAB")]
    lab: Option<usize>,

    /// Check only the cases on N ranks, and time on N [default: the lab's rank counts, 2 to 8;
    /// the timing, --steps and --trace on 4].
    #[arg(short = 'n', value_name = "N", value_parser = rank_count)]
    ranks: Option<usize>,

    /// Run one small case and show your code's steps (those it shows with `comm.show_step`), as
    /// grids of every rank's buffer, with the result beside the expected one.
    #[arg(long)]
    steps: bool,

    /// Run the reference solution (crates/labs/solutions/) instead of your file: what a right
    /// run prints.
    #[arg(long, conflicts_with = "code")]
    solution: bool,

    /// The job flags every program shares.
    #[command(flatten)]
    job: JobArgs,

    /// Whose files to run: the tests' pristine skeletons and planted bugs.
    #[arg(long, hide = true, value_parser = ["yours", "solution", "skeleton", "planted"])]
    code: Option<String>,

    /// A rank's work, set by the checker for the ranks it starts.
    #[arg(long, hide = true)]
    child_work: Option<String>,

    /// Where a rank reports, set by the checker.
    #[arg(long, hide = true)]
    child_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    // The job flags' --timeout, as the checker takes it: short, so that a hang is found soon.
    let matches = Args::command()
        .mut_arg("timeout", |arg| {
            arg.default_value("20").help(
                "Seconds a rank may wait for another (the rendezvous, a message, a collective) \
                 before the check fails, naming whom it waited for [lab 7: 5 unless given]",
            )
        })
        .get_matches();
    let mut args = match Args::from_arg_matches(&matches) {
        Ok(args) => args,
        Err(e) => e.exit(),
    };
    let Some(number) = args.lab else {
        list();
        return ExitCode::SUCCESS;
    };
    let Some(lab) = Lab::numbered(number) else {
        eprintln!("error: there is no lab {number}: `cargo lab` lists them");
        return ExitCode::from(2);
    };
    if matches.value_source("timeout") == Some(ValueSource::DefaultValue) {
        args.job.timeout = lab.timeout();
    }
    let whose = match (args.solution, args.code.as_deref()) {
        (true, _) => Whose::Solution,
        (false, Some(name)) => Whose::from_name(name).expect("clap checked the name"),
        (false, None) => Whose::Yours,
    };
    let settings = match args.job.settings(lab.collectives()) {
        Ok(s) => Settings {
            backend: BackendChoice::Cpu,
            steps: args.steps,
            ..s
        },
        Err(e) => {
            eprintln!("error: {e}");
            return launch::exit_code(e.exit_code());
        }
    };
    let code = match launch::role(&settings, None) {
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
        Ok(Role::Parent) => parent::check(lab, whose, args.ranks, &settings),
        Ok(Role::Rank(topology)) => match (&args.child_work, &args.child_dir) {
            (Some(work), Some(dir)) => {
                let work = Work::from_name(work).expect("the checker names the work");
                match whose {
                    Whose::Yours => {
                        rank::main::<Yours>(lab, work, dir, args.ranks, &settings, topology)
                    }
                    Whose::Solution => {
                        rank::main::<Solution>(lab, work, dir, args.ranks, &settings, topology)
                    }
                    Whose::Skeleton => {
                        rank::main::<Skeleton>(lab, work, dir, args.ranks, &settings, topology)
                    }
                    Whose::Planted => {
                        rank::main::<Planted>(lab, work, dir, args.ranks, &settings, topology)
                    }
                }
            }
            _ => {
                eprintln!("error: the checker starts its own ranks: run it without a launcher (`cargo lab {number}`)");
                2
            }
        },
    };
    launch::exit_code(code)
}

/// `-n`: a rank count the checker can start on one machine.
fn rank_count(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n @ 1..=64) => Ok(n),
        _ => Err(format!("{text}: give a number of ranks from 1 to 64")),
    }
}

/// `cargo lab` alone: the labs, and how to check one.
fn list() {
    println!("The labs (each has a page in the book: docs/src/lab1-ping-pong.md and on):");
    let width = Lab::ALL
        .map(|lab| lab.title().chars().count())
        .into_iter()
        .max();
    for lab in Lab::ALL {
        let title = lab.title();
        let width = width.unwrap_or(0);
        println!("  {}  {title:<width$}  {}", lab.number(), lab.file());
    }
    println!("Check one with `cargo lab N`; `cargo lab N --solution` runs the reference solution.");
}
