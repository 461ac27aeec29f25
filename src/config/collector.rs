//! What every reader of the file shares: the problems found, each with its line, and a
//! value as the text an option parses.

use std::path::Path;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::options::{FileType, Opt};
use super::{ConfigError, Settings};

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

impl<'a> Collector<'a> {
    /// A collector for the file at `path` whose text is `text`.
    pub(super) fn new(path: &Path, text: &'a str) -> Self {
        Collector {
            file: path.display().to_string(),
            text,
            errors: Vec::new(),
        }
    }

    /// The file's text.
    pub(super) fn text(&self) -> &'a str {
        self.text
    }

    /// Every problem, in the order of the file, as a reader goes through it.
    pub(super) fn into_errors(mut self) -> Vec<ConfigError> {
        self.errors.sort_by_key(|(line, _)| *line);
        self.errors.into_iter().map(|(_, e)| e).collect()
    }

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
