//! Lab 1 with a bug planted on purpose, to show that the checker catches it and says where: rank
//! 1 sends back a buffer of its own instead of the one it received (a missing step: what arrives
//! is never passed on).

use comm_core::{Buffer, Communicator, Result};

pub use crate::solutions::lab1_ping_pong::fit_alpha_beta;

/// The solution, but rank 1 answers with zeros.
pub fn ping_pong(comm: &Communicator, buf: &mut Buffer<f32>, round_trips: usize) -> Result<()> {
    for _ in 0..round_trips {
        match comm.rank() {
            0 => {
                comm.send(&*buf, 1)?;
                comm.recv(&mut *buf, 1)?;
            }
            1 => {
                comm.recv(&mut *buf, 0)?;
                comm.send(&comm.zeros::<f32>(buf.len())?, 0)?;
            }
            _ => {}
        }
    }
    Ok(())
}
