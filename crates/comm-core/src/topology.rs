//! Who am I? Rank, world size, local rank and the master's address, read from the environment the
//! way torchrun and Slurm's `srun` set it. This is the only module that reads the environment.
//!
//! Slurm's compressed host lists and task counts are parsed in [`nodelist`]; this machine's name
//! and interface addresses are [`crate::host`]'s.

pub mod nodelist;

use crate::error::{CommError, Result};

pub use nodelist::{expand_nodelist, first_host, tasks_on_node, MAX_NODELIST_HOSTS};

/// Port used when neither MASTER_PORT nor a Slurm job id says otherwise (torchrun's default).
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// The most ranks in one job: beyond, a world size is a typo (or a `WORLD_SIZE` gone wrong),
/// not a job, and every rank would allocate tables of that size.
pub const MAX_WORLD_SIZE: usize = 65536;

/// The most ranks started on one node. Each is a process with its threads, sockets and pipes;
/// past this the node runs out of those long before the job does anything useful.
pub const MAX_LOCAL_RANKS: usize = 1024;

/// torchrun's variable for the run a worker belongs to (its `--rdzv-id`).
pub const RUN_ID_VAR: &str = "TORCHELASTIC_RUN_ID";

/// Who started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// RANK, WORLD_SIZE, … as torchrun, commrun or our own self-spawn set them.
    Torchrun,
    /// SLURM_PROCID, SLURM_NTASKS, … as a `srun` task sees them.
    Slurm,
}

/// This rank's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// This process's rank in the whole job, 0..world_size.
    pub rank: usize,
    /// Ranks in the whole job.
    pub world_size: usize,
    /// Rank among the processes on this node: picks the GPU.
    pub local_rank: usize,
    /// Ranks on this node.
    pub local_world_size: usize,
    /// Which node (torchrun's GROUP_RANK, Slurm's SLURM_NODEID).
    pub node_rank: usize,
    /// Where rank 0 serves the rendezvous store.
    pub master_addr: String,
    /// The port the store listens on.
    pub master_port: u16,
    /// Whose variables this was read from.
    pub launcher: Launcher,
    /// Which run this rank belongs to, so a rank of another job that finds the same port is
    /// refused: torchrun's `TORCHELASTIC_RUN_ID` (its `--rdzv-id`; commrun and self-spawn set it
    /// too), or Slurm's job and step under srun. None for ranks started by hand.
    pub run_id: Option<String>,
    /// The network interface the CPU backend's peer links listen on, from
    /// [`SOCKET_IFNAME_VAR`] as Gloo reads it; None: the address this rank reaches the store
    /// from.
    pub socket_ifname: Option<String>,
    /// Who serves the rendezvous store at MASTER_ADDR:MASTER_PORT.
    pub store: StoreHost,
}

/// Who serves the rendezvous store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreHost {
    /// Rank 0, for the job (self-spawn, commrun, srun, torchrun told not to share its store).
    RankZero,
    /// torchrun's agent on node 0 (`TORCHELASTIC_USE_AGENT_STORE=True`): every rank is a client,
    /// and this job's keys live under `/worker/attempt_<attempt>`, torch's own worker prefix, so a
    /// restarted worker group (`TORCHELASTIC_RESTART_COUNT`) meets under fresh keys.
    Agent {
        /// The worker group's attempt, 0 first.
        attempt: usize,
    },
}

impl StoreHost {
    /// The namespace this job's keys live under in the store ("" for rank 0's own store).
    pub fn namespace(&self) -> String {
        match self {
            StoreHost::RankZero => String::new(),
            StoreHost::Agent { attempt } => format!("/worker/attempt_{attempt}"),
        }
    }
}

/// torchrun's variable saying its agent serves the store the workers should use.
pub const AGENT_STORE_VAR: &str = "TORCHELASTIC_USE_AGENT_STORE";
/// torchrun's variable for which attempt of the worker group this is (0 first).
pub const RESTART_COUNT_VAR: &str = "TORCHELASTIC_RESTART_COUNT";

