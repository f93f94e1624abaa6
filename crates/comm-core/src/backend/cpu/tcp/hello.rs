//! The hello two ranks exchange when a TCP link opens: its bytes, and who may connect.
//!
//! The connecting rank sends `NCW2`, its rank and the world size (u32 little-endian each), then
//! its run id (u16 little-endian length, UTF-8 bytes; length 0 when it has none). The accepting
//! rank answers with its own hello and a verdict: one byte (0 accepted, 1 refused), then a u16
//! length and the reason in UTF-8.

use crate::error::CommError;

/// The first bytes of a peer hello (version 2: rank, world size and run id).
const MAGIC: &[u8; 4] = b"NCW2";
/// The hello before its run id: magic, rank, world size, run id length.
const HELLO_HEAD: usize = 4 + 4 + 4 + 2;
/// Longest run id a hello may carry; a longer one is not one of ours.
const MAX_RUN_ID: usize = 1024;
/// The verdict before its reason: accepted or refused, reason length.
pub(super) const VERDICT_HEAD: usize = 1 + 2;

/// Who is on the other end of a peer connection.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Hello {
    pub(super) rank: usize,
    pub(super) world_size: usize,
    pub(super) run_id: Option<String>,
}

/// How far a hello read so far has come.
pub(super) enum Parsed {
    /// This many more bytes are needed.
    Need(usize),
    /// Complete.
    Done(Hello),
    /// Not a hello of ours.
    NotOurs,
}

