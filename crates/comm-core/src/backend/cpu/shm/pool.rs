//! Registered memory: the process's pool of shared-memory segments that a communicator's
//! buffers are carved from (`Communicator::buffer`, `filled`, `zeros`) when its ranks share a
//! host, so that a peer can read them where they lie. What MPI-3's `MPI_Win_allocate_shared`
//! hands out, and on GPUs NCCL's `ncclMemAlloc` + `ncclCommRegister`.
//!
//! Each segment is a [`Held`] one: unlinked from /dev/shm as soon as it exists, reached by peers
//! through this process's descriptor. Its first page is a header (magic, this process's token,
//! the segment's serial number) a peer checks after mapping it; buffers start after it, 64-byte
//! aligned (page-aligned from 64 KiB). Freed buffers go back to their segment's free list,
//! neighbours merged, for the next buffer to reuse; a segment whose buffers are all free is kept
//! until a buffer fits in no segment, and then given back to the system first. Segments are
//! made [`MIN_SEGMENT_BYTES`] or more at a time.
//!
//! [`locate`] answers, for any slice, whether it lies in the pool and where (segment descriptor,
//! serial, offset): a part of a registered buffer is registered too, and a `Vec` is not.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use super::segment::{random_token, Held, HugePages};
use crate::error::{CommError, Result};
use crate::units::human_bytes;

/// A segment's header: one page (a huge page's first 4 KiB on huge pages).
pub(crate) const HEADER_BYTES: usize = 4096;
/// What a segment's header starts with.
const MAGIC: [u8; 8] = *b"NCWPOOL1";
/// Segments are made at least this large: small buffers share one. Small, because the pool
/// lives in /dev/shm beside the rings' inboxes (a container's 64 MB by default).
const MIN_SEGMENT_BYTES: usize = 1 << 20;
/// Buffers from this size start on a page.
const PAGE_ALIGNED_FROM: usize = 64 << 10;

/// Where a registered slice lies: what a peer needs to read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub(crate) struct Location {
    /// The segment's descriptor in the owning process.
    pub fd: i32,
    /// The segment's serial number in that process (a descriptor's number is reused).
    pub serial: u32,
    /// The slice's first byte, from the segment's start.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u64,
}

/// One segment of the pool and its free stretches (offset, length), sorted by offset.
struct PoolSegment {
    held: Held,
    serial: u32,
    free: Vec<(usize, usize)>,
}

impl PoolSegment {
    fn holds(&self, at: usize, len: usize) -> bool {
        let base = self.held.base() as usize;
        at >= base + HEADER_BYTES && at + len <= base + self.held.len()
    }

    fn all_free(&self) -> bool {
        self.free == [(HEADER_BYTES, self.held.len() - HEADER_BYTES)]
    }

    /// First fit for `len` bytes aligned to `align`: the offset taken.
    fn take(&mut self, len: usize, align: usize) -> Option<usize> {
        let (i, start) = self.free.iter().enumerate().find_map(|(i, &(at, free))| {
            let start = at.next_multiple_of(align);
            (start + len <= at + free).then_some((i, start))
        })?;
        let (at, free) = self.free.remove(i);
        if start + len < at + free {
            self.free.insert(i, (start + len, at + free - start - len));
        }
        if start > at {
            self.free.insert(i, (at, start - at));
        }
        Some(start)
    }

    /// Gives `len` bytes at `at` back, merged with free neighbours.
    fn give_back(&mut self, at: usize, len: usize) {
        let i = self.free.partition_point(|&(o, _)| o < at);
        self.free.insert(i, (at, len));
        if i + 1 < self.free.len() && at + len == self.free[i + 1].0 {
            self.free[i].1 += self.free.remove(i + 1).1;
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == at {
            self.free[i - 1].1 += self.free.remove(i).1;
        }
    }
}

/// The process's pool: every communicator of the process carves its buffers from it.
struct Pool {
    segments: Vec<PoolSegment>,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    segments: Vec::new(),
});
/// Serial numbers of segments, in this process.
static SERIAL: AtomicU32 = AtomicU32::new(1);

/// This process's token, stamped in every segment's header: a peer that maps a descriptor
/// checks it found this process's segment.
pub(crate) fn token() -> u64 {
    static TOKEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOKEN.get_or_init(random_token)
}

/// A buffer's bytes in the pool; given back when dropped.
#[derive(Debug)]
pub struct Region {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a Region is the only owner of its bytes (the pool hands each stretch out once) and
// the segment stays mapped while it is taken (segments are released only when all free).
unsafe impl Send for Region {}
// SAFETY: &Region gives out its bytes only as &[u8] (see `bytes`).
unsafe impl Sync for Region {}

impl Region {
    /// The region's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is mapped and this region's alone while it lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The region's bytes, to write.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let at = self.ptr as usize;
        if let Some(s) = pool.segments.iter_mut().find(|s| s.holds(at, self.len)) {
            let base = s.held.base() as usize;
            s.give_back(at - base, stretch(self.len));
        }
    }
}

/// The bytes a buffer of `len` takes in a segment: whole 64-byte lines.
fn stretch(len: usize) -> usize {
    len.next_multiple_of(64)
}

