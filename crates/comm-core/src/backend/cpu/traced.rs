//! A transport that puts every send and receive in the trace ([`crate::trace`]): a slice with
//! its byte count and peer, and an arrow from each message's send to its receive. Built only
//! with `--trace`, around the transport that moves the bytes, so an untraced run pays nothing.

use std::sync::atomic::{AtomicU64, Ordering};

use super::transport::{Sink, Transport};
use crate::error::Result;
use crate::trace::{self, Args, Span};

/// `inner`, traced.
pub struct Traced {
    inner: Box<dyn Transport>,
    /// Messages sent to each peer, and received from each: a message's number on both sides
    /// (each pair's messages arrive in order), which names its arrow.
    sent: Vec<AtomicU64>,
    received: Vec<AtomicU64>,
}

impl Traced {
    /// Traces `inner`'s messages.
    pub fn new(inner: Box<dyn Transport>) -> Traced {
        let n = inner.world_size();
        Traced {
            inner,
            sent: (0..n).map(|_| AtomicU64::new(0)).collect(),
            received: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Starts the arrow of the next message to `to`, where `span` (the send's slice) starts.
    fn sending(&self, to: usize, span: &Span) {
        let seq = self.sent[to].fetch_add(1, Ordering::Relaxed);
        let ts = span.start().unwrap_or_else(trace::now);
        trace::arrow(true, self.rank(), to, seq, ts);
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
        let span = Span::slice("sendrecv", name).with_args(args);
        self.sending(to, &span);
        let done = exchange();
        drop(span);
        self.received(from, trace::now());
        done
    }

    /// Ends the arrow of the next message from `from`.
    fn received(&self, from: usize, ts: f64) {
        let seq = self.received[from].fetch_add(1, Ordering::Relaxed);
        trace::arrow(false, from, self.rank(), seq, ts);
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
        let span = Span::slice("send", format!("send to {peer}")).with_args(args);
        self.sending(peer, &span);
        self.inner.send(peer, data)
    }

    fn recv(&self, peer: usize, out: &mut [u8]) -> Result<()> {
        let args = Args {
            from: Some(peer),
            ..Args::bytes(out.len())
        };
        let span = Span::slice("recv", format!("receive from {peer}")).with_args(args);
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
}
