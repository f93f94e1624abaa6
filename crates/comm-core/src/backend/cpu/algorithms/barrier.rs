//! The barrier.

use crate::backend::cpu::transport::{CallScope, Transport};
use crate::error::Result;

/// Dissemination barrier: in round k each rank signals rank+2^k and hears from rank-2^k.
pub fn barrier(t: &dyn Transport) -> Result<()> {
    let _call = CallScope::new(t);
    let (n, rank) = (t.world_size(), t.rank());
    let mut distance = 1;
    while distance < n {
        t.send_recv(
            (rank + distance) % n,
            &[1],
            (rank + n - distance) % n,
            &mut [0],
        )?;
        distance <<= 1;
    }
    Ok(())
}
