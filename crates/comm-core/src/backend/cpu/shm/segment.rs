//! A shared-memory segment: a POSIX shared-memory object (a file in /dev/shm) mapped into every
//! rank of a host that uses it, as NCCL's SHM transport and MPI's shared-memory layer make them.
//!
//! Nothing may outlive the job, even when a rank is killed: a rank's inbox loses its name the
//! moment it is made ([`Held`]), and peers open it through the creator's
//! descriptor when they first need it, so the memory lives only as long as some rank maps it or
//! holds it open, and the kernel frees it when the last one exits, however it exits. Only a rank
//! killed in the microseconds between creating and removing leaves a name behind; names carry
//! the creator's pid, and [`sweep_stale`] removes those whose creator is gone.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// Every segment of ours is named `/ncw-<pid>-<rank>-<random>`.
const PREFIX: &str = "ncw-";
/// Where Linux shows POSIX shared-memory objects.
const SHM_DIR: &str = "/dev/shm";

/// A mapped segment; unmapped when dropped.
pub(crate) struct Segment {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping stays valid until drop, and a Segment hands out only a raw base pointer;
// who touches which bytes, and with which atomics, is the ring protocol's business (see ring.rs).
unsafe impl Send for Segment {}
// SAFETY: as above; &Segment gives nothing but the address.
unsafe impl Sync for Segment {}

impl Segment {
    /// A fresh name for rank `rank`'s segment.
    pub(crate) fn fresh_name(rank: usize) -> String {
        format!(
            "/{PREFIX}{}-{rank}-{:016x}",
            std::process::id(),
            random_token()
        )
    }

    /// The first byte of the mapping, page-aligned; `len()` bytes follow.
    pub(crate) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: base and len are exactly what mmap returned and nothing uses them after drop.
            unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
        }
    }
}

/// A segment only its descriptor names: created in /dev/shm and unlinked at once (nothing is
/// left there however the process ends), its descriptor kept open so that peers can open it
/// through `/proc/<pid>/fd/<fd>` whenever they need it, after setting up; what registered
/// buffers and the boards their calls meet on live in ([`super::pool`], [`super::board`]).
pub(crate) struct Held {
    segment: Segment,
    fd: OwnedFd,
}

