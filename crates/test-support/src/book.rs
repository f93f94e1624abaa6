//! The book (docs/src) as tests read it: where its chapters are, and their order.

use std::path::PathBuf;

use crate::build::workspace_root;

/// docs/src, where the chapters and SUMMARY.md are.
pub fn src() -> PathBuf {
    workspace_root().join("docs/src")
}

/// The chapters of SUMMARY.md, in order (file names relative to docs/src).
pub fn chapters() -> Vec<String> {
    let summary = std::fs::read_to_string(src().join("SUMMARY.md")).unwrap();
    summary
        .lines()
        .filter_map(|l| l.split_once("](").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_once(')').map(|(target, _)| target.to_string()))
        .filter(|t| !t.is_empty())
        .collect()
}

/// Every Markdown file of docs/src, sorted by name (SUMMARY.md included): what a check of the
/// docs' command lines reads.
pub fn markdown_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(src())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files
}
