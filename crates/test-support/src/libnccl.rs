//! The pip wheel of NCCL the tests load (`NCCL_WORKSHOP_TEST_LIBNCCL`, a `pip --target` folder
//! of nvidia-nccl-cu12; `.ci/run` installs it): loading it needs no GPU.

use std::path::PathBuf;

/// The wheel's folder, or None (saying the test skipped) when it is not set; a failure when
/// `NCCL_WORKSHOP_REQUIRE_LIBNCCL=1`.
pub fn wheel_or_skip() -> Option<PathBuf> {
    let Some(wheel) = std::env::var_os("NCCL_WORKSHOP_TEST_LIBNCCL").map(PathBuf::from) else {
        let required = std::env::var("NCCL_WORKSHOP_REQUIRE_LIBNCCL").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "NCCL_WORKSHOP_REQUIRE_LIBNCCL=1 but NCCL_WORKSHOP_TEST_LIBNCCL is not set"
        );
        eprintln!(
            "skipped: set NCCL_WORKSHOP_TEST_LIBNCCL to a pip --target folder of nvidia-nccl-cu12"
        );
        return None;
    };
    Some(wheel)
}

/// The wheel's `libnccl.so.2`, its real path.
pub fn so2(wheel: &std::path::Path) -> PathBuf {
    wheel
        .join("nvidia/nccl/lib/libnccl.so.2")
        .canonicalize()
        .unwrap_or_else(|e| panic!("NCCL_WORKSHOP_TEST_LIBNCCL={}: {e}", wheel.display()))
}
