//! Lab 1's solution: ping-pong between ranks 0 and 1, and the least-squares α–β line.

use comm_core::{Buffer, Communicator, Result};

/// `round_trips` round trips of `buf` between ranks 0 and 1.
pub fn ping_pong(comm: &Communicator, buf: &mut Buffer<f32>, round_trips: usize) -> Result<()> {
    for _ in 0..round_trips {
        match comm.rank() {
            0 => {
                comm.send(&*buf, 1)?;
                comm.recv(&mut *buf, 1)?;
            }
            1 => {
                comm.recv(&mut *buf, 0)?;
                comm.send(&*buf, 0)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The least-squares line `t ≈ α + β·s` through `points`.
pub fn fit_alpha_beta(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let s_mean = points.iter().map(|p| p.0).sum::<f64>() / n;
    let t_mean = points.iter().map(|p| p.1).sum::<f64>() / n;
    let covariance: f64 = points
        .iter()
        .map(|(s, t)| (s - s_mean) * (t - t_mean))
        .sum();
    let variance: f64 = points.iter().map(|(s, _)| (s - s_mean).powi(2)).sum();
    let beta = covariance / variance;
    (t_mean - beta * s_mean, beta)
}
