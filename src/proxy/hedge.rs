//! Hedged requests (`docs/traffic.md`, "Hedged requests"): when no answer head has come
//! after the pool's `hedge.after`, the same request goes to another backend too (at
//! most `hedge.max` more, each within `retries` and the retry budget); the first answer
//! head wins and the others are dropped at once — their connections closed, their
//! backends' in-flight slots released, their elapsed time a latency sample (a lower
//! bound, so a slow backend's estimate still rises) and neither an error nor a success.
//!
//! Only an idempotent request without a body is hedged: its head can be sent to several
//! backends at the same time. Each try goes through hyper's client (`docs/performance.md`,
//! "Hedged requests").

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::answer::ShedPermit;
use super::answer::{Answer, ProxyResponse};
use super::outgoing::{self, build_upstream, is_idempotent, Outgoing};
use super::record::Pending;
use super::retry::{Miss, Tries, Try};
use super::upstream::{inject_faults, Failure, Upstreams};
use crate::clock::Stamp;
use crate::pool::{Backend, Hedging, RequestGuard};
use crate::trace::{TryOutcome, TryParent, TrySpan};

/// A hedged try's future, boxed: only a request on a pool that hedges pays for it.
pub(super) type Hedged<'a> = Pin<Box<dyn Future<Output = Result<ProxyResponse, Miss>> + Send + 'a>>;

/// How long the try `t` of `req` waits for an answer head before a hedge goes out;
/// `None`: it is not hedged (its pool does not hedge, no other try may follow it, it
/// is not idempotent or has a body or an upgrade, or the pool's percentile is not
/// known yet).
#[inline]
pub(super) fn delay(req: &Outgoing<'_>, t: &Try) -> Option<Duration> {
    let hedging = req.pool.hedging.as_deref()?;
    let hedged = !t.final_try
        && req.body.is_none()
        && req.client_upgrade.is_none()
        && is_idempotent(&req.head.method);
    hedged.then(|| hedging.delay()).flatten()
}

/// What a race needs of the proxy.
pub(super) trait Racer: Sync {
    /// The worker's connections to the backends.
    fn upstreams(&self) -> &'static Upstreams;

    /// A backend for a hedge, not yet tried, paid for by the retry budget; counted as a
    /// try.
    fn pick_hedge(
        &self,
        req: &mut Outgoing<'_>,
        tries: &mut Tries,
        fin: &mut Pending,
    ) -> Option<RequestGuard>;

    /// A try that ended (its guard, how, whether its pick was the sticky one): the
    /// client's answer, or why it gave none (its backend charged as a plain attempt's
    /// would be).
    fn settle(
        &self,
        req: &mut Outgoing<'_>,
        end: (RequestGuard, Outcome, bool),
        held: (&mut Pending, &mut Option<ShedPermit>),
        t: Try,
    ) -> Result<ProxyResponse, Miss>;
}

/// How a try ended. Not boxed: every plain attempt makes one, on its stack.
#[allow(clippy::large_enum_variant)]
pub(super) enum Outcome {
    /// `degrade` made it fail before it was sent.
    Injected,
    /// Its answer head, or why none came; with the delay `degrade` added.
    Sent(Result<(Answer, Stamp), Failure>, Duration),
}

/// A racing try that ended: which one (0 the first), its backend slot, how.
struct Ended {
    index: usize,
    guard: RequestGuard,
    outcome: Outcome,
    /// Whether its pick was the sticky one.
    stuck: bool,
}

/// A try still racing: which one, its backend, when it went out, and its span when the
/// request is traced.
struct Racing {
    index: usize,
    backend: Arc<Backend>,
    since: Stamp,
    span: Option<TrySpan>,
}

/// The try `t` at the backend `guard` holds, hedged: `delay` without an answer head
/// sends it to another backend too, and so on up to `hedge.max`; the first answer is the
/// client's, the others are dropped.
pub(super) fn race<'a, R: Racer>(
    r: &'a R,
    req: &'a mut Outgoing<'_>,
    (guard, tries, t, delay): (RequestGuard, &'a mut Tries, Try, Duration),
    (fin, permit): (&'a mut Pending, &'a mut Option<ShedPermit>),
) -> Hedged<'a> {
    Box::pin(async move {
        let pool = Arc::clone(&req.pool);
        let Some(hedging) = pool.hedging.as_deref() else {
            return Err(Miss::Failed(Failure::Connect));
        };
        let mut spare = (hedging.max as usize).min(tries.spare());
        tries.tried.push(guard.backend().id);
        let traced = fin
            .trace
            .as_ref()
            .map(|t| (t.tries().clone(), req.head.method.clone()));
        let mut tally = Tally {
            hedging,
            racing: Vec::new(),
            launched: 0,
            over: false,
            traced,
        };
        let mut ends = FuturesUnordered::new();
        ends.push(tally.launch(r.upstreams(), req, guard, t.bound));
        let bound_of = |tries: &Tries, req: &Outgoing<'_>| tries.bound(&req.pool);
        let timer = tokio::time::sleep(delay);
        tokio::pin!(timer);
        let mut last = None;
        loop {
            tokio::select! {
                Some(end) = ends.next() => {
                    tally.ended(&end);
                    let index = end.index;
                    // A listed status is dropped only while another try may follow.
                    let t = Try { on_status: t.on_status && tries.spare() > 0, ..t };
                    let ended = (end.guard, end.outcome, end.stuck);
                    match r.settle(req, ended, (fin, permit), t) {
                        Ok(answer) => {
                            tally.end(Some(index));
                            return Ok(answer);
                        }
                        Err(miss) if ends.is_empty() => {
                            tally.end(None);
                            return Err(miss);
                        }
                        Err(miss) => last = Some(miss),
                    }
                }
                () = &mut timer, if spare > 0 => {
                    spare -= 1;
                    let Some(g) = r.pick_hedge(req, tries, fin) else {
                        spare = 0;
                        continue;
                    };
                    let bound = bound_of(tries, req);
                    ends.push(tally.launch(r.upstreams(), req, g, bound));
                    timer.as_mut().reset(tokio::time::Instant::now() + delay);
                }
                else => return Err(last.unwrap_or(Miss::Failed(Failure::Connect))),
            }
        }
    })
}

