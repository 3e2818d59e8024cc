//! The modules of the workspace's library crates form layers, checked from the source text:
//!
//! - In every folder of `server/src`, `snapshots/src` and `journal/src` (the crate root
//!   included), no file or subfolder names a sibling that names it back, directly or through
//!   others.
//! - In `server/src`, the top-level modules keep the direction of the layer table in `lib.rs`
//!   (its `| layer | modules |` rows, top to bottom): a module names only modules of its own
//!   layer or of a layer below. Every top-level module is in the table, once.
//!
//! An edge is a path in code (comments and `#[cfg(test)]` code left out) that names another
//! module: `crate::a::b`, `super::b`, `self::b`, or an item that the folder's `mod.rs` (or
//! `lib.rs`) re-exports from a sibling (`pub use b::Item;` makes `super::Item` an edge to `b`).
//!
//! One file past 500 lines: the checker and its own tests on planted graphs belong together.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One source file of a crate.
#[derive(Debug)]
struct SourceFile {
    /// Its module path from the crate root: `lib.rs` is `[]`, `runtime/mod.rs` is `["runtime"]`,
    /// `runtime/task.rs` is `["runtime", "task"]`.
    module: Vec<String>,
    /// Its whole text.
    text: String,
}

/// A folder's dependency graph among its children: child → the siblings it names.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every `.rs` file under `src`, test-only files (declared `#[cfg(test)] mod x;`) left out.
fn read_crate(src: &Path) -> Vec<SourceFile> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("read a source folder")
            .map(|entry| entry.expect("a folder entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let relative = path.strip_prefix(src).expect("under src");
            let mut module: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_str().expect("UTF-8 names").to_owned())
                .collect();
            let last = module.pop().expect("a file name");
            let stem = last.trim_end_matches(".rs");
            if !matches!(stem, "lib" | "main" | "mod") {
                module.push(stem.to_owned());
            }
            if stem == "main" {
                continue; // the binary, not the library
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            files.push(SourceFile { module, text });
        }
    }
    without_test_modules(files)
}

/// Drops the files of modules declared `#[cfg(test)]` (and everything under them).
fn without_test_modules(files: Vec<SourceFile>) -> Vec<SourceFile> {
    let mut test_only: Vec<Vec<String>> = Vec::new();
    for file in &files {
        for (at, _) in file.text.match_indices("#[cfg(test)]") {
            let rest = file.text[at + "#[cfg(test)]".len()..].trim_start();
            let rest = rest.strip_prefix("pub(crate) ").unwrap_or(rest);
            if let Some(rest) = rest.strip_prefix("mod ") {
                let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
                if rest[name.len()..].starts_with(';') {
                    let mut module = file.module.clone();
                    module.push(name);
                    test_only.push(module);
                }
            }
        }
    }
    files
        .into_iter()
        .filter(|file| !test_only.iter().any(|t| file.module.starts_with(t)))
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The code of a file: comment lines dropped, and every `#[cfg(test)]` item (a `mod tests { … }`
/// runs to the end of the file; a `#[cfg(test)] mod tests;` line is only that line).
fn code(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect();
    let mut text = lines.join("\n");
    while let Some(at) = text.find("#[cfg(test)]") {
        let rest = &text[at..];
        let braces = rest.find('{');
        let end = match rest.find(';') {
            Some(semicolon) if braces.is_none_or(|open| semicolon < open) => at + semicolon + 1,
            _ => match braces {
                Some(open) if !rest[..open].contains("mod ") => {
                    at + block_end(&rest[open..]) + open
                }
                _ => text.len(),
            },
        };
        text.replace_range(at..end, "");
    }
    text
}

/// The length of the brace block `text` starts with (to the end if it never closes).
fn block_end(text: &str) -> usize {
    let mut depth = 0usize;
    for (at, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return at + 1;
                }
            }
            _ => {}
        }
    }
    text.len()
}

/// Every path `code` names, absolute from the crate root: `crate::a::b`, and `super::`/`self::`
/// paths resolved from `module`; a brace group (`super::{a::X, b}`) names each of its paths.
fn paths(module: &[String], code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(start) {
            if code[..at].chars().next_back().is_some_and(is_ident) {
                continue; // `my_crate::`, `foo_super::`
            }
            let base: Vec<String> = match start {
                "crate::" => Vec::new(),
                "super::" => module[..module.len().saturating_sub(1)].to_vec(),
                _ => module.to_vec(),
            };
            use_tree(base, &code[at + start.len()..], &mut found);
        }
    }
    found
}

