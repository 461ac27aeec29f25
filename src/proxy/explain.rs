//! "Why this backend?" (`POST /admin/explain`, `docs/operations.md`): what fulcrum would
//! do with a request now — its route, the route's policies, its pool, the sticky
//! cookie, the strategy's candidates — without sending it and without changing anything
//! the request path keeps: no route counter, no rate-limit bucket, no rotation's
//! position, no in-flight count, no trial claim.
//!
//! Each step reads what the request path's own step reads, through the same rules
//! (`Routing::peek`, `RateLimiter::would_allow`, `Picker::candidates_now`), so the answer
//! is the one the next request with this head gets while nothing else moves.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use http::header::{self, HeaderName, HeaderValue};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::chain::{self, Chain};
use super::message::{RequestFields, RequestHead};
use super::sticky;
use crate::backend::{clock_ns, AdminState, Backend};
use crate::pool::{Mode, Pool, Snapshot};
use crate::site::{RoutePolicy, Routing};

/// The request to explain; every part is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Question {
    /// `GET` when not given.
    method: Option<String>,
    /// The `Host` field; none when not given.
    host: Option<String>,
    /// Path and query; `/` when not given.
    path: Option<String>,
    /// Further request fields.
    headers: Option<BTreeMap<String, String>>,
    /// The address the request comes from; 127.0.0.1 when not given.
    client_ip: Option<IpAddr>,
    /// The verified client certificate its connection carries; none when not given.
    client_cert: Option<GivenCert>,
}

/// A client certificate, by its alternative names.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GivenCert {
    sans: Vec<String>,
}

/// What fulcrum would do with it.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Explanation {
    /// The index of the route that takes it.
    route: Option<usize>,
    /// The route's step that answers it (`redirect`, `allow`, `rate_limit`,
    /// `client_cert`, `basic_auth`, `jwt`, `forward_auth`); none when it reaches a pool.
    step: Option<&'static str>,
    /// That route's pool (for a split route, the side it would take).
    pool: Option<String>,
    /// For a split route: the side and what placed it (`docs/traffic.md`, "Splits").
    #[serde(skip_serializing_if = "Option::is_none")]
    split: Option<SplitSide>,
    /// For a mirrored route: its mirror and whether this request would be copied
    /// (`docs/traffic.md`, "Mirrors").
    #[serde(skip_serializing_if = "Option::is_none")]
    mirror: Option<MirrorSide>,
    /// The pool's strategy.
    strategy: Option<&'static str>,
    /// The backend it would go to.
    backend: Option<u64>,
    /// Every backend of the pool, in pool order.
    candidates: Vec<Candidate>,
    /// The backend its sticky cookie names, when that backend takes it.
    sticky: Option<u64>,
    /// One sentence.
    why: String,
}

/// The side a split route would send the request to.
#[derive(Debug, Serialize)]
struct SplitSide {
    pool: String,
    /// `split_key` (the request has the key) or `round_robin` (the next place).
    by: &'static str,
}

/// A mirrored route's copy of the request.
#[derive(Debug, Serialize)]
struct MirrorSide {
    pool: String,
    percent: f64,
    /// Whether it would be copied: known for a share of 0 or 100 %, and for a request
    /// whose `X-Request-Id` a trusted peer gives (the id decides); else `null` (a new id
    /// is drawn for each request).
    mirrored: Option<bool>,
}

/// One backend of the pool as the pick sees it.
#[derive(Debug, Serialize)]
struct Candidate {
    id: u64,
    name: String,
    /// Whether the pick may take it now.
    eligible: bool,
    /// Why not.
    reason: Option<&'static str>,
    /// The strategy's number for it (`Picker::score`).
    score: Option<f64>,
}

