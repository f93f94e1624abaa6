//! Batches and groups: when the calls are waited for. Outside both, every call is waited for
//! until the GPU finished it. In a batch, calls are only waited for until NCCL has enqueued them,
//! and the outermost batch's end waits once for all of them. In a group (ncclGroupStart …
//! ncclGroupEnd) calls are not even enqueued until the group ends, so nothing is waited for
//! until then. Pure bookkeeping, so it is tested without a GPU.

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

/// How deep in batches and groups the rank is, and how many calls are enqueued unwaited.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Batching {
    batches: usize,
    groups: usize,
    unwaited: usize,
}

impl Batching {
    /// A call was just handed to NCCL.
    pub fn called(&mut self) -> Wait {
        if self.groups > 0 {
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
    pub fn end_batch(&mut self) -> Wait {
        self.batches -= 1;
        self.settle()
    }

    /// A group begins (after ncclGroupStart; groups nest as NCCL's do).
    pub fn begin_group(&mut self) {
        self.groups += 1;
    }

    /// A group ends (after ncclGroupEnd, which enqueues its calls): the outermost one waits for
    /// them to be enqueued, and, outside a batch, for them to finish.
    pub fn end_group(&mut self) -> Wait {
        self.groups -= 1;
        if self.groups == 0 && self.batches > 0 && self.unwaited > 0 {
            return Wait::Enqueued;
        }
        self.settle()
    }

    /// A download is about to read the stream's results: everything before it must finish.
    /// `None` inside a group, whose calls have not even been enqueued yet.
    pub fn download(&mut self) -> Option<Wait> {
        if self.groups > 0 {
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
    pub fn copy_into(&self) -> crate::error::Result<()> {
        if self.groups > 0 {
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

    fn settle(&mut self) -> Wait {
        if self.batches > 0 || self.groups > 0 {
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

    #[test]
    fn outside_batches_every_call_is_waited_for() {
        let mut b = Batching::default();
        assert_eq!(b.called(), Wait::Finished { calls: 1 });
        assert_eq!(b.called(), Wait::Finished { calls: 1 });
        assert_eq!(b.download(), Some(Wait::Nothing));
    }

    #[test]
    fn a_batch_waits_once_at_its_end() {
        let mut b = Batching::default();
        b.begin_batch();
        for _ in 0..5 {
            assert_eq!(b.called(), Wait::Enqueued);
        }
        assert_eq!(b.unwaited(), 5);
        assert_eq!(b.end_batch(), Wait::Finished { calls: 5 });
        assert_eq!(b, Batching::default());
    }

    #[test]
    fn an_empty_batch_waits_for_nothing() {
        let mut b = Batching::default();
        b.begin_batch();
        assert_eq!(b.end_batch(), Wait::Nothing);
    }

    #[test]
    fn nested_batches_are_one() {
        let mut b = Batching::default();
        b.begin_batch();
        b.called();
        b.begin_batch();
        b.called();
        assert_eq!(b.end_batch(), Wait::Nothing, "the inner end does not wait");
        b.called();
        assert_eq!(b.end_batch(), Wait::Finished { calls: 3 });
    }

    #[test]
    fn a_group_waits_after_its_end() {
        let mut b = Batching::default();
        b.begin_group();
        assert_eq!(b.called(), Wait::Nothing);
        assert_eq!(b.called(), Wait::Nothing);
        b.begin_group();
        b.called();
        assert_eq!(
            b.end_group(),
            Wait::Nothing,
            "a nested group ends inside the outer one"
        );
        assert_eq!(b.end_group(), Wait::Finished { calls: 3 });
    }

    #[test]
    fn a_group_in_a_batch_waits_for_the_enqueue_only() {
        let mut b = Batching::default();
        b.begin_batch();
        b.called();
        b.begin_group();
        assert_eq!(b.called(), Wait::Nothing);
        assert_eq!(b.called(), Wait::Nothing);
        assert_eq!(b.end_group(), Wait::Enqueued);
        assert_eq!(b.end_batch(), Wait::Finished { calls: 3 });
    }

    #[test]
    fn a_batch_in_a_group_waits_when_the_group_ends() {
        let mut b = Batching::default();
        b.begin_group();
        b.begin_batch();
        b.called();
        assert_eq!(b.end_batch(), Wait::Nothing);
        assert_eq!(b.end_group(), Wait::Finished { calls: 1 });
    }

    #[test]
    fn a_copy_into_a_buffer_is_refused_in_a_group_only() {
        let mut b = Batching::default();
        assert!(b.copy_into().is_ok());
        b.begin_batch();
        b.called();
        assert!(
            b.copy_into().is_ok(),
            "in a batch it is enqueued behind the calls"
        );
        b.begin_group();
        b.called();
        let refused = b.copy_into().unwrap_err();
        assert!(
            matches!(refused, crate::error::CommError::Usage(_)),
            "{refused}"
        );
        assert!(refused.to_string().contains("inside a group"), "{refused}");
        b.begin_group();
        assert!(b.copy_into().is_err(), "nor in a nested group");
        b.end_group();
        assert!(b.copy_into().is_err(), "the outer group is still open");
        b.end_group();
        assert!(b.copy_into().is_ok(), "after the group");
    }

    #[test]
    fn a_download_waits_for_the_batch_so_far_and_not_in_a_group() {
        let mut b = Batching::default();
        b.begin_batch();
        b.called();
        b.called();
        assert_eq!(b.download(), Some(Wait::Finished { calls: 2 }));
        b.called();
        b.begin_group();
        assert_eq!(b.download(), None);
        b.end_group();
        assert_eq!(b.end_batch(), Wait::Finished { calls: 1 });
    }
}
