//! `forward_auth`: the request is first put to an auth service (nginx `auth_request`,
//! Traefik ForwardAuth, Caddy `forward_auth`; `docs/policies.md`, "Forward auth"). The
//! subrequest carries the client's method and end-to-end fields with no body, and the
//! `X-Forwarded-*` fields that say what the client asked for; a `2xx` lets the request
//! on with the `copy_headers` fields the service set (and its `Set-Cookie` fields added
//! to the client's answer); any other answer is the client's, as it is; no answer
//! within `timeout` is `503 auth unavailable`.
//!
//! The subrequest goes over the worker's keep-alive connections to backends
//! ([`super::super::upstream`]): the auth service is reached as a backend of its own,
//! outside every pool, so a busy route pays no connect per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, StatusCode};
use http_body_util::BodyExt;

use super::{Before, Explain, Grant, Next, Step};
use crate::backend::Backend;
use crate::config::auth::ForwardAuth;
use crate::config::policy::Policies;
use crate::proxy::answer::{ProxyResponse, RespBody};
use crate::proxy::body::ReqBody;
use crate::proxy::message::RequestFields;
use crate::proxy::upstream::Upstreams;
use crate::stats::{AccessCounts, AuthResult};

/// Auth services are backends with ids from here up, outside every pool's (their idle
/// connections are kept while no pool holds their id).
pub(crate) const AUX_IDS: u64 = 1 << 62;
static NEXT_AUX: AtomicU64 = AtomicU64::new(AUX_IDS);

/// An auth service's refusal is passed on with at most this much body.
const MAX_REFUSAL_BODY: usize = 64 * 1024;

#[derive(Debug)]
struct ForwardAuthStep {
    spec: ForwardAuth,
    /// The auth service as a backend.
    service: Arc<Backend>,
    /// `url`'s path and query: the subrequest's target.
    target: http::Uri,
    /// `url`'s authority: the subrequest's `Host`.
    host: HeaderValue,
}

pub(super) fn build(p: &Policies) -> Option<Box<dyn Step>> {
    let spec = p.forward_auth.clone()?;
    let scheme = spec.url.scheme_str().unwrap_or("http");
    let authority = spec.url.authority()?.clone();
    let origin = format!("{scheme}://{authority}");
    let Ok(backend) = crate::config::backend_spec(&origin, None, Some("forward-auth")) else {
        // The URL was checked when the configuration was read.
        return None;
    };
    let settings = crate::config::Settings::default().pool;
    let link = crate::backend::PoolLink::new();
    let id = NEXT_AUX.fetch_add(1, Ordering::Relaxed);
    let service = Backend::new(id, backend, 0.3).in_pool("forward-auth".into(), &settings, &link);
    let target = spec.url.path_and_query().map_or("/", |p| p.as_str());
    Some(Box::new(ForwardAuthStep {
        target: target
            .parse()
            .unwrap_or_else(|_| http::Uri::from_static("/")),
        host: HeaderValue::from_str(authority.as_str()).ok()?,
        service: Arc::new(service),
        spec,
    }))
}

/// Whether `name` stays on the subrequest: not hop-by-hop, not one the connection's
/// `Connection` names, not the message's framing, not `Host` (the service's own), and
/// not one that says where the request came from or what it asked for — the client's
/// own `Forwarded`, `X-Real-IP`, `X-Forwarded-*` and `X-Original-*` could tell the
/// service another address or URL than the real ones (this hop sets its own).
fn end_to_end(name: &HeaderName, connection_names: &[Vec<u8>]) -> bool {
    let n = name.as_str();
    !crate::proxy::hop::is_hop_by_hop(n.as_bytes())
        && *name != header::CONTENT_LENGTH
        && *name != header::HOST
        && *name != header::EXPECT
        && !says_origin(n)
        && !(connection_names.iter()).any(|c| c.eq_ignore_ascii_case(n.as_bytes()))
}

/// A field (lower-case, as `HeaderName` keeps it) that names the request's origin.
fn says_origin(name: &str) -> bool {
    name == "forwarded"
        || name == "x-real-ip"
        || name.starts_with("x-forwarded-")
        || name.starts_with("x-original-")
}

impl ForwardAuthStep {
    /// The subrequest for the request `cx` holds.
    fn subrequest(&self, cx: &mut Before<'_>) -> Option<Request<ReqBody>> {
        let host = cx.head.host();
        // The target as received, in origin form whatever the client's protocol (an
        // HTTP/2 request's is built from `:path`).
        let uri = cx
            .head
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let client = cx.client_ip().to_string();
        let proto = if cx.peer.tls { "https" } else { "http" };
        let method = cx.head.method.clone();
        cx.head.make_map();
        let RequestFields::Map(fields) = &cx.head.fields else {
            return None;
        };
        let connection_names: Vec<Vec<u8>> = fields
            .get_all(header::CONNECTION)
            .iter()
            .flat_map(|v| crate::proxy::hop::tokens(v.as_bytes()))
            .filter_map(|t| match t {
                crate::proxy::hop::Token::Names(n) => Some(n.to_vec()),
                _ => None,
            })
            .collect();
        let mut out = HeaderMap::with_capacity(fields.len() + 7);
        for (n, v) in fields
            .iter()
            .filter(|(n, _)| end_to_end(n, &connection_names))
        {
            out.append(n.clone(), v.clone());
        }
        out.insert(header::HOST, self.host.clone());
        // This hop, after the client's: a subrequest that comes back here (the service's
        // name resolving to this fulcrum) is answered 508, not asked again.
        out.append(header::VIA, crate::loops::probe_value());
        out.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        let forwarded = [
            (
                "x-forwarded-method",
                HeaderValue::from_str(method.as_str()).ok(),
            ),
            ("x-forwarded-uri", HeaderValue::from_str(&uri).ok()),
            ("x-forwarded-host", host),
            ("x-forwarded-proto", Some(HeaderValue::from_static(proto))),
            ("x-forwarded-for", HeaderValue::from_str(&client).ok()),
        ];
        for (n, v) in forwarded {
            if let Some(v) = v {
                out.insert(HeaderName::from_static(n), v);
            }
        }
        let mut req = Request::new(ReqBody::Empty);
        *req.method_mut() = method;
        *req.uri_mut() = self.target.clone();
        *req.headers_mut() = out;
        Some(req)
    }
}

