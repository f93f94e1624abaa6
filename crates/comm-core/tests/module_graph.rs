//! comm-core's rooms import each other in one direction only: a cycle (comm importing launch
//! importing comm, as it once did) means a concept has leaked into a room that is not its own.
//! The graph is read from the source: `crate::module` in code, not in comments or tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the top-level modules its code uses.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in test_support::source::rust_files(&src) {
        let top = file.relative.components().next().unwrap().as_os_str();
        let module = top.to_string_lossy().trim_end_matches(".rs").to_string();
        if module == "lib" || file.relative.ends_with("tests.rs") {
            continue;
        }
        let uses = graph.entry(module.clone()).or_default();
        for line in file
            .code
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
        {
            for (at, _) in line.match_indices("crate::") {
                let name: String = line[at + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    uses.insert(name);
                }
            }
        }
    }
    graph
}

/// A cycle through `from`, if the graph has one.
fn cycle(
    graph: &BTreeMap<String, BTreeSet<String>>,
    from: &str,
    path: &mut Vec<String>,
) -> Option<Vec<String>> {
    if let Some(at) = path.iter().position(|m| m == from) {
        let mut found = path[at..].to_vec();
        found.push(from.to_string());
        return Some(found);
    }
    path.push(from.to_string());
    for next in graph.get(from).into_iter().flatten() {
        if let Some(found) = cycle(graph, next, path) {
            return Some(found);
        }
    }
    path.pop();
    None
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = module_graph();
    // The rooms this test is about are all there.
    for module in [
        "comm",
        "job",
        "launch",
        "collective",
        "check",
        "spawn",
        "store",
    ] {
        assert!(graph.contains_key(module), "{module} in {graph:?}");
    }
    assert!(graph["launch"].contains("job") && graph["job"].contains("comm"));
    for module in graph.keys() {
        if let Some(found) = cycle(&graph, module, &mut Vec::new()) {
            panic!("import cycle: {}", found.join(" -> "));
        }
    }
}
