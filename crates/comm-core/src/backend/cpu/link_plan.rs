//! How a CPU rank links up with the other ranks of a communicator: the flags' transport and
//! copy, the address it listens on, the run it belongs to, the timeout, and whether it is traced.
//! The job makes one plan and connects its communicators by it; a split's groups connect by the
//! same plan under a prefix of their own, so every group has links of its own (its own sockets and
//! shared-memory rings), and a group's messages never mix with its parent's.

use std::net::IpAddr;
use std::time::Duration;

use super::{connect, Traced, Transport, Wiring};
use crate::error::Result;
use crate::store::Scoped;

/// What every communicator of a rank is connected with (see the module's documentation).
#[derive(Debug, Clone)]
pub struct LinkPlan {
    /// `--transport` and `--copy`.
    pub wiring: Wiring,
    /// Where this rank listens for its peers (GLOO_SOCKET_IFNAME's address, or the one the
    /// store is reached from).
    pub ip: IpAddr,
    /// The run's id: a peer of another run is refused.
    pub run_id: Option<String>,
    /// Bounds connecting, then every collective call (`--timeout`).
    pub timeout: Duration,
    /// Whether every send and receive goes into the trace (`--trace`).
    pub traced: bool,
}

/// A communicator's links: the transport and the line that says what moves its bytes.
pub struct Linked {
    /// What the algorithms run over.
    pub transport: Box<dyn Transport>,
    /// `transport: shm (shared memory between the 4 ranks of this host)`; a group's line names
    /// the group: `transport (tp 0): …`.
    pub line: String,
}

impl LinkPlan {
    /// Connects the ranks that meet in `scope` (the job's, or a group's: [`Scoped::among`]),
    /// this one at its seat there. `group` names a split's group, in the transport line and
    /// the trace.
    pub fn connect(&self, scope: &Scoped, group: Option<&str>) -> Result<Linked> {
        let (rank, size) = scope.seat();
        let run_id = self.run_id.as_deref();
        let connected = connect(
            scope,
            rank,
            size,
            run_id,
            self.wiring,
            self.ip,
            self.timeout,
        )?;
        let what = format!("{} ({})", connected.transport.name(), connected.why);
        let line = match group {
            Some(group) => format!("transport ({group}): {what}"),
            None => format!("transport: {what}"),
        };
        let transport = match self.traced {
            true => Box::new(Traced::new(connected.transport, group)),
            false => connected.transport,
        };
        Ok(Linked { transport, line })
    }
}
