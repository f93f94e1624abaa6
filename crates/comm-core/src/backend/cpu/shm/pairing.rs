//! Two ranks of one host set up their shared memory when the pair first talks, over the TCP link
//! that opens then (`tcp/handshake.rs` runs [`Arming::agree`] on both sides, the dialler's thread
//! and the other rank's acceptor): each reserves, in its own inbox, the ring the other will
//! write, tells the other where its inbox is, maps the other's, and says whether all of that
//! worked; the pair moves its messages through the rings only if both sides could. Inboxes are
//! made sparse and nameless (`segment.rs`), so a rank's shared memory and mappings grow with
//! the peers it talks to, two in a ring, not with the ranks of its host; a full /dev/shm fails
//! a reservation here, with a message, never a write into an unreserved page later.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Mutex, OnceLock};

use super::inboxes::{peer_inbox, Own};
use super::pair::Pair;
use super::segment::Segment;
use crate::backend::cpu::connected::TransportChoice;
use crate::backend::cpu::tcp::PairSetup;
use crate::deadline::Deadline;
use crate::error::{CommError, Result};

/// The pairs of one rank with the ranks of its host: armed as each first talks.
pub(super) struct Arming {
    rank: usize,
    /// The ranks of this host, sorted, this one included: where each one's ring sits.
    host: Vec<usize>,
    /// The peers this rank reads by one copy, and their pids.
    pids: Vec<(usize, libc::pid_t)>,
    /// `--transport shm` makes a pair that cannot arm an error; `auto` lets it use TCP.
    choice: TransportChoice,
    /// Per peer: the pair's rings, once armed; never set where the pair's bytes go over TCP.
    pairs: Vec<OnceLock<Pair>>,
    /// The peers' inboxes mapped as their pairs armed; after `pairs`, so dropped after them.
    mapped: Mutex<Vec<Segment>>,
    /// This rank's inbox, if it could be made; last, so dropped last.
    own: Option<Own>,
}

/// What one side says in the first exchange: whether it reserved the other's ring, and where
/// its inbox is.
struct Offer {
    reserved: bool,
    address: String,
}

impl Arming {
    /// The pairs of rank `rank` of `world_size` with the other ranks of `host`, whose rings live
    /// in `own` (this rank's inbox; `None` where it could not be made: every pair then says so
    /// and uses TCP), reading by one copy from `pids`.
    pub(super) fn new(
        (rank, world_size): (usize, usize),
        host: Vec<usize>,
        own: Option<Own>,
        pids: Vec<(usize, libc::pid_t)>,
        choice: TransportChoice,
    ) -> Arming {
        Arming {
            rank,
            host,
            pids,
            choice,
            pairs: (0..world_size).map(|_| OnceLock::new()).collect(),
            mapped: Mutex::new(Vec::new()),
            own,
        }
    }

    /// The rings shared with `peer`, once the pair has armed them; `None` where its bytes go
    /// over TCP (another host, a side that could not, or not armed yet).
    pub(super) fn pair(&self, peer: usize) -> Option<&Pair> {
        self.pairs[peer].get()
    }

    /// A peer whose message waits in this rank's inbox, and the message's bytes: between calls
    /// there is none, every message of a call being taken in it.
    pub(super) fn message_waiting(&self) -> Option<(usize, usize)> {
        self.pairs.iter().enumerate().find_map(|(peer, pair)| {
            // Not locked by anyone between this rank's calls; skipped if it were.
            let ring = pair.get()?.incoming.try_lock().ok()?;
            ring.can_read().then(|| (peer, ring.peek().0))
        })
    }

    /// What this rank offers `peer`: its ring reserved in our inbox, and our inbox's address.
    fn offer(&self, peer: usize) -> (Offer, std::result::Result<(), String>) {
        let Some(own) = &self.own else {
            let offer = Offer {
                reserved: false,
                address: String::new(),
            };
            return (offer, Err(format!("rank {} has no inbox", self.rank)));
        };
        let ring = ring_index(&self.host, peer, self.rank);
        let span = own.inbox.geometry().ring_span(ring);
        let reserved = own.held.reserve(span.clone()).map_err(|e| {
            format!(
                "rank {} could not reserve {} bytes of /dev/shm for rank {peer}'s ring: {e} (is \
                 /dev/shm full or too small? docker run --shm-size raises it)",
                self.rank,
                span.len()
            )
        });
        let offer = Offer {
            reserved: reserved.is_ok(),
            address: own.address.clone(),
        };
        (offer, reserved)
    }

