//! The shape rules of the source tree (issue 22), checked on every crate of the workspace: no
//! two top-level modules of a crate import each other in a circle, and no library, binary or
//! CUDA source file outside tests grows past 800 lines. Both read the files as text (std only).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Source lines a non-test file may hold.
const MAX_LINES: usize = 800;

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates/ above this crate")
        .to_path_buf()
}

/// Every `.rs` file below `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    files_with(dir, &["rs"])
}

/// Every file below `dir` whose extension is one of `extensions`, sorted.
fn files_with(dir: &Path, extensions: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path
                .extension()
                .is_some_and(|e| extensions.iter().any(|x| e == *x))
            {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The crates' `src/` folders.
fn crate_sources() -> Vec<(String, PathBuf)> {
    let mut crates: Vec<(String, PathBuf)> = fs::read_dir(crates_dir())
        .expect("read crates/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("src").is_dir())
        .map(|p| {
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            (name, p.join("src"))
        })
        .collect();
    crates.sort();
    assert!(crates.len() >= 10, "found only {} crates", crates.len());
    crates
}

/// A file's code as the import check reads it: comment lines dropped, and nothing from its
/// first `#[cfg(test)]` on (tests may reach anywhere).
fn code_of(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module a file of `src` belongs to (`None` for the crate root).
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel
        .components()
        .next()?
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (!matches!(name.as_str(), "lib" | "main")).then_some(name)
}

/// The `crate::<module>` edges between a crate's top-level modules.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let is_module =
        |name: &str| src.join(format!("{name}.rs")).is_file() || src.join(name).is_dir();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in rust_files(src) {
        let Some(from) = top_module(src, &file) else {
            continue;
        };
        let code = code_of(&file);
        for (at, _) in code.match_indices("crate::") {
            // `$crate::` in macros and `super::`-relative paths name no top-level edge.
            if code[..at].ends_with('$') {
                continue;
            }
            let rest = &code[at + "crate::".len()..];
            let to: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if to != from && is_module(&to) {
                graph.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    graph
}

/// A circle in `graph`, if any, as the modules along it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

#[test]
fn no_crate_has_an_import_circle_between_its_top_level_modules() {
    let mut circles = Vec::new();
    for (name, src) in crate_sources() {
        if let Some(cycle) = find_cycle(&module_graph(&src)) {
            circles.push(format!("{name}: {}", cycle.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_cycle_finder_finds_a_circle_and_passes_a_tree() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry((*a).to_owned())
                .or_default()
                .insert((*b).to_owned());
        }
        g
    };
    assert_eq!(
        find_cycle(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])),
        None
    );
    let cycle = find_cycle(&graph(&[("a", "b"), ("b", "c"), ("c", "a")])).expect("a circle");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4);
}

#[test]
fn no_source_file_outside_tests_is_over_800_lines() {
    let mut long = Vec::new();
    for (_, src) in crate_sources() {
        let kernels = src.with_file_name("kernels");
        let sources = rust_files(&src)
            .into_iter()
            .chain(files_with(&kernels, &["cu", "cuh"]));
        for file in sources {
            let is_test = file.file_name().is_some_and(|n| n == "tests.rs")
                || file.components().any(|c| c.as_os_str() == "tests");
            let lines = fs::read_to_string(&file)
                .unwrap_or_default()
                .lines()
                .count();
            if !is_test && lines > MAX_LINES {
                long.push(format!("{} ({lines} lines)", file.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}
