//! The settings a pool has of its own, apart from how pools and routes are read
//! (`pools.rs`), so the options table can name them without importing the readers.

use std::time::Duration;

use super::{retry, BackendSpec, BackendTransport, HashKey, HealthSettings, OutlierSettings};
use super::{StickySettings, StrategyKind};

/// The settings a pool has of its own: the values of the per-pool rows of the options
/// table (`config/options.rs`). `Settings::pool` holds the top-level ones, which every
/// pool takes unless it sets its own.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PoolSettings {
    /// Balancing strategy.
    pub(crate) strategy: StrategyKind,
    /// Key of the hashing strategies.
    pub(crate) hash_key: HashKey,
    /// Bounded load for the hashing strategies; `None` = off.
    pub(crate) hash_balance_factor: Option<f64>,
    /// Active health checks.
    pub(crate) health: HealthSettings,
    /// Passive outlier detection.
    pub(crate) outlier: super::OutlierSettings,
    /// Panic mode below this share of eligible primary backends (percent); 0 = off.
    pub(crate) panic_threshold: u32,
    /// Cookie-insert stickiness.
    pub(crate) sticky: super::StickySettings,
    /// Longest wait in the queue.
    pub(crate) queue_timeout: Duration,
    /// Most requests waiting in the queue.
    pub(crate) max_queue: usize,
    /// Most backends it takes, from every source (`max_backends`).
    pub(crate) max_backends: usize,
    /// The `max_conns` of its backends that set none: a number (0: no limit) or
    /// [`super::AUTO_CONNS`].
    pub(crate) max_conns: u32,
    /// The least and the most an adaptive limit may be (`max_conns_auto`).
    pub(crate) max_conns_auto: (u32, u32),
    /// Extra attempts for a failed idempotent request.
    pub(crate) retries: u32,
    /// Weight ramp duration; zero = off.
    pub(crate) slow_start: Duration,
    /// EWMA smoothing factor.
    pub(crate) ewma_alpha: f64,
    /// TCP connect bound.
    pub(crate) connect_timeout: Duration,
    /// HTTP version and TLS verification to the backends.
    pub(crate) transport: super::BackendTransport,
    /// Request sent → response headers bound.
    pub(crate) upstream_timeout: Duration,
    /// Largest request body; `None` = no limit.
    pub(crate) max_request_body: Option<u64>,
    /// What sends a request to another backend (`retry_on`).
    pub(crate) retry_on: super::retry::RetryOn,
    /// Whether any method may be sent again, not only the idempotent ones.
    pub(crate) retry_non_idempotent: bool,
    /// The largest request body kept so that it can be sent again.
    pub(crate) retry_body_limit: u64,
    /// Each try's bound on its answer head (`upstream_timeout` bounds them all).
    pub(crate) try_timeout: Option<Duration>,
    /// When a hedge goes out (`hedge.after`); `None`: never.
    pub(crate) hedge_after: Option<super::retry::HedgeAfter>,
    /// How many hedges a request may send (`hedge.max`).
    pub(crate) hedge_max: u32,
    /// What it carries: HTTP requests or TCP connections (`mode`).
    pub(crate) mode: super::tcp::PoolMode,
    /// A TCP connection silent this long both ways is closed (`idle_timeout`).
    pub(crate) idle_timeout: Duration,
}

impl PoolSettings {
    /// Every value zero or empty: what the options table's defaults are then set on
    /// (`Settings::default`).
    pub(crate) fn blank() -> PoolSettings {
        PoolSettings {
            strategy: StrategyKind::RoundRobin,
            hash_key: HashKey::ClientIp,
            hash_balance_factor: None,
            health: HealthSettings {
                path: String::new(),
                interval: Duration::ZERO,
                timeout: Duration::ZERO,
                healthy_threshold: 0,
                unhealthy_threshold: 0,
                kind: Default::default(),
            },
            outlier: OutlierSettings {
                consecutive_failures: 0,
                base_ejection: Duration::ZERO,
                max_ejection: Duration::ZERO,
                max_ejected_percent: 0,
                success_rate: None,
            },
            panic_threshold: 0,
            sticky: StickySettings::default(),
            queue_timeout: Duration::ZERO,
            max_queue: 0,
            max_backends: 0,
            max_conns: 0,
            max_conns_auto: (0, 0),
            retries: 0,
            slow_start: Duration::ZERO,
            ewma_alpha: 0.0,
            connect_timeout: Duration::ZERO,
            transport: BackendTransport::default(),
            upstream_timeout: Duration::ZERO,
            max_request_body: None,
            retry_on: retry::RetryOn::default(),
            retry_non_idempotent: false,
            retry_body_limit: 0,
            try_timeout: None,
            hedge_after: None,
            hedge_max: 0,
            mode: Default::default(),
            idle_timeout: super::tcp::DEFAULT_IDLE_TIMEOUT,
        }
    }

    /// The `max_conns` a backend of this pool gets: its own, else the pool's.
    pub(crate) fn max_conns_of(&self, spec: &BackendSpec) -> u32 {
        match spec.max_conns {
            0 => self.max_conns,
            own => own,
        }
    }
}
