//! Finding libnccl. cudarc loads NCCL by the name `libnccl.so`, which only NCCL's development
//! files provide; pip's `nvidia-nccl-cu12`/`-cu13` wheels and the runtime packages ship only
//! `libnccl.so.2`. When only that is found, we put a `libnccl.so` link to it in a private folder
//! and re-execute this program with that folder on LD_LIBRARY_PATH (the loader reads it only at
//! start), so the user need not do it by hand.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use crate::error::{CommError, Result};

/// Set on the re-executed process, so a link that still does not load is an error, not a loop.
const RELINKED: &str = "NCCL_WORKSHOP_RELINKED";

/// What to tell a user who has no libnccl at all.
pub const INSTALL_HINT: &str = "load it (`module load nccl` on Leonardo), install it \
(`pip install nvidia-nccl-cu12`, or your distribution's libnccl2), or point NCCL_LIBRARY at libnccl.so.2";

/// Whether cudarc can load NCCL as things stand.
pub fn loadable() -> bool {
    // SAFETY: only tries dlopen on cudarc's candidate names and closes what it opened.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// Why `libnccl.so` does not load, in the loader's words ("invalid ELF header", "cannot open
/// shared object file", a missing symbol version…).
pub fn load_error() -> String {
    // SAFETY: dlopen/dlerror with a valid C string; the handle, if any, is closed again.
    unsafe {
        let handle = libc::dlopen(c"libnccl.so".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if !handle.is_null() {
            libc::dlclose(handle);
            return "it loads with dlopen but lacks what cudarc needs".into();
        }
        let error = libc::dlerror();
        if error.is_null() {
            return "dlopen gave no reason".into();
        }
        std::ffi::CStr::from_ptr(error)
            .to_string_lossy()
            .into_owned()
    }
}

/// Whether this process is the re-executed one.
pub fn relinked(var: &impl Fn(&str) -> Option<String>) -> bool {
    var(RELINKED).is_some()
}

/// Places `libnccl.so.2` is usually found, in the order we look: NCCL_LIBRARY (a file or a
/// folder), LD_LIBRARY_PATH, NCCL_HOME, CUDA_HOME, a conda or virtual environment, the system.
pub fn candidates(var: &impl Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut files: Vec<PathBuf> = Vec::new();
    if let Some(given) = var("NCCL_LIBRARY") {
        let given = PathBuf::from(given);
        if given.is_dir() {
            dirs.push(given);
        } else {
            files.push(given);
        }
    }
    for dir in var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
    {
        dirs.push(dir.into());
    }
    for (name, sub) in [
        ("NCCL_HOME", "lib"),
        ("CUDA_HOME", "lib64"),
        ("CONDA_PREFIX", "lib"),
    ] {
        if let Some(root) = var(name) {
            dirs.push(Path::new(&root).join(sub));
        }
    }
    for root in [var("VIRTUAL_ENV"), var("CONDA_PREFIX")]
        .into_iter()
        .flatten()
    {
        dirs.extend(python_wheel_dirs(&Path::new(&root).join("lib")));
    }
    if let Some(home) = var("HOME") {
        dirs.extend(python_wheel_dirs(&Path::new(&home).join(".local/lib")));
    }
    for root in ["/usr/local/lib", "/usr/lib"] {
        dirs.extend(python_wheel_dirs(Path::new(root)));
    }
    dirs.extend(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/usr/local/cuda/lib64",
            "/usr/lib64",
        ]
        .map(PathBuf::from),
    );
    files.extend(dirs.into_iter().map(|d| d.join("libnccl.so.2")));
    files
}

/// `ROOT/python3.*/{site,dist}-packages/nvidia/nccl/lib`, where pip puts the NCCL wheel.
fn python_wheel_dirs(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with("python3") {
            for packages in ["site-packages", "dist-packages"] {
                found.push(entry.path().join(packages).join("nvidia/nccl/lib"));
            }
        }
    }
    found.sort();
    found
}

