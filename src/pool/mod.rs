//! The pool: backends in order, and the routing table the request path reads.
//!
//! Control (the admin API, reloads, the health checker, the maintenance task) changes the
//! pool through a few operations; each one publishes a new immutable [`Snapshot`] — eligible backends plus
//! a freshly built [`Picker`] — through `arc-swap`. The request path does one lock-free
//! load and one pick; it never takes the control mutex.

mod acquire;
mod budget;
mod discovered;
mod eligible;
mod events;
mod hedge;
pub(crate) mod maintenance;
mod membership;
pub(crate) mod tcp_counts;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use serde::Serialize;
use tokio::sync::{broadcast, watch};

use crate::backend::outlier::{self, Reason};
pub(crate) use crate::backend::{
    clock_ns, AdminState, PoolLink, Queue, QueueError, Source, SpawnInfo,
};
pub use crate::backend::{Backend, RequestGuard};
use crate::stats;
pub(crate) use eligible::Mode;
pub(crate) use events::{Event, Tagged, EVENT_CAPACITY};
pub(crate) use membership::{Apply, Changes, Wanted};

use crate::config::PoolSpec;
use crate::strategy::{Picker, PickerOptions, StrategyKind};
#[cfg(test)]
use crate::{config::BackendSpec, strategy::PickCtx};
pub(crate) use acquire::{takes_sessions, Ask, NoPick, Turn};
pub(crate) use budget::{Retried, RetryBudget, RetryReason};
pub(crate) use discovered::DiscoveryStatus;
pub(crate) use hedge::Hedging;

/// How often a running slow-start ramp republishes the routing table.
pub(crate) const RAMP_REPUBLISH: std::time::Duration = std::time::Duration::from_millis(250);

/// An immutable view of the pool and the picker built over it.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// The live strategy.
    pub(crate) strategy: StrategyKind,
    /// Every backend in pool order.
    pub(crate) backends: Vec<Arc<Backend>>,
    /// The backends a strategy may pick, in pool order.
    pub(crate) eligible: Vec<Arc<Backend>>,
    /// How `eligible` was chosen: primaries, backups, or every primary in panic mode.
    pub(crate) mode: Mode,
    /// Routing state over `eligible`.
    pub(crate) picker: Picker,
}

impl Snapshot {
    /// The strategy's first candidate for a request with `key` that `accept` takes
    /// (see [`Picker::select`]).
    #[inline]
    pub(crate) fn select(
        &self,
        key: Option<u64>,
        accept: impl FnMut(&Arc<Backend>) -> bool,
    ) -> Option<&Arc<Backend>> {
        self.picker
            .select(&self.eligible, key, accept)
            .map(|i| &self.eligible[i])
    }

    /// Picks an eligible backend that `ctx` allows (not yet tried).
    #[cfg(test)]
    pub(crate) fn pick(&self, ctx: &PickCtx<'_>) -> Option<&Arc<Backend>> {
        self.picker
            .pick(&self.eligible, ctx)
            .map(|i| &self.eligible[i])
    }
}

/// Why a pool operation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PoolError {
    /// No backend has that id.
    NotFound(u64),
    /// A backend with that URL is already in the pool.
    DuplicateUrl(String),
    /// Another backend already has this name.
    DuplicateName(String),
    /// The pool has been removed.
    Retired(String),
    /// The pool holds its `max_backends` already.
    Full(usize),
    /// The backend is this fulcrum's own listener (why).
    Own(String),
}

impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolError::NotFound(id) => write!(f, "no backend with id {id}"),
            PoolError::DuplicateUrl(u) => write!(f, "backend URL '{u}' is already in the pool"),
            PoolError::DuplicateName(n) => write!(f, "backend name '{n}' is already in the pool"),
            PoolError::Retired(p) => write!(f, "pool '{p}' has been removed"),
            PoolError::Full(max) => {
                write!(f, "the pool has its max_backends ({max}) already")
            }
            PoolError::Own(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for PoolError {}

#[derive(Debug)]
struct Members {
    /// When a slow-start ramp last republished the routing table.
    last_ramp_publish: Option<std::time::Instant>,
    backends: Vec<Arc<Backend>>,
    strategy: StrategyKind,
    /// What pickers are built with.
    options: PickerOptions,
    /// Panic mode below this share of eligible primaries (percent); 0 = off.
    panic_threshold: u32,
}

/// What every pool shares: the event bus, the proxy-wide counters, the sampler of
/// `request` events and the backend ids (global, never reused).
#[derive(Debug)]
pub(crate) struct Hub {
    events: broadcast::Sender<Tagged>,
    /// Proxy-wide counters.
    pub(crate) stats: stats::ProxyStats,
    /// Which finished requests become `request` events.
    pub(crate) sampler: stats::RequestSampler,
    next_id: AtomicU64,
}

impl Hub {
    /// A hub with no pool yet; ids start at 0.
    pub(crate) fn new() -> Hub {
        Hub {
            events: broadcast::channel(EVENT_CAPACITY).0,
            stats: Default::default(),
            sampler: Default::default(),
            next_id: AtomicU64::new(0),
        }
    }

    /// A receiver of every event from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Tagged> {
        self.events.subscribe()
    }

    /// Sends an event to whoever listens (nobody listening is fine).
    pub(crate) fn send(&self, e: Tagged) {
        let _ = self.events.send(e);
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Makes the ids it gives from now on at least `first`: in fleet mode the store's
    /// backends have theirs (etcd revisions), and this instance's own — discovered —
    /// must never take one of them.
    pub(crate) fn ids_from(&self, first: u64) {
        self.next_id.fetch_max(first, Ordering::Relaxed);
    }
}

/// One pool: its backends, its strategy, the published routing table, and the
/// settings it has of its own (`docs/routing.md`).
#[derive(Debug)]
pub(crate) struct Pool {
    /// Unique among the pools.
    pub(crate) name: Arc<str>,
    members: Mutex<Members>,
    table: ArcSwap<Snapshot>,
    /// The settings it was made with (its strategy is the first one; the live one is
    /// [`Self::strategy`]).
    pub(crate) settings: crate::config::PoolSettings,
    /// Its own retry budget: a sick pool does not spend another's.
    pub(crate) budget: RetryBudget,
    /// Retries it sent, by reason.
    pub(crate) retried: Retried,
    /// A TCP pool's connections and bytes.
    pub(crate) tcp: tcp_counts::TcpCounts,
    /// Its hedging, when `hedge.after` is set.
    pub(crate) hedging: Option<Box<Hedging>>,
    /// Requests balanced in panic mode.
    pub(crate) panic_requests: AtomicU64,
    /// Requests waiting for a backend under its `max_conns`.
    pub(crate) queue: Arc<Queue>,
    /// What its backends share with it: the queue, and the doorbell their outlier news
    /// rings for the upkeep task.
    link: PoolLink,
    /// What all pools share.
    pub(crate) hub: Arc<Hub>,
    /// Flips when the pool is removed: its health checks and upkeep stop.
    retired: watch::Sender<bool>,
    /// Where its backends come from when discovery finds them; its discovery task
    /// follows it (`docs/discovery.md`).
    discover: watch::Sender<Option<Arc<crate::config::DiscoverSpec>>>,
    /// What discovery last did.
    discovery: Mutex<DiscoveryStatus>,
    /// Whether a backend has an adaptive limit: set at each publish, so that the upkeep
    /// of a pool without one reads one flag per tick and nothing more.
    adaptive: std::sync::atomic::AtomicBool,
}

/// A backend as the admin API shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct BackendView {
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) url: String,
    pub(crate) weight: u32,
    pub(crate) effective_weight: f64,
    pub(crate) state: AdminState,
    pub(crate) healthy: bool,
    pub(crate) ejected: bool,
    pub(crate) active_conns: u64,
    pub(crate) avg_latency_ms: Option<f64>,
    pub(crate) requests: u64,
    pub(crate) errors: u64,
    pub(crate) spawned: bool,
    /// The pool it belongs to.
    pub(crate) pool: Arc<str>,
    /// Picked only while no primary of its pool is eligible.
    pub(crate) backup: bool,
    /// At most this many requests in flight now; 0 = no limit.
    pub(crate) max_conns: u32,
    /// Whether `max_conns` follows the backend's latency (`auto`) or is `fixed`.
    pub(crate) max_conns_mode: &'static str,
    /// Requests waiting in the pool's queue that the strategy would send here.
    pub(crate) queued: u64,
    /// Who put it in the pool.
    pub(crate) source: Source,
    /// The utilization in its latest load report no older than three minutes.
    pub(crate) reported_utilization: Option<f64>,
    /// A spawned backend's process id (`null` while it is not running).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pid: Option<Option<u32>>,
    /// A spawned backend's port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) port: Option<u16>,
}

