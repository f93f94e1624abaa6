//! Processes as ranks: one TCP connection per pair of ranks that talk, on one machine or across
//! nodes, in rooms as gloo's listener and pair: `handshake.rs` opens a link when its pair first
//! talks (the dialler's thread, or the other rank's acceptor, a hello each way: `hello.rs`),
//! `peers.rs` keeps which links are open and makes each pair's one, and `link.rs` carries one
//! link's messages once it is open. This file joins them into the rank's transport.
//!
//! Connecting a transport only publishes this rank's address and reads the others' (one write
//! and one read at the store, whatever the job's size): a rank holds links to the peers it talks
//! to, two in a ring, as NCCL connects the peers of its rings and trees when first needed, where
//! Gloo's full mesh opens n - 1 per rank before anything runs.
//!
//! The timeout is one deadline per collective call (see [`super::transport`]), opening the links
//! it needs included: each blocking read or write waits at most the time left, so bytes that
//! trickle in cannot stretch it. The first failure on any link shuts every link of the rank, so
//! no other thread of the call waits out the deadline too, and every later operation fails at
//! once with that first error. Every link is probed by the heartbeat (`crate::heartbeat`): a
//! peer whose node went silent is an error within its bound, naming the peer and its node.

mod handshake;
mod hello;
mod link;
mod peers;

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

pub(crate) use handshake::PairSetup;
use handshake::{Accepting, Acceptor, Dialed, Opening};
use hello::Hello;
use link::{Link, RecvError};
use peers::{Peers, Turn};

use super::context::Context;
use super::transport::{size_mismatch, Deadline, Transport};
use crate::error::{CommError, Result};
use crate::heartbeat::{went_silent, Heartbeat};
use crate::store::Scoped;

/// One process's TCP links to the peers it talks to, set up through the rendezvous store.
pub struct TcpTransport {
    /// The rank, the call's deadline and the first failure, shared with a transport that
    /// carries some pairs over shared memory: a failure shuts every link.
    ctx: Arc<Context>,
    peers: Arc<Peers>,
    open: Arc<Opening>,
    /// Takes the peers' dials; stopped when the transport drops.
    _acceptor: Acceptor,
}

/// How a rank's links are made: everything but the store scope and the pair's extra setup.
#[derive(Debug, Clone)]
pub(crate) struct LinkParams<'a> {
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    /// The run's id (a peer of another run is refused); `None` for ranks started by hand.
    pub(crate) run_id: Option<&'a str>,
    /// The address to listen on.
    pub(crate) ip: std::net::IpAddr,
    /// The job's `--timeout`.
    pub(crate) timeout: Duration,
    /// How links are probed (`--heartbeat`).
    pub(crate) beat: Heartbeat,
}

impl TcpTransport {
    /// Links this rank to its peers as they first talk, exchanging addresses through the store
    /// in `scope`. `run_id` names the run (torchrun's `--rdzv-id`, Slurm's job and step,
    /// self-spawn's own): a peer of another run is refused. Ranks started by hand have none, and
    /// then run ids are not compared. `timeout` (the job's `--timeout`) bounds each collective
    /// call, opening the links it needs included.
    pub fn connect(
        scope: &Scoped,
        rank: usize,
        world_size: usize,
        run_id: Option<&str>,
        timeout: Duration,
    ) -> Result<Self> {
        let ip = scope.store().local_ip();
        Self::connect_on(scope, rank, world_size, run_id, ip, timeout)
    }

    /// [`connect`](Self::connect), listening for peers on `ip` (an interface's address, as
    /// `GLOO_SOCKET_IFNAME` names it) instead of the address the store is reached from.
    pub fn connect_on(
        scope: &Scoped,
        rank: usize,
        world_size: usize,
        run_id: Option<&str>,
        ip: std::net::IpAddr,
        timeout: Duration,
    ) -> Result<Self> {
        let params = LinkParams {
            rank,
            world_size,
            run_id,
            ip,
            timeout,
            beat: Heartbeat::default(),
        };
        let tcp = Self::connect_with(scope, &params)?;
        tcp.seal(None);
        Ok(tcp)
    }

