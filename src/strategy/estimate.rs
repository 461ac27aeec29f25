//! The latency estimates of the latency-aware strategies, kept on every backend.
//!
//! Every completed request's latency sample is folded into each estimate, whatever the
//! strategy ([`record_latency`](super::record_latency)), so a switch finds them up to
//! date (as tower's `PeakEwma` wraps each endpoint and the balancer only compares). The
//! backend stores the cells ([`Estimates`](crate::backend::Estimates)); which cell is
//! whose and what every reader shares live here; each rule and its constants live with
//! the strategy that folds and reads it: `least_time.rs` (the route EWMA) and `p2c.rs`
//! (peak EWMA). A new estimate takes a cell here, its rule in its strategy's file and
//! one line in `record_latency`.

use std::time::Duration;

use crate::backend::{Backend, ESTIMATE_CELLS};

/// `least_response_time`'s EWMA.
pub(crate) const ROUTE_EWMA: usize = 0;
/// `peak_ewma`'s estimate.
pub(crate) const PEAK: usize = 1;
const _: () = assert!(ROUTE_EWMA < ESTIMATE_CELLS && PEAK < ESTIMATE_CELLS);

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

/// Time constant with which the route EWMA of a backend that has nothing in flight
/// fades toward zero as seen by a pick (×1/e per second idle).
pub(crate) const FADE: Duration = Duration::from_secs(1);

/// The route EWMA as an index ranks it: the average believed (before any fading) and
/// when it was last sampled; `None` when unsampled.
#[inline]
pub(crate) fn route_sample(b: &Backend) -> Option<(f64, u64)> {
    let avg = b.estimates().get(ROUTE_EWMA)?;
    Some((avg, b.sampled_at().unwrap_or(0)))
}
