//! Processes as ranks: one TCP connection per pair of ranks, on one machine or across nodes, in
//! two rooms as gloo's listener and pair: `handshake.rs` opens the links through the rendezvous
//! store (each rank connects to every lower rank and accepts every higher one, a hello each way:
//! `hello.rs`), and `link.rs` carries one link's messages once it is open. This file joins them
//! into the rank's transport.
//!
//! After the handshake the timeout is one deadline per collective call (see
//! [`super::transport`]): each blocking read or write waits at most the time left, so bytes that
//! trickle in cannot stretch it. The first failure on any link shuts every link of the rank, so
//! no other thread of the call waits out the deadline too, and every later operation fails at
//! once with that first error.

mod handshake;
mod hello;
mod link;

use std::io::ErrorKind;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use hello::Hello;
use link::{Link, RecvError};

use super::context::Context;
use super::transport::{size_mismatch, Deadline, Transport};
use crate::error::{CommError, Result};
use crate::store::Scoped;

/// One process's TCP connections to every other rank, set up through the rendezvous store.
pub struct TcpTransport {
    /// The rank, the call's deadline and the first failure, shared with a transport that
    /// carries some pairs over shared memory: a failure shuts every link.
    ctx: Arc<Context>,
    links: Vec<Option<Link>>,
}

impl TcpTransport {
    /// Connects every pair of ranks, exchanging addresses through the store in `scope`.
    /// `run_id` names the run (torchrun's `--rdzv-id`, Slurm's job and step, self-spawn's own):
    /// a peer of another run is refused. Ranks started by hand have none, and then run ids are
    /// not compared. Everything must be connected within `timeout` (the job's `--timeout`),
    /// which then bounds each collective call.
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
        let deadline = Deadline::after(timeout);
        let listener = TcpListener::bind((ip, 0))
            .map_err(|e| CommError::io(format!("rank {rank} cannot listen for peers"), e))?;
        let ours = Hello {
            rank,
            world_size,
            run_id: run_id.map(str::to_string),
        };
        let opened = handshake::open_all(scope, &listener, &ours, deadline, timeout)?;
        let mut links: Vec<Option<Link>> = (0..world_size).map(|_| None).collect();
        let mut shutters = Vec::new();
        for (peer, stream) in opened {
            let link = Link::new(stream)?;
            shutters.push(link.shutter()?);
            links[peer] = Some(link);
        }
        let ctx = Context::new(rank, world_size, timeout);
        // The first failure shuts every link, so no other thread of this rank waits on one.
        ctx.on_failure(move || {
            for shutter in &shutters {
                let _ = shutter.shutdown(std::net::Shutdown::Both);
            }
        });
        Ok(TcpTransport { ctx, links })
    }

    /// What this rank's transports share (see [`Context`]).
    pub(crate) fn context(&self) -> Arc<Context> {
        self.ctx.clone()
    }

    fn link(&self, peer: usize) -> &Link {
        self.links[peer]
            .as_ref()
            .unwrap_or_else(|| panic!("rank {} has no link to rank {peer}", self.ctx.rank()))
    }

    /// Whether `peer`'s end of the link has closed (it exited, was killed, or failed and shut
    /// its links). For links that carry no data (pairs on shared memory) this is how a dead
    /// peer shows; it does not block.
    pub(crate) fn peer_closed(&self, peer: usize) -> bool {
        self.link(peer).peer_closed()
    }

    fn failure(&self, peer: usize, doing: &'static str, e: std::io::Error) -> CommError {
        let e = match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => CommError::Timeout {
                what: format!("rank {peer} while rank {} was {doing} it", self.ctx.rank()),
                timeout: self.ctx.timeout(),
                detail: " (is that rank stuck, or did the ranks call different collectives?)"
                    .into(),
                missing: vec![peer],
            },
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::BrokenPipe
            | ErrorKind::ConnectionAborted
            | ErrorKind::WriteZero => CommError::PeerClosed {
                rank: self.ctx.rank(),
                peer,
                doing,
            },
            _ => CommError::io(format!("rank {} {doing} rank {peer}", self.ctx.rank()), e),
        };
        self.ctx.fail(e)
    }
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
        self.link(peer)
            .send(data, deadline)
            .map_err(|e| self.failure(peer, "sending to", e))
    }

    fn recv(&self, peer: usize, out: &mut [u8]) -> Result<()> {
        let deadline = self.ctx.deadline();
        self.ctx.check()?;
        let expected = out.len();
        match self.link(peer).recv(out, deadline) {
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
