//! Who am I? Rank, world size, local rank and the master's address, read from the environment the
//! way torchrun and Slurm's `srun` set it. This is the only module that reads the environment.

use crate::error::{CommError, Result};

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

/// Reads Slurm's compressed task counts (`2(x3),1`) and returns the count on node `node`.
pub fn tasks_on_node(spec: &str, node: usize) -> Option<usize> {
    let mut seen = 0;
    for part in spec.split(',') {
        let (count, repeat) = match part.split_once("(x") {
            Some((count, rest)) => (count, rest.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (part, 1),
        };
        let count = count.trim().parse::<usize>().ok()?;
        if node < seen + repeat {
            return Some(count);
        }
        seen += repeat;
    }
    None
}

/// The most hosts [`expand_nodelist`] lists: more than any job has, so more is a mistake (and
/// `r[1-100000]n[1-100000]` would otherwise allocate until the process dies).
pub const MAX_NODELIST_HOSTS: u64 = 65536;

/// Expands a Slurm host list such as `lrdn[0101-0104,0107]` or `a1,b[1-2]-ib` into host names, in
/// order, keeping zero padding. Refuses a list of more than [`MAX_NODELIST_HOSTS`] hosts (counted
/// before anything is expanded).
pub fn expand_nodelist(list: &str) -> std::result::Result<Vec<String>, String> {
    let items = parse_nodelist(list)?;
    let count = items
        .iter()
        .try_fold(0u64, |sum, parts| sum.checked_add(host_count(parts)?))
        .filter(|&n| n <= MAX_NODELIST_HOSTS)
        .ok_or_else(|| format!("names more than {MAX_NODELIST_HOSTS} hosts"))?;
    let mut hosts = Vec::with_capacity(count as usize);
    for parts in &items {
        expand_parts(parts, String::new(), &mut hosts);
    }
    Ok(hosts)
}

/// The first host of a Slurm host list (where rank 0 runs), without expanding the rest: the
/// whole list is checked, but `r[1-100000]n[1-100000]` costs no more than `r1n1`.
pub fn first_host(list: &str) -> std::result::Result<String, String> {
    let items = parse_nodelist(list)?;
    let mut host = String::new();
    for part in &items[0] {
        match part {
            HostPart::Text(text) => host.push_str(text),
            HostPart::Ranges(ranges) => {
                let (lo, _, width) = ranges[0];
                host.push_str(&format!("{lo:0width$}"));
            }
        }
    }
    Ok(host)
}

/// A piece of a host pattern: literal text, or a bracket's ranges (first, last, zero-padded
/// width).
enum HostPart {
    Text(String),
    Ranges(Vec<(u64, u64, usize)>),
}

/// Every host pattern of the list, checked (brackets, numbers, ranges that run forwards).
fn parse_nodelist(list: &str) -> std::result::Result<Vec<Vec<HostPart>>, String> {
    split_top_level(list)?
        .iter()
        .map(|item| {
            if item.is_empty() {
                Err("empty host name".to_string())
            } else {
                parse_host(item)
            }
        })
        .collect()
}

/// Splits on the commas that are not inside brackets.
fn split_top_level(list: &str) -> std::result::Result<Vec<String>, String> {
    let (mut items, mut current, mut depth) = (Vec::new(), String::new(), 0i32);
    for c in list.trim().chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err("unbalanced or nested brackets".into());
        }
        current.push(c);
    }
    if depth != 0 {
        return Err("unbalanced brackets".into());
    }
    items.push(current);
    Ok(items)
}

/// One host pattern's pieces; several bracket groups multiply (`r[1-2]n[1-2]` is four hosts).
fn parse_host(pattern: &str) -> std::result::Result<Vec<HostPart>, String> {
    let mut parts = Vec::new();
    let mut rest = pattern;
    while let Some(open) = rest.find('[') {
        let close = open + rest[open..].find(']').ok_or("unbalanced brackets")?;
        if open > 0 {
            parts.push(HostPart::Text(rest[..open].to_string()));
        }
        let mut ranges = Vec::new();
        for range in rest[open + 1..close].split(',') {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            let (Ok(a), Ok(b)) = (lo.parse::<u64>(), hi.parse::<u64>()) else {
                return Err(format!("bad range {range:?}"));
            };
            if a > b {
                return Err(format!("range {range:?} runs backwards"));
            }
            ranges.push((a, b, lo.len()));
        }
        parts.push(HostPart::Ranges(ranges));
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        parts.push(HostPart::Text(rest.to_string()));
    }
    Ok(parts)
}

/// How many hosts a pattern names; None past u64.
fn host_count(parts: &[HostPart]) -> Option<u64> {
    parts.iter().try_fold(1u64, |product, part| match part {
        HostPart::Text(_) => Some(product),
        HostPart::Ranges(ranges) => {
            let n = ranges.iter().try_fold(0u64, |sum, &(a, b, _)| {
                sum.checked_add((b - a).checked_add(1)?)
            })?;
            product.checked_mul(n)
        }
    })
}

