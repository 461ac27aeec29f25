//! The value parsers shared by the flags, the file and the admin API. Each returns the
//! message part of a [`super::ConfigError`]; the caller adds the origin.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use http::Uri;
use ipnet::IpNet;

use super::StrategyKind;
use super::{BackendSpec, HashKey, LogFormat, MAX_WEIGHT};

/// The longest duration any setting takes: ten years. Anything longer is a mistake, and
/// a deadline that far out could not be added to a clock reading.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Parses `250ms`, `5s`, `1m`, `1h`; a unit is required, and at most ten years.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let digits = t.chars().take_while(|c| c.is_ascii_digit()).count();
    let unit = &t[digits..];
    let bad = || format!("invalid duration '{s}' (write a number with a unit: 250ms, 5s, 1m, 1h)");
    if digits == 0 {
        return Err(bad());
    }
    let n: u64 = t[..digits].parse().map_err(|_| bad())?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    if d > MAX_DURATION {
        return Err(format!("invalid duration '{s}' (at most 10 years)"));
    }
    Ok(d)
}

/// `d` as [`parse_duration`] reads it back: in one unit, whole seconds when it is.
pub(crate) fn duration_text(d: Duration) -> String {
    match d.as_millis() {
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

pub(crate) fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!(
            "invalid duration '{s}' (must be greater than zero)"
        ));
    }
    Ok(d)
}

pub(crate) fn parse_uint<T: std::str::FromStr + PartialOrd + fmt::Display + Copy>(
    s: &str,
    min: T,
    max: T,
) -> Result<T, String> {
    match s.trim().parse::<T>() {
        Ok(v) if v >= min && v <= max => Ok(v),
        _ => Err(format!(
            "invalid value '{s}' (expected an integer from {min} to {max})"
        )),
    }
}

/// Parses a listener address; `localhost:PORT` means `127.0.0.1:PORT`.
pub(crate) fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    let t2 = t
        .strip_prefix("localhost:")
        .map(|p| format!("127.0.0.1:{p}"));
    t2.as_deref()
        .unwrap_or(t)
        .parse()
        .map_err(|_| format!("invalid address '{s}' (expected IP:PORT, e.g. 127.0.0.1:8080)"))
}

/// Parses `resolvers`: `IP` or `IP:PORT` (port 53), comma-separated; at most 8.
pub(crate) fn parse_resolvers(s: &str) -> Result<Vec<SocketAddr>, String> {
    let list: Vec<&str> = s
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if list.len() > 8 {
        return Err(format!("{} resolvers: at most 8", list.len()));
    }
    list.iter()
        .map(|p| {
            p.parse::<SocketAddr>()
                .or_else(|_| {
                    p.parse::<std::net::IpAddr>()
                        .map(|ip| SocketAddr::new(ip, 53))
                })
                .map_err(|_| {
                    format!("invalid resolver '{p}' (expected IP or IP:PORT, e.g. 127.0.0.1:5353)")
                })
        })
        .collect()
}

/// Parses and checks a backend URL: `http://host[:port]` with no path beyond `/`, or
/// `tcp://host:port` for a TCP pool (`docs/tcp.md`).
pub(crate) fn parse_backend_url(url: &str) -> Result<http::uri::Authority, String> {
    let bad = |why: &str| format!("invalid backend URL '{url}' ({why})");
    let uri: Uri = url.parse().map_err(|_| bad("expected http://HOST:PORT"))?;
    let default_port = match uri.scheme_str() {
        Some("http") => 80,
        Some("https") => 443,
        Some(s) if s.eq_ignore_ascii_case("tcp") => {
            let port = uri.authority().and_then(|a| a.port_u16());
            port.ok_or_else(|| bad("a tcp:// backend names its port"))?
        }
        Some(other) => {
            return Err(bad(&format!(
                "scheme '{other}' is not supported; use http, https or tcp"
            )))
        }
        None => return Err(bad("missing scheme; expected http://HOST:PORT")),
    };
    let authority = uri.authority().ok_or_else(|| bad("missing host"))?;
    if authority.host().is_empty() {
        return Err(bad("missing host"));
    }
    if authority.as_str().contains('@') {
        return Err(bad("user info is not supported"));
    }
    if let Some(pq) = uri.path_and_query() {
        if (pq.path() != "/" && !pq.path().is_empty()) || pq.query().is_some() {
            return Err(bad("a backend URL has no path or query"));
        }
    }
    let with_port = match authority.port_u16() {
        Some(_) => authority.clone(),
        None => format!("{}:{default_port}", authority.host())
            .parse()
            .map_err(|_| bad("bad host"))?,
    };
    Ok(with_port)
}

