//! libnccl's files: where a `libnccl.so.2` is, the private folder with a `libnccl.so` link to it,
//! and the restart with that folder on LD_LIBRARY_PATH.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use crate::error::{CommError, Result};

/// Set on the re-executed process, so a link that still does not load is an error, not a loop.
const RELINKED: &str = crate::topology::RELINKED_VAR;

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

/// The `libnccl.so.2` NCCL_LIBRARY names (the file, or the one in the folder it names), where it
/// exists: the user's own choice, which wins even over a `libnccl.so` that loads (the system's
/// NCCL, where the user points at a fork of it).
pub fn given(var: &impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let given = PathBuf::from(var("NCCL_LIBRARY")?);
    let file = match given.is_dir() {
        true => given.join("libnccl.so.2"),
        false => given,
    };
    file.is_file().then_some(file)
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

/// Makes sure `dir` is a folder only `uid` can use: creates it `0700` if missing; an existing one
/// must be a real folder (not a link) owned by `uid` and writable by nobody else. Anything else
/// is refused: another user could put their own `libnccl.so` in it.
pub fn ensure_private_dir(dir: &Path, uid: u32) -> Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(CommError::io(format!("creating {}", dir.display()), e)),
    }
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| CommError::io(format!("reading {}", dir.display()), e))?;
    let refuse = |why: String| {
        CommError::Backend(format!(
            "refusing to put the libnccl.so link in {}: {why}; remove it, or set TMPDIR to a \
             folder of your own",
            dir.display()
        ))
    };
    if !meta.file_type().is_dir() {
        return Err(refuse("it is not a folder (a link or a file)".into()));
    }
    if meta.uid() != uid {
        return Err(refuse(format!(
            "it belongs to user id {}, not to you ({uid})",
            meta.uid()
        )));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(refuse(format!(
            "others can write to it (mode {mode:03o}; it must be 0700)"
        )));
    }
    Ok(())
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
    let mine = std::env::temp_dir().join(format!("nccl-workshop-{uid}"));
    ensure_private_dir(&mine, uid)?;
    let folder = mine.join(format!("nccl-{tag:016x}"));
    ensure_private_dir(&folder, uid)?;
    let link = folder.join("libnccl.so");
    link_atomically(&library, &link).map_err(|e| {
        CommError::io(
            format!("linking {} to {}", link.display(), library.display()),
            e,
        )
    })?;
    Ok(folder)
}

/// Makes `link` a symbolic link to `target`, safe when the ranks of a node do it at the same
/// moment: a link that already points at `target` is left as it is; otherwise a new link is made
/// under a name of this process's own in the same folder and renamed over `link`, which POSIX
/// makes atomic, so every process sees either the old entry or the new link, never none, and no
/// two collide (as a remove then a symlink did: EEXIST, or a moment with no link). Should the
/// rename fail but another process have made the right link meanwhile, that is success too. No
/// temporary name outlives the call, whatever happens.
fn link_atomically(target: &Path, link: &Path) -> std::io::Result<()> {
    let points_right = || std::fs::read_link(link).ok().as_deref() == Some(target);
    if points_right() {
        return Ok(());
    }
    let temporary = temporary_name(link);
    if let Err(e) = std::os::unix::fs::symlink(target, &temporary) {
        return if points_right() { Ok(()) } else { Err(e) };
    }
    match std::fs::rename(&temporary, link) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&temporary);
            if points_right() {
                Ok(())
            } else {
                Err(e)
            }
        }
    }
}

