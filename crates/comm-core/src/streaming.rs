//! Writes that bypass the cache, for destinations too large to stay in it: a copy into a large
//! receive buffer, or an out-of-place reduction's output.

/// From this many bytes a destination is written with streaming stores: it would not stay in
/// cache anyway, and an ordinary store first reads every line it writes (read for ownership),
/// a third memory stream on top of the two a copy or an out-of-place reduction needs. Measured
/// on a 2-core EPYC VM, 64 MiB of `z = x + y`: 10 ms with ordinary stores, 8 ms streaming, as
/// fast as `x += y` in place.
pub const STREAMING_BYTES: usize = 256 << 10;

/// `dst.copy_from_slice(src)`, with streaming (non-temporal) stores when `dst` is at least
/// [`STREAMING_BYTES`] long.
pub fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    match dst.len() >= STREAMING_BYTES {
        true => stream(dst, src),
        false => dst.copy_from_slice(src),
    }
}

/// `dst.copy_from_slice(src)` with streaming stores, whatever the length (where the CPU has
/// them; elsewhere an ordinary copy), then a fence.
pub(crate) fn stream(dst: &mut [u8], src: &[u8]) {
    stream_unfenced(dst, src);
    fence();
}

/// [`stream`] without the fence: for a run of pieces, followed by one [`fence`].
pub(crate) fn stream_unfenced(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "stream: lengths differ");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        const LANE: usize = 16;
        let head = dst.as_ptr().align_offset(LANE).min(dst.len());
        dst[..head].copy_from_slice(&src[..head]);
        let body = (dst.len() - head) / LANE * LANE;
        for at in (head..head + body).step_by(LANE) {
            // SAFETY: SSE2 is part of x86_64; `at..at + 16` lies within both slices (body
            // stops at the last whole lane); the store's address is 16-byte aligned (head
            // aligned it) and the load's may be unaligned.
            unsafe {
                let lane = _mm_loadu_si128(src.as_ptr().add(at) as *const __m128i);
                _mm_stream_si128(dst.as_mut_ptr().add(at) as *mut __m128i, lane);
            }
        }
        dst[head + body..].copy_from_slice(&src[head + body..]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
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
            copy_streaming(&mut dst[offset..], &src[..len]);
            assert_eq!(&dst[offset..], &src[..len], "offset {offset}, {len} bytes");
            stream(&mut dst[offset..offset + 5], &src[..5]);
        }
    }
}
