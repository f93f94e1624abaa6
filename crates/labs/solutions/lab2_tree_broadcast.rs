//! Lab 2's solution: a binomial-tree broadcast from `send` and `recv`, any root, any number of
//! ranks.

use comm_core::{Buffer, Communicator, Element, Result};

/// Copies `root`'s `buf` into every rank's `buf`, as a binomial tree.
pub fn tree_broadcast<T: Element>(
    comm: &Communicator,
    buf: &mut Buffer<T>,
    root: usize,
) -> Result<()> {
    let (n, rank) = (comm.world_size(), comm.rank());
    // Places in the tree count from the root: the root is place 0, and place p is rank p+root.
    let me = (rank + n - root) % n;
    let rank_at = |place: usize| (place + root) % n;
    // Before the round with `reach`, places 0..reach hold the data; each sends to the place
    // `reach` further on, so afterwards places 0..2·reach do.
    let mut reach = 1;
    let mut round = 1;
    while reach < n {
        if me < reach && me + reach < n {
            comm.send(&*buf, rank_at(me + reach))?;
        } else if (reach..2 * reach).contains(&me) {
            comm.recv(&mut *buf, rank_at(me - reach))?;
        }
        comm.show_step(
            &format!("round {round}: {} ranks hold the data", (2 * reach).min(n)),
            &*buf,
        )?;
        reach *= 2;
        round += 1;
    }
    Ok(())
}
