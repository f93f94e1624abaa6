//! Who does what. Started plainly, comm-bench is the *parent*: it picks the backends once, and
//! for each backend and world size starts that many ranks of itself (comm-core's spawn, as the
//! course's mp.spawn does), reads what their rank 0 reports and prints the tables. Started by a
//! launcher (srun, torchrun, commrun) it is a *rank*: it meets the others and measures; its rank
//! 0 prints the tables itself, or, when the parent started it, reports to the parent.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use comm_core::backend::cpu;
use comm_core::backend::{self, BackendKind};
use comm_core::launch::{self, Role};
use comm_core::spawn::Outcome;
use comm_core::timing::Loop;
use comm_core::{
    BackendChoice, Collective, Communicator, Device, Named, ReduceOp, Settings, Topology,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::budget::{self, Budget};
use crate::cli::BenchArgs;
use crate::error::BenchError;
use crate::measure::{Case, Options};
use crate::plan::Plan;
use crate::record::{self, Row, RunInfo};
use crate::table;

/// What a rank 0 reports, in order: to the parent as JSON lines, or straight to its own printer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Event {
    /// A table starts.
    Begin { info: RunInfo, collective: String },
    /// One table line's rows.
    Line(Vec<Row>),
    /// A size that was not measured, and why (None: too small for one element per rank).
    Skipped(Option<String>),
    /// The table ends.
    End,
}

/// Prints tables from events, keeps the rows, and moves the progress bar.
pub struct Printer {
    plan: Plan,
    block: Vec<Row>,
    pub rows: Vec<Row>,
    progress: ProgressBar,
}

impl Printer {
    pub fn new(plan: &Plan, lines: usize) -> Printer {
        // Hidden by indicatif itself when stderr is not a terminal (pipes, srun, CI).
        let progress = ProgressBar::new(lines as u64);
        progress.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} sizes {msg} (eta {eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Printer {
            plan: plan.clone(),
            block: Vec::new(),
            rows: Vec::new(),
            progress,
        }
    }

    fn print(&self, text: &str) {
        self.progress.suspend(|| {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        });
    }

    pub fn handle(&mut self, event: Event) {
        match event {
            Event::Begin { info, collective } => {
                self.progress.set_message(format!(
                    "{collective}, {}, {} ranks",
                    info.backend, info.world_size
                ));
                self.print(&table::header(&info, &collective, &self.plan));
            }
            Event::Line(rows) => {
                self.print(&table::line(&rows));
                self.block.extend(rows.iter().cloned());
                self.rows.extend(rows);
                self.progress.inc(1);
            }
            Event::Skipped(note) => {
                if let Some(note) = note {
                    self.print(&format!("# {note}"));
                }
                self.progress.inc(1);
            }
            Event::End => {
                self.print(&table::footer(&self.block));
                self.block.clear();
            }
        }
    }

    pub fn done(&self) {
        self.progress.finish_and_clear();
    }

    pub fn wrong(&self) -> u64 {
        self.rows.iter().filter_map(|r| r.wrong).sum()
    }
}

/// Where a rank's events go.
enum Sink {
    /// Not rank 0: nothing to report.
    None,
    /// Rank 0 started by the parent: one JSON line per event, flushed at once.
    Parent(File),
    /// Rank 0 under a launcher: print here.
    Print(Box<Printer>),
}

impl Sink {
    fn send(&mut self, event: Event) -> comm_core::Result<()> {
        match self {
            Sink::None => Ok(()),
            Sink::Print(p) => {
                p.handle(event);
                Ok(())
            }
            Sink::Parent(file) => {
                let mut line = serde_json::to_string(&event)
                    .map_err(|e| comm_core::CommError::Usage(format!("encoding a result: {e}")))?;
                line.push('\n');
                file.write_all(line.as_bytes())
                    .and_then(|_| file.flush())
                    .map_err(|e| comm_core::CommError::io("reporting to comm-bench's parent", e))
            }
        }
    }
}

/// The entry point of a benchmark run (not `report`). Returns the exit code.
pub fn run(args: &BenchArgs) -> i32 {
    let plan = Plan::resolve(args).map_err(|e| (e.to_string(), 2));
    // The job flags become settings as every example's do: one constructor, comm-core's.
    let settings = plan.and_then(|plan| {
        let settings = args.job.settings(&plan.collectives);
        settings
            .map(|s| (plan, s))
            .map_err(|e| (e.to_string(), e.exit_code()))
    });
    let role = settings.and_then(|(plan, settings)| {
        launch::role(&settings, None)
            .map(|role| (plan, settings, role))
            .map_err(|e| (e.to_string(), e.exit_code()))
    });
    match role {
        Err((e, code)) => {
            eprintln!("comm-bench: error: {e}");
            code
        }
        Ok((plan, settings, Role::Rank(topology))) => rank_main(args, &plan, &settings, topology),
        Ok((plan, settings, Role::Parent)) => parent_main(args, &plan, &settings),
    }
}

/// One run of ranks: the backend asked for, what it resolved to, and the world size.
struct RanksJob {
    choice: BackendChoice,
    kind: BackendKind,
    world_size: usize,
}

/// The parent: one launch of ranks per (backend, world size); tables printed from the ranks'
/// reports.
fn parent_main(args: &BenchArgs, plan: &Plan, settings: &Settings) -> i32 {
    let jobs = match jobs(plan) {
        Ok(jobs) => jobs,
        Err(e) => {
            eprintln!("comm-bench: error: {e}");
            return 2;
        }
    };
    let dir = match events_dir() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("comm-bench: error: {e}");
            return 1;
        }
    };
    let mut printer = Printer::new(plan, jobs.len() * plan.cases());
    let mut code = 0;
    if let Err(e) = run_jobs(&jobs, settings, &dir, &mut printer) {
        printer
            .progress
            .suspend(|| eprintln!("comm-bench: error: {e}"));
        code = e.exit_code();
    }
    printer.done();
    let _ = std::fs::remove_dir_all(&dir);
    // `&`, not `&&`: the course's files are written even when --csv/--json failed.
    let written =
        write_outputs(args, &printer.rows) & crate::course::write(args, plan, &printer.rows);
    if code == 0 && !written {
        code = 1;
    }
    finish_code(code, printer.wrong(), printer.rows.len())
}

