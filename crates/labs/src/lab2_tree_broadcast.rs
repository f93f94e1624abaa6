//! Lab 2: broadcast as a binomial tree, from `send` and `recv`. The page: docs/src/lab2-tree-broadcast.md.
//! Check it with `cargo lab 2`.

use comm_core::{Buffer, Communicator, Element, Result};

/// Copies `root`'s `buf` into every rank's `buf`, as a binomial tree: in round 1 the root sends
/// to one rank; in each later round every rank that has the data sends it to one rank that has
/// not, so the number of ranks holding it doubles each round (⌈log2 n⌉ rounds). Any root, any
/// number of ranks (not only powers of two).
///
/// Use only `comm.rank()`, `comm.world_size()`, `comm.send(&*buf, peer)?` (the whole buffer;
/// `&*buf` lends your `&mut` buffer for reading) and `comm.recv(&mut *buf, peer)?`. With
/// `comm.show_step("round 1", &*buf)?` after each round (every rank, every round), `cargo lab 2
/// --steps` shows your rounds.
pub fn tree_broadcast<T: Element>(
    comm: &Communicator,
    buf: &mut Buffer<T>,
    root: usize,
) -> Result<()> {
    todo!("lab 2: write the tree broadcast")
}
