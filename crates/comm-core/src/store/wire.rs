//! The wire format: c10d's TCPStore protocol, as PyTorch (2.1 and later) speaks it, so that our
//! ranks can join torchrun's store and Python's `TCPStore` can read ours. The store's first layer
//! (mini-redis's frame): requests ([`Command`]) and answers ([`Answer`]), encoded and decoded both
//! ways; the only place that knows bytes. The client (`connection.rs`) and the server
//! (`server.rs`) both speak through it.
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
//! An answer has no tag: its request says its [`Shape`] ([`Command::answer`]).
//!
//! Decoding never trusts a length: each is checked against its bound as soon as it arrives, before
//! anything is allocated, and bytes are copied only once all of a field is there. A length field of
//! 2^63 costs nothing but the connection.

use std::io::{ErrorKind, Read};

/// The key on the wire for `key` in `namespace`: PyTorch's `PrefixStore` joins with `/`, and
/// its `TCPStore` puts `/` in front of every key.
pub fn wire_key(namespace: &str, key: &str) -> String {
    match namespace {
        "" => format!("/{key}"),
        ns => format!("/{ns}/{key}"),
    }
}

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

/// One decoded request: each variant is the table's row in this module's comment, its fields
/// the request's fields.
#[allow(missing_docs)]
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
struct Encoder<'a>(&'a mut Vec<u8>);

impl Encoder<'_> {
    fn u8(self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn u32(self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    fn bytes(self, v: &[u8]) -> Self {
        let e = self.u64(v.len() as u64);
        e.0.extend_from_slice(v);
        e
    }
    fn keys<S: AsRef<str>>(self, keys: &[S]) -> Self {
        keys.iter().fold(self.u64(keys.len() as u64), |e, k| {
            e.bytes(k.as_ref().as_bytes())
        })
    }
}

impl Command {
    /// Appends the request's bytes to `out`, as a client sends them.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        use query::*;
        let e = Encoder(out);
        match self {
            Command::Validate { magic } => e.u8(VALIDATE).u32(*magic),
            Command::Set { key, value } => e.u8(SET).bytes(key.as_bytes()).bytes(value),
            Command::CompareSet {
                key,
                expected,
                desired,
            } => e
                .u8(COMPARE_SET)
                .bytes(key.as_bytes())
                .bytes(expected)
                .bytes(desired),
            Command::Get { key } => e.u8(GET).bytes(key.as_bytes()),
            Command::Add { key, delta } => e.u8(ADD).bytes(key.as_bytes()).u64(*delta as u64),
            Command::Check { keys } => e.u8(CHECK).keys(keys),
            Command::Wait { keys } => e.u8(WAIT).keys(keys),
            Command::NumKeys => e.u8(GETNUMKEYS),
            Command::Delete { key } => e.u8(DELETE_KEY).bytes(key.as_bytes()),
            Command::Append { key, value } => e.u8(APPEND).bytes(key.as_bytes()).bytes(value),
            Command::MultiGet { keys } => e.u8(MULTI_GET).keys(keys),
            Command::MultiSet { pairs } => pairs
                .iter()
                .fold(e.u8(MULTI_SET).u64(pairs.len() as u64), |e, (k, v)| {
                    e.bytes(k.as_bytes()).bytes(v)
                }),
            Command::CancelWait => e.u8(CANCEL_WAIT),
            Command::Ping { nonce } => e.u8(PING).u32(*nonce),
        };
    }

    /// The request's bytes (tests; clients and the server append to a buffer).
    #[cfg(test)]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    /// The shape of the server's answer; None for the commands TCPStore does not answer.
    pub fn answer(&self) -> Option<Shape> {
        Some(match self {
            Command::Validate { .. }
            | Command::Set { .. }
            | Command::Append { .. }
            | Command::MultiSet { .. } => return None,
            Command::CompareSet { .. } | Command::Get { .. } => Shape::Value,
            Command::Add { .. } | Command::NumKeys | Command::Delete { .. } => Shape::Number,
            Command::Check { .. } => Shape::Ready,
            Command::Wait { .. } => Shape::Waited,
            Command::MultiGet { keys } => Shape::Values(keys.len()),
            Command::CancelWait => Shape::Canceled,
            Command::Ping { .. } => Shape::Nonce,
        })
    }
}

/// What an answer looks like. Answers carry no tag: the request says what comes back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    /// One value: GET, COMPARE_SET.
    Value,
    /// That many values: MULTI_GET.
    Values(usize),
    /// An i64: ADD, GETNUMKEYS, DELETE_KEY.
    Number,
    /// CHECK's u8.
    Ready,
    /// WAIT's u8.
    Waited,
    /// CANCEL_WAIT's u8 (after the 0 of a wait that ended meanwhile, read as its own answer).
    Canceled,
    /// PING's u32.
    Nonce,
}

/// One answer of the server.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Value(Vec<u8>),
    Values(Vec<Vec<u8>>),
    Number(i64),
    /// CHECK: every key set (any byte but [`READY`] reads as not).
    Ready(bool),
    /// The keys of a WAIT are set.
    StopWaiting,
    /// A WAIT was withdrawn (CANCEL_WAIT).
    WaitCanceled,
    Nonce(u32),
}

