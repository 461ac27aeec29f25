//! The answer as the request path carries it back: the backend's (read inline or by
//! hyper's client), and the client's — a head beside a body that holds the request's
//! accounting (`Hold`) until it has been read whole.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::message::Added;
use super::request_id::X_REQUEST_ID;
use http::{Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;

use super::body::{BodyError, Upload};
use super::message::{ResponseFields, ResponseHead};
use super::record::{Finish, Recorder};
use super::upstream::{Conn, Upstreams};
use super::wire::WireBody;
use crate::backend::{observe, RequestGuard};
use crate::descriptors::Descriptor;

/// A backend's answer, from hyper's client or from an inline exchange.
pub(crate) enum Answer {
    /// Through hyper's client (a body, an upgrade, HTTP/2, TLS), with its connection.
    Hyper(Response<Incoming>, Conn),
    /// Read inline (`wire`): the head with span fields, and the body still on the socket.
    Wire(ResponseHead, WireBody),
}

impl Answer {
    /// The backend's fields, when hyper's client read the answer (the only way an
    /// upgrade goes); `None` for an answer read inline.
    pub(crate) fn map(&self) -> Option<&HeaderMap> {
        match self {
            Answer::Hyper(r, _) => Some(r.headers()),
            Answer::Wire(..) => None,
        }
    }

    /// The backend's half of the upgrade it switched to: its connection to come, the
    /// answer's fields and the connection's descriptor, which the tunnel keeps. An
    /// answer read inline (it never carries an upgrade) is given back.
    pub(crate) fn into_upgrade(self) -> Result<Upgraded, Box<Answer>> {
        match self {
            Answer::Hyper(mut r, conn) => {
                let upgrade = hyper::upgrade::on(&mut r);
                // A load report goes no further than fulcrum, on a `101` too.
                r.headers_mut().remove(crate::backend::report::FIELD);
                Ok((upgrade, std::mem::take(r.headers_mut()), conn.detach()))
            }
            inline @ Answer::Wire(..) => Err(Box::new(inline)),
        }
    }

    /// The body's length as the answer states it.
    pub(crate) fn stated_length(&self) -> Option<u64> {
        let v = match self {
            Answer::Hyper(r, _) => r.headers().get(header::CONTENT_LENGTH).cloned(),
            Answer::Wire(h, _) => h.field(&header::CONTENT_LENGTH),
        }?;
        v.to_str().ok()?.trim().parse().ok()
    }

    /// The answer's status.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Answer::Hyper(r, _) => r.status(),
            Answer::Wire(h, _) => h.status,
        }
    }

    /// The client's answer: the backend's head, and its body wrapped with `hold`.
    pub(crate) fn into_response(
        self,
        mut hold: Hold,
        upstreams: &'static Upstreams,
    ) -> ProxyResponse {
        let status = self.status();
        match self {
            Answer::Hyper(resp, conn) => {
                let (mut parts, body) = resp.into_parts();
                let observed = super::headers::strip_answer(&mut parts.headers);
                for (which, value) in observed.iter().enumerate() {
                    if let Some(v) = value {
                        observe::hand(hold.guard.backend(), which, v.as_bytes());
                    }
                }
                hold.conn = Some(conn);
                let head = ResponseHead {
                    request_id: None,
                    rate_limit: None,
                    alt_svc: false,
                    status,
                    version: parts.version,
                    reason: parts.extensions.remove(),
                    fields: ResponseFields::Map(parts.headers),
                };
                ProxyResponse {
                    head,
                    body: RespBody::upstream(body, hold, upstreams),
                }
            }
            // Its hop-by-hop fields and those fulcrum keeps were left out as it was parsed.
            Answer::Wire(head, body) => {
                if let ResponseFields::Wire(f) = &head.fields {
                    if f.has_observed() {
                        note_observed(f, &hold);
                    }
                }
                ProxyResponse {
                    head,
                    body: RespBody::wire(body, hold, upstreams),
                }
            }
        }
    }
}

