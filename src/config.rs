//! Settings: every default in one place, the TOML file, and the validation shared by
//! `fulcrum serve` flags, the config file and `fulcrum check`.
//!
//! Layering is explicit: defaults → file → command line. Every raw value, wherever it
//! came from, goes through the same parser, so a bad value is reported the same way:
//! the option, the value, and (where there is a list) the valid values.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Uri;
use ipnet::IpNet;
use serde::Deserialize;
use toml::Spanned;

use crate::strategy::StrategyKind;

/// Default proxy listener.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default admin listener.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9090";
/// Largest accepted backend weight.
pub const MAX_WEIGHT: u32 = 1000;

/// One problem with a setting, ready to print on one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Where the value came from: `--flag`, or `file line N`.
    pub origin: String,
    /// What is wrong, naming the value and the valid values.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.origin, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// A backend as configured: `URL[,weight=N][,name=NAME]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSpec {
    /// The URL exactly as given.
    pub url: String,
    /// The `host:port` the proxy connects to.
    pub authority: http::uri::Authority,
    /// 1..=1000.
    pub weight: u32,
    /// Display name; defaults to `host:port`.
    pub name: String,
}

/// Where the request key of the hashing strategies comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// The client IP of §4.3.
    ClientIp,
    /// A request header (lower-case name).
    Header(http::HeaderName),
    /// A cookie by name.
    Cookie(String),
}

/// Log output format on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Active health check settings.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthSettings {
    /// Path probed with `GET`.
    pub path: String,
    /// Time between probes.
    pub interval: Duration,
    /// Bound on one probe.
    pub timeout: Duration,
    /// Consecutive successes to become healthy.
    pub healthy_threshold: u32,
    /// Consecutive failures to become unhealthy.
    pub unhealthy_threshold: u32,
}

/// Every setting of `fulcrum serve`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Proxy listener.
    pub listen: SocketAddr,
    /// Admin listener.
    pub admin: SocketAddr,
    /// The initial pool, in order.
    pub backends: Vec<BackendSpec>,
    /// Balancing strategy.
    pub strategy: StrategyKind,
    /// Key of the hashing strategies.
    pub hash_key: HashKey,
    /// Peers whose forwarding headers are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// Bounded load for the hashing strategies; `None` = off.
    pub hash_balance_factor: Option<f64>,
    /// Active health checks.
    pub health: HealthSettings,
    /// TCP connect bound.
    pub connect_timeout: Duration,
    /// Request sent → response headers bound.
    pub upstream_timeout: Duration,
    /// Extra attempts for a failed idempotent request.
    pub retries: u32,
    /// Shed above this many requests in flight; 0 = off.
    pub max_inflight: usize,
    /// Weight ramp duration; zero = off.
    pub slow_start: Duration,
    /// EWMA smoothing factor.
    pub ewma_alpha: f64,
    /// File holding the admin bearer token.
    pub admin_token_file: Option<PathBuf>,
    /// The admin token itself (from the file or `FULCRUM_ADMIN_TOKEN`).
    pub admin_token: Option<String>,
    /// Threads serving traffic.
    pub workers: usize,
    /// Log format.
    pub log_format: LogFormat,
    /// One access log line per request on stderr.
    pub access_log: bool,
    /// The config file, kept for reloads.
    pub config_file: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: DEFAULT_LISTEN.parse().expect("valid default"),
            admin: DEFAULT_ADMIN.parse().expect("valid default"),
            backends: Vec::new(),
            strategy: StrategyKind::RoundRobin,
            hash_key: HashKey::ClientIp,
            trusted_proxies: Vec::new(),
            hash_balance_factor: None,
            health: HealthSettings {
                path: "/health".into(),
                interval: Duration::from_secs(5),
                timeout: Duration::from_secs(2),
                healthy_threshold: 2,
                unhealthy_threshold: 3,
            },
            connect_timeout: Duration::from_secs(3),
            upstream_timeout: Duration::from_secs(30),
            retries: 2,
            max_inflight: 0,
            slow_start: Duration::ZERO,
            ewma_alpha: 0.1,
            admin_token_file: None,
            admin_token: None,
            workers: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            log_format: LogFormat::Text,
            access_log: true,
            config_file: None,
        }
    }
}

