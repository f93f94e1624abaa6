//! A job's settings: the job flags every program shares, declared once ([`JobArgs`], flattened by
//! the examples' [`LaunchArgs`] and by comm-bench), turned into one [`Settings`] value by one
//! constructor ([`JobArgs::settings`]) that the launch hands down. The rendezvous, the CPU
//! transports and the NCCL backend read their timeout, transport, algorithm, steps and trace
//! from it (through [`Job`](crate::job::Job)); nothing reads a setting back out of the store.
//!
//! This is the one room below the programs that knows the command line: the backend, transport
//! and algorithm types are plain enums ([`Named`]), and the flags map onto them here.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

use crate::backend::cpu::{self, Algo, CopyChoice, TransportChoice};
use crate::backend::BackendChoice;
use crate::collective::Collective;
use crate::error::{CommError, Result};
use crate::heartbeat::{self, Heartbeat};
use crate::named::Named;
use crate::topology::Topology;

/// How long any wait may take when `--timeout` is not given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The longest `--timeout` honoured (about 31 years): longer ones wait this long, which is
/// forever in practice. It bounds the flag's value only; a deadline too far for the clock is
/// [`Deadline`](crate::deadline::Deadline)'s to handle.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(1_000_000_000);

/// What a job runs with, decided once from the flags by [`JobArgs::settings`] and handed to
/// [`launch`](crate::launch), which gives it to the [`Job`](crate::job::Job) that every
/// communicator is built from. Tests may build one by hand from [`Settings::default`].
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Ranks to start when this program starts its own (`-n`); `None`: one per GPU, or
    /// [`DEFAULT_CPU_RANKS`](crate::launch::DEFAULT_CPU_RANKS).
    pub ranks: Option<usize>,
    /// Which backend runs the collectives (`--backend`).
    pub backend: BackendChoice,
    /// How CPU ranks move bytes (`--transport`).
    pub transport: TransportChoice,
    /// How CPU ranks that share memory move large messages (`--copy`): one copy or two.
    pub copy: CopyChoice,
    /// How long any wait may take: the rendezvous, connecting, every collective (`--timeout`).
    pub timeout: Duration,
    /// The CPU algorithm asked for (`--algo`), one that a collective the program runs has.
    pub algo: Option<Algo>,
    /// Whether communicators show every step of their CPU algorithms (`--steps`).
    pub steps: bool,
    /// Where the job's trace goes (`--trace`), if it records one.
    pub trace: Option<PathBuf>,
    /// Where rank 0 serves the store (`--master-addr`, `--master-port`).
    pub master: Master,
    /// How a silent peer is noticed (`--heartbeat`, `--heartbeat-misses`): the store's
    /// connections and every peer link are probed, and a peer unheard for the whole bound ends
    /// the job, naming it.
    pub heartbeat: Heartbeat,
}

impl Default for Settings {
    /// What the flags default to.
    fn default() -> Settings {
        Settings {
            ranks: None,
            backend: BackendChoice::default(),
            transport: TransportChoice::default(),
            copy: CopyChoice::default(),
            timeout: DEFAULT_TIMEOUT,
            algo: None,
            steps: false,
            trace: None,
            master: Master::default(),
            heartbeat: Heartbeat::default(),
        }
    }
}

/// `--timeout SECONDS` as a duration, at most [`MAX_TIMEOUT`]; zero, negative, infinite and NaN
/// values are usage errors.
pub fn timeout_flag(seconds: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(seconds.min(MAX_TIMEOUT.as_secs_f64()))
        .ok()
        .filter(|d| !d.is_zero() && seconds.is_finite())
        .ok_or_else(|| {
            CommError::Usage(format!(
                "--timeout {seconds}: give a positive, finite number of seconds"
            ))
        })
}