/// Names the interface for the CPU backend's TCP links, as it does for Gloo's (`ib0`, `eth0`).
pub const SOCKET_IFNAME_VAR: &str = "GLOO_SOCKET_IFNAME";

impl Topology {
    /// Reads the process environment. `Ok(None)` means no launcher set a rank: the program should
    /// spawn its own ranks.
    pub fn from_env() -> Result<Option<Topology>> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Same as [`Topology::from_env`], reading variables through `var` (tests pass a map).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Topology>> {
        if var("RANK").is_some() {
            return torchrun(&var).map(Some);
        }
        // A batch script sees SLURM_PROCID=0 too; only a task started by srun has a step id.
        if var("SLURM_PROCID").is_some() && var("SLURM_STEP_ID").is_some() {
            return slurm(&var).map(Some);
        }
        Ok(None)
    }

    /// A rank placed by hand, one per host, as the course starts two nodes:
    /// `--world-size 2 --rank 1 --master-addr 10.0.0.1 --master-port 29502`.
    pub fn by_hand(
        rank: usize,
        world_size: usize,
        master_addr: &str,
        master_port: u16,
    ) -> Result<Topology> {
        // The same check as for the variables, reported as the flags' usage error.
        check_below("--rank", rank, "--world-size", world_size).map_err(|e| match e {
            CommError::Env { message, .. } => CommError::Usage(message),
            other => other,
        })?;
        if master_port == 0 {
            return Err(CommError::Usage(
                "--master-port 0: give the port rank 0 listens on".into(),
            ));
        }
        Ok(Topology {
            rank,
            world_size,
            local_rank: 0,
            local_world_size: 1,
            node_rank: rank,
            master_addr: master_addr.to_string(),
            master_port,
            launcher: Launcher::Torchrun,
            run_id: None,
            socket_ifname: socket_ifname(&|name| std::env::var(name).ok()),
            store: StoreHost::RankZero,
        })
    }

    /// The environment a launcher gives one local worker: the variables torchrun sets.
    pub fn worker_env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("RANK", self.rank.to_string()),
            ("WORLD_SIZE", self.world_size.to_string()),
            ("LOCAL_RANK", self.local_rank.to_string()),
            ("LOCAL_WORLD_SIZE", self.local_world_size.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
        ];
        if let Some(run_id) = &self.run_id {
            env.push((RUN_ID_VAR, run_id.clone()));
        }
        // Rank 0 serves the store for ranks we start, whatever the environment we inherited
        // says (a program started under torchrun may start ranks of its own).
        env.push((AGENT_STORE_VAR, "False".into()));
        env
    }
}

/// Reads a number, naming the variable when it is missing or not a number.
fn number(var: &impl Fn(&str) -> Option<String>, name: &str, hint: &str) -> Result<usize> {
    let value =
        var(name).ok_or_else(|| CommError::env(name, format!("{name} is not set; {hint}")))?;
    value
        .trim()
        .parse()
        .map_err(|_| CommError::env(name, format!("{name}={value:?} is not a whole number")))
}

fn optional_number(var: &impl Fn(&str) -> Option<String>, name: &str) -> Result<Option<usize>> {
    match var(name) {
        None => Ok(None),
        Some(_) => number(var, name, "").map(Some),
    }
}

fn port(var: &impl Fn(&str) -> Option<String>) -> Result<Option<u16>> {
    match var("MASTER_PORT") {
        None => Ok(None),
        Some(value) => match value.trim().parse::<u16>() {
            Ok(p) if p > 0 => Ok(Some(p)),
            _ => Err(CommError::env(
                "MASTER_PORT",
                format!("MASTER_PORT={value:?} is not a port number (1-65535)"),
            )),
        },
    }
}

fn check_below(name: &str, value: usize, limit_name: &str, limit: usize) -> Result<()> {
    if limit == 0 {
        return Err(CommError::env(
            limit_name,
            format!("{limit_name}=0: a job needs at least one rank"),
        ));
    }
    if value >= limit {
        return Err(CommError::env(
            name,
            format!("{name}={value} but {limit_name}={limit}: {name} must be below {limit_name}"),
        ));
    }
    Ok(())
}