/// Raw, unvalidated values as typed on the command line; `None` = not given.
#[derive(Debug, Clone, Default)]
pub struct RawFlags {
    pub config: Option<PathBuf>,
    pub listen: Option<String>,
    pub admin: Option<String>,
    pub backend: Vec<String>,
    pub strategy: Option<String>,
    pub hash_key: Option<String>,
    pub trusted_proxies: Option<String>,
    pub hash_balance_factor: Option<String>,
    pub health_path: Option<String>,
    pub health_interval: Option<String>,
    pub health_timeout: Option<String>,
    pub healthy_threshold: Option<String>,
    pub unhealthy_threshold: Option<String>,
    pub connect_timeout: Option<String>,
    pub upstream_timeout: Option<String>,
    pub retries: Option<String>,
    pub max_inflight: Option<String>,
    pub slow_start: Option<String>,
    pub ewma_alpha: Option<String>,
    pub admin_token_file: Option<PathBuf>,
    pub admin_token_env: Option<String>,
    pub workers: Option<String>,
    pub log_format: Option<String>,
    pub access_log: Option<String>,
}

// ---------------------------------------------------------------- value parsers
// Each returns the message part of a ConfigError; the caller adds the origin.

/// Parses `250ms`, `5s`, `1m`, `1h`; a unit is required.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
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
    Ok(d)
}

fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!(
            "invalid duration '{s}' (must be greater than zero)"
        ));
    }
    Ok(d)
}

fn parse_uint<T: std::str::FromStr + PartialOrd + fmt::Display + Copy>(
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
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    let t2 = t
        .strip_prefix("localhost:")
        .map(|p| format!("127.0.0.1:{p}"));
    t2.as_deref()
        .unwrap_or(t)
        .parse()
        .map_err(|_| format!("invalid address '{s}' (expected IP:PORT, e.g. 127.0.0.1:8080)"))
}

/// Parses and checks a backend URL: `http://host[:port]` with no path beyond `/`.
pub fn parse_backend_url(url: &str) -> Result<http::uri::Authority, String> {
    let bad = |why: &str| format!("invalid backend URL '{url}' ({why})");
    let uri: Uri = url.parse().map_err(|_| bad("expected http://HOST:PORT"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => return Err(bad(&format!("scheme '{other}' is not supported; use http"))),
        None => return Err(bad("missing scheme; expected http://HOST:PORT")),
    }
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
        None => format!("{}:80", authority.host())
            .parse()
            .map_err(|_| bad("bad host"))?,
    };
    Ok(with_port)
}

/// Parses a weight, 1..=1000.
pub fn parse_weight(s: &str) -> Result<u32, String> {
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
    })
}

/// Parses `URL[,weight=N][,name=NAME]`.
pub fn parse_backend_spec(s: &str) -> Result<BackendSpec, String> {
    let mut parts = s.split(',');
    let url = parts.next().unwrap_or("").trim();
    let mut weight = None;
    let mut name = None;
    for p in parts {
        match p.split_once('=') {
            Some(("weight", w)) => weight = Some(parse_weight(w)?),
            Some(("name", n)) => name = Some(n),
            _ => {
                return Err(format!(
                    "invalid backend option '{p}' in '{s}' (valid: weight=N, name=NAME)"
                ))
            }
        }
    }
    backend_spec(url, weight, name)
}

/// Parses `client_ip`, `header:NAME`, `cookie:NAME`.
pub fn parse_hash_key(s: &str) -> Result<HashKey, String> {
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
pub fn parse_cidrs(s: &str) -> Result<Vec<IpNet>, String> {
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
pub fn parse_balance_factor(s: &str) -> Result<Option<f64>, String> {
    match s.trim().parse::<f64>() {
        Ok(0.0) => Ok(None),
        Ok(f) if f > 1.0 && f <= 100.0 => Ok(Some(f)),
        _ => Err(format!(
            "invalid value '{s}' (expected a factor above 1 and at most 100, e.g. 1.25 for 125 % of the average load, or 0 for off)"
        )),
    }
}

fn parse_alpha(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(a) if a > 0.0 && a <= 1.0 => Ok(a),
        _ => Err(format!(
            "invalid value '{s}' (expected a number with 0 < F <= 1)"
        )),
    }
}

fn parse_log_format(s: &str) -> Result<LogFormat, String> {
    match s {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err(format!("invalid log format '{s}' (valid: text, json)")),
    }
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("invalid value '{s}' (valid: on, off)")),
    }
}

