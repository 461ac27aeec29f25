//! The request path: admit, prepare, pick, forward, stream back
//! (`docs/architecture.md`, "The request path").

mod answer;
mod body;
mod chain;
pub(crate) mod explain;
pub(crate) mod headers;
mod hedge;
pub(crate) mod hop;
pub(crate) mod message;
mod mirror;
mod outgoing;
mod placement;
mod plain_first;
pub(crate) mod record;
mod refusal;
pub(crate) mod request_id;
mod retry;
mod routed;
mod settings;
mod sticky;
mod tunnel;
mod upstream;
mod validate;
mod wire;

#[cfg(any(fuzzing, test))]
pub(crate) use validate::check as validate_head;
#[cfg(any(fuzzing, test))]
pub(crate) use wire::{fuzz_chunked, fuzz_response};

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::Either;
use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, StatusCode};
use ipnet::IpNet;

use answer::Answer;
pub(crate) use answer::{fit_head, stated_length, Hold, ProxyResponse, RespBody, ShedPermit};
pub(crate) use body::{BodyError, ClientBody};
use chain::{Chain, Ran};
use hedge::Outcome;
pub(crate) use message::{
    advertise_h3, Added, Peer, RequestFields, RequestHead, ResponseFields, ResponseHead,
};
use outgoing::{build_upstream, write_inline_head, Outgoing};
pub(crate) use plain_first::PlainFirst;
pub(crate) use record::{Finish, Pending, Recorder};
use refusal::{within_body_limit, Refusal};
use request_id::RequestId;
pub(crate) use settings::ProxySettings;
pub(crate) use tunnel::ClientUpgrade;
pub(crate) use upstream::{Failure, Upstreams};

use crate::clock::Stamp;
use crate::pool::{Ask, Backend, NoPick, QueueError, RequestGuard, Turn};
use crate::site::RoutePolicy;
use crate::site::Site;
use crate::stats::bump;

/// One worker's proxy: shared pools and routes, own upstream connections.
#[derive(Debug)]
pub(crate) struct Proxy {
    site: Arc<Site>,
    upstreams: &'static Upstreams,
    settings: ProxySettings,
    in_flight: Arc<AtomicUsize>,
    rec: &'static Recorder,
}

/// Request heads larger than this are refused with 431.
pub(crate) const MAX_HEADER_BYTES: usize = 64 * 1024;

impl Proxy {
    /// A proxy over the pools of `site`; `in_flight` (shedding) is shared by every
    /// worker.
    ///
    /// A proxy lives as long as its worker thread, which is as long as the process: its
    /// connection pool is leaked so response bodies can hand connections back to it
    /// without a reference count per request.
    pub(crate) fn new(
        site: Arc<Site>,
        settings: ProxySettings,
        in_flight: Arc<AtomicUsize>,
    ) -> Proxy {
        Proxy {
            upstreams: Box::leak(Box::new(Upstreams::new())),
            rec: Box::leak(Box::new(Recorder::new(
                Arc::clone(&site),
                settings.access_log,
            ))),
            site,
            settings,
            in_flight,
        }
    }

    /// Closes every idle upstream connection (the worker ends: their descriptors go back
    /// to the process's budget).
    pub(crate) fn close_idle(&self) {
        self.upstreams.close_idle();
    }

    /// Closes idle upstream connections past their time or to backends no longer pooled.
    pub(crate) fn sweep_idle(&self) {
        let live = self.site.routing().backend_ids();
        // An auth service (`forward_auth`) is in no pool: its idle connections age out.
        self.upstreams
            .sweep(|id| id >= chain::AUX_IDS || live.contains(&id));
    }

    /// Counts a new connection of `ip` against `max_connections_per_client`: `Err` when
    /// it must be closed at once; `Ok(None)` when there is no such limit.
    pub(crate) fn admit_client(
        &self,
        ip: std::net::IpAddr,
    ) -> Result<Option<crate::listeners::ClientSlot>, ()> {
        match &self.settings.per_client {
            None => Ok(None),
            Some(p) => p.admit(ip).map(Some).ok_or_else(|| {
                bump(&self.site.hub.stats.client_refused);
            }),
        }
    }

    /// The pools, routes and what a reload changes beside them.
    pub(crate) fn site(&self) -> &Site {
        &self.site
    }