/// Parses a weight, 1..=1000.
pub(crate) fn parse_weight(s: &str) -> Result<u32, String> {
    parse_uint::<u32>(s, 1, MAX_WEIGHT)
        .map_err(|_| format!("invalid weight '{s}' (expected an integer from 1 to {MAX_WEIGHT})"))
}

/// Builds a backend from its parts, defaulting the name to `host:port`.
pub fn backend_spec(
    url: &str,
    weight: Option<u32>,
    name: Option<&str>,
) -> Result<BackendSpec, String> {
    let authority = parse_backend_url(url)?;
    let weight = weight.unwrap_or(1);
    if !(1..=MAX_WEIGHT).contains(&weight) {
        return Err(format!(
            "invalid weight '{weight}' (expected an integer from 1 to {MAX_WEIGHT})"
        ));
    }
    let name = match name {
        Some(n) if n.trim().is_empty() => return Err("a backend name must not be empty".into()),
        // A name is a metrics label and a log field: printable, no quotes or backslashes.
        Some(n)
            if n.chars().count() > 64
                || n.chars().any(|c| c.is_control() || c == '"' || c == '\\') =>
        {
            return Err(format!(
                "invalid backend name '{}' (1 to 64 printable characters, no quotes or backslashes)",
                n.escape_default()
            ))
        }
        Some(n) => n.to_string(),
        None => authority.as_str().to_string(),
    };
    Ok(BackendSpec {
        url: url.to_string(),
        authority,
        weight,
        name,
        backup: false,
        max_conns: 0,
        addr: None,
    })
}

/// A backend as JSON gives it: `POST /admin/backends`, `POST /admin/pools`, a
/// discovery file (`docs/discovery.md`).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BackendEntry {
    url: String,
    weight: Option<i64>,
    name: Option<String>,
    /// Picked only while no primary of the pool is eligible.
    backup: Option<bool>,
    /// At most this many requests in flight; 0 = no limit; or `"auto"`.
    max_conns: Option<MaxConnsValue>,
}

/// A `max_conns` in JSON: a number, or `"auto"`.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
pub(crate) enum MaxConnsValue {
    /// A number of requests.
    Number(i64),
    /// `auto`.
    Text(String),
}

impl BackendEntry {
    /// The backend it describes, or what is wrong with it.
    pub(crate) fn spec(self) -> Result<BackendSpec, String> {
        let weight = match self.weight {
            Some(w) if (1..=i64::from(MAX_WEIGHT)).contains(&w) => Some(w as u32),
            Some(w) => {
                return Err(format!(
                    "invalid weight {w} (expected an integer from 1 to {MAX_WEIGHT})"
                ))
            }
            None => None,
        };
        let mut spec = backend_spec(&self.url, weight, self.name.as_deref())?;
        spec.backup = self.backup.unwrap_or(false);
        match self.max_conns {
            Some(MaxConnsValue::Number(n)) => spec.max_conns = parse_max_conns(&n.to_string())?,
            Some(MaxConnsValue::Text(t)) => spec.max_conns = parse_max_conns(&t)?,
            None => {}
        }
        Ok(spec)
    }
}

/// The most requests in flight a backend's `max_conns` may allow.
pub(crate) const MAX_CONNS: u32 = 1_000_000;