/// `.NAME.PID-NANOS-N.tmp` beside `link`: unique to this process and call (the time and a
/// counter tell apart two processes with one pid, as on a TMPDIR that nodes share), and hidden.
fn temporary_name(link: &Path) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let name = link
        .file_name()
        .map_or("link".into(), |n| n.to_string_lossy());
    link.with_file_name(format!(".{name}.{}-{nanos}-{call}.tmp", std::process::id()))
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
        assert_eq!(given(&|k: &str| vars.get(k).cloned()), Some(so2.clone()));
        let vars: HashMap<&str, String> = [("NCCL_LIBRARY", so2.display().to_string())].into();
        assert_eq!(given(&|k: &str| vars.get(k).cloned()), Some(so2.clone()));
        // Named but missing, or not named: none given.
        let vars: HashMap<&str, String> = [("NCCL_LIBRARY", "/nonexistent/x".into())].into();
        assert_eq!(given(&|k: &str| vars.get(k).cloned()), None);
        assert_eq!(given(&|_: &str| None), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The names in `dir`, sorted.
    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_right_link_is_kept_and_any_other_replaced() {
        let dir = std::env::temp_dir().join(format!("nccl-relink-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let right = dir.join("libnccl.so.2");
        std::fs::write(&right, b"the library").unwrap();
        let other = dir.join("other.so.2");
        std::fs::write(&other, b"another library").unwrap();
        let link = dir.join("libnccl.so");
        let only_these = ["libnccl.so", "libnccl.so.2", "other.so.2"];
        // None yet: made.
        link_atomically(&right, &link).unwrap();
        assert_eq!(std::fs::read_link(&link).unwrap(), right);
        assert_eq!(names_in(&dir), only_these);
        // The right one already: success, and left as it is (not made again: the same inode).
        let inode = std::fs::symlink_metadata(&link).unwrap().ino();
        link_atomically(&right, &link).unwrap();
        assert_eq!(std::fs::symlink_metadata(&link).unwrap().ino(), inode);
        // A link to another file, a dangling link, a plain file: replaced.
        let wrong: [&dyn Fn(); 3] = [
            &|| std::os::unix::fs::symlink(&other, &link).unwrap(),
            &|| std::os::unix::fs::symlink(dir.join("gone"), &link).unwrap(),
            &|| std::fs::write(&link, b"not a link").unwrap(),
        ];
        for make_wrong in wrong {
            std::fs::remove_file(&link).unwrap();
            make_wrong();
            link_atomically(&right, &link).unwrap();
            assert_eq!(std::fs::read_link(&link).unwrap(), right);
            assert_eq!(names_in(&dir), only_these);
        }
        // A folder in its place cannot be replaced: an error, and no temporary name left.
        std::fs::remove_file(&link).unwrap();
        std::fs::create_dir(&link).unwrap();
        assert!(link_atomically(&right, &link).is_err());
        assert_eq!(names_in(&dir), only_these);
        // Through link_folder, as a restart does: a wrong link in the private folder is mended,
        // and a failure names the link and the library.
        let folder = link_folder(&right).unwrap();
        let in_folder = folder.join("libnccl.so");
        std::fs::remove_file(&in_folder).unwrap();
        std::os::unix::fs::symlink(&other, &in_folder).unwrap();
        assert_eq!(link_folder(&right).unwrap(), folder);
        assert_eq!(
            std::fs::read_link(&in_folder).unwrap(),
            right.canonicalize().unwrap()
        );
        assert_eq!(names_in(&folder), ["libnccl.so"]);
        std::fs::remove_file(&in_folder).unwrap();
        std::fs::create_dir(&in_folder).unwrap();
        let err = link_folder(&right).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "linking {} to {}",
                in_folder.display(),
                right.canonicalize().unwrap().display()
            )),
            "{err}"
        );
        assert_eq!(names_in(&folder), ["libnccl.so"]);
        std::fs::remove_dir_all(&folder).unwrap();
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

    #[test]
    fn the_link_folder_is_private() {
        let root = std::env::temp_dir().join(format!("nccl-private-test-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let fresh = root.join("fresh");
        ensure_private_dir(&fresh, uid).unwrap();
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // Again: it exists and is ours.
        ensure_private_dir(&fresh, uid).unwrap();
        // Someone else's.
        let err = ensure_private_dir(&fresh, uid + 1).unwrap_err().to_string();
        assert!(err.contains(&format!("belongs to user id {uid}")), "{err}");
        // Writable by the group or the world.
        let open = root.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = ensure_private_dir(&open, uid).unwrap_err().to_string();
        assert!(
            err.contains("others can write to it (mode 777") && err.contains("TMPDIR"),
            "{err}"
        );
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(ensure_private_dir(&open, uid).is_err());
        // A link where the folder should be.
        let link = root.join("link");
        std::os::unix::fs::symlink(&fresh, &link).unwrap();
        let err = ensure_private_dir(&link, uid).unwrap_err().to_string();
        assert!(err.contains("not a folder"), "{err}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
