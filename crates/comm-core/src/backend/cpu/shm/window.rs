//! The window: how the ranks of one host reach each other's registered buffers during a call
//! (MPI's shared-memory window, XPMEM's attach). Set up once per communicator, over the store:
//! each rank makes its board ([`super::board`]), publishes its pid and descriptor, and maps
//! every peer's; the job uses the window only if every rank could.
//!
//! A call on it (`Window::open` of the transport) goes:
//! 1. every rank posts its call and where its buffers lie, then meets the others at a barrier;
//! 2. each reads every post: a call that differs is an error naming the rank; if any rank's
//!    buffers are not registered (a `Vec`), every rank knows it and the call goes through the
//!    rings instead, as before;
//! 3. otherwise each maps the peers' segments it has not mapped yet (kept for later calls) and
//!    the algorithm reads their buffers, in phases separated by barriers (`fence`);
//! 4. a last barrier (`close`): no rank returns while a peer may still read its
//!    buffers.
//!
//! So who may touch which bytes when is the algorithm's phases': between two barriers a rank
//! writes only bytes no peer reads in that phase, and reads only bytes no one writes in it.
//!
//! Under `--copy auto` a call smaller than [`registered_from`] skips the window and goes
//! through the rings: its two barriers cost more than the messages. Each rank decides from its
//! own buffers, so ranks that disagree on sizes may split, some at the window's barrier, some on
//! the rings; each side sees the other while it waits (a ring message in the inbox of a rank at
//! the barrier, a board's barrier count ahead for a rank on the rings) and says so.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

use super::board::{Board, Post, BOARD_BYTES};
use super::pairing::Arming;
use super::pool::{self, Location, Region};
use super::segment::{random_token, Held, HugePages, Segment};
use super::waiting::Waiter;
use crate::backend::cpu::transport::{Signature, Window as WindowOnHost, WindowCall};
use crate::collective::Collective;
use crate::error::{CommError, Result};
use crate::store::Scoped;
use crate::trace::Span;
use crate::units::human_bytes;

/// One communicator's window on the registered buffers of its ranks, all on this host.
pub struct Window {
    rank: usize,
    /// Every rank's board, by rank; the first rank's holds the barrier.
    boards: Vec<Board>,
    /// Every rank's pid, and the token stamped in its pool's segments.
    pids: Vec<libc::pid_t>,
    tokens: Vec<u64>,
    /// `--copy registered`: a buffer that does not fit in /dev/shm is an error, not a `Vec`, and
    /// every call that can takes the window (under `--copy auto`, from [`registered_from`]).
    required: bool,
    /// The calls made so far; held for the whole of a call, which keeps calls in order.
    calls: Mutex<u64>,
    /// Peers' pool segments mapped so far, by (rank, descriptor): their serial and mapping.
    segments: Mutex<HashMap<(usize, i32), (u32, Segment)>>,
    /// The mappings the boards point into; dropped after them.
    _own: Held,
    _peers: Vec<Segment>,
}

/// A window and how this rank waits on it: what a transport hands the algorithms.
pub struct HostWindow<'a> {
    window: &'a Window,
    waiter: Waiter<'a>,
    /// This rank's rings from its peers, where a message waiting at a barrier is a peer in
    /// another call.
    inbox: &'a Arming,
}

/// Under `--copy auto`, the size (nccl-tests': the larger buffer, in bytes) from which a call of
/// `collective` goes on registered buffers; smaller calls take the rings, whose messages cost
/// less than two barriers. Measured on the 2-core VM, each path's best of four rounds on a quiet
/// machine (`comm-bench -c all_reduce,all_gather,broadcast,reduce_scatter --world-sizes 2,3,4
/// -b 1K -e 2M -f 2 -n 200 -w 20`, `--copy registered` against `--copy ring`; the table in
/// docs/src/transports.md): on 2 ranks registered buffers won all_gather and all_reduce from 8
/// KiB, reduce_scatter and broadcast from 16 KiB; on 3 and 4 ranks (more ranks than cores, where
/// every wake-up counts) the first three from 1 to 8 KiB, and broadcast, where the rings' tree
/// lets most ranks wait for one message, only from 128 or 256 KiB. Broadcast's 64 KiB splits
/// the difference.
pub fn registered_from(collective: Collective) -> usize {
    match collective {
        Collective::AllReduce | Collective::AllGather => 8 << 10,
        Collective::ReduceScatter => 16 << 10,
        Collective::Broadcast => 64 << 10,
        Collective::Reduce
        | Collective::SendRecv
        | Collective::AllToAll
        | Collective::Gather
        | Collective::Scatter => 0,
    }
}

