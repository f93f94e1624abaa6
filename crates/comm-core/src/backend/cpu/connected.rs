//! What connecting a CPU rank is asked for (`--transport`) and what it gives: a module of its
//! own so that `connect` (in `mod.rs`) and the shared-memory transport it builds (`shm/`) both
//! use it without importing each other.

use super::tcp::TcpTransport;
use super::transport::Transport;

/// What the user asked for with `--transport`: how CPU ranks move bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportChoice {
    /// Shared memory between ranks of one host, TCP between hosts.
    Auto,
    /// Shared memory between every pair; an error where ranks do not share a host.
    Shm,
    /// TCP between every pair, even on one host (what Gloo does).
    Tcp,
}

/// A rank's transport to every peer, and why it is the one it is (the transport line's words:
/// `requested`, `shared memory between the 4 ranks of this host`, ...).
pub struct Connected {
    /// TCP alone, or shared memory to the ranks of this host and TCP to the others.
    pub transport: Box<dyn Transport>,
    /// Why.
    pub why: String,
}

impl Connected {
    pub(super) fn alone(tcp: TcpTransport, why: &str) -> Connected {
        Connected {
            transport: Box::new(tcp),
            why: why.into(),
        }
    }
}
