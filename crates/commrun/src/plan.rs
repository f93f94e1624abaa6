//! From the command line (and, under srun, Slurm's variables) to a [`SpawnPlan`]: how many
//! workers, which node this is, where node 0 serves the rendezvous store. Every contradiction
//! is refused here with a message that says what to change, before anything starts.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use comm_core::spawn::SpawnPlan;
use comm_core::topology::{Launcher, Topology, DEFAULT_MASTER_PORT};

use crate::cli::{Cli, Nproc};
use crate::error::LaunchError;
use crate::logs::OutputPlan;

/// torchrun's port when `--rdzv-endpoint` names only a host.
pub const DEFAULT_RDZV_PORT: u16 = 29400;

/// What the machine offers, looked up once (tests pass their own).
#[derive(Debug, Clone)]
pub struct Machine {
    pub gpus: usize,
    pub cpus: usize,
    /// The srun task this commrun is, if it is one.
    pub slurm: Option<Topology>,
    /// A free port, for `--standalone`.
    pub free_port: fn() -> comm_core::Result<u16>,
}

impl Machine {
    pub fn probe() -> Result<Machine, LaunchError> {
        let slurm = match Topology::from_env() {
            Ok(Some(t)) if t.launcher == Launcher::Slurm => Some(t),
            Ok(_) => None,
            Err(e) => return Err(LaunchError::Slurm(e)),
        };
        Ok(Machine {
            gpus: gpu_count(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            slurm,
            free_port: comm_core::spawn::free_port,
        })
    }
}

/// GPUs this process may use: CUDA_VISIBLE_DEVICES when set (Slurm's `--gres` sets it, and CUDA
/// honours it), else every GPU the NVIDIA driver lists.
fn gpu_count() -> usize {
    if let Some(list) = std::env::var_os("CUDA_VISIBLE_DEVICES") {
        // CUDA stops at the first entry that is not a device.
        return list
            .to_string_lossy()
            .split(',')
            .map(str::trim)
            .take_while(|d| !d.is_empty() && !d.starts_with('-') && *d != "NoDevFiles")
            .count();
    }
    std::fs::read_dir("/proc/driver/nvidia/gpus").map_or(0, |d| d.count())
}

/// A plan, where its numbers came from (for the one line commrun prints under srun), how often
/// to restart it and where its output goes.
#[derive(Debug)]
pub struct Resolved {
    pub plan: SpawnPlan,
    /// Set when the node layout came from Slurm's variables.
    pub from_slurm: bool,
    /// `--max-restarts`: starts of the worker group after the first one fails.
    pub max_restarts: u32,
    /// `--log-dir`, `--redirects`, `--tee`, `--local-ranks-filter`.
    pub output: OutputPlan,
}

impl Resolved {
    pub fn world_size(&self) -> usize {
        self.plan.nnodes * self.plan.nproc_per_node
    }
}

pub fn resolve(cli: &Cli, machine: &Machine) -> Result<Resolved, LaunchError> {
    let nproc = nproc_per_node(cli, machine)?;
    let grace = shutdown_grace(cli)?;
    if let Some(backend) = &cli.rdzv_backend {
        if backend != "c10d" && backend != "static" {
            return Err(LaunchError::RdzvBackend(backend.clone()));
        }
    }
    // The srun task's place, unless the flags say otherwise (or --standalone asks for none).
    let slurm = machine.slurm.as_ref().filter(|_| !cli.standalone);
    let (nnodes, node_rank) = node_place(cli, slurm)?;
    // Refused before anything starts (spawn::run would refuse too, after the checks below).
    let flag = if nnodes > 1 {
        "--nproc-per-node × --nnodes"
    } else {
        "--nproc-per-node"
    };
    comm_core::spawn::check_ranks(flag, nproc, nnodes)?;
    if node_rank >= nnodes {
        return Err(LaunchError::NodeRankOutOfRange { node_rank, nnodes });
    }
    check_restarts(cli.max_restarts, nnodes)?;
    let output = OutputPlan {
        log_dir: cli.log_dir.clone(),
        redirects: cli.redirects.clone(),
        tee: cli.tee.clone(),
        filter: cli.local_ranks_filter.clone(),
    };
    output.check(nproc)?;

    let (master_addr, master_port) = master(cli, machine, slurm, nnodes)?;
    let program = find_program(&cli.command[0])?;
    let args: Vec<OsString> = cli.command[1..].to_vec();
    let run_id = run_id(cli, slurm, nnodes);
    Ok(Resolved {
        plan: SpawnPlan {
            program,
            args,
            nproc_per_node: nproc,
            nnodes,
            node_rank,
            master_addr,
            master_port,
            prefix_output: !cli.no_prefix,
            grace,
            run_id,
        },
        from_slurm: slurm.is_some(),
        max_restarts: cli.max_restarts,
        output,
    })
}

/// Ranks on this node: `--nproc-per-node` as a number, or read off the machine.
fn nproc_per_node(cli: &Cli, machine: &Machine) -> Result<usize, LaunchError> {
    Ok(match cli.nproc_per_node {
        Nproc::Count(n) => n,
        Nproc::Cpu => machine.cpus,
        Nproc::Gpu if machine.gpus == 0 => return Err(LaunchError::NoGpu),
        Nproc::Gpu => machine.gpus,
        Nproc::Auto if machine.gpus > 0 => machine.gpus,
        Nproc::Auto => machine.cpus,
    })
}

/// `--shutdown-timeout` as a duration.
fn shutdown_grace(cli: &Cli) -> Result<Duration, LaunchError> {
    Duration::try_from_secs_f64(cli.shutdown_timeout)
        .map_err(|_| LaunchError::ShutdownTimeout(cli.shutdown_timeout))
}

/// How many nodes, and which one this is: from the flags, or the srun task's place.
fn node_place(cli: &Cli, slurm: Option<&Topology>) -> Result<(usize, usize), LaunchError> {
    if let Some(task) = slurm {
        if task.local_world_size != 1 && cli.nnodes.is_none() && cli.node_rank.is_none() {
            return Err(LaunchError::TasksPerNode {
                tasks: task.local_world_size,
                node: task.node_rank,
            });
        }
    }
    let nnodes = cli.nnodes.or(slurm.map(|t| t.world_size)).unwrap_or(1);
    if cli.standalone && nnodes > 1 {
        return Err(LaunchError::StandaloneNodes(nnodes));
    }
    let node_rank = match (cli.node_rank, slurm) {
        (Some(r), _) => r,
        (None, Some(task)) => task.rank,
        (None, None) if nnodes == 1 => 0,
        (None, None) => return Err(LaunchError::NodeRankNeeded { nnodes }),
    };
    Ok((nnodes, node_rank))
}

/// Where rank 0 serves the store: `--standalone`'s free local port, or the flags', the
/// endpoint's or Slurm's address and port.
fn master(
    cli: &Cli,
    machine: &Machine,
    slurm: Option<&Topology>,
    nnodes: usize,
) -> Result<(String, u16), LaunchError> {
    let endpoint = cli
        .rdzv_endpoint
        .as_deref()
        .map(parse_endpoint)
        .transpose()?;
    Ok(if cli.standalone {
        ("127.0.0.1".to_string(), (machine.free_port)()?)
    } else {
        let addr = cli
            .master_addr
            .clone()
            .or_else(|| endpoint.as_ref().map(|e| e.0.clone()))
            .or_else(|| slurm.map(|t| t.master_addr.clone()));
        let addr = match addr {
            Some(a) if a.trim().is_empty() => return Err(LaunchError::EmptyMasterAddr),
            Some(a) => a.trim().to_string(),
            None if nnodes == 1 => "127.0.0.1".to_string(),
            None => return Err(LaunchError::MasterAddrNeeded { nnodes }),
        };
        let port = cli
            .master_port
            .or(endpoint.as_ref().map(|e| e.1))
            .or(slurm.map(|t| t.master_port))
            .unwrap_or(DEFAULT_MASTER_PORT);
        (addr, port)
    })
}

fn run_id(cli: &Cli, slurm: Option<&Topology>, nnodes: usize) -> Option<String> {
    // The run the workers belong to (TORCHELASTIC_RUN_ID), as torchrun passes --rdzv-id: given,
    // or Slurm's job and step, or a fresh one where this commrun is the whole job. Several nodes
    // started by hand without --rdzv-id share none (each would make up its own).
    match (&cli.rdzv_id, slurm) {
        (Some(id), _) if !id.trim().is_empty() => Some(id.trim().to_string()),
        (_, Some(task)) => task.run_id.clone(),
        _ if nnodes == 1 => Some(comm_core::topology::fresh_run_id()),
        _ => None,
    }
}

/// Restarting a worker group on one node of several would need every node's commrun to stop
/// and restart together, and they have no way to agree: refused.
fn check_restarts(max_restarts: u32, nnodes: usize) -> Result<(), LaunchError> {
    if max_restarts > 0 && nnodes > 1 {
        return Err(LaunchError::RestartsOnNodes {
            max_restarts,
            nnodes,
        });
    }
    Ok(())
}

/// On node 0, rank 0 will serve the store at `port`: refuse now if something holds it.
pub fn check_port_free(port: u16) -> Result<(), LaunchError> {
    match std::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, port)) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(LaunchError::PortInUse(port)),
        // Anything else (no permission for a low port, …) is for rank 0 to report.
        _ => Ok(()),
    }
}