impl Window {
    /// Sets up the window of `rank` among `n` ranks, all on this host, over `scope`: `Ok(Err)`
    /// with the reason where some rank could not map a peer's board (every rank then knows it);
    /// `required` (`--copy registered`) makes a buffer that does not fit an error; `refuse`
    /// fails this rank's check (a test's stand-in for a host that forbids it).
    pub(crate) fn connect(
        scope: &Scoped,
        rank: usize,
        n: usize,
        required: bool,
        refuse: bool,
    ) -> Result<std::result::Result<Window, String>> {
        let scope = scope.scoped("window");
        let token = random_token();
        let own = Held::create(rank, BOARD_BYTES, HugePages::None);
        let published = match &own {
            Ok(held) => {
                // SAFETY: a fresh zeroed mapping of BOARD_BYTES only this process knows yet.
                unsafe { Board::format(held.base(), token) };
                let pid = std::process::id();
                format!("{pid} {} {token} {}", held.fd(), pool::token())
            }
            Err(e) => format!("-{e}"),
        };
        scope.set_at("board", rank, published.as_bytes())?;
        let mut peers = Vec::new();
        let (mut boards, mut pids, mut tokens) = (Vec::new(), Vec::new(), Vec::new());
        let mut why = own.as_ref().err().map(|e| format!("rank {rank}: {e}"));
        for (peer, value) in scope.get_at("board", 0..n)?.into_iter().enumerate() {
            let value = String::from_utf8_lossy(&value).into_owned();
            match open_board(peer, rank, &value, own.as_ref().ok(), refuse) {
                Ok((board, pid, pool_token, mapping)) => {
                    boards.push(board);
                    pids.push(pid);
                    tokens.push(pool_token);
                    peers.extend(mapping);
                }
                Err(e) => why = why.or(Some(e)),
            }
        }
        let ours = why.clone().unwrap_or_else(|| "yes".into());
        scope.set_at("mapped", rank, ours.as_bytes())?;
        let answers = scope.get_at("mapped", 0..n)?;
        let refusal = answers
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .find(|a| a != "yes");
        Ok(match (refusal, own) {
            (None, Ok(own)) => Ok(Window {
                rank,
                required,
                boards,
                pids,
                tokens,
                calls: Mutex::new(0),
                segments: Mutex::new(HashMap::new()),
                _own: own,
                _peers: peers,
            }),
            (refusal, _) => Err(refusal.or(why).unwrap_or_default()),
        })
    }

    /// The window with this rank's waiter and inbox.
    pub(crate) fn with<'a>(&'a self, waiter: Waiter<'a>, inbox: &'a Arming) -> HostWindow<'a> {
        HostWindow {
            window: self,
            waiter,
            inbox,
        }
    }

    /// Rank `peer`'s latest call, where it waits at a barrier of the window that this rank
    /// has not reached: seen by a rank on the rings, a call it is not in.
    pub(crate) fn ahead(&self, peer: usize) -> Option<Signature> {
        let theirs = self.boards[peer].progress().load(Ordering::Acquire);
        let ours = self.boards[self.rank].progress().load(Ordering::Relaxed);
        if theirs <= ours {
            return None;
        }
        // Its post was written before its barrier count (release), and stays until its next
        // call, which cannot start without this rank.
        let board = self.boards[peer];
        let latest = [board.read_post(0), board.read_post(1)]
            .into_iter()
            .max_by_key(|p| p.call)?;
        Some(latest.signature)
    }

    /// The error for rank `peer` seen in call `theirs` on registered buffers while rank `rank`
    /// was `doing` it through the rings.
    pub(crate) fn ahead_error(&self, peer: usize, theirs: Signature, doing: &str) -> CommError {
        let rank = self.rank;
        CommError::Peer(format!(
            "rank {peer} called {} on registered buffers while rank {rank} was {doing} it in a \
             call through the rings: {}",
            theirs.words(),
            self.split_calls(theirs.collective())
        ))
    }

    /// Why ranks can be in calls of two kinds at once, one of them `collective` on registered
    /// buffers.
    fn split_calls(&self, collective: Option<Collective>) -> String {
        let sizes = match (self.required, collective) {
            (false, Some(c)) => format!(
                "{c} calls of {} ({} bytes{}) or more go on registered buffers, smaller ones \
                 through the rings; ",
                human_bytes(registered_from(c) as f64),
                registered_from(c),
                match c {
                    Collective::ReduceScatter => " of input",
                    _ => "",
                },
            ),
            _ => String::new(),
        };
        format!(
            "the ranks disagree on buffer sizes or made different calls ({sizes}pass the same \
             length, dtype and root on every rank, in the same calls)"
        )
    }
}

