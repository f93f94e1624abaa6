//! Sound groups: between `ncclGroupStart` and `ncclGroupEnd`, NCCL launches nothing; the group's
//! kernels are enqueued at its end. A device buffer's free is stream-ordered and enqueued the
//! moment the buffer drops, so a buffer made and dropped inside a group would be freed before
//! the kernel that uses it. So every device buffer knows its communicator's [`Groups`], and while
//! a group is open there, a buffer that drops (on any thread) is kept, and freed when the
//! outermost group has ended, after its kernels are enqueued.

use std::any::Any;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaSlice;

/// One communicator's open groups, and what dropped while one was open.
#[derive(Default)]
pub(super) struct Groups {
    open: Mutex<(usize, Vec<Box<dyn Any + Send>>)>,
}

impl Groups {
    /// A group opens (after `ncclGroupStart`).
    pub(super) fn open(&self) {
        self.open.lock().unwrap().0 += 1;
    }

    /// A group ends (after `ncclGroupEnd` returned): the outermost one frees what was kept while
    /// it was open.
    pub(super) fn close(&self) {
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
    pub(super) fn is_open(&self) -> bool {
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

/// A device buffer that is never freed inside an open group of its communicator.
pub struct GroupSafe<T: 'static> {
    slice: Option<CudaSlice<T>>,
    groups: Arc<Groups>,
}

impl<T: 'static> std::fmt::Debug for GroupSafe<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GroupSafe({} elements)", self.len())
    }
}

impl<T: 'static> GroupSafe<T> {
    pub(super) fn new(slice: CudaSlice<T>, groups: Arc<Groups>) -> Self {
        GroupSafe {
            slice: Some(slice),
            groups,
        }
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
            self.groups.drop_after_group(Box::new(slice));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
