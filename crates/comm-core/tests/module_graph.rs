//! Every crate's modules import each other in one direction only, down to submodules (a
//! directory module's files are its submodules): a circle (comm importing launch importing comm,
//! store's client and membership, comm-bench's report and alpha_beta) means a concept has leaked
//! into a room that is not its own. And no source file outside tests is over 800 lines.
//!
//! The graph is read from the source, comments and strings blanked and test code cut out
//! (`#[cfg(test)]` items, `tests.rs` files): `crate::a::b`, `super::x`, `self::x`, a child's
//! name, and `use` lists, each resolved to the deepest module it names; a name a module
//! re-exports (`pub use child::Name`) resolves to where it is defined, so a facade is no circle.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A module's path inside its crate (`["backend", "cpu"]`; the crate root is empty).
type ModPath = Vec<String>;

fn show(m: &ModPath) -> String {
    match m.is_empty() {
        true => "crate".into(),
        false => m.join("::"),
    }
}

/// `text` with comments and string and char literals turned to spaces (lines kept), so that a
/// path in a doc comment or a message is no import.
fn blank(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let wipe = |from: usize, to: usize, out: &mut Vec<u8>| {
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let prev = if i > 0 { b[i - 1] } else { b' ' };
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = b[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |p| i + p);
                wipe(i, end, &mut out);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let (mut j, mut depth) = (i + 2, 1);
                while j < b.len() && depth > 0 {
                    match (b[j], b.get(j + 1)) {
                        (b'/', Some(b'*')) => (depth, j) = (depth + 1, j + 2),
                        (b'*', Some(b'/')) => (depth, j) = (depth - 1, j + 2),
                        _ => j += 1,
                    }
                }
                wipe(i, j, &mut out);
                i = j;
            }
            // r"..", r#".."#, br"..": raw strings.
            b'r' if (!ident(prev) || prev == b'b' && (i < 2 || !ident(b[i - 2])))
                && matches!(b.get(i + 1), Some(b'"' | b'#')) =>
            {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    i += 1; // r#ident
                    continue;
                }
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                let start = i + 2 + hashes;
                let end = b[start..]
                    .windows(close.len())
                    .position(|w| w == close)
                    .map_or(b.len(), |p| start + p + close.len());
                wipe(i, end, &mut out);
                i = end;
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                let end = (j + 1).min(b.len());
                wipe(i, end, &mut out);
                i = end;
            }
            b'\'' => {
                // A char literal ('x', '\n', 'é'), else a lifetime ('a).
                let len = match b.get(i + 1) {
                    Some(b'\\') => b
                        .get(i + 3..)
                        .and_then(|r| r.iter().position(|&c| c == b'\''))
                        .map(|p| p + 4),
                    Some(_) => {
                        let ch = text[i + 1..].chars().next().unwrap().len_utf8();
                        (b.get(i + 1 + ch) == Some(&b'\'')).then_some(ch + 2)
                    }
                    None => None,
                };
                let end = i + len.unwrap_or(1);
                if len.is_some() {
                    wipe(i, end, &mut out);
                }
                i = end;
            }
            _ => i += 1,
        }
    }
    String::from_utf8(out).unwrap()
}