    /// [`connect`](Self::connect) as `params` say. Links open only once [`TcpTransport::seal`]
    /// has said what else each pair agrees on as its link opens (shared memory's pairs).
    pub(crate) fn connect_with(scope: &Scoped, params: &LinkParams) -> Result<Self> {
        let (rank, world_size) = (params.rank, params.world_size);
        let listener = TcpListener::bind((params.ip, 0))
            .map_err(|e| CommError::io(format!("rank {rank} cannot listen for peers"), e))?;
        let me = listener
            .local_addr()
            .map_err(|e| CommError::io("peer listener", e))?;
        let ours = Hello {
            rank,
            world_size,
            run_id: params.run_id.map(str::to_string),
            host: crate::host::hostname(),
        };
        let open = Arc::new(Opening::new(ours, params.beat, params.timeout));
        let ctx = Context::new(rank, world_size, params.timeout);
        let peers = Arc::new(Peers::new(world_size));
        // The first failure shuts every link, so no other thread of this rank waits on one.
        let open_links = peers.clone();
        ctx.on_failure(move || open_links.open().for_each(|link| link.shut()));
        // Peers may dial as soon as the address is out: the acceptor runs before.
        let _acceptor = Acceptor::start(Accepting {
            listener,
            open: open.clone(),
            peers: peers.clone(),
            ctx: ctx.clone(),
        })?;
        let tcp = TcpTransport {
            ctx,
            peers,
            open,
            _acceptor,
        };
        scope.set_at("addr", rank, me.to_string().as_bytes())?;
        // A stranger the acceptor refused meanwhile is the better news than a timeout.
        let addrs =
            published_addrs(scope, world_size).map_err(|e| tcp.ctx.check().err().unwrap_or(e))?;
        let _ = tcp.open.addrs.set(addrs);
        Ok(tcp)
    }

    /// Says what else each pair of ranks agrees on as its link opens (`None`: nothing), once
    /// the transport built on these links is wired: until then links wait to open.
    pub(crate) fn seal(&self, setup: Option<Arc<dyn PairSetup>>) {
        self.open.seal(setup);
    }

    /// What this rank's transports share (see [`Context`]).
    pub(crate) fn context(&self) -> Arc<Context> {
        self.ctx.clone()
    }

    /// Links open now: one per peer this rank has talked with.
    pub fn open_links(&self) -> usize {
        self.peers.count()
    }

    /// The link to `peer`, opened now by `deadline` if the pair has not talked yet.
    pub(crate) fn link_to(&self, peer: usize, deadline: Deadline) -> Result<()> {
        self.link(peer, deadline).map(|_| ())
    }

    fn link(&self, peer: usize, deadline: Deadline) -> Result<&Link> {
        loop {
            if let Some(link) = self.peers.get(peer) {
                return Ok(link);
            }
            self.ctx.check()?;
            match self.peers.turn(peer, deadline) {
                Some(Turn::Open) | Some(Turn::Wait) => {}
                Some(Turn::Dial) => self.dial(peer, deadline)?,
                None => return Err(self.ctx.fail(self.never_opened(peer))),
            }
        }
    }

    /// Dials `peer` (this thread has the turn); a tie leaves the link to the peer's dial.
    fn dial(&self, peer: usize, deadline: Deadline) -> Result<()> {
        match handshake::dial(&self.open, peer, deadline) {
            Ok(Dialed::Link(stream, theirs)) => {
                let link = Link::new(stream, theirs.host).inspect_err(|_| {
                    self.peers.give_up(peer);
                })?;
                let link = self.peers.install(peer, link, true);
                if self.ctx.check().is_err() {
                    link.shut();
                }
                Ok(())
            }
            Ok(Dialed::Tie) => {
                self.peers.await_peer(peer);
                Ok(())
            }
            // Losing a tie can end this way too: the peer's dial, accepted meanwhile, is the link.
            Err(_) if self.peers.dial_failed(peer) => Ok(()),
            Err(e) => Err(self.ctx.fail(e)),
        }
    }

