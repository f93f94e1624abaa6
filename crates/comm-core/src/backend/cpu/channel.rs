//! Threads as ranks: an in-process transport over crossbeam channels, one per ordered pair of
//! ranks. The test suite uses it to cover many world sizes quickly.

use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};

use super::transport::{size_mismatch, CallClock, CallScope, Transport};
use crate::error::{CommError, Result};

/// One thread's endpoint of a [`ChannelTransport::mesh`]; messages to a thread that ended
/// fail as [`CommError::PeerGone`].
pub struct ChannelTransport {
    rank: usize,
    to: Vec<Sender<Vec<u8>>>,
    from: Vec<Receiver<Vec<u8>>>,
    /// The deadline of the collective call under way.
    clock: CallClock,
}

impl ChannelTransport {
    /// A fully connected set of `world_size` endpoints; give one to each thread.
    pub fn mesh(world_size: usize, timeout: Duration) -> Vec<ChannelTransport> {
        // channels[src][dst]
        let channels: Vec<Vec<_>> = (0..world_size)
            .map(|_| (0..world_size).map(|_| unbounded()).collect())
            .collect();
        (0..world_size)
            .map(|rank| ChannelTransport {
                rank,
                to: (0..world_size)
                    .map(|dst| channels[rank][dst].0.clone())
                    .collect(),
                from: (0..world_size)
                    .map(|src| channels[src][rank].1.clone())
                    .collect(),
                clock: CallClock::new(timeout),
            })
            .collect()
    }
}

impl Transport for ChannelTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.to.len()
    }

    fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        self.to[peer]
            .send(data.to_vec())
            .map_err(|_| CommError::PeerGone {
                rank: self.rank,
                peer,
            })
    }

    fn recv(&self, peer: usize, out: &mut [u8]) -> Result<()> {
        let deadline = self.clock.deadline();
        let received = match deadline.remaining() {
            Some(left) => self.from[peer].recv_timeout(left),
            None => self.from[peer]
                .recv()
                .map_err(|_| RecvTimeoutError::Disconnected),
        };
        let message = received.map_err(|e| match e {
            RecvTimeoutError::Timeout => CommError::Timeout {
                what: format!("rank {peer} to send to rank {}", self.rank),
                timeout: self.clock.timeout(),
                detail: String::new(),
                missing: vec![peer],
            },
            RecvTimeoutError::Disconnected => CommError::PeerGone {
                rank: self.rank,
                peer,
            },
        })?;
        if message.len() != out.len() {
            return Err(size_mismatch(self.rank, peer, message.len(), out.len()));
        }
        out.copy_from_slice(&message);
        Ok(())
    }

    /// Sends never block here, so no thread is needed.
    fn send_recv(&self, to: usize, data: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        let _call = CallScope::new(self);
        self.send(to, data)?;
        self.recv(from, out)
    }

    fn begin_call(&self) -> bool {
        self.clock.begin()
    }

    fn end_call(&self) {
        self.clock.end()
    }

    fn name(&self) -> &'static str {
        "channels"
    }
}
