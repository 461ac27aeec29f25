//! A backend and the live numbers it keeps about itself.
//!
//! The backend is the vocabulary the pool, the strategies and the request path share,
//! and it depends on none of them: it holds its identity, its admin state, its health
//! and ejection state, its slow-start ramp, the load numbers every strategy may read
//! (requests in flight, the time of the last latency sample) and two things that are
//! opaque to it — the latency estimates a strategy keeps on it ([`Estimates`], whose
//! cells and rules belong to the strategies) and the strategy's hook that must hear of
//! every change of its load ([`LoadWatch`]). A new strategy is written in `strategy/`
//! only.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use http::uri::Authority;
use serde::Serialize;

use arc_swap::ArcSwapOption;

use crate::config::BackendSpec;

/// Administrative state, set through the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum AdminState {
    /// Takes traffic when healthy.
    Active,
    /// No new requests; in-flight ones finish.
    Draining,
    /// Out of rotation for maintenance; in-flight ones finish.
    Maintenance,
}

impl AdminState {
    /// Parses `active`, `draining`, `maintenance`.
    pub(crate) fn parse(s: &str) -> Option<AdminState> {
        match s {
            "active" => Some(AdminState::Active),
            "draining" => Some(AdminState::Draining),
            "maintenance" => Some(AdminState::Maintenance),
            _ => None,
        }
    }

    fn from_u8(v: u8) -> AdminState {
        match v {
            1 => AdminState::Draining,
            2 => AdminState::Maintenance,
            _ => AdminState::Active,
        }
    }
}

/// Sentinel for "no latency sample yet" in the EWMA cells.
const NO_SAMPLE: u64 = u64::MAX;
/// Sentinel for "never sampled" in the time stamp of the last sample.
const NEVER: u64 = u64::MAX;

/// Nanoseconds on a process-wide monotonic clock: the time stamps of the latency
/// estimates. One `Instant::now()`.
#[inline]
pub fn clock_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// How many estimate cells a backend has for the strategies ([`Estimates`]).
pub(crate) const ESTIMATE_CELLS: usize = 2;

/// Latency estimates the strategies keep on a backend, one `f64` cell each (in an
/// `AtomicU64`, updated by compare-and-swap), empty until the first sample and emptied
/// when the backend's measurements are cleared. Which cell means what, and how a sample
/// folds into it, is the business of the strategy that owns the cell
/// (`strategy::estimate`); the backend only stores them, so that a strategy switch finds
/// them up to date.
#[derive(Debug)]
pub(crate) struct Estimates([AtomicU64; ESTIMATE_CELLS]);

impl Estimates {
    fn new() -> Estimates {
        Estimates([const { AtomicU64::new(NO_SAMPLE) }; ESTIMATE_CELLS])
    }

    /// The value of `cell`, `None` while it is empty.
    #[inline]
    pub(crate) fn get(&self, cell: usize) -> Option<f64> {
        let bits = self.0[cell].load(Ordering::Relaxed);
        (bits != NO_SAMPLE).then(|| f64::from_bits(bits))
    }

    /// Replaces the value of `cell` with `next(value)`, atomically.
    #[inline]
    pub(crate) fn update(&self, cell: usize, next: impl Fn(Option<f64>) -> f64) {
        let _ = self.0[cell].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
            Some(next((bits != NO_SAMPLE).then(|| f64::from_bits(bits))).to_bits())
        });
    }

    fn clear(&self) {
        for c in &self.0 {
            c.store(NO_SAMPLE, Ordering::Relaxed);
        }
    }
}

