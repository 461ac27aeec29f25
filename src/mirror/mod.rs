//! A route's mirror (`docs/traffic.md`, "Mirrors"): which requests are copied to the
//! mirror pool, how many copies are on their way, what became of them and, with
//! `compare`, how the mirror's answers compare with the primary's.
//!
//! The request path asks [`Mirror::takes`] (a hash of the request id: reproducible) and
//! [`Mirror::enter`] (the `max_in_flight` bound, one atomic add); only a request that is
//! copied touches anything else. The counts and figures live in [`Counts`], which goes
//! on across a change of the routes for a route that keeps its index and conditions.

mod digest;
mod figures;
mod watched;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::config::mirror::{MirrorSpec, ALL};
use crate::pool::{Event, Pool};
pub(crate) use digest::{Digest, Ignored};
pub(crate) use figures::{Figures, Side};
pub(crate) use watched::{Pair, Report, Watched};

/// What a copy came to, as `fulcrum_mirror_requests_total` labels it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome {
    /// It went out.
    Sent,
    /// It was not sent: too many on their way, a body over the limit, an upgrade.
    Skipped,
    /// It went out, or was to, and got no answer (no backend, a refused connection, a
    /// timeout).
    Error,
}

/// A route's mirror, as the routing table holds it.
#[derive(Debug)]
pub(crate) struct Mirror {
    /// The pool the copies go to.
    pub(crate) pool: Arc<Pool>,
    /// As configured.
    pub(crate) spec: MirrorSpec,
    /// The route's index.
    pub(crate) route: usize,
    /// `ignore_json`, read.
    pub(crate) ignored: Ignored,
    counts: Arc<Counts>,
}

/// What a mirror counts, kept across a change of the routes.
#[derive(Debug, Default)]
struct Counts {
    in_flight: AtomicU32,
    sent: AtomicU64,
    skipped: AtomicU64,
    errors: AtomicU64,
    figures: Mutex<Figures>,
}

/// A copy on its way: holds its place under `max_in_flight` until dropped.
#[derive(Debug)]
pub(crate) struct Flight(Arc<Mirror>);

impl Drop for Flight {
    fn drop(&mut self) {
        self.0.counts.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Mirror {
    /// Route `route`'s mirror to `pool`, going on with `old`'s counts and figures.
    pub(crate) fn new(
        route: usize,
        spec: &MirrorSpec,
        pool: Arc<Pool>,
        old: Option<&Mirror>,
    ) -> Mirror {
        let ignored =
            (spec.compare.as_ref()).map_or_else(Ignored::default, |c| Ignored::new(&c.ignore_json));
        Mirror {
            pool,
            spec: spec.clone(),
            route,
            ignored,
            counts: old.map_or_else(Arc::default, |o| Arc::clone(&o.counts)),
        }
    }

    /// Whether the request whose id is `id` is copied: its hash falls within the share
    /// (every instance, every restart, decides the same).
    #[inline]
    pub(crate) fn takes(&self, id: &[u8]) -> bool {
        match self.spec.share {
            ALL => true,
            0 => false,
            share => crate::strategy::key::placement_hash(id) % u64::from(ALL) < u64::from(share),
        }
    }

    /// A place for one more copy, when fewer than `max_in_flight` are on their way
    /// (else the copy is counted skipped).
    pub(crate) fn enter(self: &Arc<Self>) -> Option<Flight> {
        let was = self.counts.in_flight.fetch_add(1, Ordering::Relaxed);
        let flight = Flight(Arc::clone(self));
        if was >= self.spec.max_in_flight {
            drop(flight);
            self.count(Outcome::Skipped);
            return None;
        }
        Some(flight)
    }

    /// Counts what a copy came to.
    pub(crate) fn count(&self, o: Outcome) {
        let c = match o {
            Outcome::Sent => &self.counts.sent,
            Outcome::Skipped => &self.counts.skipped,
            Outcome::Error => &self.counts.errors,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// `(sent, skipped, error)` so far.
    pub(crate) fn counts(&self) -> [u64; 3] {
        let k = &self.counts;
        [&k.sent, &k.skipped, &k.errors].map(|c| c.load(Ordering::Relaxed))
    }

    /// Counts one request both sides answered; a verdict that changes is an event.
    fn compared(&self, sides: (Side, Side), request_id: &str, path: &str) {
        let changed = self.figures().record(sides, request_id, path);
        if let Some((was, now)) = changed {
            self.pool.emit(Event::MirrorVerdict {
                route: self.route,
                verdict: now.name(),
                was: was.name(),
            });
        }
    }

    fn figures(&self) -> std::sync::MutexGuard<'_, Figures> {
        // Nothing panics while it is held; the figures stay whole even if something did.
        self.counts
            .figures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Whether answers are compared.
    pub(crate) fn compares(&self) -> bool {
        self.spec.compare.is_some()
    }

    /// Starts the counts and figures afresh (`DELETE /admin/routes/{index}/mirror`).
    pub(crate) fn reset(&self) {
        let k = &self.counts;
        for c in [&k.sent, &k.skipped, &k.errors] {
            c.store(0, Ordering::Relaxed);
        }
        *self.figures() = Figures::default();
    }

    /// As `GET /admin/routes/{index}/mirror` shows it.
    pub(crate) fn to_json(&self) -> Value {
        let [sent, skipped, errors] = self.counts();
        let mut m = serde_json::Map::new();
        m.insert("route".into(), self.route.into());
        m.insert("pool".into(), self.pool.name.to_string().into());
        m.insert("percent".into(), self.spec.percent().into());
        m.insert("compare".into(), self.compares().into());
        m.insert("mirrored".into(), sent.into());
        m.insert("skipped".into(), skipped.into());
        m.insert("mirror_errors".into(), errors.into());
        m.insert(
            "in_flight".into(),
            self.counts.in_flight.load(Ordering::Relaxed).into(),
        );
        m.extend(self.figures().to_json());
        if let Some(c) = &self.spec.compare {
            m.insert("ignored".into(), c.ignore_json.clone().into());
        }
        Value::Object(m)
    }
}
