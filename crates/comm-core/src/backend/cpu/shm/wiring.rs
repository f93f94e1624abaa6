//! Wiring shared memory between the ranks of a host, over the store: which ranks share the
//! host, their inboxes made (`inboxes.rs`), whether every pair may read each other's memory
//! (`cma.rs`), agreed by the whole job, and each pair's rings handed to the data path
//! (`data_path.rs`), to be armed when the pair first talks (`pairing.rs`), over the TCP link
//! that opens then and stays as the way a dead or failed peer is noticed.

use std::sync::Arc;

use super::cma;
use super::data_path::ShmTcpTransport;
use super::inboxes::{host_ranks, own_inbox, summary};
use super::pairing::Arming;
use super::pool;
use super::segment;
use super::waiting::{self, Pacing};
use super::window::Window;
use crate::backend::cpu::connected::{Connected, CopyChoice, TransportChoice, Wiring};
use crate::backend::cpu::tcp::TcpTransport;
use crate::backend::cpu::transport::Transport;
use crate::error::{CommError, Result};
use crate::store::Scoped;

/// Whether each rank of the host can read its peers' memory: the pids of the peers this rank
/// can read, or why it cannot read one.
type Readable = std::result::Result<Vec<(usize, libc::pid_t)>, String>;

/// What the job agreed on for copies (see `agree_on_copy`).
struct Copying {
    /// The pids of the peers this rank reads by one copy.
    pids: Vec<(usize, libc::pid_t)>,
    /// The size from which messages take one copy; `None`: none does.
    single_from: Option<usize>,
    /// What the transport line adds.
    note: String,
}

impl Copying {
    /// Every message through the rings, the line adding `note`.
    fn rings(note: String) -> Copying {
        Copying {
            pids: Vec::new(),
            single_from: None,
            note,
        }
    }
}

/// Moves the pairs of this host that can share memory off `tcp`, as `choice` says: `Auto`
/// wherever it can be set up, `Shm` for every pair or an error. Each pair's rings are armed
/// when it first talks (`pairing.rs`); here the ranks learn who shares the host, make their
/// inboxes and agree on copies. Where no pair can, `tcp` goes on alone, with the reason.
pub(crate) fn connect(tcp: TcpTransport, scope: &Scoped, wiring: Wiring) -> Result<Connected> {
    let choice = wiring.transport;
    let (rank, world_size) = (tcp.rank(), tcp.world_size());
    let scope = scope.scoped("shm");
    let host = host_ranks(&scope, rank)?;
    if choice == TransportChoice::Shm && host.len() < world_size {
        return Err(ranks_elsewhere(rank, world_size, &host));
    }
    let peers: Vec<usize> = host.iter().copied().filter(|&r| r != rank).collect();
    let pacing = Pacing::for_host(host.len(), waiting::cores());
    let (window, registered) = registered_buffers(&scope, rank, world_size, &host, wiring)?;
    // Kept until every rank has said whether it could read it (agree_on_copy).
    let _probe = match wiring.copy {
        CopyChoice::Ring | CopyChoice::Registered => None,
        _ => {
            cma::allow_peers();
            let probe = cma::Probe::new(segment::random_token());
            scope.set_at("probe", rank, probe.published().as_bytes())?;
            Some(probe)
        }
    };
    if peers.is_empty() {
        agree_on_copy(&scope, rank, world_size, wiring.copy, Ok(Vec::new()))?;
        return Ok(Connected::alone(tcp, "no other rank on this host"));
    }
    let own = own_inbox(rank, peers.len());
    let readable = match (&own, wiring.copy) {
        (Err(_), _) | (_, CopyChoice::Ring | CopyChoice::Registered) => Ok(Vec::new()),
        _ => readable_peers(&scope, rank, &peers, wiring.refuse_cross_memory)?,
    };
    let copying = agree_on_copy(&scope, rank, world_size, wiring.copy, readable)?;
    let own = match own {
        Ok(own) => Some(own),
        Err(why) if choice == TransportChoice::Shm => {
            return Err(CommError::Backend(format!(
                "--transport shm: rank {rank} cannot share memory: {why} (--transport tcp or \
                 auto runs without it)"
            )))
        }
        Err(why) => {
            eprintln!("warning: rank {rank} cannot share memory with its host's ranks: {why}");
            None
        }
    };
    let doorbell = own.as_ref().map(|own| own.inbox.doorbell());
    let mut why = summary(
        rank,
        world_size,
        own.as_ref().map_or(0, |_| peers.len()),
        host.len(),
    );
    if own.is_some() {
        why.push_str(&registered);
        why.push_str(&copying.note);
    }
    let pids = copying.pids;
    let arming = Arc::new(Arming::new((rank, world_size), host, own, pids, choice));
    // Every pair says its part as it first talks, even where this rank has no inbox to offer.
    tcp.seal(Some(arming.clone()));
    let Some(doorbell) = doorbell else {
        return Ok(Connected::alone(tcp, &why));
    };
    let transport = ShmTcpTransport::new(tcp, arming, peers.len(), doorbell, copying.single_from)
        .with_window(window, pacing);
    Ok(Connected {
        transport: Box::new(transport),
        why,
    })
}