fn parse_health_path(s: &str) -> Result<String, String> {
    if s.starts_with('/') && s.parse::<http::uri::PathAndQuery>().is_ok() {
        Ok(s.to_string())
    } else {
        Err(format!("invalid path '{s}' (must start with '/')"))
    }
}

fn parse_strategy(s: &str) -> Result<StrategyKind, String> {
    StrategyKind::parse(s).ok_or_else(|| {
        format!(
            "unknown strategy '{s}' (valid: {})",
            StrategyKind::canonical_names().join(", ")
        )
    })
}

fn parse_workers(s: &str) -> Result<usize, String> {
    parse_uint::<usize>(s, 1, 1024)
}

// ---------------------------------------------------------------- the file

/// A value read from the file with its position, so errors can name the line.
type Sp<T> = Spanned<T>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileHealth {
    path: Option<Sp<String>>,
    interval: Option<Sp<String>>,
    timeout: Option<Sp<String>>,
    healthy_threshold: Option<Sp<i64>>,
    unhealthy_threshold: Option<Sp<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileBackend {
    url: Sp<String>,
    weight: Option<Sp<i64>>,
    name: Option<Sp<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "access_log: expected on, off, true or false")]
enum BoolOrStr {
    Bool(bool),
    Str(String),
}

#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "trusted_proxies: expected a CIDR string or a list of CIDR strings"
)]
enum StrOrList {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<Sp<String>>,
    admin: Option<Sp<String>>,
    strategy: Option<Sp<String>>,
    hash_key: Option<Sp<String>>,
    trusted_proxies: Option<Sp<StrOrList>>,
    hash_balance_factor: Option<Sp<f64>>,
    health: Option<FileHealth>,
    health_path: Option<Sp<String>>,
    health_interval: Option<Sp<String>>,
    health_timeout: Option<Sp<String>>,
    healthy_threshold: Option<Sp<i64>>,
    unhealthy_threshold: Option<Sp<i64>>,
    connect_timeout: Option<Sp<String>>,
    upstream_timeout: Option<Sp<String>>,
    retries: Option<Sp<i64>>,
    max_inflight: Option<Sp<i64>>,
    slow_start: Option<Sp<String>>,
    ewma_alpha: Option<Sp<f64>>,
    admin_token_file: Option<Sp<String>>,
    workers: Option<Sp<i64>>,
    log_format: Option<Sp<String>>,
    access_log: Option<Sp<BoolOrStr>>,
    backends: Option<Vec<FileBackend>>,
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Collects errors while applying values, so `check` can list them all.
struct Collector<'a> {
    file: &'a str,
    text: &'a str,
    errors: Vec<ConfigError>,
}

impl Collector<'_> {
    fn at<T>(&mut self, key: &str, v: &Sp<T>, r: Result<(), String>) {
        if let Err(message) = r {
            self.errors.push(ConfigError {
                origin: format!(
                    "{} line {}: {key}",
                    self.file,
                    line_of(self.text, v.span().start)
                ),
                message,
            });
        }
    }
}

fn int_str(v: &Sp<i64>) -> String {
    v.get_ref().to_string()
}

