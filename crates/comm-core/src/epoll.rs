//! Linux's epoll, the readiness list a server of thousands of sockets waits on: the kernel keeps
//! the set of descriptors and answers each wait with only those that are ready, so a wake-up
//! costs what happened, not how many are watched (`poll(2)` hands the kernel every descriptor
//! on every call). PyTorch's libuv TCPStore server waits on epoll the same way. The store's
//! server uses it, and so does `comm-bench store-load`, which plays thousands of ranks.

use std::io::ErrorKind;
use std::os::fd::RawFd;
use std::time::Duration;

/// Readable (or the other end closed).
pub const READ: u32 = libc::EPOLLIN as u32;
/// Writable.
pub const WRITE: u32 = libc::EPOLLOUT as u32;
/// Report a change once (edge-triggered) instead of while it lasts.
pub const EDGE: u32 = libc::EPOLLET as u32;

/// One ready descriptor: the token it was added with, and what it is ready for.
#[derive(Debug, Clone, Copy)]
pub struct Ready {
    /// The token the descriptor was added with.
    pub token: u64,
    /// What it is ready for (epoll's bits).
    pub events: u32,
}

impl Ready {
    /// Something to read, or the other end closed or failed (a read then says which).
    pub fn readable(&self) -> bool {
        self.events & (READ | libc::EPOLLHUP as u32 | libc::EPOLLERR as u32) != 0
    }

    /// Room to write.
    pub fn writable(&self) -> bool {
        self.events & WRITE != 0
    }
}

/// An epoll set, closed when dropped.
pub struct Epoll {
    fd: RawFd,
    /// What the kernel fills on each wait.
    buffer: Vec<libc::epoll_event>,
}

impl Epoll {
    /// An empty set whose waits report up to `batch` descriptors at a time.
    pub fn new(batch: usize) -> std::io::Result<Epoll> {
        // SAFETY: no preconditions; the fd is owned by the returned value.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let buffer = vec![libc::epoll_event { events: 0, u64: 0 }; batch.max(1)];
        Ok(Epoll { fd, buffer })
    }

    /// Watches `fd` for `events` ([`READ`], [`WRITE`], [`EDGE`]), reported with `token`.
    pub fn add(&self, fd: RawFd, token: u64, events: u32) -> std::io::Result<()> {
        self.control(libc::EPOLL_CTL_ADD, fd, token, events)
    }

    /// Changes what `fd` is watched for (0: nothing but errors and hang-ups).
    pub fn modify(&self, fd: RawFd, token: u64, events: u32) -> std::io::Result<()> {
        self.control(libc::EPOLL_CTL_MOD, fd, token, events)
    }

    /// Stops watching `fd` (closing it does too).
    pub fn remove(&self, fd: RawFd) -> std::io::Result<()> {
        self.control(libc::EPOLL_CTL_DEL, fd, 0, 0)
    }

    fn control(&self, op: i32, fd: RawFd, token: u64, events: u32) -> std::io::Result<()> {
        let mut event = libc::epoll_event { events, u64: token };
        // SAFETY: `self.fd` is an epoll fd and `event` a valid pointer for the call; a bad `fd`
        // is an error the kernel returns, not undefined behaviour.
        match unsafe { libc::epoll_ctl(self.fd, op, fd, &mut event) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    }

    /// Waits up to `timeout` (`None`: for ever) for ready descriptors; an interrupted wait
    /// returns none.
    pub fn wait(&mut self, timeout: Option<Duration>) -> std::io::Result<Vec<Ready>> {
        let ms = match timeout {
            None => -1,
            // Rounded up, so a wait for a deadline does not wake just before it.
            Some(t) => t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32,
        };
        let capacity = self.buffer.len() as i32;
        // SAFETY: the buffer is valid for `capacity` events, which bounds what the kernel writes.
        let n = unsafe { libc::epoll_wait(self.fd, self.buffer.as_mut_ptr(), capacity, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                ErrorKind::Interrupted => Ok(Vec::new()),
                _ => Err(e),
            };
        }
        Ok(self.buffer[..n as usize]
            .iter()
            .map(|e| Ready {
                token: e.u64,
                events: e.events,
            })
            .collect())
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: the fd is this value's own and closed once.
        unsafe { libc::close(self.fd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn only_the_ready_descriptor_is_reported_with_its_token() {
        let mut set = Epoll::new(8).unwrap();
        let (mut a, b) = UnixStream::pair().unwrap();
        let (_c, d) = UnixStream::pair().unwrap();
        set.add(b.as_raw_fd(), 7, READ).unwrap();
        set.add(d.as_raw_fd(), 9, READ).unwrap();
        assert!(set.wait(Some(Duration::ZERO)).unwrap().is_empty());
        a.write_all(b"x").unwrap();
        let ready = set.wait(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(ready.len(), 1);
        assert_eq!(ready[0].token, 7);
        assert!(ready[0].readable() && !ready[0].writable());
        set.modify(b.as_raw_fd(), 7, WRITE).unwrap();
        let ready = set.wait(Some(Duration::from_secs(5))).unwrap();
        assert!(ready[0].writable());
        set.remove(b.as_raw_fd()).unwrap();
        assert!(set.wait(Some(Duration::ZERO)).unwrap().is_empty());
    }
}