    /// The request path's settings (timeouts, PROXY headers, passthrough names, …).
    pub(crate) fn settings(&self) -> &ProxySettings {
        &self.settings
    }

    /// The peer's trust (its forwarding fields are believed) and the request's id: a
    /// trusted peer's own `X-Request-Id`, else a new one. The caller passes both to
    /// [`Self::serve`] and puts the id on the answer (returning it from `serve` beside
    /// the answer's future, or wrapping that future, would move the whole request
    /// future once more).
    pub(crate) fn identify(&self, head: &RequestHead, peer: &Peer) -> (bool, RequestId) {
        let trusted = crate::trust::is_trusted(&self.settings.trusted_proxies, peer.addr.ip());
        let theirs = trusted
            .then(|| head.field(&request_id::X_REQUEST_ID))
            .flatten()
            .and_then(|v| RequestId::from_peer(v.as_bytes()));
        (trusted, theirs.unwrap_or_else(RequestId::random))
    }

    /// Proxies one request for a front end that answers with an `http::Response` (hyper's
    /// server, HTTP/3): [`Self::begin`], then the request id on the answer. An `async
    /// move` block, for the reason [`Self::begin`] gives.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn answer<'a>(
        &'a self,
        head: RequestHead,
        body: Option<ClientBody>,
        client_upgrade: Option<ClientUpgrade>,
        peer: &'a Peer,
    ) -> impl std::future::Future<Output = http::Response<RespBody>> + 'a {
        async move {
            let version = head.version;
            let mut id = None;
            let mut r = self.begin(head, body, client_upgrade, peer, &mut id).await;
            if let Some(id) = id {
                r.head.stamp(id, peer, version);
            }
            r.into_http()
        }
    }

    /// Begins a request: [`Self::identify`], then [`Self::serve`]'s first steps, up to
    /// the future of its answer; the request's id left in `id`, for the front end to put
    /// on the answer ([`ResponseHead::stamp`]) once it comes.
    ///
    /// No `async` around the future: the HTTP/2 front end keeps it in its stream's box
    /// as it is, and each layer of `async` would move it whole (two kilobytes) into its
    /// own state at the first poll. The id is left through `id` rather than returned
    /// beside the future, and this is inlined, so the future passes through no pair on
    /// its way to the box (a pair cost one more copy of it, 237 instructions of `memcpy`
    /// under callgrind; `docs/performance.md`, "Begun, not wrapped"). [`Self::forward`] is an `async
    /// move` block rather than an `async fn` for a like reason: an `async fn` keeps its
    /// arguments twice in its state (as given and as bound).
    #[inline(always)]
    pub(crate) fn begin<'a>(
        &'a self,
        head: RequestHead,
        body: Option<ClientBody>,
        client_upgrade: Option<ClientUpgrade>,
        peer: &'a Peer,
        id: &mut Option<RequestId>,
    ) -> impl std::future::Future<Output = ProxyResponse> + 'a {
        let who = self.identify(&head, peer);
        *id = Some(who.1.clone());
        self.serve(head, body, client_upgrade, peer, who)
    }

    /// Proxies one request: `body` is `None` when it has none, `client_upgrade` the
    /// client side's half of an upgrade. The client-facing HTTP/1.1 fast path
    /// ([`crate::front`]) calls this directly for its bodiless requests, with span
    /// fields.
    ///
    /// The steps, each its own function: admit (size, shedding), prepare (Host, hop
    /// rules, forwarded fields), then forward: pick (the strategy's candidates, the
    /// not-tried check and the trial claim), attempt (faults, exchange, respond: the
    /// hold, the body) and the retry decision. The last argument is what
    /// [`Self::identify`] found.
    ///
    /// Not an `async fn`: a refusal is answered at once, and a request that is admitted
    /// is the [`Self::forward`] future itself, one level of future less to move the
    /// answer through.
    pub(crate) fn serve<'a>(
        &'a self,
        head: RequestHead,
        body: Option<ClientBody>,
        client_upgrade: Option<ClientUpgrade>,
        peer: &'a Peer,
        (trusted, id): (bool, RequestId),
    ) -> impl std::future::Future<Output = ProxyResponse> + 'a {
        let mut fin = self.record(&head, peer, &id);
        if let (Some(first), false) = (&self.settings.plain_first, peer.tls) {
            if let Some(r) = first.answer(&head) {
                return Either::Left(std::future::ready(self.own(&mut fin, None, r)));
            }
        }
        let to = (&*self.site, self.trusted());
        let admitted = self
            .admit(&head)
            .and_then(|permit| Ok((permit, routed::route(to, &head, (peer, trusted))?)))
            .and_then(|(permit, routed)| {
                within_body_limit(&head, &routed.pool)?;
                Ok((permit, routed))
            });
        match admitted {
            Err(refusal) => {
                let r = self.own(&mut fin, None, refusal.answer());
                Either::Left(std::future::ready(r))
            }
            Ok((permit, routed)) => {
                fin.split = routed.split;
                if let Some(t) = &mut fin.trace {
                    t.route = Some(routed.index);
                    let pool = &routed.pool;
                    t.pool = Some((Arc::clone(&pool.name), pool.strategy().name()));
                }
                let via = crate::loops::element(head.version);
                let req = Outgoing {
                    target: routed.target.unwrap_or_else(|| fin.path.clone()),
                    pool: routed.pool,
                    found: chain::Found::default(),
                    head,
                    body,
                    client_upgrade,
                    host: None,
                    peer,
                    peer_trusted: trusted,
                    id,
                    via,
                    inline: false,
                    key: None,
                    sticky: None,
                    stuck: false,
                    mirror: routed.mirror,
                    traceparent: None,
                };
                Either::Right(self.forward(req, fin, permit, routed.policies))
            }
        }
    }

    /// The request's record, begun as it arrives: what its access log line, its span and
    /// its counters will say (`proxy::record`). Inlined: the record is returned by value
    /// into the request's own state.
    #[inline(always)]
    fn record(&self, head: &RequestHead, peer: &Peer, id: &RequestId) -> Pending {
        Pending::new(
            Finish {
                started: Stamp::now(),
                method: head.method.clone(),
                path: head
                    .uri
                    .path_and_query()
                    .cloned()
                    .unwrap_or_else(|| PathAndQuery::from_static("/")),
                client: peer.addr.ip(),
                version: head.version,
                status: 0,
                upstream: None,
                retries: 0,
                id: id.clone(),
                extra: (self.rec).extra(|| head.combined_fields(), peer.client_cert.as_ref()),
                split: false,
                trace: crate::trace::begin(
                    || head.first_value(&request_id::TRACEPARENT),
                    || head.first_value(&request_id::TRACESTATE),
                ),
            },
            self.rec,
        )
    }

    /// Admission: the head-size limit, the head's own rules ([`validate`]), then
    /// shedding. Returns the shedding slot, or the refusal to send.
    fn admit(&self, head: &RequestHead) -> Result<Option<ShedPermit>, Refusal> {
        // hyper bounds its read buffer, but a head that arrives in one read can slip past
        // that bound; the limit is checked here exactly.
        if head.size() > MAX_HEADER_BYTES {
            return Err(Refusal::TooLarge);
        }
        validate::check(head).map_err(Refusal::Invalid)?;
        self.shed_permit().map_err(|()| {
            bump(&self.site.hub.stats.shed);
            Refusal::Overloaded
        })
    }

    /// `Err(())` when the proxy is over `--max-inflight` and must shed this request.
    fn shed_permit(&self) -> Result<Option<ShedPermit>, ()> {
        let max = self.settings.max_inflight;
        if max == 0 {
            return Ok(None);
        }
        ShedPermit::take(&self.in_flight, max).map(Some).ok_or(())
    }

    /// Sends the request to a backend, again to another one after a failure or an
    /// answer `retry_on` lists while the rules and the budget allow, and answers with the
    /// first answer or the last failure.
    ///
    /// One future for the steps before the pool and every try: a nested one would be
    /// moved whole into this one's state on every request (`docs/performance.md`). An
    /// `async move` block, not an `async fn`, for the reason [`Self::begin`] gives.
    /// A future dropped early drops its captures in the order captured (the request
    /// before its record): the record's 499 reads nothing of the request.
    #[allow(clippy::manual_async_fn)]
    fn forward<'a>(
        &'a self,
        mut req: Outgoing<'a>,
        mut fin: Pending,
        mut permit: Option<ShedPermit>,
        route: Option<Arc<RoutePolicy>>,
    ) -> impl std::future::Future<Output = ProxyResponse> + 'a {
        async move {
            let (chain, again) = match self.before_pool(&mut req, route.as_deref(), fin.started) {
                Before::Ready(chain, again) => (chain, again),
                Before::Refused(r, step) => return self.refused(Some(step), &mut fin, *r),
                Before::Wait(wait) => match wait.await {
                    Ok(ready) => ready,
                    Err((r, step)) => return self.refused(step, &mut fin, r),
                },
            };
            let (req, fin) = (&mut req, &mut fin);
            let watch = match req.mirror.is_some() {
                true => mirror::copy(self.upstreams, req, again.body.as_ref(), self.trusted()),
                false => None,
            };
            // Every request funds its pool's budget; only retryable ones may draw on it.
            req.pool.budget.deposit();
            let mut tries = retry::Tries::new(&req.pool, again);
            // The queue's deadline, from the first wait of an attempt on; and whether this
            // request waited.
            let (mut deadline, mut ticket) = (None, None);
            while tries.left() {
                let seen = req.pool.queue.epoch();
                let fresh = tries.tried.is_empty() && ticket.is_none();
                let guard = match self.pick(req, &mut tries.tried, fresh) {
                    Ok(g) => g,
                    Err(NoPick::Nothing) => break,
                    Err(NoPick::Full(preferred)) => {
                        let turn = Turn {
                            preferred,
                            seen,
                            ticket,
                        };
                        match self.wait_turn(req, fin, turn, &mut deadline).await {
                            Ok(place) => ticket = place.or(ticket),
                            Err(r) => return r,
                        }
                        continue;
                    }
                };
                deadline = None;
                let id = guard.backend().id;
                let t = tries.next(req, fin, id);
                let tried = match hedge::delay(req, &t) {
                    None => self.attempt(req, guard, fin, &mut permit, t).await,
                    Some(delay) => {
                        let race = (guard, &mut tries, t, delay);
                        hedge::race(self, req, race, (fin, &mut permit)).await
                    }
                };
                match tried {
                    // Two paths: an answer that is not compared is not touched (moved
                    // through no match before `on_answer`).
                    Ok(r) => {
                        return match watch {
                            None => self.on_answer(req, chain, r),
                            Some(w) => {
                                let latency = fin.upstream.map(record::Latency::get);
                                self.on_answer(req, chain, (*w).primary(r, latency))
                            }
                        }
                    }
                    Err(miss) => {
                        if !tries.again_after(miss, id, &req.pool) {
                            break;
                        }
                    }
                }
            }
            mirror::watched_own(watch, self.give_up(req, fin, tries.last))
        }
    }

    /// A route's step answered the request itself: its span names the step.
    #[cold]
    fn refused(
        &self,
        step: Option<&'static str>,
        fin: &mut Pending,
        r: ProxyResponse,
    ) -> ProxyResponse {
        if let Some(t) = &mut fin.trace {
            t.answered_by = step;
        }
        self.own(fin, None, r)
    }

    /// `trusted_proxies`.
    fn trusted(&self) -> &[IpNet] {
        &self.settings.trusted_proxies
    }

    /// The route's steps before the pool (none without policies), then the request's
    /// forwarded fields set and what its tries may do again found: a body to keep is
    /// read whole first. Only a request whose step waits (a credential to verify) or
    /// whose body is kept waits, in a future of its own.
    fn before_pool<'w, 'c: 'w>(
        &'w self,
        req: &'w mut Outgoing<'_>,
        route: Option<&'c RoutePolicy>,
        now: Stamp,
    ) -> Before<'w, 'c> {
        let (chain, next) = match route {
            None => (None, None),
            Some(route) => {
                let chain = Chain::of(route);
                let from = chain.first_to_run(req.peer, req.peer_trusted);
                let ran = match from == chain.len() {
                    true => Ran::Done,
                    false => chain.run(from, &mut self.before_cx(req, route, now)),
                };
                match ran {
                    Ran::Done => (Some(chain), None),
                    Ran::Answer(r, step) => return Before::Refused(r, step),
                    Ran::Wait(next, wait) => (Some(chain), Some((route, next, wait))),
                }
            }
        };
        if next.is_none() {
            self.prepare(req, chain);
            if let Some(again) = retry::Again::now(req) {
                return Before::Ready(chain, again);
            }
        }
        Before::Wait(Box::pin(async move {
            if let (Some((route, next, wait)), Some(chain)) = (next, chain) {
                self.police_after(req, (route, chain), next, wait, now)
                    .await?;
                self.prepare(req, Some(chain));
            }
            let again = match retry::Again::now(req) {
                Some(again) => again,
                None => (retry::Again::kept(req).await).map_err(|f| (f.answer(), None))?,
            };
            Ok((chain, again))
        }))
    }

    /// The request's fields as its backend is to see them (`outgoing::prepare`).
    #[inline]
    fn prepare(&self, req: &mut Outgoing<'_>, chain: Option<&Chain>) {
        let trusted = &self.settings.trusted_proxies;
        outgoing::prepare(req, chain, self.settings.trace_context, trusted);
    }

    /// The answer when no attempt is left: the last failure's (recorded against the
    /// backend of the last attempt), or `503` when no backend could be picked at all.
    fn give_up(&self, req: &Outgoing<'_>, fin: &mut Pending, last: retry::Last) -> ProxyResponse {
        match last {
            retry::Last::Failure(f) => {
                let r = f.answer();
                fin.status = r.head.status.as_u16();
                fin.finish_attempted();
                r
            }
            // An answer sent elsewhere, and no backend left to try: its status, in
            // fulcrum's words.
            retry::Last::Status(status) => {
                let text = format!("{status}: every backend tried answered so\n");
                let r = ProxyResponse::new(
                    status,
                    Default::default(),
                    RespBody::full(bytes::Bytes::from(text)),
                );
                fin.status = status.as_u16();
                fin.finish_attempted();
                r
            }
            retry::Last::Nothing => {
                bump(&req.pool.hub.stats.no_backend);
                let r = ProxyResponse::own(StatusCode::SERVICE_UNAVAILABLE, "no healthy backend\n");
                self.own(fin, None, r)
            }
        }
    }

    /// A backend's answer, through the route's steps after the pool.
    fn on_answer(
        &self,
        req: &Outgoing<'_>,
        chain: Option<&Chain>,
        mut r: ProxyResponse,
    ) -> ProxyResponse {
        let Some(chain) = chain.filter(|c| c.edits_answer(&req.found)) else {
            return r;
        };
        let cx = chain::After {
            found: &req.found,
            peer: req.peer,
            id: &req.id,
            host: req.host.as_ref(),
        };
        chain.after(&cx, &mut r);
        r
    }

    /// A request as the route's steps before the pool see it (`docs/policies.md`).
    fn before_cx<'r>(
        &'r self,
        req: &'r mut Outgoing<'_>,
        route: &'r RoutePolicy,
        now: Stamp,
    ) -> chain::Before<'r> {
        chain::Before {
            head: &mut req.head,
            upstreams: self.upstreams,
            peer: req.peer,
            peer_trusted: req.peer_trusted,
            trusted_proxies: &self.settings.trusted_proxies,
            now,
            route,
            found: &mut req.found,
        }
    }

    /// The route's steps before the pool from the one that waits on: `wait`, then the
    /// steps from `next` on, each wait in turn. `Err` with the answer that ends the
    /// request here.
    async fn police_after(
        &self,
        req: &mut Outgoing<'_>,
        (route, chain): (&RoutePolicy, &Chain),
        mut next: usize,
        mut wait: Box<chain::Waiting<'_>>,
        now: Stamp,
    ) -> Result<(), (ProxyResponse, Option<&'static str>)> {
        loop {
            let mut cx = self.before_cx(req, route, now);
            // The step that waited answers, if its wait ends in an answer.
            let grant = (&mut *wait).await;
            cx.grant(grant.map_err(|r| (r, chain.step_name(next - 1)))?);
            match chain.run(next, &mut cx) {
                Ran::Done => return Ok(()),
                Ran::Answer(r, step) => return Err((*r, Some(step))),
                Ran::Wait(n, w) => (next, wait) = (n, w),
            }
        }
    }

    /// Waits in the pool's queue until a slot comes free (`Ok`: pick again, with its
    /// place in the queue if it took one), or answers 503 with `Retry-After: 1`: the
    /// queue is full, or the wait ran out.
    async fn wait_turn(
        &self,
        req: &Outgoing<'_>,
        fin: &mut Pending,
        turn: Turn,
        deadline: &mut Option<tokio::time::Instant>,
    ) -> Result<Option<u64>, ProxyResponse> {
        let text = match req.pool.wait_turn(turn, deadline).await {
            Ok(place) => return Ok(place),
            Err(QueueError::Full) => "queue full, retry later\n",
            Err(QueueError::Timeout) => "queue timeout\n",
        };
        let r = ProxyResponse::own(StatusCode::SERVICE_UNAVAILABLE, text)
            .with_field(header::RETRY_AFTER, HeaderValue::from_static("1"));
        Err(self.own(fin, None, r))
    }

    /// A backend for the next attempt, its in-flight slot taken (`Pool::acquire`);
    /// `fresh`: the request's first pick.
    fn pick(
        &self,
        req: &mut Outgoing<'_>,
        tried: &mut Vec<u64>,
        fresh: bool,
    ) -> Result<RequestGuard, NoPick> {
        let mut key = req.key;
        let ask = Ask {
            sticky: req.sticky,
            tried,
            fresh,
            key: &mut key,
        };
        let got = (req.pool).acquire(ask, |source| self.request_key(req, source));
        req.key = key;
        let got = got?;
        // The strategy's pick gets a cookie for the backend it picks.
        req.stuck = got.stuck;
        Ok(got.guard)
    }

    /// The request key of a hashing strategy, read from the fields as forwarded: the
    /// client IP rule sees the same right-most untrusted entry either way, and HTTP/2
    /// cookies are joined by then. Span fields are made into a map for it.
    fn request_key(&self, req: &Outgoing<'_>, source: crate::strategy::KeySource) -> u64 {
        let forwarded;
        let fields = match &req.head.fields {
            RequestFields::Map(m) => m,
            RequestFields::Spans(f) => {
                forwarded = f.forwarded_map(req.hop());
                &forwarded
            }
        };
        crate::strategy::request_key(
            source,
            &req.pool.settings.hash_key,
            fields,
            req.peer.addr.ip(),
            &self.settings.trusted_proxies,
        )
    }

    /// One attempt at the backend `guard` holds a slot of: faults injected with
    /// `degrade`, the exchange, and on an answer the response for the client; on a
    /// failure another backend may be tried.
    async fn attempt(
        &self,
        req: &mut Outgoing<'_>,
        mut guard: RequestGuard,
        fin: &mut Pending,
        permit: &mut Option<ShedPermit>,
        t: retry::Try,
    ) -> Result<ProxyResponse, retry::Miss> {
        let backend = Arc::clone(guard.backend());
        let Ok(injected_delay) = upstream::inject_faults(&backend).await else {
            return Ok(self.injected(guard, fin));
        };
        if let Some(trace) = &mut fin.trace {
            outgoing::set_traceparent(req, trace.begin_current());
        }
        let (result, upload) = self.exchange(req, &backend, t).await;
        let end_try = |fin: &mut Pending, method: &http::Method, outcome| {
            if let Some(trace) = &mut fin.trace {
                trace.end_current(&backend, method, outcome);
            }
        };
        // Ended before the answer is taken apart: ended between, the answer would be
        // copied once more on every request, traced or not.
        if let (Some(_), Ok((answer, _))) = (&fin.trace, &result) {
            let status = crate::trace::TryOutcome::Status(answer.status().as_u16());
            end_try(fin, &req.head.method, status);
        }
        match result {
            Ok((answer, sent_at)) => {
                let head = (answer, sent_at, injected_delay);
                self.on_head(req, guard, (fin, permit), t, (head, upload))
            }
            Err(failure) => {
                // A timeout while the upload waits on the client is the client's: the
                // backend cannot answer a request it has not been given whole. A
                // backend that stopped taking the body is still charged.
                let stalled = upload.as_ref().is_some_and(|u| u.stalled_on_client());
                let too_large = upload.as_ref().is_some_and(|u| u.too_large());
                let failure = match failure {
                    _ if too_large => Failure::BodyTooLarge,
                    Failure::Timeout if stalled => Failure::ClientStalled,
                    f => f,
                };
                end_try(
                    fin,
                    &req.head.method,
                    crate::trace::TryOutcome::Failed(failure.name()),
                );
                Err(retry::failed(&mut guard, failure))
            }
        }
    }

    /// A failure `degrade` injected at the backend `guard` holds: `503`, counted like
    /// the real thing.
    #[cold]
    fn injected(&self, mut guard: RequestGuard, fin: &mut Pending) -> ProxyResponse {
        guard.fail();
        guard.outcome(false);
        let backend = Arc::clone(guard.backend());
        drop(guard);
        let r = ProxyResponse::own(StatusCode::SERVICE_UNAVAILABLE, "injected failure\n");
        self.own(fin, Some(&backend), r)
    }

    /// An answer head from the backend `guard` holds, sent at `sent_at` after `degrade`'s
    /// delay: its latency noted, then the response for the client, unless `retry_on`
    /// lists its status.
    #[inline(always)]
    fn on_head(
        &self,
        req: &mut Outgoing<'_>,
        guard: RequestGuard,
        (fin, permit): (&mut Pending, &mut Option<ShedPermit>),
        t: retry::Try,
        ((answer, sent_at, injected_delay), upload): (
            (Answer, Stamp, Duration),
            Option<Arc<body::Upload>>,
        ),
    ) -> Result<ProxyResponse, retry::Miss> {
        // One clock read for the sample and its time stamp.
        let now = Stamp::now();
        let upstream_time = now.since(sent_at) + injected_delay;
        crate::strategy::record_latency_at(guard.backend(), upstream_time, now.ns());
        if let Some(h) = &req.pool.hedging {
            h.sample(upstream_time);
        }
        fin.upstream = Some(upstream_time.into());
        if t.on_status {
            if let Some(i) = retry::on_status(&req.pool, answer.status()) {
                return Err(retry::drop_for_retry(answer, guard, i));
            }
        }
        Ok(self.respond(req, answer, guard, fin, permit.take(), upload))
    }

    /// Sends the request to `backend` and waits for the answer's head: inline for a
    /// request without a body, through hyper's client otherwise. Also returns the flag
    /// that tells when an upload has been sent whole.
    async fn exchange(
        &self,
        req: &mut Outgoing<'_>,
        backend: &Backend,
        t: retry::Try,
    ) -> (Result<(Answer, Stamp), Failure>, Option<Arc<body::Upload>>) {
        let (timeout, keep) = (t.bound, t.keep);
        outgoing::fit_to(req, backend);
        if req.inline {
            // Room for what this hop adds (`Via`, `X-Forwarded-*`, `X-Request-Id`,
            // `traceparent`) without growing.
            let target = req.target.as_str();
            let mut out = Vec::with_capacity(256 + req.head.fields.wire_len(target));
            write_inline_head(&mut out, req, backend.authority.as_str());
            let r = self
                .upstreams
                .send_head(backend, &out, &req.head.method, timeout)
                .await
                .map(|(h, b, at)| (Answer::Wire(h, b), at));
            return (r, None);
        }
        let up_req = build_upstream(req, backend, keep);
        let upload = up_req.body().upload();
        // Boxed: only requests with a body or an upgrade come this way, and the
        // exchange's state would otherwise enlarge every request's future (each client
        // connection keeps one allocated).
        let origin = Some((req.peer.addr, req.peer.local));
        let sending = self.upstreams.send(backend, up_req, timeout, origin);
        let r = match Box::pin(sending).await {
            Ok((r, c, at)) => Ok((Answer::Hyper(r, c), at)),
            Err(e) => {
                if let Some(unsent) = e.unsent {
                    req.restore(unsent);
                }
                Err(e.failure)
            }
        };
        (r, upload)
    }

    /// The client's answer from a backend's: the outcome counted, an upgrade joined, or
    /// the body wrapped with everything that keeps the request accounted for (`Hold`)
    /// until it has been read whole.
    fn respond(
        &self,
        req: &mut Outgoing<'_>,
        mut answer: Answer,
        mut guard: RequestGuard,
        fin: &mut Pending,
        permit: Option<ShedPermit>,
        upload: Option<Arc<body::Upload>>,
    ) -> ProxyResponse {
        let status = answer.status();
        fin.status = status.as_u16();
        if let Some(c) = fin.combined_mut() {
            // A compressed answer's length is not known here: `-`, as for a stream.
            let compresses = req.found.coding.is_some();
            // No body: a HEAD's answer, a 204, a 304.
            let bodiless = req.head.method == Method::HEAD
                || matches!(status.as_u16(), 204 | 304)
                || status.is_informational();
            c.bytes = answer.stated_length().filter(|_| !compresses && !bodiless);
        }
        let failed = status.is_server_error();
        if failed {
            guard.fail();
        }
        guard.outcome(!failed);
        if let (Some(fields), Some(client_upgrade)) = (answer.map(), req.client_upgrade.take()) {
            let allowed = &self.settings.upgrade_protocols;
            if status == StatusCode::SWITCHING_PROTOCOLS
                && !headers::switches_to_allowed(fields, allowed)
            {
                // A tunnel to another protocol than the one asked for is not opened.
                tracing::warn!(backend = %guard.backend().name, "the backend switched to a protocol upgrade_protocols does not name; answered 502");
                let r = ProxyResponse::own(StatusCode::BAD_GATEWAY, "bad gateway\n");
                return self.own(fin, Some(guard.backend()), r);
            }
            if status == StatusCode::SWITCHING_PROTOCOLS {
                answer = match answer.into_upgrade() {
                    Ok((upstream_upgrade, fields, fd)) => {
                        fin.finish(Some(guard.backend()));
                        let held = (guard, fd);
                        tokio::spawn(tunnel::tunnel(client_upgrade, upstream_upgrade, held));
                        return ProxyResponse::new(status, fields, RespBody::empty());
                    }
                    Err(inline) => *inline,
                };
            }
        }
        let set_cookie = match req.stuck {
            false => sticky::set_cookie(&req.pool.settings.sticky, guard.backend().sticky_value),
            true => None,
        };
        let hold = Hold {
            guard,
            _permit: permit,
            conn: None,
            upload,
            finish: Some(fin.hand_off()),
        };
        let mut r = answer.into_response(hold, self.upstreams);
        if let Some(c) = set_cookie {
            r.head.append_field(header::SET_COOKIE, c);
        }
        r
    }

    /// Records an answer of fulcrum's own and returns it.
    fn own(&self, fin: &mut Pending, backend: Option<&Backend>, r: ProxyResponse) -> ProxyResponse {
        fin.status = r.head.status.as_u16();
        if let Some(c) = fin.combined_mut() {
            c.bytes = http_body::Body::size_hint(&r.body).exact();
        }
        fin.finish(backend);
        r
    }
}

