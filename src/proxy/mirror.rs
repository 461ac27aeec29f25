//! Mirroring on the request path (`docs/traffic.md`, "Mirrors"): a copy of a request its
//! route's mirror takes goes to the mirror pool in a task of its own, off the client's
//! path; with `compare`, the client's answer is watched as it passes so that the two
//! can be compared ([`crate::mirror`]).
//!
//! The copy is the request as this hop forwards it, with `X-Fulcrum-Mirror: 1`. Its body
//! is the one retries keep when they keep it; else the client's body is copied as the
//! primary reads it (never faster: the copy is sent once it is whole), up to the
//! mirror's `body_limit` — a longer one drops the copy (skipped).
//!
//! The copy goes through hyper's client, not the inline exchange the client's own
//! bodiless request takes: a second caller of that exchange would take it out of the
//! request's future and make every request dearer, mirrored or not
//! (`docs/performance.md`, "Mirrors").

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use http::header::{HeaderMap, HeaderValue};
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

/// The primary's side of a compared request: its report, and when the copy was made.
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
    /// Whole once the primary has read the client's; the sender dropped unsent when it
    /// grew over the limit or broke off.
    Later(oneshot::Receiver<Bytes>),
}

/// Where the copy goes: a backend of the mirror pool now, or the means to pick one once
/// its body is whole (its slot is not held through the client's upload).
enum Target {
    Now(RequestGuard),
    Later { ip: IpAddr, trusted: Vec<IpNet> },
}

/// Copies `req` to its route's mirror when the mirror takes it (`kept`: the body its
/// tries keep, when they keep one); returns the primary's side of the comparison when
/// answers are compared. A copy that cannot go is counted: skipped (`max_in_flight`, a
/// body over the limit, an upgrade), or an error (no backend in the mirror pool).
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
    // Its place first: a copy that has none takes nothing of the request.
    let flight = mirror.enter()?;
    let Some(body) = body_of(req, kept, mirror.spec.body_limit) else {
        mirror.count(Outcome::Skipped);
        return None;
    };
    let mut copy = outgoing::copy_of(req);
    (copy.headers_mut()).insert(X_FULCRUM_MIRROR, HeaderValue::from_static("1"));
    let ip = req.peer.addr.ip();
    let target = match body {
        CopyBody::Later(_) => Target::Later {
            ip,
            trusted: trusted.to_vec(),
        },
        _ => match pick(&mirror.pool, copy.headers(), ip, trusted) {
            Some(guard) => Target::Now(guard),
            None => {
                mirror.count(Outcome::Error);
                return None;
            }
        },
    };
    // Compared, the pair holds the place until both sides have reported (the primary's
    // body may be kept for `ignore_json` until then); else the copy's task does.
    let (primary, mirrored, flight) = match mirror.compares() {
        true => {
            let id = req.id.as_bytes();
            let [p, m] = Pair::reports(Arc::clone(&mirror), id, req.target.path(), flight);
            (Some(p), Some(m), None)
        }
        false => (None, None, Some(flight)),
    };
    let origin = Some((req.peer.addr, req.peer.local));
    // Boxed: the task moves a pointer, not the exchange's whole future.
    let sending = send(up, (mirror, flight), target, (copy, body, origin), mirrored);
    tokio::spawn(Box::pin(sending));
    primary.map(|report| {
        Box::new(Watch {
            report,
            since: Stamp::now(),
        })
    })
}

