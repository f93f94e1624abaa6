//! Whether NCCL can run here: a CUDA driver, a visible GPU, libnccl. Asked one question at a
//! time ([`Machine`]), and never allowed to panic (cudarc panics when a library it loads at run
//! time is missing; [`quietly`] turns that into a reason). What libnccl's files are and where
//! they lie is [`library`]'s: the probe asks it, never the other way round.

use std::path::PathBuf;

use cudarc::driver::CudaContext;
use cudarc::nccl::result;

use super::errors::{driver_error, nccl_error, quietly};
use super::library;

/// What this machine offers NCCL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// NCCL can run.
    Ready {
        /// GPUs visible to this process.
        gpus: usize,
        /// libnccl's version, `major.minor.patch`.
        version: String,
    },
    /// NCCL cannot run here; the text says why.
    Unavailable(String),
    /// Only `libnccl.so.2` was found: restart with a `libnccl.so` link to it.
    Relink(PathBuf),
}

/// What the probe asks of the machine, one question at a time (so later ones are only asked
/// when earlier ones pass: no driver, no device query).
pub trait Machine {
    /// Whether a CUDA driver library loads.
    fn has_driver(&self) -> bool;
    /// GPUs CUDA sees, or why it cannot look.
    fn gpu_count(&self) -> std::result::Result<usize, String>;
    /// Whether libnccl loads under the name cudarc uses, `libnccl.so`.
    fn nccl_loadable(&self) -> bool;
    /// Why libnccl does not load (asked only when it does not).
    fn nccl_load_error(&self) -> String;
    /// Whether this process is already the restart with a `libnccl.so` link.
    fn relinked(&self) -> bool;
    /// The `libnccl.so.2` NCCL_LIBRARY names, if it exists (see [`library::given`]).
    fn library_given(&self) -> Option<PathBuf>;
    /// A `libnccl.so.2` to link to, if there is one (see [`library::find`]).
    fn find_libnccl_so2(&self) -> Option<PathBuf>;
    /// libnccl's version as `major.minor.patch`, or why it could not be asked.
    fn nccl_version(&self) -> std::result::Result<String, String>;
}

/// NCCL's version number (`22803`, as `ncclGetVersion` gives it) as people write it (`2.28.3`).
pub fn dotted_version(version: i32) -> String {
    format!(
        "{}.{}.{}",
        version / 10000,
        (version / 100) % 100,
        version % 100
    )
}

/// This machine, through cudarc, with every call that could panic caught.
pub struct ThisMachine<F: Fn(&str) -> Option<String>>(pub F);

impl<F: Fn(&str) -> Option<String>> Machine for ThisMachine<F> {
    fn has_driver(&self) -> bool {
        // SAFETY: tries to dlopen the driver's candidate names and closes what it opened.
        unsafe { cudarc::driver::sys::is_culib_present() }
    }
    fn gpu_count(&self) -> std::result::Result<usize, String> {
        match quietly(CudaContext::device_count) {
            Err(panic) => Err(format!("the CUDA driver did not load: {panic}")),
            Ok(Err(e)) => Err(format!("CUDA sees no usable GPU: {}", driver_error(&e))),
            Ok(Ok(n)) => Ok(n.max(0) as usize),
        }
    }
    fn nccl_loadable(&self) -> bool {
        library::loadable()
    }
    fn nccl_load_error(&self) -> String {
        library::load_error()
    }
    fn relinked(&self) -> bool {
        library::relinked(&self.0)
    }
    fn library_given(&self) -> Option<PathBuf> {
        library::given(&self.0)
    }
    fn find_libnccl_so2(&self) -> Option<PathBuf> {
        library::find(&self.0)
    }
    fn nccl_version(&self) -> std::result::Result<String, String> {
        match quietly(result::get_nccl_version) {
            Ok(Ok(v)) => Ok(dotted_version(v)),
            Ok(Err(e)) => Err(format!(
                "libnccl loaded but {}",
                nccl_error("ncclGetVersion", e)
            )),
            Err(panic) => Err(format!("libnccl did not load: {panic}")),
        }
    }
}

