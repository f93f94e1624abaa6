//! The hello two ranks exchange when a TCP link opens: its bytes, and who may connect.
//!
//! The dialling rank sends `NCW3`, its rank and the world size (u32 little-endian each), then
//! its run id and its host's name (each a u16 little-endian length and UTF-8 bytes; a run id of
//! length 0 when it has none). The accepting rank answers with its own hello and a verdict: one
//! byte (0 accepted, 1 refused, 2 a tie: both dialled at once and the other dial is the link, see
//! `peers.rs`), then a u16 length and the reason in UTF-8. The host names let an error name the
//! node a silent peer runs on.

use crate::error::CommError;

/// The first bytes of a peer hello (version 3: rank, world size, run id and host name).
const MAGIC: &[u8; 4] = b"NCW3";
/// The hello before its run id: magic, rank, world size, run id length.
const HELLO_HEAD: usize = 4 + 4 + 4 + 2;
/// Longest run id or host name a hello may carry; a longer one is not one of ours.
const MAX_TEXT: usize = 1024;
/// The verdict before its reason: accepted or refused, reason length.
pub(super) const VERDICT_HEAD: usize = 1 + 2;

/// Who is on the other end of a peer connection.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Hello {
    pub(super) rank: usize,
    pub(super) world_size: usize,
    pub(super) run_id: Option<String>,
    /// The name of the host the rank runs on.
    pub(super) host: String,
}

/// What the accepting rank answers a hello with.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Verdict {
    /// This connection is the pair's link.
    Accepted,
    /// Not accepted, and why.
    Refused(String),
    /// Both ranks dialled at once, and the other dial is the pair's link: wait for it.
    Tie,
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
        let text = |s: &str| s.as_bytes()[..s.len().min(MAX_TEXT)].to_vec();
        let (run, host) = (text(self.run_id.as_deref().unwrap_or("")), text(&self.host));
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&(self.rank as u32).to_le_bytes());
        out.extend_from_slice(&(self.world_size as u32).to_le_bytes());
        out.extend_from_slice(&(run.len() as u16).to_le_bytes());
        out.extend_from_slice(&run);
        out.extend_from_slice(&(host.len() as u16).to_le_bytes());
        out.extend_from_slice(&host);
        out
    }

    /// The accepting rank's answer: this hello, then the verdict.
    pub(super) fn answer(&self, verdict: &Verdict) -> Vec<u8> {
        let mut answer = self.encode();
        let (code, reason) = match verdict {
            Verdict::Accepted => (0, ""),
            Verdict::Refused(reason) => (1, reason.as_str()),
            Verdict::Tie => (2, ""),
        };
        let reason = &reason.as_bytes()[..reason.len().min(u16::MAX as usize)];
        answer.push(code);
        answer.extend_from_slice(&(reason.len() as u16).to_le_bytes());
        answer.extend_from_slice(reason);
        answer
    }

    /// The verdict of code `code` (the verdict's first byte) with `reason`; `None` for a code
    /// that is not one of ours.
    pub(super) fn verdict(code: u8, reason: String) -> Option<Verdict> {
        match code {
            0 => Some(Verdict::Accepted),
            1 => Some(Verdict::Refused(reason)),
            2 => Some(Verdict::Tie),
            _ => None,
        }
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
        let (run, at) = match text_at(buf, HELLO_HEAD - 2) {
            Ok(found) => found,
            Err(parsed) => return parsed,
        };
        let (host, _) = match text_at(buf, at) {
            Ok(found) => found,
            Err(parsed) => return parsed,
        };
        Parsed::Done(Hello {
            rank: u32_at(4),
            world_size: u32_at(8),
            run_id: (!run.is_empty()).then(|| run.to_string()),
            host: host.to_string(),
        })
    }

    /// Whether `theirs`, dialling from `from`, may be another rank of this job: the error to
    /// fail with if not. (Whether its rank already has a link is `peers.rs`'s to say.)
    pub(super) fn refuse(&self, theirs: &Hello, from: &str) -> Option<CommError> {
        let claimed = theirs.rank;
        let bad = self.runs_differ(theirs)
            || theirs.world_size != self.world_size
            || claimed >= self.world_size
            || claimed == self.rank;
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
    pub(super) fn foreign(&self, theirs: &Hello, from: &str) -> CommError {
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

/// The text (a u16 little-endian length, then UTF-8 bytes) at `at` in `buf`, and where what
/// follows it starts; `Err` with how far parsing came when it is incomplete or not ours.
fn text_at(buf: &[u8], at: usize) -> Result<(&str, usize), Parsed> {
    if buf.len() < at + 2 {
        return Err(Parsed::Need(at + 2 - buf.len()));
    }
    let len = u16::from_le_bytes([buf[at], buf[at + 1]]) as usize;
    if len > MAX_TEXT {
        return Err(Parsed::NotOurs);
    }
    let end = at + 2 + len;
    if buf.len() < end {
        return Err(Parsed::Need(end - buf.len()));
    }
    match std::str::from_utf8(&buf[at + 2..end]) {
        Ok(text) => Ok((text, end)),
        Err(_) => Err(Parsed::NotOurs),
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
            host: "node1".into(),
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
        long[12..14].copy_from_slice(&(MAX_TEXT as u16 + 1).to_le_bytes());
        assert!(matches!(Hello::parse(&long), Parsed::NotOurs));
    }

    #[test]
    fn only_another_rank_of_the_same_run_and_size_is_let_in() {
        let ours = hello(1, 4, Some("a"));
        assert!(ours.refuse(&hello(2, 4, Some("a")), "x").is_none());
        assert!(ours.refuse(&hello(0, 4, None), "x").is_none());
        for theirs in [
            hello(2, 4, Some("b")),
            hello(2, 5, Some("a")),
            hello(1, 4, Some("a")),
            hello(4, 4, Some("a")),
        ] {
            assert!(ours.refuse(&theirs, "x").is_some(), "{theirs:?}");
        }
        assert!(ours.mismatch(&hello(0, 4, Some("a")), 0, "x").is_none());
        assert!(ours.mismatch(&hello(0, 4, Some("a")), 2, "x").is_some());
    }

    #[test]
    fn a_verdict_follows_the_hello_and_a_refusal_carries_its_reason() {
        let ours = hello(0, 2, None);
        let head = ours.encode().len();
        assert_eq!(&ours.answer(&Verdict::Accepted)[head..], &[0, 0, 0]);
        assert_eq!(&ours.answer(&Verdict::Tie)[head..], &[2, 0, 0]);
        let refused = ours.answer(&Verdict::Refused("why".into()));
        assert_eq!(&refused[head..head + VERDICT_HEAD], &[1, 3, 0]);
        assert_eq!(&refused[head + VERDICT_HEAD..], b"why");
        assert_eq!(Hello::verdict(2, String::new()), Some(Verdict::Tie));
        assert_eq!(Hello::verdict(9, String::new()), None);
    }
}
