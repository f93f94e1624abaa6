//! Traces (`--trace FILE`): what every rank did and when, as Chrome's trace-event JSON, which
//! Perfetto (ui.perfetto.dev) and chrome://tracing open: a process per rank (`pid` = rank, a
//! track per thread of it), a slice per collective call and, on the CPU backend, a slice per send
//! and receive with its byte count and an arrow from each send to its receive; on NCCL a slice
//! per call on the GPU's own track, timed by CUDA events (`backend::nccl::gpu_trace`).
//!
//! Each rank records into its own memory, at most [`MAX_EVENTS`] events (later ones are counted
//! as dropped, and the file says how many). When the job finishes every rank writes its part
//! (`FILE.rank<r>`), and rank 0, once all have, merges the parts into `FILE`.
//!
//! Clocks: every rank stamps events with its host's realtime clock. Ranks on rank 0's host share
//! that clock: their times agree exactly. A rank on another host adds its offset from rank 0's
//! clock, measured through the store when tracing starts, as Cristian's algorithm does: it notes
//! its time t1, asks rank 0 for its time T through the store, gets the answer at t2; rank 0's
//! clock read t2 at about T + (t2 - t1) / 2, so the offset is known within ±(t2 - t1) / 2, half a
//! store round trip (a few hundred microseconds over a cluster's network). The file records each
//! rank's offset and bound (`otherData.ranks`).
//!
//! Off, the only cost is one relaxed atomic load per collective call: nothing else is wrapped.
//!
//! Two rooms: `recording.rs` keeps the events and writes the file; `span.rs` has the one way
//! code marks a stretch of its work, a [`Span`], which records a slice here and opens an NVTX
//! range for Nsight Systems.

mod recording;
mod span;

pub use recording::{
    arrow, gpu_slice, merge, name_track, now, on, start, write_part, Args, MAX_EVENTS,
};
pub use span::{copying, copying_as, timed, Span};