/// Decides, without ever panicking, whether NCCL can run: a CUDA driver, a visible GPU, libnccl.
pub fn probe(machine: &impl Machine) -> Probe {
    if !machine.has_driver() {
        return Probe::Unavailable("no CUDA driver found".into());
    }
    let gpus = match machine.gpu_count() {
        Err(reason) => return Probe::Unavailable(reason),
        Ok(0) => {
            return Probe::Unavailable("no GPU visible (is CUDA_VISIBLE_DEVICES empty?)".into())
        }
        Ok(n) => n,
    };
    if !machine.nccl_loadable() {
        if machine.relinked() {
            return Probe::Unavailable(format!(
                "libnccl.so.2 was linked as libnccl.so but still does not load ({}); check that \
                 NCCL_LIBRARY or the install points at a real libnccl.so.2 for this CUDA driver",
                machine.nccl_load_error()
            ));
        }
        return match machine.find_libnccl_so2() {
            Some(path) => Probe::Relink(path),
            None => Probe::Unavailable(format!("no libnccl found; {}", library::INSTALL_HINT)),
        };
    }
    match machine.nccl_version() {
        Ok(version) => Probe::Ready { gpus, version },
        Err(reason) => Probe::Unavailable(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_never_panics_on_this_machine() {
        let machine = ThisMachine(|_: &str| None);
        let outcome = probe(&machine);
        // On a machine without a driver (CI) the reason is named; elsewhere any answer is fine.
        if !machine.has_driver() {
            assert_eq!(outcome, Probe::Unavailable("no CUDA driver found".into()));
            // cudarc itself panics here; the probe's guard turns that into a reason.
            let count = machine.gpu_count().unwrap_err();
            assert!(count.contains("did not load"), "{count}");
            let version = machine.nccl_version();
            assert!(version.is_ok() || version.unwrap_err().contains("did not load"));
        }
    }

    /// A machine described by its answers, for the cases CI's machine cannot show.
    struct Described {
        driver: bool,
        gpus: std::result::Result<usize, String>,
        loadable: bool,
        relinked: bool,
        so2: Option<PathBuf>,
    }

    impl Machine for Described {
        fn has_driver(&self) -> bool {
            self.driver
        }
        fn gpu_count(&self) -> std::result::Result<usize, String> {
            assert!(self.driver, "asked for GPUs without a driver");
            self.gpus.clone()
        }
        fn nccl_loadable(&self) -> bool {
            self.loadable
        }
        fn nccl_load_error(&self) -> String {
            assert!(!self.loadable, "asked why a loadable NCCL does not load");
            "invalid ELF header".into()
        }
        fn relinked(&self) -> bool {
            self.relinked
        }
        fn library_given(&self) -> Option<PathBuf> {
            unreachable!("the probe leaves NCCL_LIBRARY to the start")
        }
        fn find_libnccl_so2(&self) -> Option<PathBuf> {
            self.so2.clone()
        }
        fn nccl_version(&self) -> std::result::Result<String, String> {
            assert!(self.loadable, "asked NCCL's version without NCCL");
            Ok("2.21.5".into())
        }
    }

    #[test]
    fn the_probe_decides_in_order() {
        let base = || Described {
            driver: true,
            gpus: Ok(4),
            loadable: true,
            relinked: false,
            so2: None,
        };
        assert_eq!(
            probe(&base()),
            Probe::Ready {
                gpus: 4,
                version: "2.21.5".into()
            }
        );
        let no_driver = Described {
            driver: false,
            ..base()
        };
        assert_eq!(
            probe(&no_driver),
            Probe::Unavailable("no CUDA driver found".into())
        );
        let no_gpu = Described {
            gpus: Ok(0),
            ..base()
        };
        assert!(matches!(probe(&no_gpu), Probe::Unavailable(r) if r.contains("no GPU visible")));
        let broken = Described {
            gpus: Err("CUDA sees no usable GPU: X".into()),
            ..base()
        };
        assert_eq!(
            probe(&broken),
            Probe::Unavailable("CUDA sees no usable GPU: X".into())
        );
        let no_nccl = Described {
            loadable: false,
            ..base()
        };
        let reason = match probe(&no_nccl) {
            Probe::Unavailable(r) => r,
            other => panic!("{other:?}"),
        };
        assert!(
            reason.contains("no libnccl found") && reason.contains("module load nccl"),
            "{reason}"
        );
        let only_so2 = Described {
            loadable: false,
            so2: Some("/venv/nvidia/nccl/lib/libnccl.so.2".into()),
            ..base()
        };
        assert_eq!(
            probe(&only_so2),
            Probe::Relink("/venv/nvidia/nccl/lib/libnccl.so.2".into())
        );
        let still_broken = Described {
            relinked: true,
            ..only_so2
        };
        assert!(
            matches!(probe(&still_broken), Probe::Unavailable(r) if r.contains("still does not load (invalid ELF header)"))
        );
    }
}