impl Answer {
    /// Appends the answer's bytes to `out`, as the server sends them.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let e = Encoder(out);
        match self {
            Answer::Value(v) => e.bytes(v),
            Answer::Values(vs) => vs.iter().fold(e, |e, v| e.bytes(v)),
            Answer::Number(n) => e.u64(*n as u64),
            Answer::Ready(ready) => e.u8(if *ready { READY } else { NOT_READY }),
            Answer::StopWaiting => e.u8(STOP_WAITING),
            Answer::WaitCanceled => e.u8(WAIT_CANCELED),
            Answer::Nonce(n) => e.u32(*n),
        };
    }

    /// The answer's bytes (tests; clients and the server append to a buffer).
    #[cfg(test)]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    /// Reads an answer of `shape` from `r`, blocking until all of it is there. A value's length is
    /// checked before anything is allocated, and its buffer grows only as bytes arrive.
    pub fn read(r: &mut impl Read, shape: Shape) -> std::io::Result<Answer> {
        Ok(match shape {
            Shape::Value => Answer::Value(read_value(r)?),
            Shape::Values(n) => {
                Answer::Values((0..n).map(|_| read_value(r)).collect::<Result<_, _>>()?)
            }
            Shape::Number => Answer::Number(i64::from_ne_bytes(exact(r)?)),
            Shape::Ready => Answer::Ready(exact::<1>(r)?[0] == READY),
            Shape::Nonce => Answer::Nonce(u32::from_ne_bytes(exact(r)?)),
            Shape::Waited | Shape::Canceled => match exact::<1>(r)?[0] {
                STOP_WAITING => Answer::StopWaiting,
                WAIT_CANCELED => Answer::WaitCanceled,
                _ if shape == Shape::Waited => return Err(odd("a WAIT answered oddly")),
                _ => return Err(odd("CANCEL_WAIT answered oddly")),
            },
        })
    }
}

/// An answer that is no answer to what was asked.
pub fn odd(what: &str) -> std::io::Error {
    std::io::Error::new(ErrorKind::InvalidData, what.to_string())
}