/// `max_conns = "auto"` where a number of requests would be: the limit follows the
/// backend's latency (`docs/operations.md`, "Adaptive concurrency").
pub(crate) const AUTO_CONNS: u32 = u32::MAX;

/// A backend's `max_conns`: 0 (no limit) to [`MAX_CONNS`], or `auto` ([`AUTO_CONNS`]).
pub(crate) fn parse_max_conns(s: &str) -> Result<u32, String> {
    if s.trim() == "auto" {
        return Ok(AUTO_CONNS);
    }
    parse_uint::<u32>(s, 0, MAX_CONNS).map_err(|_| {
        format!("invalid max_conns '{s}' (expected auto, or an integer from 0, no limit, to {MAX_CONNS})")
    })
}

/// Parses the bounds of an adaptive `max_conns`: `min=N,max=N` (either may be left out:
/// 1 and 1000).
pub(crate) fn parse_auto_bounds(s: &str) -> Result<(u32, u32), String> {
    let (mut min, mut max) = (1u32, 1000u32);
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let named = |k: &str, e: String| format!("max_conns_auto.{k}: {e}");
        match pair.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
            Some(("min", v)) => min = parse_uint(v, 1, MAX_CONNS).map_err(|e| named("min", e))?,
            Some(("max", v)) => max = parse_uint(v, 1, MAX_CONNS).map_err(|e| named("max", e))?,
            _ => {
                return Err(format!(
                    "invalid max_conns_auto '{pair}' (expected min=N or max=N)"
                ))
            }
        }
    }
    if min > max {
        return Err(format!(
            "invalid max_conns_auto: min {min} is over max {max}"
        ));
    }
    Ok((min, max))
}

/// Parses `URL[,weight=N][,name=NAME][,backup][,max_conns=N]`.
pub(crate) fn parse_backend_spec(s: &str) -> Result<BackendSpec, String> {
    let mut parts = s.split(',');
    let url = parts.next().unwrap_or("").trim();
    let mut weight = None;
    let mut name = None;
    let mut backup = false;
    let mut max_conns = 0;
    for p in parts {
        match p.split_once('=') {
            Some(("weight", w)) => weight = Some(parse_weight(w)?),
            Some(("max_conns", n)) => max_conns = parse_max_conns(n)?,
            Some(("name", n)) => name = Some(n),
            None if p == "backup" => backup = true,
            _ => {
                return Err(format!(
                    "invalid backend option '{p}' in '{s}' (valid: weight=N, name=NAME, backup, max_conns=N|auto)"
                ))
            }
        }
    }
    let mut spec = backend_spec(url, weight, name)?;
    spec.backup = backup;
    spec.max_conns = max_conns;
    Ok(spec)
}

/// Parses `client_ip`, `header:NAME`, `cookie:NAME`.
pub(crate) fn parse_hash_key(s: &str) -> Result<HashKey, String> {
    let bad = || format!("invalid hash key '{s}' (valid: client_ip, header:NAME, cookie:NAME)");
    if s == "client_ip" {
        return Ok(HashKey::ClientIp);
    }
    if let Some(h) = s.strip_prefix("header:") {
        return http::HeaderName::from_bytes(h.as_bytes())
            .map(HashKey::Header)
            .map_err(|_| bad());
    }
    if let Some(c) = s.strip_prefix("cookie:") {
        if !c.is_empty() && !c.contains([';', '=', ' ']) {
            return Ok(HashKey::Cookie(c.to_string()));
        }
    }
    Err(bad())
}

/// Parses `CIDR[,CIDR…]`; a bare IP is a /32 or /128.
pub(crate) fn parse_cidrs(s: &str) -> Result<Vec<IpNet>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<IpNet>()
                .or_else(|_| p.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    format!("invalid CIDR '{p}' (expected e.g. 10.0.0.0/8 or 192.168.1.7)")
                })
        })
        .collect()
}

