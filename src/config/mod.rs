//! Settings: every option declared once ([`options`]), the TOML file ([`file`]), and
//! the validation shared by `fulcrum serve` flags, the config file and `fulcrum check`.
//!
//! Layering is explicit: defaults → file → command line. Every raw value, wherever it
//! came from, goes through the same parser, so a bad value is reported the same way:
//! the option, the value, and (where there is a list) the valid values.

pub(crate) mod acme;
pub(crate) mod auth;
pub(crate) mod client_auth;
mod collector;
pub mod compress;
pub(crate) mod discover;
mod fields;
mod file;
mod file_backends;
mod file_pools;
mod file_tcp;
pub(crate) mod opt;
pub(crate) mod options;
pub(crate) mod outlier;
pub(crate) mod pem;
pub(crate) mod policy;
mod pool_settings;
pub(crate) mod pools;
pub(crate) mod retry;
pub(crate) use retry::HedgeAfter;
pub(crate) mod mirror;
pub(crate) mod split;
pub(crate) mod strategy_kind;
pub(crate) mod tcp;
pub(crate) mod tls;
pub(crate) mod trace_settings;
mod values;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;

pub use strategy_kind::StrategyKind;

pub(crate) use discover::DiscoverSpec;
pub(crate) use file::apply_file;
pub(crate) use pools::{PoolSettings, PoolSpec, RouteSpec, DEFAULT_POOL};
pub use values::backend_spec;
pub(crate) use values::parse_backend_spec;
pub(crate) use values::BackendEntry;
pub(crate) use values::{parse_addr, parse_max_conns, parse_positive_duration, AUTO_CONNS};

/// Default proxy listener.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default admin listener.
pub(crate) const DEFAULT_ADMIN: &str = "127.0.0.1:9090";
/// The most sockets one hand-over carries: Linux passes at most 253 descriptors in one
/// message (`SCM_MAX_FD`), so at most 252 workers plus the admin API's.
pub(crate) const MAX_SOCKETS: usize = 253;

/// Largest accepted backend weight.
pub(crate) const MAX_WEIGHT: u32 = 1000;

/// One problem with a setting, ready to print on one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConfigError {
    /// Where the value came from: `--flag`, or `file line N`.
    pub(crate) origin: String,
    /// What is wrong, naming the value and the valid values.
    pub(crate) message: String,
}

impl fmt::Display for ConfigError {
    /// One line, whatever the value quoted: a line break or another control character
    /// in it is written escaped (`\n`), so a value cannot forge a line of its own.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let origin = self.origin.as_str();
        for part in [origin, ": ", self.message.as_str()] {
            for c in part.chars() {
                if c.is_control() {
                    write!(f, "{}", c.escape_default())?;
                } else {
                    fmt::Write::write_char(f, c)?;
                }
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// A backend as configured: `URL[,weight=N][,name=NAME]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSpec {
    /// The URL exactly as given.
    pub(crate) url: String,
    /// The `host:port` the proxy connects to.
    pub(crate) authority: http::uri::Authority,
    /// 1..=1000.
    pub(crate) weight: u32,
    /// Display name; defaults to `host:port`.
    pub(crate) name: String,
    /// Picked only while no other backend of its pool is eligible (HAProxy's `backup`).
    pub(crate) backup: bool,
    /// At most this many requests in flight; 0 = no limit (HAProxy's `maxconn`).
    pub(crate) max_conns: u32,
    /// The address to connect to when discovery resolved the URL's host itself (an SRV
    /// target); `None`: the host is an IP, or it is resolved at each connect.
    pub(crate) addr: Option<SocketAddr>,
}

/// Where the request key of the hashing strategies comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// The client IP (`docs/architecture.md`, "Headers").
    ClientIp,
    /// A request header (lower-case name).
    Header(http::HeaderName),
    /// A cookie by name.
    Cookie(String),
}

/// Log output format on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Where the access log goes (`docs/install.md`, "Logs").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AccessLog {
    /// No access log.
    Off,
    /// On stderr, beside the other logs.
    Stderr,
    /// A file of its own, appended to and reopened on `SIGUSR1`.
    File(PathBuf),
}