impl Held {
    /// `len` bytes for rank `rank`, all reserved now (on a full /dev/shm this fails with ENOSPC
    /// instead of the first touch of a page killing the process with SIGBUS later), in /dev/shm;
    /// with `huge`, on the huge pages the host offers instead ([`HugePages`]).
    pub(crate) fn create(rank: usize, len: usize, huge: HugePages) -> io::Result<Held> {
        let fd = match huge {
            HugePages::Reserved => memfd(libc::MFD_HUGETLB)?,
            HugePages::Transparent => memfd(0)?,
            HugePages::OnDevShm | HugePages::None => open_unlinked(rank)?,
        };
        // SAFETY: fd is the descriptor just opened; posix_fallocate returns the error number.
        let reserved = unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, len as libc::off_t) };
        if reserved != 0 {
            return Err(io::Error::from_raw_os_error(reserved));
        }
        let base = map(fd.as_raw_fd(), len, libc::PROT_READ | libc::PROT_WRITE)?;
        if huge != HugePages::None && huge != HugePages::Reserved {
            // SAFETY: advice on a range this process just mapped; it changes no contents.
            unsafe { libc::madvise(base.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
        }
        let segment = Segment { base, len };
        Ok(Held { segment, fd })
    }

    /// `len` bytes for rank `rank` in /dev/shm of which only the first `reserved` are reserved
    /// now; each other piece is reserved with [`Held::reserve`] before anyone touches it (an
    /// inbox: one ring per peer of the host, reserved when the pair first talks), so memory grows
    /// with the pairs that talk and a full /dev/shm still fails a reservation, never a touch.
    pub(crate) fn sparse(rank: usize, len: usize, reserved: usize) -> io::Result<Held> {
        let fd = open_unlinked(rank)?;
        // SAFETY: fd is open; a sparse size reserves nothing.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let base = map(fd.as_raw_fd(), len, libc::PROT_READ | libc::PROT_WRITE)?;
        let held = Held {
            segment: Segment { base, len },
            fd,
        };
        held.reserve(0..reserved)?;
        Ok(held)
    }

    /// Reserves the bytes `range` of the segment: once this returns, touching them cannot fail
    /// for want of room in /dev/shm.
    pub(crate) fn reserve(&self, range: std::ops::Range<usize>) -> io::Result<()> {
        let len = range.end.saturating_sub(range.start);
        // SAFETY: the descriptor is open; posix_fallocate returns the error number rather than
        // setting errno.
        let rc = unsafe {
            libc::posix_fallocate(
                self.fd.as_raw_fd(),
                range.start as libc::off_t,
                len as libc::off_t,
            )
        };
        match rc {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }

    /// The first byte of the mapping; `len()` bytes follow.
    pub(crate) fn base(&self) -> *mut u8 {
        self.segment.base()
    }

    /// Its length.
    pub(crate) fn len(&self) -> usize {
        self.segment.len
    }

    /// The descriptor peers open it by, in this process.
    pub(crate) fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

impl Segment {
    /// Maps the segment process `pid` holds open as descriptor `fd` ([`Held`]), all of it, which
    /// must be at least `len` bytes: read-only, or read and write with `write`. The kernel lets
    /// a process of the same user open another's descriptors (the check is ptrace's read mode,
    /// which Yama leaves alone).
    pub(crate) fn open_held(
        pid: libc::pid_t,
        fd: i32,
        len: usize,
        write: bool,
    ) -> io::Result<Segment> {
        let path = CString::new(format!("/proc/{pid}/fd/{fd}")).map_err(io::Error::other)?;
        let (flags, prot) = match write {
            true => (libc::O_RDWR, libc::PROT_READ | libc::PROT_WRITE),
            false => (libc::O_RDONLY, libc::PROT_READ),
        };
        // SAFETY: path is a valid NUL-terminated string.
        let raw = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a descriptor this process just opened and owns alone.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open and stat is a valid out-pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let size = stat.st_size as usize;
        if size < len {
            return Err(io::Error::other(format!(
                "it holds {size} bytes, not {len}"
            )));
        }
        Ok(Segment {
            base: map(fd.as_raw_fd(), size, prot)?,
            len: size,
        })
    }

    /// Its length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// Which pages a [`Held`] segment gets: the huge pages the host offers for shared memory, as
/// [`HugePages::offered`] finds them, or the ordinary 4 KiB ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HugePages {
    /// Pages of the huge page pool (hugetlbfs: `vm.nr_hugepages`), reserved for this.
    Reserved,
    /// /dev/shm is mounted with huge pages (`huge=` other than `never`).
    OnDevShm,
    /// Transparent huge pages for shared memory (`shmem_enabled` always, within_size or
    /// advise): a memory file, not in /dev/shm.
    Transparent,
    /// 4 KiB pages.
    None,
}

impl HugePages {
    /// What the host offers for `bytes` more: free pages of the huge page pool first, then
    /// /dev/shm's own, then transparent huge pages for shared memory; else none.
    pub(crate) fn offered(bytes: usize) -> HugePages {
        let free = meminfo_kib("HugePages_Free").unwrap_or(0);
        let size = meminfo_kib("Hugepagesize").unwrap_or(0) * 1024;
        if size > 0 && free * size >= bytes as u64 {
            return HugePages::Reserved;
        }
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let dev_shm = mounts
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(SHM_DIR));
        if dev_shm.is_some_and(|l| l.contains("huge=") && !l.contains("huge=never")) {
            return HugePages::OnDevShm;
        }
        let shmem = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
        let chosen = shmem.ok().and_then(|s| {
            let start = s.find('[')?;
            Some(s[start + 1..start + s[start..].find(']')?].to_string())
        });
        match chosen.as_deref() {
            Some("always" | "within_size" | "advise" | "force") => HugePages::Transparent,
            _ => HugePages::None,
        }
    }

    /// The size segments are made in: whole huge pages of the pool.
    pub(crate) fn granule(self) -> usize {
        match self {
            HugePages::Reserved => 2 << 20,
            _ => 4096,
        }
    }

    /// For the transport line: "" for 4 KiB pages.
    pub(crate) fn words(self) -> &'static str {
        match self {
            HugePages::Reserved => "on 2 MiB huge pages",
            HugePages::OnDevShm => "on /dev/shm's huge pages",
            HugePages::Transparent => "on transparent huge pages, outside /dev/shm",
            HugePages::None => "",
        }
    }
}