/// Parses `--hash-balance-factor`: a factor above 1 (1.25 lets a backend hold 125 % of
/// its share of the load), or 0 for off.
pub(crate) fn parse_balance_factor(s: &str) -> Result<Option<f64>, String> {
    match s.trim().parse::<f64>() {
        Ok(0.0) => Ok(None),
        Ok(f) if f > 1.0 && f <= 100.0 => Ok(Some(f)),
        _ => Err(format!(
            "invalid value '{s}' (expected a factor above 1 and at most 100, e.g. 1.25 for 125 % of the average load, or 0 for off)"
        )),
    }
}

pub(crate) fn parse_alpha(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(a) if a > 0.0 && a <= 1.0 => Ok(a),
        _ => Err(format!(
            "invalid value '{s}' (expected a number with 0 < F <= 1)"
        )),
    }
}

pub(crate) fn parse_log_format(s: &str) -> Result<LogFormat, String> {
    match s {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err(format!("invalid log format '{s}' (valid: text, json)")),
    }
}

/// `on`/`true`/`stderr`, `off`/`false`, or a file whose directory exists (the file is
/// made at start, by the user fulcrum runs as).
pub(crate) fn parse_access_log(s: &str) -> Result<super::AccessLog, String> {
    use super::AccessLog;
    match s {
        "on" | "true" | "stderr" => return Ok(AccessLog::Stderr),
        "off" | "false" => return Ok(AccessLog::Off),
        "" => return Err("empty (valid: on, off, stderr or a file)".into()),
        _ => {}
    }
    let path = PathBuf::from(s);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    if !dir.is_dir() {
        return Err(format!(
            "cannot write '{s}': no directory '{}'",
            dir.display()
        ));
    }
    if path.is_dir() {
        return Err(format!("cannot write '{s}': a directory"));
    }
    Ok(AccessLog::File(path))
}

/// `text`, `json` or `combined` (Apache's).
pub(crate) fn parse_access_format(s: &str) -> Result<super::AccessFormat, String> {
    use super::AccessFormat;
    match s {
        "text" => Ok(AccessFormat::Text),
        "json" => Ok(AccessFormat::Json),
        "combined" => Ok(AccessFormat::Combined),
        _ => Err(format!(
            "invalid access log format '{s}' (valid: text, json, combined)"
        )),
    }
}

pub(crate) fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("invalid value '{s}' (valid: on, off)")),
    }
}

/// A cookie name: 1 to 64 characters of an RFC 6265 token.
pub(crate) fn parse_cookie_name(s: &str) -> Result<String, String> {
    let token = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c);
    if !s.is_empty() && s.len() <= 64 && s.bytes().all(token) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "invalid cookie name '{}' (1 to 64 letters, digits or !#$%&'*+-.^_`|~)",
            s.escape_default()
        ))
    }
}

pub(crate) fn parse_health_path(s: &str) -> Result<String, String> {
    if s.starts_with('/') && s.parse::<http::uri::PathAndQuery>().is_ok() {
        Ok(s.to_string())
    } else {
        Err(format!("invalid path '{s}' (must start with '/')"))
    }
}

pub(crate) fn parse_strategy(s: &str) -> Result<StrategyKind, String> {
    StrategyKind::parse(s).ok_or_else(|| {
        format!(
            "unknown strategy '{s}' (valid: {})",
            StrategyKind::canonical_names().join(", ")
        )
    })
}

pub(crate) fn parse_workers(s: &str) -> Result<usize, String> {
    parse_uint::<usize>(s, 1, 1024)
}

/// The largest `max_request_body`: 1 TiB.
const MAX_SIZE: u64 = 1 << 40;

