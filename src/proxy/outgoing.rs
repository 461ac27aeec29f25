//! A request on its way to a backend (`docs/architecture.md`, "The request path"): this
//! hop's rules applied to its head (`prepare`), and the head written for an exchange —
//! inline, or as hyper's `Request` (HTTP/1.1 or HTTP/2 to the backend).

use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use http::{Request, Version};
use ipnet::IpNet;

use super::body::{ClientBody, ReqBody};
use super::chain::{self, Chain};
use super::message::{Peer, RequestFields, RequestHead};
use super::request_id::{self, RequestId};
use super::tunnel::ClientUpgrade;
use super::{headers, sticky, wire};
use crate::pool::{Backend, Pool};

/// A request on its way to a backend, as [`Proxy::prepare`] leaves it: its head with
/// this hop's rules applied (to the map at once; to span fields as they are written
/// out), its body, and what the attempts need to know about it.
pub(super) struct Outgoing<'p> {
    /// The pool its route sends it to, held until the request ends.
    pub(super) pool: Arc<Pool>,
    pub(super) head: RequestHead,
    pub(super) body: Option<ClientBody>,
    /// The client side's half of an upgrade, when one is asked for.
    pub(super) client_upgrade: Option<ClientUpgrade>,
    /// The target as forwarded (origin form).
    pub(super) target: PathAndQuery,
    /// The authority the request is for ([`RequestHead::host`]): what the backend gets
    /// as `Host` and `X-Forwarded-Host`.
    pub(super) host: Option<HeaderValue>,
    /// The client, as its connection knows it (borrowed: a request does not copy it).
    pub(super) peer: &'p Peer,
    pub(super) peer_trusted: bool,
    /// Exchanged inline: no body, no upgrade, idempotent (so that a pooled connection
    /// found closed can be replaced by a new one).
    pub(super) inline: bool,
    /// The request key of a hashing strategy, computed once, when first needed.
    pub(super) key: Option<u64>,
    /// The sticky cookie's value the request came with (its pool is sticky).
    pub(super) sticky: Option<u64>,
    /// Whether the first attempt went to the backend that cookie names.
    pub(super) stuck: bool,
    /// Its `X-Request-Id`, to the backend and back.
    pub(super) id: RequestId,
    /// This hop's `Via` element, for the client's protocol.
    pub(super) via: &'static [u8],
    /// What its route's steps found that the rest of the way needs.
    pub(super) found: chain::Found,
    /// Its route's mirror, until the copy is made (`docs/traffic.md`, "Mirrors").
    pub(super) mirror: Option<Arc<crate::mirror::Mirror>>,
    /// A traced request's `traceparent` for its try at hand (`docs/tracing.md`).
    /// Boxed: the plain path carries 8 bytes for it, not 56.
    pub(super) traceparent: Option<Box<crate::trace::Traceparent>>,
}

impl Outgoing<'_> {
    /// This hop, as the request's forwarding fields speak of it.
    pub(super) fn hop(&self) -> headers::Hop<'_> {
        headers::Hop {
            peer: &self.peer.forwarded,
            peer_trusted: self.peer_trusted,
            host: self.host.as_ref(),
            https: self.peer.tls,
            request_id: self.id.as_bytes(),
            via: self.via,
            client_cert: self.peer.client_cert.as_ref().map(|c| &c.xfcc),
            traceparent: self.traceparent.as_deref().map(|t| &t[..]),
        }
    }

    /// Takes back a request that was never written (`upstream::SendError::unsent`):
    /// its body and its fields, without the `Host` made up for the backend tried.
    pub(super) fn restore(&mut self, unsent: Request<ReqBody>) {
        let (mut parts, body) = unsent.into_parts();
        if let ReqBody::Stream { inner, .. } = body {
            self.body = Some(inner);
        }
        if let RequestFields::Map(map) = &mut self.head.fields {
            if map.is_empty() {
                if self.host.is_none() {
                    parts.headers.remove(header::HOST);
                }
                *map = parts.headers;
            }
        }
    }
}

/// A request's fields as forwarded, as a map: span fields (a bodiless request from the
/// fast path, prepared for the inline exchange) get the rules [`Proxy::prepare`] gives a
/// map, and `Host` the authority the request is for.
pub(super) fn forwarded_fields(f: &headers::ClientFields, req: &Outgoing<'_>) -> http::HeaderMap {
    let mut map = f.forwarded_map(req.hop());
    if let Some(h) = &req.host {
        map.insert(header::HOST, h.clone());
    }
    map
}