/// A field of /proc/meminfo, in KiB (or a count, for HugePages_Free).
fn meminfo_kib(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(&format!("{field}:")))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A fresh file in /dev/shm under this process's prefix, unlinked before it is returned: its
/// name lives a few microseconds (a rank killed then leaves it to [`sweep_stale`]).
fn open_unlinked(rank: usize) -> io::Result<OwnedFd> {
    let name = CString::new(Segment::fresh_name(rank)).map_err(io::Error::other)?;
    // SAFETY: name is a valid NUL-terminated string; the flags create a new object only.
    let raw = unsafe {
        libc::shm_open(
            name.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
            0o600,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: name is a valid NUL-terminated string.
    unsafe { libc::shm_unlink(name.as_ptr()) };
    // SAFETY: raw is the descriptor shm_open just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// An anonymous memory file (`memfd_create`) with `flags` besides close-on-exec.
fn memfd(flags: libc::c_uint) -> io::Result<OwnedFd> {
    // SAFETY: a constant NUL-terminated name; memfd_create touches nothing else of ours.
    let raw = unsafe { libc::memfd_create(c"ncw-registered".as_ptr(), libc::MFD_CLOEXEC | flags) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is the descriptor memfd_create just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// A number no other process will have picked: a segment's name, the token stamped in it.
pub(crate) fn random_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(crate::failure_record::unix_us());
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// Maps `len` bytes of `fd` shared, with protection `prot`.
fn map(fd: libc::c_int, len: usize, prot: libc::c_int) -> io::Result<NonNull<u8>> {
    // SAFETY: a fresh shared mapping of an open descriptor; the kernel picks the address.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(NonNull::new(p.cast()).expect("mmap returned null"))
}

/// Removes segments of ours left by processes that no longer exist (killed while setting up);
/// returns how many. Segments of live processes are left alone, whoever they belong to.
pub(crate) fn sweep_stale() -> usize {
    sweep(|pid| !process_exists(pid))
}

/// Removes the segments this process created and still has in /dev/shm: for a rank about to exit
/// in the middle of setting up (another rank ended the job), which unlinks nothing on the way.
pub(crate) fn remove_own() -> usize {
    let me = std::process::id() as libc::pid_t;
    sweep(|pid| pid == me)
}

/// Unlinks our segments whose creator's pid `doomed` picks; returns how many.
fn sweep(doomed: impl Fn(libc::pid_t) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(SHM_DIR) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        if doomed(pid) {
            if let Ok(c_name) = CString::new(format!("/{}", name.to_string_lossy())) {
                // SAFETY: c_name is a valid NUL-terminated string.
                if unsafe { libc::shm_unlink(c_name.as_ptr()) } == 0 {
                    removed += 1;
                }
            }
        }
    }
    removed
}

/// Whether a process with this pid exists (in this pid namespace).
fn process_exists(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    alive || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Segments of ours in /dev/shm now, by name: for tests that check nothing is left behind.
pub fn leftovers() -> Vec<String> {
    std::fs::read_dir(SHM_DIR)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(PREFIX))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_segment_is_shared_and_has_no_name() {
        let ours = Held::create(0, 1 << 16, HugePages::None).unwrap();
        let target = std::fs::read_link(format!("/proc/self/fd/{}", ours.fd())).unwrap();
        let target = target.to_string_lossy();
        assert!(target.ends_with(" (deleted)"), "its name is gone: {target}");
        let pid = std::process::id() as libc::pid_t;
        let theirs = Segment::open_held(pid, ours.fd(), 1 << 16, true).unwrap();
        // SAFETY: both mappings are 64 KiB long and this test is their only user.
        unsafe {
            *ours.base().add(100) = 42;
            assert_eq!(*theirs.base().add(100), 42);
        }
        assert!(
            Segment::open_held(pid, ours.fd(), 1 << 20, true).is_err(),
            "too short"
        );
    }

    #[test]
    fn a_sparse_segment_holds_only_what_was_reserved() {
        let blocks = |path: &str| {
            let meta = std::fs::metadata(path).unwrap();
            std::os::unix::fs::MetadataExt::blocks(&meta) * 512
        };
        let ours = Held::sparse(0, 64 << 20, 4096).unwrap();
        let at = format!("/proc/self/fd/{}", ours.fd());
        let target = std::fs::read_link(&at).unwrap();
        assert!(
            target.to_string_lossy().ends_with(" (deleted)"),
            "{target:?}"
        );
        assert!(blocks(&at) < 1 << 20, "{} bytes", blocks(&at));
        ours.reserve(8 << 20..16 << 20).unwrap();
        assert!(blocks(&at) >= 8 << 20, "{} bytes", blocks(&at));
        let pid = std::process::id() as libc::pid_t;
        let theirs = Segment::open_held(pid, ours.fd(), 64 << 20, true).unwrap();
        // SAFETY: both mappings are 64 MiB long, byte 100 is reserved, and this test is their
        // only user.
        unsafe {
            *ours.base().add(100) = 42;
            assert_eq!(*theirs.base().add(100), 42);
        }
    }

    #[test]
    fn a_stale_segment_of_a_dead_process_is_swept() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        // Names as a rank killed between creating and unlinking would leave them: one of a dead
        // process, one of this live one.
        let stale = format!("{PREFIX}{dead}-0-feed");
        let live = Segment::fresh_name(1)[1..].to_string();
        for name in [&stale, &live] {
            std::fs::write(format!("{SHM_DIR}/{name}"), b"").unwrap();
        }
        assert!(sweep_stale() >= 1);
        let left = leftovers();
        assert!(!left.contains(&stale), "{left:?}");
        assert!(left.contains(&live), "{left:?}");
        std::fs::remove_file(format!("{SHM_DIR}/{live}")).unwrap();
    }
}
