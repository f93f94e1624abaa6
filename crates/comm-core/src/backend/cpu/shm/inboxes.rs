//! Mapping the host's inboxes, over the store: which ranks share this host, each rank's inbox
//! created and published, every peer's opened and checked, and the pairs that mapped each
//! other kept (part of the wiring `connect` in `wiring.rs` runs; see its module comment).

use super::super::connected::TransportChoice;
use super::ring::{Geometry, Inbox};
use super::segment::{self, Segment};
use crate::error::{CommError, Result};
use crate::store::Scoped;

/// The peers of this host whose memory could not be shared: an error under `--transport shm`,
/// a warning otherwise (those pairs use TCP).
pub(super) fn unmapped_peers(
    rank: usize,
    peers: &[usize],
    shared: &Shared,
    choice: TransportChoice,
) -> Result<()> {
    let failed: Vec<_> = peers
        .iter()
        .copied()
        .filter(|p| !shared.mapped.iter().any(|(q, _)| q == p))
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    let why = shared.why.as_deref().unwrap_or("the peer could not map it");
    let message = format!(
        "rank {rank} cannot share memory with ranks {}: {why}",
        crate::error::rank_list(failed.iter().copied())
    );
    if choice == TransportChoice::Shm {
        return Err(CommError::Backend(format!(
            "--transport shm: {message} (--transport tcp or auto runs without it)"
        )));
    }
    eprintln!("warning: {message}; those pairs use TCP");
    Ok(())
}

/// The transport line's words: which ranks share memory, and who is reached by TCP.
pub(super) fn summary(rank: usize, world_size: usize, mapped: usize, on_host: usize) -> String {
    match (mapped, world_size - on_host) {
        (n, 0) if n + 1 == world_size => {
            format!("shared memory between the {world_size} ranks of this host")
        }
        (0, _) => "shared memory could not be set up".into(),
        (n, _) => format!(
            "rank {rank}: shared memory to {n} rank{} of its host, TCP to {}",
            if n == 1 { "" } else { "s" },
            world_size - 1 - n
        ),
    }
}

/// What identifies a host: its name and the kernel's boot id (two containers of one name on
/// different machines differ in the second; ranks that match still check they can map each
/// other's segments).
fn host_key() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{}:{}", crate::host::hostname(), boot.trim())
}

/// The ranks on this rank's host, sorted, itself included: every rank signs in under its host's
/// key, and after a barrier reads who signed in there.
pub(super) fn host_ranks(scope: &Scoped, rank: usize) -> Result<Vec<usize>> {
    let host = scope.scoped("host").scoped(&host_key());
    let seat = host.add("count", 1)? - 1;
    host.set_at("seat", seat, rank.to_string().as_bytes())?;
    scope.barrier("hosts")?;
    let count = host.add("count", 0)?;
    let mut ranks = Vec::new();
    for value in host.get_at("seat", 0..count)? {
        let peer = String::from_utf8_lossy(&value)
            .parse::<usize>()
            .map_err(|_| {
                let host = host.key("seat");
                CommError::Peer(format!("a rank signed in under {host} as {value:?}"))
            })?;
        ranks.push(peer);
    }
    ranks.sort_unstable();
    Ok(ranks)
}

/// The outcome of setting up shared memory with the peers of this host.
pub(super) struct Shared {
    /// Our inbox, if it could be made.
    pub(super) inbox: Option<Inbox>,
    /// The peers that share memory with us (both sides mapped the other), and their inboxes.
    pub(super) mapped: Vec<(usize, Inbox)>,
    /// Every mapping, ours first.
    pub(super) segments: Vec<Segment>,
    /// Why something failed on our side.
    pub(super) why: Option<String>,
}