/// `--algo` for a program that runs `runs`: refused unless one of them has an algorithm of that
/// name ([`cpu::algos_of`]), naming those they have, rather than silently ignored.
pub fn algo_flag(algo: Option<Algo>, runs: &[Collective]) -> Result<Option<Algo>> {
    let Some(asked) = algo else { return Ok(None) };
    if runs.iter().any(|&c| cpu::algos_of(c).contains(&asked)) {
        return Ok(algo);
    }
    let has = |c: Collective| match cpu::algos_of(c) {
        [] => format!("{c} has one algorithm, no choice"),
        algos => {
            let names: Vec<&str> = algos.iter().map(|a| a.name()).collect();
            format!("{c} has {}", names.join(" or "))
        }
    };
    let mut runs = runs.to_vec();
    runs.dedup();
    let has: Vec<String> = runs.into_iter().map(has).collect();
    Err(CommError::Usage(match has.is_empty() {
        true => format!("--algo {}: this program runs no collective", asked.name()),
        false => format!(
            "--algo {}: no collective this program runs has it ({})",
            asked.name(),
            has.join("; ")
        ),
    }))
}

/// The job flags every program shares, the examples (through [`LaunchArgs`]) and comm-bench
/// alike: how CPU ranks move bytes, how long a wait may take, the algorithm, the trace, and
/// where rank 0 serves the store. A new job flag is a field here and a field of [`Settings`].
#[derive(Debug, Clone, clap::Args)]
// The struct's own doc comment would otherwise become the program's --help text.
#[command(about = None, long_about = None)]
pub struct JobArgs {
    /// How CPU ranks move bytes: shared memory within a host and TCP between hosts (auto), or
    /// one of them for every pair. NCCL picks its own.
    #[arg(long, value_name = "TRANSPORT", value_parser = choices(transport_help),
          default_value = TransportChoice::default().name())]
    pub transport: TransportChoice,

    /// How CPU ranks of one host move large messages: from registered buffers, which every
    /// rank of the host maps (as NCCL's registered buffers), one copy, the receiver reading the
    /// sender's buffer (cross-memory attach, as NCCL's P2P transport), or two through shared
    /// memory (as NCCL's SHM). auto takes what was measured fastest where every rank can.
    #[arg(long, value_name = "COPY", value_parser = choices(copy_help),
          default_value = CopyChoice::default().name())]
    pub copy: CopyChoice,

    /// Seconds any wait may take (rendezvous, a collective) before the job fails.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_TIMEOUT.as_secs_f64())]
    pub timeout: f64,

    /// The CPU backend's algorithm, as NCCL_ALGO chooses NCCL's (all_reduce: ring or direct;
    /// broadcast: tree or chain; all_gather, reduce_scatter: ring). One the program's collective
    /// does not have is refused [default: by size].
    #[arg(long, value_name = "NAME", value_parser = choices(algo_help))]
    pub algo: Option<Algo>,

    /// Record what every rank does into FILE, a Chrome trace (open it in ui.perfetto.dev, or
    /// draw it with `comm-bench timeline FILE`): a track per rank, a slice per collective call
    /// and, on the CPU backend, per send and receive, with arrows from sends to receives.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,

    /// Host where rank 0 serves the rendezvous store. With a launcher's MASTER_ADDR too, this
    /// flag wins, as torchrun's own flags win over its environment.
    #[arg(long, visible_alias = "master_addr", value_name = "HOST")]
    pub master_addr: Option<String>,

    /// Port of the rendezvous store [default: a free port when the program starts its own
    /// ranks; else MASTER_PORT, or 20000 + Slurm job id mod 20000]. Wins over MASTER_PORT.
    #[arg(long, visible_alias = "master_port", value_name = "PORT",
          value_parser = clap::value_parser!(u16).range(1..))]
    pub master_port: Option<u16>,

    /// Seconds of quiet after which every connection of the job (to the store, between ranks)
    /// is probed, and between probes: torchrun's keep-alive interval.
    #[arg(long, value_name = "SECONDS", default_value_t = heartbeat::DEFAULT_INTERVAL.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=heartbeat::MAX_KEEPALIVE_SECONDS))]
    pub heartbeat: u64,

    /// Heartbeats a peer may miss: one silent this many intervals (a lost node, a cut cable)
    /// ends the job, naming it, long before --timeout. torchrun's keep-alive count.
    #[arg(long, value_name = "N", default_value_t = heartbeat::DEFAULT_MISSES,
          value_parser = clap::value_parser!(u32).range(1..=heartbeat::MAX_KEEPALIVE_PROBES as i64))]
    pub heartbeat_misses: u32,
}

