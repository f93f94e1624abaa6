//! What to measure: the flags, a preset's values under them, and the defaults under both.

use comm_core::timing::{Average, Waiting};
use comm_core::{BackendChoice, Collective, DType, ReduceOp};

use crate::cli::{BenchArgs, Placements, Preset};
use crate::error::BenchError;
use crate::units::{sizes, SweepDefaults};

/// A resolved sweep, the same on every rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub collectives: Vec<Collective>,
    /// Requested sizes in bytes (each collective rounds them to whole elements per rank).
    pub sizes: Vec<u64>,
    pub dtypes: Vec<DType>,
    pub ops: Vec<ReduceOp>,
    pub root: usize,
    pub iters: usize,
    pub warmup: usize,
    /// How the timed iterations wait (-z).
    pub waiting: Waiting,
    /// How the ranks' times become the reported one (-a).
    pub average: Average,
    /// Each iteration timed between marks: CUDA events on NCCL (-I 1).
    pub per_iteration: bool,
    /// Calls per timed iteration (-m).
    pub aggregate: usize,
    pub checks: usize,
    pub out_of_place: bool,
    pub in_place: bool,
    pub backends: Vec<BackendChoice>,
    /// None: the default for the backend (one per GPU, or the CPU default).
    pub world_sizes: Option<Vec<usize>>,
    pub inject_error: bool,
}

/// A preset's values, each used where its flag was not given.
#[derive(Default)]
struct Defaults {
    collectives: Option<Vec<Collective>>,
    min: Option<u64>,
    max: Option<u64>,
    factor: Option<u64>,
    placement: Option<Placements>,
    backends: Option<Vec<BackendChoice>>,
    world_sizes: Option<Vec<usize>>,
}

fn preset(p: Option<Preset>) -> Defaults {
    match p {
        None => Defaults::default(),
        Some(Preset::Profiler) => Defaults {
            collectives: Some(vec![
                Collective::AllReduce,
                Collective::AllGather,
                Collective::ReduceScatter,
            ]),
            min: Some(4 << 20),
            max: Some(64 << 20),
            factor: Some(4),
            ..Defaults::default()
        },
        Some(Preset::AllreduceSweep) => Defaults {
            collectives: Some(vec![Collective::AllReduce]),
            min: Some(1_000_000),
            max: Some(1_000_000_000),
            factor: Some(10),
            placement: Some(Placements::InPlace),
            world_sizes: Some(vec![2, 4, 6]),
            ..Defaults::default()
        },
        Some(Preset::CpuVsNccl) => Defaults {
            collectives: Some(vec![Collective::AllReduce]),
            min: Some(100_000_000),
            max: Some(100_000_000),
            factor: Some(2),
            placement: Some(Placements::InPlace),
            backends: Some(vec![BackendChoice::Cpu, BackendChoice::Nccl]),
            world_sizes: Some(vec![2]),
        },
    }
}

fn list<T: Copy>(
    given: &Option<Vec<String>>,
    all: &[T],
    parse: impl Fn(&str) -> Result<T, BenchError>,
) -> Result<Option<Vec<T>>, BenchError> {
    let Some(given) = given else { return Ok(None) };
    if given.iter().any(|s| s == "all") {
        return Ok(Some(all.to_vec()));
    }
    let mut out = Vec::new();
    for s in given.iter().filter(|s| !s.is_empty()) {
        out.push(parse(s)?);
    }
    Ok(Some(out))
}

/// What each table measures: --collectives, -d and -o (comm-core's parsers name the values).
struct Tables {
    collectives: Vec<Collective>,
    dtypes: Vec<DType>,
    ops: Vec<ReduceOp>,
}

fn tables(args: &BenchArgs, d: &Defaults) -> Result<Tables, BenchError> {
    // comm-core's parsers say which names they know; "all" is comm-bench's own.
    let collectives = list(&args.collectives, &Collective::ALL, |s| {
        s.parse::<Collective>()
            .map_err(|e| BenchError::UnknownName(e.replace("use one of", "use all or one of")))
    })?
    .or(d.collectives.clone())
    .unwrap_or_else(|| vec![Collective::AllReduce]);
    let dtypes = list(&args.dtypes, &DType::ALL, |s| {
        s.parse().map_err(BenchError::UnknownName)
    })?
    .unwrap_or(vec![DType::F32]);
    let ops = list(&args.ops, &ReduceOp::ALL, |s| {
        s.parse().map_err(BenchError::UnknownName)
    })?
    .unwrap_or(vec![ReduceOp::Sum]);
    if collectives.is_empty() || dtypes.is_empty() || ops.is_empty() {
        return Err(BenchError::EmptyList);
    }
    Ok(Tables {
        collectives,
        dtypes,
        ops,
    })
}

