//! A backend and the live numbers it keeps about itself, each concern in a module of its
//! own: [`capacity`] (its connection limit and requests in flight), [`latency`] (its
//! average and the strategies' estimates), [`outlier`] (passive outlier detection),
//! [`ramp`] (slow start), [`faults`] (injected faults), [`queue`] (its pool's
//! waiting requests, which a freed slot wakes), [`report`] (the load it reports) and
//! [`observe`] (the fields of its answers meant for fulcrum, the load report among them).
//!
//! The backend is the vocabulary the pool, the strategies and the request path share,
//! and it depends on none of them: what a strategy keeps on it is opaque to it (the
//! latency estimates' cells, and the hook that must hear of every change of its load,
//! [`LoadWatch`]). A new strategy is written in `strategy/` only.

mod capacity;
mod control;
mod faults;
mod gradient;
mod latency;
pub(crate) mod observe;
pub(crate) mod outlier;
pub(crate) mod queue;
mod ramp;
pub mod report;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use http::uri::Authority;
use tokio::sync::Notify;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::config::BackendSpec;
use capacity::Capacity;
pub(crate) use control::{pin, AdminState, Control, Source};
use faults::FaultCells;
pub(crate) use faults::Faults;
pub use latency::clock_ns;
pub(crate) use latency::{Estimates, Latency, ESTIMATE_CELLS};
pub(crate) use outlier::{Outlier, OutlierAction};
pub(crate) use queue::{Queue, QueueError};
use ramp::Ramp;

/// The bounds of an adaptive limit outside a pool (`max_conns_auto`'s default).
const DEFAULT_AUTO_BOUNDS: (u32, u32) = (1, 1000);

/// The value of the sticky cookie (`docs/operations.md`, "Sticky sessions") of the
/// backend at `url` in the pool `pool`: XXH3-64 of the URL seeded with the hash of the
/// pool's name. It tells nothing of the address, and every fulcrum with the same pool
/// gives the same backend the same value.
pub(crate) fn sticky_value(pool: &str, url: &str) -> u64 {
    xxh3_64_with_seed(url.as_bytes(), xxh3_64(pool.as_bytes()))
}

/// What a strategy keeps per backend that must hear of every change of the backend's
/// load or latency (the leaf of a least-loaded index, `strategy::load_index`). Opaque to
/// the backend.
pub(crate) trait LoadWatch: Send + Sync + std::fmt::Debug {
    /// The backend's load or latency changed.
    fn refresh(&self, b: &Backend);
}

/// What a backend shares with its pool: the queue a freed slot wakes, and the doorbell
/// its outlier news rings for the pool's control side.
#[derive(Debug, Clone)]
pub(crate) struct PoolLink {
    /// The pool's waiting requests.
    pub(crate) queue: Arc<Queue>,
    /// Rung when a backend of the pool has news for the control side
    /// ([`Outlier::take_news`]).
    pub(crate) news: Arc<Notify>,
}

impl PoolLink {
    /// An empty queue and a doorbell nobody has rung.
    pub(crate) fn new() -> PoolLink {
        PoolLink {
            queue: Arc::new(Queue::default()),
            news: Arc::new(Notify::new()),
        }
    }
}

/// One upstream server. Shared (`Arc`) by the pool, every snapshot and every request
/// guard, so a backend removed from the pool lives until its last request ends.
#[derive(Debug)]
pub struct Backend {
    /// Id, unique across every pool and never reused.
    pub(crate) id: u64,
    /// Display name (unique within its pool).
    pub(crate) name: String,
    /// The name of the pool it belongs to.
    pub(crate) pool: Arc<str>,
    /// The URL exactly as configured.
    pub(crate) url: String,
    /// `host:port` to connect to.
    pub(crate) authority: Authority,
    /// The address itself when the host is an IP literal (no resolution per connect).
    pub(crate) socket_addr: Option<std::net::SocketAddr>,
    /// TLS or not (the URL's scheme) and the HTTP version (the pool's `protocol`).
    pub(crate) transport: crate::transport::Transport,
    /// Bound on a TCP connect to it (its pool's `connect_timeout`).
    pub(crate) connect_timeout: Duration,
    /// Picked only while no other backend of its pool is eligible.
    pub(crate) backup: bool,
    /// Its sticky cookie's value in its pool ([`sticky_value`]).
    pub(crate) sticky_value: u64,
    /// What the operator and the health checks decide about it.
    pub(crate) control: Control,
    /// What it shares with its pool (set once, before it serves).
    link: OnceLock<PoolLink>,
    /// What the request path counts and measures on it.
    pub(crate) live: Live,
    /// What the current strategy keeps on it.
    strategy: StrategyCells,
    /// Set for a backend fulcrum started itself (`POST /admin/backends/spawn`).
    pub(crate) spawn: Option<SpawnInfo>,
}

