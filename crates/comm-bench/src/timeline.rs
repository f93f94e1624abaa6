//! `comm-bench timeline TRACE.json -o timeline.svg`: a trace (`--trace`) drawn as a lane per
//! track of each rank (its main thread; a communication thread or GPU stream, named by the
//! trace's `thread_name`, below it) along a time axis, a box per slice coloured by kind
//! (asynchronous calls and collective calls behind, sends, receives and exchanges in front;
//! a training step's compute and waits) and an arrow from each message's send to its receive.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use crate::error::BenchError;
use crate::grids::escape;

/// One slice of a rank's lane.
#[derive(Debug, Clone, PartialEq)]
pub struct Slice {
    pub rank: usize,
    /// The thread's track within the rank (`tid`).
    pub track: usize,
    pub kind: String,
    pub name: String,
    pub start: f64,
    pub end: f64,
}

/// A message: from (rank, time) to (rank, time).
#[derive(Debug, Clone, PartialEq)]
pub struct Arrow {
    pub from: (usize, f64),
    pub to: (usize, f64),
    /// The tracks (`tid`) of the send and of the receive.
    pub tracks: (usize, usize),
}

/// The names of tracks (`thread_name` metadata), by (rank, track).
pub type TrackNames = HashMap<(usize, usize), String>;

/// The slices and arrows of a Chrome trace's `traceEvents`.
pub fn read(trace: &Value) -> (Vec<Slice>, Vec<Arrow>) {
    let (slices, arrows, _) = read_named(trace);
    (slices, arrows)
}

/// [`read`], and the tracks' names.
pub fn read_named(trace: &Value) -> (Vec<Slice>, Vec<Arrow>, TrackNames) {
    let events = trace["traceEvents"].as_array().cloned().unwrap_or_default();
    let mut slices = Vec::new();
    let mut names = TrackNames::new();
    let mut starts: HashMap<String, (usize, f64, usize)> = HashMap::new();
    let mut ends = Vec::new();
    for e in &events {
        let rank = e["pid"].as_u64().unwrap_or(0) as usize;
        let track = e["tid"].as_u64().unwrap_or(0) as usize;
        let ts = e["ts"].as_f64().unwrap_or(0.0);
        let id = e["id"].as_str().unwrap_or_default().to_string();
        match e["ph"].as_str() {
            Some("M") if e["name"] == "thread_name" => {
                let name = e["args"]["name"].as_str().unwrap_or_default();
                names.insert((rank, track), name.to_string());
            }
            Some("X") => slices.push(Slice {
                rank,
                track,
                kind: e["cat"].as_str().unwrap_or_default().to_string(),
                name: e["name"].as_str().unwrap_or_default().to_string(),
                start: ts,
                end: ts + e["dur"].as_f64().unwrap_or(0.0),
            }),
            Some("s") => {
                starts.insert(id, (rank, ts, track));
            }
            Some("f") => ends.push((id, (rank, ts, track))),
            _ => {}
        }
    }
    let arrows = ends
        .into_iter()
        .filter_map(|(id, (rank, ts, track))| {
            let &(from_rank, from_ts, from_track) = starts.get(&id)?;
            Some(Arrow {
                from: (from_rank, from_ts),
                to: (rank, ts),
                tracks: (from_track, track),
            })
        })
        .collect();
    (slices, arrows, names)
}

const LANE_H: f64 = 44.0;
const LEFT: f64 = 110.0;
const WIDTH: f64 = 1000.0;
// Three legend lines of 18 px above the lanes (a fourth for training traces).
const TOP: f64 = 64.0;

fn colour(kind: &str) -> &'static str {
    match kind {
        "call" => "#dde3ea",
        "barrier" | "fence" => "#9aa5b1",
        "send" => "#7fb3e6",
        "recv" => "#8fd18a",
        "sendrecv" => "#c7a4e0",
        "reduce" => "#f0a05a",
        "copy" => "#f3e27a",
        "ring" => "#fbf3c4",
        "read" => "#4fb6b0",
        "gpu" => "#76b900",
        "async" => "#f6d2b8",
        "compute" => "#c9b38f",
        "wait" => "#e8838a",
        _ => "#cccccc",
    }
}

