use std::sync::Arc;

use super::PickCtx;
use crate::pool::{clock_ns, Backend};

/// Lowest latency average × (in flight + 1); ties to the lowest index. The bet: the
/// backend that answered fastest lately, discounted by the queue it already has, will
/// answer this request fastest.
///
/// Rules, in order:
/// 1. A backend without a sample comes first (its latency is unknown, so it is measured
///    before anything is concluded): among those, fewest in flight, then lowest index.
/// 2. Otherwise the lowest [`Backend::lrt_estimate`] × (in flight + 1).
///
/// Re-discovery. A backend that was slow loses its traffic, so nothing would ever feed
/// its average again. Two rules on the backend bring it back with nobody acting: while
/// it has nothing in flight its average, as a pick sees it, fades toward zero (×1/e per
/// second idle), so after a few seconds one request goes to it; and that request's
/// sample, coming after more than a second without one, seeds its average afresh instead
/// of being averaged with the stale value. If it is fast again it takes its share at
/// once; if not, it is avoided for another few seconds. A backend with requests in
/// flight never fades: one that hangs keeps looking as slow as it was.
///
/// O(n) per pick: one scan with an `exp` per idle backend; it stops at the first
/// unsampled idle backend.
#[derive(Debug, Default)]
pub struct LeastResponseTime;

impl LeastResponseTime {
    /// Picks at the current time.
    #[inline]
    pub fn pick(eligible: &[Arc<Backend>], ctx: &PickCtx<'_>) -> Option<usize> {
        Self::pick_at(eligible, ctx, clock_ns())
    }

    /// Picks as at `now` ([`clock_ns`]).
    pub fn pick_at(eligible: &[Arc<Backend>], ctx: &PickCtx<'_>, now: u64) -> Option<usize> {
        let mut unsampled: Option<(usize, u64)> = None;
        let mut sampled: Option<(usize, f64)> = None;
        for (i, b) in eligible.iter().enumerate() {
            if !ctx.allows(b) {
                continue;
            }
            let k = b.in_flight();
            match b.lrt_estimate(now, k) {
                None => {
                    if k == 0 {
                        return Some(i);
                    }
                    if unsampled.is_none_or(|(_, uk)| k < uk) {
                        unsampled = Some((i, k));
                    }
                }
                Some(avg) if unsampled.is_none() => {
                    let score = avg * (k + 1) as f64;
                    if sampled.is_none_or(|(_, s)| score < s) {
                        sampled = Some((i, score));
                    }
                }
                Some(_) => {}
            }
        }
        unsampled.map(|(i, _)| i).or(sampled.map(|(i, _)| i))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::*;
    use super::*;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    fn pick(bs: &[Arc<Backend>], now: u64) -> char {
        let i = LeastResponseTime::pick_at(bs, &PickCtx::default(), now).unwrap();
        bs[i].name.chars().next().unwrap()
    }

    #[test]
    fn unsampled_first_then_latency_times_queue() {
        let bs = backends(&[1, 1, 1]);
        let t = 10_000 * MS;
        assert_eq!(pick(&bs, t), 'A');
        bs[0].record_latency_at(Duration::from_millis(30), t);
        assert_eq!(pick(&bs, t), 'B');
        // An unsampled backend with a request in flight still comes first.
        let _b = bs[1].begin_request();
        let _c = bs[2].begin_request();
        assert_eq!(
            pick(&bs, t),
            'B',
            "fewest in flight among the unsampled, then index"
        );
        drop(_b);
        drop(_c);
        bs[1].record_latency_at(Duration::from_millis(10), t);
        bs[2].record_latency_at(Duration::from_millis(20), t);
        // 30, 10, 20 ms
        assert_eq!(pick(&bs, t), 'B');
        let _b1 = bs[1].begin_request();
        // 30, 10×2, 20 → B 20 = C 20: tie to the lower index
        assert_eq!(pick(&bs, t), 'B');
        let _b2 = bs[1].begin_request();
        // 30, 30, 20
        assert_eq!(pick(&bs, t), 'C');
    }

    #[test]
    fn the_average_is_the_ewma_with_alpha() {
        let bs = backends(&[1]);
        let t = 10_000 * MS;
        bs[0].record_latency_at(Duration::from_millis(100), t);
        bs[0].record_latency_at(Duration::from_millis(200), t + MS);
        // alpha 0.1: 100 + 0.1 × 100
        let est = bs[0].lrt_estimate(t + MS, 1).unwrap();
        assert!((est - 110.0 * MS as f64).abs() < 1.0, "{est}");
        assert_eq!(bs[0].avg_latency(), Some(Duration::from_millis(110)));
    }

    /// A backend that was slow and is fast again gets traffic back within a few
    /// seconds, with nobody touching the pool.
    #[test]
    fn a_recovered_backend_is_found_again() {
        let bs = backends(&[1, 1, 1]);
        let mut t = 10_000 * MS;
        let step = 5 * MS;
        // A and B answer in 10 ms, C has turned slow: 100 ms.
        for b in &bs[..2] {
            b.record_latency_at(Duration::from_millis(10), t);
        }
        for _ in 0..20 {
            bs[2].record_latency_at(Duration::from_millis(100), t);
        }
        // C is fast again from now on. Traffic: one request every 5 ms, answered at once.
        let mut first_c = None;
        let mut c_picks = 0;
        for n in 0..2000u64 {
            t += step;
            let i = LeastResponseTime::pick_at(&bs, &PickCtx::default(), t).unwrap();
            if i == 2 {
                c_picks += 1;
                first_c.get_or_insert(n * step);
            }
            bs[i].record_latency_at(Duration::from_millis(10), t);
        }
        let first = Duration::from_nanos(first_c.expect("C is never tried again"));
        assert!(
            first < Duration::from_secs(4),
            "first pick of C after {first:?}"
        );
        // Once measured fast, C takes a real share, not one probe now and then.
        assert!(c_picks > 100, "{c_picks} of 2000 picks");
    }

    #[test]
    fn a_slow_backend_is_probed_seldom_and_a_busy_one_never_fades() {
        let bs = backends(&[1, 1]);
        let t = 10_000 * MS;
        bs[0].record_latency_at(Duration::from_millis(10), t);
        bs[1].record_latency_at(Duration::from_millis(100), t);
        // Fresh samples on A keep it current; B fades: 100 ms × e^(-idle/1 s) < 10 ms
        // only after ln 10 ≈ 2.3 s.
        let mut probes = Vec::new();
        for n in 1..=1000u64 {
            let now = t + n * 5 * MS;
            let i = LeastResponseTime::pick_at(&bs, &PickCtx::default(), now).unwrap();
            bs[i].record_latency_at(Duration::from_millis(if i == 0 { 10 } else { 100 }), now);
            if i == 1 {
                probes.push(n * 5);
            }
        }
        assert!(!probes.is_empty() && probes.len() <= 3, "{probes:?} ms");
        assert!(probes[0] >= 2000, "{probes:?}");
        // With a request in flight (it hangs) it never looks cheaper.
        let _g = bs[1].begin_request();
        let est = bs[1].lrt_estimate(t + 3_600_000 * MS, 1).unwrap();
        assert!(est >= 100.0 * MS as f64, "{est}");
    }
}