fn exact<const N: usize>(r: &mut impl Read) -> std::io::Result<[u8; N]> {
    let mut buf = [0u8; N];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

fn read_value(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let len = u64::from_ne_bytes(exact(r)?);
    if len > MAX_VALUE_BYTES as u64 {
        return Err(odd(&format!(
            "the store sent a value of {len} bytes, over {MAX_VALUE_BYTES}"
        )));
    }
    let mut value = Vec::with_capacity((len as usize).min(64 << 10));
    r.take(len).read_to_end(&mut value)?;
    if value.len() as u64 != len {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    Ok(value)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One request of each command, with the bytes it must be on the wire (little-endian hosts:
    /// every one this runs on). Pinned by hand, so that an encoder and a decoder that broke
    /// together still fail.
    #[cfg(target_endian = "little")]
    fn every_request() -> Vec<(Command, Vec<u8>)> {
        let n = |v: u64| v.to_le_bytes().to_vec();
        let cat = |parts: &[&[u8]]| parts.concat();
        let key = |k: &str| cat(&[&n(k.len() as u64), k.as_bytes()]);
        vec![
            (
                Command::Validate {
                    magic: VALIDATION_MAGIC,
                },
                vec![0, 0xCE, 0xF7, 0x85, 0x3C],
            ),
            (
                Command::Set {
                    key: "/k".into(),
                    value: b"v1".to_vec(),
                },
                cat(&[&[1], &key("/k"), &key("v1")]),
            ),
            (
                Command::CompareSet {
                    key: "/k".into(),
                    expected: Vec::new(),
                    desired: b"d".to_vec(),
                },
                cat(&[&[2], &key("/k"), &n(0), &key("d")]),
            ),
            (Command::Get { key: "/g".into() }, cat(&[&[3], &key("/g")])),
            (
                Command::Add {
                    key: "/n".into(),
                    delta: -2,
                },
                cat(&[&[4], &key("/n"), &(-2i64).to_le_bytes()]),
            ),
            (
                Command::Check {
                    keys: vec!["/a".into(), "/bc".into()],
                },
                cat(&[&[5], &n(2), &key("/a"), &key("/bc")]),
            ),
            (
                Command::Wait {
                    keys: vec!["/w".into()],
                },
                cat(&[&[6], &n(1), &key("/w")]),
            ),
            (Command::NumKeys, vec![7]),
            (
                Command::Delete { key: "/d".into() },
                cat(&[&[8], &key("/d")]),
            ),
            (
                Command::Append {
                    key: "/l".into(),
                    value: b"x\n".to_vec(),
                },
                cat(&[&[9], &key("/l"), &key("x\n")]),
            ),
            (
                Command::MultiGet {
                    keys: vec!["/m".into(), "/n".into()],
                },
                cat(&[&[10], &n(2), &key("/m"), &key("/n")]),
            ),
            (
                Command::MultiSet {
                    pairs: vec![("/m".into(), b"1".to_vec()), ("/n".into(), Vec::new())],
                },
                cat(&[&[11], &n(2), &key("/m"), &key("1"), &key("/n"), &n(0)]),
            ),
            (Command::CancelWait, vec![12]),
            (
                Command::Ping { nonce: 0x0102_0304 },
                vec![13, 0x04, 0x03, 0x02, 0x01],
            ),
        ]
    }

    /// One answer of each shape, with its bytes.
    #[cfg(target_endian = "little")]
    fn every_answer() -> Vec<(Answer, Shape, Vec<u8>)> {
        let value = |v: &[u8]| [&(v.len() as u64).to_le_bytes()[..], v].concat();
        vec![
            (Answer::Value(b"abc".to_vec()), Shape::Value, value(b"abc")),
            (Answer::Value(Vec::new()), Shape::Value, value(b"")),
            (
                Answer::Values(vec![b"x".to_vec(), Vec::new(), b"yz".to_vec()]),
                Shape::Values(3),
                [value(b"x"), value(b""), value(b"yz")].concat(),
            ),
            (Answer::Values(Vec::new()), Shape::Values(0), Vec::new()),
            (
                Answer::Number(-5),
                Shape::Number,
                (-5i64).to_le_bytes().to_vec(),
            ),
            (Answer::Ready(true), Shape::Ready, vec![0]),
            (Answer::Ready(false), Shape::Ready, vec![1]),
            (Answer::StopWaiting, Shape::Waited, vec![0]),
            (Answer::StopWaiting, Shape::Canceled, vec![0]),
            (Answer::WaitCanceled, Shape::Canceled, vec![1]),
            (
                Answer::Nonce(0xA0B0_C0D0),
                Shape::Nonce,
                vec![0xD0, 0xC0, 0xB0, 0xA0],
            ),
        ]
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn every_request_encodes_to_its_bytes_and_decodes_back() {
        let requests = every_request();
        assert_eq!(requests.len(), 14, "one per command byte");
        for (command, bytes) in requests {
            assert_eq!(command.encode(), bytes, "{command:?}");
            assert_eq!(
                decode(&bytes, MAX_VALUE_BYTES),
                Ok(Some((command.clone(), bytes.len()))),
                "{command:?}"
            );
        }
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn every_answer_encodes_to_its_bytes_and_reads_back() {
        for (answer, shape, bytes) in every_answer() {
            assert_eq!(answer.encode(), bytes, "{answer:?}");
            let mut rest = &bytes[..];
            assert_eq!(Answer::read(&mut rest, shape).unwrap(), answer);
            assert!(rest.is_empty(), "{answer:?} left {rest:?}");
        }
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn each_request_says_the_shape_of_its_answer() {
        let shapes: Vec<Option<Shape>> = every_request().iter().map(|(c, _)| c.answer()).collect();
        use Shape::*;
        let expected = [
            None,
            None,
            Some(Value),
            Some(Value),
            Some(Number),
            Some(Ready),
            Some(Waited),
            Some(Number),
            Some(Number),
            None,
            Some(Values(2)),
            None,
            Some(Canceled),
            Some(Nonce),
        ];
        assert_eq!(shapes, expected);
    }

    #[test]
    fn a_pipeline_of_requests_decodes_one_by_one() {
        let pipeline = [
            Command::Set {
                key: "/k".into(),
                value: b"v".to_vec(),
            },
            Command::Append {
                key: "/job/keys".into(),
                value: b"0 k\n".to_vec(),
            },
            Command::Ping { nonce: 7 },
        ];
        let mut bytes = Vec::new();
        pipeline.iter().for_each(|c| c.encode_into(&mut bytes));
        let mut at = 0;
        for command in &pipeline {
            let (decoded, used) = decode(&bytes[at..], MAX_VALUE_BYTES).unwrap().unwrap();
            assert_eq!(&decoded, command);
            at += used;
        }
        assert_eq!(at, bytes.len());
    }

    #[test]
    fn answers_that_are_cut_short_or_odd_or_too_long_are_errors() {
        let cut = Answer::Value(b"abc".to_vec()).encode();
        let err = Answer::read(&mut &cut[..cut.len() - 1], Shape::Value).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnexpectedEof);
        let err = Answer::read(&mut &[7u8][..], Shape::Waited).unwrap_err();
        assert_eq!(err.to_string(), "a WAIT answered oddly");
        let err = Answer::read(&mut &[7u8][..], Shape::Canceled).unwrap_err();
        assert_eq!(err.to_string(), "CANCEL_WAIT answered oddly");
        let huge = (MAX_VALUE_BYTES as u64 + 1).to_ne_bytes();
        let err = Answer::read(&mut &huge[..], Shape::Value).unwrap_err();
        assert!(err.to_string().contains("over 8388608"), "{err}");
    }

    #[test]
    fn keys_on_the_wire_are_prefixed_as_torch_does() {
        assert_eq!(wire_key("", "job/abort"), "/job/abort");
        // Under torchrun: the worker's PrefixStore, then TCPStore's own `/`.
        assert_eq!(wire_key("/worker/attempt_0", "x"), "//worker/attempt_0/x");
    }
}
