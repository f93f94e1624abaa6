//! The watchdog: how a rank waits for NCCL without ever hanging. It looks at the call in flight
//! until it is done, fails, or outlives the timeout, and aborts the communicator on the way out.

use std::time::{Duration, Instant};

use cudarc::nccl::{result, sys};

use crate::error::{CommError, Result};

/// What one look at an NCCL call in flight finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Look {
    Busy,
    Done,
}

/// The communicator's progress as NCCL reports it: busy (`ncclInProgress`), done, or an error.
pub(super) fn async_state(comm: sys::ncclComm_t) -> std::result::Result<Look, result::NcclError> {
    let mut state = sys::ncclResult_t::ncclSuccess;
    // SAFETY: comm is a live communicator; state is a valid out-pointer.
    unsafe { sys::ncclCommGetAsyncError(comm, &mut state) }.result()?;
    match state.result()? {
        result::NcclStatus::InProgress => Ok(Look::Busy),
        _ => Ok(Look::Done),
    }
}

/// The watchdog, as in PyTorch: looks at a call until it is done, fails, or outlives `timeout`.
/// On failure or timeout `abort` runs first, so no rank is left inside NCCL, then the error
/// says what was waited for.
pub(super) fn watch(
    what: &str,
    detail: &str,
    timeout: Duration,
    look: &mut dyn FnMut() -> Result<Look>,
    abort: impl FnOnce(),
) -> Result<()> {
    // ANCHOR: watchdog
    let start = Instant::now();
    let mut pause = Duration::from_micros(5);
    loop {
        match look() {
            Ok(Look::Done) => return Ok(()),
            Ok(Look::Busy) => {}
            Err(e) => {
                abort();
                return Err(e);
            }
        }
        if start.elapsed() > timeout {
            abort();
            return Err(CommError::Timeout {
                what: what.into(),
                timeout,
                detail: detail.into(),
                missing: Vec::new(),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
    // ANCHOR_END: watchdog
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_waits_for_done() {
        let mut looks = [Look::Busy, Look::Busy, Look::Done].into_iter();
        let mut aborted = false;
        watch(
            "x",
            "",
            Duration::from_secs(5),
            &mut || Ok(looks.next().unwrap()),
            || aborted = true,
        )
        .unwrap();
        assert!(!aborted);
        assert_eq!(looks.next(), None, "it looked until done and no more");
    }

    #[test]
    fn the_watchdog_aborts_on_an_error_and_at_the_timeout() {
        let mut aborts = 0;
        let err = watch(
            "x",
            "",
            Duration::from_secs(5),
            &mut || Err(CommError::Backend("ncclRemoteError".into())),
            || aborts += 1,
        )
        .unwrap_err();
        assert_eq!(
            (aborts, err.to_string().contains("ncclRemoteError")),
            (1, true)
        );

        let err = watch(
            "NCCL ncclAllReduce on rank 1 to complete",
            " (a peer died or is stuck?)",
            Duration::from_millis(50),
            &mut || Ok(Look::Busy),
            || aborts += 1,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(aborts, 2);
        assert!(
            err.contains("NCCL ncclAllReduce on rank 1 to complete") && err.contains("peer died"),
            "{err}"
        );
    }
}