/// Creates this rank's inbox, maps every peer's, and agrees with each which pairs share memory.
/// Every rank of the host takes every step, failed or not, so none waits for another in vain.
pub(super) fn share_memory(scope: &Scoped, rank: usize, peers: &[usize]) -> Result<Shared> {
    let geometry = Geometry::for_peers(peers.len());
    segment::sweep_stale();
    let (own, mut why) = create_inbox(rank, geometry);
    let published = match &own {
        Some((_, _, name_and_token)) => name_and_token.as_str(),
        None => "-",
    };
    scope.set_at("inbox", rank, published.as_bytes())?;
    let opened = open_peer_inboxes(scope, peers, geometry, &mut why)?;
    let mut segments = Vec::new();
    let mut mapped = keep_mutual(scope, rank, opened, &mut segments)?;
    // Every peer that maps our inbox has said so above: the name can go.
    let inbox = own.map(|(mut segment, inbox, _)| {
        segment.unlink();
        segments.insert(0, segment);
        inbox
    });
    if inbox.is_none() {
        mapped.clear();
    }
    Ok(Shared {
        inbox,
        mapped,
        segments,
        why,
    })
}

/// This rank's inbox, formatted under a fresh random token, and what peers need to map it (its
/// name and the token); or why there is none.
fn create_inbox(
    rank: usize,
    geometry: Geometry,
) -> (Option<(Segment, Inbox, String)>, Option<String>) {
    let name = Segment::fresh_name(rank);
    let token = segment::random_token();
    match Segment::create(&name, geometry.bytes()) {
        Ok(segment) => {
            // SAFETY: a fresh mapping of geometry.bytes() bytes, zeroed by the kernel, that no
            // one else knows of yet; it lives in `segments` as long as the transport.
            let inbox = unsafe { Inbox::format(segment.base(), geometry, token) };
            (Some((segment, inbox, format!("{name} {token}"))), None)
        }
        Err(e) => {
            let why = format!(
                "creating {} bytes in /dev/shm failed: {e} (is /dev/shm full or too small? \
                 docker run --shm-size raises it)",
                geometry.bytes()
            );
            (None, Some(why))
        }
    }
}

/// Maps every peer's published inbox whose stamp matches its token; the last failure in `why`.
fn open_peer_inboxes(
    scope: &Scoped,
    peers: &[usize],
    geometry: Geometry,
    why: &mut Option<String>,
) -> Result<Vec<(usize, Segment, Inbox)>> {
    let mut opened = Vec::new();
    for (&peer, value) in peers.iter().zip(scope.get_at("inbox", peers)?) {
        let value = String::from_utf8_lossy(&value);
        let Some((name, token)) = value
            .split_once(' ')
            .and_then(|(n, t)| Some((n.to_string(), t.parse::<u64>().ok()?)))
        else {
            continue;
        };
        match Segment::open(&name, geometry.bytes()) {
            // SAFETY: the mapping is geometry.bytes() long and kept in `segments`.
            Ok(segment) => match unsafe { Inbox::check(segment.base(), geometry, token) } {
                Some(inbox) => opened.push((peer, segment, inbox)),
                None => {
                    *why = Some(format!(
                        "rank {peer}'s segment {name} is not the one it made"
                    ))
                }
            },
            Err(e) => *why = Some(format!("opening rank {peer}'s segment {name}: {e}")),
        }
    }
    Ok(opened)
}

/// Says which peers this rank mapped, and keeps those that mapped it too (their mappings go to
/// `segments`): a pair shares memory only when both sides can.
fn keep_mutual(
    scope: &Scoped,
    rank: usize,
    opened: Vec<(usize, Segment, Inbox)>,
    segments: &mut Vec<Segment>,
) -> Result<Vec<(usize, Inbox)>> {
    let ours: Vec<String> = opened.iter().map(|(p, ..)| p.to_string()).collect();
    scope.set_at("mapped", rank, ours.join(",").as_bytes())?;
    let answers = scope.get_at("mapped", opened.iter().map(|(peer, ..)| peer))?;
    let mut mapped = Vec::new();
    for ((peer, segment, inbox), theirs) in opened.into_iter().zip(answers) {
        let mapped_us = String::from_utf8_lossy(&theirs)
            .split(',')
            .any(|r| r == rank.to_string());
        if mapped_us {
            mapped.push((peer, inbox));
            segments.push(segment);
        }
    }
    Ok(mapped)
}