impl JobArgs {
    /// The job's [`Settings`] from these flags, for a program that runs the collectives `runs`
    /// (an `--algo` none of them has is refused): the one place flags become settings. The
    /// rank count, backend and steps are the defaults; [`LaunchArgs`] sets its own.
    pub fn settings(&self, runs: &[Collective]) -> Result<Settings> {
        Ok(Settings {
            transport: self.transport,
            copy: self.copy,
            timeout: timeout_flag(self.timeout)?,
            algo: algo_flag(self.algo, runs)?,
            trace: self.trace.clone(),
            master: Master::new(self.master_addr.as_deref(), self.master_port)?,
            heartbeat: Heartbeat {
                interval: Duration::from_secs(self.heartbeat),
                misses: self.heartbeat_misses,
            },
            ..Settings::default()
        })
    }
}

/// The flags of a program that starts its own ranks, as every example does: how many, on which
/// backend, whether to show the algorithm's steps, and the [`JobArgs`].
#[derive(Debug, Clone, clap::Args)]
#[command(about = None, long_about = None)]
pub struct LaunchArgs {
    /// Ranks to start on this machine [default: one per GPU, or 4 on the CPU backend].
    /// Ignored when a launcher (srun, torchrun, commrun) already started the ranks.
    #[arg(short = 'n', long, value_name = "N")]
    pub nproc_per_node: Option<usize>,

    /// Which backend runs the collectives: NCCL on GPUs, or the CPU.
    #[arg(long, value_name = "BACKEND", value_parser = choices(backend_help),
          default_value = BackendChoice::default().name())]
    pub backend: BackendChoice,

    /// The job flags every program shares.
    #[command(flatten)]
    pub job: JobArgs,

    /// Show every rank's buffer after each step of the algorithm, as grids (CPU backend; NCCL
    /// runs the steps inside one kernel, so only before and after show).
    #[arg(long)]
    pub steps: bool,
}

impl LaunchArgs {
    /// The job's [`Settings`] from these flags, for a program that runs the collectives `runs`:
    /// [`JobArgs::settings`] with this program's rank count, backend and steps.
    pub fn settings(&self, runs: &[Collective]) -> Result<Settings> {
        Ok(Settings {
            ranks: self.nproc_per_node,
            backend: self.backend,
            steps: self.steps,
            ..self.job.settings(runs)?
        })
    }
}

/// `--backend`'s parser, for a program that takes a list of backends (comm-bench).
pub fn backend_choices() -> impl TypedValueParser<Value = BackendChoice> {
    choices(backend_help)
}

/// A flag's parser for the values of `T`, each shown with its `help` in `--help`.
fn choices<T: Named>(help: fn(T) -> &'static str) -> impl TypedValueParser<Value = T> {
    let values = T::ALL
        .iter()
        .map(move |&v| PossibleValue::new(v.name()).help(help(v)));
    PossibleValuesParser::new(values)
        .map(|name| T::from_name(&name).expect("clap accepts only the names it was given"))
}

fn backend_help(b: BackendChoice) -> &'static str {
    match b {
        BackendChoice::Auto => "NCCL where a GPU and libnccl are usable, else the CPU",
        BackendChoice::Cpu => "The CPU backend, even where a GPU is present",
        BackendChoice::Nccl => "NCCL on GPUs; an error where it cannot run",
    }
}

fn transport_help(t: TransportChoice) -> &'static str {
    match t {
        TransportChoice::Auto => "Shared memory between ranks of one host, TCP between hosts",
        TransportChoice::Shm => {
            "Shared memory between every pair; an error where ranks do not share a host"
        }
        TransportChoice::Tcp => "TCP between every pair, even on one host (what Gloo does)",
    }
}

