//! Lab 2 with a bug planted on purpose, to show that the checker catches it and says where: the
//! tree is always rooted at rank 0, whatever `root` says (a wrong root).

use comm_core::{Buffer, Communicator, Element, Result};

/// The solution, but for the root: rank 0's data goes everywhere.
pub fn tree_broadcast<T: Element>(
    comm: &Communicator,
    buf: &mut Buffer<T>,
    _root: usize,
) -> Result<()> {
    let (n, me) = (comm.world_size(), comm.rank());
    let mut reach = 1;
    while reach < n {
        if me < reach && me + reach < n {
            comm.send(&*buf, me + reach)?;
        } else if (reach..2 * reach).contains(&me) {
            comm.recv(&mut *buf, me - reach)?;
        }
        reach *= 2;
    }
    Ok(())
}
