//! NCCL's and CUDA's errors as this crate's: the call by name, NCCL's text and the usual hint;
//! and cudarc's panic when a library it loads at run time is missing, as a reason ([`quietly`]).

use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::DriverError;
use cudarc::nccl::{result, sys};

use crate::error::CommError;

pub(super) fn driver_error(e: &DriverError) -> String {
    format!("{e:?}")
}

/// An NCCL error by name, with its text and the usual hint.
pub fn nccl_error(what: &str, e: result::NcclError) -> String {
    // SAFETY: ncclGetErrorString returns a static string for any result code.
    let text = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(e.0)) };
    format!(
        "{what} failed: {:?}: {} (run with NCCL_DEBUG=INFO for details)",
        e.0,
        text.to_string_lossy()
    )
}

pub(super) fn cuda(what: &str) -> impl Fn(DriverError) -> CommError + '_ {
    move |e| CommError::Backend(format!("CUDA {what} failed: {}", driver_error(&e)))
}

pub(super) fn nccl(what: &str) -> impl Fn(result::NcclError) -> CommError + '_ {
    move |e| CommError::Backend(nccl_error(what, e))
}

/// Runs `f`, turning a panic (cudarc's answer to a missing library) into an error message.
pub(super) fn quietly<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    outcome.map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown failure".into())
    })
}