/// The hot half of a backend: what every request through it counts and measures. Its
/// identity and configuration above it never change once it is shared.
#[derive(Debug)]
pub(crate) struct Live {
    /// Its limit and requests in flight.
    capacity: Capacity,
    requests: AtomicU64,
    errors: AtomicU64,
    /// Its latency average and the strategies' estimates.
    latency: Latency,
    /// Passive outlier detection.
    pub(crate) outlier: Outlier,
    /// Slow start.
    ramp: Ramp,
    /// Injected faults.
    faults: FaultCells,
    /// The load it reports in its answers.
    reports: report::LoadReports,
    /// What the metrics endpoint reads.
    pub(crate) stats: crate::stats::BackendStats,
}

/// What a strategy keeps on a backend that must hear of every change of its load
/// ([`LoadWatch`]). It belongs to the strategy and is opaque here; it sits on the
/// backend so that a request reaches it without a lookup (Envoy keeps its load
/// balancers' per-host data on the host the same way).
#[derive(Debug, Default)]
struct StrategyCells {
    /// Whether `load_watch` is set: one plain load on the request path decides whether
    /// there is an index to keep up to date at all.
    indexed: AtomicBool,
    /// The current strategy's hook for load changes, if it has one.
    load_watch: ArcSwapOption<Box<dyn LoadWatch>>,
}

/// The process behind a spawned backend.
#[derive(Debug)]
pub(crate) struct SpawnInfo {
    /// Its port on 127.0.0.1.
    pub(crate) port: u16,
    /// The demo backend's latency, kept for a revive.
    pub(crate) latency_ms: u64,
    /// Its process id while it runs, 0 when it does not.
    pid: AtomicU32,
}

impl SpawnInfo {
    /// A spawned backend on `port` whose process is `pid` (0: none yet).
    pub(crate) fn new(port: u16, latency_ms: u64, pid: u32) -> SpawnInfo {
        SpawnInfo {
            port,
            latency_ms,
            pid: AtomicU32::new(pid),
        }
    }

    /// The running process, if any.
    pub(crate) fn pid(&self) -> Option<u32> {
        match self.pid.load(Ordering::Acquire) {
            0 => None,
            p => Some(p),
        }
    }

    /// Notes the process now running.
    pub(crate) fn set_pid(&self, pid: u32) {
        self.pid.store(pid, Ordering::Release);
    }

    /// Notes that process `pid` has ended (a no-op when another one runs by now).
    pub(crate) fn clear_pid(&self, pid: u32) {
        let _ = self
            .pid
            .compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
}

impl Backend {
    /// A backend that starts healthy, active and unsampled.
    pub fn new(id: u64, spec: BackendSpec, alpha: f64) -> Backend {
        Backend {
            // Plain until `in_pool` gives it its pool's way in (a default TLS client
            // built here would read the system roots for a pool that has its own).
            transport: crate::transport::Transport::default(),
            id,
            name: spec.name,
            pool: Arc::from(crate::config::DEFAULT_POOL),
            connect_timeout: Duration::from_secs(3),
            backup: spec.backup,
            sticky_value: sticky_value(crate::config::DEFAULT_POOL, &spec.url),
            url: spec.url,
            socket_addr: spec.addr.or_else(|| spec.authority.as_str().parse().ok()),
            authority: spec.authority,
            control: Control::new(spec.weight),
            link: OnceLock::new(),
            live: Live {
                capacity: Capacity::new(spec.max_conns, DEFAULT_AUTO_BOUNDS),
                requests: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                latency: Latency::new(alpha),
                outlier: Outlier::new(outlier::DEFAULTS),
                ramp: Ramp::new(Duration::ZERO),
                faults: FaultCells::default(),
                reports: report::LoadReports::default(),
                stats: Default::default(),
            },
            strategy: StrategyCells::default(),
            spawn: None,
        }
    }

