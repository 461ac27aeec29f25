//! `/metrics`: the series `docs/operations.md` lists, in the Prometheus (OpenMetrics) text
//! format, written with prometheus-client.
//!
//! Nothing is registered per request: the request path only bumps atomics on the
//! [`Backend`](crate::backend::Backend), the pools' hub and the route counters; a collector
//! reads them at scrape time. Labels are bounded: a backend's name and its pool's, a
//! status class, a route's index.

use std::sync::Arc;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::backend::Backend;
use crate::config::tcp::PoolMode;
use crate::site::Site;
use crate::stats::STATUS_CLASSES;

/// The content type of the answer.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug)]
struct SiteCollector(Arc<Site>);

/// Encodes one gauge family with one series per backend.
fn per_backend_gauge<F>(
    enc: &mut DescriptorEncoder,
    backends: &[Arc<crate::backend::Backend>],
    name: &str,
    help: &str,
    value: F,
) -> Result<(), std::fmt::Error>
where
    F: Fn(&crate::backend::Backend) -> f64,
{
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for b in backends {
        let labels = [("backend", b.name.as_str()), ("pool", &*b.pool)];
        ConstGauge::new(value(b)).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: u64,
) -> Result<(), std::fmt::Error> {
    ConstCounter::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Counter)?)
}

impl prometheus_client::collector::Collector for SiteCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let backends: Vec<Arc<Backend>> =
            self.0.pools().iter().flat_map(|p| p.backends()).collect();
        encode_backend_counters(&mut enc, &backends)?;
        encode_backend_gauges(&mut enc, &backends)?;
        encode_backend_checks(&mut enc, &backends)?;
        encode_proxy_wide(&mut enc, &self.0)
    }
}

/// Per backend: requests by status class and the duration histogram. Counters are
/// named without `_total`: the encoder appends it.
fn encode_backend_counters(
    enc: &mut DescriptorEncoder,
    backends: &[Arc<Backend>],
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(
        "fulcrum_requests",
        "Requests answered, by backend and status class.",
        None,
        MetricType::Counter,
    )?;
    for b in backends {
        for (class, n) in STATUS_CLASSES.iter().zip(b.live.stats.by_class()) {
            let labels = [
                ("backend", b.name.as_str()),
                ("code", class),
                ("pool", &*b.pool),
            ];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }
    }

    let mut m = enc.encode_descriptor(
        "fulcrum_request_duration_seconds",
        "From a request's arrival until its response was sent whole.",
        None,
        MetricType::Histogram,
    )?;
    for b in backends {
        let (sum, count, buckets) = b.live.stats.duration.read();
        let labels = [("backend", b.name.as_str()), ("pool", &*b.pool)];
        m.encode_family(&labels)?
            .encode_histogram::<[(&str, &str); 0]>(sum, count, &buckets, None)?;
    }

    Ok(())
}

/// Per backend: health probes by result, and ejections.
fn encode_backend_checks(
    enc: &mut DescriptorEncoder,
    backends: &[Arc<Backend>],
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(
        "fulcrum_health_checks",
        "Active health probes, by result.",
        None,
        MetricType::Counter,
    )?;
    for b in backends {
        let (ok, failed) = b.live.stats.probes();
        for (result, n) in [("success", ok), ("failure", failed)] {
            let labels = [
                ("backend", b.name.as_str()),
                ("result", result),
                ("pool", &*b.pool),
            ];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }
    }

    let mut m = enc.encode_descriptor(
        "fulcrum_bad_responses",
        "Backend answers refused with 502 as unsafe to forward, by reason.",
        None,
        MetricType::Counter,
    )?;
    for b in backends {
        let counts = b.live.stats.bad_answers();
        for (why, n) in crate::stats::BadAnswer::ALL.iter().zip(counts) {
            let labels = [
                ("backend", b.name.as_str()),
                ("reason", why.label()),
                ("pool", &*b.pool),
            ];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }
    }

    let mut m = enc.encode_descriptor(
        "fulcrum_ejections",
        "Ejections by passive outlier detection.",
        None,
        MetricType::Counter,
    )?;
    for b in backends {
        let labels = [("backend", b.name.as_str()), ("pool", &*b.pool)];
        ConstCounter::new(u64::from(b.live.outlier.count())).encode(m.encode_family(&labels)?)?;
    }

    let mut m = enc.encode_descriptor(
        "fulcrum_load_reports_malformed",
        "endpoint-load-metrics values from the backend that could not be read (ignored).",
        None,
        MetricType::Counter,
    )?;
    for b in backends {
        let labels = [("backend", b.name.as_str()), ("pool", &*b.pool)];
        ConstCounter::new(b.malformed_reports()).encode(m.encode_family(&labels)?)?;
    }

    Ok(())
}

