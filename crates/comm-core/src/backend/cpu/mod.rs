//! The CPU backend: Gloo-style collectives on host memory, run by [`algorithms`] (whose
//! [`algorithms::run`] takes any call of the collective table) over a [`Transport`]: shared
//! memory between processes of one host, TCP between hosts (and where asked for), channels
//! between threads.

pub mod algorithms;
mod channel;
mod connected;
mod context;
pub mod link_plan;
pub mod shm;
mod tcp;
mod traced;
mod transport;

pub use algorithms::{
    algos_of, chosen, registered_schedule, schedule, schedules, Algo, Schedule, CHAIN_SEGMENT_BYTES,
};
pub use channel::ChannelTransport;
pub use connected::{Connected, CopyChoice, TransportChoice, Wiring};
pub use shm::{remove_own_segments, ShmTcpTransport};
pub use tcp::TcpTransport;
pub use traced::Traced;
pub use transport::{
    threaded_send_recv_with, CallScope, Signature, Sink, Transport, Window, WindowCall, PIECE_BYTES,
};

use crate::error::{CommError, Result};
use crate::named::Named;
use crate::store::Scoped;

/// Connects this rank to its peers through the store in `scope` (TCP links listening on `ip`,
/// each opened when its pair first talks, see [`TcpTransport::connect_on`]), and, as `wiring`'s
/// transport says, moves the pairs of one host to shared memory ([`shm`]): `Auto` wherever it
/// can be set up, `Shm` for every pair or an error, `Tcp` nowhere (no shared memory is set up at
/// all); and there, as its `copy` says, large messages go by one copy or two. `timeout` (the
/// job's `--timeout`) bounds connecting and then every collective call, opening the links it
/// needs included; every link is probed as `wiring.heartbeat` says.
pub fn connect(
    scope: &Scoped,
    rank: usize,
    world_size: usize,
    run_id: Option<&str>,
    wiring: impl Into<Wiring>,
    ip: std::net::IpAddr,
    timeout: std::time::Duration,
) -> Result<Connected> {
    let wiring = wiring.into();
    let choice = wiring.transport;
    let params = tcp::LinkParams {
        rank,
        world_size,
        run_id,
        ip,
        timeout,
        beat: wiring.heartbeat,
    };
    let tcp = TcpTransport::connect_with(scope, &params)?;
    if world_size == 1 {
        return Ok(Connected::alone(tcp, "one rank: nothing to move"));
    }
    agree_on_choice(scope, rank, choice)?;
    agree_on_copy(scope, rank, wiring.copy)?;
    match choice {
        TransportChoice::Tcp => Ok(Connected::alone(tcp, "requested")),
        _ => shm::connect(tcp, scope, wiring),
    }
}

/// Every rank must have been given the same `--transport`: rank 0's rules, and a rank given
/// another fails at once saying so (rather than waiting for ranks that took another path).
fn agree_on_choice(scope: &Scoped, rank: usize, choice: TransportChoice) -> Result<()> {
    let ours = choice.name();
    let chosen = scope.rank0_value("transport", ours)?;
    if chosen != ours {
        return Err(CommError::Usage(format!(
            "rank 0 runs --transport {chosen} but rank {rank} was given --transport {ours}; give \
             every rank the same --transport"
        )));
    }
    Ok(())
}

/// Every rank must have been given the same `--copy`, as [`agree_on_choice`] the transport.
fn agree_on_copy(scope: &Scoped, rank: usize, copy: CopyChoice) -> Result<()> {
    let chosen = scope.rank0_value("copy", copy.name())?;
    if chosen != copy.name() {
        return Err(CommError::Usage(format!(
            "rank 0 runs --copy {chosen} but rank {rank} was given --copy {}; give every rank \
             the same --copy",
            copy.name()
        )));
    }
    Ok(())
}
