//! Slices of the trace (`--trace`) around a training step's parts, on the calling thread's track.

/// A slice on this thread's track of the trace (`--trace`), category `compute`, from now until
/// the guard drops; nothing when no trace is recorded.
pub fn trace_span(name: &'static str) -> Span {
    trace_span_as("compute", name.to_string())
}

/// [`trace_span`] in category `cat`, with a name made at run time.
pub fn trace_span_as(cat: &'static str, name: String) -> Span {
    Span(comm_core::trace::on().then(|| (cat, name, comm_core::trace::now())))
}

/// An open slice of the trace: recorded when dropped.
pub struct Span(Option<(&'static str, String, f64)>);

impl Drop for Span {
    fn drop(&mut self) {
        if let Some((cat, name, start)) = self.0.take() {
            comm_core::trace::slice(cat, name, start, comm_core::trace::Args::default());
        }
    }
}