/// Parses a size in bytes as nginx writes one: `1048576`, `512k`, `1m`, `2g` (binary
/// multiples, any case, `KiB`/`MiB`/`GiB` too); `0` or `off` is `None` (no limit).
pub(crate) fn parse_size(s: &str) -> Result<Option<u64>, String> {
    let t = s.trim();
    if t == "off" || t == "0" {
        return Ok(None);
    }
    let bad = || {
        format!("invalid size '{s}' (bytes, or with a unit: 512k, 1m, 2g; 0 or off for no limit)")
    };
    let digits = t.chars().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 {
        return Err(bad());
    }
    let n: u64 = t[..digits].parse().map_err(|_| bad())?;
    let shift = match t[digits..].to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        _ => return Err(bad()),
    };
    match n.checked_mul(1 << shift) {
        Some(0) => Ok(None),
        Some(v) if v <= MAX_SIZE => Ok(Some(v)),
        _ => Err(format!("invalid size '{s}' (at most 1024g)")),
    }
}

/// Parses the protocols an `Upgrade` may switch to, `NAME[,NAME…]` (RFC 9110 tokens,
/// kept in lower case); an empty list tunnels nothing.
pub(crate) fn parse_upgrade_protocols(s: &str) -> Result<Vec<String>, String> {
    let token = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c);
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            if p.bytes().all(token) {
                Ok(p.to_ascii_lowercase())
            } else {
                Err(format!(
                    "invalid protocol '{}' (a token such as websocket; the list is comma-separated)",
                    p.escape_default()
                ))
            }
        })
        .collect()
}

// The forms of the options table's values (`config::options`).

/// A duration greater than zero.
pub(super) fn positive(s: &str) -> Result<std::time::Duration, String> {
    parse_positive_duration(s)
}

/// `http1` or `h2`.
pub(super) fn parse_protocol(s: &str) -> Result<super::Protocol, String> {
    match s {
        "http1" | "http/1.1" => Ok(super::Protocol::Http1),
        "h2" | "http2" => Ok(super::Protocol::H2),
        _ => Err(format!("invalid protocol '{s}' (expected http1 or h2)")),
    }
}

/// `off`, `v1` or `v2`.
pub(super) fn parse_send_proxy(s: &str) -> Result<Option<crate::proxy_protocol::Version>, String> {
    use crate::proxy_protocol::Version;
    match s {
        "off" => Ok(None),
        "v1" => Ok(Some(Version::V1)),
        "v2" => Ok(Some(Version::V2)),
        _ => Err(format!(
            "invalid send_proxy_protocol '{s}' (expected off, v1 or v2)"
        )),
    }
}

/// A file's path, not empty.
pub(super) fn non_empty_path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("the path is empty".into());
    }
    Ok(PathBuf::from(s))
}

/// A health threshold.
pub(super) fn threshold(s: &str) -> Result<u32, String> {
    parse_uint::<u32>(s, 1, 100)
}

/// A list of addresses and CIDRs, comma-separated (or a list in the file).
pub(super) fn parse_ip_set(v: &str) -> Result<crate::ipset::IpSet, String> {
    let entries: Vec<&str> = v
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    crate::ipset::IpSet::parse(&entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_bytes_or_binary_multiples() {
        assert_eq!(parse_size("1048576"), Ok(Some(1 << 20)));
        assert_eq!(parse_size("512k"), Ok(Some(512 << 10)));
        assert_eq!(parse_size("1M"), Ok(Some(1 << 20)));
        assert_eq!(parse_size("2GiB"), Ok(Some(2 << 30)));
        assert_eq!(parse_size("off"), Ok(None));
        assert_eq!(parse_size("0k"), Ok(None));
        for bad in ["", "k", "1x", "1.5m", "-1", "2000g"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn upgrade_protocols_are_tokens() {
        assert_eq!(
            parse_upgrade_protocols("websocket, X-Custom"),
            Ok(vec!["websocket".to_string(), "x-custom".to_string()])
        );
        assert_eq!(parse_upgrade_protocols(""), Ok(Vec::new()));
        assert!(parse_upgrade_protocols("web socket").is_err());
        assert!(parse_upgrade_protocols("h2c/1\u{0}").is_err());
    }
}
