//! The config file's TCP keys (`docs/tcp.md`), each value checked with its line: a
//! `[[pools]]` entry's `mode`, `idle_timeout` and `health.kind`, and the
//! `[[tcp_listeners]]` and `[[tls_passthrough]]` lists.

use std::net::SocketAddr;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::collector::Collector;
use super::options::FileType;
use super::pools;
use super::tcp::{HealthKind, ModeKeys, PassthroughSpec, PoolMode, TcpListenerSpec};
use super::Settings;
use crate::ipset::{Admission, IpSet};
use crate::route::HostPattern;

/// One key of a `[[pools]]` entry that [`ModeKeys`] holds (`mode`, `idle_timeout`);
/// `false` when its value is bad (recorded).
pub(super) fn read_mode_key(
    c: &mut Collector<'_>,
    key: &str,
    v: &Spanned<DeValue<'_>>,
    keys: &mut ModeKeys,
) -> bool {
    let shown = format!("pools.{key}");
    let Some(text) = c.text_of(v, FileType::Str, &shown) else {
        return false;
    };
    let read = match key {
        "mode" => PoolMode::parse(&text).map(|m| keys.mode = m),
        _ => super::values::parse_positive_duration(&text).map(|d| keys.idle_timeout = Some(d)),
    };
    read.map_err(|e| c.push(v.span().start, Some(&shown), e))
        .is_ok()
}

/// A pool's `health.kind`; `false` when its value is bad (recorded).
pub(super) fn read_health_kind(
    c: &mut Collector<'_>,
    v: &Spanned<DeValue<'_>>,
    keys: &mut ModeKeys,
) -> bool {
    let Some(text) = c.text_of(v, FileType::Str, "pools.health.kind") else {
        return false;
    };
    match HealthKind::parse(&text) {
        Ok(k) => {
            keys.health_kind = Some(k);
            true
        }
        Err(e) => {
            c.push(v.span().start, Some("pools.health.kind"), e);
            false
        }
    }
}

/// The entries of a list of tables (`[[NAME]]`), each with where it is; `None` (recorded)
/// when the value is not one.
fn tables<'v, 'a>(
    c: &mut Collector<'_>,
    name: &str,
    value: &'v Spanned<DeValue<'a>>,
) -> Option<Vec<(usize, &'v DeTable<'a>)>> {
    let Some(list) = value.get_ref().as_array() else {
        let msg = format!("expected a list of tables ([[{name}]])");
        c.push(value.span().start, Some(name), msg);
        return None;
    };
    let mut out = Vec::new();
    for entry in list {
        match entry.get_ref().as_table() {
            Some(t) => out.push((entry.span().start, t)),
            None => c.push(entry.span().start, Some(name), "expected a table".into()),
        }
    }
    Some(out)
}

/// A pool a TCP listener or a passthrough name sends to, and where it is named.
pub(super) type Named = (String, usize);

/// The `[[tcp_listeners]]` list; returns the pool each names.
pub(super) fn apply_tcp_listeners(
    s: &mut Settings,
    c: &mut Collector<'_>,
    value: &Spanned<DeValue<'_>>,
) -> Vec<Named> {
    let mut named = Vec::new();
    for (at, table) in tables(c, "tcp_listeners", value).unwrap_or_default() {
        let mut spec = TcpListenerSpec {
            listen: SocketAddr::from(([0, 0, 0, 0], 0)),
            pool: String::new(),
            accept_proxy_protocol: false,
            clients: Admission::default(),
        };
        let (mut ok, mut has) = (true, (false, false));
        for (key, v) in table {
            let k = key.get_ref().as_ref();
            let shown = format!("tcp_listeners.{k}");
            let read = match k {
                "listen" => text(c, v, &shown).map(|t| {
                    has.0 = true;
                    super::parse_addr(&t).map(|a| spec.listen = a)
                }),
                "pool" => text(c, v, &shown).map(|t| {
                    has.1 = true;
                    named.push((t.clone(), v.span().start));
                    pools::check_pool_name(&t).map(|()| spec.pool = t)
                }),
                "accept_proxy_protocol" => match v.get_ref() {
                    DeValue::Boolean(b) => {
                        spec.accept_proxy_protocol = *b;
                        Some(Ok(()))
                    }
                    _ => Some(Err("expected true or false".into())),
                },
                "allow" | "deny" => Some(ip_set(v).map(|set| match k {
                    "allow" => spec.clients.allow = set,
                    _ => spec.clients.deny = set,
                })),
                _ => {
                    let msg = format!(
                        "unknown key '{shown}' (valid: listen, pool, accept_proxy_protocol, allow, deny)"
                    );
                    c.push(key.span().start, None, msg);
                    ok = false;
                    continue;
                }
            };
            ok &= noted(c, v.span().start, &shown, read);
        }
        ok &= all_there(
            c,
            (at, "tcp_listeners"),
            [(has.0, "listen"), (has.1, "pool")],
        );
        if ok {
            s.tcp_listeners.push(spec);
        }
    }
    named
}

