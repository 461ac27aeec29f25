//! The config file (TOML): every key of the options table, the `[health]` table and the
//! `[[backends]]` list, each value checked with its line, every problem collected (so
//! `fulcrum check` lists them all, as `nginx -t` does).
//!
//! The file is read with `toml`'s spanned document model (`DeTable`), so every key and
//! value, however deeply nested, keeps its position for the error line.

use std::path::Path;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::options::{self, FileType, Opt};
use super::values::{backend_spec, parse_weight};
use super::{BackendSpec, ConfigError, Settings};
use crate::config::file_pools::{self, Layout};

/// Keys of a `[[backends]]` entry.
const BACKEND_KEYS: [&str; 5] = ["url", "weight", "name", "backup", "max_conns"];

/// Applies a config file's text on top of `s`; returns every problem found.
pub(crate) fn apply_file(s: &mut Settings, path: &Path, text: &str) -> Vec<ConfigError> {
    let mut c = Collector {
        file: path.display().to_string(),
        text,
        errors: Vec::new(),
    };
    apply_document(s, &mut c);
    // In the order of the file, as a reader goes through it.
    c.errors.sort_by_key(|(line, _)| *line);
    c.errors.into_iter().map(|(_, e)| e).collect()
}

/// Applies the whole document, or records why it cannot be read.
fn apply_document(s: &mut Settings, c: &mut Collector<'_>) {
    let text = c.text;
    let doc = match DeTable::parse(text) {
        Ok(doc) => doc,
        Err(e) => {
            let at = e.span().map_or(0, |r| r.start);
            c.push(at, None, e.message().trim().replace('\n', " "));
            return;
        }
    };
    let mut layout = Layout::default();
    for (key, value) in doc.get_ref() {
        let at = key.span().start;
        match key.get_ref().as_ref() {
            t @ ("health" | "outlier" | "sticky") => apply_table(s, c, t, value),
            "backends" => {
                layout.backends_at = Some(at);
                if let Some(list) = read_backends(c, value, "backends") {
                    s.backends = list;
                }
            }
            "discover" => {
                layout.discover_at = Some(at);
                s.discover = read_discover(c, value, "discover");
            }
            "tls" => super::tls::read_table(s, c, value),
            "pools" => file_pools::apply_pools(s, c, value, &mut layout),
            "routes" => file_pools::apply_routes(s, c, value, &mut layout),
            k => match options::find(k) {
                Some(o) => apply_value(s, c, o, k, value),
                None => c.push(at, None, unknown_key(k)),
            },
        }
    }
    file_pools::check_layout(c, &layout);
}

fn unknown_key(key: &str) -> String {
    let mut valid: Vec<&str> = options::OPTIONS.iter().map(|o| o.key).collect();
    valid.extend([
        "health", "outlier", "sticky", "tls", "backends", "discover", "pools", "routes",
    ]);
    format!("unknown key '{key}' (valid: {})", valid.join(", "))
}

/// A table of settings (`[health]`, `[outlier]`, `[sticky]`): its options under their short keys.
fn apply_table(
    s: &mut Settings,
    c: &mut Collector<'_>,
    table_name: &str,
    value: &Spanned<DeValue<'_>>,
) {
    let Some(table) = value.get_ref().as_table() else {
        c.push(
            value.span().start,
            Some(table_name),
            "expected a table".into(),
        );
        return;
    };
    for (key, v) in table {
        let k = key.get_ref().as_ref();
        let shown = format!("{table_name}.{k}");
        match options::find_in(table_name, k) {
            Some(o) => apply_value(s, c, o, &shown, v),
            None => {
                let msg = options::unknown_table_key(table_name, &shown);
                c.push(key.span().start, None, msg);
            }
        }
    }
}

