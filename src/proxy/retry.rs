//! What a request's tries may do again (`docs/traffic.md`, "Retries"): a failure before
//! any answer (`connect`, `reset`, `timeout`) or an answer whose status its pool's
//! `retry_on` lists sends it to another backend, when it can be sent again — its method
//! idempotent (or `retry_non_idempotent`), its body none or kept.
//!
//! A body is kept by reading it whole before the first try, as nginx's
//! `proxy_request_buffering` does, when its stated length is within `retry_body_limit`:
//! each try then sends the same bytes. A body of unknown or larger length streams
//! through as before and is never sent twice.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;

use super::answer::Answer;
use super::body::{ClientBody, ReqBody};
use super::outgoing::{is_idempotent, Outgoing};
use super::record::Pending;
use super::upstream::Failure;
use crate::pool::{Pool, RequestGuard, RetryReason};
use http::StatusCode;

/// What the request's tries may do again.
#[derive(Debug, Default)]
pub(super) struct Again {
    /// Whether it may be sent again after its bytes left (a reset, a timeout, a
    /// listed status).
    pub(super) resendable: bool,
    /// Whether an answer of a listed status sends it to another backend.
    pub(super) on_status: bool,
    /// Its body, read whole, sent with each try.
    pub(super) body: Option<Bytes>,
}

impl Again {
    /// What `req`'s tries may do again, when finding it needs no wait: `None` when its
    /// body is to be kept, read whole first ([`Again::kept`]).
    #[inline]
    pub(super) fn now(req: &Outgoing<'_>) -> Option<Again> {
        let settings = &req.pool.settings;
        let method = resends_method(req);
        let lists = !settings.retry_on.statuses.is_empty();
        if req.body.is_none() || req.client_upgrade.is_some() {
            let on = method && req.client_upgrade.is_none();
            return Some(Again {
                resendable: on,
                on_status: on && lists,
                body: None,
            });
        }
        // The length the client stated (its `Content-Length`, which the hop's rules have
        // taken off the fields by now; an HTTP/2 or 3 stream's, when it gave one).
        let stated = req.body.as_ref().and_then(ClientBody::stated_length);
        let fits = stated.is_some_and(|n| n <= settings.retry_body_limit);
        if !(method && fits && settings.retries > 0) {
            return Some(Again::default());
        }
        None
    }

    /// What the tries of `req`, whose body is to be kept ([`Again::now`] said `None`),
    /// may do again, its body read whole. `Err` when that read fails (the client's
    /// doing: its body broke off, stalled or grew too large).
    pub(super) async fn kept(req: &mut Outgoing<'_>) -> Result<Again, Failure> {
        let settings = &req.pool.settings;
        let Some(inner) = req.body.take() else {
            return Ok(Again::default());
        };
        let read = ReqBody::streaming(inner, settings.max_request_body).collect();
        let body = match tokio::time::timeout(settings.upstream_timeout, read).await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(e)) if e.is::<super::body::BodyTooLarge>() => return Err(Failure::BodyTooLarge),
            Ok(Err(_)) => return Err(Failure::ClientGone),
            Err(_) => return Err(Failure::ClientStalled),
        };
        Ok(Again {
            resendable: true,
            on_status: !settings.retry_on.statuses.is_empty(),
            body: Some(body),
        })
    }

    /// The body for the next try (the kept one again), if it has one.
    pub(super) fn next_body(&self) -> Option<ClientBody> {
        let b = self.body.clone()?;
        let full = http_body_util::Full::new(b).map_err(|e: Infallible| match e {});
        Some(ClientBody::stream(full))
    }
}

/// Whether the request's method may be sent twice on its pool.
fn resends_method(req: &Outgoing<'_>) -> bool {
    req.pool.settings.retry_non_idempotent || is_idempotent(&req.head.method)
}

/// The `retry_on` entry a failure before any answer matches.
fn reason_of(f: Failure) -> RetryReason {
    match f {
        Failure::Connect => RetryReason::Connect,
        Failure::Timeout => RetryReason::Timeout,
        _ => RetryReason::Reset,
    }
}

/// Whether a failed try may go to another backend. Nothing of the answer has reached
/// the client yet: a request none of which left may always go (nginx and Envoy retry
/// it so); one that left, when it is resendable and its pool's `retry_on` names the
/// failure; each while the pool's retry budget allows.
fn retries_after(failure: Failure, resendable: bool, pool: &Pool) -> bool {
    let on = &pool.settings.retry_on;
    let again = match failure {
        Failure::Connect => true,
        Failure::Timeout => resendable && on.timeout,
        _ => resendable && on.reset,
    };
    again && !failure.spares_backend() && pool.budget.withdraw()
}

/// The `retry_on` entry an answer of `status` matches, when it may be sent again and
/// the budget allows: the answer is then dropped and the request tried elsewhere.
#[inline]
pub(super) fn on_status(pool: &Pool, status: http::StatusCode) -> Option<usize> {
    let i = pool.settings.retry_on.entry_for(status.as_u16())?;
    pool.budget.withdraw().then_some(i)
}

/// This try's bound on its answer head: `try_timeout`, within what is left of
/// `upstream_timeout` since the first try (`until`).
fn try_bound(pool: &Pool, until: Option<tokio::time::Instant>) -> Duration {
    let whole = pool.settings.upstream_timeout;
    match (pool.settings.try_timeout, until) {
        (Some(t), Some(until)) => {
            t.min(until.saturating_duration_since(tokio::time::Instant::now()))
        }
        _ => whole,
    }
}

