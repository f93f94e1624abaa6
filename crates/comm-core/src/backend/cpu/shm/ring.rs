//! What lives in a rank's shared-memory segment, its *inbox*: a header with a doorbell, then one
//! bounded ring of slots per peer of the host that sends to this rank. A ring has one writer
//! (the sending rank) and one reader (this rank), so two counters suffice, as in NCCL's SHM
//! FIFOs: `head` counts slots written (only the sender moves it), `tail` counts slots read (only
//! the receiver moves it); a slot may be written while `head - tail < slots` and read while
//! `tail < head`. Release stores and acquire loads on them order the slot's bytes.
//!
//! Waiting never burns a core for long (ranks may outnumber cores): a rank spins briefly, then
//! yields, then sleeps on its doorbell with a futex. Whoever frees a slot or fills one rings the
//! doorbell of the rank that may wait for it, and makes a system call only when that rank sleeps.
//!
//! A third counter, `done`, serves the one-copy path ([`super::cma`]): the sender posts the
//! address and length of its buffer as a small message in the ring, and the receiver, once it
//! has read that buffer itself, counts it `done`; only then may the sender return.
//!
//! ```text
//! inbox: | header (magic, token, geometry; doorbell) | ring 0 | ring 1 | …   (one per sending peer)
//! ring:  | head | tail | slot lengths | done | slot 0 | slot 1 | …                  (each slot_bytes long)
//! ```

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::streaming::{copy, Stores};

/// Identifies an inbox of ours, version 2 (with `done`).
const MAGIC: [u8; 8] = *b"NCWSHM02";
/// Header and each ring's control block: one page each, so slot data starts page-aligned.
const PAGE: usize = 4096;
/// Cache line: counters written by different ranks live on different lines.
const LINE: usize = 64;
/// Offsets in the header.
const TOKEN_AT: usize = 8;
const GEOMETRY_AT: usize = 16;
const DOORBELL_AT: usize = LINE;
const SLEEPERS_AT: usize = 2 * LINE;
/// Offsets in a ring's control block; then one u64 message length per slot.
const HEAD_AT: usize = 0;
const TAIL_AT: usize = LINE;
const LENGTHS_AT: usize = 2 * LINE;
/// Messages the receiver has read from the sender's own buffer (one-copy path).
const DONE_AT: usize = 3 * LINE;

/// How an inbox is cut: `rings` rings of `slots` slots of `slot_bytes` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub rings: usize,
    pub slots: usize,
    pub slot_bytes: usize,
}

impl Geometry {
    /// Two slots per peer (one being filled while the other is read), of 512 KiB, smaller when
    /// many peers share a host so that an inbox stays within 8 MiB (and a host's segments within
    /// a container's usual /dev/shm for 8 ranks). Measured on 2 ranks of a 2-core EPYC VM, a
    /// 64 MiB broadcast: 2 x 512 KiB 7 ms, 8 x 64 KiB 43 ms, 4 x 256 KiB 42 ms; at 1 MiB the
    /// three are within noise (80-95 us). Large pieces keep the copies long and the hand-offs
    /// few.
    pub(crate) fn for_peers(peers: usize) -> Geometry {
        const SLOTS: usize = 2;
        const INBOX_BYTES: usize = 8 << 20;
        const _: () = assert!(LENGTHS_AT + 8 * SLOTS <= DONE_AT && DONE_AT + LINE <= PAGE);
        let slot_bytes = (INBOX_BYTES / (peers.max(1) * SLOTS)).clamp(64 << 10, 512 << 10);
        Geometry {
            rings: peers,
            slots: SLOTS,
            // Whole pages: every piece starts aligned for any element type.
            slot_bytes: slot_bytes / PAGE * PAGE,
        }
    }

    fn ring_bytes(&self) -> usize {
        PAGE + self.slots * self.slot_bytes
    }

    /// The inbox's header: what its owner writes and every peer reads before any ring is used.
    pub(crate) fn header_bytes(&self) -> usize {
        PAGE
    }

    /// Where ring `index` lies in the inbox, its control page and slots.
    pub(crate) fn ring_span(&self, index: usize) -> std::ops::Range<usize> {
        let start = PAGE + index * self.ring_bytes();
        start..start + self.ring_bytes()
    }

    /// The whole inbox's size.
    pub(crate) fn bytes(&self) -> usize {
        PAGE + self.rings * self.ring_bytes()
    }
}