/// What a strategy keeps per backend that must hear of every change of the backend's
/// load or latency (the leaf of a least-loaded index, `strategy::load_index`). Opaque to
/// the backend.
pub(crate) trait LoadWatch: Send + Sync + std::fmt::Debug {
    /// The backend's load or latency changed.
    fn refresh(&self, b: &Backend);
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
    /// Bound on a TCP connect to it (its pool's `connect_timeout`).
    pub(crate) connect_timeout: Duration,
    /// Its pool's passive checks.
    outlier: crate::config::OutlierSettings,
    /// Picked only while no other backend of its pool is eligible.
    pub(crate) backup: bool,
    /// Its sticky cookie's value in its pool (`proxy/sticky.rs`).
    pub(crate) sticky_value: u64,
    /// At most this many requests in flight; 0 = no limit (HAProxy's `maxconn`).
    max_conns: AtomicU32,
    /// Requests waiting in its pool's queue that the strategy would have sent here.
    pub(crate) queued: AtomicU64,
    /// Its pool's queue, woken when a limited slot comes free.
    queue: OnceLock<Arc<crate::pool::Queue>>,
    /// The URL exactly as configured.
    pub(crate) url: String,
    /// `host:port` to connect to.
    pub(crate) authority: Authority,
    /// The address itself when the host is an IP literal (no resolution per connect).
    pub(crate) socket_addr: Option<std::net::SocketAddr>,
    /// TLS or not (the URL's scheme) and the HTTP version (the pool's `protocol`).
    pub(crate) transport: crate::transport::Transport,
    weight: AtomicU32,
    state: AtomicU8,
    healthy: AtomicBool,
    ejected: AtomicBool,
    in_flight: AtomicU64,
    /// Whether `load_watch` is set: one plain load on the request path decides whether
    /// there is an index to keep up to date at all.
    indexed: AtomicBool,
    /// The current strategy's hook for load changes ([`LoadWatch`]), if it has one.
    load_watch: ArcSwapOption<Box<dyn LoadWatch>>,
    requests: AtomicU64,
    errors: AtomicU64,
    /// Latency EWMA in nanoseconds as f64 bits; `NO_SAMPLE` when unsampled. This is the
    /// average the admin API shows as `avg_latency_ms`.
    ewma: AtomicU64,
    alpha: f64,
    /// The strategies' own latency estimates.
    pub(crate) estimates: Estimates,
    /// [`clock_ns`] of the last latency sample; `NEVER` before the first.
    sampled_at: AtomicU64,
    /// Passive outlier detection: failures in a row seen on live traffic.
    consecutive_failures: AtomicU32,
    /// How often it has been ejected (sets the length of the next ejection).
    ejections: AtomicU32,
    /// When the current ejection ends (control path only).
    ejected_until: Mutex<Option<Instant>>,
    /// Half-open after an ejection: `TRIAL_OPEN` until one request has been let through,
    /// `TRIAL_RUNNING` while it is in flight.
    trial: AtomicU8,
    /// `--slow-start`: how long a joining or recovering backend ramps its weight.
    slow_start: Duration,
    /// When the current ramp began (control path only).
    ramp_since: Mutex<Option<Instant>>,
    /// Injected latency (`degrade`), milliseconds.
    fault_latency_ms: AtomicU32,
    /// Injected error rate (`degrade`), in millionths.
    fault_error_ppm: AtomicU32,
    /// What the metrics endpoint reads.
    pub(crate) stats: crate::stats::BackendStats,
    /// Set for a backend fulcrum started itself (`POST /admin/backends/spawn`).
    pub(crate) spawn: Option<SpawnInfo>,
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

/// Faults injected through the admin API to rehearse a sick backend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Faults {
    /// Added before the request is forwarded.
    pub(crate) latency: Duration,
    /// Share of requests answered 503 by the proxy itself, 0..=1.
    pub(crate) error_rate: f64,
}

/// No trial: the backend takes traffic normally.
const TRIAL_NONE: u8 = 0;
/// An ejection just ended: the next request that picks it is the trial.
const TRIAL_OPEN: u8 = 1;
/// The trial request is in flight; nobody else may use the backend.
const TRIAL_RUNNING: u8 = 2;

/// Consecutive failures on live traffic that eject a backend.
pub(crate) const EJECT_AFTER_FAILURES: u32 = 5;
/// Length of the first ejection; the n-th lasts n times as long.
pub(crate) const EJECTION_BASE: Duration = Duration::from_secs(30);
/// Longest ejection.
pub(crate) const EJECTION_MAX: Duration = Duration::from_secs(300);

