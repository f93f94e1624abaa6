//! Scratch memory kept per thread between calls.

use bytemuck::cast_slice_mut;

use crate::dtype::Element;

thread_local! {
    /// Scratch kept between calls: a fresh buffer of a block's size per call would cost its
    /// page faults every time (tens of milliseconds for 50 MB), more than the reduction itself.
    static SCRATCH: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `body` with `len` elements of scratch (contents unspecified), reused by later calls on
/// this thread.
pub(super) fn with_scratch<T: Element, R>(len: usize, body: impl FnOnce(&mut [T]) -> R) -> R {
    SCRATCH.with(|cell| {
        let mut words = cell.borrow_mut();
        let needed = (len * std::mem::size_of::<T>()).div_ceil(8);
        if words.len() < needed {
            words.resize(needed, 0);
        }
        let bytes: &mut [u8] = cast_slice_mut(&mut words[..needed]);
        let result = body(&mut cast_slice_mut(bytes)[..len]);
        // Kept up to a bound: a 1 GB call should not pin its scratch for the process's life.
        if words.len() * 8 > SCRATCH_KEPT_BYTES {
            *words = Vec::new();
        }
        result
    })
}

/// The most scratch kept between calls.
const SCRATCH_KEPT_BYTES: usize = 256 << 20;
