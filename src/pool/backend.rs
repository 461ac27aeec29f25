//! A backend and the live numbers it keeps about itself.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use serde::Serialize;

use crate::config::BackendSpec;

/// Administrative state, set through the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminState {
    /// Takes traffic when healthy.
    Active,
    /// No new requests; in-flight ones finish.
    Draining,
    /// Out of rotation for maintenance; in-flight ones finish.
    Maintenance,
}

impl AdminState {
    /// Parses `active`, `draining`, `maintenance`.
    pub fn parse(s: &str) -> Option<AdminState> {
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

/// Sentinel for "no latency sample yet" in the EWMA cell.
const NO_SAMPLE: u64 = u64::MAX;

/// One upstream server. Shared (`Arc`) by the pool, every snapshot and every request
/// guard, so a backend removed from the pool lives until its last request ends.
#[derive(Debug)]
pub struct Backend {
    /// Pool-unique id, never reused.
    pub id: u64,
    /// Display name.
    pub name: String,
    /// The URL exactly as configured.
    pub url: String,
    /// Scheme of the upstream URI (pre-built so no request formats it).
    pub scheme: Scheme,
    /// `host:port` to connect to.
    pub authority: Authority,
    /// The address itself when the host is an IP literal (no resolution per connect).
    pub socket_addr: Option<std::net::SocketAddr>,
    weight: AtomicU32,
    state: AtomicU8,
    healthy: AtomicBool,
    ejected: AtomicBool,
    in_flight: AtomicU64,
    requests: AtomicU64,
    errors: AtomicU64,
    /// Latency EWMA in nanoseconds as f64 bits; `NO_SAMPLE` when unsampled.
    ewma: AtomicU64,
    alpha: f64,
}

impl Backend {
    /// A backend that starts healthy, active and unsampled.
    pub fn new(id: u64, spec: BackendSpec, alpha: f64) -> Backend {
        Backend {
            id,
            name: spec.name,
            url: spec.url,
            scheme: Scheme::HTTP,
            socket_addr: spec.authority.as_str().parse().ok(),
            authority: spec.authority,
            weight: AtomicU32::new(spec.weight),
            state: AtomicU8::new(0),
            healthy: AtomicBool::new(true),
            ejected: AtomicBool::new(false),
            in_flight: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            ewma: AtomicU64::new(NO_SAMPLE),
            alpha,
        }
    }

    /// Configured weight.
    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    pub(crate) fn set_weight(&self, w: u32) {
        self.weight.store(w, Ordering::Relaxed);
    }

    /// Administrative state.
    pub fn state(&self) -> AdminState {
        AdminState::from_u8(self.state.load(Ordering::Relaxed))
    }

    pub(crate) fn set_state(&self, s: AdminState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }

    /// Result of the active health checks.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub(crate) fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }

    /// Ejected by passive outlier detection.
    pub fn ejected(&self) -> bool {
        self.ejected.load(Ordering::Relaxed)
    }

    /// Whether a strategy may pick it: healthy, not ejected, active.
    pub fn eligible(&self) -> bool {
        self.healthy() && !self.ejected() && self.state() == AdminState::Active
    }

    /// Requests in flight.
    #[inline]
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Requests sent to it.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Requests that failed or answered 5xx.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Latency average, `None` until the first sample.
    pub fn avg_latency(&self) -> Option<Duration> {
        let bits = self.ewma.load(Ordering::Relaxed);
        (bits != NO_SAMPLE).then(|| Duration::from_nanos(f64::from_bits(bits) as u64))
    }

    /// Folds one latency sample into the EWMA; the first sample seeds it.
    pub fn record_latency(&self, sample: Duration) {
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
    }

    /// Forgets the latency average (recovery, or back to healthy).
    pub fn clear_latency(&self) {
        self.ewma.store(NO_SAMPLE, Ordering::Relaxed);
    }

    /// Counts a request in flight until the returned guard drops.
    #[inline]
    pub fn begin_request(self: &Arc<Self>) -> RequestGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        RequestGuard {
            backend: Arc::clone(self),
            failed: false,
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
}

impl RequestGuard {
    /// The backend this request went to.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    /// Marks the exchange as failed (counted in `errors` when the guard drops).
    pub fn fail(&mut self) {
        self.failed = true;
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.backend.in_flight.fetch_sub(1, Ordering::Relaxed);
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
        b.record_latency(Duration::from_millis(100));
        assert_eq!(b.avg_latency(), Some(Duration::from_millis(100)));
        b.record_latency(Duration::from_millis(200));
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
