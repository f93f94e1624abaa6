//! The wire format: c10d's TCPStore protocol, as PyTorch (2.1 and later) speaks it, so that our
//! ranks can join torchrun's store and Python's `TCPStore` can read ours.
//!
//! A request is a one-byte command then its fields, with no frame around it; integers are in the
//! host's byte order (little-endian on every machine this runs on, as for PyTorch), strings and
//! values are a u64 length and that many bytes, key lists a u64 count then the strings. What each
//! command carries and answers (`TCPStoreLibUvBackend.cpp` in PyTorch is the reference):
//!
//! | command | request fields | answer |
//! |---|---|---|
//! | VALIDATE (0) | u32 magic `0x3C85F7CE` | none; must come first on every connection |
//! | SET (1) | key, value | none |
//! | COMPARE_SET (2) | key, expected, desired | the value now stored (see [`compare_set`]) |
//! | GET (3) | key | the value (empty if unset: clients WAIT first) |
//! | ADD (4) | key, i64 delta | the new i64; the value is kept as decimal ASCII |
//! | CHECK (5) | keys | u8: 0 all set, 1 not |
//! | WAIT (6) | keys | u8 0 once all are set (later, maybe much later) |
//! | GETNUMKEYS (7) | | i64 |
//! | DELETE_KEY (8) | key | i64 keys deleted (0 or 1) |
//! | APPEND (9) | key, value | none |
//! | MULTI_GET (10) | keys | each value in turn |
//! | MULTI_SET (11) | u64 n, then n × (key, value) | none |
//! | CANCEL_WAIT (12) | | u8 1, after the 0 of a wait that ended meanwhile |
//! | PING (13) | u32 nonce | the nonce |
//!
//! Decoding never trusts a length: each is checked against its bound as soon as it arrives, before
//! anything is allocated, and bytes are copied only once all of a field is there. A length field of
//! 2^63 costs nothing but the connection.

/// The number every connection starts with, after VALIDATE.
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// Longest key either side accepts (PyTorch's server: 8 KiB).
pub const MAX_KEY_BYTES: usize = 8 << 10;
/// Largest value either side accepts (PyTorch's server: 8 MiB); our server may bound it lower.
pub const MAX_VALUE_BYTES: usize = 8 << 20;
/// Most keys in one CHECK, WAIT, MULTI_GET or MULTI_SET (PyTorch's server: 128 Ki).
pub const MAX_KEY_COUNT: u64 = 128 << 10;

/// The command bytes.
pub mod query {
    pub const VALIDATE: u8 = 0;
    pub const SET: u8 = 1;
    pub const COMPARE_SET: u8 = 2;
    pub const GET: u8 = 3;
    pub const ADD: u8 = 4;
    pub const CHECK: u8 = 5;
    pub const WAIT: u8 = 6;
    pub const GETNUMKEYS: u8 = 7;
    pub const DELETE_KEY: u8 = 8;
    pub const APPEND: u8 = 9;
    pub const MULTI_GET: u8 = 10;
    pub const MULTI_SET: u8 = 11;
    pub const CANCEL_WAIT: u8 = 12;
    pub const PING: u8 = 13;
}

/// CHECK's answers.
pub const READY: u8 = 0;
pub const NOT_READY: u8 = 1;
/// WAIT's answers.
pub const STOP_WAITING: u8 = 0;
pub const WAIT_CANCELED: u8 = 1;

/// One decoded request.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Validate {
        magic: u32,
    },
    Set {
        key: String,
        value: Vec<u8>,
    },
    CompareSet {
        key: String,
        expected: Vec<u8>,
        desired: Vec<u8>,
    },
    Get {
        key: String,
    },
    Add {
        key: String,
        delta: i64,
    },
    Check {
        keys: Vec<String>,
    },
    Wait {
        keys: Vec<String>,
    },
    NumKeys,
    Delete {
        key: String,
    },
    Append {
        key: String,
        value: Vec<u8>,
    },
    MultiGet {
        keys: Vec<String>,
    },
    MultiSet {
        pairs: Vec<(String, Vec<u8>)>,
    },
    CancelWait,
    Ping {
        nonce: u32,
    },
}

