//! What a rank records for its trace, and the file it writes: events kept in memory as cheaply
//! as they can be (slices, arrows, names), the clock set against rank 0's, each rank's part
//! written and rank 0 merging them (see the module above for the whole story).

use std::borrow::Cow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::error::{CommError, Result};
use crate::store::Scoped;

/// The most events a rank keeps (about 100 MB of JSON at most).
pub const MAX_EVENTS: usize = 1 << 20;

static ON: AtomicBool = AtomicBool::new(false);
static RANK: AtomicUsize = AtomicUsize::new(0);
/// Nanoseconds to add to this host's clock to read rank 0's.
static OFFSET_NS: AtomicI64 = AtomicI64::new(0);
/// Half the round trip the offset was measured over: how far it can be off.
static OFFSET_BOUND_NS: AtomicI64 = AtomicI64::new(0);
static DROPPED: AtomicUsize = AtomicUsize::new(0);
static THREADS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's track in its rank's process: slices of one thread nest, as viewers want.
    static TRACK: usize = THREADS.fetch_add(1, Ordering::Relaxed);
}

/// This rank and this thread's track: `pid` and `tid`.
fn place() -> (usize, usize) {
    (RANK.load(Ordering::Relaxed), TRACK.with(|t| *t))
}

/// Whether this process records a trace.
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Now on rank 0's clock, in microseconds since the Unix epoch.
pub fn now() -> f64 {
    (local_ns() + OFFSET_NS.load(Ordering::Relaxed)) as f64 / 1000.0
}

fn local_ns() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    since.as_nanos() as i64
}

/// What a slice carries besides its name: the few facts the project records, kept as numbers
/// until the file is written (a JSON object per event would cost microseconds a call).
#[derive(Debug, Clone, Copy, Default)]
pub struct Args {
    /// Bytes the slice moved, reduced or copied.
    pub bytes: Option<usize>,
    /// The peer a message went to.
    pub to: Option<usize>,
    /// The peer a message came from.
    pub from: Option<usize>,
    /// A call's placement: in-place or out-of-place.
    pub placement: Option<&'static str>,
    /// How far a GPU slice's start can be off the host clock, µs.
    pub anchor_within_us: Option<f64>,
    /// How precise a GPU slice's start (from its anchor) and duration are, µs: CUDA's event
    /// timer, in float milliseconds.
    pub precision_us: Option<f64>,
}

impl Args {
    /// Only a byte count.
    pub fn bytes(bytes: usize) -> Args {
        Args {
            bytes: Some(bytes),
            ..Args::default()
        }
    }

    fn to_json(self) -> Value {
        let mut args = serde_json::Map::new();
        let mut put = |key: &str, value: Option<Value>| {
            if let Some(value) = value {
                args.insert(key.into(), value);
            }
        };
        put("bytes", self.bytes.map(Value::from));
        put("to", self.to.map(Value::from));
        put("from", self.from.map(Value::from));
        put("placement", self.placement.map(Value::from));
        put("anchor_within_us", self.anchor_within_us.map(Value::from));
        put("precision_us", self.precision_us.map(Value::from));
        Value::Object(args)
    }
}

/// One recorded event, as cheap to keep as it can be; JSON only when the part is written.
enum Event {
    /// A slice (`ph: X`) on track `tid` of process `pid`.
    Slice {
        cat: &'static str,
        name: Cow<'static, str>,
        ts: f64,
        dur: f64,
        pid: usize,
        tid: usize,
        args: Args,
    },
    /// One end of a message's arrow: the start on the sender, the end on the receiver.
    Arrow {
        start: bool,
        from: usize,
        to: usize,
        seq: u64,
        /// The split's group whose ranks `from` and `to` are, if not the job's.
        group: Option<std::sync::Arc<str>>,
        ts: f64,
        pid: usize,
        tid: usize,
    },
    /// Metadata (names of processes and tracks): a few per rank.
    Meta(Value),
}

