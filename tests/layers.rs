//! Layers that only point down (`docs/architecture.md`, "Layers"): every `crate::` path
//! in `src/` names a module of a lower layer than its own, and inside the request core
//! (`src/proxy/`) every `super::` path names a module below its own.

use std::collections::BTreeMap;
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

/// The code of a file that counts: comments and the tests beside the code left out.
fn code(text: &str) -> String {
    let test_mod = ["#[cfg(test)]\nmod ", "#[cfg(test)]\npub(crate) mod "]
        .iter()
        .filter_map(|m| text.find(m))
        .min();
    let text = match test_mod {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The layer of each top-level module.
fn layers(doc: &str) -> BTreeMap<String, u32> {
    layers_of(doc, "layers")
}

/// Every module named after `crate::` in `code`.
fn imports(code: &str) -> Vec<&str> {
    after(code, "crate::")
}

/// Every path segment named after `prefix` in `code`.
fn after<'c>(code: &'c str, prefix: &str) -> Vec<&'c str> {
    code.match_indices(prefix)
        .filter(|(i, _)| {
            // Not a suffix of a longer path segment (`my_crate::`).
            !code[..*i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
        .map(|(i, _)| {
            let rest = &code[i + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|m| !m.is_empty())
        .collect()
}

/// The violations in the source tree at `src` against `layers`.
fn violations(src: &Path, layers: &BTreeMap<String, u32>) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut bad = Vec::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let top = top.trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let Some(&own) = layers.get(&top) else {
            bad.push(format!("{}: module `{top}` has no layer", rel.display()));
            continue;
        };
        let text = std::fs::read_to_string(&f).unwrap();
        for m in imports(&code(&text)) {
            if m == top {
                continue;
            }
            match layers.get(m) {
                Some(&theirs) if theirs < own => {}
                Some(&theirs) => bad.push(format!(
                    "{}: `{top}` (layer {own}) imports `{m}` (layer {theirs})",
                    rel.display()
                )),
                None => bad.push(format!("{}: `{m}` has no layer", rel.display())),
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

/// The violations inside the request core at `dir` (`src/proxy`) against `layers`: a
/// module's `super::` and `crate::proxy::` paths must name modules of a lower layer;
/// `mod.rs`, the core itself, may import them all.
fn core_violations(dir: &Path, layers: &BTreeMap<String, u32>) -> Vec<String> {
    let mut bad = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let f = e.unwrap().path();
        let name = f.file_stem().unwrap().to_string_lossy().to_string();
        if name == "mod" || f.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let Some(&own) = layers.get(&name) else {
            bad.push(format!("proxy/{name}.rs: module `{name}` has no layer"));
            continue;
        };
        let code = code(&std::fs::read_to_string(&f).unwrap());
        let mut named = after(&code, "super::");
        named.extend(after(&code, "crate::proxy::"));
        for m in named {
            match layers.get(m) {
                Some(&theirs) if theirs < own => {}
                Some(&theirs) => bad.push(format!(
                    "proxy/{name}.rs: `{name}` (layer {own}) imports `{m}` (layer {theirs})"
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

#[test]
fn the_request_core_imports_point_down() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let bad = core_violations(&root.join("src/proxy"), &layers_of(&doc, "proxy-layers"));
    assert!(
        bad.is_empty(),
        "imports inside src/proxy against its layers:\n{}",
        bad.join("\n")
    );
}

#[test]
fn every_import_points_down() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let layers = layers(&doc);
    let bad = violations(&root.join("src"), &layers);
    assert!(
        bad.is_empty(),
        "imports against the layers:\n{}",
        bad.join("\n")
    );
}

#[test]
fn a_reversed_import_is_caught() {
    let dir = std::env::temp_dir().join(format!("fulcrum-layers-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("low")).unwrap();
    std::fs::write(dir.join("low/mod.rs"), "use crate::high::Thing;\n").unwrap();
    std::fs::write(
        dir.join("high.rs"),
        "// crate::nowhere in a comment\nuse crate::low::X;\n#[cfg(test)]\nmod tests { use crate::top; }\n",
    )
    .unwrap();
    let layers = layers("```layers\n1 high # up\n0 low\n```\n");
    let bad = violations(&dir, &layers);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        bad,
        ["low/mod.rs: `low` (layer 0) imports `high` (layer 1)"],
        "the upward import and nothing else"
    );
}