/// The runs to make, each (backend, world size) once. With several backends one that this
/// machine cannot run is skipped, as are world sizes NCCL has too few GPUs for; the notes on
/// stderr say so.
fn jobs(plan: &Plan) -> Result<Vec<RanksJob>, BenchError> {
    let mut jobs: Vec<RanksJob> = Vec::new();
    let mut notes = Vec::new();
    for &choice in &plan.backends {
        let selection = match backend::select(choice) {
            Ok(s) => s,
            Err(e) if plan.backends.len() > 1 => {
                notes.push(format!("skipping --backend {}: {e}", choice.name()));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let sizes = plan
            .world_sizes
            .clone()
            .unwrap_or_else(|| vec![launch::default_ranks(&selection)]);
        for ws in sizes {
            if selection.kind == BackendKind::Nccl && ws > selection.gpus {
                notes.push(format!(
                    "skipping {ws} ranks on NCCL: this node has {} GPU{} and NCCL needs one per rank",
                    selection.gpus,
                    if selection.gpus == 1 { "" } else { "s" }
                ));
            } else if !jobs
                .iter()
                .any(|j| j.kind == selection.kind && j.world_size == ws)
            {
                jobs.push(RanksJob {
                    choice,
                    kind: selection.kind,
                    world_size: ws,
                });
            }
        }
    }
    for note in &notes {
        eprintln!("comm-bench: {note}");
    }
    if jobs.is_empty() {
        return Err(BenchError::NothingToRun);
    }
    Ok(jobs)
}

/// A new folder for the files the ranks' rank 0 reports into (removed after the run).
fn events_dir() -> Result<PathBuf, BenchError> {
    let dir = std::env::temp_dir().join(format!(
        "comm-bench-{}-{}",
        std::process::id(),
        record::utc_now().replace(':', "")
    ));
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::CreateDir {
        path: dir.clone(),
        source,
    })?;
    Ok(dir)
}

/// Runs the jobs one after another, their events in `dir`; stops at the first that fails.
fn run_jobs(
    jobs: &[RanksJob],
    settings: &Settings,
    dir: &Path,
    printer: &mut Printer,
) -> Result<(), BenchError> {
    for job in jobs {
        let (kind, ws) = (job.kind, job.world_size);
        let events = dir.join(format!("{kind}-{ws}.jsonl"));
        let settings = Settings {
            ranks: Some(ws),
            backend: job.choice,
            ..settings.clone()
        };
        match launch_job(&settings, &events, printer)? {
            Outcome::Success => {}
            outcome => {
                return Err(BenchError::RanksFailed {
                    backend: kind,
                    world_size: ws,
                    outcome: Box::new(outcome),
                })
            }
        }
    }
    Ok(())
}

/// A run's exit code: a failure's, else 1 when nothing was measured (every size skipped) or
/// when any element was wrong.
fn finish_code(code: i32, wrong: u64, measured: usize) -> i32 {
    if code == 0 && measured == 0 {
        eprintln!(
            "comm-bench: error: measured nothing: every size was skipped (the # lines say why); \
             give sizes that fit (-b/-e) or fewer ranks"
        );
        return 1;
    }
    if code == 0 && wrong > 0 {
        eprintln!(
            "comm-bench: error: {wrong} wrong element{} (the #wrong columns): a collective gave a result that differs from the sequential reference",
            if wrong == 1 { "" } else { "s" }
        );
        return 1;
    }
    code
}

/// Writes --csv and --json; says so on stderr. False when one could not be written.
fn write_outputs(args: &BenchArgs, rows: &[Row]) -> bool {
    let mut ok = true;
    for (path, write) in [
        (
            &args.sweep.csv,
            record::write_csv as fn(&Path, &[Row]) -> Result<(), BenchError>,
        ),
        (&args.json, record::write_json),
    ] {
        let Some(path) = path else { continue };
        match write(path, rows) {
            Ok(()) => eprintln!(
                "comm-bench: wrote {} rows to {}",
                rows.len(),
                path.display()
            ),
            Err(e) => {
                eprintln!("comm-bench: error: {e}");
                ok = false;
            }
        }
    }
    ok
}

/// Starts `settings.ranks` ranks measuring `settings.backend` (through comm-core's launch, as
/// every example starts its ranks), printing what their rank 0 reports as it arrives.
fn launch_job(
    settings: &Settings,
    events: &Path,
    printer: &mut Printer,
) -> comm_core::Result<Outcome> {
    let child_args: [std::ffi::OsString; 4] = [
        "--child-events".into(),
        events.as_os_str().to_owned(),
        "--child-backend".into(),
        settings.backend.name().into(),
    ];
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let follower = s.spawn(|| follow(events, &stop, printer));
        let outcome = launch::start_ranks(settings, &child_args);
        stop.store(true, Ordering::SeqCst);
        let _ = follower.join();
        outcome
    })
}