impl Question {
    /// The request head it describes; `Err` names a part that is not valid.
    fn head(&self) -> Result<RequestHead, String> {
        let method = self.method.as_deref().unwrap_or("GET");
        let path = self.path.as_deref().unwrap_or("/");
        let mut b = http::Request::builder()
            .method(
                http::Method::from_bytes(method.as_bytes())
                    .map_err(|_| format!("invalid method '{method}'"))?,
            )
            .uri(http::Uri::try_from(path).map_err(|_| format!("invalid path '{path}'"))?);
        if let Some(h) = &self.host {
            let v = HeaderValue::from_str(h).map_err(|_| format!("invalid host '{h}'"))?;
            b = b.header(header::HOST, v);
        }
        for (name, value) in self.headers.iter().flatten() {
            let n = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("invalid header name '{name}'"))?;
            let v = HeaderValue::from_str(value)
                .map_err(|_| format!("invalid value of header '{name}'"))?;
            b = b.header(n, v);
        }
        let (parts, ()) = b.body(()).map_err(|e| e.to_string())?.into_parts();
        Ok(RequestHead::from_parts(parts))
    }
}

/// Explains `q` against the routing table `routing`, with `trusted` the proxies whose
/// forwarding fields are believed. `Err` when the question is not a valid request.
pub(crate) async fn explain(
    routing: Arc<Routing>,
    trusted: &[IpNet],
    q: Question,
) -> Result<Explanation, String> {
    let head = q.head()?;
    let peer = q.client_ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let fields = match &head.fields {
        RequestFields::Map(m) => m.clone(),
        RequestFields::Spans(f) => f.to_map(),
    };
    let client_ip = crate::trust::client_ip(&fields, peer, trusted);
    let found = {
        let host = head.host();
        let has_field = |name: &HeaderName, value: &[u8]| head.has_field(name, value);
        let req = crate::route::Request {
            host: host.as_ref().map(HeaderValue::as_bytes),
            path: head.uri.path().as_bytes(),
            method: &head.method,
            has_field: &has_field,
        };
        routing.peek(&req)
    };
    let Some((index, hit)) = found else {
        return Ok(Explanation {
            why: "no route takes this request: fulcrum answers 404".into(),
            ..Explanation::default()
        });
    };
    let mut e = Explanation {
        route: Some(index),
        ..Explanation::default()
    };
    if let Some(p) = hit.policies {
        let cert = (q.client_cert.as_ref()).map(|c| crate::identity::ClientCert::named(&c.sans));
        if let Some((step, why)) = policed(p, &head, client_ip, index, cert.as_ref()) {
            (e.step, e.why) = (Some(step), why);
            return Ok(e);
        }
    }
    e.mirror = hit.mirror.map(|m| mirror_side(m, &head, peer, trusted));
    let pool = match hit.split {
        None => Arc::clone(hit.pool),
        Some(split) => {
            let key =
                (split.key()).and_then(|k| super::placement::split_key(k, &head, || client_ip));
            let (i, keyed) = split.peek(key);
            let pool = Arc::clone(routing.pools.get(i).unwrap_or(hit.pool));
            let by = if keyed { "split_key" } else { "round_robin" };
            e.split = Some(SplitSide {
                pool: pool.name.to_string(),
                by,
            });
            pool
        }
    };
    drop(routing);
    pick(&mut e, &pool, fields, peer, trusted);
    Ok(e)
}

/// What `m` would do with the request from `peer`.
fn mirror_side(
    m: &crate::mirror::Mirror,
    head: &RequestHead,
    peer: IpAddr,
    trusted: &[IpNet],
) -> MirrorSide {
    use crate::config::mirror::ALL;
    let given = (crate::trust::is_trusted(trusted, peer))
        .then(|| head.field(&super::request_id::X_REQUEST_ID))
        .flatten()
        .and_then(|v| super::request_id::RequestId::from_peer(v.as_bytes()));
    let mirrored = match (m.spec.share, given) {
        (0, _) => Some(false),
        (ALL, _) => Some(true),
        (_, Some(id)) => Some(m.takes(id.as_bytes())),
        (_, None) => None,
    };
    MirrorSide {
        pool: m.pool.name.to_string(),
        percent: m.spec.percent(),
        mirrored,
    }
}

