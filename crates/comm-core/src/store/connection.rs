//! One TCPStore connection, the store's second layer (mini-redis's connection): requests out and
//! answers in, in `wire`'s format. It knows the protocol's manners: the handshake (VALIDATE, then
//! a PING that proves a TCPStore answers), a PING after requests TCPStore does not answer so that
//! they are known done, and how a WAIT that ran out of time is withdrawn. Nothing of what keys
//! mean.

use std::io::{BufReader, ErrorKind, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::wire::{self, Answer, Command, Shape};
use crate::deadline::Deadline;
use crate::heartbeat::Heartbeat;

/// One TCPStore connection.
pub(super) struct Conn {
    pub(super) stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    /// Connects within `left`, validates and pings (the ping proves a TCPStore answers).
    pub(super) fn open(endpoint: &str, left: Duration, beat: Heartbeat) -> std::io::Result<Conn> {
        Conn::start(endpoint, left, beat)?.confirm()
    }

    /// Connects within `left` and sends VALIDATE and a PING, without waiting for the answer:
    /// [`Conn::confirm`] reads it, so the round trip can overlap other work. The connection is
    /// probed as `beat` says, so a store whose node went silent is noticed.
    pub(super) fn start(endpoint: &str, left: Duration, beat: Heartbeat) -> std::io::Result<Conn> {
        let left = left.clamp(Duration::from_millis(50), Duration::from_secs(5));
        let addr = endpoint.to_socket_addrs()?.next().ok_or_else(|| {
            std::io::Error::new(ErrorKind::NotFound, format!("{endpoint} has no address"))
        })?;
        // EMFILE/ENFILE here (no descriptor for the socket) is as passing as a refused connection.
        let stream = TcpStream::connect_timeout(&addr, left)?;
        // A socket the kernel connected to itself (no listener yet) is not the store.
        if stream.local_addr()? == stream.peer_addr()? {
            return Err(std::io::Error::new(
                ErrorKind::ConnectionRefused,
                "no store listening yet",
            ));
        }
        stream.set_nodelay(true)?;
        beat.apply(&stream)?;
        stream.set_read_timeout(Some(left))?;
        let reader = BufReader::new(stream.try_clone()?);
        let mut conn = Conn { stream, reader };
        let hello = [
            Command::Validate {
                magic: wire::VALIDATION_MAGIC,
            },
            Command::Ping {
                nonce: std::process::id(),
            },
        ];
        match conn.send(&hello) {
            Err(e) if closed(&e) => Err(closed_at_once()),
            sent => sent.map(|()| conn),
        }
    }

    /// Reads the answer to [`Conn::start`]'s PING.
    pub(super) fn confirm(mut self) -> std::io::Result<Conn> {
        match self.nonce() {
            Ok(echo) if echo == std::process::id() => Ok(self),
            Ok(_) => Err(std::io::Error::new(
                ErrorKind::InvalidData,
                "what answers there is not a TCPStore (its ping came back wrong)",
            )),
            Err(e) if closed(&e) => Err(closed_at_once()),
            Err(e) => Err(e),
        }
    }

    /// Sends `requests` in one write.
    pub(super) fn send(&mut self, requests: &[Command]) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        requests.iter().for_each(|r| r.encode_into(&mut bytes));
        self.stream.write_all(&bytes)
    }

    /// Reads the next answer, of `shape`.
    pub(super) fn read(&mut self, shape: Shape) -> std::io::Result<Answer> {
        Answer::read(&mut self.reader, shape)
    }

    pub(super) fn value(&mut self) -> std::io::Result<Vec<u8>> {
        match self.read(Shape::Value)? {
            Answer::Value(v) => Ok(v),
            _ => Err(wire::odd("not a value")),
        }
    }

    pub(super) fn values(&mut self, n: usize) -> std::io::Result<Vec<Vec<u8>>> {
        match self.read(Shape::Values(n))? {
            Answer::Values(v) => Ok(v),
            _ => Err(wire::odd("not values")),
        }
    }

    pub(super) fn number(&mut self) -> std::io::Result<i64> {
        match self.read(Shape::Number)? {
            Answer::Number(n) => Ok(n),
            _ => Err(wire::odd("not a number")),
        }
    }

    pub(super) fn ready(&mut self) -> std::io::Result<bool> {
        match self.read(Shape::Ready)? {
            Answer::Ready(ready) => Ok(ready),
            _ => Err(wire::odd("not CHECK's answer")),
        }
    }

    fn nonce(&mut self) -> std::io::Result<u32> {
        match self.read(Shape::Nonce)? {
            Answer::Nonce(n) => Ok(n),
            _ => Err(wire::odd("not PING's answer")),
        }
    }

    /// Sends requests TCPStore does not answer, then a PING, so that they are known done (or
    /// refused: the server closes the connection) when this returns.
    pub(super) fn confirmed(&mut self, mut requests: Vec<Command>) -> std::io::Result<()> {
        // An answered request here would leave its answer in front of the PING's.
        debug_assert!(requests.iter().all(|r| r.answer().is_none()));
        let nonce = std::process::id();
        requests.push(Command::Ping { nonce });
        self.send(&requests)?;
        match self.nonce() {
            Ok(n) if n == nonce => Ok(()),
            Ok(_) => Err(std::io::Error::new(
                ErrorKind::InvalidData,
                "the store's ping came back wrong",
            )),
            Err(e) if closed(&e) => Err(std::io::Error::new(
                ErrorKind::ConnectionAborted,
                "the store closed the connection after this request (over one of its bounds? \
                 rank 0's output says which)",
            )),
            Err(e) => Err(e),
        }
    }

    /// WAIT for `keys`: true once they are set, false after `timeout` (the wait is then
    /// withdrawn).
    pub(super) fn wait(&mut self, keys: Vec<String>, timeout: Duration) -> std::io::Result<bool> {
        self.send(&[Command::Wait { keys }])?;
        self.stream
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
        match self.read(Shape::Waited) {
            Ok(Answer::StopWaiting) => return Ok(true),
            Ok(_) => return Err(wire::odd("a WAIT answered oddly")),
            Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(e)
            }
            Err(_) => {}
        }
        // Withdraw the wait; the answer to it may have crossed our cancel, so skip it.
        self.stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        self.send(&[Command::CancelWait])?;
        let mut answer = self.read(Shape::Canceled)?;
        if answer == Answer::StopWaiting {
            answer = self.read(Shape::Canceled)?;
        }
        match answer {
            Answer::WaitCanceled => Ok(false),
            _ => Err(wire::odd("CANCEL_WAIT answered oddly")),
        }
    }
}

/// The store closed a new connection before answering its ping.
fn closed_at_once() -> std::io::Error {
    std::io::Error::new(
        ErrorKind::ConnectionAborted,
        "the store closed the connection at once (it closes connections over its bound of open \
         connections, and says so in rank 0's output)",
    )
}

/// Whether `e` says the other end closed the connection (a close, or a reset when it closed
/// without reading what we sent).
fn closed(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
    )
}

/// Connects, validates and pings, retrying with a growing pause until `deadline`.
pub(super) fn connect_until(
    endpoint: &str,
    deadline: Deadline,
    beat: Heartbeat,
) -> std::io::Result<Conn> {
    let mut pause = Duration::from_millis(20);
    loop {
        let left = deadline.remaining().unwrap_or(Duration::MAX);
        match Conn::open(endpoint, left, beat) {
            Ok(conn) => return Ok(conn),
            Err(e) if deadline.remaining().is_some_and(|left| left <= pause) => return Err(e),
            Err(_) => {}
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}