/// `len` bytes of registered memory (contents unspecified: a reused stretch holds what the last
/// buffer there left). A /dev/shm too small is an error saying how much was asked for.
pub(crate) fn allocate(rank: usize, len: usize) -> Result<Region> {
    let align = if len >= PAGE_ALIGNED_FROM { 4096 } else { 64 };
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let taken = pool
        .segments
        .iter_mut()
        .find_map(|s| Some(s.held.base() as usize + s.take(stretch(len), align)?));
    let at = match taken {
        Some(at) => at,
        None => {
            // Segments with nothing taken are too small or too cut up: theirs go back first.
            pool.segments.retain(|s| !s.all_free());
            let mut segment = new_segment(rank, len)?;
            let at = segment
                .take(stretch(len), align)
                .expect("a fresh segment fits");
            let base = segment.held.base() as usize;
            pool.segments.push(segment);
            base + at
        }
    };
    // The segment is found again by address when the region is dropped.
    Ok(Region {
        ptr: at as *mut u8,
        len,
    })
}

/// A fresh segment with room for `len` bytes after its header.
fn new_segment(rank: usize, len: usize) -> Result<PoolSegment> {
    let want = (HEADER_BYTES + stretch(len).next_multiple_of(4096)).max(MIN_SEGMENT_BYTES);
    let huge = HugePages::offered(want);
    let bytes = want.next_multiple_of(huge.granule());
    // Huge pages another process took first: ordinary ones, then.
    let held = Held::create(rank, bytes, huge).or_else(|e| match huge {
        HugePages::None => Err(e),
        _ => Held::create(rank, want, HugePages::None),
    });
    let bytes = held.as_ref().map_or(bytes, |h| h.len());
    let held = held.map_err(|e| {
        CommError::Backend(format!(
            "creating {} in /dev/shm for a registered buffer of {} failed: {e} \
             (is /dev/shm full or too small? docker run --shm-size raises it; --copy ring keeps \
             buffers out of it)",
            human_bytes(bytes as f64),
            human_bytes(len as f64)
        ))
    })?;
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the header page is the start of a fresh mapping only this process knows yet.
    unsafe {
        let base = held.base();
        std::ptr::copy_nonoverlapping(MAGIC.as_ptr(), base, MAGIC.len());
        (base.add(8) as *mut u64).write(token());
        (base.add(16) as *mut u32).write(serial);
    }
    Ok(PoolSegment {
        free: vec![(HEADER_BYTES, bytes - HEADER_BYTES)],
        held,
        serial,
    })
}

/// Where `bytes` lie in the pool, if they do (an empty slice lies anywhere: `Some` of nothing).
pub(crate) fn locate(bytes: &[u8]) -> Option<Location> {
    if bytes.is_empty() {
        return Some(Location::default());
    }
    let at = bytes.as_ptr() as usize;
    let pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let s = pool.segments.iter().find(|s| s.holds(at, bytes.len()))?;
    Some(Location {
        fd: s.held.fd(),
        serial: s.serial,
        offset: (at - s.held.base() as usize) as u64,
        len: bytes.len() as u64,
    })
}

/// Whether the segment a peer mapped at `base` is the one `location` names, of the process
/// whose token is `token`.
///
/// # Safety
/// `base` must point to at least [`HEADER_BYTES`] mapped bytes.
pub(crate) unsafe fn is_segment(base: *const u8, token: u64, location: &Location) -> bool {
    // SAFETY: the header lies within the mapping (caller's promise); its owner wrote it before
    // handing out any buffer of the segment.
    unsafe {
        let mut magic = [0u8; 8];
        std::ptr::copy_nonoverlapping(base, magic.as_mut_ptr(), 8);
        magic == MAGIC
            && (base.add(8) as *const u64).read() == token
            && (base.add(16) as *const u32).read() == location.serial
    }
}

/// The pages the pool's next segment of `bytes` would get, as the transport line says it.
pub(crate) fn pages(bytes: usize) -> HugePages {
    HugePages::offered(bytes.max(MIN_SEGMENT_BYTES))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_found_where_they_lie_and_their_stretches_reused() {
        let mut a = allocate(0, 1000).unwrap();
        a.bytes_mut().fill(7);
        let at = locate(a.bytes()).unwrap();
        assert_eq!((at.offset % 64, at.len), (0, 1000));
        let part = locate(&a.bytes()[10..20]).unwrap();
        assert_eq!((part.offset, part.fd), (at.offset + 10, at.fd));
        let heap = vec![1u8; 10];
        assert_eq!(locate(&heap), None, "a Vec is not registered");
        let big = allocate(0, 1 << 20).unwrap();
        assert_eq!(locate(big.bytes()).unwrap().offset % 4096, 0);
        let first = a.bytes().as_ptr();
        drop(a);
        let again = allocate(0, 900).unwrap();
        assert_eq!(again.bytes().as_ptr(), first, "the freed stretch is reused");
        drop((again, big));
    }

    #[test]
    fn free_stretches_merge() {
        let held = Held::create(0, 1 << 16, HugePages::None).unwrap();
        let mut s = PoolSegment {
            free: vec![(HEADER_BYTES, (1 << 16) - HEADER_BYTES)],
            held,
            serial: 0,
        };
        let x = s.take(128, 64).unwrap();
        let y = s.take(4096, 4096).unwrap();
        let z = s.take(64, 64).unwrap();
        assert_eq!((x, y % 4096), (HEADER_BYTES, 0));
        s.give_back(y, 4096);
        s.give_back(x, 128);
        s.give_back(z, 64);
        assert!(s.all_free(), "{:?}", s.free);
    }
}
