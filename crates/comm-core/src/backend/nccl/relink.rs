//! The start-time relink: whether this process restarts, first thing, with a `libnccl.so` link
//! to the `libnccl.so.2` found (cudarc loads only `libnccl.so`; see [`library`] for the files).
//!
//! That restart happens once, first thing in the process ([`link_at_start`], which
//! [`crate::backend::prepare`] and [`crate::launch`] call), before any socket, rank or thread
//! exists: never in the middle of a job. Whether to is asked of the machine as the probe asks it
//! ([`Machine`]); how is the library's ([`library::restart_with_link`]).

use std::path::PathBuf;
use std::sync::OnceLock;

use super::library;
use super::probe::{Machine, ThisMachine};
use crate::error::Result;

/// When a start-time relink is worth a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Only where a CUDA driver loads (every program): without one NCCL cannot run, so a restart
    /// would buy nothing.
    DriverPresent,
    /// Wherever a `libnccl.so.2` is found, driver or not (nccl-probe, which reports on libnccl
    /// itself and loads it without a GPU).
    Always,
}

/// What [`link_at_start`] does, as [`decide_at_start`] decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtStart {
    /// Nothing to do; the reason.
    Stay(&'static str),
    /// Link this `libnccl.so.2` as `libnccl.so` and restart.
    Restart(PathBuf),
}

/// Whether this process must restart with a `libnccl.so` link. The questions are asked cheapest
/// first, and later ones only when needed: the restart guard, the driver, the library
/// NCCL_LIBRARY names (the user's choice wins over a `libnccl.so` that loads), whether
/// `libnccl.so` loads, and only then the search for `libnccl.so.2` (which may ask Python).
pub fn decide_at_start(machine: &impl Machine, when: When) -> AtStart {
    if machine.relinked() {
        return AtStart::Stay("already restarted with the link");
    }
    if when == When::DriverPresent && !machine.has_driver() {
        return AtStart::Stay("no CUDA driver: NCCL cannot run here");
    }
    if let Some(given) = machine.library_given() {
        return AtStart::Restart(given);
    }
    if machine.nccl_loadable() {
        return AtStart::Stay("libnccl.so loads as it is");
    }
    match machine.find_libnccl_so2() {
        Some(so2) => AtStart::Restart(so2),
        None => AtStart::Stay("no libnccl.so.2 found"),
    }
}

/// Why the start-time relink failed in this process, for [`crate::backend::select`] to report.
static START_FAILURE: OnceLock<String> = OnceLock::new();

/// Why [`link_at_start`] could not link and restart, if it tried and failed.
pub fn start_failure() -> Option<&'static str> {
    START_FAILURE.get().map(String::as_str)
}

