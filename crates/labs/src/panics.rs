//! The student's code may panic: an index out of range, an `unwrap` on an error, or the
//! skeleton's `todo!()`. A rank runs it with the panic caught, and turns it into an error that
//! says where (file and line, without a backtrace), or, for `todo!()`, into "not written yet".
//! The error ends the job, as any rank's failure does, so no other rank waits for this one.

use std::panic::{self, AssertUnwindSafe};
use std::sync::Mutex;

use comm_core::{CommError, Result};

/// The last panic's place and message, kept by the hook for [`caught`].
static LAST: Mutex<Option<(String, String)>> = Mutex::new(None);

/// What `todo!()` says.
const TODO: &str = "not yet implemented";

/// Keeps the main thread's panics quiet (they are reported as errors by [`caught`]); other
/// threads' panics are printed as usual.
pub fn install() {
    let default = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() != Some("main") {
            return default(info);
        }
        let place = info.location().map_or_else(String::new, |l| {
            format!("{}:{}:{}", l.file(), l.line(), l.column())
        });
        let message = match info.payload().downcast_ref::<&str>() {
            Some(s) => s.to_string(),
            None => info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_default(),
        };
        *LAST.lock().unwrap_or_else(|p| p.into_inner()) = Some((place, message));
    }));
}

/// Runs `code` (the student's), a panic turned into an error; a `todo!()` is reported as the
/// lab not written yet.
pub fn caught<R>(code: impl FnOnce() -> Result<R>) -> Result<R> {
    crate::report::in_yours(|| match panic::catch_unwind(AssertUnwindSafe(code)) {
        Ok(done) => done,
        Err(_) => {
            let (place, message) = LAST
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .unwrap_or_default();
            if message.starts_with(TODO) {
                crate::report::not_written();
                return Err(CommError::Usage(format!("reached todo!() at {place}")));
            }
            Err(CommError::Usage(format!(
                "the code panicked at {place}: {message}"
            )))
        }
    })
}
