//! How CPU ranks move bytes between each other. The algorithms only need ordered, reliable
//! point-to-point messages; a transport provides them between processes (TCP) or threads
//! (channels). A message carries its length, so ranks that disagree on sizes get an error, not a
//! hang or garbage.

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

    /// Sends to `to` while receiving from `from`: the step every ring algorithm takes.
    fn send_recv(&self, to: usize, data: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        std::thread::scope(|s| {
            let sender = s.spawn(|| self.send(to, data));
            let received = self.recv(from, out);
            let sent = sender
                .join()
                .unwrap_or_else(|_| Err(CommError::Peer("the sending thread panicked".into())));
            received.and(sent)
        })
    }

    /// Short name for messages and reports ("tcp", "channels").
    fn name(&self) -> &'static str;
}

/// The error for a message whose size is not what this rank expected.
pub(crate) fn size_mismatch(me: usize, peer: usize, got: usize, expected: usize) -> CommError {
    CommError::Peer(format!(
        "rank {peer} sent {got} bytes where rank {me} expected {expected}: \
         the ranks disagree on buffer sizes (pass the same length, dtype and root on every rank)"
    ))
}
