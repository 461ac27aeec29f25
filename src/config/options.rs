//! Every setting of `fulcrum serve`, declared once.
//!
//! One row per option holds its name, its value's form, its help, its default, how a
//! value is parsed into [`Settings`], whether a pool may set it for itself and whether
//! a running fulcrum can take a new value on reload. The command-line flags (`--` + the
//! key in kebab-case), the config file's keys (top level and `[[pools]]`), the defaults
//! of [`Settings::default`], validation and the reload report are all made from this
//! table: a new option is one new row and its field, in [`Settings`] or, for a
//! per-pool option, in [`PoolSettings`]. `--config` and the repeatable `--backend` are
//! structured and handled beside it.

use std::path::PathBuf;

pub(crate) use super::opt::{FileType, Opt, Reload};
use super::pool_settings::PoolSettings;
use super::values::*;
use super::Settings;

/// Looks up an option by its file key.
pub(crate) fn find(key: &str) -> Option<&'static Opt> {
    OPTIONS.iter().find(|o| o.key == key)
}

/// The options a pool may set for itself, in the order of the table.
pub(crate) fn pool_options() -> impl Iterator<Item = &'static Opt> {
    OPTIONS.iter().filter(|o| o.per_pool())
}

/// Looks up an option by its key inside the table `table` (`health`, `outlier`).
pub(crate) fn find_in(table: &str, key: &str) -> Option<&'static Opt> {
    OPTIONS.iter().find(|o| o.table_key == Some((table, key)))
}

/// The message for a key the table `table` does not have, written `shown`.
pub(crate) fn unknown_table_key(table: &str, shown: &str) -> String {
    let valid: Vec<&str> = OPTIONS
        .iter()
        .filter_map(|o| o.table_key)
        .filter(|(t, _)| *t == table)
        .map(|(_, k)| k)
        .collect();
    format!("unknown key '{shown}' (valid: {})", valid.join(", "))
}

macro_rules! restart {
    ($name:literal, $($field:ident).+) => {
        Reload::Restart($name, |a, b| a.$($field).+ != b.$($field).+)
    };
}

macro_rules! pool_restart {
    ($name:literal, $($field:ident).+) => {
        Reload::PoolRestart($name, |a, b| a.$($field).+ != b.$($field).+)
    };
}

