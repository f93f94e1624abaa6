//! Shared memory's data path: how a message moves between two ranks of a host once their rings
//! are wired (`wiring.rs`): through the slots of a ring, two copies, or by one copy out of the
//! sender's buffer (cross-memory attach), the wait for a slot or a reader between, and TCP for
//! the ranks of other hosts.

use std::sync::Arc;

use super::cma;
use super::pair::Pair;
use super::pairing::Arming;
use super::ring::{Doorbell, Ring};
use super::waiting::{Pacing, Waiter};
use super::window::Window;
use crate::backend::cpu::context::Context;
use crate::backend::cpu::tcp::TcpTransport;
use crate::backend::cpu::transport::{
    self, piece, piece_count, recv_pieces, send_pieces, send_while_receiving, size_mismatch,
    CallScope, Deadline, Sink, Transport,
};
use crate::error::{CommError, Result};
use crate::streaming::{copy, Stores};
use crate::trace;

/// Processes as ranks: shared memory to the ranks of this host, TCP to the others (see
/// [`super`]'s documentation). Built by `wiring::connect` where a peer shares this host.
pub struct ShmTcpTransport {
    /// Links to every peer: the data path to ranks of other hosts, and everywhere the signal
    /// that a peer has gone or failed.
    tcp: TcpTransport,
    /// The rank, the call's deadline and the first failure, shared with `tcp`.
    ctx: Arc<Context>,
    /// Per peer: the rings shared with it once the pair has talked (`pairing.rs`), and the
    /// mappings they point into; none where bytes go over TCP.
    arming: Arc<Arming>,
    /// Peers of this host, which share memory with it as they talk.
    host_peers: usize,
    /// This rank's doorbell, rung by peers that fill or free a slot it may wait for.
    doorbell: Doorbell,
    /// Messages of this many bytes or more go by one copy (cross-memory attach); `None`: all
    /// through the rings.
    single_from: Option<usize>,
    /// Every rank's registered buffers, where the job has them (every rank on this host).
    window: Option<Window>,
    /// How long a waiting rank spins and yields before it sleeps.
    pacing: Pacing,
}

/// Where a received message goes.
enum Dest<'a> {
    /// Into this buffer, whose writes take these stores.
    Buffer(&'a mut [u8], Stores),
    /// Piece by piece to a sink (see [`Transport::send_recv_with`]).
    Sink(Sink<'a>),
}

impl Dest<'_> {
    /// Hands over the piece at `offset`.
    fn put(&mut self, offset: usize, piece: &[u8]) {
        match self {
            Dest::Buffer(out, stores) => {
                trace::timed("ring", "copy out of the ring", piece.len(), || {
                    copy(*stores, &mut out[offset..offset + piece.len()], piece)
                })
            }
            Dest::Sink(sink) => sink(offset, piece),
        }
    }
}

impl ShmTcpTransport {
    /// The transport over `tcp` (sealed with `arming`, which each link's opening runs) whose
    /// `host_peers` peers of this host get rings as each pair first talks, woken by `doorbell`;
    /// messages from `single_from` bytes go by one copy.
    pub(super) fn new(
        tcp: TcpTransport,
        arming: Arc<Arming>,
        host_peers: usize,
        doorbell: Doorbell,
        single_from: Option<usize>,
    ) -> ShmTcpTransport {
        ShmTcpTransport {
            ctx: tcp.context(),
            tcp,
            arming,
            host_peers,
            doorbell,
            single_from,
            window: None,
            pacing: Pacing::for_host(1, 1),
        }
    }

    /// The transport with `window` on the registered buffers, waiting as `pacing` says.
    pub(super) fn with_window(mut self, window: Option<Window>, pacing: Pacing) -> Self {
        self.window = window;
        self.pacing = pacing;
        self
    }

    /// Ranks this rank reaches through shared memory, as they talk: its host's.
    pub fn shared_peers(&self) -> usize {
        self.host_peers
    }

    /// The rings shared with `peer`, once the pair's link is open (opened now if the pair has
    /// not talked yet, by the call's deadline) and its rings armed; `None` where bytes to it go
    /// over TCP.
    fn pair(&self, peer: usize) -> Result<Option<&Pair>> {
        self.tcp.link_to(peer, self.ctx.deadline())?;
        Ok(self.arming.pair(peer))
    }