/// The timeline of `slices` and `arrows` as SVG text.
pub fn svg(slices: &[Slice], arrows: &[Arrow]) -> String {
    svg_named(slices, arrows, &TrackNames::new())
}

/// [`svg`], each lane labelled with its track's name where the trace names it.
pub fn svg_named(slices: &[Slice], arrows: &[Arrow], names: &TrackNames) -> String {
    // A lane per (rank, track): unnamed tracks (the main thread) first, named ones below.
    let mut lanes: Vec<(usize, bool, usize)> = slices
        .iter()
        .map(|s| (s.rank, names.contains_key(&(s.rank, s.track)), s.track))
        .collect();
    lanes.sort();
    lanes.dedup();
    let lane_of = |rank: usize, track: usize| {
        let named = names.contains_key(&(rank, track));
        lanes
            .iter()
            .position(|&l| l == (rank, named, track))
            .unwrap_or(0)
    };
    let first = slices.iter().map(|s| s.start).fold(f64::INFINITY, f64::min);
    let t1 = slices
        .iter()
        .map(|s| s.end)
        .fold(f64::NEG_INFINITY, f64::max);
    let t0 = start_of_work(slices, first, t1);
    let span = (t1 - t0).max(1.0);
    // A slice that began before the picture does is drawn from its left edge.
    let x = |t: f64| LEFT + (t.max(t0) - t0) / span * (WIDTH - LEFT - 20.0);
    let kinds: Vec<&str> = slices.iter().map(|s| s.kind.as_str()).collect();
    let training = kinds
        .iter()
        .any(|k| ["async", "compute", "wait"].contains(k));
    // The legend's lines, then the lanes.
    let top = if training { TOP + 18.0 } else { TOP };
    let lane = |index: usize| top + index as f64 * LANE_H;
    let bottom = top + lanes.len() as f64 * LANE_H;
    // Room under the axis for the line saying what was cut, where something was.
    let height = bottom + if t0 > first { 56.0 } else { 40.0 };
    let mut out = header(height, training);
    for (index, &(rank, _, track)) in lanes.iter().enumerate() {
        let y = lane(index);
        let _ = writeln!(out, "<text x=\"10\" y=\"{}\">rank {rank}</text>", y + 24.0);
        if let Some(name) = names.get(&(rank, track)) {
            let _ = writeln!(
                out,
                "<text x=\"10\" y=\"{}\" font-size=\"11\">{}</text>",
                y + 36.0,
                escape(name)
            );
        }
    }
    draw_slices(&mut out, slices, &x, &|s| lane(lane_of(s.rank, s.track)));
    for a in arrows {
        let _ = writeln!(
            out,
            "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#333\" \
             stroke-width=\"0.8\" marker-end=\"url(#head)\"/>",
            x(a.from.1),
            lane(lane_of(a.from.0, a.tracks.0)) + LANE_H / 2.0,
            x(a.to.1),
            lane(lane_of(a.to.0, a.tracks.1)) + LANE_H / 2.0
        );
    }
    axis(&mut out, t0, span, bottom + 10.0, &x);
    if t0 > first {
        let _ = writeln!(
            out,
            "<text x=\"{LEFT}\" y=\"{}\" fill=\"#446\">The ranks entered their first call {:.0} µs \
             apart: the picture starts as the last one enters, the wait before it cut.</text>",
            height - 4.0,
            t0 - first
        );
    }
    out.push_str("</svg>\n");
    out
}

/// The SVG's opening, `height` high, and its legend (the training kinds' line where the trace has
/// them).
fn header(height: f64, training: bool) -> String {
    // 14 px text: the book shows a 1000 px picture about 750 px wide.
    let mut legend = vec![
        "grey: a collective call; dark grey: a barrier; arrows: messages",
        "blue: send; green: receive; purple: send and receive at once; orange: reducing what arrived",
        "yellow: a local copy; pale yellow: into or out of a shared-memory ring; teal: reading the \
         sender's buffer",
    ];
    if training {
        legend.push(
            "tan: compute (forward, backward by layer, optimizer); red: waiting for a collective; \
             peach: an asynchronous call on the comm thread",
        );
    }
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"14\">\n<rect width=\"100%\" height=\"100%\" \
         fill=\"white\"/>\n<defs><marker id=\"head\" markerWidth=\"8\" markerHeight=\"8\" \
         refX=\"7\" refY=\"4\" orient=\"auto\"><path d=\"M0,0 L8,4 L0,8 z\" \
         fill=\"#333\"/></marker></defs>\n"
    );
    for (i, line) in legend.iter().enumerate() {
        let _ = writeln!(
            out,
            "<text x=\"10\" y=\"{}\" fill=\"#446\">{line}</text>",
            16 + 18 * i
        );
    }
    out
}