/// What one outcome on live traffic asks the pool to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutlierAction {
    /// Nothing.
    None,
    /// Enough failures in a row: eject it.
    Eject,
    /// The half-open trial failed: eject it again, for longer.
    TrialFailed,
    /// The half-open trial succeeded: full traffic again.
    Restored,
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
            outlier: crate::config::OutlierSettings {
                consecutive_failures: EJECT_AFTER_FAILURES,
                base_ejection: EJECTION_BASE,
                max_ejection: EJECTION_MAX,
                max_ejected_percent: 50,
            },
            backup: spec.backup,
            sticky_value: crate::proxy::sticky_value(crate::config::DEFAULT_POOL, &spec.url),
            max_conns: AtomicU32::new(spec.max_conns),
            queued: AtomicU64::new(0),
            queue: OnceLock::new(),
            url: spec.url,
            socket_addr: spec.authority.as_str().parse().ok(),
            authority: spec.authority,
            weight: AtomicU32::new(spec.weight),
            state: AtomicU8::new(0),
            healthy: AtomicBool::new(true),
            ejected: AtomicBool::new(false),
            in_flight: AtomicU64::new(0),
            indexed: AtomicBool::new(false),
            load_watch: ArcSwapOption::empty(),
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            ewma: AtomicU64::new(NO_SAMPLE),
            alpha,
            estimates: Estimates::new(),
            sampled_at: AtomicU64::new(NEVER),
            consecutive_failures: AtomicU32::new(0),
            ejections: AtomicU32::new(0),
            ejected_until: Mutex::new(None),
            trial: AtomicU8::new(TRIAL_NONE),
            slow_start: Duration::ZERO,
            ramp_since: Mutex::new(None),
            fault_latency_ms: AtomicU32::new(0),
            fault_error_ppm: AtomicU32::new(0),
            stats: Default::default(),
            spawn: None,
        }
    }

    /// Marks it as spawned by fulcrum (before the backend is shared).
    pub(crate) fn with_spawn(mut self, spawn: Option<SpawnInfo>) -> Backend {
        self.spawn = spawn;
        self
    }

    /// Places it in the pool `name`, whose connect bound and passive checks it takes
    /// (before the backend is shared).
    pub(crate) fn in_pool(
        mut self,
        name: Arc<str>,
        settings: &crate::config::PoolSettings,
    ) -> Backend {
        self.sticky_value = crate::proxy::sticky_value(&name, &self.url);
        self.pool = name;
        self.connect_timeout = settings.connect_timeout;
        self.outlier = settings.outlier;
        self.transport = crate::transport::Transport::new(
            is_https(&self.url),
            self.authority.host(),
            &settings.transport,
        );
        self
    }

    /// Sets `--slow-start` (before the backend is shared).
    pub(crate) fn with_slow_start(mut self, d: Duration) -> Backend {
        self.slow_start = d;
        self
    }

    /// Starts a weight ramp (the backend joined or recovered); no-op without slow start.
    pub(crate) fn start_ramp(&self, now: Instant) {
        if !self.slow_start.is_zero() {
            *self.ramp_since.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
        }
    }

    /// The share of its weight a ramping backend has at `now`: 10 % at the start, 100 %
    /// after `--slow-start`; `None` when it is not ramping.
    fn ramp_share(&self, now: Instant) -> Option<f64> {
        let since = (*self.ramp_since.lock().unwrap_or_else(|e| e.into_inner()))?;
        let t = now.saturating_duration_since(since).as_secs_f64() / self.slow_start.as_secs_f64();
        (t < 1.0).then_some(0.1 + 0.9 * t)
    }

    /// The share of its full traffic a backend has now: its ramp's share while slow start
    /// ramps it, else 1. The pickers of the strategies without weights read it.
    pub(crate) fn ramp_fraction(&self) -> f64 {
        self.ramp_share(Instant::now()).unwrap_or(1.0)
    }

    /// Ends a ramp whose time is up; returns whether a ramp was running before the call.
    pub(crate) fn ramp_step(&self, now: Instant) -> bool {
        let mut since = self.ramp_since.lock().unwrap_or_else(|e| e.into_inner());
        match *since {
            Some(t) if now.saturating_duration_since(t) >= self.slow_start => {
                *since = None;
                true
            }
            Some(_) => true,
            None => false,
        }
    }

    /// The weight the weighted strategies use now (slow start applied).
    pub(crate) fn effective_weight(&self) -> f64 {
        let w = self.weight() as f64;
        match self.ramp_share(Instant::now()) {
            Some(share) => w * share,
            None => w,
        }
    }

    /// Configured weight.
    pub(crate) fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    pub(crate) fn set_weight(&self, w: u32) {
        self.weight.store(w, Ordering::Relaxed);
    }

    /// Administrative state.
    pub(crate) fn state(&self) -> AdminState {
        AdminState::from_u8(self.state.load(Ordering::Relaxed))
    }

    pub(crate) fn set_state(&self, s: AdminState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }

    /// Result of the active health checks.
    pub(crate) fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub(crate) fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }

    /// Counts one outcome seen on live traffic (a 5xx answer, a connect failure, a broken
    /// exchange or a timeout is a failure) and says what the pool should do about it.
    pub(crate) fn record_outcome(&self, ok: bool, was_trial: bool) -> OutlierAction {
        if ok {
            self.consecutive_failures.store(0, Ordering::Relaxed);
            if was_trial && self.end_trial() {
                return OutlierAction::Restored;
            }
            return OutlierAction::None;
        }
        if was_trial && self.end_trial() {
            return OutlierAction::TrialFailed;
        }
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        let after = self.outlier.consecutive_failures;
        if after > 0 && n >= after && !self.ejected() {
            OutlierAction::Eject
        } else {
            OutlierAction::None
        }
    }

    fn end_trial(&self) -> bool {
        self.trial
            .compare_exchange(
                TRIAL_RUNNING,
                TRIAL_NONE,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Whether the backend is half-open (an ejection ended, no trial has passed yet).
    #[inline]
    pub(crate) fn half_open(&self) -> bool {
        self.trial.load(Ordering::Relaxed) != TRIAL_NONE
    }

    /// Claims the single trial request of a half-open backend; `false` when another
    /// request already has it.
    pub(crate) fn claim_trial(&self) -> bool {
        self.trial
            .compare_exchange(
                TRIAL_OPEN,
                TRIAL_RUNNING,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// The trial request ended without an outcome (the client went away): the next
    /// request may try instead.
    fn release_trial(&self) {
        let _ = self.trial.compare_exchange(
            TRIAL_RUNNING,
            TRIAL_OPEN,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Ejects it (the pool has checked the half-of-the-pool cap); returns how long for.
    pub(crate) fn eject(&self, now: Instant) -> Duration {
        let n = self.ejections.fetch_add(1, Ordering::Relaxed) + 1;
        let o = &self.outlier;
        let d = o.base_ejection.saturating_mul(n).min(o.max_ejection);
        *self.ejected_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(now + d);
        self.trial.store(TRIAL_NONE, Ordering::Relaxed);
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.ejected.store(true, Ordering::Relaxed);
        d
    }

    /// Ends an ejection whose time is up: the backend turns half-open. Returns whether
    /// it did.
    pub(crate) fn end_ejection_if_due(&self, now: Instant) -> bool {
        let mut until = self.ejected_until.lock().unwrap_or_else(|e| e.into_inner());
        match *until {
            Some(t) if t <= now => {
                *until = None;
                self.trial.store(TRIAL_OPEN, Ordering::Relaxed);
                self.ejected.store(false, Ordering::Relaxed);
                self.start_ramp(now);
                true
            }
            _ => false,
        }
    }

    /// The injected faults, `None` when there are none (the common case: two loads).
    #[inline]
    pub(crate) fn faults(&self) -> Option<Faults> {
        let ms = self.fault_latency_ms.load(Ordering::Relaxed);
        let ppm = self.fault_error_ppm.load(Ordering::Relaxed);
        (ms != 0 || ppm != 0).then(|| Faults {
            latency: Duration::from_millis(ms as u64),
            error_rate: ppm as f64 / 1e6,
        })
    }

    /// Sets injected faults; `None` leaves that one as it is.
    pub(crate) fn degrade(&self, latency_ms: Option<u32>, error_rate: Option<f64>) {
        if let Some(ms) = latency_ms {
            self.fault_latency_ms.store(ms, Ordering::Relaxed);
        }
        if let Some(r) = error_rate {
            self.fault_error_ppm
                .store((r.clamp(0.0, 1.0) * 1e6).round() as u32, Ordering::Relaxed);
        }
    }

    /// Clears injected faults and the latency average.
    pub(crate) fn recover(&self) {
        self.fault_latency_ms.store(0, Ordering::Relaxed);
        self.fault_error_ppm.store(0, Ordering::Relaxed);
        self.clear_latency();
    }

    /// Ends an ejection at once (the backend came back through the health checks): it
    /// turns half-open like at the end of its time.
    pub(crate) fn end_ejection_now(&self) -> bool {
        if !self.ejected() {
            return false;
        }
        *self.ejected_until.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.trial.store(TRIAL_OPEN, Ordering::Relaxed);
        self.ejected.store(false, Ordering::Relaxed);
        self.start_ramp(Instant::now());
        true
    }

    /// How often passive outlier detection has ejected it.
    pub(crate) fn ejection_count(&self) -> u32 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// Ejected by passive outlier detection.
    pub(crate) fn ejected(&self) -> bool {
        self.ejected.load(Ordering::Relaxed)
    }

    /// Whether a strategy may pick it: healthy, not ejected, active.
    pub(crate) fn eligible(&self) -> bool {
        self.healthy() && !self.ejected() && self.state() == AdminState::Active
    }

    /// Requests in flight.
    #[inline]
    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Requests sent to it.
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Requests that failed or answered 5xx.
    pub(crate) fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Latency average, `None` until the first sample.
    pub(crate) fn avg_latency(&self) -> Option<Duration> {
        let bits = self.ewma.load(Ordering::Relaxed);
        (bits != NO_SAMPLE).then(|| Duration::from_nanos(f64::from_bits(bits) as u64))
    }

    /// Folds one latency sample into the backend's latency average and notes its time; returns
    /// the time since the sample before it (`None` for the first). The strategies' own
    /// estimates are folded by `strategy::record_latency`, which calls this.
    ///
    /// Lock-free: the average is one atomic cell updated by compare-and-swap. Two
    /// samples that land at the same moment each take the time since the sample before
    /// them from one `swap` of the time stamp, so elapsed time is never counted twice; the
    /// order in which their values are folded in may differ from the order of their time
    /// stamps by the width of the race, which moves an average by a rounding error.
    pub(crate) fn note_latency(&self, sample: Duration, now: u64) -> Option<u64> {
        let x = sample.as_nanos() as f64;
        let alpha = self.alpha;
        let _ = self
            .ewma
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let next = if bits == NO_SAMPLE {
                    x
                } else {
                    let prev = f64::from_bits(bits);
                    prev + alpha * (x - prev)
                };
                Some(next.to_bits())
            });
        match self.sampled_at.swap(now, Ordering::Relaxed) {
            NEVER => None,
            t => Some(now.saturating_sub(t)),
        }
    }

    /// The EWMA weight of a new sample (`--ewma-alpha`).
    pub(crate) fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Forgets every latency estimate (recovery, or back to healthy).
    pub(crate) fn clear_latency(&self) {
        self.ewma.store(NO_SAMPLE, Ordering::Relaxed);
        self.estimates.clear();
        self.sampled_at.store(NEVER, Ordering::Relaxed);
        self.refresh_index();
    }

    /// [`clock_ns`] of the last latency sample, `None` before the first.
    #[inline]
    pub(crate) fn sampled_at(&self) -> Option<u64> {
        match self.sampled_at.load(Ordering::Relaxed) {
            NEVER => None,
            t => Some(t),
        }
    }

    /// Points it at the current strategy's hook for load changes, or at none. Control
    /// path only (`strategy::Picker::attach`).
    pub(crate) fn set_load_watch(&self, watch: Option<Box<dyn LoadWatch>>) {
        let some = watch.is_some();
        if !some && !self.indexed.load(Ordering::Relaxed) {
            return;
        }
        self.load_watch.store(watch.map(Arc::new));
        self.indexed.store(some, Ordering::Release);
    }

    /// Whether it has a hook for load changes.
    #[cfg(test)]
    pub(crate) fn is_watched(&self) -> bool {
        self.load_watch.load().is_some()
    }

    /// Tells the strategy's hook, if there is one, that its load or latency changed.
    #[inline]
    pub(crate) fn refresh_index(&self) {
        if self.indexed.load(Ordering::Acquire) {
            if let Some(watch) = self.load_watch.load().as_ref() {
                watch.refresh(self);
            }
        }
    }

    /// Counts a request in flight until the returned guard drops.
    #[inline]
    pub fn begin_request(self: &Arc<Self>) -> RequestGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.begin_claimed()
    }

    /// The limit on requests in flight; 0 = none.
    pub(crate) fn max_conns(&self) -> u32 {
        self.max_conns.load(Ordering::Relaxed)
    }

    /// Sets the limit (applies to the next pick).
    pub(crate) fn set_max_conns(&self, n: u32) {
        self.max_conns.store(n, Ordering::Relaxed);
    }

    /// Wakes its pool's waiters when its limit goes up (`n` more slots, or all for
    /// `None`: no limit any more).
    pub(crate) fn wake_waiters(&self, n: Option<usize>) {
        if let Some(q) = self.queue.get() {
            q.release_many(n);
        }
    }

    /// Joins its pool's queue (once, before the backend serves).
    pub(crate) fn attach_queue(&self, q: &Arc<crate::pool::Queue>) {
        let _ = self.queue.set(Arc::clone(q));
    }

    /// Takes one of its slots: `None` when it is at its limit; `Some(true)` when the
    /// slot is counted in flight already (a limited backend, counted atomically with the
    /// check), `Some(false)` when there is no limit and `begin_after_claim` counts it.
    pub(crate) fn claim_slot(&self) -> Option<bool> {
        let max = self.max_conns();
        if max == 0 {
            return Some(false);
        }
        let mut n = self.in_flight.load(Ordering::Relaxed);
        loop {
            if n >= u64::from(max) {
                return None;
            }
            match self.in_flight.compare_exchange_weak(
                n,
                n + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(true),
                Err(now) => n = now,
            }
        }
    }

    /// Gives back a slot `claim_slot` took (`counted`) for a request that went elsewhere.
    pub(crate) fn unclaim_slot(&self, counted: bool) {
        if counted {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
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
        if let Some(q) = self.queue.get() {
            q.release();
        }
    }

    /// The guard of a request whose in-flight count is taken already.
    fn begin_claimed(self: &Arc<Self>) -> RequestGuard {
        self.refresh_index();
        self.requests.fetch_add(1, Ordering::Relaxed);
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
        self.backend.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.backend.refresh_index();
        // A limited slot came free, or the limit was lifted meanwhile: either way a
        // waiter may go.
        if self.backend.max_conns() != 0 {
            self.backend.release_slot();
        }
        if self.trial {
            self.backend.release_trial();
        }
        if self.failed {
            self.backend.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::backend_spec;

    fn b() -> Arc<Backend> {
        Arc::new(Backend::new(
            0,
            backend_spec("http://127.0.0.1:1", None, None).unwrap(),
            0.5,
        ))
    }

    #[test]
    fn ewma_is_seeded_by_the_first_sample() {
        let b = b();
        assert_eq!(b.avg_latency(), None);
        b.note_latency(Duration::from_millis(100), clock_ns());
        assert_eq!(b.avg_latency(), Some(Duration::from_millis(100)));
        b.note_latency(Duration::from_millis(200), clock_ns());
        assert_eq!(b.avg_latency(), Some(Duration::from_millis(150)));
        b.clear_latency();
        assert_eq!(b.avg_latency(), None);
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
}

#[cfg(test)]
mod outlier_tests {
    use super::*;
    use crate::config::backend_spec;

    fn b() -> Arc<Backend> {
        Arc::new(Backend::new(
            0,
            backend_spec("http://127.0.0.1:1", None, None).unwrap(),
            0.1,
        ))
    }

    #[test]
    fn five_failures_in_a_row_ask_for_an_ejection() {
        let b = b();
        for _ in 0..4 {
            assert_eq!(b.record_outcome(false, false), OutlierAction::None);
        }
        assert_eq!(b.record_outcome(true, false), OutlierAction::None);
        for _ in 0..4 {
            assert_eq!(b.record_outcome(false, false), OutlierAction::None);
        }
        assert_eq!(b.record_outcome(false, false), OutlierAction::Eject);
    }

    #[test]
    fn ejections_grow_and_end_half_open_with_one_trial() {
        let b = b();
        let t0 = Instant::now();
        assert_eq!(b.eject(t0), EJECTION_BASE);
        assert!(b.ejected() && !b.eligible());
        assert!(!b.end_ejection_if_due(t0 + Duration::from_secs(29)));
        assert!(b.end_ejection_if_due(t0 + Duration::from_secs(30)));
        assert!(b.eligible() && b.half_open());
        assert!(b.claim_trial());
        assert!(!b.claim_trial(), "only one trial at a time");
        assert_eq!(b.record_outcome(false, true), OutlierAction::TrialFailed);
        assert_eq!(b.eject(t0), EJECTION_BASE * 2);
        for _ in 0..20 {
            b.eject(t0);
        }
        assert_eq!(b.eject(t0), EJECTION_MAX);
        assert!(b.end_ejection_if_due(t0 + EJECTION_MAX));
        assert!(b.claim_trial());
        assert_eq!(b.record_outcome(true, true), OutlierAction::Restored);
        assert!(!b.half_open());
    }

    #[test]
    fn a_trial_that_ends_without_an_outcome_is_offered_again() {
        let b = b();
        b.eject(Instant::now());
        assert!(b.end_ejection_if_due(Instant::now() + EJECTION_MAX));
        assert!(b.claim_trial());
        let mut g = b.begin_request();
        g.set_trial();
        drop(g);
        assert!(b.claim_trial());
    }
}

#[cfg(test)]
mod slow_start_tests {
    use super::*;
    use crate::config::backend_spec;

    #[test]
    fn the_weight_ramps_from_a_tenth_to_all_of_it() {
        let b = Backend::new(
            0,
            backend_spec("http://127.0.0.1:1", Some(100), None).unwrap(),
            0.1,
        )
        .with_slow_start(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(b.ramp_share(t0), None);
        b.start_ramp(t0);
        assert!((b.ramp_share(t0).unwrap() - 0.1).abs() < 1e-9);
        assert!((b.ramp_share(t0 + Duration::from_secs(5)).unwrap() - 0.55).abs() < 1e-9);
        assert_eq!(b.ramp_share(t0 + Duration::from_secs(10)), None);
        assert!(b.ramp_step(t0 + Duration::from_secs(5)));
        assert!(
            b.ramp_step(t0 + Duration::from_secs(10)),
            "the last step reports the change"
        );
        assert!(!b.ramp_step(t0 + Duration::from_secs(11)));
        let off = Backend::new(
            1,
            backend_spec("http://127.0.0.1:2", Some(7), None).unwrap(),
            0.1,
        );
        off.start_ramp(t0);
        assert_eq!(off.effective_weight(), 7.0);
    }
}

/// Whether a backend URL is `https://` (the scheme in any case).
fn is_https(url: &str) -> bool {
    url.get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
}