    /// Marks it as spawned by fulcrum (before the backend is shared).
    pub(crate) fn with_spawn(mut self, spawn: Option<SpawnInfo>) -> Backend {
        self.spawn = spawn;
        self
    }

    /// Places it in the pool `name`, whose connect bound, passive checks and slow start
    /// it takes, and links it to the pool's queue and doorbell (before the backend is
    /// shared).
    pub(crate) fn in_pool(
        mut self,
        name: Arc<str>,
        settings: &crate::config::PoolSettings,
        link: &PoolLink,
    ) -> Backend {
        self.sticky_value = sticky_value(&name, &self.url);
        self.pool = name;
        self.connect_timeout = settings.connect_timeout;
        self.live.outlier = Outlier::new(settings.outlier);
        self.live.ramp = Ramp::new(settings.slow_start);
        // Its own `max_conns`, else its pool's; an adaptive one within the pool's bounds.
        let own = self.live.capacity.configured();
        let limit = if own == 0 { settings.max_conns } else { own };
        self.live.capacity = Capacity::new(limit, settings.max_conns_auto);
        self.transport = crate::transport::Transport::new(
            is_https(&self.url),
            self.authority.host(),
            &settings.transport,
        );
        let _ = self.link.set(link.clone());
        self
    }

    /// Sets `--slow-start` (before the backend is shared).
    #[cfg(test)]
    pub(crate) fn with_slow_start(mut self, d: Duration) -> Backend {
        self.live.ramp = Ramp::new(d);
        self
    }

    /// Starts a weight ramp (the backend joined or recovered); no-op without slow start.
    pub(crate) fn start_ramp(&self, now: Instant) {
        self.live.ramp.start(now);
    }

    /// The weight the weighted strategies use now (slow start applied).
    pub(crate) fn effective_weight(&self) -> f64 {
        let w = self.control.weight() as f64;
        match self.live.ramp.share(Instant::now()) {
            Some(share) => w * share,
            None => w,
        }
    }

    /// The share of its full traffic a backend has now: its ramp's share while slow start
    /// ramps it, else 1. The pickers of the strategies without weights read it.
    pub(crate) fn ramp_fraction(&self) -> f64 {
        self.live.ramp.share(Instant::now()).unwrap_or(1.0)
    }

    /// Ends a ramp whose time is up; returns whether a ramp was running before the call.
    pub(crate) fn ramp_step(&self, now: Instant) -> bool {
        self.live.ramp.step(now)
    }

    /// Takes what the admin API set on `old`, which this backend replaces (before it is
    /// shared).
    pub(crate) fn keep_pins_of(&self, old: &Backend) {
        if old.control.pinned(pin::WEIGHT) {
            self.control.set_weight(old.control.weight());
            self.control.pin(pin::WEIGHT);
        }
        if old.control.pinned(pin::MAX_CONNS) {
            self.set_max_conns(old.configured_max_conns());
            self.control.pin(pin::MAX_CONNS);
        }
    }

    /// Whether the backend is half-open (an ejection ended, no trial has passed yet).
    #[inline]
    pub(crate) fn half_open(&self) -> bool {
        self.live.outlier.half_open()
    }

    /// Claims the single trial request of a half-open backend; `false` when another
    /// request already has it.
    pub(crate) fn claim_trial(&self) -> bool {
        self.live.outlier.claim_trial()
    }

    /// Ends an ejection whose time is up: the backend turns half-open and starts its
    /// ramp. Returns whether it did. Control side only.
    pub(crate) fn end_ejection_if_due(&self, now: Instant) -> bool {
        let ended = self.live.outlier.end_if_due(now);
        if ended {
            self.live.ramp.start(now);
        }
        ended
    }