/// A box per slice at `x` of its times, on its lane's `y`: asynchronous calls first, full lane
/// height, then calls and compute, the messages inside them, and the reductions and copies
/// inside those on top.
fn draw_slices(
    out: &mut String,
    slices: &[Slice],
    x: &dyn Fn(f64) -> f64,
    y: &dyn Fn(&Slice) -> f64,
) {
    let depth = |kind: &str| match kind {
        "async" => 0,
        "call" | "barrier" | "compute" | "wait" => 1,
        // A barrier inside a call on registered buffers sits where its messages would.
        "send" | "recv" | "sendrecv" | "fence" => 2,
        _ => 3,
    };
    let mut ordered: Vec<&Slice> = slices.iter().collect();
    ordered.sort_by_key(|s| depth(&s.kind));
    for s in ordered {
        let (inset, h) = match depth(&s.kind) {
            0 => (0.0, LANE_H),
            1 => (2.0, LANE_H - 4.0),
            2 => (10.0, LANE_H - 20.0),
            _ => (16.0, LANE_H - 32.0),
        };
        let _ = writeln!(
            out,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h}\" fill=\"{}\" \
             stroke=\"#556\" stroke-width=\"0.5\"><title>{}</title></rect>",
            x(s.start),
            y(s) + inset,
            (x(s.end) - x(s.start)).max(1.0),
            colour(&s.kind),
            escape(&s.name)
        );
    }
}

/// Where the picture starts: at the first event, unless the ranks entered their first call so
/// far apart (a rank still starting up) that the wait would take most of the picture; then just
/// before the last rank entered it, so that the work, not the start-up, fills the width.
fn start_of_work(slices: &[Slice], first: f64, last: f64) -> f64 {
    let mut entered: HashMap<usize, f64> = HashMap::new();
    for s in slices.iter().filter(|s| s.kind == "call") {
        let at = entered.entry(s.rank).or_insert(s.start);
        *at = at.min(s.start);
    }
    let arrived = entered.values().copied().fold(first, f64::max);
    match arrived - first > (last - first) / 3.0 {
        true => arrived - (last - arrived) * 0.03,
        false => first,
    }
}

/// The time axis: five ticks from the first event, in microseconds.
fn axis(out: &mut String, t0: f64, span: f64, y: f64, x: &dyn Fn(f64) -> f64) {
    let _ = writeln!(
        out,
        "<line x1=\"{LEFT}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#333\"/>",
        WIDTH - 20.0
    );
    for i in 0..=4 {
        let t = t0 + span * i as f64 / 4.0;
        // The last label ends at its tick, so it stays inside the picture.
        let anchor = if i == 4 { "end" } else { "middle" };
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"{anchor}\">{:.0} µs</text>",
            x(t),
            y + 16.0,
            t - t0
        );
    }
}