    /// Waits until `ready()` holds, checked after every ring of this rank's doorbell, as
    /// [`Waiter::wait`] does; the error names the first peer in `watch` at the deadline.
    fn wait(
        &self,
        deadline: Deadline,
        ready: impl FnMut() -> bool,
        watch: &[(usize, &'static str)],
    ) -> Result<()> {
        let timed_out = || {
            let (peer, doing) = watch[0];
            let rank = self.ctx.rank();
            let what = format!("rank {peer} while rank {rank} was {doing} it");
            self.waiter().timeout(what, vec![peer])
        };
        // A peer owed to this rank in this call that waits at a barrier of registered buffers
        // is in another call.
        let astray = || {
            let window = self.window.as_ref()?;
            watch.iter().find_map(|&(peer, doing)| {
                let theirs = window.ahead(peer)?;
                Some(window.ahead_error(peer, theirs, doing))
            })
        };
        self.waiter()
            .wait(self.doorbell, deadline, ready, watch, astray, timed_out)
    }

    /// How this rank waits.
    fn waiter(&self) -> Waiter<'_> {
        Waiter {
            ctx: &self.ctx,
            tcp: &self.tcp,
            pacing: self.pacing,
        }
    }

    /// The next message from shared-memory peer `peer` (through `pair`), which must be `len`
    /// bytes, into `dest`: a buffer at once, or a sink piece by piece.
    fn recv_from(&self, pair: &Pair, peer: usize, len: usize, mut dest: Dest<'_>) -> Result<()> {
        let deadline = self.ctx.deadline();
        self.ctx.check()?;
        let ring = pair.incoming.lock().unwrap();
        let size = ring.slot_bytes();
        if self.single_copy(len) {
            self.wait(deadline, || ring.can_read(), &[(peer, "receiving from")])?;
            return self.take_reference(pair, &ring, peer, len, &mut dest);
        }
        for i in 0..piece_count(len, size) {
            self.wait(deadline, || ring.can_read(), &[(peer, "receiving from")])?;
            self.take_piece(pair, &ring, peer, len, i * size, &mut dest)?;
        }
        Ok(())
    }

    /// A step that combines with a shared-memory peer on one side and a TCP peer on the other.
    /// Each link keeps the framing that link's kind has in this step on every rank: one message
    /// through the ring to or from the shared-memory peer (as [`Self::exchange`] sends and takes
    /// it), pieces of PIECE_BYTES over TCP (as a TCP-only rank's step does). Were the two sides
    /// framed alike, a neighbour whose both peers share its memory would read a piece where it
    /// expects the whole message.
    fn mixed_send_recv_with(
        &self,
        to: usize,
        data: &[u8],
        from: usize,
        len: usize,
        sink: Sink<'_>,
    ) -> Result<()> {
        let _call = CallScope::new(self);
        send_while_receiving(
            || match self.pair(to)? {
                Some(_) => self.send(to, data),
                None => send_pieces(&self.tcp, to, data),
            },
            || match self.pair(from)? {
                Some(pair) => self.recv_from(pair, from, len, Dest::Sink(sink)),
                None => recv_pieces(&self.tcp, from, len, sink),
            },
        )
    }

    /// Whether a message of `len` bytes goes by one copy.
    fn single_copy(&self, len: usize) -> bool {
        self.single_from.is_some_and(|from| len >= from && len > 0)
    }

    /// Reads the next slot of `ring` (from `peer`), part of a message that must be `len` bytes,
    /// into `dest` at `offset`; the piece is `len - offset` bytes at most one slot.
    fn take_piece(
        &self,
        pair: &Pair,
        ring: &Ring,
        peer: usize,
        len: usize,
        offset: usize,
        dest: &mut Dest<'_>,
    ) -> Result<()> {
        let (message_len, slot) = ring.peek();
        if message_len != len {
            // The rest of that message still fills slots: the pair is out of step for good.
            let e = size_mismatch(self.ctx.rank(), peer, message_len, len);
            return Err(self.ctx.fail(e));
        }
        let piece = (len - offset).min(ring.slot_bytes());
        dest.put(offset, &slot[..piece]);
        ring.release();
        pair.bell.ring();
        Ok(())
    }

    /// Takes the message of `len` bytes that `peer` posted by reference in the next slot of
    /// `ring`: reads it out of the peer's buffer into `dest` (a buffer at once, a sink piece by
    /// piece), then tells the peer it may reuse its buffer.
    fn take_reference(
        &self,
        pair: &Pair,
        ring: &Ring,
        peer: usize,
        len: usize,
        dest: &mut Dest<'_>,
    ) -> Result<()> {
        let (message_len, slot) = ring.peek();
        let (at, posted) = reference_of(slot);
        if message_len != len || posted != len {
            let e = size_mismatch(self.ctx.rank(), peer, message_len, len);
            return Err(self.ctx.fail(e));
        }
        ring.release();
        pair.bell.ring();
        let read = match dest {
            Dest::Buffer(out, _) => read_peer(pair.pid, at, out),
            Dest::Sink(sink) => {
                let mut staging = pair.staging.lock().unwrap();
                let piece_bytes = cma::PIECE_BYTES;
                // u64s: the pieces are cast to slices of any element type.
                let words = len.min(piece_bytes).div_ceil(8).max(staging.len());
                staging.resize(words, 0);
                let buffer: &mut [u8] = bytemuck::cast_slice_mut(&mut staging[..]);
                (0..piece_count(len, piece_bytes)).try_for_each(|i| {
                    let range = piece(len, piece_bytes, i);
                    let buffer = &mut buffer[..range.len()];
                    read_peer(pair.pid, at + range.start, buffer)?;
                    sink(range.start, buffer);
                    Ok(())
                })
            }
        };
        if let Err(e) = read {
            let rank = self.ctx.rank();
            return Err(self.ctx.fail(CommError::Backend(format!(
                "rank {rank} could not read rank {peer}'s buffer by cross-memory attach: {e}"
            ))));
        }
        ring.mark_done();
        pair.bell.ring();
        Ok(())
    }

    /// Both halves of a step with a shared-memory peer on each side (see `send_recv_with`):
    /// `data` to `to` while `len` bytes from `from` go to `dest`, each by one copy or by the
    /// ring as its size says.
    fn exchange(
        &self,
        (to, out_pair): (usize, &Pair),
        data: &[u8],
        (from, in_pair): (usize, &Pair),
        len: usize,
        mut dest: Dest<'_>,
    ) -> Result<()> {
        let deadline = self.ctx.deadline();
        self.ctx.check()?;
        let outgoing = out_pair.outgoing.lock().unwrap();
        let incoming = in_pair.incoming.lock().unwrap();
        let (out_size, in_size) = (outgoing.slot_bytes(), incoming.slot_bytes());
        let (send_ref, take_ref) = (self.single_copy(data.len()), self.single_copy(len));
        let to_send = if send_ref {
            1
        } else {
            piece_count(data.len(), out_size)
        };
        let to_take = if take_ref {
            1
        } else {
            piece_count(len, in_size)
        };
        let (mut sent, mut taken) = (0, 0);
        // The count of `done` that says the peer has read our posted buffer.
        let mut awaiting: Option<u32> = None;
        while sent < to_send || awaiting.is_some() || taken < to_take {
            let can_send = |sent: usize| sent < to_send && outgoing.can_write();
            let can_take = |taken: usize| taken < to_take && incoming.can_read();
            let is_done = |awaiting: Option<u32>| awaiting.is_some_and(|t| outgoing.done() == t);
            if !can_send(sent) && !can_take(taken) && !is_done(awaiting) {
                // Only the peers still owed something: one that has all it needs from this
                // rank may finish its part and exit.
                let watch: Vec<_> = [
                    (taken < to_take).then_some((from, "receiving from")),
                    (sent < to_send || awaiting.is_some()).then_some((to, "sending to")),
                ]
                .into_iter()
                .flatten()
                .collect();
                let ready = || can_send(sent) || can_take(taken) || is_done(awaiting);
                self.wait(deadline, ready, &watch)?;
            }
            if can_send(sent) {
                match send_ref {
                    true => awaiting = Some(post_reference(&outgoing, data)),
                    false => write_piece(&outgoing, data, piece(data.len(), out_size, sent)),
                }
                out_pair.bell.ring();
                sent += 1;
            }
            if can_take(taken) {
                match take_ref {
                    true => self.take_reference(in_pair, &incoming, from, len, &mut dest)?,
                    false => {
                        let offset = taken * in_size;
                        self.take_piece(in_pair, &incoming, from, len, offset, &mut dest)?
                    }
                }
                taken += 1;
            }
            if is_done(awaiting) {
                awaiting = None;
            }
        }
        Ok(())
    }
}

/// Copies `data[range]`, a piece of a message of `data.len()` bytes, into the next slot of
/// `ring` (which must have one free): the first of the two copies, a "ring" slice when tracing.
fn write_piece(ring: &Ring, data: &[u8], range: std::ops::Range<usize>) {
    let piece = &data[range];
    trace::timed("ring", "copy into the ring", piece.len(), || {
        ring.write(data.len(), piece)
    })
}

/// Reads `out.len()` bytes at `at` in process `pid`: the one copy, a "read" slice when tracing.
fn read_peer(pid: libc::pid_t, at: usize, out: &mut [u8]) -> std::io::Result<()> {
    trace::timed("read", "read the sender's buffer", out.len(), || {
        cma::read(pid, at, out)
    })
}

/// Posts `data` by reference in the next slot of `ring` (which must have one free): its address
/// and length, for the receiver to read it itself. Returns the count of `done` that says the
/// receiver has; `data` must stay as it is until then.
fn post_reference(ring: &Ring, data: &[u8]) -> u32 {
    let target = ring.done().wrapping_add(1);
    let mut posted = [0u8; 16];
    posted[..8].copy_from_slice(&(data.as_ptr() as u64).to_ne_bytes());
    posted[8..].copy_from_slice(&(data.len() as u64).to_ne_bytes());
    ring.write(data.len(), &posted);
    target
}

/// The address and length [`post_reference`] wrote in `slot`.
fn reference_of(slot: &[u8]) -> (usize, usize) {
    let word = |at: usize| u64::from_ne_bytes(slot[at..at + 8].try_into().unwrap()) as usize;
    (word(0), word(8))
}

impl Transport for ShmTcpTransport {
    fn rank(&self) -> usize {
        self.ctx.rank()
    }