    /// Ends an ejection at once (the backend came back through the health checks): it
    /// turns half-open like at the end of its time. Control side only.
    pub(crate) fn end_ejection_now(&self) -> bool {
        let ended = self.live.outlier.end_now();
        if ended {
            self.live.ramp.start(Instant::now());
        }
        ended
    }

    /// Ejected by passive outlier detection.
    #[inline]
    pub(crate) fn ejected(&self) -> bool {
        self.live.outlier.ejected()
    }

    /// The injected faults, `None` when there are none (the common case: two loads).
    #[inline]
    pub(crate) fn faults(&self) -> Option<Faults> {
        self.live.faults.get()
    }

    /// Sets injected faults; `None` leaves that one as it is.
    pub(crate) fn degrade(&self, latency_ms: Option<u32>, error_rate: Option<f64>) {
        self.live.faults.set(latency_ms, error_rate);
    }

    /// Clears injected faults and the latency average.
    pub(crate) fn recover(&self) {
        self.live.faults.clear();
        self.clear_latency();
    }

    /// Keeps the load report of one of its answers (the value of its
    /// `endpoint-load-metrics` field).
    pub(crate) fn note_load_report(&self, value: &[u8]) {
        self.live.reports.note(value, clock_ns());
    }

    /// Its latest load report, when it is fresh at `now` ([`clock_ns`] time).
    pub(crate) fn load_report(&self, now: u64) -> Option<report::Report> {
        self.live.reports.fresh(now)
    }

    /// Load reports it sent that could not be read.
    pub(crate) fn malformed_reports(&self) -> u64 {
        self.live.reports.malformed()
    }

    /// Whether a strategy may pick it: healthy, not ejected, active.
    pub(crate) fn eligible(&self) -> bool {
        self.control.healthy() && !self.ejected() && self.control.state() == AdminState::Active
    }

    /// Requests in flight.
    #[inline]
    pub(crate) fn in_flight(&self) -> u64 {
        self.live.capacity.in_flight()
    }

    /// Requests waiting in its pool's queue that the strategy would have sent here.
    pub(crate) fn queued(&self) -> &AtomicU64 {
        &self.live.capacity.queued
    }

    /// Requests sent to it.
    pub(crate) fn requests(&self) -> u64 {
        self.live.requests.load(Ordering::Relaxed)
    }

    /// Requests that failed or answered 5xx.
    pub(crate) fn errors(&self) -> u64 {
        self.live.errors.load(Ordering::Relaxed)
    }

    /// Latency average, `None` until the first sample.
    pub(crate) fn avg_latency(&self) -> Option<Duration> {
        self.live.latency.average()
    }

    /// The strategies' latency estimates.
    #[inline]
    pub(crate) fn estimates(&self) -> &Estimates {
        &self.live.latency.estimates
    }

    /// Folds one latency sample into the backend's average and notes its time; returns
    /// the time since the sample before it (`None` for the first). The strategies' own
    /// estimates are folded by `strategy::record_latency`, which calls this. Lock-free.
    pub(crate) fn note_latency(&self, sample: Duration, now: u64) -> Option<u64> {
        if self.live.capacity.adaptive() {
            self.live.capacity.sample(sample);
        }
        self.live.latency.note(sample, now)
    }

    /// The EWMA weight of a new sample (`--ewma-alpha`).
    pub(crate) fn alpha(&self) -> f64 {
        self.live.latency.alpha()
    }

    /// Forgets every latency estimate (recovery, or back to healthy).
    pub(crate) fn clear_latency(&self) {
        self.live.latency.clear();
        self.refresh_index();
    }

    /// [`clock_ns`] of the last latency sample, `None` before the first.
    #[inline]
    pub(crate) fn sampled_at(&self) -> Option<u64> {
        self.live.latency.sampled_at()
    }

    /// Points it at the current strategy's hook for load changes, or at none. Control
    /// path only (`strategy::Picker::attach`).
    pub(crate) fn set_load_watch(&self, watch: Option<Box<dyn LoadWatch>>) {
        let some = watch.is_some();
        if !some && !self.strategy.indexed.load(Ordering::Relaxed) {
            return;
        }
        self.strategy.load_watch.store(watch.map(Arc::new));
        self.strategy.indexed.store(some, Ordering::Release);
    }