/// What the auth service answered, its body read.
struct Answer {
    status: StatusCode,
    fields: HeaderMap,
    /// `None`: longer than [`MAX_REFUSAL_BODY`].
    body: Option<Bytes>,
}

/// Sends `req` to the service and reads the answer, all within `timeout`; `None` when
/// the service is down, broke the exchange or took too long.
async fn ask(
    upstreams: &'static Upstreams,
    service: &Backend,
    req: Request<ReqBody>,
    timeout: Duration,
) -> Option<Answer> {
    let exchange = async {
        let (resp, conn, _) = upstreams.send(service, req, timeout, None).await.ok()?;
        let (parts, body) = resp.into_parts();
        let limited = http_body_util::Limited::new(body, MAX_REFUSAL_BODY);
        let body = match limited.collect().await {
            Ok(b) => {
                upstreams.checkin(conn);
                Some(b.to_bytes())
            }
            // Too long (the connection goes with its unread rest), or broken.
            Err(e)
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some() =>
            {
                None
            }
            Err(_) => return None,
        };
        Some(Answer {
            status: parts.status,
            fields: parts.headers,
            body,
        })
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten()
}

/// The client's answer for a refusal: the service's status and fields (less the hop's,
/// fulcrum's own and the framing, which the client's connection writes itself) and its
/// body.
fn refusal(a: Answer) -> ProxyResponse {
    let mut fields = a.fields;
    // As a backend's answer: the hop's fields, fulcrum's own feedback fields and
    // `Alt-Svc` go no further.
    let _ = crate::proxy::headers::strip_answer(&mut fields);
    for n in [header::CONTENT_LENGTH, header::TRANSFER_ENCODING] {
        fields.remove(n);
    }
    let body = match a.body {
        Some(b) => RespBody::full(b),
        None => {
            tracing::warn!("forward_auth: the refusal's body is over 64 KiB: passed on without it");
            RespBody::empty()
        }
    };
    crate::proxy::answer::fit_head(&mut fields, &body);
    ProxyResponse::new(a.status, fields, body)
}

/// `503 auth unavailable`: the service could not be asked or did not answer.
fn unavailable() -> ProxyResponse {
    ProxyResponse::own(StatusCode::SERVICE_UNAVAILABLE, "auth unavailable\n")
}

/// The fields a `2xx` grants: `copy` taken into the request, `Set-Cookie` added to the
/// answer.
fn granted(a: &Answer, copy: &[HeaderName]) -> Grant {
    let request = (copy.iter())
        .flat_map(|n| a.fields.get_all(n).iter().map(|v| (n.clone(), v.clone())))
        .collect();
    let answer = a
        .fields
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| (header::SET_COOKIE, v.clone()))
        .collect();
    Grant { request, answer }
}

impl Step for ForwardAuthStep {
    fn name(&self) -> &'static str {
        "forward_auth"
    }

    fn before<'s>(&'s self, cx: &mut Before<'_>) -> Next<'s> {
        let counts: Arc<AccessCounts> = Arc::clone(&cx.route.access);
        let Some(req) = self.subrequest(cx) else {
            // Never let a request by unasked: the service cannot be asked, as when down.
            counts.forward_auth(AuthResult::Unavailable);
            return Next::Answer(Box::new(unavailable()));
        };
        // The client cannot name itself: the service's fields of these names replace
        // its own, or none go on.
        cx.set_fields(&self.spec.copy_headers, &[]);
        let upstreams = cx.upstreams;
        Next::wait(async move {
            let Some(answer) = ask(upstreams, &self.service, req, self.spec.timeout).await else {
                counts.forward_auth(AuthResult::Unavailable);
                tracing::warn!(url = %self.spec.url, "forward_auth: the auth service did not answer in time");
                return Err(unavailable());
            };
            if answer.status.is_success() {
                counts.forward_auth(AuthResult::Allowed);
                return Ok(granted(&answer, &self.spec.copy_headers));
            }
            counts.forward_auth(AuthResult::Refused);
            Err(refusal(answer))
        })
    }

    fn explain(&self, cx: &Explain<'_>) -> Option<String> {
        Some(format!(
            "route {} asks the auth service at {} first (forward_auth; explain does not call it): a 2xx lets the request on, any other answer is the client's",
            cx.index, self.spec.url
        ))
    }
}