/// Reads the trace `input`, draws its timeline into `out`; the number of slices drawn.
pub fn draw(input: &Path, out: &Path) -> Result<usize, BenchError> {
    let text = std::fs::read_to_string(input).map_err(|source| BenchError::ReadFile {
        path: input.to_path_buf(),
        source,
    })?;
    let trace: Value = serde_json::from_str(&text).map_err(|source| BenchError::MalformedJson {
        path: input.to_path_buf(),
        source,
    })?;
    let (slices, arrows, names) = read_named(&trace);
    if slices.is_empty() {
        return Err(BenchError::NoSlices {
            path: input.to_path_buf(),
        });
    }
    std::fs::write(out, svg_named(&slices, &arrows, &names)).map_err(|source| {
        BenchError::WriteFile {
            path: out.to_path_buf(),
            source,
        }
    })?;
    Ok(slices.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn slices_and_matched_arrows_are_read_and_drawn() {
        let trace = json!({"traceEvents": [
            {"ph": "X", "cat": "call", "name": "all_reduce", "ts": 0.0, "dur": 10.0, "pid": 0},
            {"ph": "X", "cat": "send", "name": "send to 1", "ts": 1.0, "dur": 2.0, "pid": 0},
            {"ph": "s", "id": "0>1#0", "ts": 1.0, "pid": 0},
            {"ph": "f", "id": "0>1#0", "ts": 4.0, "pid": 1, "bp": "e"},
            {"ph": "f", "id": "unmatched", "ts": 4.0, "pid": 1},
            {"ph": "X", "cat": "recv", "name": "receive from 0", "ts": 2.0, "dur": 2.0, "pid": 1}
        ]});
        let (slices, arrows) = read(&trace);
        assert_eq!(slices.len(), 3);
        assert_eq!(
            arrows,
            [Arrow {
                from: (0, 1.0),
                to: (1, 4.0),
                tracks: (0, 0),
            }]
        );
        let picture = svg(&slices, &arrows);
        assert_eq!(picture.matches("<rect x=").count(), 3);
        assert_eq!(picture.matches("marker-end").count(), 1);
        assert!(picture.contains("rank 1"));
        assert!(
            !picture.contains("apart"),
            "no rank waited long: nothing cut"
        );
    }

    /// A rank that entered its call long after the other: the picture starts as it enters, the
    /// first rank's slice drawn from the left edge, and says what was cut.
    #[test]
    fn a_late_rank_start_is_cut_from_the_picture() {
        let slice = |rank, kind: &str, start, end| Slice {
            rank,
            track: 0,
            kind: kind.into(),
            name: String::new(),
            start,
            end,
        };
        let slices = [
            slice(0, "call", 0.0, 1000.0),
            slice(1, "call", 900.0, 1000.0),
            slice(1, "read", 910.0, 990.0),
        ];
        assert_eq!(start_of_work(&slices, 0.0, 1000.0), 900.0 - 100.0 * 0.03);
        let picture = svg(&slices, &[]);
        assert!(picture.contains("first call 897 µs apart"), "{picture}");
        assert!(
            picture.contains(&format!("<rect x=\"{LEFT:.1}\"")),
            "rank 0's call from the left edge"
        );
        // Ranks that entered close together: the picture starts at the first event.
        let close = [
            slice(0, "call", 0.0, 1000.0),
            slice(1, "call", 100.0, 1000.0),
        ];
        assert_eq!(start_of_work(&close, 0.0, 1000.0), 0.0);
    }

    /// A rank's communication thread is a lane of its own below its main thread, named.
    #[test]
    fn a_named_track_gets_a_lane_of_its_own() {
        let trace = json!({"traceEvents": [
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "comm thread"}},
            {"ph": "X", "cat": "async", "name": "all-reduce bucket 0", "ts": 2.0, "dur": 5.0, "pid": 0, "tid": 0},
            {"ph": "X", "cat": "compute", "name": "backward layer 2", "ts": 2.0, "dur": 5.0, "pid": 0, "tid": 1},
            {"ph": "X", "cat": "wait", "name": "wait for bucket 0", "ts": 7.0, "dur": 1.0, "pid": 0, "tid": 1}
        ]});
        let (slices, arrows, names) = read_named(&trace);
        let picture = svg_named(&slices, &arrows, &names);
        assert_eq!(picture.matches(">rank 0</text>").count(), 2, "{picture}");
        assert!(picture.contains(">comm thread</text>"));
        assert!(picture.contains("red: waiting for a collective"));
        // The main thread (unnamed) is the first lane, the comm thread the second.
        let compute = picture.find("backward layer 2").unwrap();
        let y = |at: usize| -> f64 {
            let rect = picture[..at].rfind("<rect x=").unwrap();
            let y = picture[rect..].split("y=\"").nth(1).unwrap();
            y.split('"').next().unwrap().parse().unwrap()
        };
        assert!(y(compute) < y(picture.find("all-reduce bucket 0").unwrap()));
    }
}