/// Per backend: what it is doing now.
fn encode_backend_gauges(
    enc: &mut DescriptorEncoder,
    backends: &[Arc<Backend>],
) -> Result<(), std::fmt::Error> {
    per_backend_gauge(
        enc,
        backends,
        "fulcrum_backend_up",
        "1 when the health checks find the backend healthy.",
        |b| f64::from(u8::from(b.control.healthy())),
    )?;
    per_backend_gauge(
        enc,
        backends,
        "fulcrum_backend_active_requests",
        "Requests in flight on the backend.",
        |b| b.in_flight() as f64,
    )?;
    per_backend_gauge(
        enc,
        backends,
        "fulcrum_backend_latency_ewma_seconds",
        "Latency average (EWMA) of the backend; NaN before the first sample.",
        |b| b.avg_latency().map_or(f64::NAN, |d| d.as_secs_f64()),
    )?;
    per_backend_gauge(
        enc,
        backends,
        "fulcrum_backend_effective_weight",
        "Weight the weighted strategies use now (slow start applied).",
        |b| b.effective_weight(),
    )?;
    per_backend_gauge(
        enc,
        backends,
        "fulcrum_backend_effective_load",
        "Requests in flight divided by the effective weight.",
        |b| b.in_flight() as f64 / b.effective_weight().max(f64::MIN_POSITIVE),
    )?;
    per_backend_gauge(
        enc,
        backends,
        "fulcrum_backend_reported_utilization",
        "Utilization in the backend's latest fresh load report; NaN without one.",
        |b| reported_utilization(b).unwrap_or(f64::NAN),
    )?;

    Ok(())
}

/// The utilization of a backend's latest fresh load report.
fn reported_utilization(b: &Backend) -> Option<f64> {
    b.load_report(crate::backend::clock_ns())?.utilization
}

