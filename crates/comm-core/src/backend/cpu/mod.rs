//! The CPU backend: Gloo-style collectives on host memory, run by [`algorithms`] (whose
//! [`algorithms::run`] takes any call of the collective table) over a [`Transport`]: shared
//! memory between processes of one host, TCP between hosts (and where asked for), channels
//! between threads.

pub mod algorithms;
mod channel;
pub mod shm;
mod tcp;
mod transport;

pub use channel::ChannelTransport;
pub use shm::{remove_own_segments, ShmTransport};
pub use tcp::TcpTransport;
pub use transport::{threaded_send_recv_with, CallScope, Sink, Transport, PIECE_BYTES};

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
