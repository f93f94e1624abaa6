//! The wire format: every message is a frame, a big-endian u32 length and that many bytes. Inside a
//! frame, a one-byte tag then fields; byte strings are u32-length-prefixed.
//!
//! Decoding never trusts a length: a frame's length is checked against a bound before anything is
//! read, its payload grows only as bytes actually arrive, and a field's length or count is checked
//! against what is left of the frame. Every rank of a job runs one build, so the format has no
//! version.

use std::io::{self, Read, Write};

use super::MAX_FRAME;

/// Requests a client sends.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// The first request of every connection: which job (run id, world size) and which rank
    /// it belongs to. The server refuses a hello from another run, a rank already connected and
    /// a world size other than its own.
    Hello {
        rank: u32,
        world_size: u32,
        run_id: Option<String>,
    },
    Set {
        key: String,
        value: Vec<u8>,
    },
    /// Waits up to `timeout_ms` for the key, then returns its value.
    Get {
        key: String,
        timeout_ms: u64,
    },
    Wait {
        keys: Vec<String>,
        timeout_ms: u64,
    },
    Add {
        key: String,
        delta: i64,
    },
    Check {
        keys: Vec<String>,
    },
    Delete {
        key: String,
    },
}

/// Answers the server sends.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    Ok,
    Value(Vec<u8>),
    Number(i64),
    Bool(bool),
    /// The wait ran out; `detail` says which ranks had connected, `missing` lists those that
    /// never did (so a client can name them without reading the text).
    Timeout {
        detail: String,
        missing: Vec<u32>,
    },
    /// The server will not do what was asked, and says why.
    Refused(Refusal),
}

/// Why the server refused a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The hello's run id differs from the store's: a rank of another job found this port.
    ForeignRun { store_run_id: String },
    /// A connection of this rank is already open, from `first_from`.
    DuplicateRank { first_from: String },
    /// Rank `rank` said the world has `rank_world_size` ranks; the store (rank 0) has
    /// `store_world_size`. Once one such hello arrived, every rank's waits get this answer.
    WorldSizeMismatch {
        store_world_size: u32,
        rank: u32,
        rank_world_size: u32,
    },
    /// A bound of the store: `what` was exceeded, `max` is the bound.
    Limit { what: String, max: u64 },
    /// Anything else (no hello first, a rank outside the world).
    Other(String),
}

pub fn write_frame(w: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&n| n as usize <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(payload);
    w.write_all(&buf)?;
    w.flush()
}

/// Reads one frame; a length over [`MAX_FRAME`] is an error before anything is allocated.
pub fn read_frame(r: &mut impl Read) -> io::Result<Vec<u8>> {
    read_frame_within(r, MAX_FRAME)
}

/// A frame whose announced length exceeds the bound; the error's inner value.
#[derive(Debug)]
pub struct FrameTooLarge {
    pub len: usize,
    pub max: usize,
}

impl std::fmt::Display for FrameTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "frame of {} bytes exceeds the {}-byte limit",
            self.len, self.max
        )
    }
}

impl std::error::Error for FrameTooLarge {}

/// Reads one frame of at most `max` bytes (and never more than [`MAX_FRAME`]). A longer announced
/// length is an [`io::ErrorKind::InvalidData`] error wrapping [`FrameTooLarge`], before anything
/// is allocated; the payload buffer grows only as bytes arrive, so a peer that announces 16 MiB
/// and sends nothing costs nothing.
pub fn read_frame_within(r: &mut impl Read, max: usize) -> io::Result<Vec<u8>> {
    let max = max.min(MAX_FRAME);
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            FrameTooLarge { len, max },
        ));
    }
    let mut payload = Vec::with_capacity(len.min(64 << 10));
    r.take(len as u64).read_to_end(&mut payload)?;
    if payload.len() < len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the connection closed inside a frame",
        ));
    }
    Ok(payload)
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn put_optional(out: &mut Vec<u8>, text: Option<&str>) {
    match text {
        None => out.push(0),
        Some(text) => {
            out.push(1);
            put_bytes(out, text.as_bytes());
        }
    }
}

fn put_keys(out: &mut Vec<u8>, keys: &[String]) {
    out.extend_from_slice(&(keys.len() as u32).to_be_bytes());
    for k in keys {
        put_bytes(out, k.as_bytes());
    }
}

/// Reads fields from a frame's payload; any shortfall is malformed input.
struct Fields<'a>(&'a [u8]);