/// `fulcrum_retries_total{pool,reason}`: retries each pool sent to another backend, by
/// the `retry_on` entry that sent them.
fn encode_retries(
    enc: &mut DescriptorEncoder,
    routing: &crate::site::Routing,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(
        "fulcrum_retries",
        "Retries sent to another backend, by pool and by the retry_on entry that sent them (connect, reset, timeout, a status or a class).",
        None,
        MetricType::Counter,
    )?;
    for p in &routing.pools {
        let labels: Vec<String> = (p.settings.retry_on.statuses.iter())
            .map(|s| s.label())
            .collect();
        for (reason, n) in p.retried.each(&labels) {
            let labels = [("pool", &*p.name), ("reason", reason.as_str())];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// `fulcrum_hedges_total{pool,result}`: hedges each hedging pool sent, `won` when the
/// hedge's answer was the one used, `lost` otherwise.
fn encode_hedges(
    enc: &mut DescriptorEncoder,
    routing: &crate::site::Routing,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(
        "fulcrum_hedges",
        "Hedged tries sent, by pool and by result (won: its answer was used; lost: another's was).",
        None,
        MetricType::Counter,
    )?;
    for p in &routing.pools {
        let Some(h) = &p.hedging else { continue };
        let (won, lost) = h.counts();
        for (result, n) in [("won", won), ("lost", lost)] {
            let labels = [("pool", &*p.name), ("result", result)];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// `fulcrum_trace_spans_dropped_total`: spans the queue had no room for, or the
/// collector did not take (`docs/tracing.md`).
fn encode_traces(enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let m = enc.encode_descriptor(
        "fulcrum_trace_spans_dropped",
        "Spans dropped: the queue for the collector was full, or an export failed.",
        None,
        MetricType::Counter,
    )?;
    ConstCounter::new(crate::trace::dropped()).encode(m)
}

/// `fulcrum_tcp_connections_total{pool}` and `fulcrum_tcp_bytes_total{pool,direction}`:
/// each TCP pool's connections and the bytes copied each way (`docs/tcp.md`).
fn encode_tcp(
    enc: &mut DescriptorEncoder,
    routing: &crate::site::Routing,
) -> Result<(), std::fmt::Error> {
    let tcp = || (routing.pools.iter()).filter(|p| p.settings.mode == PoolMode::Tcp);
    let mut m = enc.encode_descriptor(
        "fulcrum_tcp_connections",
        "Client connections a TCP pool took.",
        None,
        MetricType::Counter,
    )?;
    for p in tcp() {
        ConstCounter::new(p.tcp.connections()).encode(m.encode_family(&[("pool", &*p.name)])?)?;
    }
    let mut m = enc.encode_descriptor(
        "fulcrum_tcp_bytes",
        "Bytes a TCP pool copied, by direction (client_to_backend, backend_to_client).",
        None,
        MetricType::Counter,
    )?;
    for p in tcp() {
        for (direction, n) in p.tcp.directions() {
            let labels = [("pool", &*p.name), ("direction", direction)];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// Proxy-wide counters, the routes' and each pool's strategy.
fn encode_proxy_wide(enc: &mut DescriptorEncoder, site: &Site) -> Result<(), std::fmt::Error> {
    use std::sync::atomic::Ordering::Relaxed;
    let s = &site.hub.stats;
    for (name, help, v) in [
        (
            "fulcrum_shed",
            "Requests answered 503 by --max-inflight.",
            &s.shed,
        ),
        (
            "fulcrum_no_backend",
            "Requests answered 503 because no backend was eligible.",
            &s.no_backend,
        ),
        (
            "fulcrum_no_route",
            "Requests answered 404 because no route took them.",
            &s.no_route,
        ),
        (
            "fulcrum_events_dropped",
            "Events a slow subscriber of /admin/events missed.",
            &s.events_dropped,
        ),
        (
            "fulcrum_client_connections_refused",
            "Client connections closed at once: their IP held max_connections_per_client already.",
            &s.client_refused,
        ),
        (
            "fulcrum_acme_failures",
            "ACME orders (first or renewal) that failed; the stored certificate keeps serving.",
            &s.acme_failures,
        ),
    ] {
        counter(enc, name, help, v.load(Relaxed))?;
    }
    encode_protocols(enc)?;
    encode_client_auth(enc)?;
    encode_denied(enc)?;
    let routing = site.routing();
    encode_access(enc, &routing)?;
    encode_routing(enc, &routing)
}

/// What each route's `jwt` refused, its key set's failed fetches and how its
/// `forward_auth` ended, by route index (routes with the policy only; `docs/policies.md`).
fn encode_access(
    enc: &mut DescriptorEncoder,
    routing: &crate::site::Routing,
) -> Result<(), std::fmt::Error> {
    use crate::stats::{AuthResult, JwtRefusal};
    let with = |f: fn(&crate::site::RoutePolicy) -> bool| {
        let all = routing.route_policies().iter().enumerate();
        all.filter_map(move |(i, p)| Some((i.to_string(), p.as_deref().filter(|p| f(p))?)))
    };
    let mut m = enc.encode_descriptor(
        "fulcrum_jwt_refused",
        "Requests a route's jwt answered 401, by route index and reason.",
        None,
        MetricType::Counter,
    )?;
    for (route, p) in with(|p| p.spec.jwt.is_some()) {
        for (reason, n) in JwtRefusal::ALL.iter().zip(p.access.jwt()) {
            let labels = [("route", route.as_str()), ("reason", reason)];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }
    }
    let mut m = enc.encode_descriptor(
        "fulcrum_jwks_fetch_failures",
        "Fetches of a route's jwks_url that failed (the last good key set is kept), by route index.",
        None,
        MetricType::Counter,
    )?;
    for (route, p) in with(|p| p.jwks.is_some()) {
        let n = p.jwks.as_ref().map_or(0, |s| s.failures());
        ConstCounter::new(n).encode(m.encode_family(&[("route", route.as_str())])?)?;
    }
    let mut m = enc.encode_descriptor(
        "fulcrum_forward_auth",
        "Subrequests of a route's forward_auth, by route index and result (allowed, refused, unavailable).",
        None,
        MetricType::Counter,
    )?;
    for (route, p) in with(|p| p.spec.forward_auth.is_some()) {
        for (result, n) in AuthResult::ALL.iter().zip(p.access.forward_auths()) {
            let labels = [("route", route.as_str()), ("result", result)];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// Handshakes refused for their client certificate, by reason (`docs/tls.md`,
/// "Mutual TLS").
fn encode_client_auth(enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(
        "fulcrum_tls_client_auth_failures",
        "TLS handshakes refused for their client certificate: unknown_ca, expired, revoked, missing (required and not sent), other.",
        None,
        MetricType::Counter,
    )?;
    for (reason, n) in crate::mtls::REASONS.iter().zip(crate::mtls::failures()) {
        ConstCounter::new(n).encode(m.encode_family(&[("reason", *reason)])?)?;
    }
    Ok(())
}

/// Clients kept out by the address lists, by where (`docs/policies.md`, "Who may come
/// in").
fn encode_denied(enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(
        "fulcrum_clients_denied",
        "Clients kept out by address: connections closed at accept (deny_clients, allow_clients), requests answered 403 by a route's allow/deny.",
        None,
        MetricType::Counter,
    )?;
    let counts = crate::stats::clients_denied();
    for (at, n) in crate::stats::Denied::ALL.iter().zip(counts) {
        ConstCounter::new(n).encode(m.encode_family(&[("where", *at)])?)?;
    }
    Ok(())
}

/// Requests by the client's protocol (`h1`, `h2`, `h3`).
fn encode_protocols(enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(
        "fulcrum_client_requests",
        "Requests by the protocol the client spoke (h1, h2, h3).",
        None,
        MetricType::Counter,
    )?;
    let totals = crate::stats::protocol_totals();
    for (name, n) in crate::stats::PROTOCOLS.iter().zip(totals) {
        ConstCounter::new(n).encode(m.encode_family(&[("protocol", *name)])?)?;
    }
    Ok(())
}

/// The per-route counts of routes with a rate limit or a split.
fn encode_route_counts(
    enc: &mut DescriptorEncoder,
    routing: &crate::site::Routing,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(
        "fulcrum_rate_limited",
        "Requests a route's rate limit answered 429, by the route's index (routes with a rate limit only).",
        None,
        MetricType::Counter,
    )?;
    let limited = (routing.routes.iter().zip(routing.rate_limited())).enumerate();
    for (i, (_, n)) in limited.filter(|(_, (r, _))| r.policies.rate_limit.is_some()) {
        let index = i.to_string();
        ConstCounter::new(n).encode(m.encode_family(&[("route", index.as_str())])?)?;
    }
    let mut m = enc.encode_descriptor(
        "fulcrum_route_split",
        "Requests a split route sent to each of its pools, by the route's index (split routes only).",
        None,
        MetricType::Counter,
    )?;
    for (i, sides) in routing.split_counts() {
        let index = i.to_string();
        for (pool, n) in sides {
            let labels = [("route", index.as_str()), ("pool", pool)];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }
    }
    let mut m = enc.encode_descriptor(
        "fulcrum_mirror_requests",
        "Copies of a mirrored route's requests, by the route's index and what came of them: sent, skipped (too many on their way, a body over the limit) or error (no answer).",
        None,
        MetricType::Counter,
    )?;
    for mirror in routing.mirrors() {
        let index = mirror.route.to_string();
        for (result, n) in ["sent", "skipped", "error"]
            .into_iter()
            .zip(mirror.counts())
        {
            let labels = [("route", index.as_str()), ("result", result)];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// The route counters, the first pool's strategy (the single-pool series) and each
/// pool's.
fn encode_routing(
    enc: &mut DescriptorEncoder,
    routing: &crate::site::Routing,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(
        "fulcrum_route_requests",
        "Requests each route took, by its index in the route list.",
        None,
        MetricType::Counter,
    )?;
    for (i, n) in routing.route_requests().into_iter().enumerate() {
        let index = i.to_string();
        ConstCounter::new(n).encode(m.encode_family(&[("route", index.as_str())])?)?;
    }
    encode_route_counts(enc, routing)?;
    let mut m = enc.encode_descriptor(
        "fulcrum_panic",
        "Requests a pool balanced in panic mode, over all its backends, healthy or not.",
        None,
        MetricType::Counter,
    )?;
    for p in &routing.pools {
        let n = p.panic_requests.load(std::sync::atomic::Ordering::Relaxed);
        ConstCounter::new(n).encode(m.encode_family(&[("pool", &*p.name)])?)?;
    }
    encode_retries(enc, routing)?;
    encode_hedges(enc, routing)?;
    encode_tcp(enc, routing)?;
    encode_traces(enc)?;
    let mut m = enc.encode_descriptor(
        "fulcrum_pool_queue_length",
        "Requests waiting in a pool's queue for a backend under its max_conns.",
        None,
        MetricType::Gauge,
    )?;
    for p in &routing.pools {
        let n = p.queue.len() as f64;
        ConstGauge::new(n).encode(m.encode_family(&[("pool", &*p.name)])?)?;
    }
    let mut m = enc.encode_descriptor(
        "fulcrum_queue_timeouts",
        "Requests answered 503 because their wait in the queue ran out.",
        None,
        MetricType::Counter,
    )?;
    for p in &routing.pools {
        let n = p.queue.timeouts.load(std::sync::atomic::Ordering::Relaxed);
        ConstCounter::new(n).encode(m.encode_family(&[("pool", &*p.name)])?)?;
    }
    encode_discovery(enc, routing)?;
    if let Some(first) = routing.pools.first() {
        // The single-pool series of old: the first pool's, as the single-pool admin
        // routes address it.
        let m = enc.encode_descriptor(
            "fulcrum_strategy",
            "The balancing strategy of the first pool.",
            None,
            MetricType::Info,
        )?;
        prometheus_client::metrics::info::Info::new([("strategy", first.strategy().name())])
            .encode(m)?;
    }
    let mut m = enc.encode_descriptor(
        "fulcrum_pool_strategy",
        "The balancing strategy of each pool.",
        None,
        MetricType::Info,
    )?;
    for p in &routing.pools {
        m.encode_family(&[("pool", &*p.name)])?
            .encode_info(&[("strategy", p.strategy().name())])?;
    }
    Ok(())
}

/// `fulcrum_discovery_updates_total{pool,result}` of each pool with `discover`.
fn encode_discovery(
    enc: &mut DescriptorEncoder,
    routing: &crate::site::Routing,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(
        "fulcrum_discovery_updates",
        "Lookups (or reads of a file) by discovery, by what they did: changed the backends, found them unchanged, or failed (the last good set stayed).",
        None,
        MetricType::Counter,
    )?;
    for p in routing.pools.iter().filter(|p| p.discover().is_some()) {
        let st = p.discovery().clone();
        for (result, n) in [
            ("changed", st.changed),
            ("unchanged", st.unchanged),
            ("error", st.errors),
        ] {
            let labels = [("pool", &*p.name), ("result", result)];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// Renders the metrics of every pool.
pub(crate) fn render(site: &Arc<Site>) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SiteCollector(Arc::clone(site))));
    let mut out = String::with_capacity(8 * 1024);
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}
