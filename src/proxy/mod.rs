//! The request path: pick, forward, stream back (§4).

mod body;
pub mod budget;
pub mod headers;
pub mod record;
mod upstream;
mod wire;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::Body as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ipnet::IpNet;

pub use body::{Hold, ReqBody, RespBody};
pub use budget::RetryBudget;
pub use record::{Finish, Pending, Recorder};
pub use upstream::{Failure, Upstreams};
pub use wire::Fields;

use crate::config::{HashKey, Settings};
use crate::pool::stats::bump;
use crate::pool::{Backend, OutlierAction, Pool};
use crate::strategy::PickCtx;

/// The settings the request path reads.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// Bound on request sent → response headers.
    pub upstream_timeout: Duration,
    /// TCP connect bound.
    pub connect_timeout: Duration,
    /// Extra attempts for idempotent requests whose connect failed.
    pub retries: u32,
    /// Shed above this many in flight (0 = off).
    pub max_inflight: usize,
    /// Peers whose forwarding headers are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// The access log's format; `None` when it is off.
    pub access_log: Option<crate::config::LogFormat>,
    /// Request key of `consistent_hash` and `maglev`.
    pub hash_key: HashKey,
}

impl ProxySettings {
    /// The request-path part of the settings.
    pub fn from_settings(s: &Settings) -> Self {
        ProxySettings {
            upstream_timeout: s.upstream_timeout,
            connect_timeout: s.connect_timeout,
            retries: s.retries,
            max_inflight: s.max_inflight,
            trusted_proxies: s.trusted_proxies.clone(),
            access_log: s.access_log.then_some(s.log_format),
            hash_key: s.hash_key.clone(),
        }
    }
}

/// A slot in the proxy-wide in-flight count used for shedding.
#[derive(Debug)]
pub struct ShedPermit(Arc<AtomicUsize>);

impl Drop for ShedPermit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One worker's proxy: shared pool, own upstream connections.
#[derive(Debug)]
pub struct Proxy {
    pool: Arc<Pool>,
    upstreams: &'static Upstreams,
    settings: ProxySettings,
    in_flight: Arc<AtomicUsize>,
    budget: Arc<RetryBudget>,
    rec: &'static Recorder,
}

