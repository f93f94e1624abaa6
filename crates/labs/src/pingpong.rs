//! Lab 1 checked: the ping-pong moves the buffer there and back (ranks 0 and 1 end with rank 0's
//! values, the others' buffers untouched), and the least-squares fit finds the line through
//! points whose line is known. Then the student's ping-pong is timed from 8 B to 64 MiB, fitted
//! with the student's own fit, and compared with `comm-bench model`'s fit of the library's
//! message between the same two ranks (a broadcast on 2 ranks: one message of s bytes).

use comm_bench::model::fit::{fit, Shape};
use comm_bench::units::human_bytes;
use comm_core::backend::cpu::Algo;
use comm_core::check::input;
use comm_core::{Collective, Communicator, ReduceOp, Result};

use crate::code::Code;
use crate::compare::{agree, exactly, Shown};
use crate::panics;
use crate::report::{self, Verdict};
use crate::timing::seconds;

/// Buffer lengths (floats) and round trips the ping-pong is checked with.
const LENGTHS: [usize; 4] = [2, 250, 2500, 65536];
const ROUND_TRIPS: [usize; 2] = [1, 3];

/// The sizes timed, in bytes: 8 B to 64 MiB.
const SIZES: [usize; 9] = [
    8,
    64,
    512,
    4 << 10,
    32 << 10,
    256 << 10,
    2 << 20,
    16 << 20,
    64 << 20,
];

/// The point sets the fit is checked on.
fn point_sets() -> Vec<Vec<(f64, f64)>> {
    let line = |alpha: f64, beta: f64, sizes: &[f64]| {
        sizes.iter().map(|&s| (s, alpha + beta * s)).collect()
    };
    let sweep: Vec<f64> = SIZES.iter().map(|&s| s as f64).collect();
    vec![
        line(20e-6, 1.0 / 5e9, &sweep),
        line(1e-3, 1e-6, &[0.0, 1000.0, 3000.0]),
        vec![(1.0, 1.0), (2.0, 2.5), (3.0, 2.9), (4.0, 4.2), (8.0, 8.5)],
    ]
}

/// Least squares, the checker's own: what the student's fit must find.
fn least_squares(points: &[(f64, f64)]) -> [f64; 2] {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), p| (a + p.0, b + p.1));
    let (mx, my) = (sx / n, sy / n);
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let beta = sxy / sxx;
    [my - beta * mx, beta]
}

/// The cases on one rank count: each ping-pong, then each fit.
pub fn count() -> usize {
    LENGTHS.len() * ROUND_TRIPS.len() + point_sets().len()
}

/// Every case on this communicator's ranks, until one is wrong.
pub fn cases<C: Code>(comm: &Communicator, before: usize, total: usize) -> Result<Verdict> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let mut k = 0;
    for len in LENGTHS {
        for trips in ROUND_TRIPS {
            report::in_case(k);
            let mine = input::<f32>(k as u64, rank, len, ReduceOp::Sum);
            let mut buf = comm.buffer(&mine)?;
            panics::caught(|| C::ping_pong(comm, &mut buf, trips))?;
            let want = match rank {
                1 => input::<f32>(k as u64, 0, len, ReduceOp::Sum),
                _ => mine,
            };
            let shown = Shown {
                headline: format!(
                    "case {} of {total} is wrong: {n} ranks, {len} floats, {trips} round trip{}",
                    before + k + 1,
                    if trips == 1 { "" } else { "s" }
                ),
                element: "element",
                titles: [
                    "Yours:",
                    "Right (ranks 0 and 1 hold rank 0's, the others their own):",
                ],
            };
            if agree(comm, &comm.to_host(&buf)?, &want, exactly, &shown)? {
                return Ok(Verdict::Wrong(k));
            }
            k += 1;
        }
    }
    for points in point_sets() {
        report::in_case(k);
        let (alpha, beta) = panics::caught(|| Ok(C::fit_alpha_beta(&points)))?;
        let shown = Shown {
            headline: format!(
                "case {} of {total} is wrong: the fit of {} points {:?}",
                before + k + 1,
                points.len(),
                points
            ),
            element: "value (0 is α, 1 is β)",
            titles: ["Your α and β:", "The least-squares α and β:"],
        };
        let close = |want: f64, got: f64| (got - want).abs() <= 1e-6 * want.abs().max(1e-300);
        if agree(comm, &[alpha, beta], &least_squares(&points), close, &shown)? {
            return Ok(Verdict::Wrong(k));
        }
        k += 1;
    }
    Ok(Verdict::Right(k))
}

/// Times the student's ping-pong and the library's message at every size, fits both, and
/// prints them on rank 0.
pub fn timing<C: Code>(comm: &Communicator) -> Result<()> {
    let shape = Shape {
        collective: Collective::Broadcast,
        world_size: 2,
        in_place: true,
        asked: Some(Algo::Tree),
        // A named algorithm runs over messages, never on registered buffers.
        registered_from: None,
        on_cpu: true,
    };
    let (mut yours, mut library, mut rows) = (Vec::new(), Vec::new(), Vec::new());
    for bytes in SIZES {
        let mut buf = comm.zeros::<f32>(bytes / 4)?;
        // Enough round trips that a call lasts a while, at least one.
        let trips = (4 << 20) / bytes.max(1) / 8 + 1;
        let trips = trips.min(64);
        let one_way = seconds(comm, || {
            panics::caught(|| C::ping_pong(comm, &mut buf, trips))
        })? / (2 * trips) as f64;
        let theirs = seconds(comm, || comm.broadcast(&mut buf, 0))?;
        yours.push((bytes as f64, one_way));
        library.extend(shape.point(bytes as u64, theirs * 1e6));
        rows.push(format!(
            "  {}: yours {}, the library's {}",
            human_bytes(bytes as f64),
            us(one_way),
            us(theirs)
        ));
    }
    let (alpha, beta) = panics::caught(|| Ok(C::fit_alpha_beta(&yours)))?;
    if comm.rank() != 0 {
        return Ok(());
    }
    println!(
        "one message between ranks 0 and 1, the median of 5: half a round trip of your ping_pong, \
         and the library's (a broadcast on 2 ranks):"
    );
    rows.iter().for_each(|r| println!("{r}"));
    println!(
        "your fit (least squares on the times): α = {}, β = {:.4} ns a byte ({})",
        us(alpha),
        beta * 1e9,
        gbps(1.0 / beta / 1e9)
    );
    if let Some(fitted) = fit(shape, &library) {
        let m = &fitted.model;
        println!(
            "comm-bench model's fit of the library's: α = {:.1} us, {} in cache, {} from memory (relative errors, robust, with a knee where the buffers outgrow the cache)",
            m.alpha_us,
            gbps(m.cache_gbps),
            gbps(m.memory_gbps())
        );
    }
    Ok(())
}

fn us(seconds: f64) -> String {
    format!("{:.1} us", seconds * 1e6)
}

fn gbps(v: f64) -> String {
    match v.is_finite() && v > 0.0 {
        true => format!("{v:.2} GB/s"),
        false => "unbounded".into(),
    }
}
