//! The lists and tables of backends in the file (`[[backends]]`, `discover`), read the
//! same at the top and in a `[[pools]]` entry.

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::collector::Collector;
use super::options::FileType;
use super::values::{backend_spec, parse_weight};
use super::BackendSpec;

/// Keys of a `[[backends]]` entry.
const BACKEND_KEYS: [&str; 5] = ["url", "weight", "name", "backup", "max_conns"];

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