/// Hands what an answer read inline told about its backend to the backend
/// (`backend::observe`); out of line, as only some backends' answers come here.
#[cold]
#[inline(never)]
fn note_observed(f: &super::message::Fields, hold: &Hold) {
    for (which, value) in f.observed() {
        observe::hand(hold.guard.backend(), which, value);
    }
}

/// The backend's half of an upgrade: its connection to come, the `101`'s fields, the
/// connection's descriptor.
pub(crate) type Upgraded = (OnUpgrade, HeaderMap, Option<Descriptor>);

/// A slot in the proxy-wide in-flight count used for shedding.
#[derive(Debug)]
pub(crate) struct ShedPermit(Arc<AtomicUsize>);

impl ShedPermit {
    /// Counts one more request in flight in `count`; `None` when that makes more than
    /// `max` (the request is shed, and counts for nothing once the permit is dropped).
    pub(crate) fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<ShedPermit> {
        let now = count.fetch_add(1, Ordering::Relaxed) + 1;
        let permit = ShedPermit(Arc::clone(count));
        (now <= max).then_some(permit)
    }
}

impl Drop for ShedPermit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What keeps a request accounted for until its response has been received whole.
#[derive(Debug)]
pub(crate) struct Hold {
    /// The backend's in-flight slot.
    pub(crate) guard: RequestGuard,
    /// The proxy-wide shedding slot, when shedding is on; held for its drop.
    pub(crate) _permit: Option<ShedPermit>,
    /// The upstream connection, returned to its pool once the body has been read whole
    /// (the pool is the body's: a hold is moved on every request, and kept to 256 bytes
    /// it is copied without a loop, `docs/performance.md`, "A hold in 256 bytes").
    pub(crate) conn: Option<Conn>,
    /// How far the request body has gone (`None`: there was none).
    pub(crate) upload: Option<Arc<Upload>>,
    /// The request's record, written when the hold is released.
    pub(crate) finish: Option<(Finish, &'static Recorder)>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some((fin, rec)) = self.finish.take() {
            rec.finish(&fin, Some(self.guard.backend()));
        }
    }
}

impl Hold {
    /// The response was received whole. The connection can serve another request unless
    /// the backend answered before the upload ended; that connection is closed instead.
    fn complete(mut self, pool: &'static Upstreams) {
        let uploaded = self.upload.as_ref().is_none_or(|u| u.is_done());
        if let (Some(conn), true) = (self.conn.take(), uploaded) {
            pool.checkin(conn);
        }
    }
}

/// The body sent to the client: the backend's stream, or a short answer of our own.
#[derive(Debug)]
pub(crate) enum RespBody {
    /// The backend's body; `hold` is released the moment it has been read whole, fails,
    /// or the body is dropped (client gone).
    Upstream {
        /// The backend's body.
        inner: Incoming,
        /// Released at the end of the stream.
        /// Boxed: it is large, and a response body is moved around by value.
        hold: Option<Box<Hold>>,
        /// Where the connection goes back when the body has been read whole.
        pool: &'static Upstreams,
    },
    /// The backend's body, read from its socket as it is polled (see `wire`).
    Wire {
        /// The body and its connection.
        inner: WireBody,
        /// Released at the end of the stream.
        hold: Option<Box<Hold>>,
        /// Where the connection goes back when the body has been read whole.
        pool: &'static Upstreams,
    },
    /// A short answer of fulcrum's own.
    Full(Option<Bytes>),
    /// A body compressed on its way (`docs/policies.md`, "Compression").
    Compressed(Box<crate::compress::Compressed<RespBody>>),
    /// A body hashed on its way, for a mirror's comparison (`docs/traffic.md`,
    /// "Compare").
    Watched(Box<crate::mirror::Watched<RespBody>>),
}

impl RespBody {
    /// Wraps a backend body; an already-finished one releases its hold at once.
    pub(crate) fn upstream(inner: Incoming, hold: Hold, pool: &'static Upstreams) -> RespBody {
        let hold = if inner.is_end_stream() {
            hold.complete(pool);
            None
        } else {
            Some(Box::new(hold))
        };
        RespBody::Upstream { inner, hold, pool }
    }