/// Reads one path (or brace group of paths) at the start of `rest`, below `base`, into `found`;
/// returns the length it read.
fn use_tree(mut base: Vec<String>, rest: &str, found: &mut Vec<Vec<String>>) -> usize {
    let mut read = 0;
    loop {
        let tail = &rest[read..];
        if let Some(group) = tail.strip_prefix('{') {
            read += 1;
            let mut inner = 0;
            loop {
                let item = group[inner..].trim_start();
                inner = group.len() - item.len();
                if item.is_empty() || item.starts_with('}') {
                    return read + inner + usize::from(!item.is_empty());
                }
                inner += use_tree(base.clone(), item, found);
                let after = group[inner..].trim_start();
                inner = group.len() - after.len();
                if after.starts_with(',') {
                    inner += 1;
                } else if !after.starts_with('}') {
                    // ` as name`, or something that is no use tree: skip to the next item.
                    match after.find([',', '}']) {
                        Some(at) => inner += at + usize::from(after[at..].starts_with(',')),
                        None => return rest.len(),
                    }
                }
            }
        }
        let name: String = tail.chars().take_while(|c| is_ident(*c)).collect();
        if name.is_empty() {
            break;
        }
        read += name.len();
        if name == "super" {
            base.pop();
        } else if name != "self" {
            base.push(name);
        }
        match rest[read..].strip_prefix("::") {
            Some(_) => read += 2,
            None => break,
        }
    }
    found.push(base);
    read
}

/// What a folder's own file (`mod.rs`, `lib.rs`) re-exports: item name → the child it comes
/// from. Reads `use child::…;` statements, with any visibility.
fn reexports(text: &str, children: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let code = code(text);
    for statement in code.split(';') {
        let statement = statement.trim();
        let Some(at) = statement.find("use ") else {
            continue;
        };
        let prefix = statement[..at].trim();
        if !(prefix.is_empty() || prefix.starts_with("pub")) || prefix.contains('\n') {
            continue;
        }
        let tree = statement[at + 4..].trim();
        let tree = tree.strip_prefix("self::").unwrap_or(tree);
        let child: String = tree.chars().take_while(|c| is_ident(*c)).collect();
        if !children.contains(&child) {
            continue;
        }
        for leaf in tree.split(['{', '}', ',']) {
            let leaf = leaf.trim();
            let name = match leaf.split_once(" as ") {
                Some((_, alias)) => alias.trim(),
                None => leaf.rsplit("::").next().unwrap_or_default(),
            };
            if !name.is_empty() && name != "self" && name != "*" && name != child {
                names.insert(name.to_owned(), child.clone());
            }
        }
    }
    names
}

/// For every folder (by module path) its graph among its children.
fn folder_graphs(files: &[SourceFile]) -> BTreeMap<Vec<String>, Graph> {
    // The children of each folder: every module one level below it.
    let mut children: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        for depth in 0..file.module.len() {
            children
                .entry(file.module[..depth].to_vec())
                .or_default()
                .insert(file.module[depth].clone());
        }
    }
    let folder_text: BTreeMap<&[String], &str> = files
        .iter()
        .filter(|file| children.contains_key(&file.module))
        .map(|file| (file.module.as_slice(), file.text.as_str()))
        .collect();
    let reexported: BTreeMap<&Vec<String>, BTreeMap<String, String>> = children
        .iter()
        .map(|(folder, names)| {
            let text = folder_text.get(folder.as_slice()).copied().unwrap_or("");
            (folder, reexports(text, names))
        })
        .collect();

    let mut graphs: BTreeMap<Vec<String>, Graph> = BTreeMap::new();
    for (folder, names) in &children {
        let graph = graphs.entry(folder.clone()).or_default();
        for name in names {
            graph.entry(name.clone()).or_default();
        }
    }
    for file in files {
        let code = code(&file.text);
        let named = paths(&file.module, &code);
        // The file belongs to child `file.module[depth]` of every folder above it.
        for depth in 0..file.module.len() {
            let folder = &file.module[..depth];
            let from = &file.module[depth];
            for path in &named {
                if path.len() <= depth || path[..depth] != *folder {
                    continue;
                }
                let next = &path[depth];
                let to = if children[folder].contains(next) {
                    next.clone()
                } else if let Some(owner) = reexported[&folder.to_vec()].get(next) {
                    owner.clone()
                } else {
                    continue; // an item of the folder's own file
                };
                if to != *from {
                    graphs
                        .get_mut(folder)
                        .expect("every folder has a graph")
                        .entry(from.clone())
                        .or_default()
                        .insert(to);
                }
            }
        }
    }
    graphs
}