    /// Whether it has a hook for load changes.
    #[cfg(test)]
    pub(crate) fn is_watched(&self) -> bool {
        self.strategy.load_watch.load().is_some()
    }

    /// Tells the strategy's hook, if there is one, that its load or latency changed.
    #[inline]
    pub(crate) fn refresh_index(&self) {
        if self.strategy.indexed.load(Ordering::Acquire) {
            if let Some(watch) = self.strategy.load_watch.load().as_ref() {
                watch.refresh(self);
            }
        }
    }

    /// Counts a request in flight until the returned guard drops.
    #[inline]
    pub fn begin_request(self: &Arc<Self>) -> RequestGuard {
        self.live.capacity.enter();
        self.begin_claimed()
    }

    /// The limit on requests in flight now (an adaptive one's current value); 0 = none.
    pub(crate) fn max_conns(&self) -> u32 {
        self.live.capacity.max_conns()
    }

    /// The limit as configured: a number, or [`crate::config::AUTO_CONNS`].
    pub(crate) fn configured_max_conns(&self) -> u32 {
        self.live.capacity.configured()
    }

    /// Whether its limit follows its latency (`max_conns = "auto"`).
    pub(crate) fn adaptive_limit(&self) -> bool {
        self.live.capacity.adaptive()
    }

    /// Sets the limit (applies to the next pick): a number, or
    /// [`crate::config::AUTO_CONNS`].
    pub(crate) fn set_max_conns(&self, n: u32) {
        self.live.capacity.set_max_conns(n);
    }

    /// Moves an adaptive limit when its window is due at `now`, and lets waiters take
    /// the slots a rise brings. Control side only (the pool's upkeep).
    pub(crate) fn adjust_limit(&self, now: Instant) {
        if let Some((was, limit)) = self.live.capacity.adjust(now) {
            if limit > was {
                self.wake_waiters(Some((limit - was) as usize));
            }
        }
    }

    /// Wakes its pool's waiters when its limit goes up (`n` more slots, or all for
    /// `None`: no limit any more).
    pub(crate) fn wake_waiters(&self, n: Option<usize>) {
        if let Some(l) = self.link.get() {
            l.queue.release_many(n);
        }
    }

    /// Takes one of its slots: `None` when it is at its limit; `Some(true)` when the
    /// slot is counted in flight already (a limited backend, counted atomically with the
    /// check), `Some(false)` when there is no limit and `begin_after_claim` counts it.
    pub(crate) fn claim_slot(&self) -> Option<bool> {
        self.live.capacity.claim()
    }

    /// Gives back a slot `claim_slot` took (`counted`) for a request that went elsewhere.
    pub(crate) fn unclaim_slot(&self, counted: bool) {
        if counted {
            self.live.capacity.leave();
            self.release_slot();
        }
    }

    /// The request's guard after `claim_slot` said `Some(counted)`.
    pub(crate) fn begin_after_claim(self: &Arc<Self>, counted: bool) -> RequestGuard {
        if counted {
            self.begin_claimed()
        } else {
            self.begin_request()
        }
    }

    /// A limited slot came free: the oldest waiter of its pool may take it.
    fn release_slot(&self) {
        if let Some(l) = self.link.get() {
            l.queue.release();
        }
    }

    /// Records one outcome on live traffic for passive outlier detection; when it asks
    /// the pool for something, rings the pool's doorbell (the control side acts).
    fn record_outcome(&self, ok: bool, was_trial: bool) -> OutlierAction {
        let action = self.live.outlier.record(ok, was_trial);
        if action != OutlierAction::None {
            if let Some(l) = self.link.get() {
                l.news.notify_one();
            }
        }
        action
    }