impl BackendView {
    /// Reads a backend's live numbers.
    pub(crate) fn of(b: &Backend) -> BackendView {
        BackendView {
            id: b.id,
            name: b.name.clone(),
            url: b.url.clone(),
            weight: b.control.weight(),
            effective_weight: b.effective_weight(),
            state: b.control.state(),
            healthy: b.control.healthy(),
            ejected: b.ejected(),
            active_conns: b.in_flight(),
            avg_latency_ms: b.avg_latency().map(|d| d.as_secs_f64() * 1000.0),
            requests: b.requests(),
            errors: b.errors(),
            spawned: b.spawn.is_some(),
            pool: Arc::clone(&b.pool),
            backup: b.backup,
            max_conns: b.max_conns(),
            max_conns_mode: if b.adaptive_limit() { "auto" } else { "fixed" },
            queued: b.queued().load(Ordering::Relaxed),
            source: b.control.source(),
            reported_utilization: b.load_report(clock_ns()).and_then(|r| r.utilization),
            pid: b.spawn.as_ref().map(|s| s.pid()),
            port: b.spawn.as_ref().map(|s| s.port),
        }
    }
}

/// Builds the snapshot of `m`; `previous` lets a rotation carry on where it was instead
/// of restarting at the first backend on every change (a health flip, a weight edit).
fn build_snapshot(m: &Members, previous: Option<&Picker>) -> Snapshot {
    let (eligible, mode) = eligible::select(&m.backends, m.panic_threshold);
    let picker = Picker::build_with(m.strategy, &eligible, &m.options, previous);
    picker.attach(&m.backends, &eligible);
    Snapshot {
        strategy: m.strategy,
        picker,
        backends: m.backends.clone(),
        eligible,
        mode,
    }
}

impl Pool {
    /// The pool `spec`, its backends in order with ids from `hub`, owned by `source`.
    ///
    /// Backends present at start-up take their full weight at once (as in HAProxy);
    /// slow start applies to those that join or recover later.
    pub(crate) fn new(spec: &PoolSpec, hub: Arc<Hub>, source: Source) -> Pool {
        let name: Arc<str> = Arc::from(spec.name.as_str());
        let st = &spec.settings;
        if !st.transport.verify {
            tracing::warn!(pool = %name, "tls_verify = false: the certificates of this pool's https backends are not verified");
        }
        if st.hedge_after.is_some() && st.retries == 0 {
            tracing::warn!(pool = %name, "hedge is set but retries = 0: a hedge is a try, so none can go out");
        }
        let link = PoolLink::new();
        let backends: Vec<Arc<Backend>> = spec
            .backends
            .iter()
            .map(|s| {
                let b = Backend::new(hub.next_id(), s.clone(), st.ewma_alpha);
                let b = b.in_pool(Arc::clone(&name), st, &link);
                b.control.set_source(source);
                Arc::new(b)
            })
            .collect();
        let members = Members {
            last_ramp_publish: None,
            backends,
            strategy: st.strategy,
            options: PickerOptions {
                hash_balance_factor: st.hash_balance_factor,
            },
            panic_threshold: st.panic_threshold,
        };
        let table = ArcSwap::from_pointee(build_snapshot(&members, None));
        let adaptive = members.backends.iter().any(|b| b.adaptive_limit());
        Pool {
            name,
            members: Mutex::new(members),
            table,
            settings: st.clone(),
            budget: RetryBudget::new(),
            retried: Retried::new(st.retry_on.statuses.len()),
            tcp: Default::default(),
            hedging: (st.hedge_after).map(|after| Box::new(Hedging::new(after, st.hedge_max))),
            panic_requests: AtomicU64::new(0),
            queue: Arc::clone(&link.queue),
            link,
            hub,
            retired: watch::channel(false).0,
            discover: watch::channel(spec.discover.clone().map(Arc::new)).0,
            discovery: Mutex::new(DiscoveryStatus::default()),
            adaptive: std::sync::atomic::AtomicBool::new(adaptive),
        }
    }