impl Hello {
    pub(super) fn encode(&self) -> Vec<u8> {
        let run = self.run_id.as_deref().unwrap_or("").as_bytes();
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&(self.rank as u32).to_le_bytes());
        out.extend_from_slice(&(self.world_size as u32).to_le_bytes());
        out.extend_from_slice(&(run.len() as u16).to_le_bytes());
        out.extend_from_slice(run);
        out
    }

    /// The accepting rank's answer: this hello, then the verdict (`refusal`'s reason, or none).
    pub(super) fn answer(&self, refusal: Option<&str>) -> Vec<u8> {
        let mut answer = self.encode();
        match refusal {
            None => answer.extend_from_slice(&[0, 0, 0]),
            Some(reason) => {
                let reason = &reason.as_bytes()[..reason.len().min(u16::MAX as usize)];
                answer.push(1);
                answer.extend_from_slice(&(reason.len() as u16).to_le_bytes());
                answer.extend_from_slice(reason);
            }
        }
        answer
    }

    pub(super) fn parse(buf: &[u8]) -> Parsed {
        let magic = buf.len().min(MAGIC.len());
        if buf[..magic] != MAGIC[..magic] {
            return Parsed::NotOurs;
        }
        if buf.len() < HELLO_HEAD {
            return Parsed::Need(HELLO_HEAD - buf.len());
        }
        let u32_at = |i: usize| u32::from_le_bytes(buf[i..i + 4].try_into().unwrap()) as usize;
        let run_len = u16::from_le_bytes([buf[12], buf[13]]) as usize;
        if run_len > MAX_RUN_ID {
            return Parsed::NotOurs;
        }
        let total = HELLO_HEAD + run_len;
        if buf.len() < total {
            return Parsed::Need(total - buf.len());
        }
        let Ok(run) = std::str::from_utf8(&buf[HELLO_HEAD..total]) else {
            return Parsed::NotOurs;
        };
        let hello = Hello {
            rank: u32_at(4),
            world_size: u32_at(8),
            run_id: (!run.is_empty()).then(|| run.to_string()),
        };
        Parsed::Done(hello)
    }

    /// Whether `theirs`, connecting from `from`, may be a higher rank of this job, `taken`
    /// telling which ranks are connected already: the error to fail with if not.
    pub(super) fn refuse(
        &self,
        theirs: &Hello,
        from: &str,
        taken: impl Fn(usize) -> bool,
    ) -> Option<CommError> {
        let claimed = theirs.rank;
        let bad = self.runs_differ(theirs)
            || theirs.world_size != self.world_size
            || claimed >= self.world_size
            || claimed <= self.rank
            || taken(claimed);
        bad.then(|| self.foreign(theirs, from))
    }

    /// Whether the accepting rank that answered with `theirs` is the one this rank meant to
    /// reach (rank `peer` of this run and size): the error to fail with if not.
    pub(super) fn mismatch(&self, theirs: &Hello, peer: usize, at: &str) -> Option<CommError> {
        let bad =
            self.runs_differ(theirs) || theirs.world_size != self.world_size || theirs.rank != peer;
        bad.then(|| self.foreign(theirs, at))
    }

    /// Both hellos carry a run id, and they differ (ranks started by hand carry none).
    fn runs_differ(&self, theirs: &Hello) -> bool {
        matches!((&theirs.run_id, &self.run_id), (Some(a), Some(b)) if a != b)
    }

    /// The error of a peer at `from` that said `theirs`, where this rank said `self`.
    fn foreign(&self, theirs: &Hello, from: &str) -> CommError {
        CommError::ForeignPeer {
            rank: self.rank,
            from: from.to_string(),
            claimed: theirs.rank,
            their_run: theirs.run_id.clone(),
            our_run: self.run_id.clone(),
            their_world: theirs.world_size,
            our_world: self.world_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(rank: usize, world_size: usize, run_id: Option<&str>) -> Hello {
        Hello {
            rank,
            world_size,
            run_id: run_id.map(str::to_string),
        }
    }

    #[test]
    fn a_hello_reads_back_byte_by_byte_and_a_stranger_is_not_ours() {
        for ours in [hello(3, 8, Some("job-42")), hello(0, 1, None)] {
            let bytes = ours.encode();
            for cut in 0..bytes.len() {
                assert!(matches!(Hello::parse(&bytes[..cut]), Parsed::Need(n) if n > 0));
            }
            assert!(matches!(Hello::parse(&bytes), Parsed::Done(h) if h == ours));
        }
        assert!(matches!(Hello::parse(b"GET / HTTP/1.1"), Parsed::NotOurs));
        let mut long = hello(1, 2, None).encode();
        long[12..14].copy_from_slice(&(MAX_RUN_ID as u16 + 1).to_le_bytes());
        assert!(matches!(Hello::parse(&long), Parsed::NotOurs));
    }

    #[test]
    fn only_a_free_higher_rank_of_the_same_run_and_size_is_let_in() {
        let ours = hello(1, 4, Some("a"));
        let free = |_| false;
        assert!(ours.refuse(&hello(2, 4, Some("a")), "x", free).is_none());
        assert!(ours.refuse(&hello(2, 4, None), "x", free).is_none());
        for theirs in [
            hello(2, 4, Some("b")),
            hello(2, 5, Some("a")),
            hello(1, 4, Some("a")),
            hello(4, 4, Some("a")),
        ] {
            assert!(ours.refuse(&theirs, "x", free).is_some(), "{theirs:?}");
        }
        assert!(ours.refuse(&hello(2, 4, None), "x", |r| r == 2).is_some());
        assert!(ours.mismatch(&hello(0, 4, Some("a")), 0, "x").is_none());
        assert!(ours.mismatch(&hello(0, 4, Some("a")), 2, "x").is_some());
    }

    #[test]
    fn a_refusal_carries_its_reason_after_the_hello() {
        let ours = hello(0, 2, None);
        let head = ours.encode().len();
        assert_eq!(&ours.answer(None)[head..], &[0, 0, 0]);
        let refused = ours.answer(Some("why"));
        assert_eq!(&refused[head..head + VERDICT_HEAD], &[1, 3, 0]);
        assert_eq!(&refused[head + VERDICT_HEAD..], b"why");
    }
}
