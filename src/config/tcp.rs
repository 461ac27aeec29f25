//! TCP pools as configured (`docs/tcp.md`): a pool's `mode`, its `idle_timeout` and
//! its health check's `kind`, the `[[tcp_listeners]]` that feed TCP pools, and the
//! `[[tls_passthrough]]` names whose TLS the HTTPS listener hands to one unopened.

use std::net::SocketAddr;
use std::time::Duration;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::collector::Collector;
use super::options::FileType;
use super::pools;
use super::Settings;
use crate::ipset::{Admission, IpSet};
use crate::route::HostPattern;

/// How long a silent TCP connection is kept, unless its pool says otherwise.
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
/// How long an old process keeps its TCP connections after an upgrade, by default.
pub(crate) const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(3600);

/// What a pool carries: HTTP requests, or TCP connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum PoolMode {
    /// HTTP requests, reached through routes.
    #[default]
    Http,
    /// TCP connections, reached through `[[tcp_listeners]]` and `[[tls_passthrough]]`.
    Tcp,
}

impl PoolMode {
    /// Reads `http` or `tcp`.
    pub(crate) fn parse(text: &str) -> Result<PoolMode, String> {
        match text {
            "http" => Ok(PoolMode::Http),
            "tcp" => Ok(PoolMode::Tcp),
            _ => Err(format!("invalid mode '{text}' (valid: http, tcp)")),
        }
    }

    /// The name it has in a config and in the admin API.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PoolMode::Http => "http",
            PoolMode::Tcp => "tcp",
        }
    }
}

/// What an active health check does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum HealthKind {
    /// `GET path`, a 2xx answer is a success.
    #[default]
    Http,
    /// A connection made is a success (a TCP pool's default).
    Tcp,
}

impl HealthKind {
    /// Reads `http` or `tcp`.
    pub(crate) fn parse(text: &str) -> Result<HealthKind, String> {
        match text {
            "http" => Ok(HealthKind::Http),
            "tcp" => Ok(HealthKind::Tcp),
            _ => Err(format!("invalid health kind '{text}' (valid: http, tcp)")),
        }
    }
}

/// A pool's keys about what it carries, as a `[[pools]]` entry gives them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ModeKeys {
    /// `mode`.
    pub(crate) mode: PoolMode,
    /// `idle_timeout`, when set.
    pub(crate) idle_timeout: Option<Duration>,
    /// `health.kind`, when set.
    pub(crate) health_kind: Option<HealthKind>,
}

/// A `[[tcp_listeners]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TcpListenerSpec {
    /// Where it listens.
    pub(crate) listen: SocketAddr,
    /// The TCP pool its connections go to.
    pub(crate) pool: String,
    /// A peer in `trusted_proxies` starts with a PROXY header naming the client.
    pub(crate) accept_proxy_protocol: bool,
    /// Its `allow` and `deny` lists.
    pub(crate) clients: Admission,
}

/// A `[[tls_passthrough]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PassthroughSpec {
    /// The server name: exact, or `*.SUFFIX`.
    pub(crate) sni: HostPattern,
    /// The TCP pool its connections go to.
    pub(crate) pool: String,
}

/// Whether a backend URL is `tcp://` (the scheme in any case).
pub(crate) fn is_tcp_url(url: &str) -> bool {
    url.get(..6)
        .is_some_and(|s| s.eq_ignore_ascii_case("tcp://"))
}

/// Why the backend `url` cannot be in a pool of `mode`, if it cannot.
pub(crate) fn url_fits(url: &str, mode: PoolMode) -> Result<(), String> {
    match (is_tcp_url(url), mode) {
        (true, PoolMode::Http) => Err(format!(
            "'{url}' is a TCP backend: it needs a pool with mode = \"tcp\""
        )),
        (false, PoolMode::Tcp) => Err(format!(
            "'{url}' in a TCP pool: its backends are tcp://HOST:PORT"
        )),
        _ => Ok(()),
    }
}

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
            match read {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    c.push(v.span().start, Some(&shown), e);
                    ok = false;
                }
                None => ok = false,
            }
        }
        for (present, field) in [(has.0, "listen"), (has.1, "pool")] {
            if !present {
                c.push(
                    at,
                    Some("tcp_listeners"),
                    format!("missing field '{field}'"),
                );
                ok = false;
            }
        }
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
            match read {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    c.push(v.span().start, Some(&shown), e);
                    ok = false;
                }
                None => ok = false,
            }
        }
        for (present, field) in [
            (has_key(table, "sni"), "sni"),
            (has_key(table, "pool"), "pool"),
        ] {
            if !present {
                c.push(
                    at,
                    Some("tls_passthrough"),
                    format!("missing field '{field}'"),
                );
            }
        }
        match (sni, pool) {
            (Some(sni), Some(pool)) if ok => s.tls_passthrough.push(PassthroughSpec { sni, pool }),
            _ => {}
        }
    }
    named
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_fit_their_pools_mode() {
        assert!(url_fits("tcp://127.0.0.1:5432", PoolMode::Tcp).is_ok());
        assert!(url_fits("TCP://127.0.0.1:5432", PoolMode::Tcp).is_ok());
        assert!(url_fits("http://127.0.0.1:80", PoolMode::Http).is_ok());
        let e = url_fits("tcp://127.0.0.1:5432", PoolMode::Http).unwrap_err();
        assert!(e.contains("mode = \"tcp\""), "{e}");
        assert!(url_fits("http://127.0.0.1:80", PoolMode::Tcp).is_err());
    }

    #[test]
    fn modes_and_kinds_parse() {
        assert_eq!(PoolMode::parse("tcp"), Ok(PoolMode::Tcp));
        assert!(PoolMode::parse("udp").unwrap_err().contains("http, tcp"));
        assert_eq!(HealthKind::parse("tcp"), Ok(HealthKind::Tcp));
        assert!(HealthKind::parse("grpc").is_err());
    }
}
