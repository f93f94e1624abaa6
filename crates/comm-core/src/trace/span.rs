//! NVTX ranges, so Nsight Systems shows our phases (rendezvous, communicator init, warm-up, timed
//! loop) and every collective with its size on the timeline, beside CUDA's and NCCL's own work.
//! Built only with the `nvtx` feature (`cargo build --features nvtx`); without it a range is an
//! empty struct and its name is never even formatted.

/// A range that lasts as long as this guard.
#[must_use = "the range ends when the guard is dropped"]
pub struct Range(());

/// Opens a range named by `name` (called only when NVTX is built in).
#[inline]
pub fn range(name: impl FnOnce() -> String) -> Range {
    #[cfg(feature = "nvtx")]
    nvtx::range_push!("{}", name());
    #[cfg(not(feature = "nvtx"))]
    let _ = name;
    Range(())
}

impl Drop for Range {
    #[inline]
    fn drop(&mut self) {
        #[cfg(feature = "nvtx")]
        nvtx::range_pop!();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ranges_nest_and_cost_nothing_without_nvtx() {
        let mut formatted = false;
        {
            let _outer = super::range(|| {
                formatted = true;
                "outer".into()
            });
            let _inner = super::range(|| "inner".into());
        }
        assert_eq!(formatted, cfg!(feature = "nvtx"));
    }
}
