//! Example 07's split, drawn (`07-tensor-parallel --draw FILE`): the two parallel layers of a
//! tensor-parallel group, which collective runs where and how many bytes it moves, with the sizes
//! of the run asked for; and the data-parallel group's all-reduce of each shard's gradients. The
//! book's picture is this drawing of the default run (tests/tensor_parallel.rs draws it again).

use std::fmt::Write as _;

use crate::model::{Shape, VOCAB};

/// Light blue: a rank's own compute; peach: a collective (as the timelines colour them).
const COMPUTE: &str = "#cfe2f3";
const COLLECTIVE: &str = "#f9cb9c";
const WHOLE: &str = "#e6e6e6";

/// What the picture shows: the model, the batch a data-parallel rank reads, the group sizes.
pub struct Split {
    pub shape: Shape,
    pub batch: usize,
    pub tp: usize,
    pub dp: usize,
}

/// `n` bytes, as the book writes sizes.
fn size(n: usize) -> String {
    match n {
        n if n >= 1 << 20 => format!("{:.2} MB", n as f64 / (1 << 20) as f64),
        n => format!("{:.1} KB", n as f64 / 1024.0),
    }
}

/// A box at (x, y), w × h, filled, with centred lines of text.
fn boxed(svg: &mut String, (x, y, w, h): (i32, i32, i32, i32), fill: &str, lines: &[&str]) {
    let _ = writeln!(
        svg,
        r##"<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="5" fill="{fill}" stroke="#556"/>"##
    );
    let top = y + h / 2 - 8 * (lines.len() as i32 - 1);
    for (i, line) in lines.iter().enumerate() {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle" dominant-baseline="middle">{line}</text>"#,
            x + w / 2,
            top + 16 * i as i32
        );
    }
}

/// An arrow from (x1, y1) to (x2, y2).
fn arrow(svg: &mut String, (x1, y1): (i32, i32), (x2, y2): (i32, i32)) {
    let _ = writeln!(
        svg,
        r##"<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#333" stroke-width="1.5" marker-end="url(#head)"/>"##
    );
}

/// The picture, an SVG of 960 × (130 + 110 per tensor-parallel rank) pixels.
pub fn draw(split: &Split) -> String {
    let Shape {
        context: c,
        embed: d,
        hidden: h,
    } = split.shape;
    let (b, tp) = (split.batch, split.tp);
    let height = 130 + LANE * tp as i32;
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="960" height="{height}" font-family="sans-serif" font-size="13">
<title>Example 07's MLP split over a tensor-parallel group of {tp}: w1 by columns (no communication), w2 by rows (an all-reduce of {fwd} forward, and of {bwd} backward), each shard's gradients all-reduced over a data-parallel group of {dp}</title>
<defs><marker id="head" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#333"/></marker></defs>
<rect width="100%" height="100%" fill="white"/>
<text x="480" y="24" text-anchor="middle" font-weight="bold">One tensor-parallel group of {tp} ranks (batch {b}, context {c} x embed {d}, hidden {h})</text>
"##,
        fwd = size(b * h * 4),
        bwd = size(b * c * d * 4),
        dp = split.dp,
    );
    for j in 0..tp {
        lane(&mut svg, split, j);
    }
    let bottom = 50 + LANE * (tp as i32 - 1) + 70;
    sums(&mut svg, split, (50, bottom));
    data_parallel(&mut svg, split, bottom + 30);
    let _ = writeln!(svg, "</svg>");
    svg
}

/// Height of a tensor-parallel rank's lane; where the group's all-reduce box starts.
const LANE: i32 = 110;
const REDUCE_X: i32 = 580;

/// Rank `j`'s lane: the whole input, its columns of w1, its rows of w2, an arrow to the sum.
fn lane(svg: &mut String, split: &Split, j: usize) {
    let Shape {
        context: c,
        embed: d,
        hidden: h,
    } = split.shape;
    let (b, w) = (split.batch, h / split.tp);
    let y = 50 + LANE * j as i32;
    let mid = y + 35;
    let _ = writeln!(svg, r#"<text x="20" y="{}">rank {j}</text>"#, mid + 4);
    let input = format!("e [{b} x {}]", c * d);
    boxed(svg, (70, y, 120, 70), WHOLE, &[&input, "whole input"]);
    arrow(svg, (190, mid), (218, mid));
    let cols = format!("w1[:, {}..{}]", j * w, (j + 1) * w);
    let out = format!("h1 slice [{b} x {w}]");
    boxed(
        svg,
        (230, y, 150, 70),
        COMPUTE,
        &["column-parallel", &cols, &out],
    );
    arrow(svg, (380, mid), (408, mid));
    let rows = format!("w2[{}..{}, :]", j * w, (j + 1) * w);
    let part = format!("a term of [{b} x {h}]");
    boxed(
        svg,
        (410, y, 150, 70),
        COMPUTE,
        &["row-parallel", &rows, &part],
    );
    arrow(svg, (560, mid), (REDUCE_X - 2, mid));
}

/// The group's all-reduce, forward and backward, from `top` to `bottom`, and what follows it.
fn sums(svg: &mut String, split: &Split, (top, bottom): (i32, i32)) {
    let Shape {
        context: c,
        embed: d,
        hidden: h,
    } = split.shape;
    let b = split.batch;
    let fwd = format!("{} ({b} x {h} floats)", size(b * h * 4));
    let bwd = format!("backward: all-reduce of {}", size(b * c * d * 4));
    let lines = [
        "all-reduce (sum)",
        "over the tp group:",
        &fwd,
        "",
        &bwd,
        "(the gradient at e, f's)",
    ];
    boxed(svg, (REDUCE_X, top, 200, bottom - top), COLLECTIVE, &lines);
    let mid = (top + bottom) / 2;
    arrow(svg, (REDUCE_X + 200, mid), (798, mid));
    let logits = format!("-> {VOCAB} logits");
    boxed(
        svg,
        (790, mid - 45, 150, 90),
        WHOLE,
        &["+ b2, tanh, w3", &logits, "every rank alike"],
    );
}

/// The data-parallel group's all-reduce of each shard's gradients, at `y`.
fn data_parallel(svg: &mut String, split: &Split, y: i32) {
    let shard: usize = crate::tensor_parallel::shard_lengths(&split.shape, split.tp)
        .map_or(0, |lengths| lengths.iter().sum());
    let dp_line = format!(
        "data parallel: each rank's shard, {shard} floats ({}), all-reduced over its dp group of {}",
        size(shard * 4),
        split.dp
    );
    let dp_how =
        "(the ranks at the same place in every tp group), in buckets, while backward goes on";
    boxed(svg, (80, y, 860, 50), COLLECTIVE, &[&dp_line, dp_how]);
}

/// Writes the picture of `split` to `file`.
pub fn save(file: &std::path::Path, split: &Split) -> comm_core::Result<()> {
    std::fs::write(file, draw(split))
        .map_err(|e| comm_core::CommError::io(format!("writing {}", file.display()), e))
}
