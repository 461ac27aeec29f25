//! The config file (TOML): every key of the options table, the `[health]` table and the
//! `[[backends]]` list, each value checked with its line, every problem collected (so
//! `fulcrum check` lists them all, as `nginx -t` does).
//!
//! The file is read with `toml`'s spanned document model (`DeTable`), so every key and
//! value, however deeply nested, keeps its position for the error line.

use std::path::Path;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::collector::{apply_value, Collector};
use super::file_backends::{read_backends, read_discover};
use super::file_pools::{self, Layout};
use super::options;
use super::{ConfigError, Settings};

/// Applies a config file's text on top of `s`; returns every problem found.
pub(crate) fn apply_file(s: &mut Settings, path: &Path, text: &str) -> Vec<ConfigError> {
    let mut c = Collector::new(path, text);
    apply_document(s, &mut c);
    c.into_errors()
}

/// Applies the whole document, or records why it cannot be read.
fn apply_document(s: &mut Settings, c: &mut Collector<'_>) {
    let text = c.text();
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
            t @ ("health" | "outlier" | "sticky" | "hedge") => apply_table(s, c, t, value),
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
            "tracing" => s.tracing = super::trace_settings::read_table(c, value),
            "pools" => file_pools::apply_pools(s, c, value, &mut layout),
            "routes" => file_pools::apply_routes(s, c, value, &mut layout),
            "tcp_listeners" => {
                let named = super::file_tcp::apply_tcp_listeners(s, c, value);
                let users = named.into_iter().map(|(p, at)| (p, at, "tcp_listeners"));
                layout.tcp_users.extend(users);
            }
            "tls_passthrough" => {
                let named = super::file_tcp::apply_passthrough(s, c, value);
                let users = named.into_iter().map(|(p, at)| (p, at, "tls_passthrough"));
                layout.tcp_users.extend(users);
            }
            "tcp_drain_timeout" => {
                let text = c.text_of(value, super::options::FileType::Str, "tcp_drain_timeout");
                match text.map(|t| super::values::parse_positive_duration(&t)) {
                    Some(Ok(d)) => s.tcp_drain_timeout = d,
                    Some(Err(e)) => c.push(value.span().start, Some("tcp_drain_timeout"), e),
                    None => {}
                }
            }
            k => match options::find(k) {
                Some(o) => apply_value(s, c, o, k, value),
                None => c.push(at, None, unknown_key(k)),
            },
        }
    }
    file_pools::check_layout(c, &layout);
    if let (Some(at), None) = (layout.client_cert_at, &s.tls.client_auth) {
        let msg = "it needs [tls.client_auth]: no client certificate is verified without it";
        c.push(at, Some("routes.client_cert"), msg.into());
    }
}

fn unknown_key(key: &str) -> String {
    let mut valid: Vec<&str> = options::OPTIONS.iter().map(|o| o.key).collect();
    valid.extend([
        "health",
        "outlier",
        "sticky",
        "hedge",
        "tls",
        "backends",
        "discover",
        "pools",
        "routes",
        "tcp_listeners",
        "tls_passthrough",
        "tcp_drain_timeout",
        "tracing",
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