    /// A pool `default` of `specs` with the built-in settings and its own hub, for tests.
    #[cfg(test)]
    pub(crate) fn of_backends(specs: Vec<BackendSpec>, strategy: StrategyKind) -> Pool {
        let mut s = crate::config::Settings::default();
        s.pool.strategy = strategy;
        let spec = PoolSpec {
            name: crate::config::DEFAULT_POOL.into(),
            settings: s.pool,
            backends: specs,
            discover: None,
        };
        Pool::new(&spec, Arc::new(Hub::new()), Source::Config)
    }

    /// Marks the pool removed: its health checks and upkeep end; requests in flight on
    /// it finish.
    pub(crate) fn retire(&self) {
        // Under the members lock, so that no backend joins after it (`add_with`).
        let _m = self.lock();
        self.retired.send_replace(true);
    }

    /// Flips when the pool is removed.
    pub(crate) fn retired(&self) -> watch::Receiver<bool> {
        self.retired.subscribe()
    }

    /// Sets `--hash-balance-factor` (bounded load for the hashing strategies; `None` =
    /// off); the next pick follows it. A ring or Maglev table in use is kept: the factor
    /// changes how it is walked, not where its points are.
    pub(crate) fn set_hash_balance_factor(&self, factor: Option<f64>) {
        let mut m = self.lock();
        if m.options.hash_balance_factor != factor {
            m.options.hash_balance_factor = factor;
            self.publish(&mut m);
        }
    }

    /// Sends an event of this pool to whoever listens.
    pub(crate) fn emit(&self, event: Event) {
        self.hub.send(Tagged {
            pool: Arc::clone(&self.name),
            event,
        });
    }

    /// The current routing table (lock-free).
    #[inline]
    pub(crate) fn snapshot(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.table.load()
    }