/// Blanked `code` without its `#[cfg(test)]` items, and the names of the test-only modules it
/// declares (`#[cfg(test)] mod fuzz;`), whose files are test code too.
fn without_tests(code: &str) -> (String, Vec<String>) {
    const MARK: &str = "#[cfg(test)]";
    let mut out = code.to_string();
    let mut test_mods = Vec::new();
    let mut from = 0;
    while let Some(at) = out[from..].find(MARK).map(|p| from + p) {
        let b = out.as_bytes();
        let mut j = at + MARK.len();
        let mut depth = 0;
        // The item ends at its `;` or at the brace closing its body.
        while j < b.len() {
            match b[j] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        j += 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    j += 1;
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        let item = &out[at + MARK.len()..j];
        let words: Vec<&str> = item.split_whitespace().take(3).collect();
        if let ["mod", name, ..] | ["pub", "mod", name] | ["pub(crate)", "mod", name] = &words[..] {
            test_mods.push(name.trim_end_matches(';').to_string());
        }
        let blanked: String = out[at..j]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(at..j, &blanked);
        from = j;
    }
    (out, test_mods)
}

/// One crate's modules, from its source files (path under `src/`, text): module → its code.
fn modules(files: &[(PathBuf, String)]) -> BTreeMap<ModPath, String> {
    let mut all = BTreeMap::new();
    let mut test_only = BTreeSet::new();
    for (relative, text) in files {
        if relative.ends_with("tests.rs") {
            continue;
        }
        let mut path: ModPath = relative
            .iter()
            .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        if matches!(
            path.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            path.pop();
        }
        let (code, test_mods) = without_tests(&blank(text));
        for name in test_mods {
            let mut child = path.clone();
            child.push(name);
            test_only.insert(child);
        }
        // A bin's main.rs beside lib.rs is its own crate root; it reaches the library by name.
        all.entry(path).or_insert_with(String::new).push_str(&code);
    }
    all.retain(|m, _| !test_only.iter().any(|t| m.starts_with(t)));
    all
}

/// The paths one `use` tree names: `a::{b, c::{d, e as f}}` → `a::b`, `a::c::d`, `a::c::e`,
/// each with the name it brings in (`f` for `e as f`).
fn use_paths(tree: &str) -> Vec<(Vec<String>, String)> {
    fn walk(prefix: &[String], tree: &str, out: &mut Vec<(Vec<String>, String)>) {
        let tree = tree.trim();
        if let Some(open) = tree.find('{') {
            let mut prefix = prefix.to_vec();
            prefix.extend(segments(tree[..open].trim_end_matches("::")));
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let (mut depth, mut start) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        walk(&prefix, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            walk(&prefix, &inner[start..], out);
            return;
        }
        let (path, alias) = match tree.split_once(" as ") {
            Some((p, a)) => (p, Some(a.trim())),
            None => (tree, None),
        };
        let mut full = prefix.to_vec();
        full.extend(segments(path));
        if full.is_empty() || tree.is_empty() {
            return;
        }
        // `a::{self}` brings in `a`.
        let last = match full.len() {
            n if n > 1 && full[n - 1] == "self" => &full[n - 2],
            n => &full[n - 1],
        };
        let name = alias.unwrap_or(last).to_string();
        out.push((full, name));
    }
    let mut out = Vec::new();
    walk(&[], tree, &mut out);
    out
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(|s| s.trim().trim_start_matches('$').to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Every `use` item of `code`: (its tree, whether it is a re-export).
fn uses(code: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for (at, _) in code.match_indices("use ") {
        let before = code[..at].trim_end();
        let word_start =
            at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        if !word_start {
            continue;
        }
        // `pub use`, `pub(crate) use`: a re-export.
        let public = before.ends_with("pub")
            || before
                .rsplit_once("pub(")
                .is_some_and(|(_, r)| r.ends_with(')') && !r.contains(['\n', ';', '}']));
        let end = code[at..].find(';').map_or(code.len(), |p| at + p);
        out.push((code[at + 4..end].to_string(), public));
    }
    out
}

/// Every path in `code` outside `use` items that starts at `crate`, `super`, `self` or a
/// module in `scope`: `crate::a::b::c` → `[crate, a, b, c]`.
fn code_paths(code: &str, scope: &BTreeMap<String, Vec<String>>) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let chars: Vec<(usize, char)> = code.char_indices().collect();
    let mut i = 0;
    while i < chars.len() {
        let (at, c) = chars[i];
        let starts = ident(c) && (i == 0 || !ident(chars[i - 1].1) && chars[i - 1].1 != ':');
        if !starts {
            i += 1;
            continue;
        }
        // The longest `ident(::ident)*` from here.
        let mut j = i;
        let end = loop {
            while j < chars.len() && ident(chars[j].1) {
                j += 1;
            }
            let end = chars.get(j).map_or(code.len(), |c| c.0);
            if code[end..].starts_with("::") && code[end + 2..].starts_with(|c: char| ident(c)) {
                j += 2;
            } else {
                break end;
            }
        };
        let path = segments(&code[at..end]);
        let first = path[0].as_str();
        if path.len() > 1
            && (["crate", "super", "self"].contains(&first) || scope.contains_key(first))
        {
            out.push(path);
        }
        i = j.max(i + 1);
    }
    out
}

/// One crate's graph: module → the modules its code uses → the first path that uses each.
type Graph = BTreeMap<ModPath, BTreeMap<ModPath, String>>;

/// One crate's graph, from its files.
fn graph_of(files: &[(PathBuf, String)]) -> Graph {
    let modules = modules(files);
    // Module → the names of modules in scope there (its children, and modules it imports with
    // `use`) → their absolute paths.
    let mut scopes: BTreeMap<ModPath, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for m in modules.keys() {
        let mut abs = vec!["crate".to_string()];
        abs.extend(m.iter().cloned());
        if let Some((child, parent)) = m.split_last() {
            scopes
                .entry(parent.to_vec())
                .or_default()
                .insert(child.clone(), abs);
        }
    }
    // Every `use` path, absolute (`crate` first), with its name; the re-exports among them:
    // module → name → the path it stands for.
    let mut used: BTreeMap<ModPath, Vec<(Vec<String>, String, bool)>> = BTreeMap::new();
    let mut reexports: BTreeMap<ModPath, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for (m, code) in &modules {
        let scope = scopes.get(m).cloned().unwrap_or_default();
        for (tree, public) in uses(code) {
            for (path, name) in use_paths(&tree) {
                let glob = path.last().is_some_and(|s| s == "*");
                let Some(abs) = absolute(m, &path, &scope) else {
                    continue;
                };
                if public {
                    let names = reexports.entry(m.clone()).or_default();
                    names.insert(name.clone(), abs.clone());
                }
                used.entry(m.clone()).or_default().push((abs, name, glob));
            }
        }
    }
    let mut graph = BTreeMap::new();
    for (m, code) in &modules {
        let mut scope = scopes.get(m).cloned().unwrap_or_default();
        let mut paths = Vec::new();
        for (abs, name, glob) in used.remove(m).unwrap_or_default() {
            let module = resolve(&modules, &reexports, &abs, 0);
            let names_module = abs[1..].iter().filter(|s| *s != "self").eq(module.iter());
            // `use super::library;` is no use yet: `library::find()` in the code is, of wherever
            // `find` lives.
            if names_module && !glob && !reexports.get(m).is_some_and(|r| r.contains_key(&name)) {
                scope.insert(name, abs);
            } else {
                paths.push(abs);
            }
        }
        let without_uses = uses(code)
            .iter()
            .fold(code.clone(), |c, (tree, _)| c.replace(tree, ""));
        paths.extend(
            code_paths(&without_uses, &scope)
                .iter()
                .filter_map(|p| absolute(m, p, &scope)),
        );
        let mut targets = BTreeMap::new();
        for path in paths {
            let target = resolve(&modules, &reexports, &path, 0);
            if &target != m {
                targets.entry(target).or_insert_with(|| path.join("::"));
            }
        }
        graph.insert(m.clone(), targets);
    }
    graph
}

/// `path` as written in module `m`, made absolute (`crate` first); `None` for another crate's
/// or a local item's path. `scope`: the modules `m` can name directly.
fn absolute(
    m: &ModPath,
    path: &[String],
    scope: &BTreeMap<String, Vec<String>>,
) -> Option<Vec<String>> {
    let mut abs = vec!["crate".to_string()];
    let mut rest = path;
    match path[0].as_str() {
        "crate" => rest = &path[1..],
        "self" => {
            abs.extend(m.iter().cloned());
            rest = &path[1..];
        }
        "super" => {
            let mut base = m.clone();
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
            abs.extend(base);
        }
        first if scope.contains_key(first) => {
            abs = scope[first].clone();
            rest = &path[1..];
        }
        _ => return None,
    }
    abs.extend(rest.iter().filter(|s| *s != "*").cloned());
    Some(abs)
}

/// The deepest module an absolute path names, following re-exports to where a name is defined.
fn resolve(
    modules: &BTreeMap<ModPath, String>,
    reexports: &BTreeMap<ModPath, BTreeMap<String, Vec<String>>>,
    path: &[String],
    depth: usize,
) -> ModPath {
    let mut m: ModPath = Vec::new();
    let mut rest = &path[1..];
    while let Some(next) = rest.first() {
        let mut deeper = m.clone();
        deeper.push(next.clone());
        if !modules.contains_key(&deeper) {
            break;
        }
        m = deeper;
        rest = &rest[1..];
    }
    match rest.first().and_then(|name| reexports.get(&m)?.get(name)) {
        Some(target) if depth < 16 && target.as_slice() != path => {
            let mut target = target.clone();
            target.extend(rest[1..].iter().cloned());
            resolve(modules, reexports, &target, depth + 1)
        }
        _ => m,
    }
}

/// Every circle of `graph`: one shortest cycle through each strongly connected set of modules.
fn circles(graph: &Graph) -> Vec<Vec<ModPath>> {
    let reach = |from: &ModPath| -> BTreeMap<ModPath, ModPath> {
        // Breadth first: each reached module → the one it was reached from.
        let mut seen = BTreeMap::new();
        let mut queue = VecDeque::from([from.clone()]);
        while let Some(m) = queue.pop_front() {
            for next in graph.get(&m).into_iter().flat_map(|t| t.keys()) {
                if !seen.contains_key(next) {
                    seen.insert(next.clone(), m.clone());
                    queue.push_back(next.clone());
                }
            }
        }
        seen
    };
    let mut done = BTreeSet::new();
    let mut found = Vec::new();
    for m in graph.keys() {
        if done.contains(m) {
            continue;
        }
        let back = reach(m);
        if !back.contains_key(m) {
            continue;
        }
        let mut cycle = vec![m.clone()];
        let mut at = back[m].clone();
        while &at != m {
            cycle.push(at.clone());
            at = back[&at].clone();
        }
        cycle.push(m.clone());
        cycle.reverse();
        // Everything in this circle's strongly connected set is reported with it.
        let members: Vec<ModPath> = back
            .keys()
            .filter(|k| reach(k).contains_key(m))
            .cloned()
            .collect();
        done.extend(members);
        found.push(cycle);
    }
    found
}

/// Every `.rs` file under `dir`, relative to it.
fn rust_files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() && !name.starts_with('.') && name != "target" {
                pending.push(path);
            } else if name.ends_with(".rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                files.push((path.strip_prefix(dir).unwrap().to_path_buf(), text));
            }
        }
    }
    files.sort();
    files
}