/// The `[[tls_passthrough]]` list; returns the pool each names.
pub(super) fn apply_passthrough(
    s: &mut Settings,
    c: &mut Collector<'_>,
    value: &Spanned<DeValue<'_>>,
) -> Vec<Named> {
    let mut named = Vec::new();
    for (at, table) in tables(c, "tls_passthrough", value).unwrap_or_default() {
        let (mut sni, mut pool, mut ok) = (None, None, true);
        for (key, v) in table {
            let k = key.get_ref().as_ref();
            let shown = format!("tls_passthrough.{k}");
            let read = match k {
                "sni" => text(c, v, &shown).map(|t| {
                    HostPattern::parse(&t)
                        .map(|p| sni = Some(p))
                        .map_err(|_| format!("'{t}' is not a server name (expected a name such as db.example.com or *.example.com)"))
                }),
                "pool" => text(c, v, &shown).map(|t| {
                    named.push((t.clone(), v.span().start));
                    pools::check_pool_name(&t).map(|()| pool = Some(t))
                }),
                _ => {
                    let msg = format!("unknown key '{shown}' (valid: sni, pool)");
                    c.push(key.span().start, None, msg);
                    ok = false;
                    continue;
                }
            };
            ok &= noted(c, v.span().start, &shown, read);
        }
        let fields = [
            (has_key(table, "sni"), "sni"),
            (has_key(table, "pool"), "pool"),
        ];
        ok &= all_there(c, (at, "tls_passthrough"), fields);
        match (sni, pool) {
            (Some(sni), Some(pool)) if ok => s.tls_passthrough.push(PassthroughSpec { sni, pool }),
            _ => {}
        }
    }
    named
}

/// Whether a key's value was read (`Some(Ok)`); a bad one is recorded where it is,
/// one of the wrong type was recorded already (`None`).
fn noted(c: &mut Collector<'_>, at: usize, shown: &str, read: Option<Result<(), String>>) -> bool {
    match read {
        Some(Ok(())) => true,
        Some(Err(e)) => {
            c.push(at, Some(shown), e);
            false
        }
        None => false,
    }
}

/// Whether every required field is there; each missing one is recorded at the entry.
fn all_there<const N: usize>(
    c: &mut Collector<'_>,
    (at, list): (usize, &str),
    fields: [(bool, &str); N],
) -> bool {
    let mut ok = true;
    for (present, field) in fields {
        if !present {
            c.push(at, Some(list), format!("missing field '{field}'"));
            ok = false;
        }
    }
    ok
}

fn has_key(table: &DeTable<'_>, key: &str) -> bool {
    table.iter().any(|(k, _)| k.get_ref().as_ref() == key)
}

/// The value as a string, or `None` (recorded) when it is not one.
fn text(c: &mut Collector<'_>, v: &Spanned<DeValue<'_>>, shown: &str) -> Option<String> {
    c.text_of(v, FileType::Str, shown)
}

/// A list of addresses and CIDRs.
fn ip_set(v: &Spanned<DeValue<'_>>) -> Result<IpSet, String> {
    let expected =
        || "expected a list of IP addresses or CIDRs, such as [\"10.0.0.0/8\"]".to_string();
    let list = v.get_ref().as_array().ok_or_else(expected)?;
    let entries = list
        .iter()
        .map(|e| e.get_ref().as_str().ok_or_else(expected))
        .collect::<Result<Vec<_>, _>>()?;
    IpSet::parse(&entries)
}
