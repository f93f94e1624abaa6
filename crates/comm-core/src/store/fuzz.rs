//! The frame decoder against random and mutated input: `read_frame`, `Request::decode` and
//! `Response::decode` must return an error, never panic, on anything, and never allocate more
//! than the input holds (every length and count is checked against what is left of the frame
//! before anything is allocated; `read_frame` checks the announced length against its bound and
//! grows its buffer only as bytes arrive, starting at 64 KiB at most).
//!
//! `cargo test -p comm-core --lib store::fuzz` runs 20,000 cases of each kind (well under 2 s).
//! For a longer run, `STORE_FUZZ_CASES=5000000 cargo test --release -p comm-core --lib
//! store::fuzz -- --nocapture` (and `STORE_FUZZ_SEED=n` for another sequence), or the ignored
//! `frames_survive_millions_of_cases`: `cargo test --release -p comm-core --lib store::fuzz --
//! --ignored`.

use std::io::Cursor;

use super::frame::{read_frame, read_frame_within, Refusal, Request, Response};
use super::MAX_FRAME;

/// xorshift64*: small, fast, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn bytes_below(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max);
        (0..n).map(|_| self.next() as u8).collect()
    }
    fn text(&mut self) -> String {
        let n = self.below(12);
        (0..n)
            .map(|_| char::from(b'a' + self.below(26) as u8))
            .collect()
    }
    /// Lengths a hostile peer would pick: edges, not just small numbers.
    fn length(&mut self) -> u32 {
        match self.below(6) {
            0 => u32::MAX,
            1 => MAX_FRAME as u32 + self.below(3) as u32,
            2 => self.next() as u32,
            _ => self.below(64) as u32,
        }
    }
}

fn random_request(rng: &mut Rng) -> Request {
    match rng.below(7) {
        0 => Request::Hello {
            rank: rng.next() as u32,
            world_size: rng.next() as u32,
            run_id: (rng.below(2) == 1).then(|| rng.text()),
        },
        1 => Request::Set {
            key: rng.text(),
            value: rng.bytes_below(40),
        },
        2 => Request::Get {
            key: rng.text(),
            timeout_ms: rng.next(),
        },
        3 => Request::Wait {
            keys: (0..rng.below(4)).map(|_| rng.text()).collect(),
            timeout_ms: rng.next(),
        },
        4 => Request::Add {
            key: rng.text(),
            delta: rng.next() as i64,
        },
        5 => Request::Check {
            keys: (0..rng.below(4)).map(|_| rng.text()).collect(),
        },
        _ => Request::Delete { key: rng.text() },
    }
}

fn random_response(rng: &mut Rng) -> Response {
    match rng.below(10) {
        0 => Response::Ok,
        1 => Response::Value(rng.bytes_below(40)),
        2 => Response::Number(rng.next() as i64),
        3 => Response::Bool(rng.below(2) == 1),
        4 => Response::Timeout {
            detail: rng.text(),
            missing: (0..rng.below(5)).map(|_| rng.next() as u32).collect(),
        },
        5 => Response::Refused(Refusal::ForeignRun {
            store_run_id: rng.text(),
        }),
        6 => Response::Refused(Refusal::DuplicateRank {
            first_from: rng.text(),
        }),
        7 => Response::Refused(Refusal::WorldSizeMismatch {
            store_world_size: rng.next() as u32,
            rank: rng.next() as u32,
            rank_world_size: rng.next() as u32,
        }),
        8 => Response::Refused(Refusal::Limit {
            what: rng.text(),
            max: rng.next(),
        }),
        _ => Response::Refused(Refusal::Other(rng.text())),
    }
}

/// Damages a valid payload the ways a broken or hostile peer would.
fn mutate(rng: &mut Rng, mut payload: Vec<u8>) -> Vec<u8> {
    for _ in 0..=rng.below(3) {
        match rng.below(6) {
            0 if !payload.is_empty() => {
                let at = rng.below(payload.len());
                payload[at] ^= 1 << rng.below(8);
            }
            1 => payload.truncate(rng.below(payload.len() + 1)),
            2 => payload.extend(rng.bytes_below(8)),
            3 if payload.len() >= 5 => {
                // A huge or odd length or count where a field's length was.
                let at = 1 + rng.below(payload.len() - 4);
                payload[at..at + 4].copy_from_slice(&rng.length().to_be_bytes());
            }
            4 if !payload.is_empty() => payload[0] = rng.next() as u8,
            _ => payload = rng.bytes_below(48),
        }
    }
    payload
}

/// Decoding any frame gives an error or a value that survives another round trip unchanged.
fn check_decoders(payload: &[u8]) {
    if let Ok(request) = Request::decode(payload) {
        assert_eq!(Request::decode(&request.encode()).unwrap(), request);
    }
    if let Ok(response) = Response::decode(payload) {
        assert_eq!(Response::decode(&response.encode()).unwrap(), response);
    }
}

/// Runs `cases` cases of each kind from `seed`.
fn run(seed: u64, cases: u64) {
    let mut rng = Rng(seed | 1);
    for _ in 0..cases {
        // Valid frames decode to themselves.
        let request = random_request(&mut rng);
        assert_eq!(Request::decode(&request.encode()).unwrap(), request);
        let response = random_response(&mut rng);
        assert_eq!(Response::decode(&response.encode()).unwrap(), response);

        // Damaged ones are errors or values, never panics.
        let payload = match rng.below(2) {
            0 => request.encode(),
            _ => response.encode(),
        };
        let damaged = mutate(&mut rng, payload);
        check_decoders(&damaged);

        // The framing: an announced length (often a lie) and what follows.
        let mut stream = match rng.below(3) {
            0 => (damaged.len() as u32).to_be_bytes().to_vec(),
            _ => rng.length().to_be_bytes().to_vec(),
        };
        stream.extend_from_slice(&damaged);
        stream.truncate(rng.below(stream.len() + 1).max(stream.len() / 2));
        let max = match rng.below(2) {
            0 => MAX_FRAME,
            _ => rng.below(64),
        };
        if let Ok(frame) = read_frame_within(&mut Cursor::new(&stream), max) {
            assert!(frame.len() <= max && frame.len() + 4 <= stream.len());
            check_decoders(&frame);
        }
        if let Ok(frame) = read_frame(&mut Cursor::new(&stream)) {
            check_decoders(&frame);
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

#[test]
fn random_and_damaged_frames_never_panic() {
    let seed = env_u64("STORE_FUZZ_SEED").unwrap_or(0x5eed_f00d);
    let cases = env_u64("STORE_FUZZ_CASES").unwrap_or(20_000);
    let started = std::time::Instant::now();
    run(seed, cases);
    eprintln!("{cases} cases (seed {seed:#x}) in {:?}", started.elapsed());
}

#[test]
#[ignore = "long: millions of frames; run with --ignored, preferably --release"]
fn frames_survive_millions_of_cases() {
    let seed = env_u64("STORE_FUZZ_SEED").unwrap_or(0xdec0de);
    run(seed, 3_000_000);
}

/// The announced length alone never makes `read_frame` allocate it.
#[test]
fn a_lying_length_allocates_nothing_it_did_not_receive() {
    let mut stream = (MAX_FRAME as u32).to_be_bytes().to_vec();
    stream.extend_from_slice(&[1, 2, 3]);
    let err = read_frame(&mut Cursor::new(&stream)).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    let err = read_frame(&mut Cursor::new(&u32::MAX.to_be_bytes())).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
}