/// Why a request cannot be decoded: the connection is closed after it.
#[derive(Debug, Clone, PartialEq)]
pub enum Malformed {
    /// A command byte no version of the protocol has.
    UnknownCommand(u8),
    /// A length or count over its bound: what, how long it said, the bound.
    TooLong {
        what: &'static str,
        len: u64,
        max: u64,
    },
    /// A key that is not UTF-8.
    KeyNotUtf8,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Malformed::UnknownCommand(c) => write!(f, "unknown command {c}"),
            Malformed::TooLong { what, len, max } => {
                write!(f, "{what} of {len} exceeds the bound of {max}")
            }
            Malformed::KeyNotUtf8 => write!(f, "a key is not UTF-8"),
        }
    }
}

/// Reads fields from the front of a buffer that may hold only part of a request: `Ok(None)`
/// means "wait for more bytes".
struct Fields<'a> {
    buf: &'a [u8],
    at: usize,
    max_value: usize,
}

type Field<T> = Result<Option<T>, Malformed>;

/// `?` for a field that may not have arrived yet.
macro_rules! field {
    ($e:expr) => {
        match $e? {
            Some(v) => v,
            None => return Ok(None),
        }
    };
}

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let bytes = self.buf.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(bytes)
    }
    fn u32(&mut self) -> Field<u32> {
        Ok(self
            .take(4)
            .map(|b| u32::from_ne_bytes(b.try_into().unwrap())))
    }
    fn u64(&mut self) -> Field<u64> {
        Ok(self
            .take(8)
            .map(|b| u64::from_ne_bytes(b.try_into().unwrap())))
    }
    fn length(&mut self, what: &'static str, max: usize) -> Field<usize> {
        let len = field!(self.u64());
        if len > max as u64 {
            return Err(Malformed::TooLong {
                what,
                len,
                max: max as u64,
            });
        }
        Ok(Some(len as usize))
    }
    fn key(&mut self) -> Field<String> {
        let len = field!(self.length("a key", MAX_KEY_BYTES));
        let bytes = field!(Ok(self.take(len)));
        String::from_utf8(bytes.to_vec())
            .map(Some)
            .map_err(|_| Malformed::KeyNotUtf8)
    }
    fn value(&mut self) -> Field<Vec<u8>> {
        let len = field!(self.length("a value", self.max_value));
        Ok(self.take(len).map(<[u8]>::to_vec))
    }
    fn count(&mut self) -> Field<usize> {
        let n = field!(self.u64());
        if n > MAX_KEY_COUNT {
            return Err(Malformed::TooLong {
                what: "a key count",
                len: n,
                max: MAX_KEY_COUNT,
            });
        }
        Ok(Some(n as usize))
    }
    fn keys(&mut self) -> Field<Vec<String>> {
        let n = field!(self.count());
        // Grows only as keys arrive: a count of 128 Ki with nothing behind it allocates nothing.
        // All the keys together are bounded like one value, so a request stays that small.
        let (mut keys, mut bytes) = (Vec::new(), 0usize);
        for _ in 0..n {
            let key = field!(self.key());
            bytes += key.len();
            if bytes > self.max_value {
                let max = self.max_value as u64;
                return Err(Malformed::TooLong {
                    what: "a key list",
                    len: bytes as u64,
                    max,
                });
            }
            keys.push(key);
        }
        Ok(Some(keys))
    }
}

/// Decodes the request at the front of `buf`: `Ok(Some((command, bytes used)))`, `Ok(None)` if
/// it has not all arrived yet, or why it never will be valid. Values over `max_value` bytes (and
/// over [`MAX_VALUE_BYTES`]) are malformed.
pub fn decode(buf: &[u8], max_value: usize) -> Result<Option<(Command, usize)>, Malformed> {
    let mut f = Fields {
        buf,
        at: 0,
        max_value: max_value.min(MAX_VALUE_BYTES),
    };
    let Some(&tag) = buf.first() else {
        return Ok(None);
    };
    f.at = 1;
    let command = match tag {
        query::VALIDATE => Command::Validate {
            magic: field!(f.u32()),
        },
        query::SET => Command::Set {
            key: field!(f.key()),
            value: field!(f.value()),
        },
        query::COMPARE_SET => Command::CompareSet {
            key: field!(f.key()),
            expected: field!(f.value()),
            desired: field!(f.value()),
        },
        query::GET => Command::Get {
            key: field!(f.key()),
        },
        query::ADD => Command::Add {
            key: field!(f.key()),
            delta: field!(f.u64()) as i64,
        },
        query::CHECK => Command::Check {
            keys: field!(f.keys()),
        },
        query::WAIT => Command::Wait {
            keys: field!(f.keys()),
        },
        query::GETNUMKEYS => Command::NumKeys,
        query::DELETE_KEY => Command::Delete {
            key: field!(f.key()),
        },
        query::APPEND => Command::Append {
            key: field!(f.key()),
            value: field!(f.value()),
        },
        query::MULTI_GET => Command::MultiGet {
            keys: field!(f.keys()),
        },
        query::MULTI_SET => {
            let n = field!(f.count());
            let mut pairs = Vec::new();
            let mut bytes = 0usize;
            for _ in 0..n {
                let (key, value) = (field!(f.key()), field!(f.value()));
                bytes += key.len() + value.len();
                if bytes > f.max_value {
                    return Err(Malformed::TooLong {
                        what: "a MULTI_SET",
                        len: bytes as u64,
                        max: f.max_value as u64,
                    });
                }
                pairs.push((key, value));
            }
            Command::MultiSet { pairs }
        }
        query::CANCEL_WAIT => Command::CancelWait,
        query::PING => Command::Ping {
            nonce: field!(f.u32()),
        },
        other => return Err(Malformed::UnknownCommand(other)),
    };
    Ok(Some((command, f.at)))
}

