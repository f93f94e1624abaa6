//! Asynchronous collectives: start one, go on working, wait for it later, as PyTorch's
//! `dist.all_reduce(t, async_op=True)` returns a `Work` to `wait()` on. DDP lives on this: each
//! bucket of gradients is all-reduced while backward still computes the next one.
//!
//! How: a communication thread owns the [`Communicator`] (it is `Send`: a CPU transport is
//! `Send + Sync`, the NCCL backend's handles are sent with it) and runs what it is given, in
//! order, one call at a time; [`AsyncComm`] feeds it through a crossbeam channel, and each call
//! answers on a channel of its own, which its [`Work`] waits on. Every rank must start the same
//! calls in the same order, as with blocking collectives: the thread keeps that order.
//!
//! The values travel by value: a call takes a `Vec` and its `Work` gives the result back. On the
//! CPU backend the thread copies them into a buffer and out again; on NCCL that copy is the
//! upload to the GPU and the download (host compute, device reduction). With `--trace`, the
//! thread's slices are on a track of their own, named `comm thread`, under the rank's process.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};

use crate::comm::Communicator;
use crate::dtype::{Element, ReduceOp};
use crate::error::{CommError, Result};

/// What the thread runs: one call on its communicator; whether it succeeded.
type Request = Box<dyn FnOnce(&Communicator) -> bool + Send>;

/// A communicator driven by a thread of its own: every call returns at once with a [`Work`].
pub struct AsyncComm {
    requests: Option<Sender<Request>>,
    thread: Option<JoinHandle<Communicator>>,
    rank: usize,
    world_size: usize,
}

/// A collective started by an [`AsyncComm`]: [`wait`](Work::wait) for its result, as torch's
/// `Work.wait()`; [`is_completed`](Work::is_completed) asks without waiting.
#[must_use = "a started collective's result is only read by waiting on its Work"]
pub struct Work<R> {
    answer: Receiver<Result<R>>,
    ready: Option<Result<R>>,
    what: String,
}

impl<R> Work<R> {
    /// Whether the call has finished (its result is kept for [`wait`](Self::wait)).
    pub fn is_completed(&mut self) -> bool {
        if self.ready.is_none() {
            self.ready = self.answer.try_recv().ok();
        }
        self.ready.is_some()
    }

    /// Blocks until the call has finished; its result.
    pub fn wait(self) -> Result<R> {
        self.wait_timed().0
    }

    /// [`wait`](Self::wait), and how long this thread was blocked: the time communication
    /// was not hidden behind work.
    pub fn wait_timed(mut self) -> (Result<R>, Duration) {
        let start = Instant::now();
        let result = match self.ready.take() {
            Some(done) => done,
            None => self.answer.recv().unwrap_or_else(|_| {
                Err(CommError::Peer(format!(
                    "{}: the communication thread ended before answering (it panicked or an \
                     earlier call failed it)",
                    self.what
                )))
            }),
        };
        (result, start.elapsed())
    }
}

/// The communication thread's name, and its track's in a trace.
pub const THREAD_NAME: &str = "comm thread";

impl AsyncComm {
    /// Hands `comm` to a new communication thread.
    pub fn start(comm: Communicator) -> Result<AsyncComm> {
        let (rank, world_size) = (comm.rank(), comm.world_size());
        let (requests, inbox) = unbounded::<Request>();
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || {
                // A split's group names its thread's track: `comm thread (dp 0)`.
                match comm.group_name() {
                    Some(group) => crate::trace::name_track(&format!("{THREAD_NAME} ({group})")),
                    None => crate::trace::name_track(THREAD_NAME),
                }
                // After a failed call the communicator is not trusted again (a peer may be gone):
                // later calls are dropped unrun, and their Works say so.
                let mut ok = true;
                if let Err(e) = comm.bind_to_thread() {
                    eprintln!("error: rank {rank}: {e}");
                    ok = false;
                }
                for request in inbox {
                    if ok {
                        ok = request(&comm);
                    }
                }
                comm
            })
            .map_err(|e| CommError::io("cannot start the communication thread", e))?;
        Ok(AsyncComm {
            requests: Some(requests),
            thread: Some(thread),
            rank,
            world_size,
        })
    }

    /// This rank's number.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Starts `call` on the thread; `what` names it in errors and, with `--trace`, in a slice
    /// (category `async`) around the call on the thread's track.
    pub fn submit<R: Send + 'static>(
        &self,
        what: impl Into<String>,
        call: impl FnOnce(&Communicator) -> Result<R> + Send + 'static,
    ) -> Work<R> {
        let what = what.into();
        let (reply, answer) = bounded(1);
        let name = what.clone();
        let request: Request = Box::new(move |comm| {
            let span = crate::trace::Span::slice("async", name);
            let result = call(comm);
            drop(span);
            let ok = result.is_ok();
            let _ = reply.send(result);
            ok
        });
        if let Some(requests) = &self.requests {
            // A send fails only once the thread is gone: the Work then says so when waited on.
            let _ = requests.send(request);
        }
        Work {
            answer,
            ready: None,
            what,
        }
    }

    /// Starts an all-reduce of `values` (copied to the device, reduced in place, copied back);
    /// the Work gives the reduced values.
    pub fn all_reduce<T: Element>(
        &self,
        what: impl Into<String>,
        values: Vec<T>,
        op: ReduceOp,
    ) -> Work<Vec<T>> {
        self.submit(what, move |comm| {
            let mut buf = comm.buffer(&values)?;
            comm.all_reduce(&mut buf, op)?;
            comm.to_host(&buf)
        })
    }

    /// Starts a broadcast of root's `values` (every rank gives as many); the Work gives the
    /// root's values.
    pub fn broadcast<T: Element>(
        &self,
        what: impl Into<String>,
        values: Vec<T>,
        root: usize,
    ) -> Work<Vec<T>> {
        self.submit(what, move |comm| {
            let mut buf = comm.buffer(&values)?;
            comm.broadcast(&mut buf, root)?;
            comm.to_host(&buf)
        })
    }

    /// Waits for every call started so far, ends the thread and gives the communicator back
    /// (to [`close`](Communicator::close) it, or use it blocking again).
    pub fn finish(mut self) -> Result<Communicator> {
        self.requests = None; // the thread's loop ends once the channel is empty
        let thread = self.thread.take().expect("finish runs once");
        thread.join().map_err(|_| {
            CommError::Peer("the communication thread panicked; see the message above".into())
        })
    }
}

impl Drop for AsyncComm {
    /// Dropped without [`finish`](AsyncComm::finish) (an error on the way): the thread ends
    /// after the calls already given, and the communicator with it.
    fn drop(&mut self) {
        self.requests = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_send<T: Send>() {}

    /// The communicator can move to a thread of its own: the premise of this module.
    #[test]
    fn a_communicator_is_send() {
        is_send::<Communicator>();
    }
}
