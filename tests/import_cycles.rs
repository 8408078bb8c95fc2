//! No import cycles between the library's modules: a module never imports a module that imports
//! it back, directly or through others. Reads `src/**/*.rs`, one node per file module
//! (`src/policy/ttl.rs` is `policy::ttl`), and an edge for every reference that names another
//! module: `crate::…` and `super::…` paths (use trees included), and a parent's `child::…`.
//! `mod x;` declarations are not edges. A child's reference to its parent (`use super::…`) is:
//! a parent that defines what its children use and uses them back is one tangle. A path through
//! a re-export (`pub use`, `pub(crate) use`) resolves to the module that defines the item, so a
//! parent that only declares and re-exports its children (a façade) makes no cycle with them.
//! Code in `#[cfg(test)]` modules and `pub(in …)` visibilities are not edges. Comments and
//! string literals are skipped.
//!
//! The second test checks the same graph one level up, between components: the top-level
//! modules (`config`, `policy`, `upstream`…) and the members of the wings that group them
//! (`protocol::codec`, `observe::metrics`…, listed in `COMPONENTS`). Each file module stands
//! for the component it is in, so a loop through several files of different components
//! (`config` naming `policy`'s types while `policy` reads `config`) is a cycle even when no two
//! files form one. The layering it keeps is in docs/architecture.md ("Module dependencies and
//! lints").
//!
//! `scripts/import-cycles.sh` prints both reports. Cycles that other work is still cutting are
//! listed in `PENDING`: a cycle found must fit inside one of them, so no new one can appear;
//! remove an entry once its cycle is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Strongly connected groups of modules that are known and being cut elsewhere; each found
/// cycle must lie within one of them.
const PENDING: &[&[&str]] = &[];

/// The same for `no_top_level_module_cycles`: groups of top-level modules still in a loop.
const PENDING_TOP_LEVEL: &[&[&str]] = &[];

/// A module's dependency edges: target module -> first `file:line` that made it.
type Edges = BTreeMap<String, String>;

#[test]
fn no_new_import_cycles() {
    let graph = graph(Path::new(env!("CARGO_MANIFEST_DIR")).join("src").as_path());
    let groups = cycles(&graph);
    let report = report(&graph, &groups);
    eprintln!("{report}");
    let unexpected: Vec<&BTreeSet<String>> = groups
        .iter()
        .filter(|g| {
            !PENDING
                .iter()
                .any(|p| g.iter().all(|m| p.contains(&m.as_str())))
        })
        .collect();
    assert!(unexpected.is_empty(), "new import cycles:\n{report}");
}

