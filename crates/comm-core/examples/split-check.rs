//! Splits the job's communicator as the flags say (NCCL's `ncclCommSplit`: a color and a key
//! per rank) and checks every group it makes: who is in it, in which order, and that its
//! all-reduces and the parent's give the right sums while both run at the same time.
//!
//!     cargo run -p comm-core --example split-check -- -n 4 --colors 0,1,0,1
//!     cargo run -p comm-core --example split-check -- -n 4 --colors 0,0,-1,0 --keys 3,2,0,1
//!
//! Try what goes wrong too: `--colors 0,-2,0,1` (a color NCCL does not define), `--skip-rank 3
//! --timeout 5` (a rank that never calls split), `--colors 0,1,1,1 --send-recv` (a group of one
//! asked for a call between two ranks).

use clap::Parser;
use comm_core::{Collective, CommError, Communicator, LaunchArgs, ReduceOp, NO_COLOR};

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
    /// This rank does not call split (it runs an all-reduce on the whole job instead): the
    /// others fail at the timeout, naming it.
    #[arg(long, value_name = "RANK")]
    skip_rank: Option<usize>,
    /// Each group also passes a message around its ring (send_recv): a group of one cannot.
    #[arg(long)]
    send_recv: bool,
    /// Split into a 2-D mesh instead, torch's init_device_mesh((dp, tp)): tensor-parallel groups
    /// of this many consecutive ranks (`tp <row>`), data-parallel ones across them (`dp <column>`).
    #[arg(long, value_name = "TP", conflicts_with_all = ["colors", "keys"])]
    mesh: Option<usize>,
    /// Elements each all-reduce sums.
    #[arg(long, default_value_t = 1 << 18)]
    len: usize,
}

/// Entry `rank` of `list`, or `default` where the list is empty.
fn of(list: &[i32], rank: usize, default: i32, flag: &str) -> comm_core::Result<i32> {
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
            println!("rank {rank}: skips the split (--skip-rank)");
            let mut buf = comm.filled(1.0f32, 1)?;
            return comm.all_reduce(&mut buf, ReduceOp::Sum);
        }
        if let Some(tp) = args.mesh {
            return mesh(comm, tp, args.len);
        }
        let color = of(&args.colors, rank, (rank % 2) as i32, "--colors")?;
        let key = of(&args.keys, rank, 0, "--keys")?;
        let group = comm.split(color, key)?;
        match &group {
            None => println!("rank {rank}: color {NO_COLOR} (NO_COLOR): no group"),
            Some(g) => describe(comm, g, color, key)?,
        }
        let group = at_once(comm, group, args.len, rank)?;
        if let (Some(g), true) = (&group, args.send_recv) {
            ring_step(g)?;
        }
        if let Some(g) = group {
            g.close()?;
        }
        Ok(())
    })
}

/// This rank's data- and tensor-parallel groups, described, and each group's all-reduces
/// checked while the other's run.
fn mesh(comm: &Communicator, tp: usize, len: usize) -> comm_core::Result<()> {
    let mesh = comm_core::Mesh::new(comm, comm.world_size() / tp.max(1), tp)?;
    let (row, column) = mesh.coordinates();
    describe(comm, &mesh.tp, row as i32, column as i32)?;
    describe(comm, &mesh.dp, column as i32, row as i32)?;
    let dp = at_once(&mesh.tp, Some(mesh.dp), len, comm.rank())?;
    mesh.tp.close()?;
    dp.map_or(Ok(()), Communicator::close)
}

/// Prints this rank's group: its place, and its members in order (an all-gather of their ranks
/// in the job: the group's first real collective).
fn describe(comm: &Communicator, g: &Communicator, color: i32, key: i32) -> comm_core::Result<()> {
    let me = g.buffer(&[comm.rank() as i64])?;
    let mut members = g.filled(0i64, g.world_size())?;
    g.all_gather_into(&me, &mut members)?;
    let members: Vec<String> = g.to_host(&members)?.iter().map(i64::to_string).collect();
    if let (0, Some(line)) = (g.rank(), g.transport_line()) {
        println!("{line}");
    }
    println!(
        "rank {}: color {color}, key {key} -> {}: rank {} of {}, members (job ranks, in order) {}",
        comm.rank(),
        g.group_name().unwrap_or("?"),
        g.rank(),
        g.world_size(),
        members.join(" ")
    );
    Ok(())
}

/// The group's all-reduces on a thread of their own while the parent's runs on this one, each
/// checked against its sum: the group's links are its own, so the two never mix bytes. `who`
/// is this rank in the job.
fn at_once(
    comm: &Communicator,
    group: Option<Communicator>,
    len: usize,
    who: usize,
) -> comm_core::Result<Option<Communicator>> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let which = group
        .as_ref()
        .and_then(|g| g.group_name().map(str::to_string));
    let group = std::thread::scope(|s| {
        let grouped = s.spawn(move || -> comm_core::Result<Option<Communicator>> {
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
    let which = which.as_deref().unwrap_or("no group");
    let parent = comm.group_name().unwrap_or("the job");
    println!("rank {who}: {which}'s all-reduces and {parent}'s, at the same time: right sums");
    Ok(group)
}

fn right(got: &[f32], want: f32, what: &str) -> comm_core::Result<()> {
    match got.iter().position(|&v| v != want) {
        None => Ok(()),
        Some(i) => Err(CommError::Peer(format!(
            "{what}: element {i} is {}, not {want}",
            got[i]
        ))),
    }
}

/// Sends this rank's rank in the group to the next, receives the previous one's.
fn ring_step(g: &Communicator) -> comm_core::Result<()> {
    let (r, n) = (g.rank(), g.world_size());
    let send = g.buffer(&[r as i32])?;
    let mut recv = g.filled(0i32, 1)?;
    g.send_recv(&send, (r + 1) % n, &mut recv, (r + n - 1) % n)?;
    let from = g.to_host(&recv)?[0];
    println!(
        "rank {r} of {}: received {from} around the ring",
        g.group_name().unwrap_or("?")
    );
    Ok(())
}
