//! How CPU ranks move bytes between each other. The algorithms only need ordered, reliable
//! point-to-point messages; a transport provides them between processes (TCP) or threads
//! (channels). A message carries its length, so ranks that disagree on sizes get an error, not a
//! hang or garbage.
//!
//! Deadlines: the timeout is one deadline per collective call, not per read. Each collective
//! algorithm opens a [`CallScope`]; every send and receive inside it (on any of the rank's
//! threads) must finish before the deadline set when the call began, however slowly bytes
//! trickle in. A send or receive made outside any call (point-to-point) gets its own deadline.

use std::time::Duration;

pub(crate) use crate::deadline::Deadline;

use super::shm::Region;
use crate::collective::{Call, Collective};
use crate::dtype::{DType, Element, ReduceOp};
use crate::error::{CommError, Result};

/// Ordered, reliable point-to-point messages between the ranks of a group: all the CPU
/// algorithms need.
pub trait Transport: Send + Sync {
    /// This endpoint's rank.
    fn rank(&self) -> usize;
    /// Ranks the transport connects, this one included.
    fn world_size(&self) -> usize;

    /// Sends one message to `peer`. May block until the peer receives, so an algorithm that both
    /// sends and receives at once uses [`Transport::send_recv`] or a thread.
    fn send(&self, peer: usize, data: &[u8]) -> Result<()>;

    /// Receives the next message from `peer`, which must be exactly `out.len()` bytes.
    fn recv(&self, peer: usize, out: &mut [u8]) -> Result<()>;

    /// Sends to `to` while receiving from `from`: the step every ring algorithm takes. Both
    /// halves share one deadline.
    fn send_recv(&self, to: usize, data: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        let _call = CallScope::new(self);
        send_while_receiving(|| self.send(to, data), || self.recv(from, out))
    }

    /// One step of a ring that combines what it receives: sends `data` to `to` while a message
    /// of `len` bytes arrives from `from`, handed to `sink(offset, piece)` in order, piece by
    /// piece, as it comes (a reduction adds each piece to what it holds, with no copy of the
    /// whole message first). Pieces start at multiples of 64 bytes, so they hold whole elements
    /// aligned for any type. Both halves share one deadline.
    fn send_recv_with(
        &self,
        to: usize,
        data: &[u8],
        from: usize,
        len: usize,
        sink: Sink<'_>,
    ) -> Result<()> {
        threaded_send_recv_with(self, to, data, from, len, sink)
    }

    /// Starts one collective call: every send and receive until [`Transport::end_call`] must
    /// finish within the timeout from now. Returns false (and changes nothing) when a call is
    /// already under way, so a collective built of others keeps the outer deadline. Transports
    /// without deadlines need not implement it; use [`CallScope`] rather than calling it.
    fn begin_call(&self) -> bool {
        false
    }

    /// Ends the call [`Transport::begin_call`] started; later sends and receives each get
    /// their own deadline again.
    fn end_call(&self) {}

    /// Short name for messages and reports ("tcp", "channels").
    fn name(&self) -> &'static str;

    /// The peers' registered buffers, read where they lie, where every rank shares this host
    /// and the job agreed on them (shared memory, `--copy registered` or auto): `None` here.
    fn window(&self) -> Option<Box<dyn Window + '_>> {
        None
    }
}

/// The registered buffers of every rank of a host, one call at a time (see the shared-memory
/// transport's `window.rs`): a collective reads its peers' buffers in place instead of sending
/// messages.
pub trait Window {
    /// `bytes` of registered memory for a buffer of this rank: `None` where they do not fit in
    /// /dev/shm and the job may do without (`--copy auto`: the buffer goes on the heap, and its
    /// calls through messages, with a warning); an error saying the size where it may not.
    fn allocate(&self, bytes: usize) -> Result<Option<Region>>;

    /// The size (nccl-tests': the larger buffer) from which a call of `collective` takes the
    /// window: 0 under `--copy registered`, the measured bound under `--copy auto` (smaller
    /// calls go through the rings).
    fn registered_from(&self, collective: Collective) -> usize;

    /// Opens a call of `signature` on this rank's `send` (`None` in place) and `recv`, once every
    /// rank has posted its own: `None` where some rank's buffers are not registered, on every
    /// rank alike (the call then takes messages); an error where a rank makes another call.
    fn open<'c>(
        &'c self,
        signature: Signature,
        send: Option<&[u8]>,
        recv: &[u8],
    ) -> Result<Option<Box<dyn WindowCall + 'c>>>;
}