    fn lock(&self) -> MutexGuard<'_, Members> {
        // Pool operations never panic while holding the lock; if one ever did, the
        // members are still consistent (every change is a single assignment).
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, m: &mut Members) {
        let adaptive = m.backends.iter().any(|b| b.adaptive_limit());
        self.adaptive.store(adaptive, Ordering::Relaxed);
        let previous = self.table.load();
        let next = build_snapshot(m, Some(&previous.picker));
        let (was, now) = (previous.mode, next.mode);
        self.table.store(Arc::new(next));
        if was != now {
            self.note_mode(was, now);
        }
    }

    /// Says so when the pool turns to its backups or to panic mode, or back.
    fn note_mode(&self, was: Mode, now: Mode) {
        if (was == Mode::Backups) != (now == Mode::Backups) {
            let active = now == Mode::Backups;
            if active {
                tracing::warn!(pool = %self.name, "no primary backend eligible: the backups take the traffic");
            } else {
                tracing::info!(pool = %self.name, "the backups no longer take the traffic");
            }
            self.emit(Event::Backups { active });
        }
        if (was == Mode::Panic) != (now == Mode::Panic) {
            let active = now == Mode::Panic;
            if active {
                tracing::warn!(pool = %self.name, "panic mode: too few eligible backends, balancing over all of them");
            } else {
                tracing::info!(pool = %self.name, "panic mode over");
            }
            self.emit(Event::Panic { active });
        }
    }

    /// Records the verdict of the health checks. Returns whether it changed anything; a
    /// change publishes a new routing table, so every strategy follows it at once. A
    /// backend that becomes healthy again starts with a fresh latency average, and any
    /// ejection it has ends (half-open).
    pub(crate) fn mark_health(&self, id: u64, healthy: bool) -> bool {
        let mut m = self.lock();
        let Some(b) = m.backends.iter().find(|b| b.id == id).cloned() else {
            return false;
        };
        if b.control.healthy() == healthy {
            return false;
        }
        b.control.set_healthy(healthy);
        self.emit(Event::Health {
            id,
            backend: b.name.clone(),
            healthy,
        });
        if healthy {
            b.clear_latency();
            b.start_ramp(std::time::Instant::now());
            // It was down and came back (a restart, say): an ejection earned while it
            // was down ends too, through the same half-open trial.
            if b.end_ejection_now() {
                tracing::info!(backend = %b.name, "healthy again: ejection over, half-open");
                self.emit(Event::Ejection {
                    id,
                    backend: b.name.clone(),
                    ejected: false,
                    seconds: None,
                    reason: None,
                });
            }
        }
        self.publish(&mut m);
        true
    }

    /// Acts on the outlier news its backends left since the last call (the request
    /// path records outcomes; this is the control side of `backend::outlier`): a
    /// passed trial is announced, and an ejection asked for is carried out within the
    /// pool's cap of ejected backends. Called by the pool's upkeep task when a backend
    /// rings its doorbell.
    pub(crate) fn settle_outliers(&self) {
        let mut m = self.lock();
        let mut changed = false;
        for b in m.backends.clone() {
            let news = b.live.outlier.take_news();
            if news.restored {
                tracing::info!(backend = %b.name, "half-open trial succeeded: full traffic again");
                self.emit(Event::Restored {
                    id: b.id,
                    backend: b.name.clone(),
                });
            }
            if news.eject {
                changed |= self.eject(&m, &b, Reason::ConsecutiveFailures);
            }
        }
        if changed {
            self.publish(&mut m);
        }
    }

    /// Ends the success-rate window of every backend and ejects those whose rate is an
    /// outlier ([`outlier::below_success_rate`]), within the pool's cap. Called by the
    /// pool's upkeep task every `success_rate.interval`.
    pub(crate) fn settle_success_rates(&self) {
        let Some(sr) = self.settings.outlier.success_rate else {
            return;
        };
        let mut m = self.lock();
        let mut qualified = Vec::new();
        let mut windows = Vec::new();
        for b in &m.backends {
            let (ok, total) = b.live.outlier.take_window();
            if total >= sr.min_requests && total > 0 && !b.ejected() {
                qualified.push(Arc::clone(b));
                windows.push((ok, total));
            }
        }
        let mut changed = false;
        for i in outlier::below_success_rate(&windows, &sr) {
            changed |= self.eject(&m, &qualified[i], Reason::SuccessRate);
        }
        if changed {
            self.publish(&mut m);
        }
    }

    /// Ejects `b` unless it is out already or the pool's cap forbids it; returns whether
    /// it did (the caller publishes).
    fn eject(&self, m: &Members, b: &Arc<Backend>, reason: Reason) -> bool {
        if b.ejected() {
            return false;
        }
        let out = m.backends.iter().filter(|b| b.ejected()).count();
        if !b.live.outlier.cap_allows(out, m.backends.len()) {
            tracing::debug!(backend = %b.name, ejected = out, pool = m.backends.len(), "not ejecting: the pool's share of ejected backends is at its limit");
            return false;
        }
        let d = b.live.outlier.eject(std::time::Instant::now());
        tracing::warn!(backend = %b.name, seconds = d.as_secs(), ?reason, "backend ejected after failures on live traffic");
        self.emit(Event::Ejection {
            id: b.id,
            backend: b.name.clone(),
            ejected: true,
            seconds: Some(d.as_secs()),
            reason: Some(reason),
        });
        true
    }

    /// Rung when a backend has outlier news ([`Self::settle_outliers`]).
    pub(crate) fn outlier_news(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.link.news)
    }

    /// Ends the ejections whose time is up (each backend turns half-open: one request
    /// goes through before it takes full traffic).
    pub(crate) fn end_due_ejections(&self) {
        let now = std::time::Instant::now();
        let mut m = self.lock();
        let mut changed = false;
        for b in &m.backends {
            if b.ejected() && b.end_ejection_if_due(now) {
                tracing::info!(backend = %b.name, "ejection over: half-open, one request goes through first");
                self.emit(Event::Ejection {
                    id: b.id,
                    backend: b.name.clone(),
                    ejected: false,
                    seconds: None,
                    reason: None,
                });
                changed = true;
            }
        }
        if changed {
            self.publish(&mut m);
        }
    }

    /// Republishes while a slow-start ramp runs, at most every [`RAMP_REPUBLISH`], and
    /// once when a ramp ends, so the weighted strategies follow the rising weight.
    pub(crate) fn refresh_ramps(&self) {
        if self.settings.slow_start.is_zero() {
            return;
        }
        let now = std::time::Instant::now();
        let mut m = self.lock();
        let mut ramping = false;
        let mut ended = false;
        for b in &m.backends {
            if b.ramp_step(now) {
                ramping = true;
                ended |= b.effective_weight() == b.control.weight() as f64;
            }
        }
        let due = m
            .last_ramp_publish
            .is_none_or(|t| now.duration_since(t) >= RAMP_REPUBLISH);
        if ramping && (due || ended) {
            m.last_ramp_publish = Some(now);
            self.publish(&mut m);
        }
    }

    /// Moves the adaptive limits (`max_conns = "auto"`) whose window is over; no routing
    /// table changes (the limit is read as each pick claims a slot).
    pub(crate) fn adjust_limits(&self) {
        if !self.adaptive.load(Ordering::Relaxed) {
            return;
        }
        let now = std::time::Instant::now();
        for b in &self.table.load().backends {
            if b.adaptive_limit() {
                b.adjust_limit(now);
            }
        }
    }

    /// Rebuilds the routing table when its least-loaded index is due for renewal
    /// ([`Picker::index_is_old`]); called by the pool's maintenance task.
    pub(crate) fn renew_index(&self) {
        let now = clock_ns();
        if self.table.load().picker.index_is_old(now) {
            let mut m = self.lock();
            if self.table.load().picker.index_is_old(now) {
                self.publish(&mut m);
            }
        }
    }

    /// The live strategy.
    pub(crate) fn strategy(&self) -> StrategyKind {
        self.lock().strategy
    }

    /// Switches strategy; requests in flight keep their backend, the next pick uses it.
    pub(crate) fn set_strategy(&self, kind: StrategyKind) {
        let mut m = self.lock();
        m.strategy = kind;
        self.publish(&mut m);
        self.emit(Event::Strategy {
            strategy: kind.name(),
        });
    }

    /// Every backend in pool order.
    pub(crate) fn backends(&self) -> Vec<Arc<Backend>> {
        self.lock().backends.clone()
    }

    /// One backend by id.
    pub(crate) fn get(&self, id: u64) -> Result<Arc<Backend>, PoolError> {
        self.lock()
            .backends
            .iter()
            .find(|b| b.id == id)
            .cloned()
            .ok_or(PoolError::NotFound(id))
    }

    /// Changes weight and/or state; applies to the next pick.
    pub(crate) fn update(
        &self,
        id: u64,
        weight: Option<u32>,
        state: Option<AdminState>,
        max_conns: Option<u32>,
    ) -> Result<Arc<Backend>, PoolError> {
        let mut m = self.lock();
        let b = m
            .backends
            .iter()
            .find(|b| b.id == id)
            .cloned()
            .ok_or(PoolError::NotFound(id))?;
        if let Some(w) = weight {
            b.control.set_weight(w);
            b.control.pin(crate::backend::pin::WEIGHT);
        }
        if let Some(s) = state {
            b.control.set_state(s);
        }
        let old = max_conns.map(|n| (b.max_conns(), n));
        if let Some(n) = max_conns {
            b.set_max_conns(n);
            b.control.pin(crate::backend::pin::MAX_CONNS);
        }
        self.publish(&mut m);
        if let Some((was, now)) = old {
            wake_for_new_slots(&b, was, now);
        }
        self.emit(Event::BackendUpdated {
            backend: BackendView::of(&b),
        });
        Ok(b)
    }
}

