//! A rank's *board*: one page of shared memory per rank and communicator, mapped by every rank
//! of the host, where a call on registered buffers is posted and its phases are counted. Each
//! call, every rank writes its *post* (the call it makes, and where its buffers lie in its pool)
//! in one of two slots (the call's number, even or odd), then meets the others at a barrier; a
//! peer reads the posts only after it. Two slots, because a rank may post its next call while a
//! slower one still reads the posts of this one, never two calls ahead (every call starts with
//! a barrier).
//!
//! The barrier's counter and doorbell live on the first rank's board: each rank adds one to
//! `arrived`; the last to arrive sets it back to 0 and rings the doorbell, whose count is the
//! barrier's generation; the others wait for the generation to move (a futex, one wake-up for
//! all). `progress` is each rank's own count of barriers passed, read only to name, at a
//! timeout, the ranks that never arrived.
//!
//! ```text
//! board: | magic, token | progress | arrived | doorbell count | sleepers | post 0 | post 1 |
//! ```

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::pool::Location;
use super::ring::Doorbell;
use crate::backend::cpu::transport::Signature;

/// Identifies a board of ours.
const MAGIC: [u8; 8] = *b"NCWBRD01";
/// A board's size.
pub(crate) const BOARD_BYTES: usize = 4096;
const TOKEN_AT: usize = 8;
/// Each counter on a cache line of its own.
const PROGRESS_AT: usize = 64;
const ARRIVED_AT: usize = 128;
const BELL_AT: usize = 192;
const SLEEPERS_AT: usize = 256;
const POSTS_AT: usize = 512;
const POST_BYTES: usize = 256;
const _: () = assert!(std::mem::size_of::<Post>() <= POST_BYTES);
const _: () = assert!(POSTS_AT + 2 * POST_BYTES <= BOARD_BYTES);

/// One rank's post for one call.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub(crate) struct Post {
    /// The call's number on this communicator, from 1.
    pub call: u64,
    pub signature: Signature,
    /// 1 where both buffers lie in the rank's pool (then `send` and `recv` say where).
    pub registered: u32,
    /// 1 in place (no send buffer: peers read `recv`).
    pub in_place: u32,
    pub send: Location,
    pub recv: Location,
}

/// A view of a board mapped at `base`.
///
/// Invariant for every method: `base` is the start of a live mapping of at least
/// [`BOARD_BYTES`] bytes, read and write, which outlives this view (the window owns both and
/// drops the views first).
#[derive(Clone, Copy)]
pub(crate) struct Board {
    base: *mut u8,
}

// SAFETY: a Board is an address; the counters are touched only as atomics and the posts under
// the barrier protocol (written before a barrier, read after it).
unsafe impl Send for Board {}
// SAFETY: as above.
unsafe impl Sync for Board {}

impl Board {
    /// Stamps a fresh (zeroed) board at `base` with `token`.
    ///
    /// # Safety
    /// `base` must satisfy the type's invariant, and nobody else may use the memory yet.
    pub(crate) unsafe fn format(base: *mut u8, token: u64) -> Board {
        // SAFETY: the first bytes are ours to write (caller's promise).
        unsafe {
            std::ptr::copy_nonoverlapping(MAGIC.as_ptr(), base, MAGIC.len());
            (base.add(TOKEN_AT) as *mut u64).write(token);
        }
        Board { base }
    }

    /// The board another rank formatted at `base`, if its magic and token are the ones it
    /// published.
    ///
    /// # Safety
    /// `base` must satisfy the type's invariant.
    pub(crate) unsafe fn check(base: *mut u8, token: u64) -> Option<Board> {
        // SAFETY: the header lies in the mapping; its owner wrote it before publishing it.
        let (magic, stamped) = unsafe {
            let mut magic = [0u8; 8];
            std::ptr::copy_nonoverlapping(base, magic.as_mut_ptr(), 8);
            (magic, (base.add(TOKEN_AT) as *const u64).read())
        };
        (magic == MAGIC && stamped == token).then_some(Board { base })
    }

    fn u32_at(&self, at: usize) -> &AtomicU32 {
        // SAFETY: `at` is one of the counters' offsets, inside the page, aligned.
        unsafe { &*(self.base.add(at) as *const AtomicU32) }
    }

    /// Barriers this rank has passed.
    pub(crate) fn progress(&self) -> &AtomicU64 {
        // SAFETY: as u32_at.
        unsafe { &*(self.base.add(PROGRESS_AT) as *const AtomicU64) }
    }

    /// The barrier's count of ranks arrived (on the first rank's board).
    pub(crate) fn arrived(&self) -> &AtomicU32 {
        self.u32_at(ARRIVED_AT)
    }

    /// The barrier's doorbell (on the first rank's board), its count the barrier's generation.
    pub(crate) fn bell(&self) -> Doorbell {
        // SAFETY: both counters lie in the board's page and are used only as atomics.
        unsafe { Doorbell::at(self.u32_at(BELL_AT), self.u32_at(SLEEPERS_AT)) }
    }

    /// Writes this rank's post for call `post.call` (its own board only), before the barrier
    /// that publishes it.
    pub(crate) fn write_post(&self, post: &Post) {
        // SAFETY: the slot lies in the page; peers read it only after the next barrier, and the
        // slot of call c is not read once any rank has posted call c + 1 (see the module).
        unsafe { (self.slot(post.call) as *mut Post).write(*post) }
    }

    /// The post for call `call`, after the barrier that follows it.
    pub(crate) fn read_post(&self, call: u64) -> Post {
        // SAFETY: as write_post; the barrier's acquire orders the read after the write.
        unsafe { (self.slot(call) as *const Post).read() }
    }

    fn slot(&self, call: u64) -> *mut u8 {
        // SAFETY: slot 0 or 1, both inside the page.
        unsafe { self.base.add(POSTS_AT + (call % 2) as usize * POST_BYTES) }
    }

    /// Adds one to the barrier's arrivals (on the first rank's board): whether this rank came
    /// last of `n`, and then resets it for the next barrier.
    pub(crate) fn arrive(&self, n: usize) -> bool {
        let arrived = self.arrived().fetch_add(1, Ordering::AcqRel) + 1;
        let last = arrived as usize == n;
        if last {
            // Nobody adds again before the doorbell rings (they wait for it), so this is safe.
            self.arrived().store(0, Ordering::Relaxed);
        }
        last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posts_alternate_slots_and_a_barrier_counts_to_n() {
        let mut page = vec![0u64; BOARD_BYTES / 8];
        // SAFETY: a zeroed, aligned page that outlives the board.
        let board = unsafe { Board::format(page.as_mut_ptr().cast(), 9) };
        // SAFETY: the same page.
        assert!(unsafe { Board::check(page.as_mut_ptr().cast(), 9) }.is_some());
        // SAFETY: the same page.
        assert!(unsafe { Board::check(page.as_mut_ptr().cast(), 8) }.is_none());
        for call in [1, 2] {
            let post = Post {
                call,
                registered: 1,
                ..Post::default()
            };
            board.write_post(&post);
        }
        assert_eq!((board.read_post(1).call, board.read_post(2).call), (1, 2));
        assert!(!board.arrive(3) && !board.arrive(3) && board.arrive(3));
        assert_eq!(board.arrived().load(Ordering::Relaxed), 0);
    }
}
