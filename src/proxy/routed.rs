//! Where a request goes (`docs/routing.md`): the first route that takes it, and for a
//! split route the side its key or the round robin picks (`docs/traffic.md`, "Splits").

use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use ipnet::IpNet;

use super::message::{Peer, RequestHead};
use super::placement;
use super::refusal::Refusal;
use crate::pool::Pool;
use crate::site::{RoutePolicy, Routing, Site};
use crate::stats::bump;

/// Where a route sends a request.
pub(super) struct Routed {
    /// The pool, held until the request ends.
    pub(super) pool: Arc<Pool>,
    /// The target rewritten when the route strips its prefix (`None`: unchanged).
    pub(super) target: Option<PathAndQuery>,
    /// The route's policies, when it has any.
    pub(super) policies: Option<Arc<RoutePolicy>>,
    /// The route's mirror, when it has one.
    pub(super) mirror: Option<Arc<crate::mirror::Mirror>>,
    /// The route's place in the routing table.
    pub(super) index: usize,
    /// Whether the route splits (the access log then names the pool).
    pub(super) split: bool,
}

/// Where the first route of `site` that takes the request sends it: its pool, or for a
/// split route the side its key or the round robin picks. The single-pool form (one
/// route without conditions or policies) looks nothing up. `client` is the peer and
/// whether it is one of the `trusted` proxies.
pub(super) fn route(
    (site, trusted): (&Site, &[IpNet]),
    head: &RequestHead,
    client: (&Peer, bool),
) -> Result<Routed, Refusal> {
    let routing = site.routing();
    let side = |split| side(&routing, split, head, client, trusted);
    if let Some((pool, policies, split, mirror)) = routing.only() {
        return Ok(Routed {
            pool: Arc::clone(split.map_or(pool, side)),
            target: None,
            policies: policies.cloned(),
            mirror: mirror.cloned(),
            index: 0,
            split: split.is_some(),
        });
    }
    let host = head.host();
    let has_field = |name: &header::HeaderName, value: &[u8]| head.has_field(name, value);
    let req = crate::route::Request {
        host: host.as_ref().map(HeaderValue::as_bytes),
        path: head.uri.path().as_bytes(),
        method: &head.method,
        has_field: &has_field,
    };
    let Some(hit) = routing.find(&req) else {
        bump(&site.hub.stats.no_route);
        return Err(Refusal::NoRoute);
    };
    let target = head.uri.path_and_query().map_or("/", PathAndQuery::as_str);
    let rewritten = (hit.route)
        .rewrite(target)
        .and_then(|t| PathAndQuery::try_from(t).ok());
    Ok(Routed {
        pool: Arc::clone(hit.split.map_or(hit.pool, side)),
        target: rewritten,
        policies: hit.policies.cloned(),
        mirror: hit.mirror.cloned(),
        index: hit.index,
        split: hit.split.is_some(),
    })
}

/// The pool of the side a split route's request takes: its key's, or the next place of
/// the round robin.
#[inline(never)]
fn side<'r>(
    routing: &'r Routing,
    split: &crate::split::Splitter,
    head: &RequestHead,
    client: (&Peer, bool),
    trusted: &[IpNet],
) -> &'r Arc<Pool> {
    let ip = || placement::client_ip(head, client.0, client.1, trusted);
    let key = (split.key()).and_then(|k| placement::split_key(k, head, ip));
    routing.side(split, key)
}