/// One call on registered buffers, under way: between two [`fence`](WindowCall::fence)s a rank
/// writes only bytes no peer reads in that phase, and reads only bytes nobody writes in it.
pub trait WindowCall {
    /// Rank `peer`'s input: its send buffer, or in place its one buffer (not this rank's own).
    fn input(&self, peer: usize) -> &[u8];
    /// Rank `peer`'s receive buffer (not this rank's own).
    fn output(&self, peer: usize) -> &[u8];
    /// Whether rank `peer` called in place (its input is then its receive buffer).
    fn in_place(&self, peer: usize) -> bool;
    /// Ends a phase: waits until every rank has ended it.
    fn fence(&self) -> Result<()>;
    /// Ends the call: waits until no rank reads this rank's buffers any more.
    fn close(self: Box<Self>) -> Result<()>;
}

/// A collective call as every rank must make it: ranks that read each other's buffers compare
/// theirs first, so a rank that called something else is an error, never a read out of bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Signature {
    collective: u64,
    op: u64,
    root: u64,
    dtype: u64,
    /// The receive buffer's bytes (the send buffer's follow from them and the collective).
    recv_bytes: u64,
}

impl Signature {
    /// `call` on elements of `T`, receiving `recv_bytes`.
    pub fn of<T: Element>(call: &Call, recv_bytes: usize) -> Signature {
        Signature {
            collective: call.collective as u64,
            op: call.op as u64,
            root: call.root as u64,
            dtype: T::DTYPE as u64,
            recv_bytes: recv_bytes as u64,
        }
    }

    /// The call in words, for an error: "all_reduce (sum) of 4096 bytes of float",
    /// "broadcast (root 1) of 8 bytes of int32".
    pub fn words(&self) -> String {
        let collective = Collective::ALL.get(self.collective as usize);
        let op = ReduceOp::ALL
            .get(self.op as usize)
            .map_or("?", |o| o.name());
        let dtype = DType::ALL.iter().find(|&&d| d as u64 == self.dtype);
        let how = match collective.map(|c| c.describe()) {
            Some(d) if d.reduces && d.rooted => format!(" ({op}, root {})", self.root),
            Some(d) if d.reduces => format!(" ({op})"),
            Some(d) if d.rooted => format!(" (root {})", self.root),
            _ => String::new(),
        };
        format!(
            "{}{how} of {} bytes of {}",
            collective.map_or("another collective", |c| c.name()),
            self.recv_bytes,
            dtype.map_or("another type", |d| d.name())
        )
    }

    /// The collective called, if it is one of this build's.
    pub fn collective(&self) -> Option<Collective> {
        Collective::ALL.get(self.collective as usize).copied()
    }

    /// The call's size as nccl-tests counts it on `ranks` ranks: its larger buffer's bytes
    /// (reduce_scatter's input is `ranks` times what it receives; the others receive the most).
    pub fn size(&self, ranks: usize) -> usize {
        let recv = self.recv_bytes as usize;
        match self.collective() {
            Some(Collective::ReduceScatter) => recv * ranks,
            _ => recv,
        }
    }

    /// Whether `other` is this call with other buffer sizes only.
    pub fn sizes_differ(&self, other: &Signature) -> bool {
        self.recv_bytes != other.recv_bytes
            && Signature {
                recv_bytes: self.recv_bytes,
                ..*other
            } == *self
    }
}

/// What [`Transport::send_recv_with`] hands each received piece to: its offset in the message,
/// and its bytes.
pub type Sink<'a> = &'a mut dyn FnMut(usize, &[u8]);

/// How [`Transport::send_recv_with`] works over a transport of whole messages (TCP, channels):
/// `data` goes as messages of [`PIECE_BYTES`] on a second thread, while this one receives the
/// pieces into a buffer of one piece and hands each to `sink`.
pub fn threaded_send_recv_with<T: Transport + ?Sized>(
    t: &T,
    to: usize,
    data: &[u8],
    from: usize,
    len: usize,
    sink: Sink<'_>,
) -> Result<()> {
    let _call = CallScope::new(t);
    send_while_receiving(
        || send_pieces(t, to, data),
        || recv_pieces(t, from, len, sink),
    )
}

/// Runs `send` on a second thread while this one runs `receive`, the two halves of a step; the
/// receive's error first. A transport whose failed receive shuts its links (TCP) frees the
/// sender at once, so it does not wait out the deadline.
pub(crate) fn send_while_receiving(
    send: impl FnOnce() -> Result<()> + Send,
    receive: impl FnOnce() -> Result<()>,
) -> Result<()> {
    std::thread::scope(|s| {
        let sender = s.spawn(send);
        let received = receive();
        let sent = sender
            .join()
            .unwrap_or_else(|_| Err(CommError::Peer("the sending thread panicked".into())));
        received.and(sent)
    })
}