/// Rank `peer`'s board from its published "pid fd token pool-token" (ours is `own`'s
/// mapping), its pid and pool token, and the mapping to keep (none for ours).
fn open_board(
    peer: usize,
    rank: usize,
    published: &str,
    own: Option<&Held>,
    refuse: bool,
) -> std::result::Result<(Board, libc::pid_t, u64, Option<Segment>), String> {
    let words: Vec<&str> = published.split(' ').collect();
    let parsed = match words[..] {
        [pid, fd, token, pool_token] => (|| {
            Some((
                pid.parse().ok()?,
                fd.parse().ok()?,
                token.parse().ok()?,
                pool_token.parse().ok()?,
            ))
        })(),
        _ => None,
    };
    let Some((pid, fd, token, pool_token)) = parsed else {
        let why = published.strip_prefix('-').unwrap_or(published);
        return Err(format!("rank {peer} has no board: {why}"));
    };
    if peer == rank {
        let own = own.expect("this rank published a board");
        // SAFETY: our own board's mapping, BOARD_BYTES long, kept in the window.
        let board = unsafe { Board::check(own.base(), token) }.expect("our own board");
        return Ok((board, pid, pool_token, None));
    }
    if refuse {
        return Err(format!(
            "rank {rank} cannot open rank {peer}'s buffers: refused (a test's stand-in for a \
             host that forbids it)"
        ));
    }
    let cannot = |e: String| format!("rank {rank} cannot open rank {peer}'s buffers: {e}");
    let mapping = Segment::open_held(pid, fd, BOARD_BYTES, true)
        .map_err(|e| cannot(format!("/proc/{pid}/fd/{fd}: {e}")))?;
    // SAFETY: the mapping is at least BOARD_BYTES long, read and write, kept in the window.
    let board = unsafe { Board::check(mapping.base(), token) }
        .ok_or_else(|| cannot("its board is not the one it published".into()))?;
    Ok((board, pid, pool_token, Some(mapping)))
}

/// One call on registered buffers, under way: the peers' buffers as this rank reads them.
struct OpenCall<'c> {
    window: &'c HostWindow<'c>,
    /// Holds the window's calls in order while this one runs.
    _calls: MutexGuard<'c, u64>,
    /// The call, as every rank posted it.
    signature: Signature,
    /// Per rank: where its input (its send buffer, or in place its buffer) and its output lie
    /// in this process (null for this rank: the algorithm has its own slices).
    inputs: Vec<(*const u8, usize)>,
    outputs: Vec<(*const u8, usize)>,
    /// Per rank: whether it called in place.
    in_place: Vec<bool>,
}

impl WindowOnHost for HostWindow<'_> {
    fn allocate(&self, bytes: usize) -> Result<Option<Region>> {
        match pool::allocate(self.rank(), bytes) {
            Ok(region) => Ok(Some(region)),
            Err(e) if self.window.required => Err(e),
            Err(e) => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    eprintln!(
                        "warning: rank {}: {e}; this buffer goes on the heap and its \
                         collectives through the rings (--copy registered makes this an error)",
                        self.rank()
                    )
                });
                Ok(None)
            }
        }
    }

    fn registered_from(&self, collective: Collective) -> usize {
        match self.window.required {
            true => 0,
            false => registered_from(collective),
        }
    }

    fn open<'c>(
        &'c self,
        signature: Signature,
        send: Option<&[u8]>,
        recv: &[u8],
    ) -> Result<Option<Box<dyn WindowCall + 'c>>> {
        let call = self.open_call(signature, send, recv)?;
        Ok(call.map(|c| Box::new(c) as Box<dyn WindowCall + 'c>))
    }
}