fn torchrun(var: &impl Fn(&str) -> Option<String>) -> Result<Topology> {
    const HINT: &str =
        "set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT together (torchrun and commrun do)";
    let rank = number(var, "RANK", HINT)?;
    let world_size = number(var, "WORLD_SIZE", HINT)?;
    check_world_size("WORLD_SIZE", world_size)?;
    check_below("RANK", rank, "WORLD_SIZE", world_size)?;
    // Started by hand with only the four variables env:// needs: one rank per node.
    let local_rank = optional_number(var, "LOCAL_RANK")?.unwrap_or(rank);
    let local_world_size = optional_number(var, "LOCAL_WORLD_SIZE")?.unwrap_or(world_size);
    check_below(
        "LOCAL_RANK",
        local_rank,
        "LOCAL_WORLD_SIZE",
        local_world_size,
    )?;
    if local_world_size > world_size {
        return Err(CommError::env(
            "LOCAL_WORLD_SIZE",
            format!("LOCAL_WORLD_SIZE={local_world_size} is larger than WORLD_SIZE={world_size}"),
        ));
    }
    let node_rank = optional_number(var, "GROUP_RANK")?.unwrap_or(rank / local_world_size);
    let master_addr = var("MASTER_ADDR")
        .filter(|a| !a.trim().is_empty())
        .ok_or_else(|| CommError::env("MASTER_ADDR", format!("MASTER_ADDR is not set; {HINT}")))?;
    let master_port = port(var)?
        .ok_or_else(|| CommError::env("MASTER_PORT", format!("MASTER_PORT is not set; {HINT}")))?;
    Ok(Topology {
        rank,
        world_size,
        local_rank,
        local_world_size,
        node_rank,
        master_addr: master_addr.trim().to_string(),
        master_port,
        launcher: Launcher::Torchrun,
        run_id: var(RUN_ID_VAR).filter(|id| !id.trim().is_empty()),
        socket_ifname: socket_ifname(var),
        store: agent_store(var)?,
    })
}

/// Whether torchrun's agent serves the store at MASTER_ADDR:MASTER_PORT, and which attempt of
/// the worker group this is (torchrun restarts the whole group after a failure).
fn agent_store(var: &impl Fn(&str) -> Option<String>) -> Result<StoreHost> {
    if var(AGENT_STORE_VAR).is_none_or(|v| v.trim() != "True") {
        return Ok(StoreHost::RankZero);
    }
    let attempt = optional_number(var, RESTART_COUNT_VAR)?.unwrap_or(0);
    Ok(StoreHost::Agent { attempt })
}

fn slurm(var: &impl Fn(&str) -> Option<String>) -> Result<Topology> {
    const HINT: &str = "srun sets it for each task";
    let rank = number(var, "SLURM_PROCID", HINT)?;
    let world_size = number(var, "SLURM_NTASKS", HINT)?;
    check_world_size("SLURM_NTASKS", world_size)?;
    check_below("SLURM_PROCID", rank, "SLURM_NTASKS", world_size)?;
    let local_rank = number(var, "SLURM_LOCALID", HINT)?;
    let node_rank = optional_number(var, "SLURM_NODEID")?.unwrap_or(0);
    let local_world_size = match var("SLURM_NTASKS_PER_NODE") {
        Some(_) => number(var, "SLURM_NTASKS_PER_NODE", HINT)?,
        None => match var("SLURM_TASKS_PER_NODE") {
            Some(spec) => tasks_on_node(&spec, node_rank).ok_or_else(|| {
                CommError::env(
                    "SLURM_TASKS_PER_NODE",
                    format!(
                        "SLURM_TASKS_PER_NODE={spec:?} has no entry for SLURM_NODEID={node_rank}"
                    ),
                )
            })?,
            None => world_size,
        },
    };
    check_below(
        "SLURM_LOCALID",
        local_rank,
        "SLURM_NTASKS_PER_NODE",
        local_world_size,
    )?;
    let master_addr = match var("MASTER_ADDR").filter(|a| !a.trim().is_empty()) {
        Some(addr) => addr.trim().to_string(),
        None => {
            let list = var("SLURM_JOB_NODELIST")
                .or_else(|| var("SLURM_NODELIST"))
                .ok_or_else(|| {
                    CommError::env(
                        "SLURM_JOB_NODELIST",
                        "neither MASTER_ADDR nor SLURM_JOB_NODELIST is set: cannot tell where rank 0 runs",
                    )
                })?;
            first_host(&list).map_err(|e| {
                CommError::env(
                    "SLURM_JOB_NODELIST",
                    format!("SLURM_JOB_NODELIST={list:?}: {e}"),
                )
            })?
        }
    };
    // Each job gets its own port, so two jobs sharing a node do not collide.
    let master_port = match port(var)? {
        Some(p) => p,
        None => match optional_number(var, "SLURM_JOB_ID")? {
            Some(job) => 20000 + (job % 20000) as u16,
            None => DEFAULT_MASTER_PORT,
        },
    };
    Ok(Topology {
        rank,
        world_size,
        local_rank,
        local_world_size,
        node_rank,
        master_addr,
        master_port,
        launcher: Launcher::Slurm,
        run_id: slurm_run_id(var),
        socket_ifname: socket_ifname(var),
        store: StoreHost::RankZero,
    })
}