/// Asks the Python on PATH where its `nvidia.nccl` wheel lives (a last resort: it costs a start).
fn ask_python() -> Option<PathBuf> {
    let output = std::process::Command::new("python3")
        .args(["-c", "import nvidia.nccl as n; print(list(n.__path__)[0])"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let dir = String::from_utf8(output.stdout).ok()?;
    Some(Path::new(dir.trim()).join("lib/libnccl.so.2"))
}

/// The first `libnccl.so.2` that exists.
pub fn find(var: &impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    candidates(var)
        .into_iter()
        .find(|p| p.is_file())
        .or_else(|| ask_python().filter(|p| p.is_file()))
}

/// The libnccl file this process has loaded, as the kernel's map of it says (after a relink,
/// the real `libnccl.so.2`, not our link).
pub fn loaded_from() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            Path::new(path)
                .file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("libnccl.so"))
        })
        .map(PathBuf::from)
}

/// A private folder holding `libnccl.so` → `library`; returns the folder.
pub fn link_folder(library: &Path) -> Result<PathBuf> {
    let library = library
        .canonicalize()
        .map_err(|e| CommError::io(format!("reading {}", library.display()), e))?;
    // One folder per library, so two installs never share a link.
    let tag = library
        .to_string_lossy()
        .bytes()
        .fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100000001b3)
        });
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let folder = std::env::temp_dir().join(format!("nccl-workshop-{uid}/nccl-{tag:016x}"));
    std::fs::create_dir_all(&folder)
        .map_err(|e| CommError::io(format!("creating {}", folder.display()), e))?;
    let link = folder.join("libnccl.so");
    if std::fs::read_link(&link).ok().as_deref() != Some(library.as_path()) {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&library, &link).map_err(|e| {
            CommError::io(
                format!("linking {} to {}", link.display(), library.display()),
                e,
            )
        })?;
    }
    Ok(folder)
}

/// Links `library` as `libnccl.so` and restarts this program with the link on LD_LIBRARY_PATH.
/// Returns only on error.
pub fn restart_with_link(library: &Path, var: &impl Fn(&str) -> Option<String>) -> CommError {
    match link_folder(library) {
        Ok(folder) => reexec_with(&folder, var),
        Err(e) => e,
    }
}

/// Replaces this process with itself, `folder` first on LD_LIBRARY_PATH. Returns only on error.
pub fn reexec_with(folder: &Path, var: &impl Fn(&str) -> Option<String>) -> CommError {
    let path = match var("LD_LIBRARY_PATH") {
        Some(old) if !old.is_empty() => format!("{}:{old}", folder.display()),
        _ => folder.display().to_string(),
    };
    let program = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return CommError::io("cannot find this program to restart it", e),
    };
    let error = std::process::Command::new(program)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", path)
        .env(RELINKED, "1")
        .exec();
    CommError::io("restarting with libnccl on LD_LIBRARY_PATH", error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn finds_only_so2_on_ld_library_path_and_links_it() {
        let dir = std::env::temp_dir().join(format!("nccl-lib-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let so2 = dir.join("libnccl.so.2");
        std::fs::write(&so2, b"not really a library").unwrap();
        let vars: HashMap<&str, String> =
            [("LD_LIBRARY_PATH", format!("/nonexistent:{}", dir.display()))].into();
        let var = |k: &str| vars.get(k).cloned();
        assert_eq!(find(&var), Some(so2.clone()));
        let folder = link_folder(&so2).unwrap();
        assert_eq!(
            std::fs::read_link(folder.join("libnccl.so")).unwrap(),
            so2.canonicalize().unwrap()
        );
        // Idempotent.
        assert_eq!(link_folder(&so2).unwrap(), folder);
        // NCCL_LIBRARY wins, as a file or a folder.
        let vars: HashMap<&str, String> = [("NCCL_LIBRARY", dir.display().to_string())].into();
        assert_eq!(candidates(&|k: &str| vars.get(k).cloned())[0], so2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pip_wheel_layout_is_searched() {
        let venv = std::env::temp_dir().join(format!("nccl-venv-test-{}", std::process::id()));
        let lib = venv.join("lib/python3.12/site-packages/nvidia/nccl/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libnccl.so.2"), b"x").unwrap();
        let vars: HashMap<&str, String> = [("VIRTUAL_ENV", venv.display().to_string())].into();
        assert_eq!(
            find(&|k: &str| vars.get(k).cloned()),
            Some(lib.join("libnccl.so.2"))
        );
        std::fs::remove_dir_all(&venv).unwrap();
    }
}