impl HostWindow<'_> {
    fn rank(&self) -> usize {
        self.window.rank
    }

    fn n(&self) -> usize {
        self.window.boards.len()
    }

    /// [`WindowOnHost::open`]: posts, meets the others, compares the posts and maps the peers'
    /// buffers.
    fn open_call<'c>(
        &'c self,
        signature: Signature,
        send: Option<&[u8]>,
        recv: &[u8],
    ) -> Result<Option<OpenCall<'c>>> {
        let from = signature
            .collective()
            .map_or(0, |c| self.registered_from(c));
        if signature.size(self.n()) < from {
            return Ok(None);
        }
        let mut calls = self.window.calls.lock().unwrap_or_else(|e| e.into_inner());
        *calls += 1;
        let (send_at, recv_at) = (send.map(pool::locate), pool::locate(recv));
        let post = Post {
            call: *calls,
            signature,
            registered: u32::from(send_at.is_none_or(|s| s.is_some()) && recv_at.is_some()),
            in_place: u32::from(send.is_none()),
            send: send_at.flatten().unwrap_or_default(),
            recv: recv_at.unwrap_or_default(),
        };
        self.window.boards[self.rank()].write_post(&post);
        self.barrier(signature)?;
        let posts: Vec<Post> = (0..self.n())
            .map(|r| self.window.boards[r].read_post(post.call))
            .collect();
        for (peer, theirs) in posts.iter().enumerate() {
            if theirs.call != post.call || theirs.signature != signature {
                return Err(self.waiter.ctx.fail(different_calls(
                    peer,
                    theirs,
                    self.rank(),
                    &post,
                )));
            }
        }
        if posts.iter().any(|p| p.registered == 0) {
            return Ok(None);
        }
        let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
        for (peer, theirs) in posts.iter().enumerate() {
            if peer == self.rank() {
                inputs.push((std::ptr::null(), 0));
                outputs.push((std::ptr::null(), 0));
                continue;
            }
            let output = self.map(peer, &theirs.recv)?;
            let input = match theirs.in_place {
                1 => output,
                _ => self.map(peer, &theirs.send)?,
            };
            inputs.push(input);
            outputs.push(output);
        }
        Ok(Some(OpenCall {
            window: self,
            _calls: calls,
            signature,
            inputs,
            outputs,
            in_place: posts.iter().map(|p| p.in_place == 1).collect(),
        }))
    }

    /// Where rank `peer`'s bytes at `location` lie in this process, its segment mapped (read
    /// only) the first time.
    fn map(&self, peer: usize, location: &Location) -> Result<(*const u8, usize)> {
        let len = location.len as usize;
        if len == 0 {
            return Ok((std::ptr::NonNull::<u64>::dangling().as_ptr().cast(), 0));
        }
        let mut segments = self
            .window
            .segments
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let key = (peer, location.fd);
        let end = location.offset as usize + len;
        let known = segments
            .get(&key)
            .is_some_and(|(serial, s)| *serial == location.serial && s.len() >= end);
        if !known {
            let pid = self.window.pids[peer];
            let rank = self.rank();
            let cannot = |e: String| {
                CommError::Backend(format!(
                    "rank {rank} cannot map rank {peer}'s registered buffer (/proc/{pid}/fd/{}): {e}",
                    location.fd
                ))
            };
            let segment = Segment::open_held(pid, location.fd, end, false)
                .map_err(|e| self.waiter.ctx.fail(cannot(e.to_string())))?;
            // SAFETY: the mapping holds at least `end` bytes, beyond the header page.
            if !unsafe { pool::is_segment(segment.base(), self.window.tokens[peer], location) } {
                let e = cannot("it is not the segment the rank posted".into());
                return Err(self.waiter.ctx.fail(e));
            }
            segments.insert(key, (location.serial, segment));
        }
        let base = segments[&key].1.base();
        // SAFETY: offset + len lies within the mapping (checked above).
        Ok((unsafe { base.add(location.offset as usize) }, len))
    }

    /// Waits until every rank of the window has arrived here.
    fn barrier(&self, call: Signature) -> Result<()> {
        // A "fence": drawn inside the call, as its messages would be, not as a call of its own.
        let _span = Span::slice("fence", "wait for every rank");
        let first = self.window.boards[0];
        let bell = first.bell();
        let generation = bell.seen();
        let own = self.window.boards[self.rank()].progress();
        let passed = own.load(Ordering::Relaxed);
        // Release: a peer on the rings that sees it ahead reads this rank's post (`ahead`).
        own.store(passed + 1, Ordering::Release);
        if first.arrive(self.n()) {
            bell.ring();
            return Ok(());
        }
        let deadline = self.waiter.ctx.deadline();
        let peers: Vec<(usize, &'static str)> = (0..self.n())
            .filter(|&r| r != self.rank())
            .map(|r| (r, "waiting for"))
            .collect();
        let timed_out = || {
            let missing: Vec<usize> = (0..self.n())
                .filter(|&r| self.window.boards[r].progress().load(Ordering::Relaxed) <= passed)
                .collect();
            let what = format!(
                "{} {} at a barrier of rank {}'s call on registered buffers",
                if missing.len() == 1 { "rank" } else { "ranks" },
                crate::error::rank_list(missing.iter().copied()),
                self.rank()
            );
            self.waiter.timeout(what, missing)
        };
        let moved = || bell.seen() != generation;
        let astray = || {
            let (peer, bytes) = self.inbox.message_waiting()?;
            Some(CommError::Peer(format!(
                "rank {peer} sent rank {rank} a message of {bytes} bytes through the rings while \
                 rank {rank} waited at a barrier of its {} on registered buffers: {}",
                call.words(),
                self.window.split_calls(call.collective()),
                rank = self.rank()
            )))
        };
        self.waiter
            .wait(bell, deadline, moved, &peers, astray, timed_out)
    }
}

