//! Watching an algorithm run (`--steps`): after each step of a CPU algorithm, every rank's
//! buffer as it is at that moment, printed by rank 0 as the course's grids under a title that
//! says what moved. The buffers are captured during the run, from the very memory the algorithm
//! works on, not recomputed.
//!
//! The algorithms say when a step ends ([`after`]); nobody listens unless the communicator was
//! asked to show steps, which sets a watcher on the calling thread for the call's length
//! ([`watching`]). Without one, [`after`] is a thread-local check and nothing more.

use std::cell::RefCell;

use crate::error::Result;

/// Shows one step: its title, and this rank's buffer as bytes.
pub(crate) type Show = Box<dyn Fn(&str, &[u8]) -> Result<()>>;

thread_local! {
    static WATCHER: RefCell<Option<Show>> = const { RefCell::new(None) };
}

/// Runs `body` with `show` called at the end of every step it makes on this thread.
pub(crate) fn watching<R>(show: Show, body: impl FnOnce() -> Result<R>) -> Result<R> {
    let before = WATCHER.with(|w| w.borrow_mut().replace(show));
    let out = body();
    WATCHER.with(|w| *w.borrow_mut() = before);
    out
}

/// The end of a step: `buf` (this rank's whole buffer, as bytes) is shown under `title` if
/// someone watches. Every rank of the call must reach the same steps, in the same order.
pub fn after(title: impl FnOnce() -> String, buf: &[u8]) -> Result<()> {
    WATCHER.with(|w| match &*w.borrow() {
        Some(show) => show(&title(), buf),
        None => Ok(()),
    })
}

/// Whether someone watches this thread's steps (an algorithm with no natural steps can then
/// run the stepwise form of itself).
pub fn watched() -> bool {
    WATCHER.with(|w| w.borrow().is_some())
}
