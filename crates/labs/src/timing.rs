//! Once every case is right: the student's time beside the library's at a few sizes, and what
//! the α–β model of the algorithm the student wrote predicts. The model is `comm-bench model`'s
//! fit ([`comm_bench::model::fit`]) of the library's own run of that algorithm on this machine,
//! at more sizes; its steps and bytes come from the algorithm's critical path
//! ([`comm_bench::model::paths`]).

use std::time::Instant;

use comm_bench::model::fit::{fit, Fit, Shape};
use comm_bench::units::human_bytes;
use comm_core::timing::median;
use comm_core::{Buffer, Call, Collective, Communicator, Named, ReduceOp, Result};

use crate::catalog::Lab;
use crate::code::Code;
use crate::panics;

/// The sizes shown, bytes of the whole buffer.
const SHOWN: [usize; 3] = [64 << 10, 1 << 20, 16 << 20];
/// The sizes the library's run is fitted at (the shown ones among them).
const FITTED: [usize; 7] = [
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
];
/// Timed calls per size, after one untimed.
const CALLS: usize = 5;

/// The median over [`CALLS`] calls of `call` of the slowest rank's time, in seconds.
pub fn seconds(comm: &Communicator, mut call: impl FnMut() -> Result<()>) -> Result<f64> {
    call()?;
    let mut times = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        comm.barrier()?;
        let start = Instant::now();
        call()?;
        let mut slowest = comm.buffer(&[start.elapsed().as_secs_f64()])?;
        comm.all_reduce(&mut slowest, ReduceOp::Max)?;
        times.push(comm.to_host(&slowest)?[0]);
    }
    Ok(median(times))
}

/// A buffer of about `bytes` for `collective` on `n` ranks: whole blocks of floats.
fn floats(comm: &Communicator, collective: Collective, bytes: usize) -> Result<Buffer<f32>> {
    let n = comm.world_size();
    let len = match collective.describe().send == collective.describe().recv {
        true => bytes / 4,
        false => bytes / 4 / n * n,
    };
    comm.zeros::<f32>(len)
}

/// The student's in-place function for `collective` on `buf`.
fn yours<C: Code>(
    collective: Collective,
    comm: &Communicator,
    buf: &mut Buffer<f32>,
) -> Result<()> {
    panics::caught(|| match collective {
        Collective::Broadcast => C::tree_broadcast(comm, buf, 0),
        Collective::AllReduce => C::ring_all_reduce(comm, buf),
        Collective::AllGather => C::all_gather(comm, buf),
        _ => C::reduce_scatter(comm, buf),
    })
}

fn ms(seconds: f64) -> String {
    format!("{:.3} ms", seconds * 1e3)
}

fn gbps(v: f64) -> String {
    match v.is_finite() {
        true => format!("{v:.2} GB/s"),
        false => "unbounded".into(),
    }
}

/// The fit of the library's times at [`FITTED`] sizes, in place, with the lab's algorithm.
fn library_fit(lab: Lab, collective: Collective, comm: &Communicator) -> Result<(Fit, Shape)> {
    let shape = Shape {
        collective,
        world_size: comm.world_size(),
        in_place: true,
        asked: Some(lab.algo()),
        // A named algorithm runs over messages, never on registered buffers.
        registered_from: None,
        on_cpu: true,
    };
    let mut points = Vec::new();
    for bytes in FITTED {
        let mut buf = floats(comm, collective, bytes)?;
        let time = seconds(comm, || {
            comm.collective(Call::new(collective), None, &mut buf)
        })?;
        points.extend(shape.point(bytes as u64, time * 1e6));
    }
    let fitted = fit(shape, &points).expect("seven sizes are enough to fit");
    Ok((fitted, shape))
}

/// Times the student's functions and the library's, and prints the table on rank 0.
pub fn run<C: Code>(lab: Lab, comm: &Communicator) -> Result<()> {
    let n = comm.world_size();
    for &collective in lab.collectives() {
        let (fitted, shape) = library_fit(lab, collective, comm)?;
        let mut rows = Vec::new();
        for bytes in SHOWN {
            let mut buf = floats(comm, collective, bytes)?;
            let mine = seconds(comm, || yours::<C>(collective, comm, &mut buf))?;
            let theirs = fitted
                .points
                .iter()
                .find(|p| p.size == bytes as u64)
                .map_or(f64::NAN, |p| p.time_us / 1e6);
            let model = shape
                .point(bytes as u64, f64::NAN)
                .map_or(f64::NAN, |p| fitted.model.time_us(&p) / 1e6);
            rows.push(format!(
                "  {}: yours {}, the library's {}, the α–β model's {}",
                human_bytes(bytes as f64),
                ms(mine),
                ms(theirs),
                ms(model)
            ));
        }
        if comm.rank() != 0 {
            continue;
        }
        let algo = lab.algo().name();
        println!(
            "{collective} on {n} ranks, the median of {CALLS} calls, each the slowest rank's time \
             (the library runs its {algo} too):"
        );
        rows.iter().for_each(|r| println!("{r}"));
        let m = &fitted.model;
        println!(
            "α–β model of the {}: comm-bench model's fit of the library's {collective} here at {} sizes, {} to {}: α = {:.1} us a step, {} in cache, {} from memory",
            fitted.points[0].path.words,
            FITTED.len(),
            human_bytes(FITTED[0] as f64),
            human_bytes(FITTED[FITTED.len() - 1] as f64),
            m.alpha_us,
            gbps(m.cache_gbps),
            gbps(m.memory_gbps()),
        );
    }
    Ok(())
}