/// The access log's line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AccessFormat {
    /// As the other logs' text lines.
    Text,
    /// As the other logs' JSON lines.
    Json,
    /// Apache's combined format.
    Combined,
}

/// Active health check settings.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HealthSettings {
    /// Path probed with `GET`.
    pub(crate) path: String,
    /// Time between probes.
    pub(crate) interval: Duration,
    /// Bound on one probe.
    pub(crate) timeout: Duration,
    /// Consecutive successes to become healthy.
    pub(crate) healthy_threshold: u32,
    /// Consecutive failures to become unhealthy.
    pub(crate) unhealthy_threshold: u32,
    /// What a probe does: `GET path`, or a connect (`health.kind`).
    pub(crate) kind: tcp::HealthKind,
}

/// Passive outlier detection (`docs/operations.md`, "Passive outlier detection").
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct OutlierSettings {
    /// Failures in a row on live traffic that eject a backend; 0 = off.
    pub(crate) consecutive_failures: u32,
    /// Length of a first ejection; the n-th lasts n times as long.
    pub(crate) base_ejection: Duration,
    /// Longest ejection.
    pub(crate) max_ejection: Duration,
    /// At most this share of the pool (percent, rounded down) ejected at once.
    pub(crate) max_ejected_percent: u32,
    /// Success-rate ejection, when on.
    pub(crate) success_rate: Option<outlier::SuccessRate>,
}

/// The HTTP version spoken to a pool's backends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) enum Protocol {
    /// HTTP/1.1, one request per connection at a time, connections kept alive.
    #[default]
    Http1,
    /// HTTP/2, many requests on one connection.
    H2,
}

/// How a pool reaches its backends (`docs/tls.md`, "HTTPS and HTTP/2 backends").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BackendTransport {
    /// `protocol`.
    pub(crate) protocol: Protocol,
    /// `tls_ca_file`: the roots for `https://` backends instead of the system's.
    pub(crate) ca_file: Option<PathBuf>,
    /// `tls_verify`: check the certificate chain and the name.
    pub(crate) verify: bool,
    /// `send_proxy_protocol`: the PROXY header sent on each new connection.
    pub(crate) send_proxy: Option<crate::proxy_protocol::Version>,
    /// `tls_client_cert`: the chain presented to `https://` backends that ask for one.
    pub(crate) client_cert: Option<PathBuf>,
    /// `tls_client_key`: its private key.
    pub(crate) client_key: Option<PathBuf>,
}

impl BackendTransport {
    /// The client certificate and its key, when both are set.
    pub(crate) fn client_pair(&self) -> Option<pem::CertPaths> {
        Some(pem::CertPaths {
            cert: self.client_cert.clone()?,
            key: self.client_key.clone()?,
            origin: "tls_client_cert".into(),
        })
    }
}

impl Default for BackendTransport {
    fn default() -> Self {
        BackendTransport {
            protocol: Protocol::Http1,
            ca_file: None,
            verify: true,
            send_proxy: None,
            client_cert: None,
            client_key: None,
        }
    }
}

/// Cookie-insert stickiness (`docs/operations.md`, "Sticky sessions").
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct StickySettings {
    /// The cookie's name; `None` = no stickiness.
    pub(crate) cookie: Option<String>,
    /// Its `Max-Age`; zero for a session cookie.
    pub(crate) max_age: Duration,
}

