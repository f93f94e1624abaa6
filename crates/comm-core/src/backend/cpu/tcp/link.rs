//! One TCP link to a peer once the handshake is done (gloo's pair): messages framed by their
//! length, each blocking read or write bounded by the collective call's deadline, and a handle
//! that shuts the link while another thread blocks on it.
//!
//! A message is its length (u64 little-endian) then its bytes; under [`COALESCE`] bytes both go
//! out in one write. Each blocking call waits at most the time left (waking at least every
//! [`WAKE`]), so bytes that trickle in cannot stretch the deadline. One socket, one descriptor:
//! the reading and the writing thread each use their own direction's timeout on it.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::Duration;

use crate::deadline::Deadline;
use crate::error::{CommError, Result};

/// Below this, header and payload go out in one write (one packet instead of two).
const COALESCE: usize = 64 << 10;
/// The longest a single blocking read or write waits before the deadline is checked again.
const WAKE: Duration = Duration::from_secs(1);

/// One direction of a link: the socket timeout it has installed (SO_RCVTIMEO or SO_SNDTIMEO):
/// a blocking call may last this long.
struct Half {
    installed: Duration,
}

/// A link to one peer: a reader and a writer, each used by one thread at a time.
pub(super) struct Link {
    stream: TcpStream,
    /// The peer's host name, as its hello said: for the error when it goes silent.
    host: String,
    reader: Mutex<Half>,
    writer: Mutex<Half>,
}

/// Why receiving a message failed.
pub(super) enum RecvError {
    /// The socket failed, closed, or the deadline passed.
    Io(std::io::Error),
    /// The peer sent a message of this many bytes, not the length asked for: the rest of it is
    /// still on the wire, and the link is out of step for good.
    Length(usize),
}

impl Link {
    /// The link over `stream`, a connection to a peer on `host` whose handshake is done.
    pub(super) fn new(stream: TcpStream, host: String) -> Result<Link> {
        let setup = |e| CommError::io("setting up a peer socket", e);
        stream.set_nonblocking(false).map_err(setup)?;
        stream.set_nodelay(true).map_err(setup)?;
        stream.set_read_timeout(Some(WAKE)).map_err(setup)?;
        stream.set_write_timeout(Some(WAKE)).map_err(setup)?;
        Ok(Link {
            stream,
            host,
            reader: Mutex::new(Half { installed: WAKE }),
            writer: Mutex::new(Half { installed: WAKE }),
        })
    }

    /// The peer's host name.
    pub(super) fn host(&self) -> &str {
        &self.host
    }

    /// Shuts the link down, from any thread: a thread blocked on it returns at once (the rank's
    /// first failure does this to every link).
    pub(super) fn shut(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Sends `data` as one message by `deadline`.
    pub(super) fn send(&self, data: &[u8], deadline: Deadline) -> std::io::Result<()> {
        let mut half = self.writer.lock().unwrap();
        let stream = &self.stream;
        let header = (data.len() as u64).to_le_bytes();
        if data.len() <= COALESCE {
            let mut message = Vec::with_capacity(8 + data.len());
            message.extend_from_slice(&header);
            message.extend_from_slice(data);
            half.write_by(stream, &message, deadline)
        } else {
            half.write_by(stream, &header, deadline)
                .and_then(|_| half.write_by(stream, data, deadline))
        }
    }

    /// Receives the next message, which must be `out.len()` bytes, into `out` by `deadline`.
    pub(super) fn recv(
        &self,
        out: &mut [u8],
        deadline: Deadline,
    ) -> std::result::Result<(), RecvError> {
        let mut half = self.reader.lock().unwrap();
        let stream = &self.stream;
        let mut header = [0u8; 8];
        half.read_by(stream, &mut header, deadline)
            .map_err(RecvError::Io)?;
        let len = u64::from_le_bytes(header) as usize;
        if len != out.len() {
            return Err(RecvError::Length(len));
        }
        half.read_by(stream, out, deadline).map_err(RecvError::Io)
    }

    /// Whether the peer's end has closed (it exited, was killed, or failed and shut its links).
    /// For links that carry no data (pairs on shared memory) this is how a dead peer shows; it
    /// does not block.
    pub(super) fn peer_closed(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut poll = libc::pollfd {
            fd: self.stream.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd, and a zero timeout: poll only reports.
        if unsafe { libc::poll(&mut poll, 1, 0) } != 1 {
            return false;
        }
        if poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            return true;
        }
        // Readable: data (not expected on an idle link) or the end of the stream.
        let mut byte = [0u8; 1];
        matches!(self.stream.peek(&mut byte), Ok(0))
    }
}

impl Half {
    /// Makes the next blocking call end by `deadline` (waking at least every [`WAKE`]); an
    /// error of kind `TimedOut` once it has passed.
    fn limit(
        &mut self,
        stream: &TcpStream,
        deadline: Deadline,
        write: bool,
    ) -> std::io::Result<()> {
        let wait = deadline
            .wait_at_most(WAKE)
            .ok_or_else(|| std::io::Error::new(ErrorKind::TimedOut, "deadline passed"))?;
        // Too long would overshoot the deadline; much shorter would wake for nothing.
        if self.installed > wait || self.installed < wait / 2 {
            match write {
                true => stream.set_write_timeout(Some(wait))?,
                false => stream.set_read_timeout(Some(wait))?,
            }
            self.installed = wait;
        }
        Ok(())
    }

    /// Reads exactly `out.len()` bytes by `deadline`, however they trickle in.
    fn read_by(
        &mut self,
        mut stream: &TcpStream,
        mut out: &mut [u8],
        deadline: Deadline,
    ) -> std::io::Result<()> {
        while !out.is_empty() {
            self.limit(stream, deadline, false)?;
            match stream.read(out) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => out = &mut out[n..],
                Err(e) if is_wait(&e) || e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes all of `data` by `deadline`.
    fn write_by(
        &mut self,
        mut stream: &TcpStream,
        mut data: &[u8],
        deadline: Deadline,
    ) -> std::io::Result<()> {
        while !data.is_empty() {
            self.limit(stream, deadline, true)?;
            match stream.write(data) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => data = &data[n..],
                Err(e) if is_wait(&e) || e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// A socket timeout ran out (the deadline is checked by the caller).
fn is_wait(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}
