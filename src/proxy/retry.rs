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
    /// A request without a body on a pool that lists no status: what every plain
    /// request gets, without a look at anything else.
    #[inline]
    pub(super) fn plain(req: &Outgoing<'_>) -> Again {
        Again {
            resendable: resends_method(req),
            on_status: false,
            body: None,
        }
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

/// What `req`'s tries may do again; its body is read whole first when it is to be
/// kept. `Err` when that read fails (the client's doing: its body broke off, stalled or
/// grew too large).
pub(super) async fn again(req: &mut Outgoing<'_>) -> Result<Again, Failure> {
    let settings = &req.pool.settings;
    let method = resends_method(req);
    let lists = !settings.retry_on.statuses.is_empty();
    if req.body.is_none() || req.client_upgrade.is_some() {
        let on = method && req.client_upgrade.is_none();
        return Ok(Again {
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
        return Ok(Again::default());
    }
    let Some(inner) = req.body.take() else {
        return Ok(Again::default());
    };
    let limit = settings.max_request_body;
    let read = ReqBody::streaming(inner, limit).collect();
    let body = match tokio::time::timeout(settings.upstream_timeout, read).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) if e.is::<super::body::BodyTooLarge>() => return Err(Failure::BodyTooLarge),
        Ok(Err(_)) => return Err(Failure::ClientGone),
        Err(_) => return Err(Failure::ClientStalled),
    };
    Ok(Again {
        resendable: true,
        on_status: lists,
        body: Some(body),
    })
}

/// The `retry_on` entry a failure before any answer matches.
pub(super) fn reason_of(f: Failure) -> RetryReason {
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
pub(super) fn retries_after(failure: Failure, resendable: bool, pool: &Pool) -> bool {
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
pub(super) fn try_bound(pool: &Pool, until: Option<tokio::time::Instant>) -> Duration {
    let whole = pool.settings.upstream_timeout;
    match (pool.settings.try_timeout, until) {
        (Some(t), Some(until)) => {
            t.min(until.saturating_duration_since(tokio::time::Instant::now()))
        }
        _ => whole,
    }
}

/// Notes the attempt number `attempt` at the backend `id` in the request's record; a
/// retry is counted, under the `retry_on` entry that sent it, once it has a backend to
/// go to, not when it is decided.
pub(super) fn note_attempt(
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