/// What the route's steps say before the pool — a redirect, a rate limit over its
/// allowance, credentials missing or wrong — each step asked in the request path's
/// order: the step's name and its words. `None` when the request goes on to the pool.
fn policed(
    p: &RoutePolicy,
    head: &RequestHead,
    client_ip: IpAddr,
    index: usize,
    client_cert: Option<&crate::identity::ClientCert>,
) -> Option<(&'static str, String)> {
    let cx = chain::Explain {
        head,
        client_ip,
        index,
        route: p,
        client_cert,
    };
    Chain::of(p).explain(&cx)
}

/// The pool's part: its candidates, the sticky cookie, the strategy's choice.
fn pick(
    e: &mut Explanation,
    pool: &Pool,
    mut fields: http::HeaderMap,
    peer: IpAddr,
    trusted: &[IpNet],
) {
    let snap = pool.snapshot();
    let now = clock_ns();
    e.pool = Some(pool.name.to_string());
    e.strategy = Some(snap.strategy.name());
    e.candidates = snap
        .backends
        .iter()
        .map(|b| candidate(&snap, b, now))
        .collect();
    let stuck = pool.settings.sticky.cookie.as_deref().and_then(|name| {
        let value = sticky::take(&mut fields, name)?;
        snap.backends
            .iter()
            .find(|b| b.sticky_value == value && crate::pool::takes_sessions(b, snap.mode))
    });
    let place = format!("pool '{}'", pool.name);
    if let Some(b) = stuck {
        e.sticky = Some(b.id);
        e.backend = Some(b.id);
        e.why = format!(
            "{place}: its sticky cookie names backend '{}', which keeps its sessions",
            b.name
        );
        return;
    }
    let key = snap.strategy.key_source().map(|source| {
        crate::strategy::request_key(source, &pool.settings.hash_key, &fields, peer, trusted)
    });
    let chosen = snap
        .picker
        .candidates_now(&snap.eligible, key)
        .map(|i| &snap.eligible[i])
        .find(|b| takes_one_now(b));
    let mode = match snap.mode {
        Mode::Primaries => "",
        Mode::Backups => " (no primary is eligible: the backups take the traffic)",
        Mode::Panic => " (panic mode: too few healthy, every primary is picked from)",
    };
    e.why = match chosen {
        Some(b) => {
            e.backend = Some(b.id);
            let by = if key.is_some() { " by the request's key" } else { "" };
            format!("{place}: {} picks backend '{}'{by}{mode}", snap.strategy.name(), b.name)
        }
        None if snap.eligible.iter().any(|b| at_limit(b)) => format!(
            "{place}: every eligible backend is at its max_conns: it waits in the queue (503 after queue_timeout){mode}"
        ),
        None => format!("{place}: no backend is eligible: fulcrum answers 503"),
    };
}

/// `b` as the pick sees it now.
fn candidate(snap: &Snapshot, b: &Arc<Backend>, now: u64) -> Candidate {
    let listed = snap.eligible.iter().any(|x| x.id == b.id);
    let reason = match b.control.state() {
        AdminState::Maintenance => Some("maintenance"),
        AdminState::Draining => Some("draining"),
        AdminState::Active if listed => None,
        AdminState::Active if !b.control.healthy() => Some("unhealthy"),
        AdminState::Active if b.ejected() => Some("ejected"),
        AdminState::Active if b.backup => Some("backup"),
        AdminState::Active => Some("unhealthy"),
    };
    let reason = match reason {
        None if at_limit(b) => Some("full"),
        None if b.half_open() && !b.live.outlier.trial_free() => Some("ejected"),
        r => r,
    };
    Candidate {
        id: b.id,
        name: b.name.clone(),
        eligible: reason.is_none(),
        reason,
        score: snap.picker.score(b, now).filter(|_| listed),
    }
}

/// Whether `b` is at its `max_conns`.
fn at_limit(b: &Backend) -> bool {
    let max = b.max_conns();
    max != 0 && b.in_flight() >= u64::from(max)
}

/// Whether the pick would take `b` now: not at its limit, and when half-open, its one
/// trial request not already in flight.
fn takes_one_now(b: &Backend) -> bool {
    !at_limit(b) && (!b.half_open() || b.live.outlier.trial_free())
}