/// Slurm's job and step (`slurm-1234.0`): every task of one srun shares it, another srun of the
/// same job (another step) does not.
fn slurm_run_id(var: &impl Fn(&str) -> Option<String>) -> Option<String> {
    let job = var("SLURM_JOB_ID").filter(|j| !j.trim().is_empty())?;
    let step = var("SLURM_STEP_ID").unwrap_or_default();
    Some(format!("slurm-{}.{}", job.trim(), step.trim()))
}

/// A fresh run id for a job that starts its own ranks: its launcher's pid, the time and a little
/// hash, enough that two jobs started by hand on one node never share one.
pub fn fresh_run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(nanos);
    hasher.write_u32(std::process::id());
    format!("job-{}-{:08x}", std::process::id(), hasher.finish() as u32)
}

/// Refuses a world size no job has: more than [`MAX_WORLD_SIZE`] ranks.
fn check_world_size(name: &str, world_size: usize) -> Result<()> {
    if world_size > MAX_WORLD_SIZE {
        return Err(CommError::env(
            name,
            format!(
                "{name}={world_size}: more than {} ranks, the most one job may have",
                MAX_WORLD_SIZE
            ),
        ));
    }
    Ok(())
}

/// Ranks on this node as the launcher said (LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE), or 1:
/// how many processes share this node's memory.
pub fn local_ranks_from_env() -> usize {
    ["LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"]
        .iter()
        .find_map(|name| std::env::var(name).ok()?.trim().parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, MAX_LOCAL_RANKS)
}

// What else the library reads from the environment: not who this rank is, but read here all the
// same, so that this file lists every variable comm-core looks at. The rooms that use them (the
// failure record, the NCCL backend) get them through these readers.

/// torchrun's variable for the path where a failed worker writes its failure record.
pub const ERROR_FILE_VAR: &str = "TORCHELASTIC_ERROR_FILE";

/// Where this rank writes its failure record ([`ERROR_FILE_VAR`]), when set to something.
pub fn error_file() -> Option<std::path::PathBuf> {
    std::env::var_os(ERROR_FILE_VAR)
        .filter(|p| !p.is_empty())
        .map(Into::into)
}

/// NCCL's variable that overrides a communicator config's `blocking`.
pub const NCCL_COMM_BLOCKING_VAR: &str = "NCCL_COMM_BLOCKING";

/// [`NCCL_COMM_BLOCKING_VAR`] as set (possibly empty or not UTF-8), or None when unset.
pub fn nccl_comm_blocking() -> Option<std::ffi::OsString> {
    std::env::var_os(NCCL_COMM_BLOCKING_VAR)
}

/// Set on a program re-executed with a `libnccl.so` link, so a link that still does not load is
/// an error, not a loop (see `backend::nccl::library`).
pub const RELINKED_VAR: &str = "NCCL_WORKSHOP_RELINKED";