impl Event {
    fn to_json(&self) -> Value {
        match self {
            Event::Slice {
                cat,
                name,
                ts,
                dur,
                pid,
                tid,
                args,
            } => json!({"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid,
                        "tid": tid, "args": args.to_json()}),
            Event::Arrow {
                start,
                from,
                to,
                seq,
                group,
                ts,
                pid,
                tid,
            } => {
                let ph = if *start { "s" } else { "f" };
                let id = match group {
                    Some(group) => format!("{group}:{from}>{to}#{seq}"),
                    None => format!("{from}>{to}#{seq}"),
                };
                let mut event = json!({"name": "message", "cat": "message", "ph": ph, "ts": ts,
                                       "pid": pid, "tid": tid, "id": id});
                if !start {
                    event["bp"] = json!("e"); // the arrow ends at the enclosing slice
                }
                event
            }
            Event::Meta(value) => value.clone(),
        }
    }
}

static EVENTS: Mutex<Vec<Event>> = Mutex::new(Vec::new());

fn record(event: Event) {
    let mut events = EVENTS.lock().unwrap_or_else(|e| e.into_inner());
    if events.len() < MAX_EVENTS {
        events.push(event);
    } else {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}

/// A slice on this thread's track, from `start` (see [`now`]) to now: what a
/// [`Span`](super::Span) records as it ends. Code marks a stretch of work with a `Span`.
pub(super) fn slice(cat: &'static str, name: impl Into<Cow<'static, str>>, start: f64, args: Args) {
    let (pid, tid) = place();
    let dur = (now() - start).max(0.0);
    let name = name.into();
    record(Event::Slice {
        cat,
        name,
        ts: start,
        dur,
        pid,
        tid,
        args,
    });
}

/// Names this thread's track (`thread_name` metadata), as Perfetto and `comm-bench timeline`
/// label it: a rank's threads other than its main one say what they are ("comm thread").
pub fn name_track(name: &str) {
    if !on() {
        return;
    }
    let (pid, tid) = place();
    record(Event::Meta(
        json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}),
    ));
}

/// The track of a rank's GPU stream: its slices are the GPU's times, not a host thread's.
const GPU_TRACK: usize = 1000;
static GPU_TRACK_NAMED: AtomicBool = AtomicBool::new(false);

/// A slice on this rank's GPU track, `dur` microseconds from `start` (rank 0's clock, as
/// [`now`]): a kernel as CUDA events timed it.
pub fn gpu_slice(name: String, start: f64, dur: f64, args: Args) {
    let pid = RANK.load(Ordering::Relaxed);
    if !GPU_TRACK_NAMED.swap(true, Ordering::Relaxed) {
        record(Event::Meta(
            json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": GPU_TRACK,
                   "args": {"name": "GPU stream (CUDA events)"}}),
        ));
    }
    record(Event::Slice {
        cat: "gpu",
        name: name.into(),
        ts: start,
        dur: dur.max(0.0),
        pid,
        tid: GPU_TRACK,
        args,
    });
}

/// The start (`ph: s`, on the sender at `ts`) or end (`ph: f`, on the receiver) of the arrow of
/// message `seq` from rank `from` to rank `to` (`message`), ranks of the split's `group` if
/// given, else of the job.
pub fn arrow(
    start: bool,
    message: (usize, usize, u64),
    group: Option<std::sync::Arc<str>>,
    ts: f64,
) {
    let (pid, tid) = place();
    let (from, to, seq) = message;
    record(Event::Arrow {
        start,
        from,
        to,
        seq,
        group,
        ts,
        pid,
        tid,
    });
}