/// `data` to `to` as messages of [`PIECE_BYTES`]: the framing of a step that combines, on a
/// transport of whole messages.
pub(crate) fn send_pieces<T: Transport + ?Sized>(t: &T, to: usize, data: &[u8]) -> Result<()> {
    (0..piece_count(data.len(), PIECE_BYTES))
        .try_for_each(|i| t.send(to, &data[piece(data.len(), PIECE_BYTES, i)]))
}

/// `len` bytes from `from` as [`send_pieces`] sends them, each piece handed to `sink` as it
/// arrives (received into a buffer of one piece).
pub(crate) fn recv_pieces<T: Transport + ?Sized>(
    t: &T,
    from: usize,
    len: usize,
    sink: Sink<'_>,
) -> Result<()> {
    // u64s: the pieces are cast to slices of any element type, which needs alignment.
    let mut buffer = vec![0u64; len.min(PIECE_BYTES).div_ceil(8)];
    let buffer: &mut [u8] = bytemuck::cast_slice_mut(&mut buffer);
    for i in 0..piece_count(len, PIECE_BYTES) {
        let range = piece(len, PIECE_BYTES, i);
        let at = range.start;
        let piece = &mut buffer[..range.len()];
        t.recv(from, piece)?;
        sink(at, piece);
    }
    Ok(())
}

/// How many pieces of `size` bytes a message of `len` bytes travels in: at least one (an empty
/// message still takes one, so that both sides count it).
pub(crate) fn piece_count(len: usize, size: usize) -> usize {
    len.div_ceil(size).max(1)
}

/// The bytes of piece `i` of a message of `len` bytes cut into pieces of `size`.
pub(crate) fn piece(len: usize, size: usize, i: usize) -> std::ops::Range<usize> {
    let at = (i * size).min(len);
    at..(at + size).min(len)
}

/// The piece a message transport sends large buffers in: large enough to amortize a message,
/// small enough that receiving and reducing overlap with the transfer.
pub const PIECE_BYTES: usize = 1 << 20;

/// One collective call on a transport: sets its deadline while alive (unless an outer call
/// already did) and ends the call when dropped, errors and panics included.
pub struct CallScope<'a, T: Transport + ?Sized> {
    transport: &'a T,
    owner: bool,
}

impl<'a, T: Transport + ?Sized> CallScope<'a, T> {
    /// Begins a call on `transport` (see [`Transport::begin_call`]).
    pub fn new(transport: &'a T) -> Self {
        let owner = transport.begin_call();
        CallScope { transport, owner }
    }
}

impl<T: Transport + ?Sized> Drop for CallScope<'_, T> {
    fn drop(&mut self) {
        if self.owner {
            self.transport.end_call();
        }
    }
}

/// The deadline of the collective call under way, shared by all its sends and receives: what a
/// transport's [`Transport::begin_call`] and [`Transport::end_call`] keep.
pub(crate) struct CallClock {
    timeout: Duration,
    call: std::sync::Mutex<Option<Deadline>>,
}

impl CallClock {
    /// No call under way yet; each will have `timeout`.
    pub(crate) fn new(timeout: Duration) -> CallClock {
        CallClock {
            timeout,
            call: std::sync::Mutex::new(None),
        }
    }

    /// [`Transport::begin_call`]: false when a call is already under way.
    pub(crate) fn begin(&self) -> bool {
        let mut call = self.call.lock().unwrap();
        if call.is_some() {
            return false;
        }
        *call = Some(Deadline::after(self.timeout));
        true
    }

    /// [`Transport::end_call`].
    pub(crate) fn end(&self) {
        *self.call.lock().unwrap() = None;
    }

    /// The call's deadline, or `timeout` from now for a send or receive outside any call.
    pub(crate) fn deadline(&self) -> Deadline {
        self.call
            .lock()
            .unwrap()
            .unwrap_or_else(|| Deadline::after(self.timeout))
    }

    /// The timeout each call has.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// The error for a message whose size is not what this rank expected.
pub(crate) fn size_mismatch(me: usize, peer: usize, got: usize, expected: usize) -> CommError {
    CommError::Peer(format!(
        "rank {peer} sent {got} bytes where rank {me} expected {expected}: \
         the ranks disagree on buffer sizes (pass the same length, dtype and root on every rank)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `--copy auto` compares with its bounds: nccl-tests' size, the larger buffer.
    #[test]
    fn a_calls_size_is_its_larger_buffer() {
        let of = |collective, recv| Signature::of::<f32>(&Call::new(collective), recv).size(4);
        assert_eq!(of(Collective::ReduceScatter, 1024), 4096);
        assert_eq!(of(Collective::AllGather, 4096), 4096);
        assert_eq!(of(Collective::AllReduce, 4096), 4096);
        assert_eq!(of(Collective::Broadcast, 4096), 4096);
    }
}
