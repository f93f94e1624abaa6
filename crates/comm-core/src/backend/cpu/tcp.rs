//! Processes as ranks: one TCP connection per pair of ranks, on one machine or across nodes.
//! Each rank listens on an ephemeral port of the address it reaches the store from, publishes
//! `host:port` in the store, connects to every lower rank and accepts every higher one.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::transport::{size_mismatch, Transport};
use crate::error::{CommError, Result};
use crate::store::Store;

const MAGIC: &[u8; 4] = b"NCWS";
/// Below this, header and payload go out in one write (one packet instead of two).
const COALESCE: usize = 64 << 10;

struct Link {
    reader: Mutex<TcpStream>,
    writer: Mutex<TcpStream>,
}

/// One process's TCP connections to every other rank, set up through the rendezvous store.
pub struct TcpTransport {
    rank: usize,
    links: Vec<Option<Link>>,
    timeout: Duration,
}

impl TcpTransport {
    /// Connects every pair of ranks, using the store under `prefix` to exchange addresses.
    pub fn connect(store: &Store, prefix: &str, rank: usize, world_size: usize) -> Result<Self> {
        let timeout = store.timeout();
        let listener = TcpListener::bind((store.local_ip(), 0))
            .map_err(|e| CommError::io(format!("rank {rank} cannot listen for peers"), e))?;
        let me = listener
            .local_addr()
            .map_err(|e| CommError::io("peer listener", e))?;
        store.set(&format!("{prefix}/addr/{rank}"), me.to_string().as_bytes())?;

        let mut links: Vec<Option<Link>> = (0..world_size).map(|_| None).collect();
        for (peer, link) in links.iter_mut().enumerate().take(rank) {
            let addr =
                String::from_utf8_lossy(&store.get(&format!("{prefix}/addr/{peer}"))?).into_owned();
            let addr: SocketAddr = addr.parse().map_err(|_| {
                CommError::Peer(format!("rank {peer} published a bad address {addr:?}"))
            })?;
            let mut stream =
                connect_retrying(addr, timeout).map_err(|source| CommError::PeerUnreachable {
                    rank,
                    peer,
                    addr: addr.to_string(),
                    source,
                })?;
            let mut hello = MAGIC.to_vec();
            hello.extend_from_slice(&(rank as u32).to_le_bytes());
            stream
                .write_all(&hello)
                .map_err(|e| CommError::io(format!("greeting rank {peer} at {addr}"), e))?;
            *link = Some(Link::new(stream, timeout)?);
        }

        let deadline = Instant::now() + timeout;
        listener
            .set_nonblocking(true)
            .map_err(|e| CommError::io("peer listener", e))?;
        let mut missing = world_size - rank - 1;
        while missing > 0 {
            let (mut stream, from) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let waiting: Vec<usize> = (rank + 1..world_size)
                            .filter(|&p| links[p].is_none())
                            .collect();
                        let names: Vec<String> = waiting.iter().map(usize::to_string).collect();
                        return Err(CommError::Timeout {
                            what: format!("ranks {} to connect to rank {rank}", names.join(", ")),
                            timeout,
                            detail: String::new(),
                            missing: waiting,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                Err(e) => return Err(CommError::io("accepting a peer", e)),
            };
            stream
                .set_nonblocking(false)
                .map_err(|e| CommError::io("peer socket", e))?;
            stream
                .set_read_timeout(Some(timeout))
                .map_err(|e| CommError::io("peer socket", e))?;
            let mut hello = [0u8; 8];
            if stream.read_exact(&mut hello).is_err() || &hello[..4] != MAGIC {
                continue; // not one of ours: ignore it
            }
            let peer = u32::from_le_bytes(hello[4..].try_into().unwrap()) as usize;
            if peer <= rank || peer >= world_size || links[peer].is_some() {
                return Err(CommError::Peer(format!(
                    "rank {rank} got a connection from {from} claiming to be rank {peer}: \
                     are two jobs using the same MASTER_PORT?"
                )));
            }
            links[peer] = Some(Link::new(stream, timeout)?);
            missing -= 1;
        }
        Ok(TcpTransport {
            rank,
            links,
            timeout,
        })
    }

    fn link(&self, peer: usize) -> &Link {
        self.links[peer]
            .as_ref()
            .unwrap_or_else(|| panic!("rank {} has no link to rank {peer}", self.rank))
    }

    fn failure(&self, peer: usize, doing: &'static str, e: std::io::Error) -> CommError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => CommError::Timeout {
                what: format!("rank {peer} while rank {} was {doing} it", self.rank),
                timeout: self.timeout,
                detail: " (is that rank stuck, or did the ranks call different collectives?)"
                    .into(),
                missing: vec![peer],
            },
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::BrokenPipe
            | ErrorKind::ConnectionAborted => CommError::PeerClosed {
                rank: self.rank,
                peer,
                doing,
            },
            _ => CommError::io(format!("rank {} {doing} rank {peer}", self.rank), e),
        }
    }
}

impl Link {
    fn new(stream: TcpStream, timeout: Duration) -> Result<Link> {
        let setup = |e| CommError::io("setting up a peer socket", e);
        stream.set_nodelay(true).map_err(setup)?;
        stream.set_read_timeout(Some(timeout)).map_err(setup)?;
        stream.set_write_timeout(Some(timeout)).map_err(setup)?;
        let writer = stream.try_clone().map_err(setup)?;
        Ok(Link {
            reader: Mutex::new(stream),
            writer: Mutex::new(writer),
        })
    }
}

fn connect_retrying(addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            // With no listener left on a local ephemeral port, the kernel can connect a socket
            // to itself; that is not the peer.
            Ok(s) if s.local_addr().ok() == Some(addr) => {}
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            return Err(std::io::Error::new(
                ErrorKind::TimedOut,
                "no listener answered",
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.links.len()
    }

    fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        let mut stream = self.link(peer).writer.lock().unwrap();
        let header = (data.len() as u64).to_le_bytes();
        let written = if data.len() <= COALESCE {
            let mut message = Vec::with_capacity(8 + data.len());
            message.extend_from_slice(&header);
            message.extend_from_slice(data);
            stream.write_all(&message)
        } else {
            stream
                .write_all(&header)
                .and_then(|_| stream.write_all(data))
        };
        written.map_err(|e| self.failure(peer, "sending to", e))
    }

    fn recv(&self, peer: usize, out: &mut [u8]) -> Result<()> {
        let mut stream = self.link(peer).reader.lock().unwrap();
        let mut header = [0u8; 8];
        stream
            .read_exact(&mut header)
            .map_err(|e| self.failure(peer, "receiving from", e))?;
        let len = u64::from_le_bytes(header) as usize;
        if len != out.len() {
            return Err(size_mismatch(self.rank, peer, len, out.len()));
        }
        stream
            .read_exact(out)
            .map_err(|e| self.failure(peer, "receiving from", e))
    }

    fn name(&self) -> &'static str {
        "tcp"
    }
}