/// Each crate of the workspace (by folder name) and its module graph.
fn workspace_graphs() -> BTreeMap<String, Graph> {
    let mut graphs = BTreeMap::new();
    for entry in std::fs::read_dir(root().join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("src").is_dir() {
            let name = dir.file_name().unwrap().to_string_lossy().to_string();
            graphs.insert(name, graph_of(&rust_files(&dir.join("src"))));
        }
    }
    graphs
}

fn m(path: &str) -> ModPath {
    segments(path)
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graphs = workspace_graphs();
    for krate in ["comm-core", "comm-bench", "commrun", "test-support"] {
        assert!(graphs.contains_key(krate), "{krate} in {:?}", graphs.keys());
    }
    // The graph is read at submodule granularity: what this test is about is there.
    let core = &graphs["comm-core"];
    for module in [
        "comm",
        "job",
        "launch",
        "collective",
        "check",
        "backend::cpu::transport",
    ] {
        assert!(core.contains_key(&m(module)), "{module} in comm-core");
    }
    assert!(core[&m("launch")].contains_key(&m("job")) && core[&m("job")].contains_key(&m("comm")));
    // `crate::backend::cpu::Transport` is defined in backend/cpu/transport.rs.
    assert!(core[&m("comm")].contains_key(&m("backend::cpu::transport")));
    assert!(graphs["comm-bench"].contains_key(&m("predict")));
    let mut found = Vec::new();
    for (krate, graph) in &graphs {
        for cycle in circles(graph) {
            // Each step with the path that takes it: `a -> b (crate::b::f)`.
            let steps: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    format!(
                        "{} -> {} ({})",
                        show(&w[0]),
                        show(&w[1]),
                        graph[&w[0]][&w[1]]
                    )
                })
                .collect();
            found.push(format!("{krate}: {}", steps.join(", ")));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn circles_are_found_through_super_use_lists_and_reexports() {
    let file = |path: &str, text: &str| (PathBuf::from(path), text.to_string());
    let files = [
        file("lib.rs", "pub mod store;\npub mod user;\npub use user::User;\n"),
        file(
            "store/mod.rs",
            "mod client;\nmod membership;\npub use client::Store;\n",
        ),
        // client ↔ membership: one through a module brought in by `use`, one through a list.
        file(
            "store/client.rs",
            "use super::membership;\npub struct Store;\nfn join() { membership::join() }\n",
        ),
        file(
            "store/membership.rs",
            "use crate::{store::{client::Store as S}, user};\nfn f(_: user::User) {}\n// crate::x\n",
        ),
        // A re-export is followed to where the name lives: no circle with the facade.
        file(
            "user.rs",
            "pub struct User;\nfn f() -> crate::store::Store { let s = \"crate::x\"; todo!() }\n#[cfg(test)]\nmod tests { use crate::lib; }\n",
        ),
        file("store/tests.rs", "use crate::user;\n"),
    ];
    let graph = graph_of(&files);
    let targets = |module: &str| graph[&m(module)].keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(
        targets("store::membership"),
        BTreeSet::from([m("store::client"), m("user")])
    );
    // `crate::store::Store` is defined in client.rs; the string and the test module are no use.
    assert_eq!(targets("user"), BTreeSet::from([m("store::client")]));
    assert!(!graph.contains_key(&m("store::tests")));
    let found = circles(&graph);
    assert_eq!(
        found,
        vec![vec![
            m("store::client"),
            m("store::membership"),
            m("store::client")
        ]]
    );
}

/// Lines of every `.rs` file of the workspace outside tests (`tests/` folders, `tests.rs`).
#[test]
fn no_file_outside_tests_is_over_800_lines() {
    let mut long = Vec::new();
    for (path, text) in rust_files(&root()) {
        let in_tests = path.iter().any(|c| c == "tests") || path.ends_with("tests.rs");
        let lines = text.lines().count();
        if !in_tests && lines > 800 {
            long.push(format!("{} ({lines} lines)", path.display()));
        }
    }
    assert!(
        long.is_empty(),
        "files over 800 lines:\n{}",
        long.join("\n")
    );
}
