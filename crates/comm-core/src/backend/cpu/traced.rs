//! A transport that puts every send and receive in the trace ([`crate::trace`]): a slice with
//! its byte count and peer, and an arrow from each message's send to its receive. Built only
//! with `--trace`, around the transport that moves the bytes, so an untraced run pays nothing.
//! A split's group (`tp 0`) puts its name before its slices' and in its arrows' ids, whose rank
//! numbers are the group's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::transport::{Sink, Transport, Window};
use crate::error::Result;
use crate::trace::{self, Args, Span};

/// `inner`, traced.
pub struct Traced {
    inner: Box<dyn Transport>,
    /// Messages sent to each peer, and received from each: a message's number on both sides
    /// (each pair's messages arrive in order), which names its arrow.
    sent: Vec<AtomicU64>,
    received: Vec<AtomicU64>,
    /// The split's group these links belong to, if any.
    group: Option<Arc<str>>,
}

impl Traced {
    /// Traces `inner`'s messages, those of the group named `group` if it is a split's.
    pub fn new(inner: Box<dyn Transport>, group: Option<&str>) -> Traced {
        let n = inner.world_size();
        Traced {
            inner,
            sent: (0..n).map(|_| AtomicU64::new(0)).collect(),
            received: (0..n).map(|_| AtomicU64::new(0)).collect(),
            group: group.map(Arc::from),
        }
    }

    /// A slice's name: `what`, after the group's name in a group (`tp 0: send to 1`).
    fn named(&self, what: String) -> String {
        match &self.group {
            Some(group) => format!("{group}: {what}"),
            None => what,
        }
    }

    /// Starts the arrow of the next message to `to`, where `span` (the send's slice) starts.
    fn sending(&self, to: usize, span: &Span) {
        let seq = self.sent[to].fetch_add(1, Ordering::Relaxed);
        let ts = span.start().unwrap_or_else(trace::now);
        trace::arrow(true, (self.rank(), to, seq), self.group.clone(), ts);
    }

    /// `exchange` (sending `bytes` to `to` while receiving from `from`) as one `sendrecv` slice,
    /// with this rank's ends of both arrows.
    fn exchange(
        &self,
        to: usize,
        bytes: usize,
        from: usize,
        name: String,
        exchange: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let args = Args {
            to: Some(to),
            from: Some(from),
            ..Args::bytes(bytes)
        };
        let span = Span::slice("sendrecv", self.named(name)).with_args(args);
        self.sending(to, &span);
        let done = exchange();
        drop(span);
        self.received(from, trace::now());
        done
    }

    /// Ends the arrow of the next message from `from`.
    fn received(&self, from: usize, ts: f64) {
        let seq = self.received[from].fetch_add(1, Ordering::Relaxed);
        trace::arrow(false, (from, self.rank(), seq), self.group.clone(), ts);
    }
}

impl Transport for Traced {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        let args = Args {
            to: Some(peer),
            ..Args::bytes(data.len())
        };
        let name = self.named(format!("send to {peer}"));
        let span = Span::slice("send", name).with_args(args);
        self.sending(peer, &span);
        self.inner.send(peer, data)
    }

    fn recv(&self, peer: usize, out: &mut [u8]) -> Result<()> {
        let args = Args {
            from: Some(peer),
            ..Args::bytes(out.len())
        };
        let name = self.named(format!("receive from {peer}"));
        let span = Span::slice("recv", name).with_args(args);
        let received = self.inner.recv(peer, out);
        drop(span);
        self.received(peer, trace::now());
        received
    }

    fn send_recv(&self, to: usize, data: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        let name = format!("send to {to}, receive from {from}");
        self.exchange(to, data.len(), from, name, || {
            self.inner.send_recv(to, data, from, out)
        })
    }

    fn send_recv_with(
        &self,
        to: usize,
        data: &[u8],
        from: usize,
        len: usize,
        sink: Sink<'_>,
    ) -> Result<()> {
        let name = format!("send to {to}, receive and reduce from {from}");
        self.exchange(to, data.len(), from, name, || {
            self.inner.send_recv_with(to, data, from, len, sink)
        })
    }

    fn begin_call(&self) -> bool {
        self.inner.begin_call()
    }

    fn end_call(&self) {
        self.inner.end_call()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    /// The window's calls send no messages: they show as their own slices (reads, reductions,
    /// barriers), which the registered algorithms record.
    fn window(&self) -> Option<Box<dyn Window + '_>> {
        self.inner.window()
    }
}
