//! Where each rank's block lies, and where a rank sits relative to the root: the arithmetic
//! every family shares.

use std::ops::Range;

/// Block `i` of `n` nearly equal blocks of `len` elements (sizes differ by at most one).
pub fn block(len: usize, n: usize, i: usize) -> Range<usize> {
    i * len / n..(i + 1) * len / n
}

/// `(&buf[a], &mut buf[b])` for two ranges that do not overlap.
pub(super) fn split_pair<T>(buf: &mut [T], a: Range<usize>, b: Range<usize>) -> (&[T], &mut [T]) {
    let (a, b) = split_pair_mut(buf, a, b);
    (a, b)
}

/// `(&mut buf[a], &mut buf[b])` for two ranges that do not overlap.
pub(super) fn split_pair_mut<T>(
    buf: &mut [T],
    a: Range<usize>,
    b: Range<usize>,
) -> (&mut [T], &mut [T]) {
    if a.start >= b.end {
        let (low, high) = buf.split_at_mut(a.start);
        (&mut high[..a.len()], &mut low[b])
    } else {
        assert!(a.end <= b.start, "overlapping blocks {a:?} and {b:?}");
        let (low, high) = buf.split_at_mut(b.start);
        (&mut low[a], &mut high[..b.len()])
    }
}

/// Rank relative to the root, and back.
pub(super) fn relative(rank: usize, root: usize, n: usize) -> usize {
    (rank + n - root) % n
}
pub(super) fn absolute(vrank: usize, root: usize, n: usize) -> usize {
    (vrank + root) % n
}

/// The n nearly equal [`block`]s of `len` elements.
pub(super) fn nearly_equal_blocks(len: usize, n: usize) -> Vec<Range<usize>> {
    (0..n).map(|i| block(len, n, i)).collect()
}

/// n blocks of `len / n` elements.
pub(super) fn equal_blocks(len: usize, n: usize) -> Vec<Range<usize>> {
    let count = len / n;
    (0..n).map(|i| i * count..(i + 1) * count).collect()
}