/// A view of an inbox mapped at `base`.
///
/// Invariant for every method: `base` is the start of a live, page-aligned mapping at least
/// `geometry.bytes()` long, which outlives this view (the transport owns both and drops the
/// views first).
#[derive(Clone, Copy)]
pub(crate) struct Inbox {
    base: *mut u8,
    geometry: Geometry,
}

// SAFETY: an Inbox is an address and a size; all shared state behind it is touched through
// atomics, or slot bytes under the ring protocol.
unsafe impl Send for Inbox {}
// SAFETY: as above.
unsafe impl Sync for Inbox {}

impl Inbox {
    /// Lays out a fresh (zeroed) inbox at `base` and stamps it with `token`.
    ///
    /// # Safety
    /// `base` must satisfy the type's invariant, and nobody else may use the memory yet.
    pub(crate) unsafe fn format(base: *mut u8, geometry: Geometry, token: u64) -> Inbox {
        let words = [
            geometry.rings as u64,
            geometry.slots as u64,
            geometry.slot_bytes as u64,
        ];
        // SAFETY: the header's first page is ours to write (caller's promise).
        unsafe {
            std::ptr::copy_nonoverlapping(MAGIC.as_ptr(), base, MAGIC.len());
            (base.add(TOKEN_AT) as *mut u64).write(token);
            std::ptr::copy_nonoverlapping(words.as_ptr(), base.add(GEOMETRY_AT).cast(), 3);
        }
        Inbox { base, geometry }
    }

    /// The inbox another rank formatted at `base`, if its magic, token and geometry are the ones
    /// that rank published.
    ///
    /// # Safety
    /// `base` must satisfy the type's invariant for `geometry`.
    pub(crate) unsafe fn check(base: *mut u8, geometry: Geometry, token: u64) -> Option<Inbox> {
        // SAFETY: the header lies within the mapping (caller's promise); its owner wrote it
        // before publishing the name, and nobody writes it again.
        let (magic, stamped, words) = unsafe {
            let mut magic = [0u8; 8];
            std::ptr::copy_nonoverlapping(base, magic.as_mut_ptr(), 8);
            let mut words = [0u64; 3];
            std::ptr::copy_nonoverlapping(base.add(GEOMETRY_AT).cast(), words.as_mut_ptr(), 3);
            (magic, (base.add(TOKEN_AT) as *const u64).read(), words)
        };
        let expected = [
            geometry.rings as u64,
            geometry.slots as u64,
            geometry.slot_bytes as u64,
        ];
        (magic == MAGIC && stamped == token && words == expected)
            .then_some(Inbox { base, geometry })
    }

    /// How it is cut.
    pub(crate) fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// The doorbell of the rank that owns this inbox.
    pub(crate) fn doorbell(&self) -> Doorbell {
        // SAFETY: both counters lie in the header page and are only ever used as atomics.
        unsafe {
            Doorbell {
                count: self.base.add(DOORBELL_AT) as *const AtomicU32,
                sleepers: self.base.add(SLEEPERS_AT) as *const AtomicU32,
            }
        }
    }

    /// Ring `index`: the one a given peer writes into.
    pub(crate) fn ring(&self, index: usize) -> Ring {
        assert!(
            index < self.geometry.rings,
            "ring {index} of {:?}",
            self.geometry
        );
        // SAFETY: ring `index` lies within the mapping: PAGE + rings * ring_bytes bytes.
        let control = unsafe { self.base.add(PAGE + index * self.geometry.ring_bytes()) };
        Ring {
            control,
            slots: self.geometry.slots,
            slot_bytes: self.geometry.slot_bytes,
        }
    }
}

/// One direction between two ranks. Only the sending rank calls the writer's methods and only
/// the receiving rank the reader's, one thread at a time each (the transport locks them).
#[derive(Clone, Copy)]
pub(crate) struct Ring {
    /// The control page; slot data follows it. Valid as long as the Inbox it came from.
    control: *mut u8,
    slots: usize,
    slot_bytes: usize,
}

// SAFETY: see Inbox.
unsafe impl Send for Ring {}
// SAFETY: see Inbox.
unsafe impl Sync for Ring {}

impl Ring {
    fn counter(&self, at: usize) -> &AtomicU32 {
        // SAFETY: head and tail lie in the control page and are only used as atomics.
        unsafe { &*(self.control.add(at) as *const AtomicU32) }
    }

    fn length(&self, slot: usize) -> &AtomicU64 {
        // SAFETY: LENGTHS_AT + 8 * slots <= PAGE for any geometry we make (see for_peers).
        unsafe { &*(self.control.add(LENGTHS_AT + 8 * slot) as *const AtomicU64) }
    }