    /// Wraps a body read inline; an already-finished one releases its hold and its
    /// connection at once.
    pub(crate) fn wire(mut inner: WireBody, hold: Hold, pool: &'static Upstreams) -> RespBody {
        let hold = if inner.is_end_stream() {
            if let Some(w) = inner.take_reusable() {
                pool.checkin_wire(w);
            }
            hold.complete(pool);
            None
        } else {
            Some(Box::new(hold))
        };
        RespBody::Wire { inner, hold, pool }
    }

    /// This body, compressed with `coding` as it streams.
    pub(crate) fn compressed(
        self,
        coding: crate::compress::Coding,
        slot: crate::compress::Slot,
    ) -> RespBody {
        RespBody::Compressed(Box::new(crate::compress::Compressed::new(
            self, coding, slot,
        )))
    }

    /// A fixed body.
    pub(crate) fn full(b: impl Into<Bytes>) -> RespBody {
        RespBody::Full(Some(b.into()))
    }

    /// No body.
    pub(crate) fn empty() -> RespBody {
        RespBody::Full(None)
    }
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = BodyError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            RespBody::Wire { inner, hold, pool } => {
                let r = inner.poll_frame(cx);
                match &r {
                    Poll::Ready(Some(Ok(_))) if !inner.is_end_stream() => {}
                    Poll::Ready(Some(Ok(_)) | None) => {
                        if let Some(w) = inner.take_reusable() {
                            pool.checkin_wire(w);
                        }
                        if let Some(h) = hold.take() {
                            h.complete(pool);
                        }
                    }
                    Poll::Ready(Some(Err(_))) => {
                        if let Some(mut h) = hold.take() {
                            h.guard.fail();
                        }
                    }
                    Poll::Pending => {}
                }
                r.map_err(Into::into)
            }
            RespBody::Upstream { inner, hold, pool } => {
                let r = Pin::new(&mut *inner).poll_frame(cx);
                match &r {
                    Poll::Ready(Some(Ok(_))) => {
                        if inner.is_end_stream() {
                            if let Some(h) = hold.take() {
                                h.complete(pool);
                            }
                        }
                    }
                    Poll::Ready(Some(Err(_))) => {
                        // A broken body: the connection is dropped, not pooled.
                        if let Some(mut h) = hold.take() {
                            h.guard.fail();
                        }
                    }
                    Poll::Ready(None) => {
                        if let Some(h) = hold.take() {
                            h.complete(pool);
                        }
                    }
                    Poll::Pending => {}
                }
                r.map_err(Into::into)
            }
            RespBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            RespBody::Compressed(c) => Pin::new(&mut **c).poll_frame(cx),
            RespBody::Watched(w) => Pin::new(&mut **w).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RespBody::Wire { inner, .. } => inner.is_end_stream(),
            RespBody::Upstream { inner, .. } => inner.is_end_stream(),
            RespBody::Full(b) => b.is_none(),
            RespBody::Compressed(c) => c.is_end_stream(),
            RespBody::Watched(w) => w.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Wire { inner, .. } => inner.size_hint(),
            RespBody::Upstream { inner, .. } => inner.size_hint(),
            RespBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            RespBody::Full(None) => SizeHint::with_exact(0),
            RespBody::Compressed(c) => c.size_hint(),
            RespBody::Watched(w) => w.size_hint(),
        }
    }
}

/// What the request path answers a client with: the head, and the body beside it.
#[derive(Debug)]
pub(crate) struct ProxyResponse {
    /// Status and header fields.
    pub(crate) head: ResponseHead,
    /// The body, which holds the request's accounting until it ends.
    pub(crate) body: RespBody,
}