/// --world-sizes (or the preset's), each a number of ranks this node can start.
fn world_sizes(args: &BenchArgs, d: &Defaults) -> Result<Option<Vec<usize>>, BenchError> {
    let world_sizes = args.world_sizes.clone().or(d.world_sizes.clone());
    if let Some(ws) = &world_sizes {
        if ws.is_empty() || ws.contains(&0) {
            return Err(BenchError::NoWorldSize);
        }
        // comm-bench starts every world size on this node.
        for &n in ws {
            comm_core::spawn::check_ranks("--world-sizes", n, 1)?;
        }
        if ws.len() > 1 && args.job.trace.is_some() {
            return Err(BenchError::TraceOfSeveralJobs);
        }
    }
    Ok(world_sizes)
}

/// How the loop is timed and its times combined: -n, -z, -a, -I and -m, in nccl-tests' ranges.
struct Timed {
    iters: usize,
    waiting: Waiting,
    average: Average,
    per_iteration: bool,
    aggregate: usize,
}

fn timed(args: &BenchArgs) -> Result<Timed, BenchError> {
    let iters = args.iters.unwrap_or(20);
    if iters == 0 {
        return Err(BenchError::ZeroIters);
    }
    let z = args.blocking.unwrap_or(0);
    let waiting = Waiting::from_flag(z).ok_or(BenchError::Blocking(z))?;
    let a = args.average.unwrap_or(1);
    let average = Average::from_flag(a).ok_or(BenchError::Average(a))?;
    let per_iteration = match args.per_iter_timing.unwrap_or(0) {
        0 => false,
        1 => true,
        i => return Err(BenchError::PerIterTiming(i)),
    };
    let aggregate = args.agg_iters.unwrap_or(1);
    if aggregate == 0 {
        return Err(BenchError::ZeroAggIters);
    }
    Ok(Timed {
        iters,
        waiting,
        average,
        per_iteration,
        aggregate,
    })
}

impl Plan {
    /// The flags over the preset's values over the defaults; refuses values that cannot work.
    pub fn resolve(args: &BenchArgs) -> Result<Plan, BenchError> {
        let d = preset(args.preset);
        let Tables {
            collectives,
            dtypes,
            ops,
        } = tables(args, &d)?;
        let sizes = sizes(
            &args.sweep,
            SweepDefaults {
                min: d.min.unwrap_or(1 << 10),
                max: d.max.unwrap_or(64 << 20),
                factor: d.factor.unwrap_or(4),
            },
        )?;
        let placement = args.placement.or(d.placement).unwrap_or(Placements::Both);
        let backends = args
            .backend
            .clone()
            .or(d.backends.clone())
            .unwrap_or(vec![BackendChoice::Auto]);
        let world_sizes = world_sizes(args, &d)?;
        let timed = timed(args)?;
        Ok(Plan {
            collectives,
            sizes,
            dtypes,
            ops,
            root: args.root.unwrap_or(0),
            iters: timed.iters,
            warmup: args.warmup.unwrap_or(5),
            waiting: timed.waiting,
            average: timed.average,
            per_iteration: timed.per_iteration,
            aggregate: timed.aggregate,
            checks: args.check.unwrap_or(1),
            out_of_place: placement != Placements::InPlace,
            in_place: placement != Placements::OutOfPlace,
            backends,
            world_sizes,
            inject_error: args.inject_error,
        })
    }

    /// The (collective, dtype, op) tables of the sweep, in order; `op` is None for collectives
    /// that do not reduce (the collective table says which do).
    pub fn tables(&self) -> Vec<(Collective, DType, Option<ReduceOp>)> {
        let mut out = Vec::new();
        for &c in &self.collectives {
            for &d in &self.dtypes {
                if c.describe().reduces {
                    out.extend(self.ops.iter().map(|&op| (c, d, Some(op))));
                } else {
                    out.push((c, d, None));
                }
            }
        }
        out
    }

