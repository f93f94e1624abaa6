//! Batches and groups: when the calls are waited for. Outside both, every call is waited for
//! until the GPU finished it. In a batch, calls are only waited for until NCCL has enqueued them,
//! and the outermost batch's end waits once for all of them. In a group (ncclGroupStart …
//! ncclGroupEnd) calls are not even enqueued until the group ends, so nothing is waited for
//! until then. Pure bookkeeping, so it is tested without a GPU.
//!
//! Batches are this communicator's; groups are the thread's. NCCL keeps one group depth per
//! thread, over every communicator (`src/group.cc`: `thread_local int ncclGroupDepth`), and
//! `ncclEnqueueCheck` (`src/enqueue.cc`) only appends a call to the thread's group until the
//! outermost `ncclGroupEnd`: a call on communicator B made inside A's group is deferred too,
//! though B opened no group. So every decision here takes `in_group`, whether this thread is
//! inside an NCCL group of any communicator ([`super::group_safe::in_group`]), never a count of
//! this communicator's own groups. Calls deferred by another communicator's group are waited for
//! at this communicator's next wait (its next call outside groups, a download, a batch's end).

/// What to wait for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// Nothing yet.
    Nothing,
    /// Until NCCL has enqueued what it was given (`ncclCommGetAsyncError` no longer says
    /// `ncclInProgress`); the GPU may still be running it.
    Enqueued,
    /// Until the GPU has finished everything on the stream: `calls` NCCL calls not yet waited for.
    Finished {
        /// How many calls that covers.
        calls: usize,
    },
}

/// How deep in batches the communicator is, and how many of its calls are enqueued (or deferred
/// by a group) and not waited for.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Batching {
    batches: usize,
    unwaited: usize,
}

impl Batching {
    /// A call was just handed to NCCL, by a thread `in_group` or not.
    pub fn called(&mut self, in_group: bool) -> Wait {
        if in_group {
            self.unwaited += 1;
            Wait::Nothing
        } else if self.batches > 0 {
            self.unwaited += 1;
            Wait::Enqueued
        } else {
            Wait::Finished {
                calls: self.take() + 1,
            }
        }
    }

    /// A batch begins (batches nest: only the outermost one's end waits).
    pub fn begin_batch(&mut self) {
        self.batches += 1;
    }

    /// A batch ends: the outermost one, outside any group, waits for all its calls.
    pub fn end_batch(&mut self, in_group: bool) -> Wait {
        self.batches -= 1;
        self.settle(in_group)
    }

    /// This communicator's group ended (after ncclGroupEnd); `in_group`: whether the thread is
    /// still inside an outer group, whose end alone launches the calls. Once out of every group
    /// the calls are enqueued: inside a batch they are waited for until then, outside one until
    /// they finish.
    pub fn end_group(&mut self, in_group: bool) -> Wait {
        if !in_group && self.batches > 0 && self.unwaited > 0 {
            return Wait::Enqueued;
        }
        self.settle(in_group)
    }

    /// A download is about to read the stream's results: everything before it must finish.
    /// `None` inside a group, whose calls have not even been enqueued yet.
    pub fn download(&mut self, in_group: bool) -> Option<Wait> {
        if in_group {
            return None;
        }
        Some(match self.take() {
            0 => Wait::Nothing,
            calls => Wait::Finished { calls },
        })
    }