    /// The guard of a request whose in-flight count is taken already.
    fn begin_claimed(self: &Arc<Self>) -> RequestGuard {
        self.refresh_index();
        self.live.requests.fetch_add(1, Ordering::Relaxed);
        RequestGuard {
            backend: Arc::clone(self),
            failed: false,
            trial: false,
        }
    }
}

/// Holds one request in flight on a backend. Dropping it — when the response body ends,
/// the exchange fails, a timeout fires or the client goes away and its future is
/// dropped — takes the count back down, so no path can leak it.
#[derive(Debug)]
pub struct RequestGuard {
    backend: Arc<Backend>,
    failed: bool,
    trial: bool,
}

impl RequestGuard {
    /// The backend this request went to.
    pub(crate) fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    /// Marks the exchange as failed (counted in `errors` when the guard drops).
    pub(crate) fn fail(&mut self) {
        self.failed = true;
    }

    /// This request is the half-open trial of its backend.
    pub(crate) fn set_trial(&mut self) {
        self.trial = true;
    }

    /// Counts the exchange's outcome for passive outlier detection (once per guard).
    pub(crate) fn outcome(&mut self, ok: bool) -> OutlierAction {
        let was_trial = std::mem::take(&mut self.trial);
        self.backend.record_outcome(ok, was_trial)
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.backend.live.capacity.leave();
        self.backend.refresh_index();
        // A limited slot came free, or the limit was lifted meanwhile: either way a
        // waiter may go.
        if self.backend.max_conns() != 0 {
            self.backend.release_slot();
        }
        if self.trial {
            self.backend.live.outlier.release_trial();
        }
        if self.failed {
            self.backend.live.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Whether a backend URL is `https://` (the scheme in any case).
fn is_https(url: &str) -> bool {
    url.get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::backend_spec;

    fn b() -> Arc<Backend> {
        Arc::new(Backend::new(
            0,
            backend_spec("http://127.0.0.1:1", Some(7), None).unwrap(),
            0.5,
        ))
    }

    #[test]
    fn guard_counts_and_fails() {
        let b = b();
        let g1 = b.begin_request();
        let mut g2 = b.begin_request();
        assert_eq!(b.in_flight(), 2);
        g2.fail();
        drop(g2);
        drop(g1);
        assert_eq!((b.in_flight(), b.requests(), b.errors()), (0, 2, 1));
    }

    #[test]
    fn an_ejection_ends_half_open_with_its_ramp_started() {
        let b = Arc::new(
            Backend::new(
                0,
                backend_spec("http://127.0.0.1:1", Some(100), None).unwrap(),
                0.1,
            )
            .with_slow_start(Duration::from_secs(10)),
        );
        let t0 = Instant::now();
        b.live.outlier.eject(t0);
        assert!(b.ejected() && !b.eligible());
        assert!(b.end_ejection_if_due(t0 + outlier::EJECTION_MAX));
        assert!(b.eligible() && b.half_open());
        assert!(b.effective_weight() < 100.0, "ramping");
    }

    #[test]
    fn a_trial_that_ends_without_an_outcome_is_offered_again() {
        let b = b();
        b.live.outlier.eject(Instant::now());
        assert!(b.end_ejection_if_due(Instant::now() + outlier::EJECTION_MAX));
        assert!(b.claim_trial());
        let mut g = b.begin_request();
        g.set_trial();
        drop(g);
        assert!(b.claim_trial());
    }

    #[test]
    fn an_outcome_that_asks_for_something_rings_the_pools_doorbell() {
        let mut settings = crate::config::Settings::default().pool;
        settings.outlier = outlier::DEFAULTS;
        settings.outlier.consecutive_failures = 2;
        let link = PoolLink::new();
        let spec = backend_spec("http://127.0.0.1:1", None, None).unwrap();
        let b = Arc::new(Backend::new(0, spec, 0.1).in_pool("p".into(), &settings, &link));
        assert_eq!(b.sticky_value, sticky_value("p", "http://127.0.0.1:1"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let rung = || {
            rt.block_on(async {
                let wait = link.news.notified();
                tokio::time::timeout(Duration::from_millis(20), wait)
                    .await
                    .is_ok()
            })
        };
        assert_eq!(b.begin_request().outcome(false), OutlierAction::None);
        assert!(!rung(), "one failure of two: no news");
        assert_eq!(b.begin_request().outcome(false), OutlierAction::Eject);
        assert!(rung(), "the control side is woken");
        assert!(b.live.outlier.take_news().eject);
        assert!(!b.ejected(), "the request path ejects nothing itself");
    }
}
