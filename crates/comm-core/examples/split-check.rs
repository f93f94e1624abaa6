//! Splits the job's communicator as the flags say (NCCL's `ncclCommSplit`: a color and a key
//! per rank) and checks every group it makes: rank 0 prints who is in each, in which order, and
//! whether its all-reduces and the parent's gave the right sums while both ran at the same time.
//!
//!     cargo run -p comm-core --example split-check -- -n 4 --colors 0,1,0,1
//!     cargo run -p comm-core --example split-check -- -n 4 --colors 0,0,-1,0 --keys 3,2,0,1
//!     cargo run -p comm-core --example split-check -- -n 4 --mesh 2
//!
//! Try what goes wrong too: `--colors 0,-2,0,1` (a color NCCL does not define), `--skip-rank 3
//! --timeout 5` (a rank that never calls split), `--colors 0,1,1,1 --send-recv` (a group of one
//! asked for a call between two ranks).

use clap::Parser;
use comm_core::{Collective, CommError, Communicator, LaunchArgs, Mesh, ReduceOp, Result};

#[derive(Parser)]
#[command(about = "Split the communicator by color and key, and check every group")]
struct Args {
    #[command(flatten)]
    launch: LaunchArgs,
    /// Each rank's color, in rank order (-1: NO_COLOR, no group) [default: rank % 2].
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    colors: Vec<i32>,
    /// Each rank's key, in rank order: the order within its group (ties: by rank) [default: 0].
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    keys: Vec<i32>,
    /// Split into a 2-D mesh instead, torch's init_device_mesh((dp, tp)): tensor-parallel groups
    /// of this many consecutive ranks (`tp <row>`), data-parallel ones across them (`dp <column>`).
    #[arg(long, value_name = "TP", conflicts_with_all = ["colors", "keys"])]
    mesh: Option<usize>,
    /// This rank does not call split (it runs an all-reduce on the whole job instead): the
    /// others fail at the timeout, naming it.
    #[arg(long, value_name = "RANK")]
    skip_rank: Option<usize>,
    /// Each group also passes a message around its ring (send_recv): a group of one cannot.
    #[arg(long)]
    send_recv: bool,
    /// Elements each all-reduce sums.
    #[arg(long, default_value_t = 1 << 18)]
    len: usize,
}