/// The same check one level up: one node per top-level module (`policy` stands for
/// `src/policy/**`), an edge X -> Y whenever any file of X names a path into Y, `super::`
/// paths included. A cycle here is a layering loop even when no two files form one.
#[test]
fn no_top_level_module_cycles() {
    let files = graph(Path::new(env!("CARGO_MANIFEST_DIR")).join("src").as_path());
    let graph = top_level(&files);
    let groups = cycles(&graph);
    let report = report(&graph, &groups);
    eprintln!("top-level modules: {report}");
    let unexpected: Vec<&BTreeSet<String>> = groups
        .iter()
        .filter(|g| {
            !PENDING_TOP_LEVEL
                .iter()
                .any(|p| g.iter().all(|m| p.contains(&m.as_str())))
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "new import cycles between top-level modules:\n{report}"
    );
}

/// The layers' components that sit inside a wing (a top-level folder grouping components
/// along the data path, `src/lib.rs`): each is a node of its own in the layering check, so a
/// wing may hold components of several layers (`observe::metrics` below `upstream`,
/// `observe::audit` above it) without its folder making a loop. A module outside them is
/// its top-level module's component.
const COMPONENTS: &[&str] = &[
    "commands::classify",
    "commands::server_facts",
    "config::recovery",
    "observe::audit",
    "observe::heap",
    "observe::keyspace",
    "observe::metrics",
    "observe::procfs",
    "observe::slowlog",
    "operations::admin",
    "operations::eviction",
    "operations::fuzzing",
    "operations::mirror",
    "operations::ops",
    "operations::server",
    "operations::setup",
    "operations::startup",
    "operations::tools",
    "operations::workers",
    "policy::ratelimit",
    "policy::script_acl",
    "policy::script_user",
    "protocol::answers",
    "protocol::codec",
    "protocol::error",
    "protocol::pem",
    "protocol::reply",
    "protocol::resp_value",
    "topology::cluster",
    "topology::routes",
    "topology::sentinel",
];

/// The component a module belongs to: the [`COMPONENTS`] entry it is in, else its top-level
/// module.
fn component(module: &str) -> String {
    COMPONENTS
        .iter()
        .find(|c| module == **c || module.starts_with(&format!("{c}::")))
        .map_or_else(
            || module.split("::").next().unwrap_or_default().to_string(),
            |c| c.to_string(),
        )
}

/// The file graph collapsed onto the components (top-level modules, or a wing's members):
/// `policy::ttl -> config::yaml` becomes `policy -> config`, the edge's place the first file
/// that made it (and how many more did). The crate root (lib.rs), which declares every module,
/// is not a node, nor is a wing's own `mod.rs` (it only declares its members).
fn top_level(files: &BTreeMap<String, Edges>) -> BTreeMap<String, Edges> {
    let top = |m: &str| component(m);
    let mut sites: BTreeMap<String, BTreeMap<String, Vec<&str>>> = BTreeMap::new();
    for (module, edges) in files.iter().filter(|(m, _)| !m.is_empty()) {
        let from = sites.entry(top(module)).or_default();
        for (to, at) in edges {
            let to = top(to);
            if !to.is_empty() && to != top(module) {
                from.entry(to).or_default().push(at);
            }
        }
    }
    sites
        .into_iter()
        .map(|(from, edges)| {
            let edges = edges
                .into_iter()
                .map(|(to, at)| {
                    let more = match at.len() - 1 {
                        0 => String::new(),
                        n => format!(" and {n} more file{}", if n == 1 { "" } else { "s" }),
                    };
                    (to, format!("{}{more}", at[0]))
                })
                .collect();
            (from, edges)
        })
        .collect()
}

/// Every file module and its edges.
fn graph(src: &Path) -> BTreeMap<String, Edges> {
    let mut files = Vec::new();
    collect(src, &mut files);
    let modules: BTreeMap<String, PathBuf> = files
        .iter()
        .filter_map(|f| module_of(src, f).map(|m| (m, f.clone())))
        .collect();
    let names: BTreeSet<&str> = modules.keys().map(String::as_str).collect();
    let reexports = reexports(&modules, &names);
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let code = without_visibility_paths(&without_test_modules(&code_of(file)));
        let mut edges = Edges::new();
        let rel = file.strip_prefix(src).unwrap_or(file).display().to_string();
        for (line, path) in references(module, &code, &names) {
            let Some(target) = resolve(&path, &names, &reexports) else {
                continue;
            };
            // A child naming its parent (`use super::…`) counts like any other edge: a parent
            // that defines what its children use and uses them back is one tangle, not parts.
            // Names the parent only re-exports resolve to the sibling that defines them.
            if target != *module && !target.is_empty() {
                edges
                    .entry(target)
                    .or_insert_with(|| format!("src/{rel}:{line}"));
            }
        }
        graph.insert(module.clone(), edges);
    }
    graph
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read src")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `policy::ttl` for `src/policy/ttl.rs`, `policy` for `src/policy/mod.rs`, `""` for lib.rs;
/// `None` for the binary's root, which is another crate.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?.with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    match parts.last().map(String::as_str) {
        Some("main") if parts.len() == 1 => return None,
        Some("lib") if parts.len() == 1 => return Some(String::new()),
        Some("mod") => {
            parts.pop();
        }
        _ => {}
    }
    Some(parts.join("::"))
}