impl hedge::Racer for Proxy {
    fn upstreams(&self) -> &'static Upstreams {
        self.upstreams
    }

    fn pick_hedge(
        &self,
        req: &mut Outgoing<'_>,
        tries: &mut retry::Tries,
        fin: &mut Pending,
    ) -> Option<RequestGuard> {
        // Picked first: the budget pays only for a hedge that goes out (a guard
        // dropped here frees its slot and any trial).
        let guard = self.pick(req, &mut tries.tried, false).ok()?;
        if !req.pool.budget.withdraw() {
            return None;
        }
        tries.hedge(fin, guard.backend().id);
        Some(guard)
    }

    fn settle(
        &self,
        req: &mut Outgoing<'_>,
        (mut guard, outcome, stuck): (RequestGuard, Outcome, bool),
        held: (&mut Pending, &mut Option<ShedPermit>),
        t: retry::Try,
    ) -> Result<ProxyResponse, retry::Miss> {
        held.0.backend_id = Some(guard.backend().id);
        // Whether this try's pick was the sticky one (a later pick changed it).
        req.stuck = stuck;
        match outcome {
            Outcome::Injected => Ok(self.injected(guard, held.0)),
            Outcome::Sent(Ok((answer, sent_at)), delay) => {
                self.on_head(req, guard, held, t, ((answer, sent_at, delay), None))
            }
            Outcome::Sent(Err(failure), _) => Err(retry::failed(&mut guard, failure)),
        }
    }
}

/// What the steps before the pool leave ([`Proxy::before_pool`]).
enum Before<'w, 'c> {
    /// The request goes on to the pool: the route's steps, and what its tries may do
    /// again.
    Ready(Option<&'c Chain>, retry::Again),
    /// A step answered it (the step named).
    Refused(Box<ProxyResponse>, &'static str),
    /// A step waits, or its body is read whole first: the same, once that is done.
    Wait(std::pin::Pin<Box<dyn std::future::Future<Output = Readied<'c>> + Send + 'w>>),
}

/// What a wait before the pool ends in: [`Before::Ready`]'s fields, or the answer (and
/// the step that gave it, if one did).
type Readied<'c> = Result<(Option<&'c Chain>, retry::Again), (ProxyResponse, Option<&'static str>)>;