/// Every option of `fulcrum serve`, in `--help` order.
pub(crate) static OPTIONS: &[Opt] = &[
    Opt {
        key: "listen",
        table_key: None,
        value_name: "ADDR",
        help: "Proxy listener",
        default: Some(super::DEFAULT_LISTEN),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| parse_addr(v).map(|x| s.listen = x),
        reload: restart!("listen", listen),
    },
    Opt {
        key: "tls_listen",
        table_key: None,
        value_name: "ADDR",
        help: "HTTPS listener (TLS 1.2 and 1.3, ALPN h2 and http/1.1); needs a certificate",
        default: None,
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| parse_addr(v).map(|x| s.tls.listen = Some(x)),
        reload: restart!("tls_listen", tls.listen),
    },
    Opt {
        key: "accept_proxy_protocol",
        table_key: None,
        value_name: "on|off",
        help: "Every connection on the listeners starts with a PROXY protocol header (v1 or v2), which names the client; one without is closed",
        default: Some("off"),
        default_text: None,
        file_type: FileType::Switch,
        set: |s, v| parse_on_off(v).map(|x| s.accept_proxy_protocol = x),
        reload: restart!("accept_proxy_protocol", accept_proxy_protocol),
    },
    Opt {
        key: "tls_cert",
        table_key: None,
        value_name: "FILE",
        help: "Certificate chain (PEM) of the HTTPS listener, the default one; more in [[tls.certs]]",
        default: None,
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| non_empty_path(v).map(|p| s.tls.cert_flag = Some(p)),
        reload: Reload::Live,
    },
    Opt {
        key: "tls_key",
        table_key: None,
        value_name: "FILE",
        help: "Private key (PEM) of --tls-cert",
        default: None,
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| non_empty_path(v).map(|p| s.tls.key_flag = Some(p)),
        reload: Reload::Live,
    },
    Opt {
        key: "redirect_https",
        table_key: None,
        value_name: "on|off",
        help: "Answer every request on the plain listener with 308 to the same URL on https",
        default: Some("off"),
        default_text: None,
        file_type: FileType::Switch,
        set: |s, v| parse_on_off(v).map(|x| s.tls.redirect_https = x),
        reload: restart!("redirect_https", tls.redirect_https),
    },
    Opt {
        key: "http3",
        table_key: None,
        value_name: "on|off",
        help: "Serve HTTP/3 (QUIC over UDP) on the tls_listen port too; also `http3` in [tls]",
        default: Some("off"),
        default_text: None,
        file_type: FileType::Switch,
        set: |s, v| parse_on_off(v).map(|x| s.tls.http3 = x),
        reload: restart!("http3", tls.http3),
    },
    Opt {
        key: "admin",
        table_key: None,
        value_name: "ADDR",
        help: "Admin API listener",
        default: Some(super::DEFAULT_ADMIN),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| parse_addr(v).map(|x| s.admin = x),
        reload: restart!("admin", admin),
    },
    Opt {
        key: "strategy",
        table_key: None,
        value_name: "NAME",
        help: "Balancing strategy",
        default: Some("round_robin"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| parse_strategy(v).map(|x| s.pool.strategy = x),
        reload: Reload::PoolLive,
    },
    Opt {
        key: "hash_key",
        table_key: None,
        value_name: "KEY",
        help: "Key of the hashing strategies: client_ip, header:NAME, cookie:NAME",
        default: Some("client_ip"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| parse_hash_key(v).map(|x| s.pool.hash_key = x),
        reload: pool_restart!("hash_key", hash_key),
    },
    Opt {
        key: "deny_clients",
        table_key: None,
        value_name: "CIDRS",
        help: "Client addresses whose connections to the proxy listeners are closed at accept, before any byte or handshake, CIDR[,CIDR…]",
        default: None,
        default_text: None,
        file_type: FileType::StrOrList,
        set: |s, v| parse_ip_set(v).map(|x| s.clients.deny = x),
        reload: Reload::Live,
    },
    Opt {
        key: "allow_clients",
        table_key: None,
        value_name: "CIDRS",
        help: "When set, the only client addresses the proxy listeners take (deny_clients first), CIDR[,CIDR…]",
        default: None,
        default_text: None,
        file_type: FileType::StrOrList,
        set: |s, v| parse_ip_set(v).map(|x| s.clients.allow = x),
        reload: Reload::Live,
    },
    Opt {
        key: "trusted_proxies",
        table_key: None,
        value_name: "CIDRS",
        help: "Peers whose X-Forwarded-For is believed, CIDR[,CIDR…]",
        default: None,
        default_text: None,
        file_type: FileType::StrOrList,
        set: |s, v| parse_cidrs(v).map(|x| s.trusted_proxies = x),
        reload: restart!("trusted_proxies", trusted_proxies),
    },
    Opt {
        key: "hash_balance_factor",
        table_key: None,
        value_name: "F",
        help: "Bounded load for the hashing strategies: a backend may hold at most F times its share of the requests in flight, F > 1; 0 = off",
        default: Some("0"),
        default_text: None,
        file_type: FileType::Float,
        set: |s, v| parse_balance_factor(v).map(|x| s.pool.hash_balance_factor = x),
        reload: Reload::PoolLive,
    },
    Opt {
        key: "health_path",
        table_key: Some(("health", "path")),
        value_name: "PATH",
        help: "Active health check path",
        default: Some("/health"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| parse_health_path(v).map(|x| s.pool.health.path = x),
        reload: pool_restart!("health.path", health.path),
    },
    Opt {
        key: "health_interval",
        table_key: Some(("health", "interval")),
        value_name: "DUR",
        help: "Time between health probes",
        default: Some("5s"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| positive(v).map(|x| s.pool.health.interval = x),
        reload: pool_restart!("health.interval", health.interval),
    },
    Opt {
        key: "health_timeout",
        table_key: Some(("health", "timeout")),
        value_name: "DUR",
        help: "Bound on one health probe",
        default: Some("2s"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| positive(v).map(|x| s.pool.health.timeout = x),
        reload: pool_restart!("health.timeout", health.timeout),
    },
    Opt {
        key: "healthy_threshold",
        table_key: Some(("health", "healthy_threshold")),
        value_name: "N",
        help: "Consecutive successes to become healthy",
        default: Some("2"),
        default_text: None,
        file_type: FileType::Int,
        set: |s, v| threshold(v).map(|x| s.pool.health.healthy_threshold = x),
        reload: pool_restart!("health.healthy_threshold", health.healthy_threshold),
    },
    Opt {
        key: "unhealthy_threshold",
        table_key: Some(("health", "unhealthy_threshold")),
        value_name: "N",
        help: "Consecutive failures to become unhealthy",
        default: Some("3"),
        default_text: None,
        file_type: FileType::Int,
        set: |s, v| threshold(v).map(|x| s.pool.health.unhealthy_threshold = x),
        reload: pool_restart!("health.unhealthy_threshold", health.unhealthy_threshold),
    },
    Opt {
        key: "outlier_consecutive_failures",
        table_key: Some(("outlier", "consecutive_failures")),
        value_name: "N",
        help: "Failures in a row on live traffic that eject a backend; 0 = passive checks off",
        default: Some("5"),
        default_text: None,
        file_type: FileType::Int,
        set: |s, v| parse_uint::<u32>(v, 0, 1000).map(|x| s.pool.outlier.consecutive_failures = x),
        reload: pool_restart!("outlier.consecutive_failures", outlier.consecutive_failures),
    },
    Opt {
        key: "outlier_base_ejection",
        table_key: Some(("outlier", "base_ejection")),
        value_name: "DUR",
        help: "Length of a first ejection; the n-th lasts n times as long",
        default: Some("30s"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| positive(v).map(|x| s.pool.outlier.base_ejection = x),
        reload: pool_restart!("outlier.base_ejection", outlier.base_ejection),
    },
    Opt {
        key: "outlier_max_ejection",
        table_key: Some(("outlier", "max_ejection")),
        value_name: "DUR",
        help: "Longest ejection",
        default: Some("300s"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| positive(v).map(|x| s.pool.outlier.max_ejection = x),
        reload: pool_restart!("outlier.max_ejection", outlier.max_ejection),
    },
    Opt {
        key: "outlier_max_ejected_percent",
        table_key: Some(("outlier", "max_ejected_percent")),
        value_name: "P",
        help: "At most P % of a pool's backends (rounded down) ejected at once",
        default: Some("50"),
        default_text: None,
        file_type: FileType::Int,
        set: |s, v| parse_uint::<u32>(v, 0, 100).map(|x| s.pool.outlier.max_ejected_percent = x),
        reload: pool_restart!("outlier.max_ejected_percent", outlier.max_ejected_percent),
    },
    Opt {
        key: "outlier_success_rate",
        table_key: Some(("outlier", "success_rate")),
        value_name: "PAIRS",
        help: "Success-rate ejection: interval=10s,min_hosts=3,min_requests=20,stdev_factor=1.9 (any subset), or off",
        default: Some("off"),
        default_text: None,
        file_type: FileType::Pairs,
        set: |s, v| super::outlier::parse_success_rate(v).map(|x| s.pool.outlier.success_rate = x),
        reload: pool_restart!("outlier.success_rate", outlier.success_rate),
    },
    Opt {
        key: "queue_timeout",
        table_key: None,
        value_name: "DUR",
        help: "Longest wait in a pool's queue when every eligible backend is at its max_conns, then 503",
        default: Some("5s"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| positive(v).map(|x| s.pool.queue_timeout = x),
        reload: pool_restart!("queue_timeout", queue_timeout),
    },
    Opt {
        key: "max_queue",
        table_key: None,
        value_name: "N",
        help: "Most requests waiting in a pool's queue; over it, 503 at once",
        default: Some("1024"),
        default_text: None,
        file_type: FileType::Int,
        set: |s, v| parse_uint::<usize>(v, 0, 1_000_000).map(|x| s.pool.max_queue = x),
        reload: pool_restart!("max_queue", max_queue),
    },
    Opt {
        key: "max_backends",
        table_key: None,
        value_name: "N",
        help: "Most backends in a pool, backups and draining ones included; a discovered list over it is refused whole",
        default: Some("1000"),
        default_text: None,
        file_type: FileType::Int,
        set: |s, v| parse_uint::<usize>(v, 1, 100_000).map(|x| s.pool.max_backends = x),
        reload: pool_restart!("max_backends", max_backends),
    },
    Opt {
        key: "max_conns",
        table_key: None,
        value_name: "N|auto",
        help: "Most requests in flight on each backend of a pool that sets none itself: N (0 = no limit), or auto (follows its latency)",
        default: Some("0"),
        default_text: None,
        file_type: FileType::IntOrStr,
        set: |s, v| parse_max_conns(v).map(|x| s.pool.max_conns = x),
        reload: pool_restart!("max_conns", max_conns),
    },
    Opt {
        key: "max_conns_auto",
        table_key: None,
        value_name: "PAIRS",
        help: "Bounds of an adaptive max_conns: min=N,max=N",
        default: Some("min=1,max=1000"),
        default_text: None,
        file_type: FileType::Pairs,
        set: |s, v| parse_auto_bounds(v).map(|x| s.pool.max_conns_auto = x),
        reload: pool_restart!("max_conns_auto", max_conns_auto),
    },
    Opt {
        key: "sticky_cookie",
        table_key: Some(("sticky", "cookie")),
        value_name: "NAME",
        help: "Cookie-insert stickiness: a client's cookie NAME sends it back to the same backend",
        default: None,
        default_text: Some("off"),
        file_type: FileType::Str,
        set: |s, v| parse_cookie_name(v).map(|x| s.pool.sticky.cookie = Some(x)),
        reload: pool_restart!("sticky.cookie", sticky.cookie),
    },
    Opt {
        key: "sticky_max_age",
        table_key: Some(("sticky", "max_age")),
        value_name: "DUR",
        help: "Max-Age of the sticky cookie; 0s = a session cookie",
        default: Some("0s"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| parse_duration(v).map(|x| s.pool.sticky.max_age = x),
        reload: pool_restart!("sticky.max_age", sticky.max_age),
    },
    Opt {
        key: "panic_threshold",
        table_key: None,
        value_name: "P",
        help: "Below P % of a pool's primary backends eligible, and no backup, balance over all of them, healthy or not; 0 = off",
        default: Some("0"),
        default_text: None,
        file_type: FileType::Int,
        set: |s, v| parse_uint::<u32>(v, 0, 100).map(|x| s.pool.panic_threshold = x),
        reload: pool_restart!("panic_threshold", panic_threshold),
    },
    Opt {
        key: "connect_timeout",
        table_key: None,
        value_name: "DUR",
        help: "TCP connect bound",
        default: Some("3s"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| positive(v).map(|x| s.pool.connect_timeout = x),
        reload: pool_restart!("connect_timeout", connect_timeout),
    },
    Opt {
        key: "protocol",
        table_key: None,
        value_name: "PROTO",
        help: "HTTP version to the backends: http1 (one request per connection at a time) or h2 (multiplexed; prior knowledge over http://, ALPN over https://)",
        default: Some("http1"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| parse_protocol(v).map(|x| s.pool.transport.protocol = x),
        reload: pool_restart!("protocol", transport.protocol),
    },
    Opt {
        key: "send_proxy_protocol",
        table_key: None,
        value_name: "off|v1|v2",
        help: "Send a PROXY protocol header naming the client in front of every backend connection (each then carries one client's requests)",
        default: Some("off"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| parse_send_proxy(v).map(|x| s.pool.transport.send_proxy = x),
        reload: pool_restart!("send_proxy_protocol", transport.send_proxy),
    },
    Opt {
        key: "tls_ca_file",
        table_key: None,
        value_name: "FILE",
        help: "CA certificates (PEM) that https:// backends are verified against, instead of the system roots",
        default: None,
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| non_empty_path(v).map(|p| s.pool.transport.ca_file = Some(p)),
        reload: pool_restart!("tls_ca_file", transport.ca_file),
    },
    Opt {
        key: "tls_client_cert",
        table_key: None,
        value_name: "FILE",
        help: "Certificate chain (PEM) presented to https:// backends that ask for a client certificate (with tls_client_key)",
        default: None,
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| non_empty_path(v).map(|p| s.pool.transport.client_cert = Some(p)),
        reload: pool_restart!("tls_client_cert", transport.client_cert),
    },
    Opt {
        key: "tls_client_key",
        table_key: None,
        value_name: "FILE",
        help: "The private key (PEM) of tls_client_cert",
        default: None,
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| non_empty_path(v).map(|p| s.pool.transport.client_key = Some(p)),
        reload: pool_restart!("tls_client_key", transport.client_key),
    },
    Opt {
        key: "tls_verify",
        table_key: None,
        value_name: "on|off",
        help: "Verify https:// backends' certificates and names; off only for testing (a warning is logged)",
        default: Some("on"),
        default_text: None,
        file_type: FileType::Switch,
        set: |s, v| parse_on_off(v).map(|x| s.pool.transport.verify = x),
        reload: pool_restart!("tls_verify", transport.verify),
    },
    Opt {
        key: "upstream_timeout",
        table_key: None,
        value_name: "DUR",
        help: "Request sent → response headers bound, then 504",
        default: Some("30s"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| positive(v).map(|x| s.pool.upstream_timeout = x),
        reload: pool_restart!("upstream_timeout", upstream_timeout),
    },
    Opt {
        key: "retries",
        table_key: None,
        value_name: "N",
        help: "Extra attempts for a failed idempotent request",
        default: Some("2"),
        default_text: None,
        file_type: FileType::Int,
        set: |s, v| parse_uint::<u32>(v, 0, 10).map(|x| s.pool.retries = x),
        reload: pool_restart!("retries", retries),
    },
    Opt {
        key: "retry_on",
        table_key: None,
        value_name: "LIST",
        help: "What sends a request to another backend: connect (always), reset, timeout, a status (503) or a class (5xx), ENTRY[,ENTRY…]",
        default: Some("connect,reset,timeout"),
        default_text: None,
        file_type: FileType::StrOrList,
        set: |s, v| super::retry::RetryOn::parse(v).map(|x| s.pool.retry_on = x),
        reload: pool_restart!("retry_on", retry_on),
    },
    Opt {
        key: "retry_non_idempotent",
        table_key: None,
        value_name: "on|off",
        help: "Send any method again after a failure or a retry_on status, not only GET, HEAD, OPTIONS, PUT and DELETE",
        default: Some("off"),
        default_text: None,
        file_type: FileType::Switch,
        set: |s, v| parse_on_off(v).map(|x| s.pool.retry_non_idempotent = x),
        reload: pool_restart!("retry_non_idempotent", retry_non_idempotent),
    },
    Opt {
        key: "retry_body_limit",
        table_key: None,
        value_name: "SIZE",
        help: "Largest request body (of stated length) kept so that a retry_on status can send it again; a larger one is not retried on status",
        default: Some("64k"),
        default_text: None,
        file_type: FileType::Size,
        set: |s, v| parse_size(v).map(|x| s.pool.retry_body_limit = x.unwrap_or(0)),
        reload: pool_restart!("retry_body_limit", retry_body_limit),
    },
    Opt {
        key: "try_timeout",
        table_key: None,
        value_name: "DUR",
        help: "Each try's bound on its answer head, retried as timeout; upstream_timeout bounds them all [default: none]",
        default: None,
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| positive(v).map(|x| s.pool.try_timeout = Some(x)),
        reload: pool_restart!("try_timeout", try_timeout),
    },
    Opt {
        key: "hedge_after",
        table_key: Some(("hedge", "after")),
        value_name: "DUR|pNN",
        help: "Send an idempotent request without a body to another backend too when no answer head came after DUR, or after the pool's pNN latency (p95); the first answer wins [default: off]",
        default: None,
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| super::retry::HedgeAfter::parse(v).map(|x| s.pool.hedge_after = Some(x)),
        reload: pool_restart!("hedge.after", hedge_after),
    },
    Opt {
        key: "hedge_max",
        table_key: Some(("hedge", "max")),
        value_name: "N",
        help: "Most hedges one request sends, each after hedge.after more; within retries and the retry budget",
        default: Some("1"),
        default_text: None,
        file_type: FileType::Int,
        set: |s, v| parse_uint::<u32>(v, 1, 5).map(|x| s.pool.hedge_max = x),
        reload: pool_restart!("hedge.max", hedge_max),
    },
    Opt {
        key: "max_inflight",
        table_key: None,
        value_name: "N",
        help: "Above N requests in flight answer 503 at once; 0 = off",
        default: Some("0"),
        default_text: None,
        file_type: FileType::Int,
        set: |s, v| parse_uint::<usize>(v, 0, 10_000_000).map(|x| s.max_inflight = x),
        reload: restart!("max_inflight", max_inflight),
    },
    Opt {
        key: "compress_max_in_flight",
        table_key: None,
        value_name: "N",
        help: "Most answers compressed at once; beyond it answers go out uncompressed",
        default: Some("1024"),
        default_text: None,
        file_type: FileType::Int,
        set: |s, v| parse_uint::<usize>(v, 1, 1_000_000).map(|x| s.compress_max_in_flight = x),
        reload: restart!("compress_max_in_flight", compress_max_in_flight),
    },
    Opt {
        key: "max_connections_per_client",
        table_key: None,
        value_name: "N",
        help: "Connections one client IP may hold open, all listeners together; a new one over it is closed at once (0 = no limit)",
        default: Some("0"),
        default_text: None,
        file_type: FileType::Int,
        set: |s, v| parse_uint::<u32>(v, 0, 10_000_000).map(|x| s.max_connections_per_client = x),
        reload: restart!("max_connections_per_client", max_connections_per_client),
    },
    Opt {
        key: "max_connections",
        table_key: None,
        value_name: "N",
        help: "Client connections open at once on the proxy listener; at the cap new ones wait in the kernel's queue; 0 = from the open-file limit",
        default: Some("0"),
        default_text: None,
        file_type: FileType::Int,
        set: |s, v| parse_uint::<usize>(v, 0, 10_000_000).map(|x| s.max_connections = x),
        reload: restart!("max_connections", max_connections),
    },
    Opt {
        key: "send_timeout",
        table_key: None,
        value_name: "DUR",
        help: "A client that takes no byte of an answer for this long is closed, and its slot freed",
        default: Some("60s"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| positive(v).map(|x| s.send_timeout = x),
        reload: restart!("send_timeout", send_timeout),
    },
    Opt {
        key: "max_request_body",
        table_key: None,
        value_name: "SIZE",
        help: "Largest request body (512k, 1m, 2g); a larger one gets 413; 0 = no limit",
        default: Some("0"),
        default_text: None,
        file_type: FileType::Size,
        set: |s, v| parse_size(v).map(|x| s.pool.max_request_body = x),
        reload: pool_restart!("max_request_body", max_request_body),
    },
    Opt {
        key: "upgrade_protocols",
        table_key: None,
        value_name: "NAMES",
        help: "Protocols an Upgrade request is tunnelled for, NAME[,NAME…]; any other Upgrade is removed and the request goes on as plain HTTP",
        default: Some("websocket"),
        default_text: None,
        file_type: FileType::StrOrList,
        set: |s, v| parse_upgrade_protocols(v).map(|x| s.upgrade_protocols = x),
        reload: restart!("upgrade_protocols", upgrade_protocols),
    },
    Opt {
        key: "slow_start",
        table_key: None,
        value_name: "DUR",
        help: "Weight ramp for joining backends",
        default: Some("0s"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| parse_duration(v).map(|x| s.pool.slow_start = x),
        reload: pool_restart!("slow_start", slow_start),
    },
    Opt {
        key: "ewma_alpha",
        table_key: None,
        value_name: "F",
        help: "Smoothing factor of the latency average, 0 < F <= 1",
        default: Some("0.1"),
        default_text: None,
        file_type: FileType::Float,
        set: |s, v| parse_alpha(v).map(|x| s.pool.ewma_alpha = x),
        reload: pool_restart!("ewma_alpha", ewma_alpha),
    },
    Opt {
        key: "admin_token_file",
        table_key: None,
        value_name: "FILE",
        help: "File holding the admin bearer token",
        default: None,
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| {
            s.admin_token_file = Some(PathBuf::from(v));
            Ok(())
        },
        // What a reload compares is the token it gives (or the environment's).
        reload: restart!("admin_token", admin_token),
    },
    Opt {
        key: "store",
        table_key: None,
        value_name: "URL",
        help: "Fleet mode: pools, backends and routes live in etcd at etcd://HOST:PORT[,HOST:PORT…]/PREFIX, shared by every instance",
        default: None,
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| super::StoreSpec::parse(v).map(|x| s.store = Some(x)),
        reload: restart!("store", store),
    },
    Opt {
        key: "resolvers",
        table_key: None,
        value_name: "ADDR[,ADDR…]",
        help: "DNS servers that discovery asks (IP or IP:PORT, port 53 by default)",
        default: None,
        default_text: Some("the nameservers of /etc/resolv.conf"),
        file_type: FileType::StrOrList,
        set: |s, v| parse_resolvers(v).map(|x| s.resolvers = x),
        reload: Reload::Live,
    },
    Opt {
        key: "upgrade_socket",
        table_key: None,
        value_name: "PATH",
        help: "Unix socket where a new fulcrum started with --upgrade takes the listening sockets over",
        default: None,
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| {
            if v.is_empty() {
                return Err("the path is empty".into());
            }
            s.upgrade_socket = Some(PathBuf::from(v));
            Ok(())
        },
        reload: restart!("upgrade_socket", upgrade_socket),
    },
    Opt {
        key: "workers",
        table_key: None,
        value_name: "N",
        help: "Threads serving traffic",
        default: None,
        default_text: Some("number of CPU cores"),
        file_type: FileType::Int,
        set: |s, v| parse_workers(v).map(|x| s.workers = x),
        reload: restart!("workers", workers),
    },
    Opt {
        key: "log_format",
        table_key: None,
        value_name: "FORMAT",
        help: "Log format on stderr: text or json",
        default: Some("text"),
        default_text: None,
        file_type: FileType::Str,
        set: |s, v| parse_log_format(v).map(|x| s.log_format = x),
        reload: restart!("log_format", log_format),
    },
    Opt {
        key: "access_log",
        table_key: None,
        value_name: "on|off|stderr|FILE",
        help: "One access log line per request: on stderr (on, stderr), off, or appended to FILE (reopened on SIGUSR1)",
        default: Some("on"),
        default_text: None,
        file_type: FileType::Switch,
        set: |s, v| parse_access_log(v).map(|x| s.access_log = x),
        reload: restart!("access_log", access_log),
    },
    Opt {
        key: "trace_context",
        table_key: None,
        value_name: "on|off",
        help: "Give a request without a W3C traceparent one, its trace id from the request id (a traceparent is always forwarded)",
        default: Some("off"),
        default_text: None,
        file_type: FileType::Switch,
        set: |s, v| parse_on_off(v).map(|x| s.trace_context = x),
        reload: restart!("trace_context", trace_context),
    },
    Opt {
        key: "access_log_format",
        table_key: None,
        value_name: "text|json|combined",
        help: "The access log's lines: text, json or combined (Apache's)",
        default: None,
        default_text: Some("as --log-format"),
        file_type: FileType::Str,
        set: |s, v| parse_access_format(v).map(|x| s.access_log_format = Some(x)),
        reload: restart!("access_log_format", access_log_format),
    },
];

/// The settings that differ between `a` and `b` and are fixed while running, by the
/// names the reload report gives them, in the order of the table. The per-pool ones are
/// the top-level values here (those of the single-pool form).
pub(crate) fn restart_required(a: &Settings, b: &Settings) -> Vec<&'static str> {
    OPTIONS
        .iter()
        .filter_map(|o| match o.reload {
            Reload::Restart(name, changed) if changed(a, b) => Some(name),
            Reload::PoolRestart(name, changed) if changed(&a.pool, &b.pool) => Some(name),
            _ => None,
        })
        .collect()
}

/// A pool's own settings that differ between `a` and `b` and that a running pool keeps
/// until a restart, in the order of the table.
pub(crate) fn pool_restart_required(a: &PoolSettings, b: &PoolSettings) -> Vec<&'static str> {
    OPTIONS
        .iter()
        .filter_map(|o| match o.reload {
            Reload::PoolRestart(name, changed) if changed(a, b) => Some(name),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_and_every_default_parses() {
        for (i, o) in OPTIONS.iter().enumerate() {
            assert!(
                OPTIONS[..i].iter().all(|p| p.key != o.key),
                "{} twice",
                o.key
            );
            let mut s = Settings::default();
            if let Some(d) = o.default {
                assert_eq!((o.set)(&mut s, d), Ok(()), "{}", o.key);
            }
        }
    }

    #[test]
    fn a_reload_reports_what_needs_a_restart() {
        let a = Settings::default();
        let mut b = a.clone();
        assert!(restart_required(&a, &b).is_empty());
        (find("health_interval").unwrap().set)(&mut b, "1s").unwrap();
        (find("strategy").unwrap().set)(&mut b, "lc").unwrap();
        b.admin_token = Some("t".into());
        assert_eq!(restart_required(&a, &b), ["health.interval", "admin_token"]);
    }

    #[test]
    fn a_pools_own_settings_are_the_per_pool_rows() {
        let mut s = Settings::default();
        let before = s.pool.clone();
        for (key, value) in [
            ("health_interval", "1s"),
            ("retries", "3"),
            ("strategy", "lc"),
        ] {
            let o = find(key).unwrap();
            assert!(o.per_pool(), "{key}");
            (o.set)(&mut s, value).unwrap();
        }
        assert_eq!(
            pool_restart_required(&before, &s.pool),
            ["health.interval", "retries"],
            "the strategy is applied live"
        );
        assert!(!find("listen").unwrap().per_pool());
        assert!(pool_options().all(|o| o.per_pool()));
        assert_eq!(pool_options().count(), 39);
    }
}
