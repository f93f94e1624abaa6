//! Sound groups: between `ncclGroupStart` and `ncclGroupEnd`, NCCL launches nothing; the group's
//! kernels are enqueued at its end. A device buffer's free is stream-ordered and enqueued the
//! moment the buffer drops, so a buffer made and dropped inside a group would be freed before
//! the kernel that uses it. So while a group is open on a thread (NCCL's groups are per thread
//! too), device buffers that drop there are kept, and freed when the outermost group has ended,
//! after its kernels are enqueued.

use std::any::Any;
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

use cudarc::driver::CudaSlice;

thread_local! {
    /// How deep in groups this thread is, and what dropped meanwhile.
    static OPEN: RefCell<(usize, Vec<Box<dyn Any>>)> = const { RefCell::new((0, Vec::new())) };
}

/// A group opens on this thread.
pub(super) fn open() {
    OPEN.with(|open| open.borrow_mut().0 += 1);
}

/// A group ends on this thread (after `ncclGroupEnd` returned): the outermost one frees what
/// was kept while it was open.
pub(super) fn close() {
    let kept = OPEN.with(|open| {
        let mut open = open.borrow_mut();
        open.0 = open.0.saturating_sub(1);
        match open.0 {
            0 => std::mem::take(&mut open.1),
            _ => Vec::new(),
        }
    });
    drop(kept);
}

/// Drops `value` now, or, inside a group, when the outermost group has ended.
fn drop_after_group(value: Box<dyn Any>) {
    let kept = OPEN.with(|open| match open.try_borrow_mut() {
        Ok(mut open) if open.0 > 0 => {
            open.1.push(value);
            None
        }
        _ => Some(value),
    });
    drop(kept);
}

/// A device buffer that is never freed inside an open group (see the module's text).
#[derive(Debug)]
pub struct GroupSafe<T: 'static>(Option<CudaSlice<T>>);

impl<T: 'static> GroupSafe<T> {
    pub(crate) fn new(slice: CudaSlice<T>) -> Self {
        GroupSafe(Some(slice))
    }
}

impl<T: 'static> Deref for GroupSafe<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        self.0
            .as_ref()
            .expect("a GroupSafe holds its slice until it drops")
    }
}

impl<T: 'static> DerefMut for GroupSafe<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        self.0
            .as_mut()
            .expect("a GroupSafe holds its slice until it drops")
    }
}

impl<T: 'static> Drop for GroupSafe<T> {
    fn drop(&mut self) {
        if let Some(slice) = self.0.take() {
            drop_after_group(Box::new(slice));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    /// Notes when it is dropped.
    struct Noted(Rc<RefCell<Vec<&'static str>>>, &'static str);

    impl Drop for Noted {
        fn drop(&mut self) {
            self.0.borrow_mut().push(self.1);
        }
    }

    #[test]
    fn what_drops_inside_a_group_is_freed_after_the_outermost_group_ends() {
        let log = Rc::new(RefCell::new(Vec::new()));
        drop_after_group(Box::new(Noted(log.clone(), "outside")));
        open();
        drop_after_group(Box::new(Noted(log.clone(), "in the group")));
        open();
        drop_after_group(Box::new(Noted(log.clone(), "in a nested group")));
        close();
        log.borrow_mut().push("inner group ended");
        close();
        log.borrow_mut().push("outer group ended");
        assert_eq!(
            *log.borrow(),
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
