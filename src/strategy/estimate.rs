//! The latency estimates of the latency-aware strategies, kept on every backend.
//!
//! Every completed request's latency sample is folded into each estimate, whatever the
//! strategy, so a switch finds them up to date (as tower's `PeakEwma` wraps each
//! endpoint and the balancer only compares). The backend stores the cells
//! ([`Estimates`](crate::backend::Estimates)); which cell is whose, and each rule and its
//! constants, live with the strategy that reads it: `least_time.rs` (the route EWMA) and
//! `p2c.rs` (peak EWMA). A new estimate takes a cell here and its rule in its strategy's
//! file.

use std::time::Duration;

use crate::backend::{clock_ns, Backend, ESTIMATE_CELLS};

/// `least_response_time`'s EWMA.
pub(crate) const ROUTE_EWMA: usize = 0;
/// `peak_ewma`'s estimate.
pub(crate) const PEAK: usize = 1;
const _: () = assert!(ROUTE_EWMA < ESTIMATE_CELLS && PEAK < ESTIMATE_CELLS);

/// Folds one latency sample into the backend's average and into every strategy's
/// estimate, and tells the strategy's index.
pub fn record_latency(b: &Backend, sample: Duration) {
    record_latency_at(b, sample, clock_ns());
}

/// [`record_latency`] at `now` ([`clock_ns`]).
pub(crate) fn record_latency_at(b: &Backend, sample: Duration, now: u64) {
    let elapsed = b.note_latency(sample, now);
    let x = sample.as_nanos() as f64;
    super::least_time::fold(b, x, elapsed);
    super::p2c::fold_peak(b, x, elapsed);
    b.refresh_index();
}

/// `v` faded by `exp(-elapsed / tau)`.
#[inline]
pub(crate) fn fade(v: f64, elapsed_ns: u64, tau: Duration) -> f64 {
    if elapsed_ns == 0 {
        return v;
    }
    v * (-(elapsed_ns as f64) / tau.as_nanos() as f64).exp()
}

/// How long nothing has been measured on a backend with `in_flight` requests: zero
/// while it has requests in flight (it is getting traffic; a backend that hangs must
/// not look cheaper by the second), else the time since its last sample.
#[inline]
pub(crate) fn idle_ns(b: &Backend, now: u64, in_flight: u64) -> u64 {
    if in_flight > 0 {
        return 0;
    }
    b.sampled_at().map_or(0, |t| now.saturating_sub(t))
}