/// Sends the request to the backend `guard` holds, the fields copied (others may be sent
/// the same): a future that borrows nothing of the request, so that several race.
fn launch(
    up: &'static Upstreams,
    req: &mut Outgoing<'_>,
    guard: RequestGuard,
    (index, traceparent): (usize, Option<crate::trace::Traceparent>),
    bound: Duration,
) -> impl Future<Output = Ended> + Send + 'static {
    let backend = Arc::clone(guard.backend());
    // Through hyper's client whatever the backend: the inline exchange's future stays
    // in one place on the plain path, where it is laid out with the request's.
    outgoing::leave_inline(req);
    let mut sent = Box::new(build_upstream(req, &backend, true));
    if let Some(parent) = traceparent.and_then(|t| http::HeaderValue::from_bytes(&t).ok()) {
        sent.headers_mut()
            .insert(super::request_id::TRACEPARENT, parent);
    }
    let (origin, stuck) = (Some((req.peer.addr, req.peer.local)), req.stuck);
    async move {
        let Ok(delay) = inject_faults(&backend).await else {
            let outcome = Outcome::Injected;
            return Ended {
                index,
                guard,
                outcome,
                stuck,
            };
        };
        let result = (up.send(&backend, *sent, bound, origin).await)
            .map(|(r, c, at)| (Answer::Hyper(r, c), at))
            .map_err(|e| e.failure);
        let outcome = Outcome::Sent(result, delay);
        Ended {
            index,
            guard,
            outcome,
            stuck,
        }
    }
}

/// A race's bookkeeping: the tries still racing, how many went out (the first among
/// them), whether it is over. A race dropped before it is over (its client went away)
/// ends as one that no try won.
struct Tally<'h> {
    hedging: &'h Hedging,
    racing: Vec<Racing>,
    launched: usize,
    over: bool,
    /// What the tries' spans hang under, and the request's method, when it is traced.
    traced: Option<(TryParent, http::Method)>,
}

impl Tally<'_> {
    /// Sends the next try (see [`launch`]), with a span of its own when the request is
    /// traced.
    fn launch(
        &mut self,
        up: &'static Upstreams,
        req: &mut Outgoing<'_>,
        guard: RequestGuard,
        bound: Duration,
    ) -> impl Future<Output = Ended> + Send + 'static {
        let (span, traceparent) = match &self.traced {
            Some((parent, _)) => {
                let (span, header) = parent.begin_try();
                (Some(span), Some(header))
            }
            None => (None, None),
        };
        let index = self.launched;
        self.racing.push(Racing {
            index,
            backend: Arc::clone(guard.backend()),
            since: Stamp::now(),
            span,
        });
        self.launched += 1;
        launch(up, req, guard, (index, traceparent), bound)
    }

    /// The try `end` is no longer racing; its span says how it ended.
    fn ended(&mut self, end: &Ended) {
        let Some(at) = self.racing.iter().position(|x| x.index == end.index) else {
            return;
        };
        let racing = self.racing.swap_remove(at);
        if let (Some((parent, method)), Some(span)) = (&self.traced, racing.span) {
            let outcome = match &end.outcome {
                Outcome::Sent(Ok((answer, _)), _) => TryOutcome::Status(answer.status().as_u16()),
                Outcome::Sent(Err(f), _) => TryOutcome::Failed(f.name()),
                Outcome::Injected => TryOutcome::Failed("injected"),
            };
            parent.end_try(span, &racing.backend, method, outcome);
        }
    }

    /// The race is over, won by the try `winner` if any: the tries still racing are
    /// dropped with it (their slots released at once), their elapsed time a latency
    /// sample for their backends; each hedge is counted won when it is the winner, lost
    /// otherwise.
    fn end(&mut self, winner: Option<usize>) {
        self.over = true;
        let now = Stamp::now();
        for r in &self.racing {
            crate::strategy::record_latency_at(&r.backend, now.since(r.since), now.ns());
            if let (Some((parent, method)), Some(span)) = (&self.traced, r.span) {
                // Dropped: another try's answer won, or the client went away.
                let outcome = TryOutcome::Failed("cancelled");
                parent.end_try(span, &r.backend, method, outcome);
            }
        }
        for index in 1..self.launched {
            self.hedging.count(winner == Some(index));
        }
    }
}

impl Drop for Tally<'_> {
    fn drop(&mut self) {
        if !self.over {
            self.end(None);
        }
    }
}