/// Applies this hop's rules to the head (see `docs/architecture.md`, "Headers"):
/// `Host` set to the request's authority (the target's in absolute form, else the
/// client's `Host`, else `:authority` for HTTP/2), HTTP/2 cookies joined,
/// hop-by-hop fields removed, `X-Forwarded-*` set, HTTP/1.1 towards the backend.
/// Span fields are only ever exchanged inline and get the same rules as they are
/// written out; any other request gets its fields as a map first.
pub(super) fn prepare(
    req: &mut Outgoing<'_>,
    chain: Option<&Chain>,
    trace_context: bool,
    trusted_proxies: &[IpNet],
) {
    let head = &mut req.head;
    req.inline = req.body.is_none() && req.client_upgrade.is_none() && is_idempotent(&head.method);
    // A sticky pool reads and removes its cookie, from a map; a route's request
    // headers policy edits one.
    let sticky = req.pool.settings.sticky.cookie.as_deref();
    let edits = chain.filter(|c| c.edits_request());
    // Off, it costs nothing; on, a request without one gets a map to add it to.
    let trace = trace_context && head.field(&request_id::TRACEPARENT).is_none();
    if !req.inline || sticky.is_some() || edits.is_some() || trace {
        head.make_map();
    }
    req.host = head.host();
    if let RequestFields::Map(map) = &mut head.fields {
        // The one authority `host` names (validated in `admit`): the client's `Host`,
        // the target's in absolute form, or HTTP/2's `:authority`.
        if let Some(h) = &req.host {
            map.insert(header::HOST, h.clone());
        }
        // HTTP/2 and HTTP/3 split `cookie` into one field per cookie.
        if head.version == Version::HTTP_2 || head.version == Version::HTTP_3 {
            headers::merge_cookies(map);
        }
        if let Some(cookie) = sticky {
            headers::merge_cookies(map);
            req.sticky = sticky::take(map, cookie);
        }
        let hop = headers::Hop {
            peer: &req.peer.forwarded,
            peer_trusted: req.peer_trusted,
            host: req.host.as_ref(),
            https: req.peer.tls,
            request_id: req.id.as_bytes(),
            via: req.via,
            client_cert: req.peer.client_cert.as_ref().map(|c| &c.xfcc),
            traceparent: req.traceparent.as_deref().map(|t| &t[..]),
        };
        let upgrade = req.client_upgrade.is_some();
        if edits.is_some() && req.found.client_ip.is_none() {
            let trusted = trusted_proxies;
            let ip = crate::trust::client_ip(map, req.peer.addr.ip(), trusted);
            req.found.client_ip = Some(ip);
        }
        headers::Forwarding::apply(map, hop, upgrade);
        if trace {
            map.insert(request_id::TRACEPARENT, req.id.traceparent());
        }
        if let (Some(chain), Some(ip)) = (edits, req.found.client_ip) {
            let vars = chain::Vars {
                client_ip: ip,
                request_id: req.id.as_bytes(),
                host: req.host.as_ref(),
            };
            chain.forward(map, &vars);
        }
    }
    // The backend pool speaks HTTP/1.1 whatever the client spoke.
    head.version = Version::HTTP_11;
}

/// Names a try's span in the backend's `traceparent`: in the map, when the fields are
/// one already; span fields get it as they are written out (`headers::Hop`).
pub(super) fn set_traceparent(req: &mut Outgoing<'_>, value: crate::trace::Traceparent) {
    if let RequestFields::Map(map) = &mut req.head.fields {
        if let Ok(v) = HeaderValue::from_bytes(&value) {
            map.insert(request_id::TRACEPARENT, v);
        }
    }
    // One box for all its tries, made from the value: a zeroed one is `calloc`'s, which
    // passes by the allocator's per-thread cache.
    match &mut req.traceparent {
        Some(b) => **b = value,
        None => req.traceparent = Some(Box::new(value)),
    }
}

/// Writes the head of an inline request: the request line and the fields as this hop
/// forwards them. HTTP/1.1 needs a Host; a request that has none (HTTP/1.0) gets the
/// backend's `authority`.
pub(super) fn write_inline_head(out: &mut Vec<u8>, req: &Outgoing<'_>, authority: &str) {
    let method = &req.head.method;
    let target = req.target.as_str();
    match &req.head.fields {
        RequestFields::Spans(f) => wire::write_head_with(out, method, target, |out| {
            f.write_forwarded(out, req.hop(), authority)
        }),
        RequestFields::Map(map) => {
            let default_host = (!map.contains_key(header::HOST)).then_some(authority);
            wire::write_head(out, method, target, map, default_host)
        }
    }
}