/// Reads the events file as rank 0 appends to it, until `stop` and the end of the file.
fn follow(path: &Path, stop: &AtomicBool, printer: &mut Printer) {
    let mut reader: Option<BufReader<File>> = None;
    let mut partial = String::new();
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        if reader.is_none() {
            reader = File::open(path).ok().map(BufReader::new);
        }
        let mut progressed = false;
        if let Some(r) = reader.as_mut() {
            loop {
                match r.read_line(&mut partial) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if partial.ends_with('\n') => {
                        progressed = true;
                        match serde_json::from_str::<Event>(partial.trim_end()) {
                            Ok(event) => printer.handle(event),
                            Err(e) => eprintln!("comm-bench: ignoring a malformed report: {e}"),
                        }
                        partial.clear();
                    }
                    Ok(_) => break, // half a line: the rest comes later
                }
            }
        }
        if stopping {
            return;
        }
        if !progressed {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A rank: meet the others, measure every backend asked for, report from rank 0. Its life
/// (rendezvous, selection line, finish or abort) is every program's, `launch::rank_life`.
fn rank_main(args: &BenchArgs, plan: &Plan, settings: &Settings, topology: Topology) -> i32 {
    let rank = topology.rank;
    let backends = match args.child_backend {
        Some(b) => vec![b],
        None => plan.backends.clone(),
    };
    let direct = args.child_events.is_none();
    let mut sink = match (&args.child_events, rank) {
        (_, r) if r != 0 => Sink::None,
        (Some(path), _) => match File::create(path) {
            Ok(f) => Sink::Parent(f),
            Err(e) => {
                eprintln!("error: rank 0 cannot write {}: {e}", path.display());
                return 1;
            }
        },
        (None, _) => Sink::Print(Box::new(Printer::new(plan, backends.len() * plan.cases()))),
    };
    if direct && rank == 0 && plan.world_sizes.is_some() {
        eprintln!(
            "comm-bench: started by a launcher: measuring its {} ranks (--world-sizes applies only when comm-bench starts the ranks)",
            topology.world_size
        );
    }
    let settings = Settings {
        backend: backends[0],
        ..settings.clone()
    };
    let nodes = (topology.world_size / topology.local_world_size.max(1)).max(1);
    let local_ranks = topology.local_world_size;
    let code = launch::rank_life(&settings, topology, |job| {
        for (i, &choice) in backends.iter().enumerate() {
            // Every backend over the same ranks and store: the first must work, the others are
            // skipped where this machine cannot run them.
            match job.communicator(choice).map(launch::announced) {
                Ok(comm) => {
                    // Over the whole job: every group of --group-size skips the same sizes.
                    let budget = memory_budget(&comm, local_ranks)?;
                    match args.group_size {
                        None => measure_all(&comm, plan, nodes, &budget, &mut sink, None)?,
                        Some(size) => {
                            let group = crate::groups::split(&comm, size)?;
                            let all = Some(&comm);
                            measure_all(&group, plan, nodes, &budget, &mut sink, all)?;
                            group.close()?;
                        }
                    }
                    // Every rank is done with it: NCCL's clean end (a barrier, then finalize
                    // and destroy), so no rank tears its communicator down while a peer still
                    // runs the last collective.
                    comm.close()?;
                }
                Err(e) if i == 0 => return Err(e),
                Err(e) if rank == 0 => {
                    eprintln!("comm-bench: skipping --backend {}: {e}", choice.name())
                }
                Err(_) => {}
            }
        }
        Ok(())
    });
    match (code, sink) {
        (0, Sink::Print(printer)) => {
            printer.done();
            // `&`, not `&&`: both are written even when one fails.
            let written = write_outputs(args, &printer.rows)
                & crate::course::write(args, plan, &printer.rows);
            let code = if written { 0 } else { 1 };
            finish_code(code, printer.wrong(), printer.rows.len())
        }
        // Ranks the parent started leave the verdict to it; other ranks stay quiet.
        (code, _) => code,
    }
}

/// What each rank may use ([`Budget`]): host memory (3/4 of MemAvailable shared by the node's
/// ranks) and on NCCL its GPU's (9/10 of the free memory `cuMemGetInfo` reports now, with the
/// communicator built), each the smallest over all ranks, so that every rank skips the same
/// sizes. A number that cannot be read does not limit.
fn memory_budget(comm: &Communicator, local_ranks: usize) -> comm_core::Result<Budget> {
    let available = comm_core::memory::available().unwrap_or(i64::MAX as u64);
    let host = budget::host_share(available, local_ranks).min(i64::MAX as u64) as i64;
    let device = match comm.device() {
        Device::Cuda(ordinal) => cudarc::driver::CudaContext::new(ordinal)
            .and_then(|ctx| ctx.mem_get_info())
            .map_or(i64::MAX, |(free, _total)| {
                budget::device_share(free as u64).min(i64::MAX as u64) as i64
            }),
        Device::Cpu(_) => i64::MAX,
    };
    let mut smallest = comm.buffer(&[host, device])?;
    comm.all_reduce(&mut smallest, ReduceOp::Min)?;
    let smallest = comm.to_host(&smallest)?;
    Ok(Budget {
        host: smallest[0] as u64,
        device: matches!(comm.device(), Device::Cuda(_)).then_some(smallest[1] as u64),
        local_ranks: local_ranks.max(1),
    })
}

/// The backend's version and the machine it runs on, for the rows of `collective`'s table.
fn describe(comm: &Communicator, collective: Collective) -> (String, String) {
    match comm.device() {
        Device::Cuda(ordinal) => {
            let version = cudarc::nccl::result::get_nccl_version().map_or_else(
                |_| "NCCL (version unknown)".to_string(),
                |v| format!("NCCL {}", comm_core::backend::nccl::dotted_version(v)),
            );
            let gpu = cudarc::driver::CudaContext::new(ordinal)
                .and_then(|c| c.name())
                .unwrap_or_else(|_| "GPU".into());
            (version, format!("{gpu}, host {}", record::cpu_model()))
        }
        Device::Cpu(_) => (
            format!(
                "{} transport{}{} (comm-core {})",
                comm.transport().unwrap_or("?"),
                comm.registered_from(collective)
                    .map_or_else(String::new, |from| {
                        format!(", {}", record::registered_words(from))
                    }),
                // Named only where this collective has it: --algo ring on all_reduce and
                // broadcast in one run leaves broadcast to choose by size.
                comm.algo()
                    .filter(|a| cpu::algos_of(collective).contains(a))
                    .map_or_else(String::new, |a| format!(", {} algorithm", a.name())),
                env!("CARGO_PKG_VERSION")
            ),
            record::cpu_model(),
        ),
    }
}

/// Every table of the plan on `comm`, within `budget`; where `comm` is a group of
/// `--group-size`, every group of `job` measures at once (see [`crate::groups`]).
fn measure_all(
    comm: &Communicator,
    plan: &Plan,
    nodes: usize,
    budget: &Budget,
    sink: &mut Sink,
    job: Option<&Communicator>,
) -> comm_core::Result<()> {
    let (version, machine) = describe(comm, Collective::AllReduce);
    let mut info = RunInfo {
        backend: comm.backend().to_string(),
        backend_version: version,
        machine,
        host: record::host(),
        world_size: comm.world_size(),
        nodes,
        warmup: plan.warmup,
        iters: plan.iters,
        blocking: plan.waiting.flag(),
        agg_iters: plan.aggregate,
        average: plan.average.flag(),
        per_iter_timing: u8::from(plan.per_iteration),
        started: record::utc_now(),
    };
    // nccl-tests rotates its buffers within the largest size (-e) it allocated; ours within the
    // largest size that fits, on GPUs only (see measure.rs's `rotation`).
    let rotate_within = match comm.device() {
        Device::Cuda(_) => budget.largest_fitting(&plan.sizes),
        Device::Cpu(_) => None,
    };
    let opts = Options {
        timed: Loop {
            warmup: plan.warmup,
            iters: plan.iters,
            aggregate: plan.aggregate,
            waiting: plan.waiting,
            per_iteration: plan.per_iteration,
        },
        average: plan.average,
        checks: plan.checks,
        out_of_place: plan.out_of_place,
        in_place: plan.in_place,
        inject_error: plan.inject_error,
        rotate_within,
    };
    // One stopwatch for the whole run: its events are made once and reused by every loop.
    let mut stopwatch = comm.stopwatch();
    let tables = plan.tables();
    for (i, &(collective, dtype, op)) in tables.iter().enumerate() {
        if i == 0 || tables[i - 1].0 != collective {
            info.backend_version = describe(comm, collective).0;
            sink.send(Event::Begin {
                info: info.clone(),
                collective: collective.name().into(),
            })?;
        }
        for &bytes in &plan.sizes {
            if let Some(refusal) = budget.refusal(bytes) {
                let why = budget::note(collective, bytes, refusal, budget.local_ranks);
                sink.send(Event::Skipped(Some(why)))?;
                continue;
            }
            let case = Case {
                collective,
                dtype,
                op,
                root: plan.root,
                bytes,
            };
            match crate::groups::measure(comm, job, &case, &opts, &mut stopwatch)? {
                Some(m) => sink.send(Event::Line(Row::of(&info, &m)))?,
                None => sink.send(Event::Skipped(None))?,
            }
        }
        if tables.get(i + 1).is_none_or(|next| next.0 != collective) {
            sink.send(Event::End)?;
        }
    }
    Ok(())
}