/// Applies a config file's text on top of `s`; returns every problem found.
pub fn apply_file(s: &mut Settings, path: &Path, text: &str) -> Vec<ConfigError> {
    let file = path.display().to_string();
    let fc: FileConfig = match toml::from_str(text) {
        Ok(fc) => fc,
        Err(e) => {
            let line = e.span().map(|r| line_of(text, r.start)).unwrap_or(1);
            return vec![ConfigError {
                origin: format!("{file} line {line}"),
                message: e.message().trim().replace('\n', " "),
            }];
        }
    };
    let mut c = Collector {
        file: &file,
        text,
        errors: Vec::new(),
    };
    macro_rules! set {
        ($key:literal, $field:expr, $parse:expr, $val:expr) => {
            if let Some(v) = $val {
                let r = $parse(v.get_ref().as_str()).map(|x| $field = x);
                c.at($key, v, r);
            }
        };
    }
    macro_rules! set_int {
        ($key:literal, $field:expr, $parse:expr, $val:expr) => {
            if let Some(v) = $val {
                let r = $parse(&int_str(v)).map(|x| $field = x);
                c.at($key, v, r);
            }
        };
    }
    set!("listen", s.listen, parse_addr, &fc.listen);
    set!("admin", s.admin, parse_addr, &fc.admin);
    set!("strategy", s.strategy, parse_strategy, &fc.strategy);
    set!("hash_key", s.hash_key, parse_hash_key, &fc.hash_key);
    if let Some(v) = &fc.trusted_proxies {
        let joined = match v.get_ref() {
            StrOrList::One(x) => x.clone(),
            StrOrList::Many(xs) => xs.join(","),
        };
        let r = parse_cidrs(&joined).map(|x| s.trusted_proxies = x);
        c.at("trusted_proxies", v, r);
    }
    if let Some(v) = &fc.hash_balance_factor {
        let r = parse_balance_factor(&v.get_ref().to_string()).map(|x| s.hash_balance_factor = x);
        c.at("hash_balance_factor", v, r);
    }
    let h = fc.health.as_ref();
    let v = h.and_then(|h| h.path.as_ref());
    set!("health.path", s.health.path, parse_health_path, v);
    let v = fc.health_path.as_ref();
    set!("health_path", s.health.path, parse_health_path, v);
    let v = h.and_then(|h| h.interval.as_ref());
    set!(
        "health.interval",
        s.health.interval,
        parse_positive_duration,
        v
    );
    let v = fc.health_interval.as_ref();
    set!(
        "health_interval",
        s.health.interval,
        parse_positive_duration,
        v
    );
    let v = h.and_then(|h| h.timeout.as_ref());
    set!(
        "health.timeout",
        s.health.timeout,
        parse_positive_duration,
        v
    );
    let v = fc.health_timeout.as_ref();
    set!(
        "health_timeout",
        s.health.timeout,
        parse_positive_duration,
        v
    );
    let thr = |x: &str| parse_uint::<u32>(x, 1, 100);
    let v = h.and_then(|h| h.healthy_threshold.as_ref());
    set_int!(
        "health.healthy_threshold",
        s.health.healthy_threshold,
        thr,
        v
    );
    let v = fc.healthy_threshold.as_ref();
    set_int!("healthy_threshold", s.health.healthy_threshold, thr, v);
    let v = h.and_then(|h| h.unhealthy_threshold.as_ref());
    set_int!(
        "health.unhealthy_threshold",
        s.health.unhealthy_threshold,
        thr,
        v
    );
    let v = fc.unhealthy_threshold.as_ref();
    set_int!("unhealthy_threshold", s.health.unhealthy_threshold, thr, v);
    set!(
        "connect_timeout",
        s.connect_timeout,
        parse_positive_duration,
        &fc.connect_timeout
    );
    set!(
        "upstream_timeout",
        s.upstream_timeout,
        parse_positive_duration,
        &fc.upstream_timeout
    );
    set_int!(
        "retries",
        s.retries,
        |x: &str| parse_uint::<u32>(x, 0, 10),
        &fc.retries
    );
    set_int!(
        "max_inflight",
        s.max_inflight,
        |x: &str| parse_uint::<usize>(x, 0, 10_000_000),
        &fc.max_inflight
    );
    set!("slow_start", s.slow_start, parse_duration, &fc.slow_start);
    if let Some(v) = &fc.ewma_alpha {
        let r = parse_alpha(&v.get_ref().to_string()).map(|x| s.ewma_alpha = x);
        c.at("ewma_alpha", v, r);
    }
    if let Some(v) = &fc.admin_token_file {
        s.admin_token_file = Some(PathBuf::from(v.get_ref()));
    }
    set_int!("workers", s.workers, parse_workers, &fc.workers);
    set!("log_format", s.log_format, parse_log_format, &fc.log_format);
    if let Some(v) = &fc.access_log {
        let r = match v.get_ref() {
            BoolOrStr::Bool(b) => Ok(*b),
            BoolOrStr::Str(x) => parse_on_off(x),
        }
        .map(|x| s.access_log = x);
        c.at("access_log", v, r);
    }
    if let Some(bs) = &fc.backends {
        let mut out = Vec::new();
        for b in bs {
            let weight = match &b.weight {
                Some(w) => match parse_weight(&int_str(w)) {
                    Ok(w) => Some(w),
                    Err(e) => {
                        c.at("backends.weight", w, Err(e));
                        continue;
                    }
                },
                None => None,
            };
            let name = b.name.as_ref().map(|n| n.get_ref().as_str());
            match backend_spec(b.url.get_ref(), weight, name) {
                Ok(spec) => out.push(spec),
                Err(e) => c.at("backends.url", &b.url, Err(e)),
            }
        }
        s.backends = out;
    }
    c.errors
}