    fn slot(&self, index: u32) -> *mut u8 {
        let slot = index as usize % self.slots;
        // SAFETY: slot data starts one page after the control block, slot_bytes per slot.
        unsafe { self.control.add(PAGE + slot * self.slot_bytes) }
    }

    /// Bytes a slot holds: messages longer than this take several slots.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Writer: whether a slot is free.
    pub(crate) fn can_write(&self) -> bool {
        let head = self.counter(HEAD_AT).load(Ordering::Relaxed);
        let tail = self.counter(TAIL_AT).load(Ordering::Acquire);
        (head.wrapping_sub(tail) as usize) < self.slots
    }

    /// Writer: fills the next slot with `piece` (at most `slot_bytes`) of a message `message_len`
    /// bytes long and hands it to the reader. Only after [`can_write`](Self::can_write).
    pub(crate) fn write(&self, message_len: usize, piece: &[u8]) {
        debug_assert!(piece.len() <= self.slot_bytes && self.can_write());
        let head = self.counter(HEAD_AT).load(Ordering::Relaxed);
        // SAFETY: the slot is free (head - tail < slots), so the reader does not touch it until
        // the release store below publishes it, and no one else writes it; piece fits in it.
        let slot = unsafe { std::slice::from_raw_parts_mut(self.slot(head), piece.len()) };
        // Cached: the reader takes it from there.
        copy(Stores::Cached, slot, piece);
        self.length(head as usize % self.slots)
            .store(message_len as u64, Ordering::Relaxed);
        self.counter(HEAD_AT)
            .store(head.wrapping_add(1), Ordering::Release);
    }

    /// Reader: whether a slot is waiting to be read.
    pub(crate) fn can_read(&self) -> bool {
        let tail = self.counter(TAIL_AT).load(Ordering::Relaxed);
        self.counter(HEAD_AT).load(Ordering::Acquire) != tail
    }

    /// Reader: the next slot, as the length of the message it belongs to and the slot's bytes
    /// (`slot_bytes` of them; the caller knows how many of them the piece fills). Only after
    /// [`can_read`](Self::can_read); valid until [`release`](Self::release).
    pub(crate) fn peek(&self) -> (usize, &[u8]) {
        let tail = self.counter(TAIL_AT).load(Ordering::Relaxed);
        let len = self
            .length(tail as usize % self.slots)
            .load(Ordering::Relaxed);
        // SAFETY: tail < head (can_read, acquire), so the writer filled this slot and leaves it
        // alone until release moves tail past it.
        let bytes = unsafe { std::slice::from_raw_parts(self.slot(tail), self.slot_bytes) };
        (len as usize, bytes)
    }

    /// Writer: how many messages posted by reference the reader has finished with.
    pub(crate) fn done(&self) -> u32 {
        self.counter(DONE_AT).load(Ordering::Acquire)
    }

    /// Reader: the sender's buffer of the message posted by reference is read; the sender may
    /// reuse it.
    pub(crate) fn mark_done(&self) {
        let done = self.counter(DONE_AT).load(Ordering::Relaxed);
        self.counter(DONE_AT)
            .store(done.wrapping_add(1), Ordering::Release);
    }

    /// Reader: gives the slot [`peek`](Self::peek) showed back to the writer.
    pub(crate) fn release(&self) {
        let tail = self.counter(TAIL_AT).load(Ordering::Relaxed);
        self.counter(TAIL_AT)
            .store(tail.wrapping_add(1), Ordering::Release);
    }
}

/// A rank's doorbell: a counter peers bump whenever they change something the rank may be
/// waiting for, and a futex it sleeps on. Valid as long as the [`Inbox`] it came from.
#[derive(Clone, Copy)]
pub(crate) struct Doorbell {
    count: *const AtomicU32,
    sleepers: *const AtomicU32,
}

// SAFETY: see Inbox; both pointers are only used as atomics.
unsafe impl Send for Doorbell {}
// SAFETY: see Inbox.
unsafe impl Sync for Doorbell {}

impl Doorbell {
    /// The doorbell whose counter is `count` and whose sleepers are counted in `sleepers`.
    ///
    /// # Safety
    /// Both must live in shared memory that outlives the doorbell, used only as atomics.
    pub(crate) unsafe fn at(count: &AtomicU32, sleepers: &AtomicU32) -> Doorbell {
        Doorbell { count, sleepers }
    }

    fn count(&self) -> &AtomicU32 {
        // SAFETY: points into a live inbox header (the type's invariant).
        unsafe { &*self.count }
    }