/// Appends every host of `parts` to `hosts`, each starting with `head`, in order.
fn expand_parts(parts: &[HostPart], head: String, hosts: &mut Vec<String>) {
    match parts.split_first() {
        None => hosts.push(head),
        Some((HostPart::Text(text), rest)) => expand_parts(rest, head + text, hosts),
        Some((HostPart::Ranges(ranges), rest)) => {
            for &(a, b, width) in ranges {
                for n in a..=b {
                    expand_parts(rest, format!("{head}{n:0width$}"), hosts);
                }
            }
        }
    }
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

/// [`SOCKET_IFNAME_VAR`], when set to something.
fn socket_ifname(var: &impl Fn(&str) -> Option<String>) -> Option<String> {
    var(SOCKET_IFNAME_VAR)
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
}

/// The address of network interface `name` (its first IPv4 address, else its first IPv6 one):
/// where a rank told `GLOO_SOCKET_IFNAME=name` listens for its peers. An unknown name, or one
/// without an address, is an error listing the interfaces that have one.
pub fn interface_address(name: &str) -> Result<std::net::IpAddr> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let mut found: Vec<(String, IpAddr)> = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(CommError::io(
            "listing network interfaces",
            std::io::Error::last_os_error(),
        ));
    }
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: entry is a node of the list getifaddrs made, valid until freeifaddrs; its name
        // is a NUL-terminated string and its address, when not null, a sockaddr of its family.
        unsafe {
            let e = &*entry;
            let ifname = std::ffi::CStr::from_ptr(e.ifa_name)
                .to_string_lossy()
                .into_owned();
            let addr = e.ifa_addr;
            if !addr.is_null() {
                match (*addr).sa_family as libc::c_int {
                    libc::AF_INET => {
                        let v4 = &*(addr as *const libc::sockaddr_in);
                        let ip = Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
                        found.push((ifname, IpAddr::V4(ip)));
                    }
                    libc::AF_INET6 => {
                        let v6 = &*(addr as *const libc::sockaddr_in6);
                        found.push((ifname, IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr))));
                    }
                    _ => {}
                }
            }
            entry = e.ifa_next;
        }
    }
    // SAFETY: list came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    let ours = |v4: bool| {
        found
            .iter()
            .find(|(n, ip)| n == name && ip.is_ipv4() == v4)
            .map(|(_, ip)| *ip)
    };
    ours(true).or_else(|| ours(false)).ok_or_else(|| {
        let mut names: Vec<&str> = Vec::new();
        for (n, _) in &found {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
        CommError::env(
            SOCKET_IFNAME_VAR,
            format!(
                "{SOCKET_IFNAME_VAR}={name}: this host has no interface of that name with an \
                 address (it has: {}); name one of them, or unset it to listen where the store \
                 is reached from",
                names.join(", ")
            ),
        )
    })
}

/// This machine's host name ("?" if the system will not say).
pub fn hostname() -> String {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most name.len() bytes into the buffer.
    if unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } != 0 {
        return "?".into();
    }
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    String::from_utf8_lossy(&name[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gloo_socket_ifname_names_an_interface_with_an_address() {
        assert_eq!(
            interface_address("lo").unwrap(),
            std::net::IpAddr::from([127, 0, 0, 1])
        );
        let e = interface_address("nosuch0").unwrap_err().to_string();
        assert!(
            e.contains("GLOO_SOCKET_IFNAME=nosuch0") && e.contains("lo"),
            "{e}"
        );
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

    #[test]
    fn nodelists() {
        assert_eq!(
            expand_nodelist("lrdn[0101-0104,0107]").unwrap(),
            ["lrdn0101", "lrdn0102", "lrdn0103", "lrdn0104", "lrdn0107"]
        );
        assert_eq!(expand_nodelist("node1").unwrap(), ["node1"]);
        assert_eq!(
            expand_nodelist("a1,b[8-10]-ib").unwrap(),
            ["a1", "b8-ib", "b9-ib", "b10-ib"]
        );
        assert_eq!(
            expand_nodelist("r[1-2]n[01-02]").unwrap(),
            ["r1n01", "r1n02", "r2n01", "r2n02"]
        );
        assert!(expand_nodelist("n[1-2").is_err());
        assert!(expand_nodelist("n[a-b]").is_err());
        assert!(expand_nodelist("a,,b").is_err());
    }

    #[test]
    fn task_counts() {
        assert_eq!(tasks_on_node("4", 0), Some(4));
        assert_eq!(tasks_on_node("2(x3),1", 2), Some(2));
        assert_eq!(tasks_on_node("2(x3),1", 3), Some(1));
        assert_eq!(tasks_on_node("2(x3),1", 4), None);
    }
}
