//! The course's grids: one small table per rank, all cells the same width, printed by rank 0.
//!
//! ```text
//! Before broadcast:
//!        ---------------------
//! Gpu 0  | 42 | 42 | 42 | 42 |
//!        ---------------------
//! ```
//! Long buffers show their first and last cells around `...`.

use std::io::Write;

use prettytable::format::{FormatBuilder, LinePosition, LineSeparator};
use prettytable::{Cell, Table};

use crate::dtype::Element;
use crate::error::{CommError, Result};
use crate::store::Scoped;

/// Buffers longer than this show only their ends.
pub const MAX_CELLS: usize = 8;
const END_CELLS: usize = 3;
const ELIDED: &str = "...";

/// One rank's buffer as it will be shown: its length and the cells to print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The buffer's full length, shown beside a row that leaves cells out.
    pub len: usize,
    /// The cells to print: every value, or the first and last few around `...`.
    pub cells: Vec<String>,
}

impl Row {
    /// The row for `values`, keeping only the ends when there are more than [`MAX_CELLS`].
    pub fn of<T: Element>(values: &[T]) -> Row {
        let cells = if values.len() <= MAX_CELLS {
            values.iter().map(T::to_string).collect()
        } else {
            let head = values[..END_CELLS].iter().map(T::to_string);
            let tail = values[values.len() - END_CELLS..].iter().map(T::to_string);
            head.chain([ELIDED.to_string()]).chain(tail).collect()
        };
        Row {
            len: values.len(),
            cells,
        }
    }

    /// Text form for the store: the length, then one cell per line.
    pub fn encode(&self) -> Vec<u8> {
        let mut text = self.len.to_string();
        for cell in &self.cells {
            text.push('\n');
            text.push_str(cell);
        }
        text.into_bytes()
    }

    /// Reads back what [`Row::encode`] wrote; None if the bytes are not a row.
    pub fn decode(bytes: &[u8]) -> Option<Row> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut lines = text.split('\n');
        let len = lines.next()?.parse().ok()?;
        Some(Row {
            len,
            cells: lines.map(str::to_string).collect(),
        })
    }
}

/// The whole grid as text: the title, then each rank's table labelled `Gpu r`, then a blank line.
pub fn render(title: &str, rows: &[Row]) -> String {
    let width = rows
        .iter()
        .flat_map(|r| r.cells.iter().map(|c| c.chars().count()))
        .max()
        .unwrap_or(0)
        .max(2);
    let label_width = format!("Gpu {}", rows.len().saturating_sub(1)).len() + 2;
    let format = FormatBuilder::new()
        .column_separator('|')
        .borders('|')
        .separators(
            &[LinePosition::Top, LinePosition::Bottom],
            LineSeparator::new('-', '-', '-', '-'),
        )
        .padding(1, 1)
        .build();

    let mut out = format!("{title}\n");
    for (rank, row) in rows.iter().enumerate() {
        let mut table = Table::new();
        table.set_format(format);
        let cells: Vec<Cell> = if row.cells.is_empty() {
            vec![Cell::new("(empty)")]
        } else {
            row.cells
                .iter()
                .map(|c| Cell::new(&format!("{c:<width$}")))
                .collect()
        };
        table.add_row(prettytable::Row::new(cells));
        let label = format!("{:<label_width$}", format!("Gpu {rank}"));
        for line in table.to_string().lines() {
            let prefix = if line.starts_with('|') {
                label.as_str()
            } else {
                ""
            };
            out.push_str(&format!("{prefix:<label_width$}{line}"));
            if line.starts_with('|') && row.len > MAX_CELLS {
                out.push_str(&format!("  ({} elements)", row.len));
            }
            out.push('\n');
        }
    }
    out.push('\n');
    out
}

/// Prints the grid in one write, so no other output lands inside it.
/// One grid of a group of ranks, through the store in `scope`: every rank hands in its `row`,
/// rank 0 gathers them under `row/<rank>`, prints the grid under `title` and deletes the rows.
/// Every rank of the group calls it; only rank 0 waits.
pub fn share(scope: &Scoped, rank: usize, world_size: usize, title: &str, row: Row) -> Result<()> {
    if rank != 0 {
        return scope.set_at("row", rank, &row.encode());
    }
    let mut rows = vec![row];
    for (rank, bytes) in (1..).zip(scope.get_at("row", 1..world_size)?) {
        rows.push(
            Row::decode(&bytes)
                .ok_or_else(|| CommError::Peer(format!("rank {rank} sent a malformed grid row")))?,
        );
    }
    scope.delete_at("row", 1..world_size)?;
    print(title, &rows);
    Ok(())
}

/// Prints a grid of `rows` (rank 0's first) under `title` on stdout.
pub fn print(title: &str, rows: &[Row]) {
    let text = render(title, rows);
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_course_grid() {
        let rows = [Row::of(&[42.0f32; 4]), Row::of(&[0.0f32; 4])];
        let expected = "\
Before broadcast:
       ---------------------
Gpu 0  | 42 | 42 | 42 | 42 |
       ---------------------
       ---------------------
Gpu 1  | 0  | 0  | 0  | 0  |
       ---------------------

";
        assert_eq!(render("Before broadcast:", &rows), expected);
    }

    #[test]
    fn long_buffers_are_elided_and_widths_shared() {
        let values: Vec<i64> = (0..100).collect();
        let rows = [Row::of(&values), Row::of(&[1000i64; 2])];
        let text = render("t", &rows);
        assert!(
            text.contains(
                "Gpu 0  | 0    | 1    | 2    | ...  | 97   | 98   | 99   |  (100 elements)"
            ),
            "{text}"
        );
        assert!(text.contains("Gpu 1  | 1000 | 1000 |\n"), "{text}");
    }

    #[test]
    fn empty_buffer_and_round_trip() {
        let row = Row::of::<f64>(&[]);
        assert!(render("t", std::slice::from_ref(&row)).contains("Gpu 0  | (empty) |"));
        let row = Row::of(&[1.5f64, -2.0]);
        assert_eq!(Row::decode(&row.encode()), Some(row));
        assert_eq!(Row::decode(b"x"), None);
    }
}