/// `host`, `host:port` or `[v6]:port`.
fn parse_endpoint(endpoint: &str) -> Result<(String, u16), LaunchError> {
    let bad = || LaunchError::BadEndpoint(endpoint.into());
    let (host, port) = if let Some(rest) = endpoint.strip_prefix('[') {
        let (host, rest) = rest.split_once(']').ok_or_else(bad)?;
        match rest {
            "" => (host, None),
            _ => (host, Some(rest.strip_prefix(':').ok_or_else(bad)?)),
        }
    } else {
        match endpoint.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (endpoint, None),
        }
    };
    if host.trim().is_empty() {
        return Err(bad());
    }
    let port = match port {
        None => DEFAULT_RDZV_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(LaunchError::BadEndpointPort {
                    endpoint: endpoint.into(),
                    port: p.into(),
                })
            }
        },
    };
    Ok((host.trim().to_string(), port))
}

/// The program as a path, checked now so a typo is one clear line, not one error per worker.
fn find_program(program: &OsString) -> Result<PathBuf, LaunchError> {
    let path = Path::new(program);
    if program.is_empty() {
        return Err(LaunchError::NoProgram);
    }
    // Errors name the program as given (`prog`), not the PATH entry that was tried.
    let check = |p: &Path| -> Result<(), LaunchError> {
        let meta = std::fs::metadata(p).map_err(|source| LaunchError::ProgramUnreadable {
            path: path.to_path_buf(),
            source,
        })?;
        if meta.is_dir() {
            return Err(LaunchError::ProgramIsDirectory(path.to_path_buf()));
        }
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o111 == 0 {
            return Err(LaunchError::ProgramNotExecutable(path.to_path_buf()));
        }
        Ok(())
    };
    if program.to_string_lossy().contains('/') {
        check(path)?;
        return Ok(path.to_path_buf());
    }
    let search = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&search) {
        let candidate = dir.join(path);
        if candidate.is_file() && check(&candidate).is_ok() {
            return Ok(path.to_path_buf());
        }
    }
    Err(LaunchError::ProgramNotFound(path.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn machine(slurm: Option<Topology>) -> Machine {
        Machine {
            gpus: 0,
            cpus: 6,
            slurm,
            free_port: || Ok(4242),
        }
    }

    fn resolve_args(args: &[&str], machine: &Machine) -> Result<Resolved, String> {
        let cli = Cli::try_parse_from(
            std::iter::once("commrun")
                .chain(args.iter().copied())
                .chain(["sh", "-c", "true"]),
        )
        .map_err(|e| e.to_string())?;
        resolve(&cli, machine).map_err(|e| e.to_string())
    }

    fn plan(args: &[&str]) -> SpawnPlan {
        resolve_args(args, &machine(None)).unwrap().plan
    }

    fn error(args: &[&str]) -> String {
        resolve_args(args, &machine(None)).unwrap_err()
    }

    #[test]
    fn one_node_defaults() {
        let p = plan(&[]);
        assert_eq!((p.nproc_per_node, p.nnodes, p.node_rank), (1, 1, 0));
        assert_eq!(
            (p.master_addr.as_str(), p.master_port),
            ("127.0.0.1", 29500)
        );
        assert!(p.prefix_output);
        assert_eq!(p.args, ["-c", "true"]);
        assert_eq!(plan(&["--nproc-per-node", "cpu"]).nproc_per_node, 6);
        assert_eq!(plan(&["--nproc-per-node", "auto"]).nproc_per_node, 6);
        assert!(error(&["--nproc-per-node", "gpu"]).contains("no GPU"));
        let p = plan(&["--standalone", "--nproc-per-node", "3"]);
        assert_eq!((p.master_addr.as_str(), p.master_port), ("127.0.0.1", 4242));
        assert!(!plan(&["--no-prefix"]).prefix_output);
    }

    #[test]
    fn several_nodes_need_an_address_and_a_node_rank() {
        let e = error(&["--nnodes", "2", "--node-rank", "1"]);
        assert!(e.contains("--nnodes 2 needs the address of node 0"), "{e}");
        let e = error(&["--nnodes", "2", "--master-addr", "h"]);
        assert!(e.contains("--nnodes 2 needs --node-rank"), "{e}");
        let e = error(&["--nnodes", "2", "--node-rank", "2", "--master-addr", "h"]);
        assert!(e.contains("--node-rank 2 but --nnodes 2"), "{e}");
        let e = error(&["--standalone", "--nnodes", "2"]);
        assert!(e.contains("--standalone is one node"), "{e}");
        let p = plan(&[
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--rdzv-endpoint",
            "h0:1234",
        ]);
        assert_eq!(
            (p.master_addr.as_str(), p.master_port, p.node_rank),
            ("h0", 1234, 1)
        );
        let p = plan(&["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h0"]);
        assert_eq!(p.master_port, DEFAULT_RDZV_PORT);
        let p = plan(&["--nnodes=2", "--node-rank=0", "--rdzv-endpoint=[::1]:7"]);
        assert_eq!((p.master_addr.as_str(), p.master_port), ("::1", 7));
        assert!(error(&["--rdzv-endpoint", "h:x"]).contains("not a port"));
        assert!(error(&["--rdzv-backend", "etcd"]).contains("--rdzv-backend etcd"));
        assert!(error(&["--shutdown-timeout=-1"]).contains("--shutdown-timeout"));
    }

    #[test]
    fn restarts_on_one_node_only_and_log_ranks_this_node_has() {
        assert_eq!(
            resolve_args(&["--max-restarts", "3"], &machine(None))
                .unwrap()
                .max_restarts,
            3
        );
        let e = error(&[
            "--max-restarts",
            "1",
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "--master-addr",
            "h",
        ]);
        assert!(e.starts_with("--max-restarts 1 with 2 nodes:"), "{e}");
        let two = resolve_args(
            &["--nnodes", "2", "--node-rank", "1", "--master-addr", "h"],
            &machine(None),
        );
        assert_eq!(two.unwrap().max_restarts, 0);
        // Under srun the node count comes from Slurm, and is refused the same way.
        let e =
            resolve_args(&["--max-restarts", "1"], &machine(Some(srun_task(0, 2, 1)))).unwrap_err();
        assert!(e.contains("with 2 nodes"), "{e}");
        let e = error(&["--nproc-per-node", "2", "--redirects", "0:3,2:3"]);
        assert!(e.contains("--redirects names local rank 2"), "{e}");
        let r = resolve_args(
            &["--nproc-per-node", "2", "--tee", "1:3", "--log-dir", "d"],
            &machine(None),
        )
        .unwrap();
        assert_eq!(r.output.log_dir.as_deref(), Some(Path::new("d")));
    }

    fn srun_task(rank: usize, ntasks: usize, per_node: usize) -> Topology {
        Topology {
            rank,
            world_size: ntasks,
            local_rank: 0,
            local_world_size: per_node,
            node_rank: rank,
            master_addr: "lrdn0101".into(),
            master_port: 21234,
            launcher: Launcher::Slurm,
            run_id: Some("slurm-7.0".into()),
            socket_ifname: None,
            store: comm_core::topology::StoreHost::RankZero,
        }
    }

    #[test]
    fn under_srun_the_layout_comes_from_slurm() {
        let m = machine(Some(srun_task(1, 2, 1)));
        let r = resolve_args(&["--nproc-per-node", "4"], &m).unwrap();
        assert!(r.from_slurm);
        let p = r.plan;
        assert_eq!((p.nnodes, p.node_rank, p.nproc_per_node), (2, 1, 4));
        assert_eq!((p.master_addr.as_str(), p.master_port), ("lrdn0101", 21234));
        // Flags win over Slurm's variables.
        let p = resolve_args(&["--master-port", "5000", "--master-addr", "x"], &m)
            .unwrap()
            .plan;
        assert_eq!((p.master_addr.as_str(), p.master_port), ("x", 5000));
        // --standalone ignores Slurm.
        let r = resolve_args(&["--standalone"], &m).unwrap();
        assert!(!r.from_slurm);
        assert_eq!(r.plan.nnodes, 1);
        // Four tasks per node: four launchers per node is a mistake.
        let m = machine(Some(srun_task(1, 8, 4)));
        let e = resolve_args(&[], &m).unwrap_err();
        assert!(e.contains("--ntasks-per-node=1"), "{e}");
    }

    #[test]
    fn programs_are_checked_before_anything_starts() {
        let error = |program: &str| find_program(&program.into()).unwrap_err().to_string();
        let e = error("no-such-program-here");
        assert_eq!(
            e,
            "program no-such-program-here not found on PATH (give a path such as \
             ./no-such-program-here or target/release/no-such-program-here)"
        );
        let e = error("./no/such/file");
        assert!(e.contains("No such file"), "{e}");
        let e = error("/");
        assert!(e.contains("is a directory"), "{e}");
        let plain = std::env::temp_dir().join(format!("commrun-plain-{}", std::process::id()));
        std::fs::write(&plain, "not a program").unwrap();
        let e = find_program(&plain.clone().into_os_string())
            .unwrap_err()
            .to_string();
        std::fs::remove_file(&plain).unwrap();
        assert!(e.contains("not executable"), "{e}");
        assert_eq!(find_program(&"sh".into()).unwrap(), Path::new("sh"));
    }
}
