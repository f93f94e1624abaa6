//! The crate's own source, as tests that check its shape read it (which module imports which,
//! who reads the environment): every `.rs` file under a folder, with its code before any
//! `#[cfg(test)]`.

use std::path::{Path, PathBuf};

/// One source file: its path relative to the folder walked, and its code (the text before its
/// first `#[cfg(test)]`).
pub struct SourceFile {
    pub relative: PathBuf,
    pub code: String,
}

/// Every `.rs` file under `src`, in no particular order, its test modules cut off.
pub fn rust_files(src: &Path) -> Vec<SourceFile> {
    let mut files = Vec::new();
    let mut pending = vec![src.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            files.push(SourceFile {
                relative: path.strip_prefix(src).unwrap().to_path_buf(),
                code: text.split("#[cfg(test)]").next().unwrap().to_string(),
            });
        }
    }
    files
}