    /// A copy from the host into an existing buffer is about to be enqueued: refused inside a
    /// group. The copy is enqueued now and the group's calls only at its end, so a call made
    /// before the copy would run after it, on the copied values: a wrong result, silently.
    pub fn copy_into(&self, in_group: bool) -> crate::error::Result<()> {
        if in_group {
            return Err(crate::error::CommError::Usage(
                "copying into a GPU buffer inside a group: the group's calls only run when it \
                 ends, so the copy would run before the calls made ahead of it; copy before the \
                 group or after it"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Calls enqueued and not waited for.
    pub fn unwaited(&self) -> usize {
        self.unwaited
    }

    fn settle(&mut self, in_group: bool) -> Wait {
        if self.batches > 0 || in_group {
            return Wait::Nothing;
        }
        match self.take() {
            0 => Wait::Nothing,
            calls => Wait::Finished { calls },
        }
    }

    fn take(&mut self) -> usize {
        std::mem::take(&mut self.unwaited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's NCCL group depth, as `group_safe` keeps it from ncclGroupStart/End.
    #[derive(Default)]
    struct Thread {
        depth: usize,
    }

    impl Thread {
        fn in_group(&self) -> bool {
            self.depth > 0
        }
    }

    #[test]
    fn outside_batches_every_call_is_waited_for() {
        let mut b = Batching::default();
        assert_eq!(b.called(false), Wait::Finished { calls: 1 });
        assert_eq!(b.called(false), Wait::Finished { calls: 1 });
        assert_eq!(b.download(false), Some(Wait::Nothing));
    }

    #[test]
    fn a_batch_waits_once_at_its_end() {
        let mut b = Batching::default();
        b.begin_batch();
        for _ in 0..5 {
            assert_eq!(b.called(false), Wait::Enqueued);
        }
        assert_eq!(b.unwaited(), 5);
        assert_eq!(b.end_batch(false), Wait::Finished { calls: 5 });
        assert_eq!(b, Batching::default());
    }

    #[test]
    fn an_empty_batch_waits_for_nothing() {
        let mut b = Batching::default();
        b.begin_batch();
        assert_eq!(b.end_batch(false), Wait::Nothing);
    }

    #[test]
    fn nested_batches_are_one() {
        let mut b = Batching::default();
        b.begin_batch();
        b.called(false);
        b.begin_batch();
        b.called(false);
        assert_eq!(
            b.end_batch(false),
            Wait::Nothing,
            "the inner end does not wait"
        );
        b.called(false);
        assert_eq!(b.end_batch(false), Wait::Finished { calls: 3 });
    }

    #[test]
    fn a_group_waits_after_its_end() {
        let (mut b, mut thread) = (Batching::default(), Thread::default());
        thread.depth += 1;
        assert_eq!(b.called(thread.in_group()), Wait::Nothing);
        assert_eq!(b.called(thread.in_group()), Wait::Nothing);
        thread.depth += 1;
        b.called(thread.in_group());
        thread.depth -= 1;
        assert_eq!(
            b.end_group(thread.in_group()),
            Wait::Nothing,
            "a nested group ends inside the outer one"
        );
        thread.depth -= 1;
        assert_eq!(b.end_group(thread.in_group()), Wait::Finished { calls: 3 });
    }

    #[test]
    fn a_group_in_a_batch_waits_for_the_enqueue_only() {
        let mut b = Batching::default();
        b.begin_batch();
        b.called(false);
        assert_eq!(b.called(true), Wait::Nothing);
        assert_eq!(b.called(true), Wait::Nothing);
        assert_eq!(b.end_group(false), Wait::Enqueued);
        assert_eq!(b.end_batch(false), Wait::Finished { calls: 3 });
    }

    #[test]
    fn a_batch_in_a_group_waits_when_the_group_ends() {
        let mut b = Batching::default();
        b.begin_batch();
        b.called(true);
        assert_eq!(b.end_batch(true), Wait::Nothing);
        assert_eq!(b.end_group(false), Wait::Finished { calls: 1 });
    }

    #[test]
    fn a_copy_into_a_buffer_is_refused_in_a_group_only() {
        let mut b = Batching::default();
        assert!(b.copy_into(false).is_ok());
        b.begin_batch();
        b.called(false);
        assert!(
            b.copy_into(false).is_ok(),
            "in a batch it is enqueued behind the calls"
        );
        b.called(true);
        let refused = b.copy_into(true).unwrap_err();
        assert!(
            matches!(refused, crate::error::CommError::Usage(_)),
            "{refused}"
        );
        assert!(refused.to_string().contains("inside a group"), "{refused}");
    }

    #[test]
    fn a_download_waits_for_the_batch_so_far_and_not_in_a_group() {
        let mut b = Batching::default();
        b.begin_batch();
        b.called(false);
        b.called(false);
        assert_eq!(b.download(false), Some(Wait::Finished { calls: 2 }));
        b.called(false);
        assert_eq!(b.download(true), None);
        assert_eq!(b.end_batch(false), Wait::Finished { calls: 1 });
    }

    /// Issue 45's case: communicator B called inside communicator A's group, on one thread.
    /// NCCL defers B's call to the end of A's group (one group depth per thread), so nothing of
    /// B may be waited for, read back or copied into until then, though B opened no group; after
    /// A's group B's next download waits for that call.
    #[test]
    fn a_call_on_another_communicator_inside_a_group_waits_for_the_threads_group() {
        let (mut a, mut b, mut thread) =
            (Batching::default(), Batching::default(), Thread::default());
        // A.group(|| { A.all_reduce(); B.all_reduce(); B.to_host() })
        thread.depth += 1; // A's ncclGroupStart
        assert_eq!(a.called(thread.in_group()), Wait::Nothing);
        assert_eq!(
            b.called(thread.in_group()),
            Wait::Nothing,
            "B's blocking call returns at once: NCCL has not enqueued it, so there is nothing to wait for yet"
        );
        assert_eq!(
            b.download(thread.in_group()),
            None,
            "B's to_host would read the data from before its call"
        );
        assert!(b.copy_into(thread.in_group()).is_err());
        thread.depth -= 1; // A's ncclGroupEnd: both calls are enqueued now
        assert_eq!(a.end_group(thread.in_group()), Wait::Finished { calls: 1 });
        assert_eq!(
            b.download(thread.in_group()),
            Some(Wait::Finished { calls: 1 }),
            "B's download waits for B's deferred call"
        );
        // A group of B's own inside A's: B's end launches nothing while A's is open.
        thread.depth += 2;
        b.called(thread.in_group());
        thread.depth -= 1;
        assert_eq!(b.end_group(thread.in_group()), Wait::Nothing);
        thread.depth -= 1;
        assert_eq!(
            a.end_group(thread.in_group()),
            Wait::Nothing,
            "A had no call"
        );
        assert_eq!(b.called(thread.in_group()), Wait::Finished { calls: 2 });
    }
}
