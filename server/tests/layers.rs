//! The modules of `server/src` form layers (the table in `lib.rs`): no module may reach a module
//! that reaches it back. Checked from the source text: every `crate::<module>` path outside
//! test code is an edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the top-level modules its non-test code names.
fn edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let relative = path.strip_prefix(&src).expect("under src");
            let top = relative
                .components()
                .next()
                .and_then(|c| c.as_os_str().to_str())
                .map(|c| c.trim_end_matches(".rs").to_owned())
                .expect("a module name");
            if top == "lib" || top == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read module");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            let named = edges.entry(top.clone()).or_default();
            for (at, _) in code.match_indices("crate::") {
                let name: String = code[at + 7..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != top {
                    named.insert(name);
                }
            }
        }
    }
    edges
}

#[test]
fn server_modules_have_no_cycles() {
    let edges = edges();
    assert!(edges.len() > 10, "found the modules: {edges:?}");
    // Depth-first search for a path back to the start.
    for start in edges.keys() {
        let mut stack: Vec<Vec<&str>> = vec![vec![start.as_str()]];
        while let Some(path) = stack.pop() {
            let last = path[path.len() - 1];
            for next in edges.get(last).into_iter().flatten() {
                assert!(
                    next != start,
                    "module cycle: {} -> {next}",
                    path.join(" -> ")
                );
                if !path.contains(&next.as_str()) {
                    let mut longer = path.clone();
                    longer.push(next);
                    stack.push(longer);
                }
            }
        }
    }
}
