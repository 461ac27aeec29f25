//! Counters the metrics endpoint reads: per backend and for the whole proxy.
//!
//! Plain relaxed atomics, written on the request path and read at scrape time. The
//! latency histogram is our own rather than prometheus-client's `Histogram`, which takes
//! a lock on every observation; here an observation is two atomic adds.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::clock::Stamp;
pub(crate) use crate::jwt::JwtRefusal;

/// Upper bounds (seconds) of the request duration histogram, as in most HTTP
/// instrumentation: 1 ms to 10 s.
pub(crate) const DURATION_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A fixed-bucket histogram of durations.
#[derive(Debug, Default)]
pub(crate) struct Histogram {
    /// Non-cumulative counts; the last slot is `+Inf`.
    counts: [AtomicU64; DURATION_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one duration.
    #[inline]
    pub(crate) fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = DURATION_BUCKETS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(DURATION_BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// `(sum in seconds, count, per-bucket counts)`; the buckets are not cumulative
    /// (prometheus-client's encoder accumulates them).
    pub(crate) fn read(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let mut count = 0;
        let mut buckets = Vec::with_capacity(self.counts.len());
        for (i, c) in self.counts.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            count += n;
            // prometheus-client writes `+Inf` for f64::MAX (and `inf` for infinity).
            let le = DURATION_BUCKETS.get(i).copied().unwrap_or(f64::MAX);
            buckets.push((le, n));
        }
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        (sum, count, buckets)
    }
}

/// What the metrics endpoint shows about one backend.
#[derive(Debug, Default)]
pub(crate) struct BackendStats {
    /// Answers by status class: 1xx … 5xx.
    by_class: [AtomicU64; 5],
    /// Time from the request's arrival until its response has been sent whole.
    pub(crate) duration: Histogram,
    health_ok: AtomicU64,
    health_failed: AtomicU64,
    /// Answers refused as unsafe to forward, by [`BadAnswer`] (502 to the client).
    bad_answers: [AtomicU64; 2],
}

/// Why a backend's answer was refused with 502 (`docs/operations.md`, "Limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BadAnswer {
    /// The head is over the limits: more than 128 fields, or more than 64 KiB.
    HeadTooLarge,
    /// The head or its framing cannot be read safely (conflicting lengths, an
    /// unrequested `101`, a malformed line).
    Malformed,
}

impl BadAnswer {
    /// Every reason, in the order the counters keep them.
    pub(crate) const ALL: [BadAnswer; 2] = [BadAnswer::HeadTooLarge, BadAnswer::Malformed];

    /// The metric's `reason` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            BadAnswer::HeadTooLarge => "head_too_large",
            BadAnswer::Malformed => "malformed",
        }
    }

    /// What the log line says.
    pub(crate) fn text(self) -> &'static str {
        match self {
            BadAnswer::HeadTooLarge => {
                "the answer's head is over the limits (128 header fields, 64 KiB)"
            }
            BadAnswer::Malformed => "the answer's head or framing is malformed",
        }
    }
}

/// Status class labels in `by_class` order.
pub(crate) const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

