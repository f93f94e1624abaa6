//! Spans: the one way code marks a stretch of its work, from the moment a [`Span`] is made until
//! it is dropped. A span shows in two places, each asked for by name:
//!
//! - the trace (`--trace`): a slice on this thread's track, with a category, a name and its
//!   facts ([`Args`]), recorded only when this rank records a trace;
//! - Nsight Systems: an NVTX range, pushed only in a build with the `nvtx` feature (without it
//!   the range's name is never even formatted, and the build needs no CUDA).
//!
//! The trace draws what the timeline pictures show (calls, messages, copies, a step's compute);
//! Nsight also shows the phases around them (rendezvous, communicator init, the timing loop's
//! two parts), and every collective call, with its placement, type and length.

use std::borrow::Cow;

use super::recording::{self, now, on, Args};

/// A stretch of work on this thread, shown until it is dropped (see the module's
/// documentation).
#[must_use = "the span ends when it is dropped"]
pub struct Span {
    /// The trace slice under way; `None` when none is recorded.
    slice: Option<OpenSlice>,
    /// Whether this span pushed an NVTX range, which it pops as it ends.
    range: bool,
}

/// A slice that started and is recorded when its span ends.
struct OpenSlice {
    cat: &'static str,
    name: Cow<'static, str>,
    start: f64,
    args: Args,
}

impl Span {
    /// A slice of category `cat` named `name` on this thread's track of the trace, when this
    /// rank records one (the only cost otherwise: one relaxed atomic load).
    pub fn slice(cat: &'static str, name: impl Into<Cow<'static, str>>) -> Span {
        let slice = on().then(|| OpenSlice {
            cat,
            name: name.into(),
            start: now(),
            args: Args::default(),
        });
        Span {
            slice,
            range: false,
        }
    }

    /// Only an NVTX range named by `name` (called only when NVTX is built in): a phase that
    /// Nsight shows and the trace draws no box for.
    pub fn range(name: impl FnOnce() -> String) -> Span {
        Span {
            slice: None,
            range: false,
        }
        .with_range(name)
    }

    /// The slice carries `args` (bytes, peers, placement).
    pub fn with_args(mut self, args: Args) -> Span {
        if let Some(slice) = &mut self.slice {
            slice.args = args;
        }
        self
    }

    /// Also an NVTX range, named by `name` (called only when NVTX is built in), which may say
    /// more than the slice's name: the trace keeps its facts in [`Args`].
    pub fn with_range(mut self, name: impl FnOnce() -> String) -> Span {
        self.range = push_range(name);
        self
    }

    /// When the slice started, on rank 0's clock (as [`now`]); `None` when no trace is
    /// recorded. A message's arrow starts there.
    pub fn start(&self) -> Option<f64> {
        self.slice.as_ref().map(|s| s.start)
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(OpenSlice {
            cat,
            name,
            start,
            args,
        }) = self.slice.take()
        {
            recording::slice(cat, name, start, args);
        }
        if self.range {
            pop_range();
        }
    }
}

/// Pushes an NVTX range named by `name`, if NVTX is built in: whether it did.
#[inline]
fn push_range(name: impl FnOnce() -> String) -> bool {
    #[cfg(feature = "nvtx")]
    nvtx::range_push!("{}", name());
    #[cfg(not(feature = "nvtx"))]
    let _ = name;
    cfg!(feature = "nvtx")
}

/// Pops the NVTX range [`push_range`] pushed.
#[inline]
fn pop_range() {
    #[cfg(feature = "nvtx")]
    nvtx::range_pop!();
}

/// Runs `work` on `bytes` as a slice of category `cat` named `name` when tracing ("ring": a
/// copy into or out of a shared-memory ring; "read": the one-copy path reading the sender's
/// buffer).
pub fn timed<R>(
    cat: &'static str,
    name: &'static str,
    bytes: usize,
    work: impl FnOnce() -> R,
) -> R {
    let _span = Span::slice(cat, name).with_args(Args::bytes(bytes));
    work()
}

/// Runs `copy`, a local copy of `bytes`, as a `copy` slice when tracing.
pub fn copying<R>(bytes: usize, copy: impl FnOnce() -> R) -> R {
    copying_as("copy", bytes, copy)
}

/// [`copying`] under its own name ("copy to host", "copy to the GPU").
pub fn copying_as<R>(name: &'static str, bytes: usize, copy: impl FnOnce() -> R) -> R {
    timed("copy", name, bytes, copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_nest_and_cost_nothing_without_nvtx() {
        let mut formatted = false;
        {
            let _outer = Span::range(|| {
                formatted = true;
                "outer".into()
            });
            let _inner = Span::slice("compute", "inner").with_range(|| "inner".into());
        }
        assert_eq!(formatted, cfg!(feature = "nvtx"));
    }

    #[test]
    fn without_a_trace_a_span_records_nothing_and_has_no_start() {
        // No test of this crate starts a trace (`trace::start` needs a job's store).
        assert!(!on());
        let span = Span::slice("call", "all_reduce").with_args(Args::bytes(8));
        assert_eq!(span.start(), None);
    }
}