/// The window on every rank's registered buffers ([`Window`]), where `wiring.copy` asks for
/// them (`Registered`, or `Auto`) and every rank of the job shares this host; and what the
/// transport line adds. `--copy registered` where they cannot be had is an error saying why.
fn registered_buffers(
    scope: &Scoped,
    rank: usize,
    world_size: usize,
    host: &[usize],
    wiring: Wiring,
) -> Result<(Option<Window>, String)> {
    let asked = wiring.copy == CopyChoice::Registered;
    if !matches!(wiring.copy, CopyChoice::Auto | CopyChoice::Registered) {
        return Ok((None, String::new()));
    }
    if host.len() < world_size {
        if asked {
            let others = (0..world_size).filter(|r| !host.contains(r));
            return Err(CommError::Usage(format!(
                "--copy registered: ranks {} run on other hosts than rank {rank}'s; registered                  buffers join the ranks of one host (--copy auto uses them where every rank                  shares one)",
                crate::error::rank_list(others)
            )));
        }
        return Ok((None, String::new()));
    }
    let refuse = wiring.refuse_registered;
    let pages = pool::pages(0).words();
    match Window::connect(scope, rank, world_size, asked, refuse)? {
        Ok(window) => {
            let note = match (asked, pages) {
                (true, "") => "; one copy from registered buffers (--copy registered)".into(),
                (true, pages) => {
                    format!("; one copy from registered buffers {pages} (--copy registered)")
                }
                (false, "") => String::new(),
                (false, pages) => format!("; registered buffers {pages}"),
            };
            Ok((Some(window), note))
        }
        Err(why) if asked => Err(CommError::Backend(format!(
            "--copy registered: {why} (--copy ring or auto runs without it)"
        ))),
        Err(why) => Ok((None, format!("; no registered buffers: {why}"))),
    }
}

/// The error for `--transport shm` where some ranks run on other hosts than this one's `host`.
fn ranks_elsewhere(rank: usize, world_size: usize, host: &[usize]) -> CommError {
    let others = (0..world_size).filter(|r| !host.contains(r));
    CommError::Usage(format!(
        "--transport shm: rank {rank} shares its host with ranks {} only, and ranks {} \
         run elsewhere; shared memory joins the ranks of one host (--transport auto uses \
         it within each host and TCP between hosts)",
        crate::error::rank_list(host.iter().copied()),
        crate::error::rank_list(others)
    ))
}

/// Checks that this rank can read the memory of each of `peers` (their published probes), as
/// the one-copy path will; `refuse` fails the check (a test's stand-in for a host that forbids
/// it).
fn readable_peers(scope: &Scoped, rank: usize, peers: &[usize], refuse: bool) -> Result<Readable> {
    let mut pids = Vec::new();
    for (&peer, published) in peers.iter().zip(scope.get_at("probe", peers)?) {
        let checked = match refuse {
            true => Err("refused (a test's stand-in for a host that forbids it)".to_string()),
            false => cma::check(&String::from_utf8_lossy(&published)),
        };
        match checked {
            Ok(pid) => pids.push((peer, pid)),
            Err(why) => {
                return Ok(Err(format!(
                    "rank {rank} cannot read rank {peer}'s memory: {why}"
                )))
            }
        }
    }
    Ok(Ok(pids))
}

/// The job-wide choice of copy: every rank says whether it can read its peers' memory, and the
/// one-copy path is used only if every rank can (`--copy auto`; `single` fails saying who
/// cannot). Returns the peers' pids, the size from which messages take one copy, and what the
/// transport line adds.
fn agree_on_copy(
    scope: &Scoped,
    rank: usize,
    world_size: usize,
    copy: CopyChoice,
    readable: Readable,
) -> Result<Copying> {
    match copy {
        CopyChoice::Ring => {
            let note = "; two copies through its rings (--copy ring)";
            return Ok(Copying::rings(note.into()));
        }
        // Messages (of buffers the window does not reach) take the rings.
        CopyChoice::Registered => return Ok(Copying::rings(String::new())),
        CopyChoice::Auto | CopyChoice::Single => {}
    }
    let ours = match &readable {
        Ok(_) => "yes".to_string(),
        Err(why) => why.clone(),
    };
    scope.set_at("readable", rank, ours.as_bytes())?;
    let answers = scope.get_at("readable", 0..world_size)?;
    let refusal = answers
        .iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .find(|a| a != "yes");
    match (refusal, readable) {
        (None, Ok(pids)) => Ok(match copy {
            CopyChoice::Single => Copying {
                pids,
                single_from: Some(1),
                note: "; one copy for every message, by cross-memory attach (--copy single)".into(),
            },
            _ => Copying {
                pids,
                single_from: cma::THRESHOLD_BYTES,
                note: String::new(),
            },
        }),
        (refusal, _) => {
            let why = refusal.unwrap_or_default();
            if copy == CopyChoice::Single {
                return Err(CommError::Backend(format!(
                    "--copy single: {why} (--copy ring or auto runs without it)"
                )));
            }
            Ok(Copying::rings(format!(
                "; two copies through its rings: {why}"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::cpu::transport::piece_count;

    #[test]
    fn an_empty_message_still_takes_a_piece() {
        assert_eq!(piece_count(0, 64), 1);
        assert_eq!(piece_count(129, 64), 3);
    }
}