/// A request's tries so far, and what the next may do.
#[derive(Debug)]
pub(super) struct Tries {
    /// The tries made before this one.
    attempt: usize,
    /// How many may be made in all: the pool's `retries`, and one.
    most: usize,
    /// The backends tried, which a retry does not go back to.
    pub(super) tried: Vec<u64>,
    /// What the last try left.
    pub(super) last: Last,
    /// The `retry_on` entry that sent the request on, after the first try.
    reason: Option<RetryReason>,
    /// When `upstream_timeout` runs out over all tries, with `try_timeout` set.
    until: Option<tokio::time::Instant>,
    again: Again,
}

impl Tries {
    /// None made yet, on `pool`.
    #[inline]
    pub(super) fn new(pool: &Pool, again: Again) -> Tries {
        let s = &pool.settings;
        Tries {
            attempt: 0,
            most: 1 + s.retries as usize,
            tried: Vec::new(),
            last: Last::Nothing,
            reason: None,
            until: (s.try_timeout).map(|_| tokio::time::Instant::now() + s.upstream_timeout),
            again,
        }
    }

    /// Whether another try may be made.
    #[inline]
    pub(super) fn left(&self) -> bool {
        self.attempt < self.most
    }

    /// The next try, at the backend `id`: noted in the request's record, the kept body
    /// set on the request again.
    #[inline]
    pub(super) fn next(&self, req: &mut Outgoing<'_>, fin: &mut Pending, id: u64) -> Try {
        note_attempt(req, fin, id, self.attempt, self.reason);
        let final_try = self.attempt + 1 == self.most;
        if self.again.body.is_some() {
            req.body = self.again.next_body();
        }
        Try {
            // The fields are moved into the exchange unless it may be sent again after
            // it left, and put back if it never did.
            keep: self.again.resendable && !final_try,
            on_status: self.again.on_status && !final_try,
            final_try,
            bound: try_bound(&req.pool, self.until),
        }
    }

    /// Whether the request goes to another backend after the try at the backend `id`
    /// missed; the miss is what the tries leave if not.
    pub(super) fn again_after(&mut self, miss: Miss, id: u64, pool: &Pool) -> bool {
        let (retry, why) = match miss {
            // The budget paid for it already.
            Miss::Status(i, status) => {
                self.last = Last::Status(status);
                (true, RetryReason::Status(i))
            }
            Miss::Failed(f) => {
                self.last = Last::Failure(f);
                let left = self.until.is_none_or(|u| tokio::time::Instant::now() < u);
                let more = self.attempt + 1 < self.most;
                let retry = more && left && retries_after(f, self.again.resendable, pool);
                (retry, reason_of(f))
            }
        };
        if retry {
            self.reason = Some(why);
            self.tried.push(id);
            self.attempt += 1;
        }
        retry
    }
}

impl Tries {
    /// Tries that may still follow the one under way (hedges among them).
    pub(super) fn spare(&self) -> usize {
        self.most.saturating_sub(self.attempt + 1)
    }

    /// The bound on the answer head of a try that starts now (a hedge's).
    pub(super) fn bound(&self, pool: &Pool) -> Duration {
        try_bound(pool, self.until)
    }

    /// A hedge goes out to the backend `id`: a try, noted in the request's record.
    pub(super) fn hedge(&mut self, fin: &mut Pending, id: u64) {
        self.attempt += 1;
        self.tried.push(id);
        fin.retries = u16::try_from(self.attempt).unwrap_or(u16::MAX);
    }
}

/// Notes the attempt number `attempt` at the backend `id` in the request's record; a
/// retry is counted, under the `retry_on` entry that sent it, once it has a backend to
/// go to, not when it is decided.
fn note_attempt(
    req: &Outgoing<'_>,
    fin: &mut Pending,
    id: u64,
    attempt: usize,
    reason: Option<RetryReason>,
) {
    fin.backend_id = Some(id);
    if let Some(reason) = reason {
        req.pool.retried.count(reason);
    }
    fin.retries = u16::try_from(attempt).unwrap_or(u16::MAX);
}

/// How one try goes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Try {
    /// The request's fields are kept for another try.
    pub(super) keep: bool,
    /// An answer `retry_on` lists is dropped and the request tried elsewhere.
    pub(super) on_status: bool,
    /// No other try may follow it.
    pub(super) final_try: bool,
    /// Its bound on the answer head.
    pub(super) bound: Duration,
}

/// Why a try gave no answer for the client.
#[derive(Debug)]
pub(super) enum Miss {
    /// It failed before any answer.
    Failed(Failure),
    /// Its answer had a status the entry at this index of `retry_on` lists; the budget
    /// paid for another try.
    Status(usize, StatusCode),
}

/// What the last try left when none is left to make.
#[derive(Debug)]
pub(super) enum Last {
    /// No try was made: no backend could be picked.
    Nothing,
    Failure(Failure),
    /// Its answer was dropped for a retry that found no backend.
    Status(StatusCode),
}

/// A try at the backend `guard` holds failed before any answer: the backend charged
/// unless the failure spares it.
#[inline]
pub(super) fn failed(guard: &mut RequestGuard, failure: Failure) -> Miss {
    tracing::debug!(backend = %guard.backend().name, ?failure, "attempt failed");
    if !failure.spares_backend() {
        guard.fail();
        guard.outcome(false);
    }
    Miss::Failed(failure)
}

/// An answer `retry_on` lists, dropped for another try: counted for its backend as
/// any answer of its status is (a 5xx a failure), its connection closed with it.
#[cold]
pub(super) fn drop_for_retry(answer: Answer, mut guard: RequestGuard, entry: usize) -> Miss {
    let status = answer.status();
    let failed = status.is_server_error();
    if failed {
        guard.fail();
    }
    guard.outcome(!failed);
    tracing::debug!(backend = %guard.backend().name, %status, "answer sent to another backend (retry_on)");
    drop(answer);
    Miss::Status(entry, status)
}