/// The variables the search for libnccl reads: where it may be (a file or folder given outright,
/// the loader's path, NCCL's and CUDA's homes, a virtual or conda environment, the user's home),
/// and whether this process is already the restart with a link ([`RELINKED_VAR`]).
pub const LIBRARY_VARS: [&str; 8] = [
    "NCCL_LIBRARY",
    "LD_LIBRARY_PATH",
    "NCCL_HOME",
    "CUDA_HOME",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "HOME",
    RELINKED_VAR,
];

/// One of [`LIBRARY_VARS`] from the process environment, as the NCCL backend's search and probe
/// take their variables (tests pass a map instead). Any other name reads as unset (and is a
/// bug: a debug build panics, naming it).
pub fn library_var(name: &str) -> Option<String> {
    let listed = LIBRARY_VARS.contains(&name);
    debug_assert!(listed, "{name} is not in topology::LIBRARY_VARS");
    listed.then(|| std::env::var(name).ok()).flatten()
}

/// [`SOCKET_IFNAME_VAR`], when set to something.
fn socket_ifname(var: &impl Fn(&str) -> Option<String>) -> Option<String> {
    var(SOCKET_IFNAME_VAR)
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_search_reads_its_variables_from_the_process() {
        for name in LIBRARY_VARS {
            assert_eq!(library_var(name), std::env::var(name).ok(), "{name}");
        }
        assert_eq!(
            nccl_comm_blocking(),
            std::env::var_os(NCCL_COMM_BLOCKING_VAR)
        );
    }

    #[test]
    fn gloo_socket_ifname_is_read_trimmed() {
        let vars = |name: &str| match name {
            "RANK" | "LOCAL_RANK" => Some("0".to_string()),
            "WORLD_SIZE" => Some("1".to_string()),
            "MASTER_ADDR" => Some("127.0.0.1".to_string()),
            "MASTER_PORT" => Some("29500".to_string()),
            "GLOO_SOCKET_IFNAME" => Some(" ib0 ".to_string()),
            _ => None,
        };
        let topology = Topology::from_vars(vars).unwrap().unwrap();
        assert_eq!(topology.socket_ifname.as_deref(), Some("ib0"));
    }
    use std::collections::HashMap;

    fn topo(vars: &[(&str, &str)]) -> Result<Option<Topology>> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Topology::from_vars(|k| map.get(k).cloned())
    }

    fn err(vars: &[(&str, &str)]) -> String {
        topo(vars).unwrap_err().to_string()
    }

    #[test]
    fn no_launcher_means_spawn() {
        assert_eq!(topo(&[]).unwrap(), None);
        // A batch script has SLURM_PROCID but no step: not a task.
        assert_eq!(
            topo(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4")]).unwrap(),
            None
        );
    }

    #[test]
    fn torchrun_variables() {
        let t = topo(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("GROUP_RANK", "1"),
            ("MASTER_ADDR", "node7"),
            ("MASTER_PORT", "1234"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (
                t.rank,
                t.world_size,
                t.local_rank,
                t.local_world_size,
                t.node_rank
            ),
            (5, 8, 1, 4, 1)
        );
        assert_eq!((t.master_addr.as_str(), t.master_port), ("node7", 1234));
        assert_eq!(t.launcher, Launcher::Torchrun);
        // worker_env round-trips.
        let env: HashMap<String, String> = t
            .worker_env()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(
            Topology::from_vars(|k| env.get(k).cloned())
                .unwrap()
                .unwrap(),
            t
        );
    }

    #[test]
    fn torchrun_errors_name_the_variable() {
        assert!(err(&[("RANK", "0")]).contains("WORLD_SIZE is not set"));
        assert!(err(&[("RANK", "x"), ("WORLD_SIZE", "2")]).contains("RANK=\"x\""));
        assert!(err(&[("RANK", "2"), ("WORLD_SIZE", "2")]).contains("RANK=2 but WORLD_SIZE=2"));
        assert!(err(&[("RANK", "0"), ("WORLD_SIZE", "2")]).contains("MASTER_ADDR is not set"));
        let e = err(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "0"),
        ]);
        assert!(e.contains("MASTER_PORT=\"0\""), "{e}");
        let e = err(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "3"),
            ("LOCAL_WORLD_SIZE", "2"),
        ]);
        assert!(e.contains("LOCAL_RANK=3 but LOCAL_WORLD_SIZE=2"), "{e}");
        assert!(err(&[("RANK", "0"), ("WORLD_SIZE", "0")]).contains("WORLD_SIZE=0"));
    }

    #[test]
    fn torchruns_agent_store_makes_every_rank_a_client_under_its_attempt() {
        let base = [
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "29500"),
        ];
        assert_eq!(topo(&base).unwrap().unwrap().store, StoreHost::RankZero);
        let mut v = base.to_vec();
        v.push(("TORCHELASTIC_USE_AGENT_STORE", "True"));
        let t = topo(&v).unwrap().unwrap();
        assert_eq!(t.store, StoreHost::Agent { attempt: 0 });
        assert_eq!(t.store.namespace(), "/worker/attempt_0");
        // Ranks such a rank starts itself meet at its rank 0's store, not at torchrun's.
        let told = ("TORCHELASTIC_USE_AGENT_STORE", "False".to_string());
        assert!(t.worker_env().contains(&told));
        v.push(("TORCHELASTIC_RESTART_COUNT", "2"));
        assert_eq!(
            topo(&v).unwrap().unwrap().store.namespace(),
            "/worker/attempt_2"
        );
        v.pop();
        v.push(("TORCHELASTIC_RESTART_COUNT", "two"));
        assert!(
            err(&v).contains("TORCHELASTIC_RESTART_COUNT"),
            "{}",
            err(&v)
        );
        // torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 says False: rank 0 serves ours.
        let mut v = base.to_vec();
        v.push(("TORCHELASTIC_USE_AGENT_STORE", "False"));
        assert_eq!(topo(&v).unwrap().unwrap().store, StoreHost::RankZero);
    }

    #[test]
    fn the_run_a_rank_belongs_to() {
        let base = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1234"),
        ];
        assert_eq!(topo(&base).unwrap().unwrap().run_id, None, "by hand: none");
        let mut given = base.to_vec();
        given.push(("TORCHELASTIC_RUN_ID", "course-42"));
        let t = topo(&given).unwrap().unwrap();
        assert_eq!(t.run_id.as_deref(), Some("course-42"));
        assert!(t
            .worker_env()
            .contains(&("TORCHELASTIC_RUN_ID", "course-42".to_string())));
        let srun = [
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_ID", "3"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_JOB_NODELIST", "n1"),
            ("SLURM_JOB_ID", "777"),
        ];
        let t = topo(&srun).unwrap().unwrap();
        assert_eq!(t.run_id.as_deref(), Some("slurm-777.3"));
        assert_ne!(fresh_run_id(), fresh_run_id());
    }

    #[test]
    fn slurm_variables() {
        let t = topo(&[
            ("SLURM_PROCID", "6"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "2"),
            ("SLURM_NODEID", "1"),
            ("SLURM_TASKS_PER_NODE", "4(x2)"),
            ("SLURM_JOB_NODELIST", "lrdn[0101-0104,0107]"),
            ("SLURM_JOB_ID", "123456"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (t.rank, t.world_size, t.local_rank, t.local_world_size),
            (6, 8, 2, 4)
        );
        assert_eq!(t.master_addr, "lrdn0101");
        assert_eq!(t.master_port, 20000 + (123456 % 20000) as u16);
        assert_eq!(t.launcher, Launcher::Slurm);
        // torchrun's variables win when both are present (torchrun started under srun).
        let t = topo(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "a"),
            ("MASTER_PORT", "9"),
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_ID", "0"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(t.launcher, Launcher::Torchrun);
    }

    #[test]
    fn slurm_errors_name_the_variable() {
        let base = [
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NTASKS", "2"),
        ];
        assert!(err(&base).contains("SLURM_LOCALID is not set"));
        let mut v = base.to_vec();
        v.push(("SLURM_LOCALID", "0"));
        assert!(err(&v).contains("SLURM_JOB_NODELIST"));
        v.push(("SLURM_JOB_NODELIST", "n[3-1]"));
        assert!(err(&v).contains("runs backwards"));
    }
}