/// A `discover` table (`shown` is where it is: `discover` or `pools.discover`), its
/// values as strings; `None` (and the problem recorded) when it is not good.
pub(super) fn read_discover(
    c: &mut Collector<'_>,
    value: &Spanned<DeValue<'_>>,
    shown: &str,
) -> Option<super::DiscoverSpec> {
    let Some(table) = value.get_ref().as_table() else {
        let msg = "expected a table such as { dns = \"api.internal:8080\" }".into();
        c.push(value.span().start, Some(shown), msg);
        return None;
    };
    let mut pairs = Vec::new();
    for (key, v) in table {
        let k = key.get_ref().as_ref();
        let text = c.text_of(v, FileType::Str, &format!("{shown}.{k}"))?;
        pairs.push((k, text));
    }
    match super::DiscoverSpec::from_pairs(pairs) {
        Ok(spec) => Some(spec),
        Err(e) => {
            c.push(value.span().start, Some(shown), e);
            None
        }
    }
}

/// A `[[backends]]` list (`key` is where it is: `backends` or `pools.backends`);
/// `None` when it is not a list at all.
pub(super) fn read_backends(
    c: &mut Collector<'_>,
    value: &Spanned<DeValue<'_>>,
    key: &str,
) -> Option<Vec<BackendSpec>> {
    let Some(list) = value.get_ref().as_array() else {
        let msg = format!("expected a list of tables ([[{key}]])");
        c.push(value.span().start, Some(key), msg);
        return None;
    };
    let mut out = Vec::new();
    for entry in list {
        let Some(table) = entry.get_ref().as_table() else {
            c.push(entry.span().start, Some(key), "expected a table".into());
            continue;
        };
        if let Some(spec) = read_backend(c, entry.span().start, table, key) {
            out.push(spec);
        }
    }
    Some(out)
}

/// One `[[backends]]` entry.
fn read_backend(
    c: &mut Collector<'_>,
    at: usize,
    table: &DeTable<'_>,
    prefix: &str,
) -> Option<BackendSpec> {
    let field = |k: &str| table.iter().find(|(key, _)| key.get_ref().as_ref() == k);
    for (key, _) in table {
        if !BACKEND_KEYS.contains(&key.get_ref().as_ref()) {
            let msg = format!(
                "unknown key '{prefix}.{}' (valid: url, weight, name, backup, max_conns)",
                key.get_ref()
            );
            c.push(key.span().start, None, msg);
        }
    }
    let Some((_, url)) = field("url") else {
        c.push(at, Some(prefix), "missing field 'url'".into());
        return None;
    };
    let url_text = c.text_of(url, FileType::Str, &format!("{prefix}.url"))?;
    let weight = match field("weight") {
        Some((_, w)) => {
            let key = format!("{prefix}.weight");
            let t = c.text_of(w, FileType::Int, &key)?;
            match parse_weight(&t) {
                Ok(w) => Some(w),
                Err(e) => {
                    c.push(w.span().start, Some(&key), e);
                    return None;
                }
            }
        }
        None => None,
    };
    let name = match field("name") {
        Some((_, n)) => Some(c.text_of(n, FileType::Str, &format!("{prefix}.name"))?),
        None => None,
    };
    let backup = match field("backup") {
        Some((_, b)) => match b.get_ref() {
            DeValue::Boolean(b) => *b,
            _ => {
                let key = format!("{prefix}.backup");
                c.push(b.span().start, Some(&key), "expected true or false".into());
                return None;
            }
        },
        None => false,
    };
    let max_conns = match field("max_conns") {
        Some((_, n)) => {
            let key = format!("{prefix}.max_conns");
            let t = match n.get_ref() {
                DeValue::String(s) => s.to_string(),
                _ => c.text_of(n, FileType::Int, &key)?,
            };
            match super::parse_max_conns(&t) {
                Ok(n) => n,
                Err(e) => {
                    c.push(n.span().start, Some(&key), e);
                    return None;
                }
            }
        }
        None => 0,
    };
    match backend_spec(&url_text, weight, name.as_deref()) {
        Ok(mut spec) => {
            spec.backup = backup;
            spec.max_conns = max_conns;
            Some(spec)
        }
        Err(e) => {
            c.push(url.span().start, Some(&format!("{prefix}.url")), e);
            None
        }
    }
}

