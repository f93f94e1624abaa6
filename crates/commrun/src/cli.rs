//! The command line: torchrun's flags where they mean the same thing (both `--nproc-per-node`
//! and torchrun's older `--nproc_per_node` spelling work), then the program and its arguments.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Parser;

use crate::error::LaunchError;
use crate::logs::{parse_rank_filter, parse_std_spec, RankFilter, StdSpec};

#[derive(Debug, Parser)]
#[command(
    name = "commrun",
    version,
    about = "Start a distributed program: N workers on this node, each with torchrun's environment \
             (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT)",
    after_help = "\
Examples:
  commrun --nproc-per-node 4 target/release/02-allreduce
  commrun --standalone --nproc-per-node 4 -- python train.py --epochs 3

  # two nodes (or two shells on one machine), node 0's host serving the rendezvous:
  commrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --master-addr HOST0 PROGRAM
  commrun --nnodes 2 --node-rank 1 --nproc-per-node 4 --master-addr HOST0 PROGRAM

  # under Slurm, one commrun per node: nodes, node rank and master come from SLURM_* variables
  srun --ntasks-per-node=1 --ntasks=$SLURM_NNODES commrun --nproc-per-node 4 PROGRAM

  # start the 4 workers again (up to twice) if one fails; keep every worker's output in files,
  # show only local rank 0's on the console
  commrun --nproc-per-node 4 --max-restarts 2 --log-dir logs --tee 3 --local-ranks-filter 0 PROGRAM

Each line a worker prints is prefixed with its rank ([3]: ...) unless --no-prefix. When a worker
fails, the others get SIGTERM, then SIGKILL after --shutdown-timeout; then, with --max-restarts
left, all of them start again; else commrun exits with the failed worker's code (128 + signal if
it was killed) and prints the root cause."
)]
pub struct Cli {
    /// Workers on this node: a number, `gpu` (one per GPU), `cpu` (one per CPU core) or `auto`
    /// (one per GPU if there are GPUs, else one per core), as torchrun reads it.
    #[arg(long, alias = "nproc_per_node", value_name = "N", default_value = "1",
          value_parser = parse_nproc)]
    pub nproc_per_node: Nproc,

    /// Number of nodes [default: 1, or the srun step's node count under Slurm]. torchrun's
    /// elastic `MIN:MAX` ranges are accepted only when MIN = MAX.
    #[arg(long, value_name = "N", value_parser = parse_nnodes)]
    pub nnodes: Option<usize>,

    /// This node's rank, 0 to nnodes-1; node 0 hosts rank 0 and the rendezvous store
    /// [default: 0 on one node, SLURM_PROCID under srun; required otherwise].
    #[arg(long, alias = "node_rank", value_name = "N")]
    pub node_rank: Option<usize>,

    /// Host name or address of node 0 [default: 127.0.0.1 on one node, the first host of
    /// SLURM_JOB_NODELIST under srun].
    #[arg(long, alias = "master_addr", value_name = "HOST")]
    pub master_addr: Option<String>,

    /// Port of the rendezvous store on node 0 [default: 29500, or one derived from
    /// SLURM_JOB_ID under srun].
    #[arg(long, alias = "master_port", value_name = "PORT",
          value_parser = clap::value_parser!(u16).range(1..))]
    pub master_port: Option<u16>,

    /// `HOST[:PORT]` of node 0, instead of --master-addr and --master-port (port 29400 if not
    /// given, as torchrun).
    #[arg(long, alias = "rdzv_endpoint", value_name = "HOST[:PORT]",
          conflicts_with_all = ["master_addr", "master_port"])]
    pub rdzv_endpoint: Option<String>,

    /// Accepted for torchrun compatibility: `c10d` or `static`. commrun always uses the store
    /// that rank 0 serves at the endpoint, with fixed node ranks.
    #[arg(long, alias = "rdzv_backend", value_name = "NAME")]
    pub rdzv_backend: Option<String>,

    /// The run's id, as torchrun's: passed to the workers as TORCHELASTIC_RUN_ID and carried in
    /// every rendezvous hello, so a rank of another run on the same port is refused. Give every
    /// node the same one [default: Slurm's job and step under srun, a fresh one on one node].
    #[arg(long, alias = "rdzv_id", value_name = "ID")]
    pub rdzv_id: Option<String>,

    /// One node on this machine: master 127.0.0.1 and a free port.
    #[arg(long, conflicts_with_all = ["master_addr", "master_port", "rdzv_endpoint", "node_rank"])]
    pub standalone: bool,

    /// Print the workers' lines as they are, without the `[rank]: ` prefix.
    #[arg(long)]
    pub no_prefix: bool,

    /// When a worker fails, stop the worker group of this node and start it again, up to N
    /// times; each start's workers get TORCHELASTIC_RESTART_COUNT (0 the first) and
    /// TORCHELASTIC_MAX_RESTARTS. An interrupt never restarts. One node only.
    #[arg(long, alias = "max_restarts", value_name = "N", default_value_t = 0,
          allow_negative_numbers = true, value_parser = parse_restarts)]
    pub max_restarts: u32,

    /// Where --redirects and --tee write the workers' files:
    /// DIR/RUN_ID_XXXXXXXX/attempt_K/LOCAL_RANK/stdout.log and stderr.log [default: a new
    /// directory in the temporary folder, named on stderr].
    #[arg(long, alias = "log_dir", value_name = "DIR")]
    pub log_dir: Option<PathBuf>,

    /// Streams written to the log files instead of the console: 0 none, 1 stdout, 2 stderr,
    /// 3 both; for every worker, or per local rank (0:3,1:2).
    #[arg(short = 'r', long, value_name = "STD", default_value = "0",
          value_parser = parse_std_spec, allow_negative_numbers = true)]
    pub redirects: StdSpec,

    /// Streams written to the log files and to the console (values as --redirects).
    #[arg(short = 't', long, value_name = "STD", default_value = "0",
          value_parser = parse_std_spec, allow_negative_numbers = true)]
    pub tee: StdSpec,

    /// Only these local ranks' output reaches the console (e.g. 0, or 0,2); the others' still
    /// goes to their log files, if any.
    #[arg(long, alias = "local_ranks_filter", value_name = "RANKS",
          value_parser = parse_rank_filter)]
    pub local_ranks_filter: Option<RankFilter>,

    /// Seconds between SIGTERM and SIGKILL when stopping workers (torchrun's default is 30).
    #[arg(
        long,
        alias = "shutdown_timeout",
        value_name = "SECONDS",
        default_value_t = 5.0
    )]
    pub shutdown_timeout: f64,

    /// The program to start on every worker, then its arguments (after `--` if they could be
    /// read as commrun's own flags).
    #[arg(value_name = "PROGRAM", required = true, num_args = 1.., trailing_var_arg = true)]
    pub command: Vec<OsString>,
}

