//! A shared-memory segment: a POSIX shared-memory object (a file in /dev/shm) mapped into every
//! rank of a host that uses it, as NCCL's SHM transport and MPI's shared-memory layer make them.
//!
//! Nothing may outlive the job, even when a rank is killed: a rank's inbox loses its name the
//! moment it is made ([`Segment::create_sparse`]), and peers open it through the creator's
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

/// A mapped segment; unmapped when dropped, and its name removed if this process created it
/// and has not removed it yet.
pub(crate) struct Segment {
    base: NonNull<u8>,
    len: usize,
    /// The name while it is still linked and ours to remove.
    linked: Option<CString>,
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

    /// Creates `name` with `len` bytes, all of them reserved now: on a full /dev/shm this fails
    /// with ENOSPC instead of the first touch of a page killing the process with SIGBUS later.
    // Inboxes are made sparse now (`create_sparse`); whole, named segments remain for the tests.
    #[allow(dead_code)]
    pub(crate) fn create(name: &str, len: usize) -> io::Result<Segment> {
        let c_name = CString::new(name).map_err(io::Error::other)?;
        // SAFETY: c_name is a valid NUL-terminated string; the flags create a new object only.
        let fd = unsafe {
            libc::shm_open(
                c_name.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut segment = Segment {
            base: NonNull::dangling(),
            len: 0,
            linked: Some(c_name),
        };
        // SAFETY: fd is the descriptor shm_open just returned; posix_fallocate returns the error
        // number rather than setting errno.
        let reserved = unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) };
        let mapped = match reserved {
            0 => map(fd, len, libc::PROT_READ | libc::PROT_WRITE),
            e => Err(io::Error::from_raw_os_error(e)),
        };
        // SAFETY: fd is ours and used no more; the mapping keeps the object alive.
        unsafe { libc::close(fd) };
        segment.base = mapped?;
        segment.len = len;
        Ok(segment)
    }