/// Builds requests and answers, field by field, in the protocol's layout.
#[derive(Default)]
pub struct Encoder(pub Vec<u8>);

impl Encoder {
    pub fn command(tag: u8) -> Encoder {
        Encoder(vec![tag])
    }
    pub fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn bytes(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(&(v.len() as u64).to_ne_bytes());
        self.0.extend_from_slice(v);
        self
    }
    pub fn keys<S: AsRef<str>>(mut self, keys: &[S]) -> Self {
        self.0.extend_from_slice(&(keys.len() as u64).to_ne_bytes());
        for k in keys {
            self = self.bytes(k.as_ref().as_bytes());
        }
        self
    }
}

impl Command {
    /// The request's bytes, as a client sends them (the client builds its requests with
    /// [`Encoder`] directly; tests check that both agree with the decoder).
    #[cfg(test)]
    pub fn encode(&self) -> Vec<u8> {
        use query::*;
        let e = match self {
            Command::Validate { magic } => Encoder::command(VALIDATE).u32(*magic),
            Command::Set { key, value } => Encoder::command(SET).bytes(key.as_bytes()).bytes(value),
            Command::CompareSet {
                key,
                expected,
                desired,
            } => Encoder::command(COMPARE_SET)
                .bytes(key.as_bytes())
                .bytes(expected)
                .bytes(desired),
            Command::Get { key } => Encoder::command(GET).bytes(key.as_bytes()),
            Command::Add { key, delta } => Encoder::command(ADD).bytes(key.as_bytes()).i64(*delta),
            Command::Check { keys } => Encoder::command(CHECK).keys(keys),
            Command::Wait { keys } => Encoder::command(WAIT).keys(keys),
            Command::NumKeys => Encoder::command(GETNUMKEYS),
            Command::Delete { key } => Encoder::command(DELETE_KEY).bytes(key.as_bytes()),
            Command::Append { key, value } => {
                Encoder::command(APPEND).bytes(key.as_bytes()).bytes(value)
            }
            Command::MultiGet { keys } => Encoder::command(MULTI_GET).keys(keys),
            Command::MultiSet { pairs } => {
                let mut e = Encoder::command(MULTI_SET);
                e.0.extend_from_slice(&(pairs.len() as u64).to_ne_bytes());
                for (k, v) in pairs {
                    e = e.bytes(k.as_bytes()).bytes(v);
                }
                e
            }
            Command::CancelWait => Encoder::command(CANCEL_WAIT),
            Command::Ping { nonce } => Encoder::command(PING).u32(*nonce),
        };
        e.0
    }
}

/// COMPARE_SET as PyTorch's server does it: an unset key takes `desired` only if `expected` is
/// empty; a set key takes it only if it holds `expected`. Either way the answer is what the key
/// holds afterwards, except for an unset key with a non-empty `expected`, answered `expected`.
/// Returns (the answer, whether the key changed).
pub fn compare_set(current: Option<&[u8]>, expected: &[u8], desired: &[u8]) -> (Vec<u8>, bool) {
    match current {
        None if expected.is_empty() => (desired.to_vec(), true),
        None => (expected.to_vec(), false),
        Some(now) if now == expected => (desired.to_vec(), true),
        Some(now) => (now.to_vec(), false),
    }
}