    /// Maps `peer`'s inbox at `theirs` and makes the pair's rings: ours to write in its inbox,
    /// its to write in ours.
    fn pair_with(&self, peer: usize, theirs: &Offer) -> std::result::Result<Pair, String> {
        let own = self.own.as_ref().ok_or("no inbox of its own")?;
        if !theirs.reserved {
            return Err(format!("rank {peer} could not reserve its side"));
        }
        let peers = self.host.len() - 1;
        let (segment, inbox) = peer_inbox(&theirs.address, peers)
            .map_err(|why| format!("rank {} cannot map rank {peer}'s inbox: {why}", self.rank))?;
        self.mapped.lock().unwrap().push(segment);
        let pid = self
            .pids
            .iter()
            .find(|(p, _)| *p == peer)
            .map_or(0, |p| p.1);
        Ok(Pair::new(
            inbox.ring(ring_index(&self.host, self.rank, peer)),
            own.inbox.ring(ring_index(&self.host, peer, self.rank)),
            inbox.doorbell(),
            pid,
        ))
    }
}

impl PairSetup for Arming {
    fn agree(&self, peer: usize, stream: &mut TcpStream, deadline: Deadline) -> Result<()> {
        if !self.host.contains(&peer) {
            return Ok(());
        }
        let linking = |e| {
            let doing = format!("rank {} sharing memory with rank {peer}", self.rank);
            CommError::io(doing, e)
        };
        let (ours, reserved) = self.offer(peer);
        let mut said = vec![ours.reserved as u8];
        said.extend_from_slice(ours.address.as_bytes());
        let heard = swap(stream, &said, deadline).map_err(linking)?;
        let theirs = Offer {
            reserved: heard.first() == Some(&1),
            address: String::from_utf8_lossy(heard.get(1..).unwrap_or_default()).into_owned(),
        };
        let paired = reserved.and_then(|()| self.pair_with(peer, &theirs));
        let heard = swap(stream, &[paired.is_ok() as u8], deadline).map_err(linking)?;
        let why = match (paired, heard.first() == Some(&1)) {
            (Ok(pair), true) => {
                let _ = self.pairs[peer].set(pair);
                return Ok(());
            }
            (Ok(_), false) => format!("rank {peer} could not map rank {}'s inbox", self.rank),
            (Err(why), _) => why,
        };
        if self.choice == TransportChoice::Shm {
            return Err(CommError::Backend(format!(
                "--transport shm: {why} (--transport tcp or auto runs without it)"
            )));
        }
        eprintln!(
            "warning: {why}; the pair of ranks {} and {peer} uses TCP",
            self.rank
        );
        Ok(())
    }
}

/// Where the ring of `sender` sits in `receiver`'s inbox: the sender's place among the
/// receiver's peers of the host (`host` sorted, both in it).
pub(super) fn ring_index(host: &[usize], sender: usize, receiver: usize) -> usize {
    host.iter()
        .filter(|&&r| r != receiver)
        .position(|&r| r == sender)
        .expect("both ranks are on the host")
}

/// Sends `ours` (a u16 little-endian length, then the bytes) and reads the peer's, each side
/// writing first, by `deadline`.
fn swap(stream: &mut TcpStream, ours: &[u8], deadline: Deadline) -> std::io::Result<Vec<u8>> {
    let late = || std::io::Error::new(std::io::ErrorKind::TimedOut, "the deadline passed");
    let wait = || deadline.wait_at_most(WAIT).ok_or_else(late);
    let mut message = (ours.len() as u16).to_le_bytes().to_vec();
    message.extend_from_slice(ours);
    stream.set_write_timeout(Some(wait()?))?;
    stream.write_all(&message)?;
    let mut head = [0u8; 2];
    read_by(stream, &mut head, &wait)?;
    let mut theirs = vec![0u8; u16::from_le_bytes(head) as usize];
    read_by(stream, &mut theirs, &wait)?;
    Ok(theirs)
}

/// Reads exactly `out.len()` bytes, each read waiting at most `wait()`.
fn read_by(
    stream: &mut TcpStream,
    out: &mut [u8],
    wait: &impl Fn() -> std::io::Result<std::time::Duration>,
) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < out.len() {
        stream.set_read_timeout(Some(wait()?))?;
        match stream.read(&mut out[filled..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The longest one blocking read or write of the exchange lasts before the deadline is checked.
const WAIT: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sender_has_its_own_ring_in_each_inbox() {
        let host = [0, 2, 5];
        // Rank 0's inbox holds rings for 2 and 5; rank 5's for 0 and 2.
        assert_eq!(ring_index(&host, 2, 0), 0);
        assert_eq!(ring_index(&host, 5, 0), 1);
        assert_eq!(ring_index(&host, 0, 5), 0);
        assert_eq!(ring_index(&host, 2, 5), 1);
    }
}
