//! Noticing a peer that went silent: a node that loses power, or whose cable is cut, sends no
//! FIN and no RST, so nothing on the other side would notice before `--timeout` (300 s by
//! default). torchrun's elastic agent sends a heartbeat every 5 s and declares a node dead after
//! 3 missed; we ask the kernel to do the same on every connection a job has (the store's both
//! ways, and every peer link): TCP keep-alive probes after [`Heartbeat::interval`] of quiet,
//! one every interval, and `TCP_USER_TIMEOUT` so that data left unacknowledged that long fails
//! too. A peer heard from in none of [`Heartbeat::misses`] intervals is dead: the connection
//! fails with `ETIMEDOUT` ([`went_silent`]), which the store's server, the watcher and the links
//! each turn into an error naming the rank, its node and what this rank was doing.
//!
//! A slow peer is not a silent one: on a link of 1 Mbit/s each segment is acknowledged as it
//! arrives, and a peer busy computing still answers probes from its kernel. A stopped process
//! (SIGSTOP) answers them too: that one is found by the call's deadline, as before.

use std::os::fd::AsRawFd;
use std::time::Duration;

/// torchrun's rendezvous keep-alive: every 5 s, dead after 3 missed (its `keep_alive_interval`
/// and `keep_alive_max_attempt`).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// See [`DEFAULT_INTERVAL`].
pub const DEFAULT_MISSES: u32 = 3;

/// How often a quiet connection is probed, and how many unanswered intervals make a peer dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Quiet this long, a connection is probed; then once more every interval.
    pub interval: Duration,
    /// Intervals heard from in none of which the peer is declared dead.
    pub misses: u32,
}

impl Default for Heartbeat {
    fn default() -> Heartbeat {
        Heartbeat {
            interval: DEFAULT_INTERVAL,
            misses: DEFAULT_MISSES,
        }
    }
}

impl Heartbeat {
    /// How long a peer may go unheard before it is declared dead: interval × misses.
    pub fn silence(&self) -> Duration {
        self.interval * self.misses
    }

    /// The flags that set it, as a message names them.
    pub fn flags(&self) -> String {
        format!(
            "--heartbeat {} × --heartbeat-misses {}",
            self.interval.as_secs(),
            self.misses
        )
    }

    /// Asks the kernel to probe `socket` when it is quiet and to fail it once the peer has
    /// been silent for [`Heartbeat::silence`], whether this side waits to read or has data
    /// unacknowledged. Set on a listener, every connection it accepts starts with them (Linux
    /// copies a listener's TCP options into each accepted socket).
    pub fn apply(&self, socket: &impl AsRawFd) -> std::io::Result<()> {
        let fd = socket.as_raw_fd();
        let seconds = self.interval.as_secs().clamp(1, MAX_KEEPALIVE_SECONDS) as libc::c_int;
        let misses = self.misses.clamp(1, MAX_KEEPALIVE_PROBES) as libc::c_int;
        let millis = self.silence().as_millis().min(libc::c_uint::MAX as u128) as libc::c_uint;
        set(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
        set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, seconds)?;
        set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, seconds)?;
        set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, misses)?;
        set(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, millis)
    }
}

/// The kernel's largest keep-alive time and interval (MAX_TCP_KEEPIDLE), in seconds.
pub const MAX_KEEPALIVE_SECONDS: u64 = 32767;
/// The kernel's largest probe count (MAX_TCP_KEEPCNT).
pub const MAX_KEEPALIVE_PROBES: u32 = 127;

/// Whether `e` is the kernel giving up on a silent peer (keep-alive probes or data left
/// unacknowledged for the whole [`Heartbeat::silence`]), not a timeout of our own (those are
/// `EAGAIN` or made by hand). It says `ETIMEDOUT`, or, where this side's own network is the one
/// cut (its interface down, no route left), the last routing error it met on the way.
pub fn went_silent(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ETIMEDOUT
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::ENETDOWN
                | libc::EHOSTDOWN
        )
    )
}

/// One integer socket option.
fn set<T>(fd: libc::c_int, level: libc::c_int, name: libc::c_int, value: T) -> std::io::Result<()> {
    // SAFETY: `value` lives across the call and its size is the length given; a bad fd or
    // option is an error the kernel returns.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// Reads back an integer socket option.
    fn get(stream: &TcpStream, level: libc::c_int, name: libc::c_int) -> libc::c_int {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: value and len are valid out-pointers of the sizes given.
        let rc = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                level,
                name,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        value
    }

    #[test]
    fn the_kernel_is_told_torchruns_interval_and_count() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let beat = Heartbeat::default();
        assert_eq!(beat.silence(), Duration::from_secs(15));
        beat.apply(&stream).unwrap();
        assert_eq!(get(&stream, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(get(&stream, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 5);
        assert_eq!(get(&stream, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), 5);
        assert_eq!(get(&stream, libc::IPPROTO_TCP, libc::TCP_KEEPCNT), 3);
        assert_eq!(
            get(&stream, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
            15_000
        );
        assert_eq!(beat.flags(), "--heartbeat 5 × --heartbeat-misses 3");
        assert!(went_silent(&std::io::Error::from_raw_os_error(
            libc::ETIMEDOUT
        )));
        assert!(!went_silent(&std::io::ErrorKind::TimedOut.into()));
    }

    /// The store's server sets the heartbeat once, on its listener, and counts on every
    /// accepted connection inheriting it.
    #[test]
    fn a_listeners_heartbeat_carries_over_to_the_connections_it_accepts() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let beat = Heartbeat {
            interval: Duration::from_secs(2),
            misses: 4,
        };
        beat.apply(&listener).unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert_eq!(get(&accepted, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(get(&accepted, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 2);
        assert_eq!(get(&accepted, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), 2);
        assert_eq!(get(&accepted, libc::IPPROTO_TCP, libc::TCP_KEEPCNT), 4);
        assert_eq!(
            get(&accepted, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
            8_000
        );
    }
}
