//! The CPU backend: Gloo-style collectives on host memory, run by [`algorithms`] (whose
//! [`algorithms::run`] takes any call of the collective table) over a [`Transport`]: shared
//! memory between processes of one host, TCP between hosts (and where asked for), channels
//! between threads.

pub mod algorithms;
mod channel;
mod context;
pub mod shm;
mod tcp;
mod traced;
mod transport;

pub use algorithms::{chosen, Algo, CHAIN_SEGMENT_BYTES};
pub use channel::ChannelTransport;
pub use shm::{remove_own_segments, ShmTcpTransport};
pub use tcp::TcpTransport;
pub use traced::Traced;
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

use crate::error::{CommError, Result};
use crate::store::Scoped;

/// A rank's transport to every peer, and why it is the one it is (the transport line's words:
/// `requested`, `shared memory between the 4 ranks of this host`, ...).
pub struct Connected {
    /// TCP alone, or shared memory to the ranks of this host and TCP to the others.
    pub transport: Box<dyn Transport>,
    /// Why.
    pub why: String,
}

impl Connected {
    fn alone(tcp: TcpTransport, why: &str) -> Connected {
        Connected {
            transport: Box::new(tcp),
            why: why.into(),
        }
    }
}

/// Connects this rank to every peer through the store in `scope` (TCP links listening on
/// `ip`, see [`TcpTransport::connect_on`]), then, as `choice` says, moves the pairs of one host
/// to shared memory ([`shm`]): `Auto` wherever it can be set up, `Shm` for every pair or an
/// error, `Tcp` nowhere (no shared memory is set up at all).
pub fn connect(
    scope: &Scoped,
    rank: usize,
    world_size: usize,
    run_id: Option<&str>,
    choice: TransportChoice,
    ip: std::net::IpAddr,
) -> Result<Connected> {
    let tcp = TcpTransport::connect_on(scope, rank, world_size, run_id, ip)?;
    if world_size == 1 {
        return Ok(Connected::alone(tcp, "one rank: nothing to move"));
    }
    agree_on_choice(scope, rank, choice)?;
    match choice {
        TransportChoice::Tcp => Ok(Connected::alone(tcp, "requested")),
        _ => shm::connect(tcp, scope, choice),
    }
}

/// Every rank must have been given the same `--transport`: rank 0's rules, and a rank given
/// another fails at once saying so (rather than waiting for ranks that took another path).
fn agree_on_choice(scope: &Scoped, rank: usize, choice: TransportChoice) -> Result<()> {
    use clap::ValueEnum;
    let ours = choice
        .to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_string());
    let chosen = scope.rank0_value("transport", &ours)?;
    if chosen != ours {
        return Err(CommError::Usage(format!(
            "rank 0 runs --transport {chosen} but rank {rank} was given --transport {ours}; give \
             every rank the same --transport"
        )));
    }
    Ok(())
}