/// The inline exchange speaks plain HTTP/1.1 only: a request for another backend goes
/// through hyper, with its fields as a map.
#[inline]
pub(super) fn fit_to(req: &mut Outgoing<'_>, backend: &Backend) {
    if req.inline && !backend.transport.is_plain_http1() {
        leave_inline(req);
    }
}

/// The request goes through hyper's client: its fields as a map.
pub(super) fn leave_inline(req: &mut Outgoing<'_>) {
    req.inline = false;
    if let RequestFields::Spans(f) = &req.head.fields {
        let map = forwarded_fields(f, req);
        req.head.fields = RequestFields::Map(map);
    }
}

/// The request for one attempt through hyper's client. Only a request without a body
/// can have several attempts, so the body (when there is one) goes with the first and
/// only attempt; the last attempt takes the fields, earlier ones copy them.
pub(super) fn build_upstream(
    req: &mut Outgoing<'_>,
    backend: &Backend,
    keep: bool,
) -> Request<ReqBody> {
    let req_body = match req.body.take() {
        Some(inner) => ReqBody::streaming(inner, req.pool.settings.max_request_body),
        None => ReqBody::Empty,
    };
    let mut r = Request::new(req_body);
    *r.method_mut() = req.head.method.clone();
    // Origin form: the connection already knows which backend it goes to.
    *r.uri_mut() = Uri::from(req.target.clone());
    *r.version_mut() = Version::HTTP_11;
    if let RequestFields::Map(map) = &mut req.head.fields {
        *r.headers_mut() = if keep {
            map.clone()
        } else {
            std::mem::take(map)
        };
    }
    for_backend(&mut r, backend);
    r
}

/// Readies `r` for `backend`: HTTP/2 when the backend speaks it; else HTTP/1.1, which
/// needs a Host (a client that sent none, as HTTP/1.0 may, gets the backend's).
#[inline]
pub(super) fn for_backend(r: &mut Request<ReqBody>, backend: &Backend) {
    if backend.transport.h2 {
        to_h2(r, backend);
        return;
    }
    if !r.headers().contains_key(header::HOST) {
        if let Ok(h) = HeaderValue::from_str(backend.authority.as_str()) {
            r.headers_mut().insert(header::HOST, h);
        }
    }
}

/// A copy of the request as this hop forwards it, without its body, for another pool
/// than its own (a mirror): its fields as a map of their own.
pub(super) fn copy_of(req: &Outgoing<'_>) -> Request<ReqBody> {
    let mut r = Request::new(ReqBody::Empty);
    *r.method_mut() = req.head.method.clone();
    *r.uri_mut() = Uri::from(req.target.clone());
    *r.version_mut() = Version::HTTP_11;
    *r.headers_mut() = match &req.head.fields {
        RequestFields::Map(map) => map.clone(),
        RequestFields::Spans(f) => forwarded_fields(f, req),
    };
    r
}

/// Makes `r` an HTTP/2 request: the target in absolute form, its authority the `Host`
/// the client asked for (HTTP/2's `:authority`, which replaces the field), else the
/// backend's. A gRPC call gets back the `te: trailers` its client sent, which the hop
/// rules removed and which gRPC servers may require.
fn to_h2(r: &mut Request<ReqBody>, backend: &Backend) {
    *r.version_mut() = Version::HTTP_2;
    let host = r.headers_mut().remove(header::HOST);
    let authority = host
        .and_then(|h| http::uri::Authority::try_from(h.as_bytes()).ok())
        .unwrap_or_else(|| backend.authority.clone());
    let scheme = if backend.transport.is_tls() {
        http::uri::Scheme::HTTPS
    } else {
        http::uri::Scheme::HTTP
    };
    let mut parts = r.uri().clone().into_parts();
    parts.scheme = Some(scheme);
    parts.authority = Some(authority);
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(PathAndQuery::from_static("/"));
    }
    if let Ok(uri) = Uri::from_parts(parts) {
        *r.uri_mut() = uri;
    }
    let grpc = r
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        r.headers_mut()
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// Whether a request may be sent again after its bytes left (RFC 9110 §9.2.2).
pub(super) fn is_idempotent(m: &http::Method) -> bool {
    matches!(
        *m,
        http::Method::GET
            | http::Method::HEAD
            | http::Method::OPTIONS
            | http::Method::PUT
            | http::Method::DELETE
    )
}
