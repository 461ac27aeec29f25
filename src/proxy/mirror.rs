//! Mirroring on the request path (`docs/traffic.md`, "Mirrors"): a copy of a request its
//! route's mirror takes goes to the mirror pool in a task of its own, off the client's
//! path; with `compare`, the client's answer is watched as it passes so that the two
//! can be compared ([`crate::mirror`]).
//!
//! The copy is the request as this hop forwards it, with `X-Fulcrum-Mirror: 1`. Its body
//! is the one retries keep when they keep it; else the client's body is copied as the
//! primary reads it (never faster: the copy is sent once it is whole), up to the
//! mirror's `body_limit` — a longer one drops the copy (skipped).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;
use http::Request;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use ipnet::IpNet;
use tokio::sync::oneshot;

use super::answer::{ProxyResponse, RespBody};
use super::body::{BodyError, ClientBody, ReqBody};
use super::headers::X_FULCRUM_MIRROR;
use super::outgoing::{self, Outgoing};
use super::upstream::Upstreams;
use crate::clock::Stamp;
use crate::mirror::{Flight, Outcome, Pair, Report, Side, Watched};
use crate::pool::{Ask, Pool, RequestGuard};

/// The primary's side of a compared request: its report, and when its tries began.
pub(super) struct Watch {
    report: Report,
    since: Stamp,
}

/// The copy's body.
enum CopyBody {
    /// None.
    Empty,
    /// Whole already (the body retries keep).
    Ready(Bytes),
    /// Whole once the primary has read the client's (`None`: it was over the limit or
    /// broke off).
    Later(oneshot::Receiver<Bytes>),
}

/// Copies `req` to its route's mirror when the mirror takes it (`kept`: the body its
/// tries keep, when they keep one); returns the primary's side of the comparison when
/// answers are compared. A copy that cannot go is counted (skipped, or an error when
/// the mirror pool has no backend to take it).
#[inline(never)]
pub(super) fn copy(
    up: &'static Upstreams,
    req: &mut Outgoing<'_>,
    kept: Option<&Bytes>,
    trusted: &[IpNet],
) -> Option<Box<Watch>> {
    let mirror = req.mirror.take()?;
    if !mirror.takes(req.id.as_bytes()) {
        return None;
    }
    let Some(body) = body_of(req, kept, mirror.spec.body_limit) else {
        mirror.count(Outcome::Skipped);
        return None;
    };
    let flight = mirror.enter()?;
    let Some(guard) = pick(&mirror.pool, req, trusted) else {
        mirror.count(Outcome::Error);
        return None;
    };
    let mut copy = outgoing::copy_of(req);
    (copy.headers_mut()).insert(X_FULCRUM_MIRROR, HeaderValue::from_static("1"));
    let (primary, mirrored) = match mirror.compares() {
        true => {
            let [p, m] = Pair::new(Arc::clone(&mirror), req.id.as_bytes(), req.target.path());
            (Some(p), Some(m))
        }
        false => (None, None),
    };
    let origin = Some((req.peer.addr, req.peer.local));
    tokio::spawn(send(up, flight, guard, (copy, body), mirrored, origin));
    primary.map(|report| {
        Box::new(Watch {
            report,
            since: Stamp::now(),
        })
    })
}

/// The primary's answer, watched when its request was compared.
#[inline]
pub(super) fn watched(watch: Option<Box<Watch>>, r: ProxyResponse) -> ProxyResponse {
    match watch {
        None => r,
        Some(w) => w.primary(r),
    }
}

impl Watch {
    /// Wraps the answer's body to hash it as it passes, its status and latency noted.
    #[inline(never)]
    fn primary(self: Box<Self>, mut r: ProxyResponse) -> ProxyResponse {
        let latency = Stamp::now().since(self.since);
        let status = r.head.status.as_u16();
        let body = std::mem::replace(&mut r.body, RespBody::empty());
        let w = Watched::new(body, self.report, status, latency);
        r.body = RespBody::Watched(Box::new(w));
        r
    }
}

/// The copy's body, when the request can be copied: not an upgrade, and a body within
/// `limit` (a body of unknown length is cut off there as it streams).
fn body_of(req: &mut Outgoing<'_>, kept: Option<&Bytes>, limit: u64) -> Option<CopyBody> {
    if req.client_upgrade.is_some() {
        return None;
    }
    if let Some(b) = kept {
        return (b.len() as u64 <= limit).then(|| CopyBody::Ready(b.clone()));
    }
    let Some(inner) = req.body.take() else {
        return Some(CopyBody::Empty);
    };
    // An empty body may never be polled.
    if inner.is_end_stream() {
        req.body = Some(inner);
        return Some(CopyBody::Empty);
    }
    if inner.stated_length().is_some_and(|n| n > limit) {
        req.body = Some(inner);
        return None;
    }
    let (tx, rx) = oneshot::channel();
    req.body = Some(ClientBody::stream(Tee {
        inner,
        copy: Some(BytesMut::new()),
        limit,
        to: Some(tx),
    }));
    Some(CopyBody::Later(rx))
}