    fn sleepers(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.sleepers }
    }

    /// What the counter reads now: take it before checking the condition to wait for, and pass
    /// it to [`sleep`](Self::sleep), so a ring between the check and the sleep is not missed.
    pub(crate) fn seen(&self) -> u32 {
        self.count().load(Ordering::SeqCst)
    }

    /// Tells the owner something changed; wakes it only if it sleeps.
    pub(crate) fn ring(&self) {
        self.count().fetch_add(1, Ordering::SeqCst);
        if self.sleepers().load(Ordering::SeqCst) > 0 {
            futex(self.count(), libc::FUTEX_WAKE, i32::MAX as u32, None);
        }
    }

    /// Sleeps until the doorbell rings after `seen`, or `most` passes.
    pub(crate) fn sleep(&self, seen: u32, most: Duration) {
        self.sleepers().fetch_add(1, Ordering::SeqCst);
        if self.count().load(Ordering::SeqCst) == seen {
            futex(self.count(), libc::FUTEX_WAIT, seen, Some(most));
        }
        self.sleepers().fetch_sub(1, Ordering::SeqCst);
    }
}

/// A shared (not process-private) futex call on `word`: a wait returns when woken, when the word
/// no longer holds `value`, on a signal or after `timeout`; spurious returns are fine, callers
/// check their condition again.
fn futex(word: &AtomicU32, op: libc::c_int, value: u32, timeout: Option<Duration>) {
    let timeout = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let timeout_ptr = timeout
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: word is a live, aligned u32 in shared memory; timeout_ptr is null or points to a
    // timespec that outlives the call; the last two arguments are unused by WAIT and WAKE.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            value,
            timeout_ptr,
            std::ptr::null::<u32>(),
            0,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page-aligned, zeroed inbox in this process, as a segment would give.
    fn local(geometry: Geometry) -> (Vec<u8>, Inbox) {
        let mut memory = vec![0u8; geometry.bytes() + PAGE];
        let offset = memory.as_ptr().align_offset(PAGE);
        // SAFETY: memory is zeroed, long enough after aligning, and outlives the inbox here.
        let inbox = unsafe { Inbox::format(memory.as_mut_ptr().add(offset), geometry, 7) };
        (memory, inbox)
    }

    #[test]
    fn a_ring_carries_pieces_in_order_and_fills_up() {
        let geometry = Geometry::for_peers(1);
        let (_memory, inbox) = local(geometry);
        let ring = inbox.ring(0);
        assert!(!ring.can_read());
        for i in 0..geometry.slots {
            assert!(ring.can_write());
            ring.write(1000, &[i as u8; 10]);
        }
        assert!(!ring.can_write(), "full after {} slots", geometry.slots);
        for i in 0..geometry.slots {
            let (len, bytes) = ring.peek();
            assert_eq!((len, &bytes[..10]), (1000, &[i as u8; 10][..]));
            ring.release();
        }
        assert!(!ring.can_read() && ring.can_write());
    }

    #[test]
    fn an_inbox_checks_its_stamp() {
        let geometry = Geometry::for_peers(3);
        let (_memory, inbox) = local(geometry);
        // SAFETY: the same live memory `local` formatted.
        unsafe {
            assert!(Inbox::check(inbox.base, geometry, 7).is_some());
            assert!(Inbox::check(inbox.base, geometry, 8).is_none());
            assert!(Inbox::check(inbox.base, Geometry::for_peers(2), 7).is_none());
        }
    }

    #[test]
    fn an_inbox_stays_within_8_mib_up_to_64_peers() {
        assert_eq!(Geometry::for_peers(1).slot_bytes, 512 << 10);
        assert_eq!(Geometry::for_peers(7).slot_bytes, 512 << 10);
        for peers in [8, 15, 63] {
            assert!(Geometry::for_peers(peers).bytes() <= (8 << 20) + (peers + 1) * PAGE);
        }
        assert_eq!(Geometry::for_peers(255).slot_bytes, 64 << 10);
    }

    #[test]
    fn a_sleeper_wakes_when_its_doorbell_rings() {
        let (_memory, inbox) = local(Geometry::for_peers(1));
        let bell = inbox.doorbell();
        let seen = bell.seen();
        let started = std::time::Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                bell.ring();
            });
            while bell.seen() == seen {
                bell.sleep(seen, Duration::from_secs(10));
            }
        });
        assert!(started.elapsed() < Duration::from_secs(5));
        // A ring before the sleep is not missed: it returns at once.
        bell.sleep(seen, Duration::from_secs(10));
    }
}