/// Builds the settings of `fulcrum serve`: defaults, then the file, then the flags.
/// Returns every error found (the caller prints the first).
pub fn build(flags: &RawFlags) -> Result<Settings, Vec<ConfigError>> {
    let mut s = Settings::default();
    let mut errors = Vec::new();
    if let Some(path) = &flags.config {
        match std::fs::read_to_string(path) {
            Ok(text) => errors.extend(apply_file(&mut s, path, &text)),
            Err(e) => errors.push(ConfigError {
                origin: "--config".into(),
                message: format!("cannot read '{}': {e}", path.display()),
            }),
        }
        s.config_file = Some(path.clone());
    }
    let mut flag = |name: &str, r: Result<(), String>| {
        if let Err(message) = r {
            errors.push(ConfigError {
                origin: format!("--{name}"),
                message,
            });
        }
    };
    macro_rules! over {
        ($name:literal, $field:expr, $parse:expr, $val:expr) => {
            if let Some(v) = &$val {
                flag($name, $parse(v.as_str()).map(|x| $field = x));
            }
        };
    }
    over!("listen", s.listen, parse_addr, flags.listen);
    over!("admin", s.admin, parse_addr, flags.admin);
    over!("strategy", s.strategy, parse_strategy, flags.strategy);
    over!("hash-key", s.hash_key, parse_hash_key, flags.hash_key);
    over!(
        "trusted-proxies",
        s.trusted_proxies,
        parse_cidrs,
        flags.trusted_proxies
    );
    over!(
        "hash-balance-factor",
        s.hash_balance_factor,
        parse_balance_factor,
        flags.hash_balance_factor
    );
    over!(
        "health-path",
        s.health.path,
        parse_health_path,
        flags.health_path
    );
    over!(
        "health-interval",
        s.health.interval,
        parse_positive_duration,
        flags.health_interval
    );
    over!(
        "health-timeout",
        s.health.timeout,
        parse_positive_duration,
        flags.health_timeout
    );
    let thr = |x: &str| parse_uint::<u32>(x, 1, 100);
    over!(
        "healthy-threshold",
        s.health.healthy_threshold,
        thr,
        flags.healthy_threshold
    );
    over!(
        "unhealthy-threshold",
        s.health.unhealthy_threshold,
        thr,
        flags.unhealthy_threshold
    );
    over!(
        "connect-timeout",
        s.connect_timeout,
        parse_positive_duration,
        flags.connect_timeout
    );
    over!(
        "upstream-timeout",
        s.upstream_timeout,
        parse_positive_duration,
        flags.upstream_timeout
    );
    over!(
        "retries",
        s.retries,
        |x: &str| parse_uint::<u32>(x, 0, 10),
        flags.retries
    );
    over!(
        "max-inflight",
        s.max_inflight,
        |x: &str| parse_uint::<usize>(x, 0, 10_000_000),
        flags.max_inflight
    );
    over!("slow-start", s.slow_start, parse_duration, flags.slow_start);
    over!("ewma-alpha", s.ewma_alpha, parse_alpha, flags.ewma_alpha);
    over!("workers", s.workers, parse_workers, flags.workers);
    over!("access-log", s.access_log, parse_on_off, flags.access_log);
    over!(
        "log-format",
        s.log_format,
        parse_log_format,
        flags.log_format
    );
    if !flags.backend.is_empty() {
        let mut out = Vec::new();
        for b in &flags.backend {
            match parse_backend_spec(b) {
                Ok(spec) => out.push(spec),
                Err(e) => flag("backend", Err(e)),
            }
        }
        s.backends = out;
    }
    if let Some(p) = &flags.admin_token_file {
        s.admin_token_file = Some(p.clone());
    }
    // Token: the file wins over the environment.
    if let Some(p) = &s.admin_token_file {
        match std::fs::read_to_string(p) {
            Ok(t) if !t.trim().is_empty() => s.admin_token = Some(t.trim().to_string()),
            Ok(_) => flag(
                "admin-token-file",
                Err(format!("'{}' is empty", p.display())),
            ),
            Err(e) => flag(
                "admin-token-file",
                Err(format!("cannot read '{}': {e}", p.display())),
            ),
        }
    } else if let Some(t) = &flags.admin_token_env {
        if !t.trim().is_empty() {
            s.admin_token = Some(t.trim().to_string());
        }
    }
    check_whole(&s, &mut errors);
    if errors.is_empty() {
        Ok(s)
    } else {
        Err(errors)
    }
}

