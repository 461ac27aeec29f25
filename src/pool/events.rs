//! The pool's event bus: every change of membership, health, ejection or strategy, for
//! the logs today and the admin event stream.
//!
//! A `tokio::sync::broadcast` channel: sending never waits, and a subscriber that falls
//! behind loses the oldest events (it is told how many) instead of slowing anyone down.

use serde::Serialize;

use super::BackendView;

/// An event and the pool it is about, as JSON: `{"type": "health", …, "pool": "api"}`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Tagged {
    /// What happened.
    #[serde(flatten)]
    pub(crate) event: Event,
    /// The pool's name.
    pub(crate) pool: std::sync::Arc<str>,
}

/// Events kept for a subscriber that has not read them yet.
pub(crate) const EVENT_CAPACITY: usize = 1024;

/// One change, as JSON: `{"type": "health", …}`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Event {
    /// The health checks changed their verdict.
    Health {
        /// Backend id.
        id: u64,
        /// Backend name.
        backend: String,
        /// The new verdict.
        healthy: bool,
    },
    /// Passive outlier detection ejected a backend, or its ejection ended (half-open).
    Ejection {
        /// Backend id.
        id: u64,
        /// Backend name.
        backend: String,
        /// Whether it is ejected now.
        ejected: bool,
        /// Length of the ejection that starts, in seconds.
        #[serde(skip_serializing_if = "Option::is_none")]
        seconds: Option<u64>,
        /// Why it is ejected (set when an ejection starts).
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<crate::backend::outlier::Reason>,
    },
    /// A half-open backend's trial request succeeded: full traffic again.
    Restored {
        /// Backend id.
        id: u64,
        /// Backend name.
        backend: String,
    },
    /// No primary backend is eligible and the backups take the traffic, or a primary is
    /// back and they stop.
    Backups {
        /// Whether the backups take the traffic now.
        active: bool,
    },
    /// Too few backends are eligible and the pool balances over all of them, healthy or
    /// not (`panic_threshold`), or it stops doing so.
    Panic {
        /// Whether the pool is in panic mode now.
        active: bool,
    },
    /// The strategy was switched.
    Strategy {
        /// Canonical name of the new strategy.
        strategy: &'static str,
    },
    /// A backend joined the pool.
    BackendAdded {
        /// The backend as it joined.
        backend: BackendView,
    },
    /// A backend left the pool.
    BackendRemoved {
        /// Backend id.
        id: u64,
        /// Backend name.
        backend: String,
    },
    /// A backend's weight or state changed.
    BackendUpdated {
        /// The backend after the change.
        backend: BackendView,
    },
    /// Discovery changed the pool's backends (`docs/discovery.md`).
    Discovery {
        /// URLs of the backends that joined.
        added: Vec<String>,
        /// URLs of the backends that left (their requests in flight finish).
        removed: Vec<String>,
    },
    /// A value in the store (fleet mode) could not be applied: it does not parse, or
    /// names what does not exist; the last good version stays.
    StoreSkipped {
        /// The key, in full.
        key: String,
        /// Why.
        error: String,
    },
    /// A step of obtaining a certificate from the ACME CA (`[tls.acme]`, `docs/tls.md`).
    Acme {
        /// `ordered`, `issued`, `renewed` or `failed`.
        action: &'static str,
        /// The names the certificate is for.
        names: Vec<String>,
        /// What went wrong (`failed` only).
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// When it is renewed (`issued`, `renewed`), RFC 3339; or retried (`failed`).
        #[serde(skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    },
    /// A mirrored route's comparison came to another verdict (`docs/traffic.md`,
    /// "Compare"); the pool is the mirror's.
    MirrorVerdict {
        /// The route's index.
        route: usize,
        /// `same`, `differs`, `slower` or `insufficient`.
        verdict: &'static str,
        /// The verdict before.
        was: &'static str,
    },
    /// A proxied request finished (sampled: at most a few hundred per second).
    Request {
        /// Backend id.
        id: u64,
        /// Backend name.
        backend: String,
        /// Status sent to the client.
        status: u16,
        /// From the request's arrival until the response had been sent whole.
        latency_ms: f64,
        /// Request method.
        method: String,
        /// Request path (without the query).
        path: String,
        /// Retries it took.
        retries: u32,
        /// The client's protocol: `h1`, `h2` or `h3`.
        protocol: &'static str,
    },
}