/// Starts recording for `rank`, its clock set against rank 0's through the store in `scope`
/// (every rank of the job calls it, in the same order as the other store calls).
pub fn start(scope: &Scoped, rank: usize, world_size: usize) -> Result<()> {
    RANK.store(rank, Ordering::Relaxed);
    align_clock(scope, rank, world_size)?;
    record(Event::Meta(
        json!({"name": "process_name", "ph": "M", "pid": rank,
                              "args": {"name": format!("rank {rank}")}}),
    ));
    record(Event::Meta(
        json!({"name": "process_sort_index", "ph": "M", "pid": rank,
                              "args": {"sort_index": rank}}),
    ));
    ON.store(true, Ordering::Relaxed);
    Ok(())
}

/// Cristian's algorithm through the store: rank 0 answers each rank's ping with its clock.
fn align_clock(scope: &Scoped, rank: usize, world_size: usize) -> Result<()> {
    let clock = scope.scoped("clock");
    if rank == 0 {
        for peer in 1..world_size {
            clock.get(&format!("ping/{peer}"))?;
            let answer = format!("{} {}", local_ns(), crate::host::hostname());
            clock.set_at("pong", peer, answer.as_bytes())?;
        }
        return Ok(());
    }
    let t1 = local_ns();
    clock.set_at("ping", rank, b"")?;
    let answer = clock.get(&format!("pong/{rank}"))?;
    let t2 = local_ns();
    let answer = String::from_utf8_lossy(&answer);
    let (theirs, host) = answer.split_once(' ').unwrap_or((&answer, ""));
    let theirs: i64 = theirs
        .parse()
        .map_err(|_| CommError::Peer(format!("rank 0 answered the clock with {answer:?}")))?;
    if host == crate::host::hostname() {
        return Ok(()); // one host, one clock: exact
    }
    OFFSET_NS.store(theirs - (t1 + t2) / 2, Ordering::Relaxed);
    OFFSET_BOUND_NS.store((t2 - t1) / 2, Ordering::Relaxed);
    Ok(())
}

/// Where rank `rank` writes its part of `file`.
fn part(file: &Path, rank: usize) -> std::path::PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(format!(".rank{rank}"));
    name.into()
}

/// Writes this rank's part of `file` (a JSON array of its events, then its notes).
pub fn write_part(file: &Path) -> Result<()> {
    let rank = RANK.load(Ordering::Relaxed);
    let events = std::mem::take(&mut *EVENTS.lock().unwrap_or_else(|e| e.into_inner()));
    let events: Vec<Value> = events.iter().map(Event::to_json).collect();
    let notes = json!({"rank": rank, "dropped_events": DROPPED.load(Ordering::Relaxed),
                       "clock_offset_us": OFFSET_NS.load(Ordering::Relaxed) as f64 / 1000.0,
                       "clock_within_us": OFFSET_BOUND_NS.load(Ordering::Relaxed) as f64 / 1000.0});
    let text = json!({"events": events, "notes": notes}).to_string();
    let path = part(file, rank);
    std::fs::write(&path, text).map_err(|e| CommError::io(format!("writing {}", path.display()), e))
}

/// Merges the `world_size` parts of `file` into it, as Chrome's JSON object format with each
/// rank's notes under `otherData`, and removes the parts.
pub fn merge(file: &Path, world_size: usize) -> Result<()> {
    let mut events = Vec::new();
    let mut notes = Vec::new();
    for rank in 0..world_size {
        let path = part(file, rank);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| CommError::io(format!("reading {}", path.display()), e))?;
        let mut part: Value = serde_json::from_str(&text)
            .map_err(|e| CommError::Peer(format!("{} is not a trace part: {e}", path.display())))?;
        if let Some(list) = part["events"].as_array_mut() {
            events.append(list);
        }
        notes.push(part["notes"].take());
        let _ = std::fs::remove_file(&path);
    }
    let trace = json!({"traceEvents": events, "displayTimeUnit": "ns",
                       "otherData": {"ranks": notes}});
    std::fs::write(file, trace.to_string())
        .map_err(|e| CommError::io(format!("writing {}", file.display()), e))
}
