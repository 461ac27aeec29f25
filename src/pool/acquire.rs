//! A request's pick of a backend for one attempt (`docs/architecture.md`, "The request
//! path"): the backend its sticky cookie names, else the strategy's candidates, each
//! accepted only with its slot (and, half-open, its trial) claimed. The pool owns the
//! rule, so the request path asks and never reaches into a snapshot itself.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Backend, Mode, Pool, QueueError, RequestGuard};
use crate::backend::AdminState;
use crate::strategy::KeySource;

/// Why no backend was acquired.
#[derive(Debug)]
pub(crate) enum NoPick {
    /// Nothing eligible and untried is left.
    Nothing,
    /// Every candidate is at its `max_conns`; the first the strategy proposed (its
    /// `queued` counts a request that waits for it).
    Full(Arc<Backend>),
}

/// What a request brings to a pick.
pub(crate) struct Ask<'a> {
    /// The value of the sticky cookie it came with (its pool is sticky).
    pub(crate) sticky: Option<u64>,
    /// Backends it tried already (a trial it could not claim is added).
    pub(crate) tried: &'a mut Vec<u64>,
    /// Its first pick (not a retry, nor a pick after a wait): the one the panic counter
    /// counts.
    pub(crate) fresh: bool,
    /// Its request key for a hashing strategy, computed once, when first needed.
    pub(crate) key: &'a mut Option<u64>,
}

/// A backend acquired for one attempt.
pub(crate) struct Acquired {
    /// The backend's in-flight slot.
    pub(crate) guard: RequestGuard,
    /// It is the backend the sticky cookie named (the answer sets no new cookie).
    pub(crate) stuck: bool,
}

/// Whether a sticky request may still go to `b`: healthy, not ejected, and active or
/// draining (draining takes no new sessions but keeps its sticky ones). A backup keeps
/// its sessions only while the backups take the traffic: once a primary is back, its
/// clients go to the primaries, as its other traffic does.
pub(crate) fn takes_sessions(b: &Backend, mode: Mode) -> bool {
    b.control.healthy()
        && !b.ejected()
        && !b.half_open()
        && matches!(b.control.state(), AdminState::Active | AdminState::Draining)
        && (!b.backup || mode == Mode::Backups)
}

impl Pool {
    /// Picks a backend for the next attempt and takes its in-flight slot. The strategy
    /// proposes, this accepts: a backend not tried by this request yet, and, for a
    /// half-open backend (after an ejection, one request at a time until one has
    /// succeeded), only with its trial claimed. `request_key` computes the request's
    /// key when the strategy hashes and none was computed yet.
    pub(crate) fn acquire(
        &self,
        ask: Ask<'_>,
        request_key: impl FnOnce(KeySource) -> u64,
    ) -> Result<Acquired, NoPick> {
        // Read afresh per attempt and not held across a wait (arc-swap's cheap read
        // slots are few per thread); the guard keeps the backend itself alive.
        let snap = self.snapshot();
        if snap.mode == Mode::Panic && ask.fresh {
            self.panic_requests.fetch_add(1, Ordering::Relaxed);
        }
        if let (Some(value), true) = (ask.sticky, ask.tried.is_empty()) {
            let stuck = (snap.backends.iter())
                .find(|b| b.sticky_value == value && takes_sessions(b, snap.mode));
            if let Some(b) = stuck {
                let Some(counted) = b.claim_slot() else {
                    return Err(NoPick::Full(Arc::clone(b)));
                };
                let guard = b.begin_after_claim(counted);
                return Ok(Acquired { guard, stuck: true });
            }
        }
        if let (None, Some(source)) = (*ask.key, snap.strategy.key_source()) {
            *ask.key = Some(request_key(source));
        }
        let tried = ask.tried;
        let (mut trial, mut counted, mut full) = (false, false, None);
        let b = snap.select(*ask.key, |b| {
            if tried.contains(&b.id) {
                return false;
            }
            // A backend at its `max_conns` is passed over (the request may queue).
            let Some(c) = b.claim_slot() else {
                full.get_or_insert_with(|| Arc::clone(b));
                return false;
            };
            trial = b.half_open();
            if trial && !b.claim_trial() {
                // Its one trial request is already in flight: this request counts it as
                // tried, so a retry does not come back to it either.
                b.unclaim_slot(c);
                tried.push(b.id);
                return false;
            }
            counted = c;
            true
        });
        let Some(b) = b else {
            return Err(full.map_or(NoPick::Nothing, NoPick::Full));
        };
        let mut guard = b.begin_after_claim(counted);
        if trial {
            guard.set_trial();
        }
        Ok(Acquired {
            guard,
            stuck: false,
        })
    }
}

/// A request's place in the queue's eyes.
pub(crate) struct Turn {
    /// The backend the strategy proposed first (its `queued` counts the request).
    pub(crate) preferred: Arc<Backend>,
    /// The queue's epoch before the pick that found every backend full.
    pub(crate) seen: u64,
    /// Its place in the queue, from its first wait on (a woken request whose slot was
    /// taken goes back to it); `None` before it waited.
    pub(crate) ticket: Option<u64>,
}

impl Pool {
    /// Waits in the queue until a slot comes free: `Ok` to pick again, with its place in
    /// the queue if it took one; `Err` when the queue is full or the wait ran out by
    /// `deadline` (set at the first wait: `queue_timeout` from then).
    pub(crate) async fn wait_turn(
        &self,
        turn: Turn,
        deadline: &mut Option<tokio::time::Instant>,
    ) -> Result<Option<u64>, QueueError> {
        let s = &self.settings;
        let until = *deadline.get_or_insert_with(|| far_after(s.queue_timeout));
        let q = &self.queue;
        let place = match turn.ticket {
            Some(t) => (t, true),
            None => (q.ticket(), false),
        };
        let (preferred, seen) = (Some(turn.preferred), turn.seen);
        // Boxed: only a request that waits pays for the wait's state.
        let wait = Box::pin(q.wait(s.max_queue, until, place, preferred, seen));
        Ok(wait.await?.then_some(place.0))
    }
}

/// Now plus `d` (durations are at most ten years: `config::values::MAX_DURATION`),
/// or now when even that cannot be added.
fn far_after(d: std::time::Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(d).unwrap_or(now)
}
