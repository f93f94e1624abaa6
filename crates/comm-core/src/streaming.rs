//! How large destinations are written: by whole aligned 64-byte lines, through the cache or
//! around it (streaming) when the destination is too large to stay in it. A copy into a receive
//! buffer or a shared-memory slot, or an out-of-place reduction's output.

/// How a destination is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stores {
    /// Ordinary stores: the destination stays in cache for whatever reads it next.
    Cached,
    /// Streaming (non-temporal) stores: no read-for-ownership of each line written, which would
    /// be a third memory stream on top of the two a copy or an out-of-place reduction needs.
    Streaming,
}

/// A whole destination of this many bytes or more is streamed. Smaller ones stay in the last
/// level cache, where the next step (the all-gather after a reduce-scatter, the caller's own
/// read) finds them: streaming a 1 MB all-reduce's output made it twice as slow, and at 4 MiB
/// (the bound before) an out-of-place all_reduce of 4-8 MB on 4 ranks of a 2-core Xeon VM took
/// 1.5x the in-place one, which keeps its partial sums cached; at 32 MiB 1.15x. Larger ones
/// would leave the cache anyway.
pub const STREAMING_BYTES: usize = 32 << 20;

impl Stores {
    /// The stores for a destination of `bytes` in all, however it is written piece by piece.
    pub fn for_destination(bytes: usize) -> Stores {
        match bytes >= STREAMING_BYTES {
            true => Stores::Streaming,
            false => Stores::Cached,
        }
    }
}

/// `dst.copy_from_slice(src)` with `stores`, fenced when streamed.
///
/// Large copies never go through `memcpy`: on an EPYC, glibc's takes `rep movsb` only when the
/// two addresses agree modulo 64 and otherwise, past a few hundred KiB, a loop of non-temporal
/// stores, which pushes a shared-memory slot its reader is about to take out to memory.
/// Measured on a 2-core EPYC VM: a 1 MB all-reduce took 110 µs or 310–500 µs depending only on
/// where the receive buffer sat in its page. This loop stores whole aligned lines, cached or
/// streamed as asked, at any alignment of `src`.
pub fn copy(stores: Stores, dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy: lengths differ");
    match stores {
        Stores::Cached if dst.len() < BY_LINES_BYTES => dst.copy_from_slice(src),
        Stores::Cached => by_lines(dst, src, store_line),
        Stores::Streaming => {
            by_lines(dst, src, stream_line);
            fence();
        }
    }
}

/// Below this, `memcpy` is as good as any loop.
const BY_LINES_BYTES: usize = 4 << 10;

/// Copies the bytes before `dst`'s first whole line and after its last with `copy_from_slice`,
/// and each aligned line between with `line(dst_line, src_line)`.
#[inline(always)]
fn by_lines(dst: &mut [u8], src: &[u8], line: impl Fn(&mut [u8], &[u8])) {
    let (head, body) = whole_lines(dst);
    dst[..head].copy_from_slice(&src[..head]);
    for (to, from) in dst[head..head + body]
        .chunks_exact_mut(LINE)
        .zip(src[head..].chunks_exact(LINE))
    {
        line(to, from);
    }
    dst[head + body..].copy_from_slice(&src[head + body..]);
}

/// A cache line: what [`stream_line`] writes at once.
pub(crate) const LINE: usize = 64;

/// Where `dst`'s whole, aligned lines are, in elements: after the first `head` elements,
/// `body` of them (a multiple of a line's worth); the rest is the tail.
pub(crate) fn whole_lines<T>(dst: &[T]) -> (usize, usize) {
    let per_line = LINE / std::mem::size_of::<T>();
    let head = dst.as_ptr().align_offset(LINE).min(dst.len());
    (head, (dst.len() - head) / per_line * per_line)
}

/// Writes one line `dst` (64 bytes, 64-byte aligned) from `src` (64 bytes, any alignment)
/// around the cache. Callers [`fence`] after a run of them.
#[inline(always)]
pub(crate) fn stream_line(dst: &mut [u8], src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::_mm_stream_si128;
        // SAFETY: SSE2 is part of x86_64; lanes_of checked the line's length and alignment.
        lanes_of(dst, src, |to, lane| unsafe { _mm_stream_si128(to, lane) });
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// [`stream_line`] through the cache.
#[inline(always)]
fn store_line(dst: &mut [u8], src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::_mm_store_si128;
        // SAFETY: SSE2 is part of x86_64; lanes_of checked the line's length and alignment.
        lanes_of(dst, src, |to, lane| unsafe { _mm_store_si128(to, lane) });
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// Loads the four 16-byte lanes of `src` and hands each to `store` with its aligned address in
/// `dst`: 64 bytes each, `dst` 64-byte aligned (checked, so `store` may assume both).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn lanes_of(
    dst: &mut [u8],
    src: &[u8],
    store: impl Fn(*mut std::arch::x86_64::__m128i, std::arch::x86_64::__m128i),
) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128};
    assert!(dst.len() == LINE && src.len() == LINE && dst.as_ptr().align_offset(LINE) == 0);
    for lane in 0..LINE / 16 {
        // SAFETY: SSE2 is part of x86_64; `src` is 64 bytes (asserted), so the lane lies within
        // it, and an unaligned load may read it; the address handed on lies within `dst` and
        // is 16-byte aligned (dst is 64-byte aligned, asserted).
        unsafe {
            let bytes = _mm_loadu_si128(src.as_ptr().add(16 * lane) as *const __m128i);
            store(dst.as_mut_ptr().add(16 * lane) as *mut __m128i, bytes);
        }
    }
}

/// Orders streaming stores before any later store (another rank may read this memory once we
/// say it is written).
pub(crate) fn fence() {
    // SAFETY: SSE2 is part of x86_64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streaming_copy_is_a_copy_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..STREAMING_BYTES * 2 + 37)
            .map(|i| (i * 7) as u8)
            .collect();
        for (offset, len) in [(0, 100), (3, STREAMING_BYTES + 5), (1, STREAMING_BYTES * 2)] {
            let mut dst = vec![0u8; len + offset];
            copy(
                Stores::for_destination(len),
                &mut dst[offset..],
                &src[..len],
            );
            assert_eq!(&dst[offset..], &src[..len], "offset {offset}, {len} bytes");
            let shorts = [0, 5, 63, 64, 65, 200, BY_LINES_BYTES + 77];
            for short in shorts.into_iter().filter(|&short| short <= len) {
                for stores in [Stores::Streaming, Stores::Cached] {
                    let (to, from) = (offset..offset + short, 1..1 + short);
                    copy(stores, &mut dst[to.clone()], &src[from.clone()]);
                    assert_eq!(&dst[to], &src[from], "{short} bytes, {stores:?}");
                }
            }
        }
    }

    #[test]
    fn only_large_destinations_are_streamed() {
        assert_eq!(Stores::for_destination(1 << 20), Stores::Cached);
        assert_eq!(Stores::for_destination(STREAMING_BYTES), Stores::Streaming);
    }
}