/// Entry `rank` of `list`, or `default` where the list is empty.
fn of(list: &[i32], rank: usize, default: i32, flag: &str) -> Result<i32> {
    match list {
        [] => Ok(default),
        _ => list.get(rank).copied().ok_or_else(|| {
            CommError::Usage(format!(
                "{flag} gives {} values, and rank {rank} needs one: give one per rank",
                list.len()
            ))
        }),
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    comm_core::run(&args.launch, &[Collective::AllReduce], |comm| {
        let rank = comm.rank();
        if args.skip_rank == Some(rank) {
            eprintln!("rank {rank}: skips the split (--skip-rank)");
            let mut buf = comm.filled(1.0f32, 1)?;
            return comm.all_reduce(&mut buf, ReduceOp::Sum);
        }
        if let Some(tp) = args.mesh {
            return mesh(comm, tp, args.len);
        }
        let color = of(&args.colors, rank, (rank % 2) as i32, "--colors")?;
        let key = of(&args.keys, rank, 0, "--keys")?;
        let group = comm.split(color, key)?;
        table(comm, group.as_ref(), (color, key))?;
        let group = at_once(comm, group, args.len)?;
        said(
            comm,
            "every group's all-reduces and the job's, at the same time",
        )?;
        if args.send_recv {
            group.as_ref().map_or(Ok(()), ring_step)?;
            said(comm, "a message around every group's ring")?;
        }
        group.map_or(Ok(()), Communicator::close)
    })
}

/// The mesh's tensor- and data-parallel groups, each table printed, and each group's
/// all-reduces checked while the other's run.
fn mesh(comm: &Communicator, tp: usize, len: usize) -> Result<()> {
    let mesh = Mesh::new(comm, comm.world_size() / tp.max(1), tp)?;
    let (row, column) = mesh.coordinates();
    table(comm, Some(&mesh.tp), (row as i32, column as i32))?;
    table(comm, Some(&mesh.dp), (column as i32, row as i32))?;
    let dp = at_once(&mesh.tp, Some(mesh.dp), len)?;
    said(
        comm,
        "the dp groups' all-reduces and the tp groups', at the same time",
    )?;
    mesh.tp.close()?;
    dp.map_or(Ok(()), Communicator::close)
}

/// Rank 0 prints every rank's group: color, key, its place, and the members in order. Each
/// group first all-gathers its members' job ranks (its first real collective); the job then
/// gathers every rank's row to rank 0.
fn table(
    comm: &Communicator,
    group: Option<&Communicator>,
    (color, key): (i32, i32),
) -> Result<()> {
    let n = comm.world_size();
    let mut row = vec![-1i64; 4 + n];
    row[..2].copy_from_slice(&[color as i64, key as i64]);
    if let Some(g) = group {
        let me = g.buffer(&[comm.rank() as i64])?;
        let mut members = g.filled(0i64, g.world_size())?;
        g.all_gather_into(&me, &mut members)?;
        row[2..4].copy_from_slice(&[g.rank() as i64, g.world_size() as i64]);
        row[4..4 + g.world_size()].copy_from_slice(&g.to_host(&members)?);
    }
    let mine = comm.buffer(&row)?;
    let mut rows = comm.filled(0i64, row.len() * n)?;
    comm.all_gather_into(&mine, &mut rows)?;
    let rows = comm.to_host(&rows)?;
    if comm.rank() != 0 {
        return Ok(());
    }
    if let Some(line) = group.and_then(Communicator::transport_line) {
        println!("{line}");
    }
    let name = group
        .and_then(Communicator::group_name)
        .unwrap_or("group 0");
    let prefix = name.split(' ').next().unwrap_or("group");
    println!("rank  color  key  group     its rank  members, in order");
    for (rank, r) in rows.chunks(row.len()).enumerate() {
        let members: Vec<String> = r[4..]
            .iter()
            .filter(|&&m| m >= 0)
            .map(i64::to_string)
            .collect();
        let (group, place) = match r[3] {
            -1 => ("-".to_string(), "-".to_string()),
            size => (format!("{prefix} {}", r[0]), format!("{} of {size}", r[2])),
        };
        println!(
            "{rank:>4}  {:>5}  {:>3}  {group:<8}  {place:<8}  {}",
            r[0],
            r[1],
            members.join(" ")
        );
    }
    Ok(())
}

/// The group's all-reduces on a thread of their own while the parent's runs on this one, each
/// checked against its sum: the group's links are its own, so the two never mix bytes.
fn at_once(
    comm: &Communicator,
    group: Option<Communicator>,
    len: usize,
) -> Result<Option<Communicator>> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let group = std::thread::scope(|s| {
        let grouped = s.spawn(move || -> Result<Option<Communicator>> {
            let Some(g) = group else { return Ok(None) };
            g.bind_to_thread()?;
            for round in 1..=3 {
                let mut buf = g.filled(1000.0 * round as f32, len)?;
                g.all_reduce(&mut buf, ReduceOp::Sum)?;
                let want = 1000.0 * round as f32 * g.world_size() as f32;
                right(&g.to_host(&buf)?, want, "the group's all-reduce")?;
            }
            Ok(Some(g))
        });
        let mut buf = comm.filled(rank as f32 + 1.0, len)?;
        let parent = comm
            .all_reduce(&mut buf, ReduceOp::Sum)
            .and_then(|_| comm.to_host(&buf))
            .and_then(|sums| right(&sums, (n * (n + 1) / 2) as f32, "the parent's all-reduce"));
        let grouped = grouped
            .join()
            .unwrap_or_else(|_| Err(CommError::Peer("the group's thread panicked".into())));
        parent.and(grouped)
    })?;
    comm.bind_to_thread()?;
    Ok(group)
}

/// Rank 0 says `what` was right on every rank (each rank's own check passed, or it failed).
fn said(comm: &Communicator, what: &str) -> Result<()> {
    comm.barrier()?;
    if comm.rank() == 0 {
        match comm.world_size() {
            1 => println!("{what}: right on the one rank"),
            n => println!("{what}: right on all {n} ranks"),
        }
    }
    Ok(())
}

fn right(got: &[f32], want: f32, what: &str) -> Result<()> {
    match got.iter().position(|&v| v != want) {
        None => Ok(()),
        Some(i) => Err(CommError::Peer(format!(
            "{what}: element {i} is {}, not {want}",
            got[i]
        ))),
    }
}

/// Sends this rank's rank in the group to the next, receives the previous one's, and checks it.
fn ring_step(g: &Communicator) -> Result<()> {
    let (r, n) = (g.rank(), g.world_size());
    let send = g.buffer(&[r as i32])?;
    let mut recv = g.filled(0i32, 1)?;
    g.send_recv(&send, (r + 1) % n, &mut recv, (r + n - 1) % n)?;
    let from = g.to_host(&recv)?[0] as usize;
    match from == (r + n - 1) % n {
        true => Ok(()),
        false => Err(CommError::Peer(format!(
            "rank {r} of its group received {from}"
        ))),
    }
}
