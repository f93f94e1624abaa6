//! The host's inboxes: which ranks share this host (over the store), this rank's inbox made
//! and the address a peer maps it by, and a peer's inbox mapped and checked when the pair first
//! talks (`pairing.rs`). Part of the wiring `connect` in `wiring.rs` runs; see its comment.

use super::ring::{Geometry, Inbox};
use super::segment::{self, Held, Segment};
use crate::error::{CommError, Result};
use crate::store::Scoped;

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

/// This rank's inbox, made for the peers of its host: mapped here, nameless, its header
/// reserved and each ring reserved as its pair first talks.
pub(super) struct Own {
    /// The segment `inbox` views, kept as long as it: its rings are reserved through it as
    /// pairs first talk.
    pub(super) held: Held,
    pub(super) inbox: Inbox,
    /// What a peer needs to map it ([`peer_inbox`]): this process, the descriptor, the token.
    pub(super) address: String,
}

/// Makes this rank's inbox, one ring for each of its `peers` peers of the host, formatted under
/// a fresh random token; or why it could not.
pub(super) fn own_inbox(rank: usize, peers: usize) -> std::result::Result<Own, String> {
    let geometry = Geometry::for_peers(peers);
    segment::sweep_stale();
    let token = segment::random_token();
    match Held::sparse(rank, geometry.bytes(), geometry.header_bytes()) {
        Ok(held) => {
            // SAFETY: a fresh mapping of geometry.bytes() bytes, zeroed by the kernel, that no
            // one else knows of yet, whose header (all that format writes) is reserved; it
            // lives as long as the transport.
            let inbox = unsafe { Inbox::format(held.base(), geometry, token) };
            let address = format!("{} {} {token}", std::process::id(), held.fd());
            Ok(Own {
                held,
                inbox,
                address,
            })
        }
        Err(e) => Err(format!(
            "creating {} bytes in /dev/shm failed: {e} (is /dev/shm full or too small? \
             docker run --shm-size raises it)",
            geometry.bytes()
        )),
    }
}

/// Maps the inbox a peer of the host said is at `address` (its [`Own::address`]) and checks
/// its stamp: the mapping and the view of it, or why not.
pub(super) fn peer_inbox(
    address: &str,
    peers: usize,
) -> std::result::Result<(Segment, Inbox), String> {
    let geometry = Geometry::for_peers(peers);
    let words: Vec<&str> = address.split(' ').collect();
    let [pid, fd, token] = words[..] else {
        return Err(format!("it gave {address:?} as its inbox"));
    };
    let parsed = (pid.parse(), fd.parse(), token.parse::<u64>());
    let (Ok(pid), Ok(fd), Ok(token)) = parsed else {
        return Err(format!("it gave {address:?} as its inbox"));
    };
    let segment = Segment::open_held(pid, fd, geometry.bytes(), true)
        .map_err(|e| format!("opening its inbox (pid {pid}, descriptor {fd}): {e}"))?;
    // SAFETY: the mapping is geometry.bytes() long and kept with the pair.
    match unsafe { Inbox::check(segment.base(), geometry, token) } {
        Some(inbox) => Ok((segment, inbox)),
        None => Err(format!("its inbox (pid {pid}) is not the one it made")),
    }
}