fn malformed(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed frame: {what}"),
    )
}

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(malformed("truncated"));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn bytes(&mut self) -> io::Result<Vec<u8>> {
        Ok(self.take_bytes()?.to_vec())
    }
    fn string(&mut self) -> io::Result<String> {
        String::from_utf8(self.bytes()?).map_err(|_| malformed("key is not UTF-8"))
    }
    fn optional(&mut self) -> io::Result<Option<String>> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.text()?)),
            _ => Err(malformed("bad option flag")),
        }
    }
    /// Text that need not be a key (a reason, an address): lossy, never an error.
    fn text(&mut self) -> io::Result<String> {
        Ok(String::from_utf8_lossy(self.take_bytes()?).into_owned())
    }
    fn take_bytes(&mut self) -> io::Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn keys(&mut self) -> io::Result<Vec<String>> {
        let n = self.u32()? as usize;
        if n > self.0.len() / 4 {
            return Err(malformed("key count exceeds the frame"));
        }
        (0..n).map(|_| self.string()).collect()
    }
    fn ranks(&mut self) -> io::Result<Vec<u32>> {
        let n = self.u32()? as usize;
        if n > self.0.len() / 4 {
            return Err(malformed("rank count exceeds the frame"));
        }
        (0..n).map(|_| self.u32()).collect()
    }
    fn end(self) -> io::Result<()> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(malformed("trailing bytes"))
        }
    }
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Request::Hello {
                rank,
                world_size,
                run_id,
            } => {
                out.push(0);
                out.extend_from_slice(&rank.to_be_bytes());
                out.extend_from_slice(&world_size.to_be_bytes());
                put_optional(&mut out, run_id.as_deref());
            }
            Request::Set { key, value } => {
                out.push(1);
                put_bytes(&mut out, key.as_bytes());
                put_bytes(&mut out, value);
            }
            Request::Get { key, timeout_ms } => {
                out.push(2);
                put_bytes(&mut out, key.as_bytes());
                out.extend_from_slice(&timeout_ms.to_be_bytes());
            }
            Request::Wait { keys, timeout_ms } => {
                out.push(3);
                put_keys(&mut out, keys);
                out.extend_from_slice(&timeout_ms.to_be_bytes());
            }
            Request::Add { key, delta } => {
                out.push(4);
                put_bytes(&mut out, key.as_bytes());
                out.extend_from_slice(&delta.to_be_bytes());
            }
            Request::Check { keys } => {
                out.push(5);
                put_keys(&mut out, keys);
            }
            Request::Delete { key } => {
                out.push(6);
                put_bytes(&mut out, key.as_bytes());
            }
        }
        out
    }

    pub fn decode(payload: &[u8]) -> io::Result<Request> {
        let mut f = Fields(payload);
        let request = match f.u8()? {
            0 => Request::Hello {
                rank: f.u32()?,
                world_size: f.u32()?,
                run_id: f.optional()?,
            },
            1 => Request::Set {
                key: f.string()?,
                value: f.bytes()?,
            },
            2 => Request::Get {
                key: f.string()?,
                timeout_ms: f.u64()?,
            },
            3 => Request::Wait {
                keys: f.keys()?,
                timeout_ms: f.u64()?,
            },
            4 => Request::Add {
                key: f.string()?,
                delta: f.u64()? as i64,
            },
            5 => Request::Check { keys: f.keys()? },
            6 => Request::Delete { key: f.string()? },
            tag => return Err(malformed(&format!("unknown request tag {tag}"))),
        };
        f.end()?;
        Ok(request)
    }
}

impl Response {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Response::Ok => out.push(0),
            Response::Value(v) => {
                out.push(1);
                put_bytes(&mut out, v);
            }
            Response::Number(n) => {
                out.push(2);
                out.extend_from_slice(&n.to_be_bytes());
            }
            Response::Bool(b) => {
                out.push(3);
                out.push(*b as u8);
            }
            Response::Timeout { detail, missing } => {
                out.push(4);
                put_bytes(&mut out, detail.as_bytes());
                out.extend_from_slice(&(missing.len() as u32).to_be_bytes());
                for rank in missing {
                    out.extend_from_slice(&rank.to_be_bytes());
                }
            }
            Response::Refused(refusal) => {
                out.push(5);
                match refusal {
                    Refusal::ForeignRun { store_run_id } => {
                        out.push(0);
                        put_bytes(&mut out, store_run_id.as_bytes());
                    }
                    Refusal::DuplicateRank { first_from } => {
                        out.push(1);
                        put_bytes(&mut out, first_from.as_bytes());
                    }
                    Refusal::WorldSizeMismatch {
                        store_world_size,
                        rank,
                        rank_world_size,
                    } => {
                        out.push(2);
                        out.extend_from_slice(&store_world_size.to_be_bytes());
                        out.extend_from_slice(&rank.to_be_bytes());
                        out.extend_from_slice(&rank_world_size.to_be_bytes());
                    }
                    Refusal::Limit { what, max } => {
                        out.push(3);
                        put_bytes(&mut out, what.as_bytes());
                        out.extend_from_slice(&max.to_be_bytes());
                    }
                    Refusal::Other(text) => {
                        out.push(4);
                        put_bytes(&mut out, text.as_bytes());
                    }
                }
            }
        }
        out
    }

    pub fn decode(payload: &[u8]) -> io::Result<Response> {
        let mut f = Fields(payload);
        let response = match f.u8()? {
            0 => Response::Ok,
            1 => Response::Value(f.bytes()?),
            2 => Response::Number(f.u64()? as i64),
            3 => Response::Bool(f.u8()? != 0),
            4 => Response::Timeout {
                detail: f.text()?,
                missing: f.ranks()?,
            },
            5 => Response::Refused(match f.u8()? {
                0 => Refusal::ForeignRun {
                    store_run_id: f.text()?,
                },
                1 => Refusal::DuplicateRank {
                    first_from: f.text()?,
                },
                2 => Refusal::WorldSizeMismatch {
                    store_world_size: f.u32()?,
                    rank: f.u32()?,
                    rank_world_size: f.u32()?,
                },
                3 => Refusal::Limit {
                    what: f.text()?,
                    max: f.u64()?,
                },
                4 => Refusal::Other(f.text()?),
                kind => return Err(malformed(&format!("unknown refusal {kind}"))),
            }),
            tag => return Err(malformed(&format!("unknown response tag {tag}"))),
        };
        f.end()?;
        Ok(response)
    }
}
