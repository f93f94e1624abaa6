//! What connecting a CPU rank is asked for (`--transport`) and what it gives: a module of its
//! own so that `connect` (in `mod.rs`) and the shared-memory transport it builds (`shm/`) both
//! use it without importing each other.

use super::tcp::TcpTransport;
use super::transport::Transport;
use crate::heartbeat::Heartbeat;
use crate::named::Named;

/// What the user asked for with `--transport`: how CPU ranks move bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportChoice {
    /// Shared memory between ranks of one host, TCP between hosts.
    #[default]
    Auto,
    /// Shared memory between every pair; an error where ranks do not share a host.
    Shm,
    /// TCP between every pair, even on one host (what Gloo does).
    Tcp,
}

/// How ranks of one host that share memory move large messages (`--copy`), as NCCL_P2P_DISABLE
/// and NCCL_SHM_DISABLE choose between NCCL's P2P and SHM transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CopyChoice {
    /// Registered buffers where every rank shares one host and can open its peers' memory, for
    /// calls from the size where they were measured faster than the rings (`registered_from`:
    /// below it their two barriers cost more than the messages; docs/src/transports.md); for
    /// smaller calls and other buffers, one copy (cross-memory attach) from the size where it
    /// was measured to win, where every pair of the job's hosts can read each other's memory;
    /// two copies through the rings otherwise (on the 2-core VM it was measured on, one copy
    /// lost at every size: the rings).
    #[default]
    Auto,
    /// One copy for every message: the receiver reads the sender's buffer itself
    /// (`process_vm_readv`); an error where a pair cannot.
    Single,
    /// Two copies for every message: into a ring of shared memory, and out of it.
    Ring,
    /// Buffers the communicator allocates live in shared memory every rank of the host maps, and
    /// a collective reads its peers' buffers where they lie: one copy, no message (an error
    /// where the ranks do not all share one host, or a peer's memory cannot be opened); other
    /// buffers go through the rings.
    Registered,
}

impl Named for TransportChoice {
    const ALL: &'static [Self] = &[Self::Auto, Self::Shm, Self::Tcp];

    fn name(self) -> &'static str {
        match self {
            TransportChoice::Auto => "auto",
            TransportChoice::Shm => "shm",
            TransportChoice::Tcp => "tcp",
        }
    }
}

impl Named for CopyChoice {
    const ALL: &'static [Self] = &[Self::Auto, Self::Single, Self::Ring, Self::Registered];

    fn name(self) -> &'static str {
        match self {
            CopyChoice::Auto => "auto",
            CopyChoice::Single => "single",
            CopyChoice::Ring => "ring",
            CopyChoice::Registered => "registered",
        }
    }
}

/// What connecting a CPU rank is asked for: `--transport` and `--copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wiring {
    /// Which transport between which pairs.
    pub transport: TransportChoice,
    /// How pairs that share memory move large messages.
    pub copy: CopyChoice,
    /// For tests: this rank's check that it can read its peers' memory fails, as on a host
    /// whose policy refuses cross-memory reads.
    #[doc(hidden)]
    pub refuse_cross_memory: bool,
    /// For tests: this rank's check that it can open its peers' registered buffers fails, as
    /// on a host that forbids one process to open another's memory files.
    #[doc(hidden)]
    pub refuse_registered: bool,
    /// How each link is probed (`--heartbeat`): a peer silent for its bound is an error.
    pub heartbeat: Heartbeat,
}

impl From<TransportChoice> for Wiring {
    /// `transport`, copying as `--copy auto` does.
    fn from(transport: TransportChoice) -> Wiring {
        Wiring {
            transport,
            copy: CopyChoice::Auto,
            refuse_cross_memory: false,
            refuse_registered: false,
            heartbeat: Heartbeat::default(),
        }
    }
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
    /// TCP for every pair: its links open with nothing else to agree on.
    pub(super) fn alone(tcp: TcpTransport, why: &str) -> Connected {
        tcp.seal(None);
        Connected {
            transport: Box::new(tcp),
            why: why.into(),
        }
    }
}