/// Slots that came with a higher `max_conns` (`was` → `now`) go to the waiters at once.
fn wake_for_new_slots(b: &Backend, was: u32, now: u32) {
    match (was, now) {
        (o, 0) if o != 0 => b.wake_waiters(None),
        (o, n) if o != 0 && n > o => b.wake_waiters(Some((n - o) as usize)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::backend_spec;

    fn pool(n: usize, kind: StrategyKind) -> Pool {
        let specs = (0..n)
            .map(|i| backend_spec(&format!("http://127.0.0.1:{}", 2000 + i), None, None).unwrap())
            .collect();
        Pool::of_backends(specs, kind)
    }

    fn pick_id(p: &Pool) -> Option<u64> {
        p.snapshot().pick(&PickCtx::default()).map(|b| b.id)
    }

    #[test]
    fn draining_and_removed_backends_get_no_new_requests() {
        let p = pool(3, StrategyKind::RoundRobin);
        let b1 = p.get(1).unwrap();
        let g = b1.begin_request();
        p.update(1, None, Some(AdminState::Draining), None).unwrap();
        let ids: Vec<_> = (0..4).filter_map(|_| pick_id(&p)).collect();
        assert_eq!(ids, vec![0, 2, 0, 2]);
        assert_eq!(b1.in_flight(), 1);
        drop(g);
        assert_eq!(b1.in_flight(), 0);
        p.remove(0).unwrap();
        let ids: Vec<_> = (0..2).filter_map(|_| pick_id(&p)).collect();
        assert_eq!(ids, vec![2, 2]);
        assert_eq!(p.remove(0).err(), Some(PoolError::NotFound(0)));
    }

    #[test]
    fn ids_are_never_reused_and_urls_are_unique() {
        let p = pool(2, StrategyKind::RoundRobin);
        p.remove(1).unwrap();
        let b = p
            .add(backend_spec("http://127.0.0.1:5000", None, None).unwrap())
            .unwrap();
        assert_eq!(b.id, 2);
        let dup = p.add(backend_spec("http://127.0.0.1:5000", None, None).unwrap());
        assert!(matches!(dup, Err(PoolError::DuplicateUrl(_))));
    }

    #[test]
    fn every_change_is_an_event() {
        let p = pool(2, StrategyKind::RoundRobin);
        let mut rx = p.hub.subscribe();
        p.set_strategy(StrategyKind::LeastConnections);
        p.update(0, Some(3), None, None).unwrap();
        assert!(p.mark_health(1, false));
        assert!(!p.mark_health(1, false), "no change, no event");
        p.remove(1).unwrap();
        let b = p
            .add(backend_spec("http://127.0.0.1:4999", None, None).unwrap())
            .unwrap();
        let got: Vec<Event> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|t| t.event)
            .collect();
        assert_eq!(got.len(), 5, "{got:?}");
        assert_eq!(
            got[0],
            Event::Strategy {
                strategy: "least_connections"
            }
        );
        assert!(matches!(&got[1], Event::BackendUpdated { backend } if backend.weight == 3));
        assert!(matches!(
            &got[2],
            Event::Health {
                id: 1,
                healthy: false,
                ..
            }
        ));
        assert!(matches!(&got[3], Event::BackendRemoved { id: 1, .. }));
        assert!(matches!(&got[4], Event::BackendAdded { backend } if backend.id == b.id));
        let json = serde_json::to_value(Tagged {
            pool: Arc::clone(&p.name),
            event: got[2].clone(),
        })
        .unwrap();
        assert_eq!(json["type"], "health");
        assert_eq!(json["pool"], "default");
    }

    #[test]
    fn a_balance_factor_applies_to_the_next_pick_and_keeps_the_ring() {
        let p = pool(3, StrategyKind::ConsistentHash);
        let ring = |p: &Pool| match &p.snapshot().picker {
            Picker::Ring(r, f) => (Arc::clone(r), *f),
            other => panic!("{other:?}"),
        };
        let (before, f) = ring(&p);
        assert_eq!(f, None);
        p.set_hash_balance_factor(Some(1.5));
        let (after, f) = ring(&p);
        assert_eq!(f, Some(1.5));
        assert!(Arc::ptr_eq(&before, &after));
    }

    #[test]
    fn a_removed_pool_takes_no_new_backend() {
        let p = pool(1, StrategyKind::RoundRobin);
        p.retire();
        let r = p.add(backend_spec("http://127.0.0.1:4998", None, None).unwrap());
        assert_eq!(r.err(), Some(PoolError::Retired("default".into())));
        assert_eq!(p.backends().len(), 1);
    }

    #[test]
    fn empty_pool_picks_nothing() {
        let p = pool(0, StrategyKind::LeastConnections);
        assert_eq!(pick_id(&p), None);
    }
}