fn own_answer(status: StatusCode, text: &'static str) -> Response<RespBody> {
    let mut r = Response::new(RespBody::full(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Request heads larger than this are refused with 431.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Bytes of the request head as sent on the wire (request line and header lines).
fn head_size(req: &http::request::Parts) -> usize {
    let line =
        req.method.as_str().len() + req.uri.path_and_query().map_or(1, |p| p.as_str().len()) + 12;
    req.headers
        .iter()
        .fold(line, |n, (k, v)| n + k.as_str().len() + v.len() + 4)
}

fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE
    )
}

impl Failure {
    fn answer(&self) -> Response<RespBody> {
        match self {
            Failure::Connect => own_answer(
                StatusCode::BAD_GATEWAY,
                "bad gateway: backend unreachable\n",
            ),
            Failure::Broken => own_answer(StatusCode::BAD_GATEWAY, "bad gateway\n"),
            Failure::Timeout => own_answer(StatusCode::GATEWAY_TIMEOUT, "gateway timeout\n"),
            // Nobody is left to read it; hyper needs some answer all the same.
            Failure::ClientGone => own_answer(StatusCode::BAD_REQUEST, "request body broke off\n"),
        }
    }
}

impl Proxy {
    /// A proxy over `pool`; `in_flight` (shedding) and `budget` (retries) are shared by
    /// every worker.
    ///
    /// A proxy lives as long as its worker thread, which is as long as the process: its
    /// connection pool is leaked so response bodies can hand connections back to it
    /// without a reference count per request.
    pub fn new(
        pool: Arc<Pool>,
        settings: ProxySettings,
        in_flight: Arc<AtomicUsize>,
        budget: Arc<RetryBudget>,
    ) -> Proxy {
        Proxy {
            budget,
            upstreams: Box::leak(Box::new(Upstreams::new(settings.connect_timeout))),
            rec: Box::leak(Box::new(Recorder::new(
                Arc::clone(&pool),
                settings.access_log,
            ))),
            pool,
            settings,
            in_flight,
        }
    }

    /// Closes idle upstream connections past their time or to backends no longer pooled.
    pub fn sweep_idle(&self) {
        let snap = self.pool.snapshot();
        let live: std::collections::HashSet<u64> = snap.backends.iter().map(|b| b.id).collect();
        self.upstreams.sweep(|id| live.contains(&id));
    }

    /// Feeds passive outlier detection and carries out what it asks for.
    fn note_outcome(&self, guard: &mut crate::pool::RequestGuard, ok: bool) {
        match guard.outcome(ok) {
            OutlierAction::None => {}
            OutlierAction::Eject | OutlierAction::TrialFailed => {
                self.pool.eject(guard.backend().id);
            }
            OutlierAction::Restored => {
                let b = guard.backend();
                tracing::info!(backend = %b.name, "half-open trial succeeded: full traffic again");
                self.pool.emit(crate::pool::Event::Restored {
                    id: b.id,
                    backend: b.name.clone(),
                });
            }
        }
    }

    /// `Err(())` when the proxy is over `--max-inflight` and must shed this request.
    fn shed_permit(&self) -> Result<Option<ShedPermit>, ()> {
        let max = self.settings.max_inflight;
        if max == 0 {
            return Ok(None);
        }
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        let permit = ShedPermit(Arc::clone(&self.in_flight));
        if now > max {
            return Err(());
        }
        Ok(Some(permit))
    }

    /// Proxies one request from `peer`; `peer_value` is its [`headers::forwarded_value`].
    pub async fn handle(
        &self,
        mut req: Request<Incoming>,
        peer: SocketAddr,
        peer_value: HeaderValue,
    ) -> Response<RespBody> {
        let upgrade =
            req.version() == Version::HTTP_11 && headers::is_upgrade_request(req.headers());
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (parts, body) = req.into_parts();
        // An empty body is not forwarded as a stream: such a request can be replayed.
        let body = (!body.is_end_stream()).then_some(body);
        let mut resp = self
            .handle_parts(parts, None, body, client_upgrade, peer, peer_value)
            .await;
        // hyper writes the head from a header map; an answer read inline has its fields
        // as spans of the backend's head (see `wire::Fields`).
        if let Some(fields) = resp.body_mut().take_wire_fields() {
            *resp.headers_mut() = fields.into_map();
        }
        resp
    }

    /// [`Self::handle`] for a request already taken apart: its body (`None` for none)
    /// and, for an upgrade, the client side's half of it. The client-facing HTTP/1.1
    /// fast path ([`crate::front`]) calls this directly for its bodiless requests.
    ///
    /// The fast path passes the request's header fields as `fields` (see
    /// [`headers::ClientFields`]) and leaves `parts.headers` empty.
    ///
    /// An answer read inline ([`RespBody::wire_fields`]) leaves its header fields in
    /// its body, not in the response's header map: the caller writes them from there.
    pub async fn handle_parts(
        &self,
        mut parts: http::request::Parts,
        mut fields: Option<headers::ClientFields>,
        mut body: Option<Incoming>,
        client_upgrade: Option<hyper::upgrade::OnUpgrade>,
        peer: SocketAddr,
        peer_value: HeaderValue,
    ) -> Response<RespBody> {
        // Only an exchange done inline writes the fields straight from the client's head;
        // any other request gets them as a header map first.
        let inline_only =
            body.is_none() && client_upgrade.is_none() && is_idempotent(&parts.method);
        if let Some(f) = fields.take_if(|_| !inline_only) {
            parts.headers = f.to_map();
        }
        let mut fin = Pending::new(
            Finish {
                started: Instant::now(),
                method: parts.method.clone(),
                path: parts
                    .uri
                    .path_and_query()
                    .cloned()
                    .unwrap_or_else(|| PathAndQuery::from_static("/")),
                client: peer.ip(),
                status: 0,
                upstream: None,
                retries: 0,
            },
            self.rec,
        );
        // hyper bounds its read buffer, but a head that arrives in one read can slip past
        // that bound; the contract's limit is checked here exactly.
        if head_size(&parts) + fields.as_ref().map_or(0, headers::ClientFields::size)
            > MAX_HEADER_BYTES
        {
            return self.own(
                &mut fin,
                None,
                own_answer(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "request header fields too large\n",
                ),
            );
        }
        let permit = match self.shed_permit() {
            Ok(p) => p,
            Err(()) => {
                bump(&self.pool.stats.shed);
                let mut r =
                    own_answer(StatusCode::SERVICE_UNAVAILABLE, "overloaded, retry later\n");
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return self.own(&mut fin, None, r);
            }
        };
        let upgrade = client_upgrade.is_some();

        let peer_ip: IpAddr = peer.ip();
        let trusted = headers::is_trusted(&self.settings.trusted_proxies, peer_ip);
        // Host as the client sent it; HTTP/2 carries it in :authority.
        let host = match &fields {
            Some(f) => f.host(),
            None => match parts.headers.get(header::HOST) {
                Some(h) => Some(h.clone()),
                None => parts
                    .uri
                    .authority()
                    .and_then(|a| HeaderValue::from_str(a.as_str()).ok()),
            },
        };
        // The fast path's fields get this hop's rules as they are written out.
        if fields.is_none() {
            if let (None, Some(h)) = (parts.headers.get(header::HOST), &host) {
                parts.headers.insert(header::HOST, h.clone());
            }
            if parts.version == Version::HTTP_2 {
                headers::merge_cookies(&mut parts.headers);
            }
            headers::strip_hop_by_hop(&mut parts.headers, upgrade);
            headers::set_forwarded(&mut parts.headers, &peer_value, trusted, host.as_ref());
        }
        // The fast path's fields as forwarded, as a map: made only if a hashing strategy
        // needs to read its key from them.
        let mut fields_map: Option<http::HeaderMap> = None;
        // The backend pool speaks HTTP/1.1 whatever the client spoke.
        parts.version = Version::HTTP_11;
        let pq = fin.path.clone();

        let replayable = body.is_none();
        let max_attempts = if is_idempotent(&parts.method) && replayable {
            1 + self.settings.retries as usize
        } else {
            1
        };
        // Every request funds the budget; only retryable ones may draw on it.
        self.budget.deposit();
        let mut tried: Vec<u64> = Vec::new();
        let mut last_failure = None;
        // The request key of a hashing strategy, computed (once) only when the routing
        // table's strategy needs one. It is read from the headers as forwarded: the
        // client IP rule sees the same right-most untrusted entry either way, and HTTP/2
        // cookies are joined by then.
        let mut key: Option<u64> = None;

        let mut attempt = 0;
        while attempt < max_attempts {
            // The routing table is read afresh per attempt and not held across the wait
            // (arc-swap's cheap read slots are few per thread); the guard keeps the
            // backend itself alive.
            let picked = {
                let snap = self.pool.snapshot();
                if let (None, Some(source)) = (key, snap.strategy.key_source()) {
                    let headers = match &fields {
                        Some(f) => &*fields_map.get_or_insert_with(|| {
                            f.forwarded_map(&peer_value, trusted, host.as_ref())
                        }),
                        None => &parts.headers,
                    };
                    key = Some(crate::strategy::request_key(
                        source,
                        &self.settings.hash_key,
                        headers,
                        peer_ip,
                        &self.settings.trusted_proxies,
                    ));
                }
                match snap.pick(&PickCtx { tried: &tried, key }) {
                    None => Pick::Nothing,
                    // Half-open after an ejection: one request at a time goes through
                    // until one has succeeded; the others pick elsewhere.
                    Some(b) if b.half_open() => match b.claim_trial() {
                        true => Pick::Go(b.begin_request(), true),
                        false => Pick::Busy(b.id),
                    },
                    Some(b) => Pick::Go(b.begin_request(), false),
                }
            };
            let mut guard = match picked {
                Pick::Nothing => break,
                Pick::Busy(id) => {
                    tried.push(id);
                    continue;
                }
                Pick::Go(mut g, trial) => {
                    if trial {
                        g.set_trial();
                    }
                    g
                }
            };
            let backend = Arc::clone(guard.backend());
            let backend = &*backend;
            fin.backend_id = Some(backend.id);
            // Faults injected with `degrade`: the proxy itself delays, or answers 503 as
            // if the backend had; both count like the real thing.
            let mut injected_delay = Duration::ZERO;
            if let Some(faults) = backend.faults() {
                if !faults.latency.is_zero() {
                    // Boxed: rare, and it would otherwise enlarge every request's future.
                    Box::pin(tokio::time::sleep(faults.latency)).await;
                    injected_delay = faults.latency;
                }
                if faults.error_rate > 0.0 && fastrand::f64() < faults.error_rate {
                    guard.fail();
                    self.note_outcome(&mut guard, false);
                    drop(guard);
                    fin.retries = attempt as u32;
                    return self.own(
                        &mut fin,
                        Some(backend),
                        own_answer(StatusCode::SERVICE_UNAVAILABLE, "injected failure\n"),
                    );
                }
            }
            let last = attempt + 1 == max_attempts;
            let timeout = self.settings.upstream_timeout;
            // A request without a body (and not an upgrade) is exchanged inline; only
            // idempotent ones, so that a pooled connection found closed can be replaced.
            let inline = body.is_none() && client_upgrade.is_none() && is_idempotent(&parts.method);
            let (result, upload) = if inline {
                let mut head = Vec::with_capacity(256 + pq.as_str().len());
                // HTTP/1.1 needs a Host; a client that sent none (HTTP/1.0) gets the backend's.
                let authority = backend.authority.as_str();
                match &fields {
                    Some(f) => {
                        wire::write_head_with(&mut head, &parts.method, pq.as_str(), |out| {
                            f.write_forwarded(out, &peer_value, trusted, host.as_ref(), authority)
                        })
                    }
                    None => {
                        let default_host =
                            (!parts.headers.contains_key(header::HOST)).then_some(authority);
                        wire::write_head(
                            &mut head,
                            &parts.method,
                            pq.as_str(),
                            &parts.headers,
                            default_host,
                        )
                    }
                }
                let r = self
                    .upstreams
                    .send_head(backend, &head, &parts.method, timeout)
                    .await
                    .map(|(p, b, at)| (Answer::Wire(p, b), at));
                (r, None)
            } else {
                let up_req = build_upstream(&mut parts, backend, &pq, &mut body, last);
                let upload = up_req.body().upload_flag();
                // Boxed: only requests with a body or an upgrade come this way, and the
                // exchange's state would otherwise enlarge every request's future (each
                // client connection keeps one allocated).
                let r = Box::pin(self.upstreams.send(backend, up_req, timeout))
                    .await
                    .map(|(r, c, at)| (Answer::Hyper(r, c), at));
                (r, upload)
            };
            let failure = match result {
                Ok((mut answer, sent_at)) => {
                    let status = answer.status();
                    let upstream_time = sent_at.elapsed() + injected_delay;
                    backend.record_latency(upstream_time);
                    fin.status = status.as_u16();
                    fin.upstream = Some(upstream_time);
                    fin.retries = attempt as u32;
                    let failed = status.is_server_error();
                    if failed {
                        guard.fail();
                    }
                    self.note_outcome(&mut guard, !failed);
                    if let (Answer::Hyper(resp, _), Some(client_upgrade)) =
                        (&mut answer, client_upgrade)
                    {
                        if status == StatusCode::SWITCHING_PROTOCOLS {
                            fin.finish(Some(backend));
                            let upstream_upgrade = hyper::upgrade::on(&mut *resp);
                            tokio::spawn(tunnel(client_upgrade, upstream_upgrade, guard));
                            let mut r = Response::new(RespBody::empty());
                            *r.status_mut() = status;
                            *r.headers_mut() = std::mem::take(resp.headers_mut());
                            return r;
                        }
                    }
                    let mut hold = Hold {
                        guard,
                        permit,
                        conn: None,
                        upload,
                        finish: Some(fin.hand_off()),
                    };
                    let (rparts, body) = match answer {
                        Answer::Hyper(resp, conn) => {
                            let (mut rparts, rbody) = resp.into_parts();
                            headers::strip_hop_by_hop(&mut rparts.headers, false);
                            hold.conn = Some((conn, self.upstreams));
                            (rparts, RespBody::upstream(rbody, hold))
                        }
                        // Its hop-by-hop fields were left out as it was parsed.
                        Answer::Wire(rparts, wbody) => {
                            (rparts, RespBody::wire(wbody, hold, self.upstreams))
                        }
                    };
                    return Response::from_parts(rparts, body);
                }
                Err(f) => f,
            };
            if failure != Failure::ClientGone {
                guard.fail();
                self.note_outcome(&mut guard, false);
            }
            tracing::debug!(backend = %backend.name, attempt, "attempt failed");
            // Nothing of the answer has reached the client yet, so an idempotent request
            // without a body may go to another backend, while the budget allows.
            let retry = failure != Failure::ClientGone
                && attempt + 1 < max_attempts
                && self.budget.withdraw();
            last_failure = Some(failure);
            if !retry {
                break;
            }
            tried.push(backend.id);
            bump(&self.pool.stats.retries);
            attempt += 1;
        }
        fin.retries = attempt as u32;
        match last_failure {
            Some(f) => {
                // Recorded against the backend of the last attempt.
                let r = f.answer();
                fin.status = r.status().as_u16();
                fin.finish_attempted();
                r
            }
            None => {
                bump(&self.pool.stats.no_backend);
                let r = own_answer(StatusCode::SERVICE_UNAVAILABLE, "no healthy backend\n");
                self.own(&mut fin, None, r)
            }
        }
    }

    /// Records an answer of fulcrum's own and returns it.
    fn own(
        &self,
        fin: &mut Pending,
        backend: Option<&Backend>,
        r: Response<RespBody>,
    ) -> Response<RespBody> {
        fin.status = r.status().as_u16();
        fin.finish(backend);
        r
    }
}

/// A backend's answer, from hyper's client or from an inline exchange.
enum Answer {
    Hyper(Response<Incoming>, upstream::Conn),
    Wire(http::response::Parts, wire::WireBody),
}

impl Answer {
    fn status(&self) -> StatusCode {
        match self {
            Answer::Hyper(r, _) => r.status(),
            Answer::Wire(p, _) => p.status,
        }
    }
}

/// What one pick of an attempt gave.
enum Pick {
    /// A backend, its in-flight slot taken; `true` when this request is its trial.
    Go(crate::pool::RequestGuard, bool),
    /// A half-open backend whose trial request is already in flight.
    Busy(u64),
    /// Nothing eligible and untried.
    Nothing,
}

/// The request for one attempt. Only a request without a body can have several
/// attempts, so the body (when there is one) goes with the first and only attempt.
fn build_upstream(
    parts: &mut http::request::Parts,
    backend: &Backend,
    pq: &PathAndQuery,
    body: &mut Option<Incoming>,
    last: bool,
) -> Request<ReqBody> {
    // Origin form: the connection already knows which backend it goes to.
    let uri = Uri::from(pq.clone());
    let req_body = match body.take() {
        Some(inner) => ReqBody::streaming(inner),
        None => ReqBody::Empty,
    };
    let mut r = Request::new(req_body);
    *r.method_mut() = parts.method.clone();
    *r.uri_mut() = uri;
    *r.version_mut() = Version::HTTP_11;
    // The last attempt takes the headers; earlier ones (retries possible) copy them.
    *r.headers_mut() = if last {
        std::mem::take(&mut parts.headers)
    } else {
        parts.headers.clone()
    };
    // HTTP/1.1 needs a Host; a client that sent none (HTTP/1.0) gets the backend's.
    if !r.headers().contains_key(header::HOST) {
        if let Ok(h) = HeaderValue::from_str(backend.authority.as_str()) {
            r.headers_mut().insert(header::HOST, h);
        }
    }
    r
}

/// Joins an upgraded client connection with the upgraded backend connection. The
/// backend's in-flight slot is held for as long as the tunnel lives.
async fn tunnel(
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    guard: crate::pool::RequestGuard,
) {
    let (c, u) = tokio::join!(client, upstream);
    match (c, u) {
        (Ok(c), Ok(u)) => {
            let mut c = TokioIo::new(c);
            let mut u = TokioIo::new(u);
            let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
        }
        (c, u) => tracing::debug!(
            client_ok = c.is_ok(),
            upstream_ok = u.is_ok(),
            "upgrade failed"
        ),
    }
    drop(guard);
}