    fn world_size(&self) -> usize {
        self.ctx.world_size()
    }

    fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        let Some(pair) = self.pair(peer)? else {
            return self.tcp.send(peer, data);
        };
        let deadline = self.ctx.deadline();
        self.ctx.check()?;
        let ring = pair.outgoing.lock().unwrap();
        if self.single_copy(data.len()) {
            let watch = &[(peer, "sending to")];
            self.wait(deadline, || ring.can_write(), watch)?;
            let target = post_reference(&ring, data);
            pair.bell.ring();
            return self.wait(deadline, || ring.done() == target, watch);
        }
        let size = ring.slot_bytes();
        for i in 0..piece_count(data.len(), size) {
            self.wait(deadline, || ring.can_write(), &[(peer, "sending to")])?;
            write_piece(&ring, data, piece(data.len(), size, i));
            pair.bell.ring();
        }
        Ok(())
    }

    fn recv(&self, peer: usize, out: &mut [u8]) -> Result<()> {
        let Some(pair) = self.pair(peer)? else {
            return self.tcp.recv(peer, out);
        };
        let len = out.len();
        self.recv_from(
            pair,
            peer,
            len,
            Dest::Buffer(out, Stores::for_destination(len)),
        )
    }

    fn send_recv(&self, to: usize, data: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        let (Some(out_pair), Some(in_pair)) = (self.pair(to)?, self.pair(from)?) else {
            // A TCP peer on one side: a whole message each way, as a step on either kind of
            // link takes on every rank, the sending on a second thread.
            let _call = CallScope::new(self);
            return send_while_receiving(|| self.send(to, data), || self.recv(from, out));
        };
        let len = out.len();
        let dest = Dest::Buffer(out, Stores::for_destination(len));
        self.exchange((to, out_pair), data, (from, in_pair), len, dest)
    }

