//! `comm-bench grids OUTPUT -o FILE.svg`: the grids a program printed (a run with `--steps`),
//! drawn as one picture, one grid under another with its title. A cell that changed since the
//! grid before is orange, one that holds what every rank ends with is green: the book's picture
//! of the ring all-reduce is drawn this way from a real run, and redrawn by a test.

use std::fmt::Write as _;
use std::path::Path;

use crate::error::BenchError;

/// One grid as printed: its title and every rank's cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Printed {
    /// The line above the grid.
    pub title: String,
    /// Cells by rank.
    pub rows: Vec<Vec<String>>,
}

/// The grids in a program's output, in order: a title line, then `Gpu N | a | b |` rows between
/// dashed rules. Other lines (the backend line, each rank's own lines) are passed over.
pub fn parse(output: &str) -> Vec<Printed> {
    let mut grids: Vec<Printed> = Vec::new();
    let mut title: Option<&str> = None;
    for line in output.lines() {
        let trimmed = line.trim();
        if let Some(rest) = line.strip_prefix("Gpu ") {
            let cells = rest.split_once('|').map_or("", |(_, cells)| cells);
            let cells = cells.rsplit_once('|').map_or("", |(cells, _)| cells);
            let row = cells.split('|').map(|c| c.trim().to_string()).collect();
            match (title.take(), grids.last_mut()) {
                (None, Some(grid)) => grid.rows.push(row),
                (title, _) => grids.push(Printed {
                    title: title.unwrap_or_default().to_string(),
                    rows: vec![row],
                }),
            }
        } else if !trimmed.is_empty() && !trimmed.chars().all(|c| c == '-') {
            title = Some(line);
        }
    }
    grids
}

const CELL_W: usize = 46;
const CELL_H: usize = 26;
const LEFT: usize = 64;
const TITLE_H: usize = 30;
const GAP: usize = 18;

/// The picture of `grids` as SVG text.
pub fn svg(grids: &[Printed]) -> String {
    let cells = grids
        .iter()
        .flat_map(|g| &g.rows)
        .map(Vec::len)
        .max()
        .unwrap_or(0);
    let width = (LEFT + cells * (CELL_W + 4) + 20).max(720);
    let height: usize = grids
        .iter()
        .map(|g| TITLE_H + g.rows.len() * (CELL_H + 6) + GAP)
        .sum::<usize>()
        + 30;
    let last = grids.last().map(|g| g.rows.clone()).unwrap_or_default();
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"13\">\n<rect width=\"100%\" height=\"100%\" \
         fill=\"white\"/>\n"
    );
    let _ = writeln!(
        out,
        "<text x=\"10\" y=\"22\" fill=\"#446\">orange: changed in this step; green: as \
         every rank ends</text>"
    );
    let mut y = 30;
    let mut before: Option<&Vec<Vec<String>>> = None;
    for grid in grids {
        y += TITLE_H - 8;
        let _ = writeln!(
            out,
            "<text x=\"10\" y=\"{y}\" font-weight=\"bold\">{}</text>",
            escape(&grid.title)
        );
        y += 8;
        for (rank, row) in grid.rows.iter().enumerate() {
            let _ = writeln!(
                out,
                "<text x=\"10\" y=\"{}\">rank {rank}</text>",
                y + CELL_H - 8
            );
            // Cells are compared by place only between rows of one shape: a rank's block before
            // an all-gather, or after a reduce-scatter, is not the same cells as its whole buffer.
            let same_shape = |other: Option<&Vec<String>>| match other {
                Some(o) if o.len() == row.len() => o.clone(),
                _ => Vec::new(),
            };
            let earlier = same_shape(before.and_then(|b| b.get(rank)));
            let finished = same_shape(last.get(rank));
            for (i, cell) in row.iter().enumerate() {
                let changed = earlier.get(i).is_some_and(|old| old != cell);
                let done = finished.get(i) == Some(cell);
                let fill = match (changed, done) {
                    (true, _) => "#ffd27f",
                    (false, true) => "#b7e4b0",
                    _ => "#e8eef7",
                };
                let x = LEFT + i * (CELL_W + 4);
                let _ = writeln!(
                    out,
                    "<rect x=\"{x}\" y=\"{y}\" width=\"{CELL_W}\" height=\"{CELL_H}\" \
                     fill=\"{fill}\" stroke=\"#446\"/>\n<text x=\"{}\" y=\"{}\" \
                     text-anchor=\"middle\">{}</text>",
                    x + CELL_W / 2,
                    y + CELL_H - 8,
                    escape(cell)
                );
            }
            y += CELL_H + 6;
        }
        y += GAP;
        before = Some(&grid.rows);
    }
    out.push_str("</svg>\n");
    out
}

/// `text` safe inside an SVG element (timeline.rs draws with it too).
pub(crate) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Reads `input` (a program's output), draws its grids into `out`.
pub fn draw(input: &Path, out: &Path) -> Result<usize, BenchError> {
    let text = std::fs::read_to_string(input).map_err(|source| BenchError::ReadFile {
        path: input.to_path_buf(),
        source,
    })?;
    let grids = parse(&text);
    if grids.is_empty() {
        return Err(BenchError::NoGrids {
            path: input.to_path_buf(),
        });
    }
    std::fs::write(out, svg(&grids)).map_err(|source| BenchError::WriteFile {
        path: out.to_path_buf(),
        source,
    })?;
    Ok(grids.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "backend: cpu (requested)\nRank 0 using device: cpu:0\nBefore reduce:\n       \
                          -------\nGpu 0  | 1  | 1  |\n       -------\n       -------\nGpu 1  | 1  | \
                          1  |\n       -------\n\nstep 1 of 1: it moved\n       -------\nGpu 0  | 2  \
                          | 1  |\n       -------\nGpu 1  | 2  | 2  |\n       -------\n";

    #[test]
    fn grids_are_read_in_order_with_their_titles() {
        let grids = parse(OUTPUT);
        assert_eq!(grids.len(), 2);
        assert_eq!(grids[0].title, "Before reduce:");
        assert_eq!(grids[1].title, "step 1 of 1: it moved");
        assert_eq!(grids[1].rows, [["2", "1"], ["2", "2"]]);
    }

    #[test]
    fn changed_cells_are_orange_and_final_ones_green() {
        let picture = svg(&parse(OUTPUT));
        assert_eq!(picture.matches("<rect x=").count(), 8);
        // In the second grid, three cells changed (orange); the first grid's cells are not final.
        assert_eq!(picture.matches("#ffd27f").count(), 3);
        assert!(picture.contains("step 1 of 1: it moved"));
    }
}