fn copy_help(c: CopyChoice) -> &'static str {
    match c {
        CopyChoice::Auto => {
            "Registered buffers where every rank shares one host and can open its peers' \
             memory, for calls from the size where they were measured to win (on the 2-core VM: \
             8 KiB, reduce_scatter 16 KiB, broadcast 64 KiB); smaller calls and other buffers \
             take one copy \
             (cross-memory attach) from the size where it was measured to win, else two copies \
             through the rings (there, the rings beat one copy at every size)"
        }
        CopyChoice::Single => {
            "One copy for every message: the receiver reads the sender's buffer itself \
             (`process_vm_readv`); an error where a pair cannot"
        }
        CopyChoice::Ring => {
            "Two copies for every message: into a ring of shared memory, and out of it"
        }
        CopyChoice::Registered => {
            "The communicator's buffers live in shared memory every rank of the host maps, and \
             a collective reads its peers' buffers where they lie: one copy per byte, no \
             message; an error where the ranks do not share one host"
        }
    }
}

fn algo_help(a: Algo) -> &'static str {
    match a {
        Algo::Ring => {
            "all_reduce: a reduce-scatter then an all-gather around the ring, 2(n-1) steps each \
             moving 1/n of the buffer (chosen above 256 KiB, or on more than 8 ranks)"
        }
        Algo::Direct => {
            "all_reduce: every rank sends its whole buffer to every other and reduces all n, one \
             step (chosen up to 256 KiB on up to 8 ranks)"
        }
        Algo::Tree => {
            "broadcast: a binomial tree, log2(n) rounds of whole buffers (chosen up to 4 MiB)"
        }
        Algo::Chain => {
            "broadcast: a pipelined chain, each rank forwarding a segment while the next \
             arrives (chosen above 4 MiB)"
        }
    }
}

/// Where rank 0 serves the rendezvous store, as the flags said (`--master-addr`/`--master-port`,
/// or their underscore spellings), checked. Unset, a program that starts its own ranks picks
/// 127.0.0.1 and a free port, and a rank started by a launcher reads `MASTER_ADDR`/`MASTER_PORT`
/// (or Slurm's host list and job id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Master {
    /// The host, trimmed, never empty.
    pub addr: Option<String>,
    /// The port, never 0.
    pub port: Option<u16>,
}

impl Master {
    /// The flags' values, checked: an empty host is a usage error.
    pub fn new(addr: Option<&str>, port: Option<u16>) -> Result<Master> {
        let addr = match addr.map(str::trim) {
            Some("") => return Err(CommError::Usage("--master-addr is empty".into())),
            addr => addr.map(str::to_string),
        };
        Ok(Master { addr, port })
    }

    /// `topology` with the flags applied: a flag wins over what the environment said, and
    /// rank 0 says so on stderr when they differ. Under torchrun's agent store the store is the
    /// agent's, at MASTER_ADDR:MASTER_PORT, so a flag that points elsewhere is an error.
    pub fn apply(&self, mut topology: Topology) -> Result<Topology> {
        let mut notes = Vec::new();
        if let Some(addr) = self.addr.as_deref() {
            if addr != topology.master_addr {
                notes.push(format!(
                    "--master-addr {addr} wins over MASTER_ADDR={}",
                    topology.master_addr
                ));
                topology.master_addr = addr.to_string();
            }
        }
        if let Some(port) = self.port {
            if port != topology.master_port {
                notes.push(format!(
                    "--master-port {port} wins over the environment's port {} (MASTER_PORT, or \
                     Slurm's job id)",
                    topology.master_port
                ));
                topology.master_port = port;
            }
        }
        if notes.is_empty() {
            return Ok(topology);
        }
        if matches!(topology.store, crate::topology::StoreHost::Agent { .. }) {
            return Err(CommError::Usage(format!(
                "{}: but torchrun's agent serves this job's store at MASTER_ADDR:MASTER_PORT and \
                 every worker must join it; give torchrun --master_addr/--master_port instead",
                notes.join("; ")
            )));
        }
        if topology.rank == 0 {
            eprintln!(
                "note: {} (the flag wins, as torchrun's flags win over its environment)",
                notes.join("; ")
            );
        }
        Ok(topology)
    }

