//! TCP pools as configured (`docs/tcp.md`): a pool's `mode`, its `idle_timeout` and
//! its health check's `kind`, the `[[tcp_listeners]]` that feed TCP pools, and the
//! `[[tls_passthrough]]` names whose TLS the HTTPS listener hands to one unopened.

use std::net::SocketAddr;
use std::time::Duration;

use crate::ipset::Admission;
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