    /// Creates a segment of `len` bytes of which only the first `reserved` are reserved now; each
    /// other piece is reserved with the [`Reserver`] before anyone touches it (an inbox: one ring
    /// per peer of the host, reserved when the pair first talks), so memory grows with the
    /// pairs that talk and a full /dev/shm still fails a reservation, never a touch. Its name
    /// (`name`) is gone before this returns: peers open it through this process's descriptor
    /// ([`Segment::open_in`]), whenever they first need it, and nothing is ever left behind.
    pub(crate) fn create_sparse(
        name: &str,
        len: usize,
        reserved: usize,
    ) -> io::Result<(Segment, Reserver)> {
        let c_name = CString::new(name).map_err(io::Error::other)?;
        // SAFETY: c_name is a valid NUL-terminated string; the flags create a new object only.
        let fd = unsafe {
            libc::shm_open(
                c_name.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is the descriptor shm_open just returned, owned by nobody else.
        let reserver = Reserver(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut segment = Segment {
            base: NonNull::dangling(),
            len: 0,
            linked: Some(c_name),
        };
        // SAFETY: fd is open; a sparse size reserves nothing.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        reserver.reserve(0..reserved)?;
        segment.base = map(fd, len, libc::PROT_READ | libc::PROT_WRITE)?;
        segment.len = len;
        segment.unlink();
        Ok((segment, reserver))
    }

    /// Maps the segment that process `pid` holds open as descriptor `fd` (made by
    /// [`Segment::create_sparse`]), which must hold at least `len` bytes: opened through
    /// `/proc/<pid>/fd/<fd>`, which the kernel allows a process of the same user (the access a
    /// debugger's reading needs, Yama aside).
    pub(crate) fn open_in(pid: libc::pid_t, fd: libc::c_int, len: usize) -> io::Result<Segment> {
        let path = CString::new(format!("/proc/{pid}/fd/{fd}")).map_err(io::Error::other)?;
        // SAFETY: path is a valid NUL-terminated string.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is the descriptor open just returned, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open and stat is a valid out-pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if (stat.st_size as usize) < len {
            let size = stat.st_size;
            return Err(io::Error::other(format!(
                "it holds {size} bytes, not {len}"
            )));
        }
        Ok(Segment {
            base: map(fd.as_raw_fd(), len, libc::PROT_READ | libc::PROT_WRITE)?,
            len,
            linked: None,
        })
    }

    /// Maps another rank's segment `name`, which must hold at least `len` bytes.
    // Inboxes are opened through their creator's descriptor now (`open_in`); by name remain
    // the tests.
    #[allow(dead_code)]
    pub(crate) fn open(name: &str, len: usize) -> io::Result<Segment> {
        let c_name = CString::new(name).map_err(io::Error::other)?;
        // SAFETY: c_name is a valid NUL-terminated string.
        let fd = unsafe { libc::shm_open(c_name.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open and stat is a valid out-pointer.
        let sized = match unsafe { libc::fstat(fd, &mut stat) } {
            0 if stat.st_size as usize >= len => Ok(()),
            0 => Err(io::Error::other(format!(
                "it holds {} bytes, not {len}",
                stat.st_size
            ))),
            _ => Err(io::Error::last_os_error()),
        };
        let mapped = sized.and_then(|_| map(fd, len, libc::PROT_READ | libc::PROT_WRITE));
        // SAFETY: fd is ours and used no more.
        unsafe { libc::close(fd) };
        Ok(Segment {
            base: mapped?,
            len,
            linked: None,
        })
    }

    /// Removes the name (the memory stays mapped here and wherever else it is mapped).
    pub(crate) fn unlink(&mut self) {
        if let Some(name) = self.linked.take() {
            // SAFETY: name is a valid NUL-terminated string.
            unsafe { libc::shm_unlink(name.as_ptr()) };
        }
    }

    /// The first byte of the mapping, page-aligned; `len()` bytes follow.
    pub(crate) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.unlink();
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
    fd: std::os::fd::OwnedFd,
}

impl Held {
    /// `len` bytes (all reserved now, as [`Segment::create`]) for rank `rank`, in /dev/shm;
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
        let segment = Segment {
            base,
            len,
            linked: None,
        };
        Ok(Held { segment, fd })
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
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
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
            linked: None,
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

/// The descriptor of a segment made by [`Segment::create_sparse`], to reserve its pieces; peers
/// open the segment through it.
pub(crate) struct Reserver(OwnedFd);

impl Reserver {
    /// The descriptor's number in this process, for peers' [`Segment::open_in`].
    pub(crate) fn fd(&self) -> libc::c_int {
        self.0.as_raw_fd()
    }

    /// Reserves the bytes `range` of the segment: once this returns, touching them cannot fail
    /// for want of room in /dev/shm.
    pub(crate) fn reserve(&self, range: std::ops::Range<usize>) -> io::Result<()> {
        let len = range.end.saturating_sub(range.start);
        // SAFETY: the descriptor is open; posix_fallocate returns the error number rather than
        // setting errno.
        let rc = unsafe {
            libc::posix_fallocate(
                self.0.as_raw_fd(),
                range.start as libc::off_t,
                len as libc::off_t,
            )
        };
        match rc {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(e)),
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
fn open_unlinked(rank: usize) -> io::Result<std::os::fd::OwnedFd> {
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
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) })
}

/// An anonymous memory file (`memfd_create`) with `flags` besides close-on-exec.
fn memfd(flags: libc::c_uint) -> io::Result<std::os::fd::OwnedFd> {
    // SAFETY: a constant NUL-terminated name; memfd_create touches nothing else of ours.
    let raw = unsafe { libc::memfd_create(c"ncw-registered".as_ptr(), libc::MFD_CLOEXEC | flags) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is the descriptor memfd_create just returned, owned by nobody else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) })
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
    fn a_segment_is_shared_and_its_name_goes_with_unlink() {
        let name = Segment::fresh_name(0);
        let mut ours = Segment::create(&name, 1 << 16).unwrap();
        let theirs = Segment::open(&name, 1 << 16).unwrap();
        // SAFETY: both mappings are 64 KiB long and this test is their only user.
        unsafe {
            *ours.base().add(100) = 42;
            assert_eq!(*theirs.base().add(100), 42);
        }
        assert!(Segment::open(&name, 1 << 20).is_err(), "too short");
        ours.unlink();
        assert!(!leftovers().contains(&name[1..].to_string()));
        assert!(Segment::open(&name, 1 << 16).is_err());
    }

    #[test]
    fn a_sparse_segment_holds_only_what_was_reserved() {
        let blocks = |path: &str| {
            let meta = std::fs::metadata(path).unwrap();
            std::os::unix::fs::MetadataExt::blocks(&meta) * 512
        };
        let name = Segment::fresh_name(0);
        let (ours, reserver) = Segment::create_sparse(&name, 64 << 20, 4096).unwrap();
        assert!(!leftovers().contains(&name[1..].to_string()), "no name");
        let at = format!("/proc/self/fd/{}", reserver.fd());
        assert!(blocks(&at) < 1 << 20, "{} bytes", blocks(&at));
        reserver.reserve(8 << 20..16 << 20).unwrap();
        assert!(blocks(&at) >= 8 << 20, "{} bytes", blocks(&at));
        let pid = std::process::id() as libc::pid_t;
        let theirs = Segment::open_in(pid, reserver.fd(), 64 << 20).unwrap();
        // SAFETY: both mappings are 64 MiB long, byte 100 is reserved, and this test is their
        // only user.
        unsafe {
            *ours.base().add(100) = 42;
            assert_eq!(*theirs.base().add(100), 42);
        }
        assert!(
            Segment::open_in(pid, reserver.fd(), 128 << 20).is_err(),
            "too short"
        );
    }

    #[test]
    fn a_stale_segment_of_a_dead_process_is_swept() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let name = format!("/{PREFIX}{dead}-0-feed");
        let mut stale = Segment::create(&name, 4096).unwrap();
        stale.linked = None; // as if its creator had been killed before removing it
        let live = Segment::create(&Segment::fresh_name(1), 4096).unwrap();
        assert!(sweep_stale() >= 1);
        let left = leftovers();
        assert!(!left.contains(&name[1..].to_string()), "{left:?}");
        assert_eq!(
            left.iter()
                .filter(|n| n.contains(&format!("-{}-1-", std::process::id())))
                .count(),
            1
        );
        drop(live);
    }
}
