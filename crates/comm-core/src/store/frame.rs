//! The wire format: every message is a frame, a big-endian u32 length and that many bytes. Inside a
//! frame, a one-byte tag then fields; byte strings are u32-length-prefixed.

use std::io::{self, Read, Write};

use super::MAX_FRAME;

/// Requests a client sends.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// Says which rank this connection belongs to, for timeout messages.
    Hello {
        rank: u32,
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
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {MAX_FRAME}-byte limit"),
        ));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(payload)
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
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
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn string(&mut self) -> io::Result<String> {
        String::from_utf8(self.bytes()?).map_err(|_| malformed("key is not UTF-8"))
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
            Request::Hello { rank } => {
                out.push(0);
                out.extend_from_slice(&rank.to_be_bytes());
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
            0 => Request::Hello { rank: f.u32()? },
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
                detail: String::from_utf8_lossy(&f.bytes()?).into_owned(),
                missing: f.ranks()?,
            },
            tag => return Err(malformed(&format!("unknown response tag {tag}"))),
        };
        f.end()?;
        Ok(response)
    }
}