/// A path of `graph` that comes back to where it started, if any.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    for start in graph.keys() {
        let mut stack: Vec<Vec<&str>> = vec![vec![start.as_str()]];
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        while let Some(path) = stack.pop() {
            let last = path[path.len() - 1];
            for next in graph.get(last).into_iter().flatten() {
                if next == start {
                    let mut cycle: Vec<String> = path.iter().map(|s| (*s).to_owned()).collect();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                if seen.insert(next.as_str()) {
                    let mut longer = path.clone();
                    longer.push(next);
                    stack.push(longer);
                }
            }
        }
    }
    None
}

/// The rows of the `| layer | modules |` table in a crate root's docs, top to bottom: each
/// layer's name and the top-level modules its cell links (`` [`name`] `` or
/// `` [`name::item`] ``).
fn layer_table(lib: &str) -> Vec<(String, Vec<String>)> {
    let mut rows = Vec::new();
    let mut inside = false;
    for line in lib.lines() {
        let Some(line) = line.strip_prefix("//!") else {
            continue;
        };
        let line = line.trim();
        if line.starts_with("| layer | modules |") {
            inside = true;
            continue;
        }
        if !inside || line.starts_with("|---") {
            continue;
        }
        if !line.starts_with('|') {
            if !rows.is_empty() {
                break;
            }
            continue;
        }
        let mut cells = line.trim_matches('|').splitn(2, '|');
        let layer = cells.next().unwrap_or_default().trim().to_owned();
        let cell = cells.next().unwrap_or_default();
        let modules = cell
            .split("[`")
            .skip(1)
            .map(|link| {
                link.chars()
                    .take_while(|c| is_ident(*c))
                    .collect::<String>()
            })
            .fold(Vec::new(), |mut modules, name| {
                if !modules.contains(&name) {
                    modules.push(name);
                }
                modules
            });
        rows.push((layer, modules));
    }
    rows
}

/// The edges of `graph` that point up the table: `(from, its layer, to, its layer)`. Modules
/// the table does not list are an error of their own (see [`unlisted`]).
fn upward<'a>(
    graph: &'a Graph,
    table: &'a [(String, Vec<String>)],
) -> Vec<(&'a str, &'a str, &'a str, &'a str)> {
    let rank = |module: &str| {
        table
            .iter()
            .position(|(_, modules)| modules.iter().any(|m| m == module))
    };
    let mut up = Vec::new();
    for (from, named) in graph {
        for to in named {
            if let (Some(a), Some(b)) = (rank(from), rank(to)) {
                if b < a {
                    up.push((
                        from.as_str(),
                        table[a].0.as_str(),
                        to.as_str(),
                        table[b].0.as_str(),
                    ));
                }
            }
        }
    }
    up
}

/// The modules of `graph` that the table lists not once.
fn unlisted(graph: &Graph, table: &[(String, Vec<String>)]) -> Vec<(String, usize)> {
    graph
        .keys()
        .map(|module| {
            let rows = table
                .iter()
                .filter(|(_, modules)| modules.contains(module))
                .count();
            (module.clone(), rows)
        })
        .filter(|(_, rows)| *rows != 1)
        .collect()
}

fn crate_src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src")
}

