//! Mirroring on the request path (`docs/traffic.md`, "Mirrors"): a copy of a request its
//! route's mirror takes goes to the mirror pool in a task of its own, off the client's
//! path; with `compare`, the client's answer is watched as it passes so that the two
//! can be compared ([`crate::mirror`]).
//!
//! The copy is the request as this hop forwards it, with `X-Fulcrum-Mirror: 1`. Its body
//! is the one retries keep when they keep it; else the client's body is copied as the
//! primary reads it (never faster: the copy is sent once it is whole), up to the
//! mirror's `body_limit` — a longer one drops the copy (skipped).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use http::header::HeaderValue;
use http::{Request, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use ipnet::IpNet;
use tokio::sync::oneshot;

use super::answer::{ProxyResponse, RespBody};
use super::body::{BodyError, ClientBody, ReqBody};
use super::headers::X_FULCRUM_MIRROR;
use super::outgoing::{self, Outgoing};
use super::upstream::Upstreams;
use crate::clock::Stamp;
use crate::mirror::{Digest, Flight, Mirror, Outcome, Pair, Report, Side, Watched};
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
            let [p, m] = Pair::reports(Arc::clone(&mirror), req.id.as_bytes(), req.target.path());
            (Some(p), Some(m))
        }
        false => (None, None),
    };
    let origin = Some((req.peer.addr, req.peer.local));
    // Boxed: the task moves a pointer, not the exchange's whole future.
    let sending = send(up, (flight, guard), (copy, body, origin), mirrored);
    tokio::spawn(Box::pin(sending));
    primary.map(|report| {
        Box::new(Watch {
            report,
            since: Stamp::now(),
        })
    })
}

impl Watch {
    /// The primary's answer, its body wrapped to hash it as it passes, its status and
    /// latency noted. (The caller matches on the watch: an answer that is not compared
    /// takes a path of its own, untouched.)
    #[inline(never)]
    pub(super) fn primary(self, mut r: ProxyResponse) -> ProxyResponse {
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

/// The mirror's answer: its status, its latency, and — when it was read whole within the
/// limit — the digest of its body (`Some(None)` when it is not compared).
struct Answered {
    status: StatusCode,
    latency: Duration,
    body: Option<Option<Digest>>,
}

/// Sends the copy through hyper's client once its body is whole, reads the mirror's
/// answer and reports it.
async fn send(
    up: &'static Upstreams,
    (flight, mut guard): (Flight, RequestGuard),
    (mut req, body, origin): (Request<ReqBody>, CopyBody, Option<(SocketAddr, SocketAddr)>),
    report: Option<Report>,
) {
    let mirror = flight.mirror();
    let Some(body) = whole(body).await else {
        return mirror.count(Outcome::Skipped);
    };
    if let Some(b) = body {
        let full = http_body_util::Full::new(b).map_err(|e: Infallible| match e {});
        *req.body_mut() = ReqBody::streaming(ClientBody::stream(full), None);
    }
    let digest = report.as_ref().map(Report::digest);
    let answered = through_hyper(up, mirror, &mut guard, (req, origin), digest).await;
    settle(mirror, guard, answered, report);
}

/// What a copy came to: an error counted, or the mirror's side reported.
fn settle(
    mirror: &Mirror,
    mut guard: RequestGuard,
    answered: Result<Answered, ()>,
    report: Option<Report>,
) {
    let Ok(a) = answered else {
        guard.fail();
        guard.outcome(false);
        return mirror.count(Outcome::Error);
    };
    if let Some(report) = report {
        let body = a.body.flatten().and_then(|d| report.finish(d));
        let (status, latency) = (a.status.as_u16(), a.latency);
        report.send(Some(Side {
            status,
            latency,
            body,
        }));
    }
}

/// The copy's body once it is whole: `Some(None)` without one, `None` when it cannot be
/// copied after all (over the limit, broken off).
async fn whole(body: CopyBody) -> Option<Option<Bytes>> {
    match body {
        CopyBody::Empty => Some(None),
        CopyBody::Ready(b) => Some(Some(b)),
        CopyBody::Later(rx) => rx.await.ok().map(Some),
    }
}

/// The copy through hyper's client; `Err` without an answer.
async fn through_hyper(
    up: &'static Upstreams,
    mirror: &Mirror,
    guard: &mut RequestGuard,
    (mut req, origin): (Request<ReqBody>, Option<(SocketAddr, SocketAddr)>),
    digest: Option<Digest>,
) -> Result<Answered, ()> {
    let backend = Arc::clone(guard.backend());
    outgoing::for_backend(&mut req, &backend);
    let timeout = mirror.pool.settings.upstream_timeout;
    mirror.count(Outcome::Sent);
    let started = Stamp::now();
    let (answer, conn, _) = (up.send(&backend, req, timeout, origin).await).map_err(drop)?;
    let status = answer.status();
    let latency = noted(guard, started, status);
    let mut body = answer.into_body();
    let limits = (mirror.spec.body_limit, timeout);
    let read = read_body(|cx| Pin::new(&mut body).poll_frame(cx), digest, limits).await;
    if read.is_some() {
        up.checkin(conn);
    }
    Ok(Answered {
        status,
        latency,
        body: read,
    })
}

/// Notes an answer of `status` whose head came after the try `started`: its backend's
/// latency sample and outcome, as any answer's. Returns the latency.
fn noted(guard: &mut RequestGuard, started: Stamp, status: StatusCode) -> Duration {
    let now = Stamp::now();
    let latency = now.since(started);
    crate::strategy::record_latency_at(guard.backend(), latency, now.ns());
    let failed = status.is_server_error();
    if failed {
        guard.fail();
    }
    guard.outcome(!failed);
    latency
}

/// Reads an answer body whole (`next` gives its frames) within `timeout`, hashing it
/// into `digest`; `None` when it broke off, took too long or ran past `limit` (its
/// connection is then not reused), else the digest.
async fn read_body<E>(
    mut next: impl FnMut(&mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, E>>>,
    mut digest: Option<Digest>,
    (limit, timeout): (u64, Duration),
) -> Option<Option<Digest>> {
    let read = async {
        let mut len = 0u64;
        while let Some(frame) = std::future::poll_fn(&mut next).await {
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
