//! One TCP link to a peer once the handshake is done (gloo's pair): messages framed by their
//! length, each blocking read or write bounded by the collective call's deadline, and a handle
//! that shuts the link while another thread blocks on it.
//!
//! A message is its length (u64 little-endian) then its bytes; under [`COALESCE`] bytes both go
//! out in one write. Each blocking call waits at most the time left (waking at least every
//! [`WAKE`]), so bytes that trickle in cannot stretch the deadline.

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

/// One direction of a link, with the socket timeout it has installed.
struct Half {
    stream: TcpStream,
    /// The SO_RCVTIMEO or SO_SNDTIMEO in force: a blocking call may last this long.
    installed: Duration,
}

/// A link to one peer: a reader and a writer, each used by one thread at a time.
pub(super) struct Link {
    reader: Mutex<Half>,
    writer: Mutex<Half>,
    /// A handle to shut the link down while another thread blocks on it.
    control: TcpStream,
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
    /// The link over `stream`, a peer connection whose handshake is done.
    pub(super) fn new(stream: TcpStream) -> Result<Link> {
        let setup = |e| CommError::io("setting up a peer socket", e);
        stream.set_nonblocking(false).map_err(setup)?;
        stream.set_nodelay(true).map_err(setup)?;
        stream.set_read_timeout(Some(WAKE)).map_err(setup)?;
        stream.set_write_timeout(Some(WAKE)).map_err(setup)?;
        let writer = stream.try_clone().map_err(setup)?;
        let control = stream.try_clone().map_err(setup)?;
        Ok(Link {
            reader: Mutex::new(Half {
                stream,
                installed: WAKE,
            }),
            writer: Mutex::new(Half {
                stream: writer,
                installed: WAKE,
            }),
            control,
        })
    }

    /// A handle that shuts this link down from any thread (the rank's first failure does).
    pub(super) fn shutter(&self) -> Result<TcpStream> {
        self.control
            .try_clone()
            .map_err(|e| CommError::io("peer link", e))
    }

    /// Sends `data` as one message by `deadline`.
    pub(super) fn send(&self, data: &[u8], deadline: Deadline) -> std::io::Result<()> {
        let mut half = self.writer.lock().unwrap();
        let header = (data.len() as u64).to_le_bytes();
        if data.len() <= COALESCE {
            let mut message = Vec::with_capacity(8 + data.len());
            message.extend_from_slice(&header);
            message.extend_from_slice(data);
            half.write_by(&message, deadline)
        } else {
            half.write_by(&header, deadline)
                .and_then(|_| half.write_by(data, deadline))
        }
    }

    /// Receives the next message, which must be `out.len()` bytes, into `out` by `deadline`.
    pub(super) fn recv(
        &self,
        out: &mut [u8],
        deadline: Deadline,
    ) -> std::result::Result<(), RecvError> {
        let mut half = self.reader.lock().unwrap();
        let mut header = [0u8; 8];
        half.read_by(&mut header, deadline).map_err(RecvError::Io)?;
        let len = u64::from_le_bytes(header) as usize;
        if len != out.len() {
            return Err(RecvError::Length(len));
        }
        half.read_by(out, deadline).map_err(RecvError::Io)
    }

    /// Whether the peer's end has closed (it exited, was killed, or failed and shut its links).
    /// For links that carry no data (pairs on shared memory) this is how a dead peer shows; it
    /// does not block.
    pub(super) fn peer_closed(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut poll = libc::pollfd {
            fd: self.control.as_raw_fd(),
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
        matches!(self.control.peek(&mut byte), Ok(0))
    }
}

impl Half {
    /// Makes the next blocking call end by `deadline` (waking at least every [`WAKE`]); an
    /// error of kind `TimedOut` once it has passed.
    fn limit(&mut self, deadline: Deadline, write: bool) -> std::io::Result<()> {
        let wait = deadline
            .wait_at_most(WAKE)
            .ok_or_else(|| std::io::Error::new(ErrorKind::TimedOut, "deadline passed"))?;
        // Too long would overshoot the deadline; much shorter would wake for nothing.
        if self.installed > wait || self.installed < wait / 2 {
            match write {
                true => self.stream.set_write_timeout(Some(wait))?,
                false => self.stream.set_read_timeout(Some(wait))?,
            }
            self.installed = wait;
        }
        Ok(())
    }

    /// Reads exactly `out.len()` bytes by `deadline`, however they trickle in.
    fn read_by(&mut self, mut out: &mut [u8], deadline: Deadline) -> std::io::Result<()> {
        while !out.is_empty() {
            self.limit(deadline, false)?;
            match self.stream.read(out) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => out = &mut out[n..],
                Err(e) if is_wait(&e) || e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes all of `data` by `deadline`.
    fn write_by(&mut self, mut data: &[u8], deadline: Deadline) -> std::io::Result<()> {
        while !data.is_empty() {
            self.limit(deadline, true)?;
            match self.stream.write(data) {
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