fn assert_no_folder_cycles(krate: &str) {
    let files = read_crate(&crate_src(krate));
    assert!(files.len() > 10, "found the files of {krate}: {files:?}");
    let cycles: Vec<String> = folder_graphs(&files)
        .iter()
        .filter_map(|(folder, graph)| {
            let cycle = find_cycle(graph)?;
            Some(format!(
                "{krate}/src/{}: {}",
                folder.join("/"),
                cycle.join(" -> ")
            ))
        })
        .collect();
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

#[test]
fn server_folders_have_no_cycles() {
    assert_no_folder_cycles("server");
}

#[test]
fn snapshots_folders_have_no_cycles() {
    assert_no_folder_cycles("snapshots");
}

#[test]
fn journal_folders_have_no_cycles() {
    assert_no_folder_cycles("journal");
}

#[test]
fn server_modules_follow_the_layer_table() {
    let src = crate_src("server");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("read lib.rs");
    let table = layer_table(&lib);
    assert!(table.len() > 3, "read the layer table of lib.rs: {table:?}");
    let graphs = folder_graphs(&read_crate(&src));
    let top = &graphs[&Vec::new()];
    assert!(top.len() > 10, "found the modules: {top:?}");
    let unlisted = unlisted(top, &table);
    assert!(
        unlisted.is_empty(),
        "modules the layer table of lib.rs lists not exactly once (module, rows): {unlisted:?}"
    );
    let up = upward(top, &table);
    assert!(
        up.is_empty(),
        "modules that name a layer above their own (module, layer, names, layer): {up:?}"
    );
}

/// The checker itself, on small in-memory crates: each planted fault is found.
mod checker {
    use super::*;

    fn file(module: &str, text: &str) -> SourceFile {
        SourceFile {
            module: module
                .split('/')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            text: text.to_owned(),
        }
    }

    fn graph(edges: &[(&str, &str)]) -> Graph {
        let mut graph = Graph::new();
        for (from, to) in edges {
            graph
                .entry((*from).to_owned())
                .or_default()
                .insert((*to).to_owned());
            graph.entry((*to).to_owned()).or_default();
        }
        graph
    }

    #[test]
    fn finds_a_planted_cycle_and_none_in_a_chain() {
        let chain = graph(&[("a", "b"), ("b", "c"), ("a", "c")]);
        assert_eq!(find_cycle(&chain), None);
        let cyclic = graph(&[("a", "b"), ("b", "c"), ("c", "a")]);
        let cycle = find_cycle(&cyclic).expect("the planted cycle");
        assert_eq!(cycle.first(), cycle.last());
        assert_eq!(cycle.len(), 4, "{cycle:?}");
    }

    #[test]
    fn sees_sibling_edges_through_super_crate_and_reexports() {
        let files = vec![
            file("", "mod log;\nmod hub;\n"),
            file("hub", "use crate::log::Entry;\n"),
            file(
                "log",
                "pub use gather::Gathered;\nmod gather;\nmod stream;\n",
            ),
            // gather -> stream by path, stream -> gather through the parent's re-export.
            file("log/gather", "use super::stream::Publisher;\n"),
            file(
                "log/stream",
                "// super::hub in a comment is no edge\nuse super::Gathered;\n",
            ),
        ];
        let graphs = folder_graphs(&files);
        let log = &graphs[&vec!["log".to_owned()]];
        assert!(log["gather"].contains("stream"), "{log:?}");
        assert!(log["stream"].contains("gather"), "{log:?}");
        assert!(find_cycle(log).is_some());
        let top = &graphs[&Vec::new()];
        assert_eq!(top["hub"], BTreeSet::from(["log".to_owned()]));
        assert!(top["log"].is_empty(), "{top:?}");
        assert_eq!(find_cycle(top), None);
    }

    #[test]
    fn reads_brace_groups() {
        let module = vec!["runtime".to_owned(), "task".to_owned()];
        let found = paths(
            &module,
            "use super::{guest::Guest, handle::{self, Handle}, Task as T};\nuse crate::log::{Entry};",
        );
        let names: Vec<String> = found.iter().map(|p| p.join("::")).collect();
        assert_eq!(
            names,
            [
                "log::Entry",
                "runtime::guest::Guest",
                "runtime::handle",
                "runtime::handle::Handle",
                "runtime::Task"
            ]
        );
    }

    #[test]
    fn leaves_test_code_out() {
        let files = without_test_modules(vec![
            file("", "mod a;\nmod b;\n#[cfg(test)]\nmod props;\n"),
            file(
                "a",
                "#[cfg(test)]\nuse crate::b::Y;\n#[cfg(test)]\nfn g() { crate::b::Z }\npub fn f() {}\n#[cfg(test)]\nmod tests { use crate::b::X; }\n",
            ),
            file("b", "use crate::a::f;\n"),
            file("props", "use crate::b::X;\nuse crate::a::f;\n"),
        ]);
        let graphs = folder_graphs(&files);
        let top = &graphs[&Vec::new()];
        assert!(!top.contains_key("props"), "{top:?}");
        assert_eq!(find_cycle(top), None, "{top:?}");
    }

    #[test]
    fn finds_an_edge_up_the_layer_table() {
        let lib = "//! | layer | modules |\n//! |---|---|\n//! | top | [`serve`] — x; [`http::admin`] |\n//! | low | [`hub`] |\n";
        let table = layer_table(lib);
        assert_eq!(
            table,
            vec![
                (
                    "top".to_owned(),
                    vec!["serve".to_owned(), "http".to_owned()]
                ),
                ("low".to_owned(), vec!["hub".to_owned()]),
            ]
        );
        let down = graph(&[("serve", "hub"), ("serve", "http")]);
        assert!(upward(&down, &table).is_empty());
        let up = graph(&[("hub", "http")]);
        assert_eq!(upward(&up, &table), vec![("hub", "low", "http", "top")]);
        assert_eq!(
            unlisted(&graph(&[("hub", "cli")]), &table),
            vec![("cli".to_owned(), 0)]
        );
    }
}