/// The error for rank `peer`'s post `theirs`, which is not this call.
fn different_calls(peer: usize, theirs: &Post, rank: usize, ours: &Post) -> CommError {
    let (t, o) = (theirs.signature, ours.signature);
    if theirs.call != ours.call {
        return CommError::Peer(format!(
            "rank {peer} posted its call number {} on registered buffers where rank {rank} posted \
             its number {} (only calls on registered buffers are counted): the ranks made \
             different calls (every rank must make the same calls in the same order)",
            theirs.call, ours.call
        ));
    }
    let why = match t.sizes_differ(&o) {
        true => "the ranks disagree on buffer sizes (pass the same length, dtype and root on every rank)",
        false => "every rank must make the same calls in the same order, with the same lengths, dtype and root",
    };
    CommError::Peer(format!(
        "rank {peer} called {} where rank {rank} called {}: {why}",
        t.words(),
        o.words()
    ))
}

impl WindowCall for OpenCall<'_> {
    fn input(&self, peer: usize) -> &[u8] {
        let (at, len) = self.inputs[peer];
        assert!(
            !at.is_null(),
            "rank {peer} reads its own input where it lies"
        );
        // SAFETY: a live read-only mapping of the peer's buffer, kept while the window lives;
        // the call's phases keep everyone from writing what is read in the same phase.
        unsafe { std::slice::from_raw_parts(at, len) }
    }

    fn output(&self, peer: usize) -> &[u8] {
        let (at, len) = self.outputs[peer];
        assert!(
            !at.is_null(),
            "rank {peer} reads its own output where it lies"
        );
        // SAFETY: as `input`.
        unsafe { std::slice::from_raw_parts(at, len) }
    }

    fn in_place(&self, peer: usize) -> bool {
        self.in_place[peer]
    }

    fn fence(&self) -> Result<()> {
        self.window.barrier(self.signature)
    }

    fn close(self: Box<Self>) -> Result<()> {
        self.window.barrier(self.signature)
    }
}