/// The file's text with comments, string and char literals blanked (newlines kept, so line
/// numbers stay true).
fn code_of(file: &Path) -> String {
    let text = std::fs::read_to_string(file).expect("read source");
    let b = text.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut String, s: &[u8]| {
        for &c in s {
            out.push(if c == b'\n' { '\n' } else { ' ' });
        }
    };
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(b"/*") {
            let end = find(rest, b"*/").map_or(rest.len(), |e| e + 2);
            blank(&mut out, &rest[..end]);
            i += end;
        } else if let Some(len) = raw_string(rest) {
            blank(&mut out, &rest[..len]);
            i += len;
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'\'' {
            // A char literal ('x', '\n', b'"'); a lifetime ('a) is left alone.
            let len = if rest.get(1) == Some(&b'\\') {
                rest[2..].iter().position(|&c| c == b'\'').map(|p| p + 3)
            } else if rest.get(2) == Some(&b'\'') {
                Some(3)
            } else {
                None
            };
            match len {
                Some(len) => {
                    blank(&mut out, &rest[..len]);
                    i += len;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let ch = text[i..].chars().next().expect("char");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Length of a raw string literal (`r"…"`, `r#"…"#`, `br#"…"#`) at the start of `s`.
fn raw_string(s: &[u8]) -> Option<usize> {
    let start = if s.starts_with(b"br") {
        2
    } else if s.starts_with(b"r") {
        1
    } else {
        return None;
    };
    let hashes = s[start..].iter().take_while(|&&c| c == b'#').count();
    if s.get(start + hashes) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    let body = start + hashes + 1;
    find(&s[body..], &close).map(|e| body + e + close.len())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The code with each `#[cfg(test)] mod … { … }` blanked (newlines kept): a file's tests use
/// whatever they test, so their paths are not edges of the layering.
fn without_test_modules(code: &str) -> String {
    let mut out = code.to_string();
    let mut from = 0;
    while let Some(found) = out[from..].find("#[cfg(test)]") {
        let start = from + found;
        let after = out[start + "#[cfg(test)]".len()..].trim_start();
        let after = match after.strip_prefix("pub") {
            Some(vis) if vis.starts_with('(') => {
                vis[vis.find(')').map_or(0, |i| i + 1)..].trim_start()
            }
            Some(vis) => vis.trim_start(),
            None => after,
        };
        let is_inline_mod = after.starts_with("mod ")
            && after
                .find(['{', ';'])
                .is_some_and(|i| after.as_bytes()[i] == b'{');
        if !is_inline_mod {
            from = start + 1;
            continue;
        }
        let open = start + out[start..].find('{').unwrap_or(0);
        let mut depth = 0;
        let mut end = out.len();
        for (i, c) in out[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        let blank: String = out[start..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(start..end, &blank);
        from = end;
    }
    out
}

/// The code with each `pub(in path)` blanked: a visibility names a module without using it.
fn without_visibility_paths(code: &str) -> String {
    let mut out = code.to_string();
    while let Some(start) = out.find("pub(in ") {
        let end = start + out[start..].find(')').map_or(out.len() - start, |i| i + 1);
        out.replace_range(start..end, &" ".repeat(end - start));
    }
    out
}

/// Every module's imports and re-exports (`use`, `pub use`, `pub(crate) use`, …): `(module,
/// name)` -> the absolute path it stands for (a child reaches its parent's private imports as
/// `super::name`). A path through a re-export resolves to the module
/// that defines the item, so a child naming a sibling's type through the parent's façade
/// (`super::Policy` for `policy::model::Policy`) is an edge to that sibling, not to the parent.
fn reexports(
    modules: &BTreeMap<String, PathBuf>,
    names: &BTreeSet<&str>,
) -> BTreeMap<(String, String), Vec<String>> {
    let mut map: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (module, file) in modules {
        let code = code_of(file);
        for stmt in code.split(';') {
            let mut stmt = stmt.trim_start();
            // `#[cfg(test)] use …`: the attribute is not part of the path.
            while let Some(attr) = stmt.strip_prefix("#[") {
                let Some(end) = attr.find(']') else { break };
                stmt = attr[end + 1..].trim_start();
            }
            let Some(rest) = ["pub use ", "pub(crate) use ", "pub(super) use ", "use "]
                .iter()
                .find_map(|p| stmt.strip_prefix(p))
            else {
                continue;
            };
            let tree = tokens(rest);
            let mut at = 0;
            let absolute: Vec<Vec<String>> = match tree.first().map(String::as_str) {
                Some("crate" | "self" | "super") => references(module, rest, names)
                    .into_iter()
                    .map(|(_, path)| path)
                    .collect(),
                _ => {
                    // A child's name (`pub use model::Policy`) or an outside crate's.
                    let mut base: Vec<String> = if module.is_empty() {
                        Vec::new()
                    } else {
                        module.split("::").map(str::to_string).collect()
                    };
                    let first = tree.first().cloned().unwrap_or_default();
                    if let Some(bound) = map.get(&(module.clone(), first.clone())) {
                        // A name this module bound earlier (`use crate::config::rules as
                        // config;` then `pub use config::{Mode, …}`).
                        let bound: Vec<String> = bound.clone();
                        at = 2;
                        use_tree(&tree, &mut at, &bound)
                    } else {
                        base.push(first.clone());
                        if !names.contains(base.join("::").as_str()) {
                            continue;
                        }
                        base.pop();
                        use_tree(&tree, &mut at, &base)
                    }
                }
            };
            // `use a::b as c;` binds `c` (an alias inside braces is rare enough to leave).
            let alias = match tree.as_slice() {
                [.., as_, alias] if as_ == "as" && absolute.len() == 1 => Some(alias.clone()),
                _ => None,
            };
            for path in absolute {
                if let Some(last) = alias.as_ref().or(path.last()) {
                    map.insert((module.clone(), last.clone()), path);
                }
            }
        }
    }
    map
}

/// Identifiers and the punctuation use trees are made of.
fn tokens(code: &str) -> Vec<String> {
    tokens_with_lines(code)
        .into_iter()
        .map(|(t, _)| t)
        .collect()
}

/// [`tokens`], each with its 1-based line.
fn tokens_with_lines(code: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut line = 1;
    let mut chars = code.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '\n' {
            line += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let mut end = i + c.len_utf8();
            while let Some(&(j, d)) = chars.peek() {
                if !(d.is_alphanumeric() || d == '_') {
                    break;
                }
                end = j + d.len_utf8();
                chars.next();
            }
            out.push((code[i..end].to_string(), line));
        } else if c == ':' && chars.peek().map(|&(_, d)| d) == Some(':') {
            chars.next();
            out.push(("::".to_string(), line));
        } else if !c.is_whitespace() {
            out.push((c.to_string(), line));
        }
    }
    out
}

/// Parses a use tree at `tokens[*at..]` under `prefix`; returns every path it names.
fn use_tree(tokens: &[String], at: &mut usize, prefix: &[String]) -> Vec<Vec<String>> {
    let mut path = prefix.to_vec();
    loop {
        match tokens.get(*at).map(String::as_str) {
            Some("{") => {
                *at += 1;
                let mut all = Vec::new();
                loop {
                    match tokens.get(*at).map(String::as_str) {
                        Some("}") => {
                            *at += 1;
                            break;
                        }
                        Some(",") => *at += 1,
                        None => break,
                        _ => all.extend(use_tree(tokens, at, &path)),
                    }
                }
                return all;
            }
            Some("*") => {
                *at += 1;
                return vec![path];
            }
            Some(t) if is_ident(t) => {
                if t != "self" {
                    path.push(t.to_string());
                }
                *at += 1;
                if tokens.get(*at).map(String::as_str) == Some("::") {
                    *at += 1;
                    continue;
                }
                if tokens.get(*at).map(String::as_str) == Some("as") {
                    *at += 2;
                }
                return vec![path];
            }
            _ => return vec![path],
        }
    }
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Every module path the code names, as absolute segments, with its line.
fn references(module: &str, code: &str, names: &BTreeSet<&str>) -> Vec<(usize, Vec<String>)> {
    let own: Vec<String> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").map(str::to_string).collect()
    };
    let children: BTreeSet<String> = names
        .iter()
        .filter_map(|n| {
            let rest = if module.is_empty() {
                Some(*n)
            } else {
                n.strip_prefix(module).and_then(|r| r.strip_prefix("::"))
            }?;
            (!rest.is_empty() && !rest.contains("::")).then(|| rest.to_string())
        })
        .collect();
    let mut out = Vec::new();
    let with_lines = tokens_with_lines(code);
    let toks: Vec<String> = with_lines.iter().map(|(t, _)| t.clone()).collect();
    // Inline modules (`mod tests { … }`) open inside the file: `(brace depth, name)`.
    let mut inline: Vec<(usize, String)> = Vec::new();
    let mut depth = 0;
    {
        let mut i = 0;
        while i < toks.len() {
            let line = with_lines[i].1;
            match toks[i].as_str() {
                "{" => depth += 1,
                "}" => {
                    depth -= 1;
                    if inline.last().is_some_and(|(d, _)| *d == depth) {
                        inline.pop();
                    }
                }
                "mod" if toks.get(i + 2).map(String::as_str) == Some("{") => {
                    inline.push((depth, toks[i + 1].clone()));
                }
                _ => {}
            }
            let mut own = own.clone();
            own.extend(inline.iter().map(|(_, name)| name.clone()));
            let children = if inline.is_empty() {
                children.clone()
            } else {
                BTreeSet::new()
            };
            let after_path = i > 0 && toks[i - 1] == "::";
            let next_is_path = toks.get(i + 1).map(String::as_str) == Some("::");
            let base: Option<Vec<String>> = match toks[i].as_str() {
                _ if after_path || !next_is_path => None,
                "crate" => Some(Vec::new()),
                "super" => {
                    let mut base = own.clone();
                    base.pop();
                    // `super::super::…`
                    let mut j = i + 2;
                    while toks.get(j).map(String::as_str) == Some("super")
                        && toks.get(j + 1).map(String::as_str) == Some("::")
                    {
                        base.pop();
                        j += 2;
                    }
                    i = j - 2;
                    Some(base)
                }
                "self" => Some(own.clone()),
                t if children.contains(t) => {
                    let mut base = own.clone();
                    base.push(t.to_string());
                    Some(base)
                }
                _ => None,
            };
            let Some(base) = base else {
                i += 1;
                continue;
            };
            let mut at = if matches!(toks[i].as_str(), "crate" | "super" | "self") {
                i + 2
            } else {
                i + 1
            };
            if at > i + 1 || toks.get(at).map(String::as_str) == Some("::") {
                if toks.get(at).map(String::as_str) == Some("::") {
                    at += 1;
                }
                for path in use_tree(&toks, &mut at, &base) {
                    out.push((line, path));
                }
            } else {
                out.push((line, base));
            }
            i = at.max(i + 1);
        }
    }
    out
}

/// The longest prefix of `path` that is a module; a path through a re-export resolves to the
/// module that defines the item (followed a few steps, as re-exports of re-exports are).
fn resolve(
    path: &[String],
    names: &BTreeSet<&str>,
    reexports: &BTreeMap<(String, String), Vec<String>>,
) -> Option<String> {
    let mut path = path.to_vec();
    for _ in 0..8 {
        let len = (0..=path.len())
            .rev()
            .find(|&len| names.contains(path[..len].join("::").as_str()))?;
        let module = path[..len].join("::");
        let Some(item) = path.get(len) else {
            return Some(module);
        };
        match reexports.get(&(module.clone(), item.clone())) {
            Some(target) if *target != path[..=len] => {
                let mut next = target.clone();
                next.extend_from_slice(&path[len + 1..]);
                path = next;
            }
            _ => return Some(module),
        }
    }
    None
}

/// Groups of two or more modules that reach each other (Tarjan's strongly connected
/// components), each sorted.
fn cycles(graph: &BTreeMap<String, Edges>) -> Vec<BTreeSet<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, Edges>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        groups: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        let graph = s.graph;
        for w in graph[v].keys().filter(|w| graph.contains_key(*w)) {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                group.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                s.groups.push(group);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        groups: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.groups.sort();
    s.groups
}

/// The cycles found, each with the edges inside it and where each edge comes from.
fn report(graph: &BTreeMap<String, Edges>, groups: &[BTreeSet<String>]) -> String {
    let mut out = String::new();
    if groups.is_empty() {
        out.push_str("no import cycles\n");
    }
    for group in groups {
        let names: Vec<&str> = group.iter().map(String::as_str).collect();
        let _ = writeln!(out, "cycle: {}", names.join(", "));
        for from in group {
            for (to, at) in &graph[from] {
                if group.contains(to) {
                    let _ = writeln!(out, "    {from} -> {to}    ({at})");
                }
            }
        }
    }
    out
}
