//! The book's pictures drawn by the project from real runs (timelines): a test draws one as the
//! chapter's commands do and holds the committed picture to the same shape.

use std::path::Path;

use crate::build::workspace_root;

/// A timeline's shape: how many boxes of each colour (kind) and how many arrows. Times differ
/// from run to run, and so may the text (a line saying how much wait was cut); the shape does
/// not, unless the code changes.
pub fn shape(svg: &str) -> Vec<(String, usize)> {
    let mut kinds: Vec<(String, usize)> = Vec::new();
    let boxes = svg.split("<rect ").skip(1);
    for fill in boxes.filter_map(|r| r.split("fill=\"").nth(1)?.split('"').next()) {
        match kinds.iter_mut().find(|(f, _)| f == fill) {
            Some((_, n)) => *n += 1,
            None => kinds.push((fill.to_string(), 1)),
        }
    }
    kinds.push(("arrows".into(), svg.matches("marker-end").count()));
    kinds.sort();
    kinds
}

/// The book's picture docs/src/images/`name` was drawn by a chapter's commands from a real run:
/// it must have the shape they draw now (`svg`). `NCCL_WORKSHOP_UPDATE_PICTURES=1` writes the new
/// one instead.
pub fn book_picture_has_the_shape_of(svg: &str, name: &str) {
    let book = workspace_root().join("docs/src/images").join(name);
    if std::env::var_os("NCCL_WORKSHOP_UPDATE_PICTURES").is_some() {
        std::fs::write(&book, svg).unwrap();
    }
    let committed = std::fs::read_to_string(&book).unwrap_or_default();
    assert_eq!(
        shape(&committed),
        shape(svg),
        "{} no longer has the shape the commands draw: rerun with NCCL_WORKSHOP_UPDATE_PICTURES=1",
        Path::new(&book).display()
    );
}