/// One option's value, written as `key` in the file.
pub(super) fn apply_value(
    s: &mut Settings,
    c: &mut Collector<'_>,
    o: &Opt,
    key: &str,
    value: &Spanned<DeValue<'_>>,
) {
    if let Some(text) = c.text_of(value, o.file_type, key) {
        if let Err(e) = (o.set)(s, &text) {
            c.push(value.span().start, Some(key), e);
        }
    }
}

/// A table of plain values as `key=value` pairs joined with commas (what a
/// [`FileType::Pairs`] option parses); `None` when a value is a table or a list, or
/// holds a comma.
fn pairs_text(t: &DeTable<'_>) -> Option<String> {
    let mut out = Vec::new();
    for (k, v) in t {
        let text = match v.get_ref() {
            DeValue::String(s) => s.to_string(),
            DeValue::Integer(i) => i.as_str().to_string(),
            DeValue::Float(f) => f.as_str().to_string(),
            DeValue::Boolean(b) => b.to_string(),
            _ => return None,
        };
        if text.contains(',') {
            return None;
        }
        out.push(format!("{}={text}", k.get_ref()));
    }
    Some(out.join(","))
}

/// Collects errors while applying values.
pub(super) struct Collector<'a> {
    file: String,
    text: &'a str,
    /// Each problem with its line.
    errors: Vec<(usize, ConfigError)>,
}

impl Collector<'_> {
    /// Records a problem at byte `at`, about `key` when there is one.
    pub(super) fn push(&mut self, at: usize, key: Option<&str>, message: String) {
        let line = self.line_at(at);
        let origin = match key {
            Some(k) => self.origin_at(at, k),
            None => format!("{} line {line}", self.file),
        };
        self.errors.push((line, ConfigError { origin, message }));
    }

    fn line_at(&self, at: usize) -> usize {
        self.text[..at.min(self.text.len())].matches('\n').count() + 1
    }

    /// `FILE line N: key`, for a problem found later (a certificate read at the end).
    pub(super) fn origin_at(&self, at: usize, key: &str) -> String {
        format!("{} line {}: {key}", self.file, self.line_at(at))
    }

    /// A path the file names, relative to the file's directory unless absolute.
    pub(super) fn relative_to_file(&self, path: &str) -> std::path::PathBuf {
        let dir = Path::new(&self.file).parent().unwrap_or(Path::new(""));
        dir.join(path)
    }

    /// The value as the text an option parses, if it has the type `ty` asks for.
    pub(super) fn text_of(
        &mut self,
        v: &Spanned<DeValue<'_>>,
        ty: FileType,
        key: &str,
    ) -> Option<String> {
        let text = match (ty, v.get_ref()) {
            (_, DeValue::String(s)) if ty != FileType::Int && ty != FileType::Float => {
                Some(s.to_string())
            }
            (
                FileType::Int | FileType::Float | FileType::Size | FileType::IntOrStr,
                DeValue::Integer(i),
            ) => i64::from_str_radix(i.as_str(), i.radix())
                .ok()
                .map(|n| n.to_string()),
            (FileType::Float, DeValue::Float(f)) => Some(f.as_str().to_string()),
            (FileType::Switch, DeValue::Boolean(b)) => Some(b.to_string()),
            (FileType::Pairs, DeValue::Table(t)) => pairs_text(t),
            (FileType::StrOrList, DeValue::Array(items)) => items
                .iter()
                .map(|i| i.get_ref().as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(|v| v.join(",")),
            _ => None,
        };
        if text.is_none() {
            let expected = match ty {
                FileType::Str => "a string",
                FileType::Int => "an integer",
                FileType::Float => "a number",
                FileType::Switch => "on, off, true or false",
                FileType::StrOrList => "a string or a list of strings",
                FileType::Size => "a size: bytes, or a string such as \"1m\"",
                FileType::Pairs => "a table such as { interval = \"10s\" }",
                FileType::IntOrStr => "an integer or a string",
            };
            self.push(v.span().start, Some(key), format!("expected {expected}"));
        }
        text
    }
}
