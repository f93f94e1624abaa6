//! All-to-all as a pairwise exchange.

use bytemuck::{cast_slice, cast_slice_mut};

use crate::backend::cpu::transport::{CallScope, Transport};
use crate::dtype::Element;
use crate::error::Result;
use crate::trace;

// ANCHOR: all_to_all
/// `send` and `recv` hold n blocks of `count`: block `j` of `send` goes to rank `j`, and block
/// `i` of `recv` comes from rank `i`.
pub fn all_to_all<T: Element>(
    t: &dyn Transport,
    send: &[T],
    recv: &mut [T],
    count: usize,
) -> Result<()> {
    let _call = CallScope::new(t);
    let (n, rank) = (t.world_size(), t.rank());
    let block = |i: usize| i * count..(i + 1) * count;
    trace::copying(std::mem::size_of_val(&send[block(rank)]), || {
        recv[block(rank)].copy_from_slice(&send[block(rank)])
    });
    for step in 1..n {
        let (to, from) = ((rank + step) % n, (rank + n - step) % n);
        t.send_recv(
            to,
            cast_slice(&send[block(to)]),
            from,
            cast_slice_mut(&mut recv[block(from)]),
        )?;
    }
    Ok(())
}
// ANCHOR_END: all_to_all
