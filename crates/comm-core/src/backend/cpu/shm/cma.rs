//! Cross-memory attach: the receiver copies a large message straight out of the sender's buffer
//! with `process_vm_readv`, one copy where the rings take two (Open MPI's vader/CMA and MPICH's
//! nemesis do the same between the ranks of a host; NCCL's P2P transport is the GPU's
//! counterpart of this path, its SHM transport of the rings).
//!
//! The kernel allows it where the reader may ptrace the sender (same user, and Yama's
//! `kernel.yama.ptrace_scope` 0; at 1 only if the sender named the reader, or anyone, with
//! `PR_SET_PTRACER`, which [`allow_peers`] does, as Open MPI does; at 2 and 3 never). Whether it
//! works is tested at connect time, by reading a token from every peer of the host; the job uses
//! it only if every pair can (see `agree_on_copy` in `wiring.rs`), and under `--copy auto` only
//! where it was measured to win ([`THRESHOLD_BYTES`]: nowhere on the machine this was written on).

use std::io;

/// From what size messages go by one copy under `--copy auto`; `None`: none does, the rings
/// carry all. Measured on this 2-core EPYC VM, 2 ranks, in place, `comm-bench --backend cpu
/// --transport shm -z 3 -n 5 --world-sizes 2 --collectives broadcast,all_gather,all_reduce -b 1M
/// -e 100M -f 10`, `--copy ring` and `--copy single` alternating, median of 3 rounds (µs):
///
/// | collective | bytes | ring | single copy | memcpy of the bytes |
/// |---|---|---|---|---|
/// | broadcast  | 1 MiB   | 36    | 75    | 15   |
/// | broadcast  | 10 MiB  | 550   | 1214  | 229-252 |
/// | broadcast  | 100 MiB | 11247 | 15963 | 4826-6478 |
/// | all_gather | 1 MiB   | 33    | 78    |      |
/// | all_gather | 10 MiB  | 605   | 1083  |      |
/// | all_gather | 100 MiB | 9528  | 14565 |      |
/// | all_reduce | 1 MiB   | 81    | 179   |      |
/// | all_reduce | 10 MiB  | 1381  | 2509  |      |
/// | all_reduce | 100 MiB | 18503 | 35089 |      |
///
/// One copy lost everywhere, by 1.4-2.2x: `process_vm_readv` pins the sender's pages a few at a
/// time (16 per batch in the kernel, each batch under the mm lock) and copies at about 6.5 GB/s
/// here, where the rings' two cached copies, each rank making one while the other makes the
/// other, reach 9-10 GB/s. So auto keeps the rings; a host where one copy wins sets a size here.
pub(crate) const THRESHOLD_BYTES: Option<usize> = None;

/// The piece a reduction takes at a time from a peer's buffer: read into a buffer of this size
/// that stays in the cache, and handed to the sink while the next is read.
pub(crate) const PIECE_BYTES: usize = 256 << 10;

/// What a rank shows its peers so they can check they may read its memory: its pid, and the
/// address of a token only it knows until it publishes it.
pub(crate) struct Probe {
    token: Box<u64>,
}

impl Probe {
    /// A fresh token in memory of this process.
    pub(crate) fn new(token: u64) -> Probe {
        Probe {
            token: Box::new(token),
        }
    }

    /// What peers need to check: "pid address token".
    pub(crate) fn published(&self) -> String {
        let at = &*self.token as *const u64 as usize;
        format!("{} {at:#x} {}", std::process::id(), self.token)
    }
}

/// A peer's published probe: its pid, the token's address and the token.
pub(crate) fn parse(published: &str) -> Option<(libc::pid_t, usize, u64)> {
    let mut words = published.split(' ');
    let pid = words.next()?.parse().ok()?;
    let at = usize::from_str_radix(words.next()?.strip_prefix("0x")?, 16).ok()?;
    let token = words.next()?.parse().ok()?;
    Some((pid, at, token))
}

/// Whether this process can read `published`'s token out of its owner's memory; why not, if
/// not (the error, and the host's ptrace policy).
pub(crate) fn check(published: &str) -> std::result::Result<libc::pid_t, String> {
    let (pid, at, token) = parse(published).ok_or("it published no probe")?;
    let mut got = [0u8; 8];
    match read(pid, at, &mut got) {
        Ok(()) if u64::from_ne_bytes(got) == token => Ok(pid),
        Ok(()) => Err(format!(
            "process {pid} is not the one that published its probe (another pid namespace?)"
        )),
        Err(e) => Err(format!("process_vm_readv: {e}{}", policy())),
    }
}

/// Reads `out.len()` bytes at address `at` of process `pid` into `out`, in as many system calls
/// as the kernel needs.
pub(crate) fn read(pid: libc::pid_t, at: usize, out: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < out.len() {
        let left = out.len() - done;
        let local = libc::iovec {
            iov_base: out[done..].as_mut_ptr().cast(),
            iov_len: left,
        };
        let remote = libc::iovec {
            iov_base: (at + done) as *mut libc::c_void,
            iov_len: left,
        };
        // SAFETY: `local` covers exactly out[done..], which we borrow mutably for the call; the
        // kernel writes nothing else of ours. `remote` names memory of another process, which
        // the kernel checks (EFAULT where it is not mapped) and only reads.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Under Yama's `ptrace_scope` 1 only a process's ancestors may read its memory, and ranks are
/// siblings: lets any process of ours do it (`PR_SET_PTRACER_ANY`), as Open MPI does. Nothing
/// at other settings, where it would not help.
pub(crate) fn allow_peers() {
    if ptrace_scope() == Some(1) {
        // SAFETY: PR_SET_PTRACER takes a pid (or PR_SET_PTRACER_ANY) and touches no memory.
        unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
    }
}

/// Yama's `kernel.yama.ptrace_scope`, where the kernel has Yama.
fn ptrace_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The host's policy, for an error: " (kernel.yama.ptrace_scope = 2)" where Yama restricts it.
fn policy() -> String {
    match ptrace_scope() {
        Some(0) | None => String::new(),
        Some(n) => format!(" (kernel.yama.ptrace_scope = {n})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_reads_its_own_probe_and_refuses_a_wrong_one() {
        let probe = Probe::new(0x5eed);
        assert_eq!(check(&probe.published()), Ok(std::process::id() as i32));
        let (pid, at, _) = parse(&probe.published()).unwrap();
        let wrong = format!("{pid} {at:#x} 7");
        assert!(check(&wrong).unwrap_err().contains("not the one"));
        assert!(check("-").unwrap_err().contains("no probe"));
        let mut out = [0u8; 8];
        let e = read(pid, 0, &mut out).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
    }

    #[test]
    fn a_large_read_is_whole() {
        let data: Vec<u8> = (0..(3 << 20) + 17).map(|i| (i * 7) as u8).collect();
        let mut out = vec![0u8; data.len()];
        read(std::process::id() as i32, data.as_ptr() as usize, &mut out).unwrap();
        assert!(out == data);
    }
}
