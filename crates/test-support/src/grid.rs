//! The course's grids read back cell by cell, so tests check values rather than layout.
//!
//! A grid is a title line, then rows between dashed lines, one per rank in rank order:
//!
//! ```text
//! After broadcast:
//! -------------------
//! Gpu 0  | 42 | 42 |
//! -------------------
//! Gpu 1  | 42 | 42 |
//! -------------------
//! ```
//!
//! and it ends at a blank line or the end of the output.

/// Cells by rank: `rows[rank][i]`.
pub type Rows = Vec<Vec<String>>;

/// How to find one grid in a program's output.
#[derive(Debug, Clone)]
pub struct Grid<'a> {
    title: &'a str,
    prefix: &'a str,
    amid_other_output: bool,
}

impl<'a> Grid<'a> {
    /// The grid under the line `title`, in output that is the printing program's alone.
    pub fn titled(title: &'a str) -> Self {
        Grid {
            title,
            prefix: "",
            amid_other_output: false,
        }
    }

    /// Reads only lines that start with `prefix`, without it: the printing rank's lines under
    /// a launcher that labels them (commrun's `[0]: `).
    pub fn prefix(mut self, prefix: &'a str) -> Self {
        self.prefix = prefix;
        self
    }

    /// Other processes' lines may land between the grid's (ranks under srun share one output):
    /// lines that are neither rows nor rules are passed over instead of failing the test.
    pub fn amid_other_output(mut self) -> Self {
        self.amid_other_output = true;
        self
    }

    /// The rows, checked to be in rank order; fails the test when there is no such grid.
    pub fn read(&self, output: &str) -> Rows {
        let lines: Vec<&str> = output
            .lines()
            .filter_map(|l| l.strip_prefix(self.prefix))
            .collect();
        let start = lines
            .iter()
            .position(|l| *l == self.title)
            .unwrap_or_else(|| panic!("no grid titled {:?} in:\n{output}", self.title));
        let mut rows = Vec::new();
        for line in &lines[start + 1..] {
            if line.trim().is_empty() {
                break;
            }
            if let Some(rest) = line.strip_prefix("Gpu ") {
                let (rank, cells) = rest
                    .split_once('|')
                    .unwrap_or_else(|| panic!("a row without cells: {line:?}"));
                assert_eq!(
                    rank.trim().parse::<usize>().ok(),
                    Some(rows.len()),
                    "rows in rank order: {line:?}"
                );
                let cells = cells
                    .rsplit_once('|')
                    .unwrap_or_else(|| panic!("a row ends with '|': {line:?}"))
                    .0;
                rows.push(cells.split('|').map(|c| c.trim().to_string()).collect());
            } else {
                assert!(
                    self.amid_other_output || line.trim().chars().all(|c| c == '-'),
                    "unexpected line in grid {:?}: {line:?}",
                    self.title
                );
            }
        }
        assert!(
            !rows.is_empty(),
            "grid {:?} has no rows in:\n{output}",
            self.title
        );
        rows
    }
}

/// The grid under `title` in output that is the printing program's alone.
pub fn grid(output: &str, title: &str) -> Rows {
    Grid::titled(title).read(output)
}

/// Checks `n` rows of `len` cells each, every cell of rank r's row being `cell(r)`.
pub fn expect_cells<S: AsRef<str>>(
    rows: &[Vec<String>],
    n: usize,
    len: usize,
    cell: impl Fn(usize) -> S,
) {
    assert_eq!(rows.len(), n, "one row per rank: {rows:?}");
    for (rank, row) in rows.iter().enumerate() {
        assert_eq!(row.len(), len, "rank {rank}: {row:?}");
        let expected = cell(rank);
        for value in row {
            assert_eq!(value, expected.as_ref(), "rank {rank}: {row:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_RANKS: &str = "backend: cpu (requested)\nAfter reduce:\n-----\nGpu 0  | 2 | 2 |\n-----\nGpu 1  | 2 | 2 |\n-----\n\nAfter:\n";

    #[test]
    fn rows_by_rank() {
        let rows = grid(TWO_RANKS, "After reduce:");
        expect_cells(&rows, 2, 2, |_| "2");
    }

    #[test]
    fn prefixed_lines_amid_others() {
        let output = "[0]: Before:\n[1]: Rank 1 using device: cpu:1\n[0]: Gpu 0  | 1 |\n\
                      Rank 2 says hello\n[0]: Gpu 1  | 1 |\n";
        let rows = Grid::titled("Before:").prefix("[0]: ").read(output);
        expect_cells(&rows, 2, 1, |_| "1");
        let rows = Grid::titled("Before:")
            .amid_other_output()
            .read("Before:\nGpu 0  | 1 |\nRank 1 using device: cpu:1\nGpu 1  | 1 |\n");
        assert_eq!(rows.len(), 2);
    }

    #[test]
    #[should_panic(expected = "unexpected line in grid")]
    fn a_stray_line_fails_unless_allowed() {
        grid("T:\nGpu 0  | 1 |\nsomething else\n", "T:");
    }

    #[test]
    #[should_panic(expected = "rows in rank order")]
    fn rows_out_of_order_fail() {
        grid("T:\nGpu 1  | 1 |\nGpu 0  | 1 |\n", "T:");
    }
}