    /// How many table lines one world size produces (for the progress bar).
    pub fn cases(&self) -> usize {
        self.tables().len() * self.sizes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    fn plan(args: &[&str]) -> Result<Plan, String> {
        let cli = Cli::try_parse_from(std::iter::once("comm-bench").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        Plan::resolve(&cli.bench).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults() {
        let p = plan(&[]).unwrap();
        assert_eq!(p.collectives, vec![Collective::AllReduce]);
        assert_eq!(p.sizes.first(), Some(&1024));
        assert_eq!(p.sizes.last(), Some(&(64 << 20)));
        assert_eq!((p.iters, p.warmup, p.checks, p.root), (20, 5, 1, 0));
        assert_eq!((p.waiting, p.aggregate), (Waiting::BackToBack, 1));
        assert_eq!((p.average, p.per_iteration), (Average::Mean, false));
        assert!(p.in_place && p.out_of_place);
        assert_eq!(p.backends, vec![BackendChoice::Auto]);
        assert_eq!(p.world_sizes, None);
    }

    #[test]
    fn nccl_tests_flags() {
        let p = plan(&[
            "-b", "8", "-e", "128M", "-f", "2", "-n", "7", "-w", "2", "-c", "0", "-d", "double",
            "-o", "max", "-r", "1",
        ])
        .unwrap();
        assert_eq!(p.sizes.len(), 25);
        assert_eq!(p.sizes[24], 128 << 20);
        assert_eq!((p.iters, p.warmup, p.checks, p.root), (7, 2, 0, 1));
        let blocking = plan(&["-z", "1", "-m", "4"]).unwrap();
        assert_eq!(
            (blocking.waiting, blocking.aggregate),
            (Waiting::BarrierEach, 4)
        );
        let each = plan(&["-z", "3", "-a", "3", "-I", "1"]).unwrap();
        assert_eq!(
            (each.waiting, each.average, each.per_iteration),
            (Waiting::EachCall, Average::Max, true)
        );
        for (a, average) in [("0", Average::Rank0), ("2", Average::Min)] {
            assert_eq!(plan(&["--average", a]).unwrap().average, average);
        }
        // nccl-tests' 2 (no barrier) is not offered; -a and -I have nccl-tests' ranges.
        for (flags, said) in [
            (["-z", "2"], "-z/--blocking 2: give 0"),
            (["-z", "4"], "-z/--blocking 4"),
            (["-a", "7"], "-a/--average 7: give 0 (rank 0's time)"),
            (["-I", "2"], "-I/--per_iter_timing 2"),
        ] {
            let e = plan(&flags).unwrap_err();
            assert!(e.contains(said) && !e.contains('\n'), "{e}");
        }
        assert!(plan(&["-m", "0"]).unwrap_err().contains("-m/--agg_iters 0"));
        assert_eq!((p.dtypes[0], p.ops[0]), (DType::F64, ReduceOp::Max));
        let p = plan(&["-b", "1K", "-e", "4K", "-i", "1K"]).unwrap();
        assert_eq!(p.sizes, vec![1024, 2048, 3072, 4096]);
        assert_eq!(
            plan(&["-b", "1M", "-e", "1M"]).unwrap().sizes,
            vec![1 << 20]
        );
        assert_eq!(plan(&["-b", "1G"]).unwrap().sizes, vec![1 << 30]);
        assert!(plan(&["-f", "2", "-i", "8"]).is_err());
    }

    #[test]
    fn lists_and_all() {
        let p = plan(&["--collectives", "all", "-d", "all", "-o", "sum,max"]).unwrap();
        assert_eq!(p.collectives, Collective::ALL.to_vec());
        assert_eq!(p.dtypes.len(), 4);
        // reducing collectives get one table per op, the others one.
        let reducing = Collective::ALL
            .iter()
            .filter(|c| c.describe().reduces)
            .count();
        assert_eq!(reducing, 3);
        assert_eq!(
            p.tables().len(),
            4 * (reducing * 2 + Collective::ALL.len() - reducing)
        );
        let p = plan(&[
            "--collectives",
            "all-gather,sendrecv",
            "--world-sizes",
            "2,3",
        ])
        .unwrap();
        assert_eq!(
            p.collectives,
            vec![Collective::AllGather, Collective::SendRecv]
        );
        assert_eq!(p.world_sizes, Some(vec![2, 3]));
        let p = plan(&["--collectives", "alltoall,all-to-all"]).unwrap();
        assert_eq!(p.collectives, vec![Collective::AllToAll; 2]);
        let err = plan(&["--collectives", "scatter_gather"]).unwrap_err();
        assert!(
            err.contains("use all or one of") && err.contains("alltoall"),
            "{err}"
        );
        assert!(plan(&["-d", "half8"]).is_err());
        assert!(plan(&["--world-sizes", "0"]).is_err());
        let e = plan(&["--world-sizes", "2,100000"]).unwrap_err();
        assert!(
            e.contains("--world-sizes 100000: at most 1024 ranks"),
            "{e}"
        );
        assert!(plan(&["-n", "0"]).is_err());
    }

    #[test]
    fn presets_and_overrides() {
        let p = plan(&["--preset", "profiler"]).unwrap();
        assert_eq!(p.sizes, vec![4 << 20, 16 << 20, 64 << 20]);
        assert_eq!(p.collectives.len(), 3);
        let p = plan(&["--preset", "allreduce-sweep"]).unwrap();
        assert_eq!(
            p.sizes,
            vec![1_000_000, 10_000_000, 100_000_000, 1_000_000_000]
        );
        assert_eq!(p.world_sizes, Some(vec![2, 4, 6]));
        assert!(p.in_place && !p.out_of_place);
        let p = plan(&["--preset", "cpu-vs-nccl"]).unwrap();
        assert_eq!(p.sizes, vec![100_000_000]);
        assert_eq!(p.backends, vec![BackendChoice::Cpu, BackendChoice::Nccl]);
        // Explicit flags win over the preset.
        let p = plan(&[
            "--preset",
            "allreduce-sweep",
            "-e",
            "10MB",
            "--world-sizes",
            "2",
        ])
        .unwrap();
        assert_eq!(p.sizes, vec![1_000_000, 10_000_000]);
        assert_eq!(p.world_sizes, Some(vec![2]));
    }
}