    /// For ranks this program starts itself: the flags' host and port, checked now so that a
    /// busy port or a foreign host is one clear error instead of a rank's failure (or a wait).
    /// Unset, 127.0.0.1 and no port (the plan picks a free one).
    pub(crate) fn for_own_ranks(&self) -> Result<(String, Option<u16>)> {
        let addr = self.addr.as_deref().unwrap_or("127.0.0.1");
        let ip = std::net::ToSocketAddrs::to_socket_addrs(&(addr, 0))
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                CommError::Usage(format!(
                    "--master-addr {addr}: no such host (it does not resolve)"
                ))
            })?
            .ip();
        // Rank 0 runs here, so the store's host must be this machine.
        std::net::TcpListener::bind((ip, 0)).map_err(|e| {
            CommError::Usage(format!(
                "--master-addr {addr} ({ip}) is not an address of this machine ({e}); the ranks \
                 start here and rank 0 serves the store here"
            ))
        })?;
        if let Some(port) = self.port {
            std::net::TcpListener::bind(("0.0.0.0", port)).map_err(|e| {
                CommError::Usage(format!(
                    "--master-port {port} is taken on this machine ({e}): pick another, or \
                     leave the flag out and a free port is picked"
                ))
            })?;
        }
        Ok((addr.to_string(), self.port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::StoreHost;

    fn launched(store: StoreHost) -> Topology {
        let mut t = Topology::by_hand(1, 2, "node0", 29500).unwrap();
        t.store = store;
        t
    }

    #[test]
    fn a_master_flag_wins_over_the_environment() {
        let flags = Master {
            addr: Some("node1".into()),
            port: Some(29502),
        };
        let t = flags.apply(launched(StoreHost::RankZero)).unwrap();
        assert_eq!((t.master_addr.as_str(), t.master_port), ("node1", 29502));
        // No flags, or flags that agree: the environment's place, unchanged.
        let same = Master {
            addr: Some("node0".into()),
            port: Some(29500),
        };
        for flags in [Master::default(), same] {
            let t = flags.apply(launched(StoreHost::RankZero)).unwrap();
            assert_eq!((t.master_addr.as_str(), t.master_port), ("node0", 29500));
        }
    }

    #[test]
    fn under_torchruns_agent_store_a_contradicting_flag_is_an_error() {
        let flags = Master {
            addr: None,
            port: Some(29502),
        };
        let e = flags
            .apply(launched(StoreHost::Agent { attempt: 0 }))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--master-port 29502") && e.contains("torchrun's agent"),
            "{e}"
        );
        let agreeing = Master {
            addr: None,
            port: Some(29500),
        };
        assert!(agreeing
            .apply(launched(StoreHost::Agent { attempt: 0 }))
            .is_ok());
    }

    #[test]
    fn own_ranks_refuse_a_busy_port_and_a_foreign_host() {
        let busy = std::net::TcpListener::bind(("0.0.0.0", 0)).unwrap();
        let port = busy.local_addr().unwrap().port();
        let flags = Master {
            addr: None,
            port: Some(port),
        };
        let e = flags.for_own_ranks().unwrap_err().to_string();
        assert!(e.contains(&format!("--master-port {port} is taken")), "{e}");
        // 192.0.2.1 (TEST-NET-1) is no address of this machine.
        let foreign = Master {
            addr: Some("192.0.2.1".into()),
            port: None,
        };
        let e = foreign.for_own_ranks().unwrap_err().to_string();
        assert!(e.contains("not an address of this machine"), "{e}");
        let fine = Master::default().for_own_ranks().unwrap();
        assert_eq!(fine, ("127.0.0.1".to_string(), None));
    }

    #[test]
    fn an_algorithm_no_collective_of_the_program_has_is_refused_naming_theirs() {
        let e = algo_flag(Some(Algo::Ring), &[Collective::Broadcast]).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("--algo ring") && e.contains("broadcast has tree or chain"),
            "{e}"
        );
        let e = algo_flag(Some(Algo::Tree), &[Collective::Reduce]).unwrap_err();
        assert!(e.to_string().contains("reduce has one algorithm"), "{e}");
        // One collective of several that has it is enough (comm-bench --collectives all).
        let all = Collective::ALL;
        for algo in [Algo::Ring, Algo::Direct, Algo::Tree, Algo::Chain] {
            assert_eq!(algo_flag(Some(algo), &all).unwrap(), Some(algo));
        }
        assert_eq!(algo_flag(None, &[Collective::Reduce]).unwrap(), None);
    }
}
