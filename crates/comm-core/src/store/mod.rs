//! The rendezvous store: a small TCP key-value server that rank 0 runs and every rank talks to, the
//! job PyTorch's c10d `TCPStore` does. Ranks use it to find each other (peer addresses, NCCL's
//! unique Id) and to wait for each other (barrier). It knows nothing of collectives.
//!
//! Every wait has a timeout whose error names the key and which ranks had reached the store.

mod client;
mod frame;
mod server;

pub use client::Store;
pub use server::StoreServer;

/// Largest frame either side accepts; anything bigger is a broken or hostile peer.
pub const MAX_FRAME: usize = 16 << 20;

#[cfg(test)]
mod tests;
