//! The proxy-wide settings the request path reads, taken from the whole settings once
//! (and again at a reload).

use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

use super::plain_first::PlainFirst;
use crate::config::Settings;

/// The proxy-wide settings the request path reads (a pool's own are on the
/// [`Pool`]).
#[derive(Debug, Clone)]
pub(crate) struct ProxySettings {
    /// Shed above this many in flight (0 = off).
    pub(crate) max_inflight: usize,
    /// Peers whose forwarding headers are believed.
    pub(crate) trusted_proxies: Vec<IpNet>,
    /// The access log's format; `None` when it is off.
    pub(crate) access_log: Option<crate::config::AccessFormat>,
    /// What the plain listener answers itself before any route (`http-01`,
    /// `redirect_https`); `None` when neither is on, one check per request.
    pub(crate) plain_first: Option<Arc<PlainFirst>>,
    /// `accept_proxy_protocol`.
    pub(crate) accept_proxy_protocol: bool,
    /// `send_timeout`: how long a client may take no byte of an answer.
    pub(crate) send_timeout: Duration,
    /// `upgrade_protocols`: what an `Upgrade` is tunnelled for, in lower case.
    pub(crate) upgrade_protocols: Arc<[String]>,
    /// `max_connections_per_client`, shared by every worker; `None` when off.
    pub(crate) per_client: Option<Arc<crate::listeners::PerClient>>,
    /// `trace_context`: a request without a `traceparent` gets one.
    pub(crate) trace_context: bool,
    /// `[[tls_passthrough]]`: the names the HTTPS listener passes through unopened.
    pub(crate) passthrough: Arc<[crate::config::tcp::PassthroughSpec]>,
    /// `tcp_drain_timeout`: how long TCP connections outlive an upgrade.
    pub(crate) tcp_drain_timeout: Duration,
}

/// The access log's format when there is one: its own, else the logs'.
fn access_format(s: &Settings) -> Option<crate::config::AccessFormat> {
    use crate::config::{AccessFormat, AccessLog, LogFormat};
    if s.access_log == AccessLog::Off {
        return None;
    }
    Some(s.access_log_format.unwrap_or(match s.log_format {
        LogFormat::Text => AccessFormat::Text,
        LogFormat::Json => AccessFormat::Json,
    }))
}

impl ProxySettings {
    /// The request-path part of the settings.
    pub(crate) fn from_settings(s: &Settings) -> Self {
        ProxySettings {
            max_inflight: s.max_inflight,
            trusted_proxies: s.trusted_proxies.clone(),
            access_log: access_format(s),
            trace_context: s.trace_context,
            passthrough: s.tls_passthrough.clone().into(),
            tcp_drain_timeout: s.tcp_drain_timeout,
            plain_first: None,
            accept_proxy_protocol: s.accept_proxy_protocol,
            send_timeout: s.send_timeout,
            upgrade_protocols: s.upgrade_protocols.clone().into(),
            per_client: (s.max_connections_per_client > 0).then(|| {
                Arc::new(crate::listeners::PerClient::new(
                    s.max_connections_per_client,
                ))
            }),
        }
    }
}

impl ProxySettings {
    /// With `accept_proxy_protocol`, whether a connection from `peer` must start with a
    /// PROXY protocol header (`true`: a trusted proxy) or must not (`false`); `None`
    /// when headers are not accepted at all.
    pub(crate) fn proxy_protocol_from(&self, peer: std::net::IpAddr) -> Option<bool> {
        self.accept_proxy_protocol
            .then(|| crate::trust::is_trusted(&self.trusted_proxies, peer))
    }

    /// On a TCP listener that accepts PROXY headers (`accept`), `Some(true)` when a
    /// connection from `peer` must start with one (a trusted proxy). Any other peer's
    /// bytes are its protocol's, passed on as they come, unread: a server that speaks
    /// first (MySQL's greeting, SMTP's banner) must not wait for the client to.
    pub(crate) fn tcp_proxy_protocol_from(
        &self,
        accept: bool,
        peer: std::net::IpAddr,
    ) -> Option<bool> {
        (accept && crate::trust::is_trusted(&self.trusted_proxies, peer)).then_some(true)
    }
}