/// Every setting of `fulcrum serve`, validated.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settings {
    /// Proxy listener.
    pub(crate) listen: SocketAddr,
    /// Admin listener.
    pub(crate) admin: SocketAddr,
    /// The initial pool, in order.
    pub(crate) backends: Vec<BackendSpec>,
    /// The single-pool form's `discover` (or `--discover`, for the first pool): where
    /// its backends come from instead of `backends` (`docs/discovery.md`).
    pub(crate) discover: Option<DiscoverSpec>,
    /// The DNS servers discovery asks; empty = those of `/etc/resolv.conf`.
    pub(crate) resolvers: Vec<SocketAddr>,
    /// The per-pool settings at the top level: every pool's unless it sets its own.
    pub(crate) pool: PoolSettings,
    /// Peers whose forwarding headers are believed.
    pub(crate) trusted_proxies: Vec<IpNet>,
    /// `deny_clients`/`allow_clients`: who may connect to the proxy listeners.
    pub(crate) clients: crate::ipset::Admission,
    /// Shed above this many requests in flight; 0 = off.
    pub(crate) max_inflight: usize,
    /// Most answers compressed at once.
    pub(crate) compress_max_in_flight: usize,
    /// Client connections open at once; 0 = derived from the open-file limit.
    pub(crate) max_connections: usize,
    /// Connections one client IP may hold open; 0 = no limit.
    pub(crate) max_connections_per_client: u32,
    /// A client that takes no byte of an answer for this long is closed.
    pub(crate) send_timeout: Duration,
    /// The protocols an `Upgrade` is tunnelled for, in lower case.
    pub(crate) upgrade_protocols: Vec<String>,
    /// File holding the admin bearer token.
    pub(crate) admin_token_file: Option<PathBuf>,
    /// The admin token itself (from the file or `FULCRUM_ADMIN_TOKEN`).
    pub(crate) admin_token: Option<String>,
    /// Threads serving traffic.
    pub(crate) workers: usize,
    /// Log format.
    pub(crate) log_format: LogFormat,
    /// Where the access log goes.
    pub(crate) access_log: AccessLog,
    /// Its format; `None`: the logs' (`log_format`).
    pub(crate) access_log_format: Option<AccessFormat>,
    /// A request without a `traceparent` gets one.
    pub(crate) trace_context: bool,
    /// The config file, kept for reloads.
    pub(crate) config_file: Option<PathBuf>,
    /// Where this process offers its listening sockets to a successor (`--upgrade`).
    pub(crate) upgrade_socket: Option<PathBuf>,
    /// The file's `[[pools]]` entries, before the top-level values they build on are
    /// final.
    pub(crate) pool_drafts: Vec<pools::PoolDraft>,
    /// The pools, in order (made by `build`: see [`pools::materialize`]).
    pub(crate) pools: Vec<PoolSpec>,
    /// The routes, in order.
    pub(crate) routes: Vec<RouteSpec>,
    /// TLS termination.
    pub(crate) tls: tls::TlsSettings,
    /// Connections on the listeners start with a PROXY protocol header.
    pub(crate) accept_proxy_protocol: bool,
    /// Fleet mode: where pools, backends and routes live (`docs/fleet.md`).
    pub(crate) store: Option<StoreSpec>,
    /// The listeners whose connections go to TCP pools (`docs/tcp.md`).
    pub(crate) tcp_listeners: Vec<tcp::TcpListenerSpec>,
    /// The server names the HTTPS listener passes through to TCP pools unopened.
    pub(crate) tls_passthrough: Vec<tcp::PassthroughSpec>,
    /// How long an old process keeps its TCP connections after an upgrade.
    pub(crate) tcp_drain_timeout: Duration,
    /// `[tracing]`: spans over OTLP (`docs/tracing.md`); `None`: no span is built.
    pub(crate) tracing: Option<trace_settings::TraceSettings>,
}

/// `--store etcd://HOST:PORT[,HOST:PORT…]/PREFIX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoreSpec {
    /// `host:port` of each etcd endpoint, in the order to try them.
    pub(crate) endpoints: Vec<String>,
    /// Every key fulcrum reads or writes starts with it (`PREFIX/`).
    pub(crate) prefix: String,
}

