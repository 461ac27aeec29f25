//! Layers that only point down (`docs/architecture.md`, "Layers"): every path in `src/`
//! that names another top-level module (`crate::…`, a grouped `crate::{…}`, `super::`
//! out of a top-level file) names one of a lower layer; inside the request core
//! (`src/proxy/`) every sibling a module names is below its own; and inside every
//! folder the files' imports of one another make no circle (a file using its own
//! `mod.rs` aside). Comments, strings and everything under `#[cfg(test)]` are left out;
//! the code after a test module counts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layer of each module, read from the block of the document fenced as `tag`
/// (`layers` for the top-level modules, `proxy-layers` for the request core's).
fn layers_of(doc: &str, tag: &str) -> BTreeMap<String, u32> {
    let fence = format!("```{tag}\n");
    let start = doc
        .find(&fence)
        .unwrap_or_else(|| panic!("docs/architecture.md has a {tag} block"))
        + fence.len();
    let end = start + doc[start..].find("```").expect("the layers block ends");
    let mut out = BTreeMap::new();
    for line in doc[start..end].lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut words = line.split_whitespace();
        let Some(n) = words.next() else { continue };
        let n: u32 = n
            .parse()
            .unwrap_or_else(|_| panic!("bad layer number in {line:?}"));
        for m in words {
            assert!(out.insert(m.to_string(), n).is_none(), "{m} placed twice");
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `text` with comments removed and every string and character literal emptied, so
/// neither a `crate::` in a message nor a brace in a format string is read as code.
fn blank(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let ident = |k: usize| k > 0 && (c[k - 1].is_alphanumeric() || c[k - 1] == '_');
    while i < c.len() {
        let next = c.get(i + 1).copied();
        match c[i] {
            '/' if next == Some('/') => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if next == Some('*') => i = block_comment_end(&c, i),
            '"' => {
                i = string_end(&c, i + 1);
                out.push_str("\"\"");
            }
            'r' if !ident(i) && matches!(next, Some('"' | '#')) && raw_start(&c, i) => {
                i = raw_string_end(&c, i + 1);
                out.push_str("\"\"");
            }
            '\'' => match char_literal_end(&c, i) {
                Some(end) => {
                    i = end;
                    out.push_str("' '");
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            },
            ch => {
                out.push(ch);
                i += 1;
            }
        }
    }
    out
}

/// Just past the (nested) block comment opened at `i`.
fn block_comment_end(c: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    i
}

/// Just past the closing quote of a string whose text starts at `i`.
fn string_end(c: &[char], mut i: usize) -> usize {
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Whether the `r` at `i` opens a raw string (`r"`, `r#"`, …).
fn raw_start(c: &[char], i: usize) -> bool {
    let mut k = i + 1;
    while c.get(k) == Some(&'#') {
        k += 1;
    }
    c.get(k) == Some(&'"')
}

/// Just past the raw string whose hashes start at `i`.
fn raw_string_end(c: &[char], mut i: usize) -> usize {
    let mut hashes = 0;
    while c.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    i += 1;
    while i < c.len() {
        if c[i] == '"' && (1..=hashes).all(|h| c.get(i + h) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

/// Just past the character literal at `i`, or `None` when the quote starts a lifetime.
fn char_literal_end(c: &[char], i: usize) -> Option<usize> {
    match c.get(i + 1) {
        Some('\\') => {
            let close = (i + 2..c.len()).find(|&k| c[k] == '\'')?;
            Some(close + 1)
        }
        Some(_) if c.get(i + 2) == Some(&'\'') => Some(i + 3),
        _ => None,
    }
}

/// The code of a file that counts: [`blank`]ed, and every item under `#[cfg(test)]`
/// (a test module, a test-only function or import) left out.
fn code(text: &str) -> String {
    let text = blank(text);
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        rest = &rest[at + "#[cfg(test)]".len()..];
        let brace = rest.find('{');
        let semi = rest.find(';');
        rest = match (brace, semi) {
            (Some(b), Some(s)) if s < b => &rest[s + 1..],
            (Some(b), _) => &rest[block_end(rest, b)..],
            (None, Some(s)) => &rest[s + 1..],
            (None, None) => "",
        };
    }
    out.push_str(rest);
    out
}

/// Just past the brace that closes the one at `open`.
fn block_end(text: &str, open: usize) -> usize {
    let mut depth = 0;
    for (k, ch) in text[open..].char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + k + 1;
                }
            }
            _ => {}
        }
    }
    text.len()
}

/// The module path of the file at `rel` (relative to `src/`): `a.rs` and `a/mod.rs`
/// are `[a]`, `a/b.rs` is `[a, b]`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// Every path `code` names from the root of the crate, as its segments, for a file of
/// module `own`: `crate::a::B`, each member of a group (`crate::{a::B, c}`), and paths
/// through `super::` and `self::` resolved.
fn paths(code: &str, own: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let starts: Vec<usize> = code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
        .chain(code.match_indices("self::"))
        .map(|(i, _)| i)
        .filter(|&i| {
            !code[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
        })
        .collect();
    for i in starts {
        let (base, rest) = resolve(&code[i..], own);
        expand(rest, base, &mut out);
    }
    out
}

/// The module a path starting at the top of `text` begins from (`crate`, `self`, any
/// number of `super`), and the text after those segments.
fn resolve<'c>(mut text: &'c str, own: &[String]) -> (Vec<String>, &'c str) {
    let mut base = own.to_vec();
    if let Some(rest) = text.strip_prefix("crate::") {
        return (Vec::new(), rest);
    }
    if let Some(rest) = text.strip_prefix("self::") {
        return (base, rest);
    }
    while let Some(rest) = text.strip_prefix("super::") {
        base.pop();
        text = rest;
    }
    (base, text)
}

/// The paths of `text` (after the resolved `base`): one, or one per member of a group.
fn expand(text: &str, mut base: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut rest = text;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..block_end(rest, 0).saturating_sub(2).min(group.len())];
            for member in split_top(inner) {
                let member = member.trim();
                if member == "self" {
                    out.push(base.clone());
                } else if !member.is_empty() {
                    expand(member, base.clone(), out);
                }
            }
            return;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if end == 0 {
            out.push(base);
            return;
        }
        base.push(rest[..end].to_string());
        match rest[end..].strip_prefix("::") {
            Some(more) => rest = more,
            None => {
                out.push(base);
                return;
            }
        }
    }
}