/// Checks that concern several settings at once.
fn check_whole(s: &Settings, errors: &mut Vec<ConfigError>) {
    let mut seen = std::collections::HashSet::new();
    let mut names = std::collections::HashSet::new();
    for b in &s.backends {
        if !seen.insert(b.url.as_str()) {
            errors.push(ConfigError {
                origin: "backend".into(),
                message: format!("duplicate backend URL '{}'", b.url),
            });
        } else if !names.insert(b.name.as_str()) {
            errors.push(ConfigError {
                origin: "backend".into(),
                message: format!(
                    "duplicate backend name '{}' (names label metrics and logs; give each backend its own with name=…)",
                    b.name
                ),
            });
        }
    }
    if !s.admin.ip().is_loopback() && s.admin_token.is_none() {
        errors.push(ConfigError {
            origin: "--admin".into(),
            message: format!(
                "admin listener '{}' is not on loopback and no token is set (set --admin-token-file or FULCRUM_ADMIN_TOKEN, or listen on 127.0.0.1)",
                s.admin
            ),
        });
    }
}

/// Validates a config file alone, as `fulcrum check` does.
pub fn check_file(path: &Path) -> Vec<ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let mut s = Settings::default();
            let mut errs = apply_file(&mut s, path, &text);
            if errs.is_empty() {
                let mut extra = Vec::new();
                // Whole-file checks other than the token (the environment may provide it).
                s.admin_token = Some(String::new());
                check_whole(&s, &mut extra);
                errs.extend(extra);
            }
            errs
        }
        Err(e) => vec![ConfigError {
            origin: "--config".into(),
            message: format!("cannot read '{}': {e}", path.display()),
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_units() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("5x").is_err());
    }

    #[test]
    fn backend_specs() {
        let b = parse_backend_spec("http://127.0.0.1:3001,weight=5,name=a").unwrap();
        assert_eq!((b.weight, b.name.as_str()), (5, "a"));
        let b = parse_backend_spec("http://127.0.0.1:3001").unwrap();
        assert_eq!((b.weight, b.name.as_str()), (1, "127.0.0.1:3001"));
        let b = parse_backend_spec("http://example.com").unwrap();
        assert_eq!(b.authority.as_str(), "example.com:80");
        assert!(parse_backend_spec("http://127.0.0.1:3001,weight=0").is_err());
        assert!(parse_backend_spec("http://127.0.0.1:3001,weight=1001").is_err());
        assert!(parse_backend_spec("127.0.0.1:3001").is_err());
        assert!(parse_backend_spec("ftp://127.0.0.1:3001").is_err());
        assert!(parse_backend_spec("http://127.0.0.1:3001/x").is_err());
        assert!(parse_backend_spec("http://127.0.0.1:3001,color=red").is_err());
    }

    #[test]
    fn access_log_takes_on_off_and_booleans() {
        for (text, want) in [
            ("access_log = false", false),
            ("access_log = \"off\"", false),
            ("access_log = true", true),
            ("access_log = \"on\"", true),
        ] {
            let mut s = Settings {
                access_log: !want,
                ..Default::default()
            };
            assert!(apply_file(&mut s, Path::new("f.toml"), text).is_empty());
            assert_eq!(s.access_log, want, "{text}");
        }
        let mut s = Settings::default();
        let errs = apply_file(&mut s, Path::new("f.toml"), "access_log = 3");
        assert!(errs[0].to_string().contains("access_log"), "{}", errs[0]);
        let flags = RawFlags {
            access_log: Some("sometimes".into()),
            ..Default::default()
        };
        let errs = build(&flags).unwrap_err();
        assert!(
            errs[0].to_string().starts_with("--access-log"),
            "{}",
            errs[0]
        );
    }

    #[test]
    fn file_errors_name_the_line() {
        let text = "listen = \"127.0.0.1:1\"\nstrategy = \"bogus\"\n";
        let mut s = Settings::default();
        let errs = apply_file(&mut s, Path::new("f.toml"), text);
        assert_eq!(errs.len(), 1);
        assert!(errs[0].to_string().contains("line 2"), "{}", errs[0]);
        assert!(errs[0].to_string().contains("round_robin"), "{}", errs[0]);
        let errs = apply_file(
            &mut s,
            Path::new("f.toml"),
            "listen = \"x:1\"\ncolour = 1\n",
        );
        assert!(errs[0].to_string().contains("line 2"), "{}", errs[0]);
        assert!(errs[0].to_string().contains("colour"), "{}", errs[0]);
    }

    #[test]
    fn flags_override_file() {
        let dir = std::env::temp_dir().join(format!("fulcrum-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.toml");
        std::fs::write(
            &f,
            "strategy = \"wrr\"\nretries = 1\n[health]\ninterval = \"2s\"\n[[backends]]\nurl = \"http://127.0.0.1:1\"\nweight = 5\n",
        )
        .unwrap();
        let flags = RawFlags {
            config: Some(f),
            retries: Some("0".into()),
            ..Default::default()
        };
        let s = build(&flags).unwrap();
        assert_eq!(s.strategy, StrategyKind::WeightedRoundRobin);
        assert_eq!(s.retries, 0);
        assert_eq!(s.health.interval, Duration::from_secs(2));
        assert_eq!(s.backends[0].weight, 5);
    }

    #[test]
    fn hash_settings() {
        assert_eq!(parse_balance_factor("1.25"), Ok(Some(1.25)));
        assert_eq!(parse_balance_factor("0"), Ok(None));
        for bad in ["1", "0.5", "150", "-2", "x", "NaN"] {
            let e = parse_balance_factor(bad).unwrap_err();
            assert!(e.contains(bad) && e.contains("1.25"), "{e}");
        }
        let mut s = Settings::default();
        let errs = apply_file(
            &mut s,
            Path::new("f.toml"),
            "hash_key = \"cookie:sid\"\nhash_balance_factor = 1.5\n",
        );
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(s.hash_key, HashKey::Cookie("sid".into()));
        assert_eq!(s.hash_balance_factor, Some(1.5));
        let errs = apply_file(&mut s, Path::new("f.toml"), "\nhash_balance_factor = 125\n");
        assert!(errs[0].to_string().contains("line 2"), "{}", errs[0]);
        let flags = RawFlags {
            hash_balance_factor: Some("2".into()),
            strategy: Some("maglev".into()),
            ..Default::default()
        };
        let s = build(&flags).unwrap();
        assert_eq!(
            (s.hash_balance_factor, s.strategy),
            (Some(2.0), StrategyKind::Maglev)
        );
        let flags = RawFlags {
            hash_balance_factor: Some("1.0".into()),
            ..Default::default()
        };
        let e = build(&flags).unwrap_err();
        assert!(
            e[0].to_string().starts_with("--hash-balance-factor: "),
            "{}",
            e[0]
        );
    }
}