impl ProxyResponse {
    /// An answer with a header map.
    pub(crate) fn new(status: StatusCode, fields: HeaderMap, body: RespBody) -> ProxyResponse {
        ProxyResponse {
            head: ResponseHead {
                request_id: None,
                rate_limit: None,
                alt_svc: false,
                status,
                version: Version::HTTP_11,
                reason: None,
                fields: ResponseFields::Map(fields),
            },
            body,
        }
    }

    /// A short plain-text answer of fulcrum's own.
    pub(crate) fn own(status: StatusCode, text: &'static str) -> ProxyResponse {
        let mut fields = HeaderMap::with_capacity(2);
        fields.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        let body = RespBody::full(Bytes::from_static(text.as_bytes()));
        ProxyResponse::new(status, fields, body)
    }

    /// Whether this is an answer of fulcrum's own that ends its connection
    /// (`Connection: close`, as a refused head's does). A backend's answer read inline
    /// has had its `Connection` removed as hop-by-hop: only a map is looked at.
    pub(crate) fn closes(&self) -> bool {
        matches!(self.head.fields, ResponseFields::Map(_))
            && self.head.field(&header::CONNECTION).is_some_and(|v| {
                super::hop::tokens(v.as_bytes()).any(|t| t == super::hop::Token::Close)
            })
    }

    /// Adds a field to an answer with a header map (fulcrum's own answers).
    pub(crate) fn with_field(mut self, name: HeaderName, value: HeaderValue) -> ProxyResponse {
        if let ResponseFields::Map(m) = &mut self.head.fields {
            m.insert(name, value);
        }
        self
    }

    /// The answer as hyper's server writes it, its fields as a header map.
    pub(crate) fn into_http(self) -> Response<RespBody> {
        let mut r = Response::new(self.body);
        *r.status_mut() = self.head.status;
        *r.version_mut() = self.head.version;
        let mut head = self.head;
        let fields = std::mem::replace(&mut head.fields, ResponseFields::Map(HeaderMap::new()));
        let mut map = match fields {
            ResponseFields::Map(m) => m,
            ResponseFields::Wire(f) => f.into_map(),
        };
        let has_date = map.contains_key(header::DATE);
        head.finish(has_date, |added| match added {
            Added::Date(v) => drop(map.insert(header::DATE, v)),
            Added::AltSvc(v) => drop(map.insert(header::ALT_SVC, v.clone())),
            Added::RequestId(id) => drop(map.insert(X_REQUEST_ID, id.header_value())),
            Added::RateLimit(rl) => {
                for (name, v) in rl.fields() {
                    map.insert(HeaderName::from_static(name), HeaderValue::from(v));
                }
            }
        });
        *r.headers_mut() = map;
        if let Some(reason) = head.reason {
            r.extensions_mut().insert(reason);
        }
        r
    }
}

/// The request's `Content-Length`, when it states one (`h2` refuses a stream whose
/// DATA frames carry another length).
pub(crate) fn stated_length(fields: &HeaderMap) -> Option<u64> {
    fields
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Makes an answer's head (as [`ProxyResponse::into_http`] made it) one HTTP/2 (and
/// HTTP/3) carries: a `Content-Length` when there is a body of a known length and none is stated (as
/// hyper's server: an answer without a body, to `HEAD` among others, says nothing it
/// does not know), and no hop-by-hop field (the hop rules' list: RFC 9113 §8.2.2 forbids
/// the connection-specific ones, and `h2` refuses to send them).
pub(crate) fn fit_head(fields: &mut HeaderMap, body: &RespBody) {
    if let (Some(n), false) = (body.size_hint().exact(), body.is_end_stream()) {
        if !fields.contains_key(header::CONTENT_LENGTH) {
            fields.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
    }
    // Answers from the wire have lost them already; an answer of fulcrum's own may say
    // `Connection: close`.
    let hop = |n: &HeaderName| super::hop::is_hop_by_hop(n.as_str().as_bytes());
    if fields.keys().any(hop) {
        let doomed: Vec<HeaderName> = fields.keys().filter(|n| hop(n)).cloned().collect();
        for name in doomed {
            fields.remove(name);
        }
    }
}
