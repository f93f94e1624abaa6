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
    let mut pending = vec![src.clone()];
    let mut readers = Vec::new();
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let relative = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .to_string();
            if relative == "topology.rs"
                || relative.ends_with("tests.rs")
                || TEST_ONLY.contains(&relative.as_str())
            {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            for (n, line) in code.lines().enumerate() {
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
    }
    assert!(
        readers.is_empty(),
        "read the environment in topology.rs and pass it on:\n{}",
        readers.join("\n")
    );
}
