//! One error type for the whole library. Every message says what happened, where (rank, key,
//! host:port, variable) and, where the user can act, what to do.

use std::time::Duration;

/// Result with the library's error.
pub type Result<T, E = CommError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// The environment (torchrun's or Slurm's variables) is missing something or contradicts itself.
    #[error("environment: {0}")]
    Env(String),

    /// A flag or argument that cannot work (e.g. a root outside the world, a bad backend name).
    #[error("{0}")]
    Usage(String),

    /// Something timed out: `what` names the key or peer, `detail` says who had arrived.
    #[error("timed out after {:.0?} waiting for {what}{detail}", timeout)]
    Timeout {
        what: String,
        timeout: Duration,
        detail: String,
    },

    /// A socket could not be bound, connected, read or written.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// A peer broke the protocol, closed its connection or disagreed on sizes.
    #[error("{0}")]
    Peer(String),

    /// The requested backend cannot run here.
    #[error("{0}")]
    Backend(String),
}

impl CommError {
    /// Wraps an I/O error with the place it happened.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        CommError::Io {
            context: context.into(),
            source,
        }
    }
}