impl BackendStats {
    /// Counts one finished request.
    #[inline]
    pub(crate) fn finished(&self, status: u16, took: Duration) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        self.by_class[class].fetch_add(1, Ordering::Relaxed);
        self.duration.observe(took);
    }

    /// Answers per status class, in [`STATUS_CLASSES`] order.
    pub(crate) fn by_class(&self) -> [u64; 5] {
        std::array::from_fn(|i| self.by_class[i].load(Ordering::Relaxed))
    }

    /// Counts one health probe.
    pub(crate) fn probe(&self, ok: bool) {
        let c = if ok {
            &self.health_ok
        } else {
            &self.health_failed
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an answer refused for `why`.
    pub(crate) fn bad_answer(&self, why: BadAnswer) {
        self.bad_answers[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Answers refused, per reason in [`BadAnswer::ALL`] order.
    pub(crate) fn bad_answers(&self) -> [u64; 2] {
        std::array::from_fn(|i| self.bad_answers[i].load(Ordering::Relaxed))
    }

    /// `(successful, failed)` health probes.
    pub(crate) fn probes(&self) -> (u64, u64) {
        (
            self.health_ok.load(Ordering::Relaxed),
            self.health_failed.load(Ordering::Relaxed),
        )
    }
}

/// Proxy-wide counters.
#[derive(Debug, Default)]
pub(crate) struct ProxyStats {
    /// Requests answered 503 by `--max-inflight`.
    pub(crate) shed: AtomicU64,
    /// Requests answered 503 because nothing was eligible.
    pub(crate) no_backend: AtomicU64,
    /// Requests answered 404 because no route took them.
    pub(crate) no_route: AtomicU64,
    /// Events a slow subscriber of the event stream missed.
    pub(crate) events_dropped: AtomicU64,
    /// Client connections closed at once by `max_connections_per_client`.
    pub(crate) client_refused: AtomicU64,
    /// ACME orders that failed (`fulcrum_acme_failures_total`).
    pub(crate) acme_failures: AtomicU64,
}

/// Adds one to a counter.
#[inline]
pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Where a client was kept out (`fulcrum_clients_denied_total{where}`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Denied {
    /// `deny_clients`/`allow_clients`: its connection closed at accept.
    Accept,
    /// A route's `allow`/`deny`: its request answered 403.
    Route,
}

impl Denied {
    /// The label values, in the order of the variants.
    pub(crate) const ALL: [&'static str; 2] = ["accept", "route"];
}

/// Clients kept out, by [`Denied`], for the whole process.
static DENIED: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];

/// Counts a client kept out.
pub(crate) fn client_denied(at: Denied) {
    DENIED[at as usize].fetch_add(1, Ordering::Relaxed);
}

/// Clients kept out, in [`Denied::ALL`] order.
pub(crate) fn clients_denied() -> [u64; 2] {
    std::array::from_fn(|i| DENIED[i].load(Ordering::Relaxed))
}

/// How a route's `forward_auth` ended (`fulcrum_forward_auth_total{route,result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuthResult {
    /// A `2xx`: the request went on.
    Allowed,
    /// Another answer, passed to the client.
    Refused,
    /// No answer within `timeout`, or none at all: `503`.
    Unavailable,
}

impl AuthResult {
    /// The label values, in the order of the variants.
    pub(crate) const ALL: [&'static str; 3] = ["allowed", "refused", "unavailable"];
}

/// A route's access counters: what its `jwt` refused, how its `forward_auth` ended.
#[derive(Debug, Default)]
pub(crate) struct AccessCounts {
    jwt: [AtomicU64; 10],
    forward_auth: [AtomicU64; 3],
}

impl AccessCounts {
    /// Counts a request `jwt` refused.
    pub(crate) fn jwt_refused(&self, why: JwtRefusal) {
        self.jwt[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a `forward_auth` outcome.
    pub(crate) fn forward_auth(&self, r: AuthResult) {
        self.forward_auth[r as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals, in [`JwtRefusal::ALL`] order.
    pub(crate) fn jwt(&self) -> [u64; 10] {
        std::array::from_fn(|i| self.jwt[i].load(Ordering::Relaxed))
    }

    /// Outcomes, in [`AuthResult::ALL`] order.
    pub(crate) fn forward_auths(&self) -> [u64; 3] {
        std::array::from_fn(|i| self.forward_auth[i].load(Ordering::Relaxed))
    }
}

/// At most this many `request` events per second reach the event stream.
pub(crate) const REQUEST_EVENTS_PER_SEC: u64 = 200;

/// Decides which requests become `request` events: none while nobody subscribes, and
/// at most [`REQUEST_EVENTS_PER_SEC`] otherwise — one shared time slot, claimed by
/// compare-and-swap, so the check costs one load when the slot is not due.
#[derive(Debug)]
pub(crate) struct RequestSampler {
    subscribers: AtomicUsize,
    /// When the next sample is due ([`Stamp`] nanoseconds).
    next_ns: AtomicU64,
}

impl Default for RequestSampler {
    fn default() -> Self {
        RequestSampler {
            subscribers: AtomicUsize::new(0),
            next_ns: AtomicU64::new(0),
        }
    }
}

impl RequestSampler {
    /// Registers a subscriber; pair with [`Self::unsubscribe`].
    pub(crate) fn subscribe(&self) {
        self.subscribers.fetch_add(1, Ordering::Relaxed);
    }

    /// Unregisters a subscriber.
    pub(crate) fn unsubscribe(&self) {
        self.subscribers.fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether the request finishing at `now` should be sampled.
    #[inline]
    pub(crate) fn sample(&self, now: Stamp) -> bool {
        if self.subscribers.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let t = now.ns();
        let next = self.next_ns.load(Ordering::Relaxed);
        t >= next
            && self
                .next_ns
                .compare_exchange(
                    next,
                    t + 1_000_000_000 / REQUEST_EVENTS_PER_SEC,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_count_their_own_range() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(30));
        h.observe(Duration::from_secs(20));
        let (sum, count, buckets) = h.read();
        assert_eq!(count, 3);
        assert!((sum - 20.0305).abs() < 1e-6, "{sum}");
        assert_eq!(buckets[0], (0.001, 1));
        assert_eq!(buckets[5], (0.05, 1));
        assert_eq!(buckets[12], (10.0, 0));
        assert_eq!(buckets[13], (f64::MAX, 1));
    }

    #[test]
    fn status_classes() {
        let s = BackendStats::default();
        for code in [101, 200, 204, 302, 404, 500, 503, 999] {
            s.finished(code, Duration::ZERO);
        }
        assert_eq!(s.by_class(), [1, 2, 1, 1, 3]);
    }

    #[test]
    fn sampler_is_off_without_subscribers_and_rate_limited_with() {
        let s = RequestSampler::default();
        let t0 = Stamp::now();
        assert!(!s.sample(t0));
        s.subscribe();
        let taken = (0..1000)
            .filter(|i| s.sample(t0.after(Duration::from_micros(i * 100))))
            .count();
        // 100 ms of requests every 100 µs: 20 slots at 200 per second.
        assert!((19..=21).contains(&taken), "{taken}");
        s.unsubscribe();
        assert!(!s.sample(t0.after(Duration::from_secs(5))));
    }
}

/// The client protocols requests arrive over, as metrics, logs and events name them.
pub(crate) const PROTOCOLS: [&str; 3] = ["h1", "h2", "h3"];

/// The index in [`PROTOCOLS`] of a request of `version`.
pub(crate) fn protocol_index(version: http::Version) -> usize {
    match version {
        http::Version::HTTP_2 => 1,
        http::Version::HTTP_3 => 2,
        _ => 0,
    }
}

/// Requests by client protocol: each worker's recorder counts in cells of its own (no
/// cache line shared between workers on the request path), summed when read.
mod by_protocol {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    type Cells = [AtomicU64; super::PROTOCOLS.len()];

    /// Every recorder's cells (a worker that ends leaves its counts here).
    static ALL: Mutex<Vec<Arc<Cells>>> = Mutex::new(Vec::new());

    /// One worker's counts.
    #[derive(Debug)]
    pub(crate) struct ProtocolCounts(Arc<Cells>);

    impl ProtocolCounts {
        /// New cells, counted in [`totals`] from now on.
        pub(crate) fn new() -> ProtocolCounts {
            let cells = Arc::new(Cells::default());
            ALL.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Arc::clone(&cells));
            ProtocolCounts(cells)
        }

        /// Adds one request of protocol `i` (an index in `PROTOCOLS`).
        #[inline]
        pub(crate) fn count(&self, i: usize) {
            if let Some(c) = self.0.get(i) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Requests so far, by protocol.
    pub(crate) fn totals() -> [u64; super::PROTOCOLS.len()] {
        let all = ALL.lock().unwrap_or_else(|e| e.into_inner());
        std::array::from_fn(|i| all.iter().map(|c| c[i].load(Ordering::Relaxed)).sum())
    }
}

pub(crate) use by_protocol::{totals as protocol_totals, ProtocolCounts};