/// How many workers `--nproc-per-node` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nproc {
    Count(usize),
    Gpu,
    Cpu,
    Auto,
}

fn parse_nproc(value: &str) -> Result<Nproc, LaunchError> {
    match value {
        "gpu" => Ok(Nproc::Gpu),
        "cpu" => Ok(Nproc::Cpu),
        "auto" => Ok(Nproc::Auto),
        _ => match value.parse::<usize>() {
            Ok(0) => Err(LaunchError::NoWorkers),
            Ok(n) => Ok(Nproc::Count(n)),
            Err(_) => Err(LaunchError::NotAWorkerCount),
        },
    }
}

fn parse_restarts(value: &str) -> Result<u32, LaunchError> {
    value
        .trim()
        .parse()
        .map_err(|_| LaunchError::NotARestartCount)
}

fn parse_nnodes(value: &str) -> Result<usize, LaunchError> {
    let number = |s: &str| match s.trim().parse::<usize>() {
        Ok(0) => Err(LaunchError::NoNodes),
        Ok(n) => Ok(n),
        Err(_) => Err(LaunchError::NotANodeCount),
    };
    match value.split_once(':') {
        None => number(value),
        Some((min, max)) => {
            let (min, max) = (number(min)?, number(max)?);
            if min == max {
                Ok(min)
            } else {
                Err(LaunchError::ElasticNodes { min, max })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, String> {
        Cli::try_parse_from(std::iter::once("commrun").chain(args.iter().copied()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn torchrun_spellings_and_a_bare_program() {
        let cli = parse(&[
            "--nproc_per_node",
            "4",
            "--node_rank",
            "1",
            "prog",
            "--len",
            "3",
        ])
        .unwrap();
        assert_eq!(cli.nproc_per_node, Nproc::Count(4));
        assert_eq!(cli.node_rank, Some(1));
        assert_eq!(cli.command, ["prog", "--len", "3"]);
        let cli = parse(&["--nproc-per-node", "gpu", "--", "prog", "-n", "2"]).unwrap();
        assert_eq!(cli.nproc_per_node, Nproc::Gpu);
        assert_eq!(cli.command, ["prog", "-n", "2"]);
        // After the program, even commrun's own flags belong to the program.
        let cli = parse(&["prog", "--nnodes", "2", "--", "x"]).unwrap();
        assert_eq!(cli.command, ["prog", "--nnodes", "2", "--", "x"]);
        assert_eq!(cli.nnodes, None);
    }

    #[test]
    fn defaults_are_torchruns() {
        let cli = parse(&["prog"]).unwrap();
        assert_eq!(cli.nproc_per_node, Nproc::Count(1));
        assert_eq!((cli.nnodes, cli.node_rank), (None, None));
        assert!(!cli.no_prefix && !cli.standalone);
        assert_eq!(cli.max_restarts, 0);
        assert_eq!((cli.redirects.clone(), cli.tee.clone()), Default::default());
        assert_eq!((cli.log_dir, cli.local_ranks_filter), (None, None));
    }

    #[test]
    fn torchruns_restart_and_log_flags() {
        let cli = parse(&[
            "--max_restarts=2",
            "--log_dir",
            "logs",
            "-r",
            "0:1,1:2",
            "-t",
            "3",
            "--local_ranks_filter",
            "0,2",
            "prog",
        ])
        .unwrap();
        assert_eq!(cli.max_restarts, 2);
        assert_eq!(cli.log_dir.as_deref(), Some(std::path::Path::new("logs")));
        assert_eq!(cli.redirects, parse_std_spec("0:1,1:2").unwrap());
        assert_eq!(cli.tee, parse_std_spec("3").unwrap());
        assert_eq!(
            cli.local_ranks_filter,
            Some(parse_rank_filter("0,2").unwrap())
        );
        let cli = parse(&["--max-restarts", "1", "--redirects", "3", "--tee", "0", "p"]).unwrap();
        assert_eq!(cli.max_restarts, 1);
        for (args, expected) in [
            (
                ["--max-restarts", "-1"],
                "give a number of restarts, 0 or more",
            ),
            (
                ["--redirects", "7"],
                "\"7\" is not 0 (none), 1 (stdout), 2 (stderr) or 3",
            ),
            (["--tee", "0:9"], "\"9\" is not 0 (none)"),
            (["--tee", "-1"], "\"-1\" is not 0 (none)"),
            (["--local-ranks-filter", "a"], "\"a\" is not a local rank"),
        ] {
            let e = parse(&[args[0], args[1], "p"]).unwrap_err();
            assert!(e.contains(expected), "{args:?}: {e}");
        }
    }

    #[test]
    fn bad_values_are_named() {
        assert!(parse(&["--nproc-per-node", "0", "p"])
            .unwrap_err()
            .contains("at least one worker"));
        assert!(parse(&["--nproc-per-node", "many", "p"])
            .unwrap_err()
            .contains("gpu, cpu or auto"));
        assert_eq!(parse(&["--nnodes", "2:2", "p"]).unwrap().nnodes, Some(2));
        assert!(parse(&["--nnodes", "1:4", "p"])
            .unwrap_err()
            .contains("elastic ranges"));
        assert!(parse(&["--master-port", "0", "p"]).is_err());
        assert!(parse(&["--master-port", "70000", "p"]).is_err());
        assert!(parse(&["--standalone", "--master-addr", "h", "p"]).is_err());
        assert!(parse(&["--rdzv-endpoint", "h:1", "--master-port", "2", "p"]).is_err());
        assert!(parse(&["--nproc-per-node", "2"])
            .unwrap_err()
            .contains("PROGRAM"));
        assert!(parse(&["--bogus", "p"]).unwrap_err().contains("--bogus"));
    }
}