impl Watch {
    /// The primary's answer, noted: a backend's, its body wrapped to hash it as it passes
    /// (its latency `upstream`, the last try's, as the mirror's is measured); fulcrum's
    /// own (no backend answered), its status only. The caller matches on the watch: an
    /// answer that is not compared takes a path of its own, untouched.
    #[inline(never)]
    pub(super) fn primary(self, mut r: ProxyResponse, upstream: Option<Duration>) -> ProxyResponse {
        let status = r.head.status.as_u16();
        let Some(latency) = upstream else {
            let latency = Stamp::now().since(self.since);
            self.report.send(Some(Side {
                status,
                latency,
                body: None,
            }));
            return r;
        };
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
    let stated = inner.stated_length();
    if stated.is_some_and(|n| n > limit) {
        req.body = Some(inner);
        return None;
    }
    let (tx, rx) = oneshot::channel();
    // Room for a stated length; a body of unknown length grows as it comes.
    let room = stated.map_or(0, |n| n.min(limit));
    req.body = Some(ClientBody::stream(Tee {
        inner,
        copy: Some(BytesMut::with_capacity(usize::try_from(room).unwrap_or(0))),
        limit,
        to: Some(tx),
    }));
    Some(CopyBody::Later(rx))
}

/// A backend of the mirror pool, its slot taken (its own strategy's pick, a hashing
/// one over the copy's `fields`; no sticky cookie, no retry).
fn pick(pool: &Pool, fields: &HeaderMap, ip: IpAddr, trusted: &[IpNet]) -> Option<RequestGuard> {
    let (mut tried, mut key) = (Vec::new(), None);
    let ask = Ask {
        sticky: None,
        tried: &mut tried,
        fresh: true,
        key: &mut key,
    };
    let hash_key = &pool.settings.hash_key;
    let got = pool.acquire(ask, |source| {
        crate::strategy::request_key(source, hash_key, fields, ip, trusted)
    });
    got.ok().map(|g| g.guard)
}

/// How reading the mirror's answer body ended.
enum Read {
    /// Whole, within the limit: its digest when compared.
    Whole(Option<Digest>),
    /// Longer than the limit: compared by status only (its connection is not reused).
    TooLong,
    /// Broken off or too slow: no answer after all.
    Broken,
}

/// The mirror's answer: its status, its latency, how its body was read.
struct Answered {
    status: StatusCode,
    latency: Duration,
    body: Read,
}

/// Sends the copy through hyper's client once its body is whole (a backend picked then
/// if not before), reads the mirror's answer and reports it.
async fn send(
    up: &'static Upstreams,
    (mirror, _flight): (Arc<Mirror>, Option<Flight>),
    target: Target,
    (mut req, body, origin): (Request<ReqBody>, CopyBody, Option<(SocketAddr, SocketAddr)>),
    report: Option<Report>,
) {
    let body = match body {
        CopyBody::Empty => None,
        CopyBody::Ready(b) => Some(b),
        CopyBody::Later(rx) => match rx.await {
            Ok(b) => Some(b),
            Err(_) => return mirror.count(Outcome::Skipped),
        },
    };
    if let Some(b) = body {
        let full = http_body_util::Full::new(b).map_err(|e: Infallible| match e {});
        *req.body_mut() = ReqBody::streaming(ClientBody::stream(full), None);
    }
    let mut guard = match target {
        Target::Now(guard) => guard,
        Target::Later { ip, trusted } => match pick(&mirror.pool, req.headers(), ip, &trusted) {
            Some(guard) => guard,
            None => return mirror.count(Outcome::Error),
        },
    };
    let digest = report.as_ref().map(Report::digest);
    let answered = through_hyper(up, &mirror, &mut guard, (req, origin), digest).await;
    settle(&mirror, guard, answered, report);
}

/// What a copy came to: an error counted, or the mirror's side reported.
fn settle(
    mirror: &Mirror,
    mut guard: RequestGuard,
    answered: Result<Answered, ()>,
    report: Option<Report>,
) {
    let a = match answered {
        Ok(Answered {
            body: Read::Broken, ..
        }) => return mirror.count(Outcome::Error),
        Ok(a) => a,
        Err(()) => {
            guard.fail();
            guard.outcome(false);
            return mirror.count(Outcome::Error);
        }
    };
    if let Some(report) = report {
        let body = match a.body {
            Read::Whole(Some(d)) => report.finish(d),
            _ => None,
        };
        let (status, latency) = (a.status.as_u16(), a.latency);
        report.send(Some(Side {
            status,
            latency,
            body,
        }));
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
    let (answer, conn, sent_at) = (up.send(&backend, req, timeout, origin).await).map_err(drop)?;
    let status = answer.status();
    let latency = noted(guard, sent_at, status);
    let mut body = answer.into_body();
    let limits = (mirror.spec.body_limit, timeout);
    let read = read_body(|cx| Pin::new(&mut body).poll_frame(cx), digest, limits).await;
    if let Read::Whole(_) = read {
        up.checkin(conn);
    }
    Ok(Answered {
        status,
        latency,
        body: read,
    })
}

/// Notes an answer of `status` whose head came after the request left at `sent_at`:
/// its backend's latency sample and outcome, as any answer's. Returns the latency.
fn noted(guard: &mut RequestGuard, sent_at: Stamp, status: StatusCode) -> Duration {
    let now = Stamp::now();
    let latency = now.since(sent_at);
    crate::strategy::record_latency_at(guard.backend(), latency, now.ns());
    let failed = status.is_server_error();
    if failed {
        guard.fail();
    }
    guard.outcome(!failed);
    latency
}

/// Reads an answer body whole (`next` gives its frames) within `timeout`, hashing it
/// into `digest`, but no further than `limit`.
async fn read_body<E>(
    mut next: impl FnMut(&mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, E>>>,
    mut digest: Option<Digest>,
    (limit, timeout): (u64, Duration),
) -> Read {
    let read = async {
        let mut len = 0u64;
        while let Some(frame) = std::future::poll_fn(&mut next).await {
            let Ok(frame) = frame else {
                return Read::Broken;
            };
            if let Some(data) = frame.data_ref() {
                len += data.len() as u64;
                if len > limit {
                    return Read::TooLong;
                }
                if let Some(d) = digest.as_mut() {
                    d.update(data);
                }
            }
        }
        Read::Whole(digest)
    };
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or(Read::Broken)
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
                // The copy's task is gone (its request ended): nothing more to keep.
                if this.to.as_ref().is_some_and(oneshot::Sender::is_closed) {
                    this.give_up();
                }
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

/// An answer of fulcrum's own to the client (no backend answered), through the
/// comparison when the request has a `watch` ([`copy`]): its status only. A backend's
/// answer is matched on where it is, so that one not compared is not moved.
#[inline(always)]
pub(super) fn watched_own(watch: Option<Box<Watch>>, r: ProxyResponse) -> ProxyResponse {
    match watch {
        None => r,
        Some(w) => (*w).primary(r, None),
    }
}
