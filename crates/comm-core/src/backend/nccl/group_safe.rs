//! Sound groups: between `ncclGroupStart` and `ncclGroupEnd`, NCCL launches nothing; the group's
//! kernels are enqueued at its end. A device buffer's free is stream-ordered and enqueued the
//! moment the buffer drops, so a buffer made and dropped inside a group would be freed before
//! the kernel that uses it. So while any NCCL group of this process is open, a buffer that drops
//! (on any thread, of any communicator) is kept, and freed when the last open group has ended,
//! after its kernels are enqueued. Any, not its own communicator's: NCCL defers a call on any
//! communicator made inside a thread's group (`src/group.cc`: one `ncclGroupDepth` per
//! thread), so a buffer of communicator B can be used by a kernel that A's group launches.
//!
//! The same holds for an abort: inside a group NCCL only queues `ncclCommAbort`'s reclaim
//! (group.cc's `ncclAsyncLaunch` runs a job at once only at group depth 0), and the outermost
//! `ncclGroupEnd` runs it beside the group's launches. So this thread's group depth is kept
//! as NCCL keeps it ([`Nesting`]: per thread, over every communicator), and an abort wanted
//! inside a group waits for the outermost group's end. The same depth says whether a call made
//! now is deferred ([`in_group`]), which the batching asks ([`super::batch`]).

use std::any::Any;
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

use cudarc::driver::CudaSlice;
use cudarc::nccl::{result, sys};

/// NCCL's group depth on one thread, and the aborts waiting for it to come back to 0. Pure
/// bookkeeping (`C` is a communicator), so it is tested without a GPU.
#[derive(Debug)]
pub(super) struct Nesting<C> {
    depth: usize,
    deferred: Vec<C>,
}

impl<C> Nesting<C> {
    const fn new() -> Self {
        Nesting {
            depth: 0,
            deferred: Vec::new(),
        }
    }

    /// `ncclGroupStart` succeeded (NCCL raised its depth).
    fn started(&mut self) {
        self.depth += 1;
    }

    /// `ncclGroupEnd` returned, with or without an error (NCCL lowers its depth either way):
    /// the aborts to run now, all of them once the outermost group ended.
    fn ended(&mut self) -> Vec<C> {
        self.depth = self.depth.saturating_sub(1);
        match self.depth {
            0 => std::mem::take(&mut self.deferred),
            _ => Vec::new(),
        }
    }

    /// An abort of `comm` is wanted: outside every group it runs now (returned), inside one it
    /// waits for the outermost group's end.
    fn abort(&mut self, comm: C) -> Option<C> {
        if self.depth == 0 {
            return Some(comm);
        }
        self.deferred.push(comm);
        None
    }
}

/// A communicator handle whose abort may wait for a group's end.
#[derive(Debug)]
pub(super) struct Comm(pub(super) sys::ncclComm_t);

thread_local! {
    /// This thread's groups, as NCCL counts them (its `ncclGroupDepth` is thread-local too).
    static NESTING: RefCell<Nesting<Comm>> = const { RefCell::new(Nesting::new()) };
}

/// `ncclGroupStart`, counted (this thread's depth, and the process's open groups). Every group
/// of this crate opens here.
pub(super) fn group_start() -> Result<result::NcclStatus, result::NcclError> {
    let started = result::group_start()?;
    NESTING.with_borrow_mut(Nesting::started);
    OPEN.open();
    Ok(started)
}

/// `ncclGroupEnd`, counted; the buffers kept while the process's last open group was open are
/// freed (its kernels are enqueued now); with it, the aborts that waited for this thread's
/// outermost group's end, which the caller must run (each once).
#[must_use = "the aborts handed out must run"]
pub(super) fn group_end() -> (Result<result::NcclStatus, result::NcclError>, Vec<Comm>) {
    let ended = result::group_end();
    let (was_open, aborts) =
        NESTING.with_borrow_mut(|nesting| (nesting.depth > 0, nesting.ended()));
    if was_open {
        OPEN.close();
    }
    (ended, aborts)
}

/// The abort of `comm` is wanted: returned if it may run now, else kept for [`group_end`].
pub(super) fn abort(comm: Comm) -> Option<Comm> {
    NESTING.with_borrow_mut(|nesting| nesting.abort(comm))
}

/// Whether this thread is inside an NCCL group (of any communicator): a call made now is only
/// enqueued at the outermost group's end.
pub(super) fn in_group() -> bool {
    NESTING.with_borrow(|nesting| nesting.depth > 0)
}

/// Open groups, and what dropped while one was open.
#[derive(Default)]
pub(super) struct Groups {
    open: Mutex<(usize, Vec<Box<dyn Any + Send>>)>,
}

/// Every open NCCL group of this process, on any thread.
static OPEN: Groups = Groups::new();

impl Groups {
    const fn new() -> Self {
        Groups {
            open: Mutex::new((0, Vec::new())),
        }
    }

    /// A group opens (after `ncclGroupStart`).
    fn open(&self) {
        self.open.lock().unwrap().0 += 1;
    }