/// A backend of the mirror pool, its slot taken (its own strategy's pick; no sticky
/// cookie, no retry).
fn pick(pool: &Pool, req: &Outgoing<'_>, trusted: &[IpNet]) -> Option<RequestGuard> {
    let (mut tried, mut key) = (Vec::new(), None);
    let ask = Ask {
        sticky: None,
        tried: &mut tried,
        fresh: true,
        key: &mut key,
    };
    let got = pool.acquire(ask, |source| {
        let fields = outgoing::copy_of(req);
        let ip = req.peer.addr.ip();
        crate::strategy::request_key(
            source,
            &pool.settings.hash_key,
            fields.headers(),
            ip,
            trusted,
        )
    });
    got.ok().map(|g| g.guard)
}

/// Sends the copy once its body is whole, reads the mirror's answer (its body hashed for
/// the comparison, up to the limit) and reports it.
async fn send(
    up: &'static Upstreams,
    flight: Flight,
    mut guard: RequestGuard,
    (mut copy, body): (Request<ReqBody>, CopyBody),
    report: Option<Report>,
    origin: Option<(std::net::SocketAddr, std::net::SocketAddr)>,
) {
    let mirror = Arc::clone(flight.mirror());
    let bytes = match body {
        CopyBody::Empty => None,
        CopyBody::Ready(b) => Some(b),
        CopyBody::Later(rx) => match rx.await {
            Ok(b) => Some(b),
            Err(_) => return mirror.count(Outcome::Skipped),
        },
    };
    if let Some(b) = bytes {
        let full = http_body_util::Full::new(b).map_err(|e: std::convert::Infallible| match e {});
        *copy.body_mut() = ReqBody::streaming(ClientBody::stream(full), None);
    }
    let backend = Arc::clone(guard.backend());
    outgoing::for_backend(&mut copy, &backend);
    let timeout = mirror.pool.settings.upstream_timeout;
    mirror.count(Outcome::Sent);
    let started = Stamp::now();
    let (answer, conn, _) = match up.send(&backend, copy, timeout, origin).await {
        Ok(a) => a,
        Err(_) => {
            guard.fail();
            guard.outcome(false);
            return mirror.count(Outcome::Error);
        }
    };
    let now = Stamp::now();
    let latency = now.since(started);
    crate::strategy::record_latency_at(&backend, latency, now.ns());
    let status = answer.status();
    if status.is_server_error() {
        guard.fail();
    }
    guard.outcome(!status.is_server_error());
    let digest = report.as_ref().map(Report::digest);
    let read = read_answer(answer.into_body(), digest, mirror.spec.body_limit, timeout).await;
    if read.is_some() {
        up.checkin(conn);
    }
    if let Some(report) = report {
        let body = read.flatten().and_then(|d| report.finish(d));
        let status = status.as_u16();
        report.send(Some(Side {
            status,
            latency,
            body,
        }));
    }
    drop((guard, flight));
}

/// Reads the mirror's answer body whole within `timeout`, hashing it into `digest`;
/// `None` when it broke off, took too long or ran past `limit` (the connection is then
/// not reused), else the digest.
async fn read_answer(
    mut body: Incoming,
    mut digest: Option<crate::mirror::Digest>,
    limit: u64,
    timeout: Duration,
) -> Option<Option<crate::mirror::Digest>> {
    let read = async {
        let mut len = 0u64;
        while let Some(frame) = body.frame().await {
            let frame = frame.ok()?;
            if let Some(data) = frame.data_ref() {
                len += data.len() as u64;
                if len > limit {
                    return None;
                }
                if let Some(d) = digest.as_mut() {
                    d.update(data);
                }
            }
        }
        Some(digest)
    };
    tokio::time::timeout(timeout, read).await.ok().flatten()
}

/// The client's body on its way to the primary, copied for the mirror as it passes:
/// the copy is handed over whole at the end, or dropped when it grows past `limit` or
/// the body breaks off.
struct Tee {
    inner: ClientBody,
    copy: Option<BytesMut>,
    limit: u64,
    to: Option<oneshot::Sender<Bytes>>,
}

impl Tee {
    fn end(&mut self) {
        if let (Some(copy), Some(to)) = (self.copy.take(), self.to.take()) {
            // The copy's task may have ended (the request is over): nothing to do.
            let _ = to.send(copy.freeze());
        }
    }

    fn give_up(&mut self) {
        self.copy = None;
        self.to = None;
    }
}

impl Body for Tee {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let r = this.inner.poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(copy), Some(data)) = (this.copy.as_mut(), frame.data_ref()) {
                    if (copy.len() + data.len()) as u64 > this.limit {
                        this.give_up();
                    } else {
                        copy.extend_from_slice(data);
                    }
                }
                if this.inner.is_end_stream() {
                    this.end();
                }
            }
            Poll::Ready(None) => this.end(),
            Poll::Ready(Some(Err(_))) => this.give_up(),
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