impl StoreSpec {
    /// Parses the URL form; the error names what is wrong.
    pub(crate) fn parse(v: &str) -> Result<StoreSpec, String> {
        let expected = "expected etcd://HOST:PORT[,HOST:PORT…]/PREFIX";
        let rest = v
            .strip_prefix("etcd://")
            .ok_or_else(|| format!("invalid store '{v}' ({expected})"))?;
        let (hosts, prefix) = rest
            .split_once('/')
            .ok_or_else(|| format!("invalid store '{v}': no PREFIX ({expected})"))?;
        let prefix = prefix.trim_end_matches('/');
        if prefix.is_empty() || prefix.chars().any(|c| c.is_control() || c == ' ') {
            return Err(format!(
                "invalid store '{v}': the PREFIX must be non-empty, without spaces ({expected})"
            ));
        }
        let endpoints = hosts
            .split(',')
            .map(|h| match h.parse::<http::uri::Authority>() {
                Ok(a) if a.port_u16().is_some() && !a.host().is_empty() => Ok(h.to_string()),
                _ => Err(format!(
                    "invalid store '{v}': '{h}' is not HOST:PORT ({expected})"
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(StoreSpec {
            endpoints,
            prefix: format!("{prefix}/"),
        })
    }
}

impl Default for Settings {
    /// The built-in defaults: those of the options table, and the number of CPU cores
    /// for `workers`.
    fn default() -> Self {
        let mut s = Settings {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin: SocketAddr::from(([127, 0, 0, 1], 9090)),
            backends: Vec::new(),
            discover: None,
            resolvers: Vec::new(),
            pool: PoolSettings::blank(),
            trusted_proxies: Vec::new(),
            clients: Default::default(),
            max_inflight: 0,
            compress_max_in_flight: 0,
            max_connections: 0,
            max_connections_per_client: 0,
            send_timeout: Duration::ZERO,
            upgrade_protocols: Vec::new(),
            admin_token_file: None,
            admin_token: None,
            workers: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            log_format: LogFormat::Text,
            access_log: AccessLog::Stderr,
            access_log_format: None,
            trace_context: false,
            config_file: None,
            upgrade_socket: None,
            pool_drafts: Vec::new(),
            pools: Vec::new(),
            routes: Vec::new(),
            tls: tls::TlsSettings::default(),
            accept_proxy_protocol: false,
            store: None,
            tcp_listeners: Vec::new(),
            tls_passthrough: Vec::new(),
            tcp_drain_timeout: tcp::DEFAULT_DRAIN_TIMEOUT,
            tracing: None,
        };
        for o in options::OPTIONS {
            if let Some(d) = o.default {
                // Every default parses (a unit test of the table checks it).
                let r = (o.set)(&mut s, d);
                debug_assert!(r.is_ok(), "default of {}", o.key);
            }
        }
        s
    }
}

/// Raw, unvalidated values as typed on the command line.
#[derive(Debug, Clone, Default)]
pub(crate) struct RawFlags {
    /// `--config`.
    pub(crate) config: Option<PathBuf>,
    /// Every `--backend`, in order.
    pub(crate) backend: Vec<String>,
    /// `--discover`, for the first pool.
    pub(crate) discover: Option<String>,
    /// The options of the table given, by file key, in the order typed.
    pub(crate) values: Vec<(&'static str, String)>,
    /// `FULCRUM_ADMIN_TOKEN`.
    pub(crate) admin_token_env: Option<String>,
    /// `--upgrade`: take the listening sockets over from the process at
    /// `upgrade_socket` instead of binding them.
    pub(crate) upgrade: bool,
}

impl RawFlags {
    /// Adds the value of the option `key` (a key of the options table).
    pub(crate) fn with(mut self, key: &str, value: impl Into<String>) -> RawFlags {
        if let Some(o) = options::find(key) {
            self.values.push((o.key, value.into()));
        }
        self
    }
}

/// Builds the settings of `fulcrum serve`: defaults, then the file, then the flags.
/// Returns every error found (the caller prints the first).
pub(crate) fn build(flags: &RawFlags) -> Result<Settings, Vec<ConfigError>> {
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
    for (key, value) in &flags.values {
        if let Some(o) = options::find(key) {
            flag(&o.flag(), (o.set)(&mut s, value));
        }
    }
    apply_pool_flags(&mut s, flags, &mut flag);
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
    if flags.upgrade && s.upgrade_socket.is_none() {
        flag(
            "upgrade",
            Err("it needs --upgrade-socket PATH (or upgrade_socket in the file): the running process's socket".into()),
        );
    }
    check_store(&s, flags, &mut errors);
    pools::materialize(&mut s, flags);
    tls::finish(&mut s, &mut errors);
    check_whole(&s, flags, &mut errors);
    if errors.is_empty() {
        Ok(s)
    } else {
        Err(errors)
    }
}

/// `--backend` (each replaces the file's list) and `--discover`, for the first pool;
/// `flag` records a bad one.
fn apply_pool_flags(
    s: &mut Settings,
    flags: &RawFlags,
    flag: &mut impl FnMut(&str, Result<(), String>),
) {
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
    if let Some(d) = &flags.discover {
        match DiscoverSpec::parse_flag(d) {
            Ok(spec) => s.discover = Some(spec),
            Err(e) => flag("discover", Err(e)),
        }
    }
}

/// With a store, pools, backends and routes come from it alone.
fn check_store(s: &Settings, flags: &RawFlags, errors: &mut Vec<ConfigError>) {
    if s.store.is_none() {
        return;
    }
    let given = [
        (!flags.backend.is_empty(), "--backend"),
        (
            flags.backend.is_empty() && !s.backends.is_empty(),
            "backends",
        ),
        (!s.pool_drafts.is_empty(), "[[pools]]"),
        (!s.routes.is_empty(), "[[routes]]"),
        (s.discover.is_some(), "discover"),
    ];
    for (_, what) in given.iter().filter(|(on, _)| *on) {
        errors.push(ConfigError {
            origin: "--store".into(),
            message: format!(
                "pools, backends and routes live in the store: {what} cannot be used with it (add them through the admin API)"
            ),
        });
    }
}

/// Checks that concern several settings at once.
/// A pool's `tls_client_cert` and `tls_client_key`: both or neither, a chain and the key
/// that belongs to it.
fn check_client_pair(p: &PoolSpec, errors: &mut Vec<ConfigError>) {
    let t = &p.settings.transport;
    let (origin, message) = match (&t.client_cert, &t.client_key) {
        (None, None) => return,
        (Some(_), None) => (
            "tls_client_cert",
            "it needs tls_client_key FILE".to_string(),
        ),
        (None, Some(_)) => (
            "tls_client_key",
            "it needs tls_client_cert FILE".to_string(),
        ),
        (Some(_), Some(_)) => match t.client_pair().map(|c| pem::load_cert(&c)) {
            Some(Err(e)) => ("tls_client_key", e),
            _ => return,
        },
    };
    errors.push(ConfigError {
        origin: format!("pool '{}': {origin}", p.name),
        message,
    });
}

fn check_whole(s: &Settings, flags: &RawFlags, errors: &mut Vec<ConfigError>) {
    check_handover(s, errors);
    let mut cookies = std::collections::HashMap::new();
    check_discover_flags(s, flags, errors);
    check_discover_schemes(s, flags, errors);
    let tcp = s.tcp_listeners.iter().map(|l| l.listen);
    let listeners: Vec<SocketAddr> = [s.listen]
        .into_iter()
        .chain(s.tls.listen)
        .chain(tcp)
        .collect();
    check_tcp_listeners(s, errors);
    check_route_services(s, &listeners, errors);
    for p in &s.pools {
        check_backends(p, &listeners, errors);
        let t = &p.settings.transport;
        if t.send_proxy.is_some() && t.protocol == Protocol::H2 {
            errors.push(ConfigError {
                origin: format!("pool '{}': send_proxy_protocol", p.name),
                message: "a PROXY header names one client per connection, and protocol = \"h2\" shares connections between clients: use protocol = \"http1\" with it".into(),
            });
        }
        check_client_pair(p, errors);
        if let Some(ca) = &p.settings.transport.ca_file {
            if let Err(message) = pem::read_ca_file(ca) {
                errors.push(ConfigError {
                    origin: format!("pool '{}': tls_ca_file", p.name),
                    message,
                });
            }
        }
        if let Some(cookie) = &p.settings.sticky.cookie {
            if let Some(other) = cookies.insert(cookie.as_str(), p.name.as_str()) {
                errors.push(ConfigError {
                    origin: format!("pool '{}': sticky", p.name),
                    message: format!(
                        "the cookie '{cookie}' is pool '{other}''s too: a client of both would lose its backend in one as the other sets it; give each pool its own (sticky = {{ cookie = \"…\" }})",
                    ),
                });
            }
        }
        let o = &p.settings.outlier;
        if o.base_ejection > o.max_ejection {
            errors.push(ConfigError {
                origin: format!("pool '{}': outlier", p.name),
                message: format!(
                    "base_ejection {:?} is longer than max_ejection {:?}",
                    o.base_ejection, o.max_ejection
                ),
            });
        }
    }
    if s.accept_proxy_protocol && s.trusted_proxies.is_empty() {
        errors.push(ConfigError {
            origin: "accept_proxy_protocol".into(),
            message: "PROXY headers are taken only from trusted_proxies, and none is set: name the load balancers that send them (e.g. trusted_proxies = [\"10.0.0.0/8\"])".into(),
        });
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

/// No route's auth service or key set is one of `listeners` (fulcrum itself).
fn check_route_services(s: &Settings, listeners: &[SocketAddr], errors: &mut Vec<ConfigError>) {
    for (i, r) in s.routes.iter().enumerate() {
        let own = |u: &http::Uri| crate::loops::own_url(listeners, u);
        if let Some(message) = r.policies.own_service(own) {
            let origin = format!("route {i}");
            errors.push(ConfigError { origin, message });
        }
    }
}

/// `--discover` and backends, or `--backend` and `discover`, for the first pool: the
/// file's own combinations are reported at their line as it is read.
fn check_discover_flags(s: &Settings, flags: &RawFlags, errors: &mut Vec<ConfigError>) {
    let Some(first) = s.pools.first() else {
        return;
    };
    if first.discover.is_none() || first.backends.is_empty() {
        return;
    }
    let flag = match (&flags.discover, flags.backend.is_empty()) {
        (Some(_), _) => "--discover",
        (None, false) => "--backend",
        (None, true) => return,
    };
    errors.push(ConfigError {
        origin: flag.into(),
        message: format!(
            "pool '{}' would have both discover and backends: its backends come from one or the other",
            first.name
        ),
    });
}

/// A pool's `discover` whose scheme is of the other kind (`tcp` in an HTTP pool, `http`
/// or `https` in a TCP one), from `--discover` or the single-pool form's `discover`; a
/// `[[pools]]` entry's is reported at its line as it is read.
fn check_discover_schemes(s: &Settings, flags: &RawFlags, errors: &mut Vec<ConfigError>) {
    for (i, p) in s.pools.iter().enumerate() {
        let Some(Err(message)) = (p.discover.as_ref()).map(|d| d.fits(p.settings.mode)) else {
            continue;
        };
        let origin = match (i, &flags.discover) {
            (0, Some(_)) => "--discover",
            _ => "discover",
        };
        errors.push(ConfigError {
            origin: origin.into(),
            message,
        });
    }
}

/// Whether every worker's sockets fit the one message an upgrade hands them over in:
/// a plain socket, a TLS one with tls_listen, a UDP one with http3, one per TCP listener.
fn check_handover(s: &Settings, errors: &mut Vec<ConfigError>) {
    let per_worker = 1
        + usize::from(s.tls.listen.is_some())
        + usize::from(s.tls.listen.is_some() && s.tls.http3)
        + s.tcp_listeners.len();
    let most = (MAX_SOCKETS - 1) / per_worker;
    if s.upgrade_socket.is_some() && s.workers > most {
        errors.push(ConfigError {
            origin: "workers".into(),
            message: format!(
                "{} workers cannot be handed over through upgrade_socket (at most {most}: one message carries {} sockets, the admin API's included)",
                s.workers,
                MAX_SOCKETS
            ),
        });
    }
}

/// TCP listeners: each on an address of its own, and the single-pool form's backends
/// (which make an HTTP pool) none of them `tcp://`.
fn check_tcp_listeners(s: &Settings, errors: &mut Vec<ConfigError>) {
    let mut taken: Vec<SocketAddr> = [s.listen, s.admin]
        .into_iter()
        .chain(s.tls.listen)
        .collect();
    for l in &s.tcp_listeners {
        if l.listen.port() != 0 && taken.contains(&l.listen) {
            errors.push(ConfigError {
                origin: "tcp_listeners.listen".into(),
                message: format!("{} is another listener's address too", l.listen),
            });
        }
        taken.push(l.listen);
    }
    if s.pool_drafts.is_empty() {
        for b in &s.backends {
            if let Err(message) = tcp::url_fits(&b.url, tcp::PoolMode::Http) {
                let origin = "backend".into();
                errors.push(ConfigError { origin, message });
            }
        }
    }
}

/// URLs and names are unique within a pool, and none is one of `listeners`.
fn check_backends(pool: &PoolSpec, listeners: &[SocketAddr], errors: &mut Vec<ConfigError>) {
    let origin = if pool.name == DEFAULT_POOL {
        "backend".to_string()
    } else {
        format!("pool '{}': backend", pool.name)
    };
    errors.extend(
        (duplicate_backends(&pool.backends).into_iter())
            .chain(over_max_backends(pool))
            .chain(own_backends(pool, listeners))
            .map(|message| ConfigError {
                origin: origin.clone(),
                message,
            }),
    );
}

/// Why each backend of `pool` that is one of `listeners` (fulcrum itself) is refused.
fn own_backends<'a>(
    pool: &'a PoolSpec,
    listeners: &'a [SocketAddr],
) -> impl Iterator<Item = String> + 'a {
    (pool.backends.iter())
        .filter_map(|b| crate::loops::own_backend(listeners, b.authority.as_str(), b.addr))
}

/// Why `pool` lists more backends than its `max_backends`, if it does.
pub(crate) fn over_max_backends(pool: &PoolSpec) -> Option<String> {
    let (n, max) = (pool.backends.len(), pool.settings.max_backends);
    (n > max).then(|| format!("{n} backends, over the pool's max_backends ({max})"))
}

/// What is twice in `backends`: a URL, or a name (names label metrics and logs).
pub(crate) fn duplicate_backends(backends: &[BackendSpec]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut names = std::collections::HashSet::new();
    let mut out = Vec::new();
    for b in backends {
        if !seen.insert(b.url.as_str()) {
            out.push(format!("duplicate backend URL '{}'", b.url));
        } else if !names.insert(b.name.as_str()) {
            out.push(format!(
                "duplicate backend name '{}' (names label metrics and logs; give each backend its own with name=…)",
                b.name
            ));
        }
    }
    out
}

/// Validates a config file alone, as `fulcrum check` does.
pub(crate) fn check_file(path: &Path) -> Vec<ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let mut s = Settings::default();
            let mut errs = apply_file(&mut s, path, &text);
            pools::materialize(&mut s, &RawFlags::default());
            if errs.is_empty() {
                let mut extra = Vec::new();
                // Whole-file checks other than the token (the environment may provide it).
                s.admin_token = Some(String::new());
                tls::finish(&mut s, &mut extra);
                check_whole(&s, &RawFlags::default(), &mut extra);
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

/// The config parser's fuzz entry: `data` as a config file. Every problem must come
/// out as one line, as `fulcrum check` prints it.
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut s = Settings::default();
    for e in file::apply_file(&mut s, Path::new("fuzz.toml"), text) {
        let line = e.to_string();
        assert!(
            !line.contains('\n'),
            "an error of more than one line: {line:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::values::{parse_balance_factor, parse_duration};
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
        let file = AccessLog::File(PathBuf::from("/tmp/access.log"));
        for (text, want) in [
            ("access_log = false", AccessLog::Off),
            ("access_log = \"off\"", AccessLog::Off),
            ("access_log = true", AccessLog::Stderr),
            ("access_log = \"on\"", AccessLog::Stderr),
            ("access_log = \"stderr\"", AccessLog::Stderr),
            ("access_log = \"/tmp/access.log\"", file),
        ] {
            let mut s = Settings {
                access_log: AccessLog::Off,
                ..Default::default()
            };
            assert!(apply_file(&mut s, Path::new("f.toml"), text).is_empty());
            assert_eq!(s.access_log, want, "{text}");
        }
        let mut s = Settings::default();
        let errs = apply_file(&mut s, Path::new("f.toml"), "access_log = 3");
        assert!(errs[0].to_string().contains("access_log"), "{}", errs[0]);
        let flags = RawFlags::default().with("access_log", "/no/such/dir/access.log");
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
        // An unknown key is one problem among the others, each with its line.
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs[0].to_string().contains("line 1"), "{}", errs[0]);
        assert!(errs[1].to_string().contains("line 2"), "{}", errs[1]);
        assert!(errs[1].to_string().contains("colour"), "{}", errs[1]);
    }

    #[test]
    fn every_problem_of_a_file_is_listed_in_line_order() {
        let text = "retries = \"2\"\n[health]\ninterval = \"0s\"\nbogus = 1\n\
                    [[backends]]\nurl = \"http://127.0.0.1:1\"\nweight = 0\n\
                    [[backends]]\nurl = \"gopher://x\"\ncolor = 1\n";
        let mut s = Settings::default();
        let errs: Vec<String> = apply_file(&mut s, Path::new("f.toml"), text)
            .iter()
            .map(ToString::to_string)
            .collect();
        let want = [
            ("line 1", "retries"),
            ("line 3", "health.interval"),
            ("line 4", "health.bogus"),
            ("line 7", "backends.weight"),
            ("line 9", "gopher"),
            ("line 10", "backends.color"),
        ];
        assert_eq!(errs.len(), want.len(), "{errs:#?}");
        for (e, (line, what)) in errs.iter().zip(want) {
            assert!(e.contains(line) && e.contains(what), "{e}");
        }
        assert_eq!(
            s.pool.retries,
            Settings::default().pool.retries,
            "a bad value changes nothing"
        );
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
            ..Default::default()
        }
        .with("retries", "0");
        let s = build(&flags).unwrap();
        assert_eq!(s.pool.strategy, StrategyKind::WeightedRoundRobin);
        assert_eq!(s.pool.retries, 0);
        assert_eq!(s.pool.health.interval, Duration::from_secs(2));
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
        assert_eq!(s.pool.hash_key, HashKey::Cookie("sid".into()));
        assert_eq!(s.pool.hash_balance_factor, Some(1.5));
        let errs = apply_file(&mut s, Path::new("f.toml"), "\nhash_balance_factor = 125\n");
        assert!(errs[0].to_string().contains("line 2"), "{}", errs[0]);
        let flags = RawFlags::default()
            .with("hash_balance_factor", "2")
            .with("strategy", "maglev");
        let s = build(&flags).unwrap();
        assert_eq!(
            (s.pool.hash_balance_factor, s.pool.strategy),
            (Some(2.0), StrategyKind::Maglev)
        );
        let flags = RawFlags::default().with("hash_balance_factor", "1.0");
        let e = build(&flags).unwrap_err();
        assert!(
            e[0].to_string().starts_with("--hash-balance-factor: "),
            "{}",
            e[0]
        );
    }
}