    /// A group ends (after `ncclGroupEnd` returned): the last open one frees what was kept while
    /// any was open.
    fn close(&self) {
        let kept = {
            let mut open = self.open.lock().unwrap();
            open.0 = open.0.saturating_sub(1);
            match open.0 {
                0 => std::mem::take(&mut open.1),
                _ => Vec::new(),
            }
        };
        drop(kept);
    }

    /// Whether a group is open.
    #[cfg(test)]
    fn is_open(&self) -> bool {
        self.open.lock().unwrap().0 > 0
    }

    /// Drops `value` now, or, while a group is open, when the outermost group has ended.
    fn drop_after_group(&self, value: Box<dyn Any + Send>) {
        let kept = {
            let mut open = self.open.lock().unwrap();
            match open.0 {
                0 => Some(value),
                _ => {
                    open.1.push(value);
                    None
                }
            }
        };
        drop(kept);
    }
}

/// A device buffer that is never freed while an NCCL group of this process is open.
pub struct GroupSafe<T: 'static> {
    slice: Option<CudaSlice<T>>,
}

impl<T: 'static> std::fmt::Debug for GroupSafe<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GroupSafe({} elements)", self.len())
    }
}

impl<T: 'static> GroupSafe<T> {
    pub(super) fn new(slice: CudaSlice<T>) -> Self {
        GroupSafe { slice: Some(slice) }
    }
}

impl<T: 'static> Deref for GroupSafe<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        self.slice
            .as_ref()
            .expect("a GroupSafe holds its slice until it drops")
    }
}

impl<T: 'static> DerefMut for GroupSafe<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        self.slice
            .as_mut()
            .expect("a GroupSafe holds its slice until it drops")
    }
}

impl<T: 'static> Drop for GroupSafe<T> {
    fn drop(&mut self) {
        if let Some(slice) = self.slice.take() {
            OPEN.drop_after_group(Box::new(slice));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn an_abort_outside_groups_runs_at_once() {
        let mut nesting = Nesting::new();
        assert_eq!(nesting.abort("a"), Some("a"));
        nesting.started();
        assert!(nesting.ended().is_empty());
        assert_eq!(nesting.abort("b"), Some("b"));
    }

    #[test]
    fn an_abort_inside_nested_groups_waits_for_the_outermost_end() {
        let mut nesting = Nesting::new();
        nesting.started();
        nesting.started();
        assert_eq!(nesting.abort("inner"), None, "queued by NCCL if called now");
        assert!(nesting.ended().is_empty(), "the outer group is still open");
        assert_eq!(nesting.abort("outer"), None);
        assert_eq!(nesting.ended(), ["inner", "outer"]);
        assert!(nesting.ended().is_empty(), "each abort is handed out once");
        assert_eq!(nesting.abort("after"), Some("after"));
    }

    #[test]
    fn a_group_end_without_a_start_keeps_the_depth_at_zero() {
        // NCCL refuses such an end and its depth stays 0: an abort after it runs at once.
        let mut nesting = Nesting::new();
        assert!(nesting.ended().is_empty());
        assert_eq!(nesting.abort("a"), Some("a"));
    }

    /// Notes when it is dropped.
    struct Noted(Arc<Mutex<Vec<&'static str>>>, &'static str);

    impl Drop for Noted {
        fn drop(&mut self) {
            self.0.lock().unwrap().push(self.1);
        }
    }

    #[test]
    fn what_drops_inside_a_group_is_freed_after_the_outermost_group_ends() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let note = |what| log.lock().unwrap().push(what);
        let groups = Arc::new(Groups::default());
        groups.drop_after_group(Box::new(Noted(log.clone(), "outside")));
        groups.open();
        groups.drop_after_group(Box::new(Noted(log.clone(), "in the group")));
        groups.open();
        // Dropped on another thread: kept all the same.
        let (other, value) = (groups.clone(), Noted(log.clone(), "in a nested group"));
        std::thread::spawn(move || other.drop_after_group(Box::new(value)))
            .join()
            .unwrap();
        groups.close();
        note("inner group ended");
        assert!(groups.is_open());
        groups.close();
        note("outer group ended");
        assert!(!groups.is_open());
        assert_eq!(
            *log.lock().unwrap(),
            [
                "outside",
                "inner group ended",
                "in the group",
                "in a nested group",
                "outer group ended"
            ]
        );
    }

    #[test]
    fn what_drops_while_any_thread_has_a_group_open_waits_for_the_last_one() {
        // Communicator A's group open on this thread; B's opens and ends on another, where a
        // buffer drops: A's group may still launch a call on B's buffers, so it is kept.
        let log = Arc::new(Mutex::new(Vec::new()));
        let groups = Arc::new(Groups::default());
        groups.open();
        let (other, value) = (groups.clone(), Noted(log.clone(), "dropped in B's group"));
        std::thread::spawn(move || {
            other.open();
            other.drop_after_group(Box::new(value));
            other.close();
        })
        .join()
        .unwrap();
        assert!(log.lock().unwrap().is_empty(), "A's group is still open");
        groups.close();
        assert_eq!(*log.lock().unwrap(), ["dropped in B's group"]);
    }
}
