//! topology is the one room of comm-core that reads the environment: every variable the library
//! looks at is named there, and the rooms that need one get it through topology's readers. This
//! test reads the source as `module_graph` does (code, not comments or tests) and names any
//! other file that calls `std::env::var`, `var_os` or `vars`.

use std::path::Path;

/// Files compiled only into tests (declared under `#[cfg(test)]` by their parent).
const TEST_ONLY: &[&str] = &["store/fuzz.rs"];

#[test]
fn only_topology_reads_the_environment() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut readers = Vec::new();
    for file in test_support::source::rust_files(&src) {
        let relative = file.relative.to_string_lossy().to_string();
        if relative == "topology.rs"
            || relative.ends_with("tests.rs")
            || TEST_ONLY.contains(&relative.as_str())
        {
            continue;
        }
        for (n, line) in file.code.lines().enumerate() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            if ["env::var(", "env::var_os(", "env::vars("]
                .iter()
                .any(|call| line.contains(call))
            {
                readers.push(format!("src/{relative}:{}: {line}", n + 1));
            }
        }
    }
    assert!(
        readers.is_empty(),
        "read the environment in topology.rs and pass it on:\n{}",
        readers.join("\n")
    );
}