    /// Between two shared-memory peers, one thread does both halves: it fills a slot of the
    /// next rank whenever one is free and takes one from the previous rank whenever one is
    /// full, so the peer's copy of the next piece overlaps this rank's work on the current one.
    /// A message that goes by one copy takes one slot, its address, and the sender waits until
    /// the receiver has read it.
    fn send_recv_with(
        &self,
        to: usize,
        data: &[u8],
        from: usize,
        len: usize,
        sink: Sink<'_>,
    ) -> Result<()> {
        let (Some(out_pair), Some(in_pair)) = (self.pair(to)?, self.pair(from)?) else {
            return self.mixed_send_recv_with(to, data, from, len, sink);
        };
        self.exchange((to, out_pair), data, (from, in_pair), len, Dest::Sink(sink))
    }

    fn begin_call(&self) -> bool {
        self.ctx.begin_call()
    }

    fn end_call(&self) {
        self.ctx.end_call()
    }

    fn window(&self) -> Option<Box<dyn transport::Window + '_>> {
        let window = self.window.as_ref()?;
        Some(Box::new(window.with(self.waiter(), &self.arming)))
    }

    fn name(&self) -> &'static str {
        match self.shared_peers() == self.world_size() - 1 {
            true => "shm",
            false => "shm+tcp",
        }
    }
}