/// Call first thing in `main`, before any socket, thread or rank exists. Where cudarc cannot
/// load `libnccl.so` but a `libnccl.so.2` is found (and this is not already the restarted
/// process), links it as `libnccl.so` in a private folder and re-executes the program with that
/// folder on LD_LIBRARY_PATH; otherwise returns at once. Ranks started by a relinked parent
/// inherit its LD_LIBRARY_PATH and guard, so they do not restart again.
///
/// Returns an error only when a restart was needed and failed (the link folder refused, exec
/// failed); [`crate::backend::select`] then gives that as the reason NCCL cannot run.
pub fn link_at_start(when: When) -> Result<()> {
    let var = crate::topology::library_var;
    match decide_at_start(&ThisMachine(var), when) {
        AtStart::Stay(_) => Ok(()),
        AtStart::Restart(so2) => {
            let error = library::restart_with_link(&so2, &var);
            let _ = START_FAILURE.set(format!("linking {}: {error}", so2.display()));
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine described by its answers; asking a question that should not be asked panics.
    struct Start {
        relinked: bool,
        driver: Option<bool>,
        given: Option<Option<PathBuf>>,
        loadable: Option<bool>,
        so2: Option<Option<PathBuf>>,
    }

    impl Machine for Start {
        fn has_driver(&self) -> bool {
            self.driver.expect("asked for the driver")
        }
        fn gpu_count(&self) -> std::result::Result<usize, String> {
            unreachable!("the start never counts GPUs")
        }
        fn nccl_loadable(&self) -> bool {
            self.loadable.expect("asked whether libnccl.so loads")
        }
        fn nccl_load_error(&self) -> String {
            unreachable!()
        }
        fn relinked(&self) -> bool {
            self.relinked
        }
        fn library_given(&self) -> Option<PathBuf> {
            self.given
                .clone()
                .expect("asked for NCCL_LIBRARY's library")
        }
        fn find_libnccl_so2(&self) -> Option<PathBuf> {
            self.so2.clone().expect("searched for libnccl.so.2")
        }
        fn nccl_version(&self) -> std::result::Result<String, String> {
            unreachable!()
        }
    }

    #[test]
    fn the_start_restarts_only_when_it_must() {
        let so2 = PathBuf::from("/venv/nvidia/nccl/lib/libnccl.so.2");
        let only_so2 = Start {
            relinked: false,
            driver: Some(true),
            given: Some(None),
            loadable: Some(false),
            so2: Some(Some(so2.clone())),
        };
        for when in [When::DriverPresent, When::Always] {
            assert_eq!(
                decide_at_start(&only_so2, when),
                AtStart::Restart(so2.clone())
            );
        }
        // The restarted process never restarts again, and asks nothing else.
        let restarted = Start {
            relinked: true,
            driver: None,
            given: None,
            loadable: None,
            so2: None,
        };
        for when in [When::DriverPresent, When::Always] {
            assert!(matches!(
                decide_at_start(&restarted, when),
                AtStart::Stay(r) if r.contains("already")
            ));
        }
        // No driver: programs skip (no dlopen of NCCL, no search); the probe still links.
        let no_driver = Start {
            driver: Some(false),
            given: None,
            loadable: None,
            so2: None,
            ..only_so2
        };
        assert_eq!(
            decide_at_start(&no_driver, When::DriverPresent),
            AtStart::Stay("no CUDA driver: NCCL cannot run here")
        );
        let probe_without_driver = Start {
            driver: None,
            given: Some(None),
            loadable: Some(false),
            so2: Some(Some(so2.clone())),
            ..no_driver
        };
        assert_eq!(
            decide_at_start(&probe_without_driver, When::Always),
            AtStart::Restart(so2.clone())
        );
        // libnccl.so loads already: no search.
        let loads = Start {
            relinked: false,
            driver: Some(true),
            given: Some(None),
            loadable: Some(true),
            so2: None,
        };
        assert_eq!(
            decide_at_start(&loads, When::DriverPresent),
            AtStart::Stay("libnccl.so loads as it is")
        );
        // Nothing to link.
        let none = Start {
            loadable: Some(false),
            so2: Some(None),
            ..loads
        };
        assert_eq!(
            decide_at_start(&none, When::Always),
            AtStart::Stay("no libnccl.so.2 found")
        );
    }

    #[test]
    fn the_library_nccl_library_names_wins_over_a_libnccl_so_that_loads() {
        // A fork (NCCLX, say) named by NCCL_LIBRARY beside the system's libnccl.so: the start
        // links the fork, without asking whether libnccl.so loads or searching.
        let fork = PathBuf::from("/opt/ncclx/lib/libnccl.so.2");
        let beside_the_system = Start {
            relinked: false,
            driver: Some(true),
            given: Some(Some(fork.clone())),
            loadable: None,
            so2: None,
        };
        for when in [When::DriverPresent, When::Always] {
            assert_eq!(
                decide_at_start(&beside_the_system, when),
                AtStart::Restart(fork.clone())
            );
        }
        // Once restarted with it, never again (the link is first on LD_LIBRARY_PATH).
        let restarted = Start {
            relinked: true,
            driver: None,
            given: None,
            ..beside_the_system
        };
        assert!(matches!(
            decide_at_start(&restarted, When::DriverPresent),
            AtStart::Stay(_)
        ));
    }
}