/// The members of a group's text, split at its top-level commas.
fn split_top(inner: &str) -> Vec<&str> {
    let (mut depth, mut from, mut out) = (0, 0, Vec::new());
    for (k, ch) in inner.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&inner[from..k]);
                from = k + 1;
            }
            _ => {}
        }
    }
    out.push(&inner[from..]);
    out
}

/// Every file of `src` with its module path and the crate paths its code names.
fn read_tree(src: &Path) -> Vec<(PathBuf, Vec<String>, Vec<Vec<String>>)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let rel = f.strip_prefix(src).unwrap().to_path_buf();
            let own = module_of(&rel);
            let code = code(&std::fs::read_to_string(&f).unwrap());
            let named = paths(&code, &own);
            (rel, own, named)
        })
        .collect()
}

/// The violations in the source tree at `src` against `layers`.
fn violations(src: &Path, layers: &BTreeMap<String, u32>) -> Vec<String> {
    let mut bad = Vec::new();
    for (rel, own, named) in read_tree(src) {
        let top = &own[0];
        if top == "lib" || top == "main" {
            continue;
        }
        let Some(&mine) = layers.get(top) else {
            bad.push(format!("{}: module `{top}` has no layer", rel.display()));
            continue;
        };
        for m in named.iter().filter_map(|p| p.first()) {
            if m == top {
                continue;
            }
            match layers.get(m) {
                Some(&theirs) if theirs < mine => {}
                Some(&theirs) => bad.push(format!(
                    "{}: `{top}` (layer {mine}) imports `{m}` (layer {theirs})",
                    rel.display()
                )),
                None if is_outside(m) => {}
                None => bad.push(format!("{}: `{m}` has no layer", rel.display())),
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

/// A crate-root name that is not a module of its own: an item `lib.rs` declares.
fn is_outside(name: &str) -> bool {
    name.chars().next().is_some_and(|c| c.is_uppercase())
}

/// The siblings each file of every folder names: `folder → file → siblings`, a file's
/// use of its folder's `mod.rs` left out.
fn sibling_edges(src: &Path) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let tree = read_tree(src);
    let mut folders: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (rel, own, _) in &tree {
        if rel.components().count() > 1 && own.len() == 2 {
            let files = folders.entry(own[0].clone()).or_default();
            files.entry(own[1].clone()).or_default();
        }
    }
    for (_, own, named) in &tree {
        let Some(files) = folders.get_mut(&own[0]) else {
            continue;
        };
        let from = own.get(1).cloned().unwrap_or_else(|| "mod".to_string());
        for p in named {
            let to = match p.as_slice() {
                [top, sib, ..] if *top == own[0] && files.contains_key(sib) => sib,
                _ => continue,
            };
            if *to != from && from != "mod" {
                files.get_mut(&from).unwrap().insert(to.clone());
            }
        }
    }
    folders
}

/// Every circle among the files of one folder, as `folder: a → b → … → a`.
fn inner_circles(src: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for (folder, edges) in sibling_edges(src) {
        let mut seen = BTreeSet::new();
        for start in edges.keys() {
            if let Some(path) = circle_from(start, &edges, &mut Vec::new()) {
                let set: BTreeSet<_> = path.iter().cloned().collect();
                if seen.insert(set) {
                    out.push(format!("{folder}: {}", path.join(" → ")));
                }
            }
        }
    }
    out
}

/// A path from `at` back to the first file of `trail` (a circle), if there is one.
fn circle_from(
    at: &str,
    edges: &BTreeMap<String, BTreeSet<String>>,
    trail: &mut Vec<String>,
) -> Option<Vec<String>> {
    if trail.first().is_some_and(|f| f == at) {
        let mut path = trail.clone();
        path.push(at.to_string());
        return Some(path);
    }
    if trail.iter().any(|f| f == at) {
        return None;
    }
    trail.push(at.to_string());
    for next in edges.get(at).into_iter().flatten() {
        if let Some(p) = circle_from(next, edges, trail) {
            return Some(p);
        }
    }
    trail.pop();
    None
}

/// The violations inside the request core at `src/proxy` against `layers`: a module's
/// paths into the core must name modules of a lower layer; `mod.rs`, the core itself,
/// may import them all.
fn core_violations(src: &Path, layers: &BTreeMap<String, u32>) -> Vec<String> {
    let mut bad = Vec::new();
    for (_, own, named) in read_tree(src) {
        // A file in a folder of the core (`proxy/chain/…`) is that folder's.
        let [top, name, ..] = own.as_slice() else {
            continue;
        };
        if top != "proxy" {
            continue;
        }
        let Some(&mine) = layers.get(name) else {
            bad.push(format!("proxy/{name}.rs: module `{name}` has no layer"));
            continue;
        };
        for p in &named {
            let m = match p.as_slice() {
                [t, m, ..] if t == "proxy" && m != name => m,
                _ => continue,
            };
            match layers.get(m) {
                Some(&theirs) if theirs < mine => {}
                Some(&theirs) => bad.push(format!(
                    "proxy/{name}.rs: `{name}` (layer {mine}) imports `{m}` (layer {theirs})"
                )),
                None => bad.push(format!(
                    "proxy/{name}.rs: `{m}` is not a module below `{name}` (the core's own items stay in mod.rs)"
                )),
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

fn doc() -> (PathBuf, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    (root, doc)
}

#[test]
fn the_request_core_imports_point_down() {
    let (root, doc) = doc();
    let bad = core_violations(&root.join("src"), &layers_of(&doc, "proxy-layers"));
    assert!(
        bad.is_empty(),
        "imports inside src/proxy against its layers:\n{}",
        bad.join("\n")
    );
}

#[test]
fn every_import_points_down() {
    let (root, doc) = doc();
    let bad = violations(&root.join("src"), &layers_of(&doc, "layers"));
    assert!(
        bad.is_empty(),
        "imports against the layers:\n{}",
        bad.join("\n")
    );
}

#[test]
fn no_folder_has_a_circle_inside() {
    let (root, _) = doc();
    let circles = inner_circles(&root.join("src"));
    assert!(
        circles.is_empty(),
        "circles inside modules:\n{}",
        circles.join("\n")
    );
}

/// A throwaway tree under the temporary directory, removed when dropped.
struct Tree(PathBuf);

impl Tree {
    fn new(tag: &str, files: &[(&str, &str)]) -> Tree {
        let dir = std::env::temp_dir().join(format!("fulcrum-layers-{tag}-{}", std::process::id()));
        for (path, text) in files {
            let p = dir.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        Tree(dir)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_reversed_import_is_caught_in_every_form() {
    let high = "// crate::low::nothing in a comment\nuse crate::low::X;\nconst S: &str = \"crate::top::in_a_string {\";\n#[cfg(test)]\nmod tests { use crate::top; }\n";
    let tree = Tree::new(
        "reversed",
        &[
            ("low/mod.rs", "mod inner;\nuse crate::{clock::Now, high::Thing};\n"),
            (
                "low/inner.rs",
                "#[cfg(test)]\nmod tests { fn f() { let _ = '{'; } }\nfn later() { super::super::high::go(); }\n",
            ),
            ("top.rs", "use super::{high::Y};\n"),
            ("high.rs", high),
            ("clock.rs", ""),
        ],
    );
    let layers = layers_of(
        "```layers\n3 top\n2 high # up\n1 low\n0 clock\n```\n",
        "layers",
    );
    assert_eq!(
        violations(&tree.0, &layers),
        [
            "low/inner.rs: `low` (layer 1) imports `high` (layer 2)",
            "low/mod.rs: `low` (layer 1) imports `high` (layer 2)",
        ],
        "the grouped import and the one past a test module, and nothing in a comment, a string or a test"
    );
}

#[test]
fn a_circle_inside_a_folder_is_caught() {
    let tree = Tree::new(
        "circle",
        &[
            ("m/mod.rs", "mod a;\nmod b;\nmod c;\nuse self::a::A;\n"),
            ("m/a.rs", "use super::{b::B, X};\n"),
            ("m/b.rs", "fn f() { crate::m::c::go(); }\n"),
            ("m/c.rs", "use super::super::m::a::A;\n"),
        ],
    );
    assert_eq!(inner_circles(&tree.0), ["m: a → b → c → a"]);
}
