//! The request decoder against random and damaged input: `wire::decode` must answer "a request",
//! "not all here yet" or "malformed", never panic, never claim more bytes than it was given, and
//! never allocate more than the input holds (every length and count is checked against its
//! bound as soon as it arrives; bytes are copied only once all of a field is there). A request
//! cut anywhere is "not all here yet", never a different request.
//!
//! `cargo test -p comm-core --lib store::fuzz` runs 20,000 cases (well under 2 s). For a longer
//! run, `STORE_FUZZ_CASES=5000000 cargo test --release -p comm-core --lib store::fuzz --
//! --nocapture` (and `STORE_FUZZ_SEED=n` for another sequence), or the ignored
//! `requests_survive_millions_of_cases`: `cargo test --release -p comm-core --lib store::fuzz --
//! --ignored`.

use super::wire::{self, Command, Malformed, MAX_VALUE_BYTES};

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
    fn keys(&mut self) -> Vec<String> {
        (0..self.below(4)).map(|_| self.text()).collect()
    }
    /// Lengths a hostile peer would pick: edges, not just small numbers.
    fn length(&mut self) -> u64 {
        match self.below(6) {
            0 => u64::MAX,
            1 => 1 << 63,
            2 => MAX_VALUE_BYTES as u64 + self.below(3) as u64,
            3 => self.next(),
            _ => self.below(64) as u64,
        }
    }
}

fn random_command(rng: &mut Rng) -> Command {
    match rng.below(14) {
        0 => Command::Validate {
            magic: rng.next() as u32,
        },
        1 => Command::Set {
            key: rng.text(),
            value: rng.bytes_below(40),
        },
        2 => Command::CompareSet {
            key: rng.text(),
            expected: rng.bytes_below(10),
            desired: rng.bytes_below(10),
        },
        3 => Command::Get { key: rng.text() },
        4 => Command::Add {
            key: rng.text(),
            delta: rng.next() as i64,
        },
        5 => Command::Check { keys: rng.keys() },
        6 => Command::Wait { keys: rng.keys() },
        7 => Command::NumKeys,
        8 => Command::Delete { key: rng.text() },
        9 => Command::Append {
            key: rng.text(),
            value: rng.bytes_below(20),
        },
        10 => Command::MultiGet { keys: rng.keys() },
        11 => Command::MultiSet {
            pairs: (0..rng.below(3))
                .map(|_| (rng.text(), rng.bytes_below(9)))
                .collect(),
        },
        12 => Command::CancelWait,
        _ => Command::Ping {
            nonce: rng.next() as u32,
        },
    }
}

/// Damages a valid request the ways a broken or hostile peer would.
fn mutate(rng: &mut Rng, mut bytes: Vec<u8>) -> Vec<u8> {
    for _ in 0..=rng.below(3) {
        match rng.below(6) {
            0 if !bytes.is_empty() => {
                let at = rng.below(bytes.len());
                bytes[at] ^= 1 << rng.below(8);
            }
            1 => bytes.truncate(rng.below(bytes.len() + 1)),
            2 => bytes.extend(rng.bytes_below(8)),
            3 if bytes.len() >= 9 => {
                // A huge or odd length or count where a field's length was.
                let at = 1 + rng.below(bytes.len() - 8);
                bytes[at..at + 8].copy_from_slice(&rng.length().to_ne_bytes());
            }
            4 if !bytes.is_empty() => bytes[0] = rng.next() as u8,
            _ => bytes = rng.bytes_below(48),
        }
    }
    bytes
}

/// Decoding anything gives a request that survives another round trip, "more", or an error.
fn check_decoder(bytes: &[u8], max_value: usize) {
    if let Ok(Some((command, used))) = wire::decode(bytes, max_value) {
        assert!(used <= bytes.len());
        let again = command.encode();
        assert_eq!(again.len(), used, "{command:?}");
        assert_eq!(wire::decode(&again, max_value), Ok(Some((command, used))));
    }
}

/// Runs `cases` cases from `seed`.
fn run(seed: u64, cases: u64) {
    let mut rng = Rng(seed | 1);
    for _ in 0..cases {
        // Valid requests decode to themselves, and every cut of one asks for more.
        let command = random_command(&mut rng);
        let bytes = command.encode();
        assert_eq!(
            wire::decode(&bytes, MAX_VALUE_BYTES),
            Ok(Some((command.clone(), bytes.len())))
        );
        let cut = rng.below(bytes.len());
        assert_eq!(wire::decode(&bytes[..cut], MAX_VALUE_BYTES), Ok(None));
        // Damaged ones are requests, "more" or errors; never panics.
        let damaged = mutate(&mut rng, bytes);
        check_decoder(&damaged, MAX_VALUE_BYTES);
        check_decoder(&damaged, rng.below(64));
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

#[test]
fn random_and_damaged_requests_never_panic() {
    let seed = env_u64("STORE_FUZZ_SEED").unwrap_or(0x5eed_f00d);
    let cases = env_u64("STORE_FUZZ_CASES").unwrap_or(20_000);
    let started = std::time::Instant::now();
    run(seed, cases);
    eprintln!("{cases} cases (seed {seed:#x}) in {:?}", started.elapsed());
}

#[test]
#[ignore = "long: millions of requests; run with --ignored, preferably --release"]
fn requests_survive_millions_of_cases() {
    let seed = env_u64("STORE_FUZZ_SEED").unwrap_or(0xdec0de);
    run(seed, 3_000_000);
}

/// A length field of 2^63 is refused the moment its eight bytes are in, whatever follows, and
/// costs nothing: no allocation of it, no waiting for it.
#[test]
fn a_lying_length_is_refused_at_once() {
    for (what, prefix) in [
        ("a key", vec![wire::query::SET]),
        ("a value", {
            let mut v = vec![wire::query::SET];
            v.extend_from_slice(&1u64.to_ne_bytes());
            v.push(b'k');
            v
        }),
        ("a key count", vec![wire::query::WAIT]),
    ] {
        let mut bytes = prefix;
        bytes.extend_from_slice(&(1u64 << 63).to_ne_bytes());
        match wire::decode(&bytes, MAX_VALUE_BYTES) {
            Err(Malformed::TooLong { what: w, len, .. }) => {
                assert_eq!((w, len), (what, 1 << 63));
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    // A key count at the bound with nothing behind it asks for more and holds nothing.
    let mut bytes = vec![wire::query::MULTI_GET];
    bytes.extend_from_slice(&wire::MAX_KEY_COUNT.to_ne_bytes());
    assert_eq!(wire::decode(&bytes, MAX_VALUE_BYTES), Ok(None));
    // A value over the server's own bound is refused as soon as its length is in.
    let mut bytes = Command::Set {
        key: "k".into(),
        value: vec![0; 65],
    }
    .encode();
    bytes.truncate(1 + 8 + 1 + 8);
    assert!(matches!(
        wire::decode(&bytes, 64),
        Err(Malformed::TooLong {
            what: "a value",
            len: 65,
            max: 64
        })
    ));
}