    /// The timeout of a link to `peer` that did not open by the call's deadline.
    fn never_opened(&self, peer: usize) -> CommError {
        CommError::Timeout {
            what: format!("rank {peer} to open its link with rank {}", self.ctx.rank()),
            timeout: self.ctx.timeout(),
            detail: " (is that rank stuck, or not calling this collective?)".into(),
            missing: vec![peer],
        }
    }

    /// Whether `peer`'s end of the link has closed (it exited, was killed, or failed and shut
    /// its links); false where the pair has no link yet. For links that carry no data (pairs on
    /// shared memory) this is how a dead peer shows; it does not block.
    pub(crate) fn peer_closed(&self, peer: usize) -> bool {
        self.peers.get(peer).is_some_and(|link| link.peer_closed())
    }

    fn failure(&self, peer: usize, doing: &'static str, e: std::io::Error) -> CommError {
        let rank = self.ctx.rank();
        let e = match e.kind() {
            _ if went_silent(&e) => CommError::PeerSilent {
                rank,
                peer,
                host: self
                    .peers
                    .get(peer)
                    .map_or("?", |link| link.host())
                    .to_string(),
                doing,
                silence: self.open.beat.silence(),
                phase: crate::phase::now(),
            },
            ErrorKind::WouldBlock | ErrorKind::TimedOut => CommError::Timeout {
                what: format!("rank {peer} while rank {rank} was {doing} it"),
                timeout: self.ctx.timeout(),
                detail: " (is that rank stuck, or did the ranks call different collectives?)"
                    .into(),
                missing: vec![peer],
            },
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::BrokenPipe
            | ErrorKind::ConnectionAborted
            | ErrorKind::WriteZero => CommError::PeerClosed { rank, peer, doing },
            _ => CommError::io(format!("rank {rank} {doing} rank {peer}"), e),
        };
        self.ctx.fail(e)
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        // An acceptor waiting for a setup that will never come stops waiting.
        self.open.seal(None);
    }
}

/// Every rank's published peer address, by rank (one MULTI_GET, waiting for all of them).
fn published_addrs(scope: &Scoped, world_size: usize) -> Result<Vec<SocketAddr>> {
    let values = scope.get_at("addr", 0..world_size)?;
    values
        .into_iter()
        .enumerate()
        .map(|(peer, addr)| {
            let addr = String::from_utf8_lossy(&addr).into_owned();
            addr.parse().map_err(|_| {
                CommError::Peer(format!("rank {peer} published a bad address {addr:?}"))
            })
        })
        .collect()
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.ctx.rank()
    }

    fn world_size(&self) -> usize {
        self.ctx.world_size()
    }

    fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        let deadline = self.ctx.deadline();
        self.ctx.check()?;
        self.link(peer, deadline)?
            .send(data, deadline)
            .map_err(|e| self.failure(peer, "sending to", e))
    }

    fn recv(&self, peer: usize, out: &mut [u8]) -> Result<()> {
        let deadline = self.ctx.deadline();
        self.ctx.check()?;
        let expected = out.len();
        match self.link(peer, deadline)?.recv(out, deadline) {
            Ok(()) => Ok(()),
            Err(RecvError::Io(e)) => Err(self.failure(peer, "receiving from", e)),
            Err(RecvError::Length(len)) => {
                let e = size_mismatch(self.ctx.rank(), peer, len, expected);
                Err(self.ctx.fail(e))
            }
        }
    }

    fn begin_call(&self) -> bool {
        self.ctx.begin_call()
    }

    fn end_call(&self) {
        self.ctx.end_call()
    }

    fn name(&self) -> &'static str {
        match self.ctx.world_size() {
            1 => "none",
            _ => "tcp",
        }
    }
}
