use std::sync::Arc;
use std::time::Duration;

use super::estimate::{fade, idle_ns, FADE, ROUTE_EWMA};
use super::load_index::Key;
use super::ramp::{lowest, Ramp};
use super::{LoadIndex, PickCtx};
use crate::backend::{clock_ns, Backend};

/// How often the pool rebuilds a `least_response_time` index (see [`Key::Idle`]).
pub(crate) const RENEW_AFTER: Duration = Duration::from_secs(60);
/// `least_response_time` does not believe an average that no sample has fed for this
/// long: the next sample seeds it again, as the first one did.
pub(crate) const QUIET: Duration = Duration::from_secs(1);

/// Folds a sample of `x` ns, `elapsed` after the previous one, into the route EWMA: the
/// backend's EWMA weight, seeded again by the first sample after [`QUIET`] without one.
pub(crate) fn fold(b: &Backend, x: f64, elapsed: Option<u64>) {
    let quiet = elapsed.is_none_or(|e| e >= QUIET.as_nanos() as u64);
    let alpha = b.alpha();
    b.estimates().update(ROUTE_EWMA, |prev| match prev {
        Some(prev) if !quiet => prev + alpha * (x - prev),
        _ => x,
    });
}

/// The latency `least_response_time` believes at `now`, in nanoseconds; `None` when
/// unsampled. It is the EWMA of the samples, started over after [`QUIET`] without one,
/// and, while the backend has nothing in flight, faded toward zero with [`FADE`]: a
/// backend that lost its traffic by being slow looks cheaper by the second until one
/// request goes to it, and that request's sample decides.
#[inline]
pub(crate) fn estimate(b: &Backend, now: u64, in_flight: u64) -> Option<f64> {
    let avg = b.estimates().get(ROUTE_EWMA)?;
    Some(fade(avg, idle_ns(b, now, in_flight), FADE))
}

/// Lowest latency average × (in flight + 1); ties to the lowest index. The bet: the
/// backend that answered fastest lately, discounted by the queue it already has, will
/// answer this request fastest.
///
/// Rules, in order:
/// 1. A backend without a sample comes first (its latency is unknown, so it is measured
///    before anything is concluded): among those, fewest in flight, then lowest index.
/// 2. Otherwise the lowest [`estimate`] × (in flight + 1).
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
/// Below [`super::load_index::MIN_INDEXED`] backends, one O(n) scan per pick with an
/// `exp` per idle backend; it stops at the first unsampled idle backend. From there up,
/// three [`LoadIndex`] trees, one per group of rule 1 and 2 — unsampled, sampled with
/// requests in flight, sampled idle — kept current by the backends as requests start
/// and end and samples arrive; a pick compares at most two roots. Idle backends all fade
/// by the same factor, so their order holds between events (see [`Key::Idle`]).
///
/// While slow start ramps a backend, the picker has a [`Ramp`] instead of indexes and
/// scans ([`Self::ramped`]).
#[derive(Debug, Default)]
pub struct LeastResponseTime {
    index: Option<Arc<[LoadIndex]>>,
    base: u64,
    ramp: Option<Ramp>,
}

impl LeastResponseTime {
    /// Over `eligible` (pool order), indexed when the pool is large.
    pub(crate) fn new(eligible: &[Arc<Backend>]) -> Self {
        Self::new_at(eligible, clock_ns())
    }

    /// As [`Self::new`], built at `base` ([`clock_ns`] time).
    pub(crate) fn new_at(eligible: &[Arc<Backend>], base: u64) -> Self {
        if let Some(ramp) = Ramp::of(eligible) {
            return LeastResponseTime {
                index: None,
                base,
                ramp: Some(ramp),
            };
        }
        let trees: Option<Vec<LoadIndex>> = [Key::Unsampled, Key::Busy, Key::Idle { base }]
            .into_iter()
            .map(|k| LoadIndex::new(eligible, k))
            .collect();
        LeastResponseTime {
            index: trees.map(Arc::from),
            base,
            ramp: None,
        }
    }

    /// Its indexes, if the pool is large enough to have them.
    pub(crate) fn index(&self) -> Option<&Arc<[LoadIndex]>> {
        self.index.as_ref()
    }

    /// Whether the pool should rebuild it to keep the idle keys precise.
    pub(crate) fn index_is_old(&self, now: u64) -> bool {
        self.index.is_some() && now.saturating_sub(self.base) > RENEW_AFTER.as_nanos() as u64
    }

    /// Picks at the current time.
    #[inline]
    pub(crate) fn pick(&self, eligible: &[Arc<Backend>], ctx: &PickCtx<'_>) -> Option<usize> {
        self.pick_at(eligible, ctx, clock_ns())
    }

    /// Picks as at `now` ([`clock_ns`]): from the indexes for a first pick while they are
    /// fresh (a retry, or an index the pool failed to renew for four periods, scans).
    pub(crate) fn pick_at(
        &self,
        eligible: &[Arc<Backend>],
        ctx: &PickCtx<'_>,
        now: u64,
    ) -> Option<usize> {
        if let Some(ramp) = &self.ramp {
            return Self::ramped(eligible, ctx, now, ramp);
        }
        if let Some(trees) = &self.index {
            let fresh = now.saturating_sub(self.base) <= 4 * RENEW_AFTER.as_nanos() as u64;
            if ctx.tried.is_empty() && fresh {
                if let Some(i) = Self::from_index(trees, eligible, now) {
                    return Some(i);
                }
            }
        }
        Self::scan(eligible, ctx, now)
    }

    /// Rule 1 from the unsampled tree's root; else the lower of the busy root's and the
    /// idle root's estimates at `now`, ties to the lower index.
    fn from_index(trees: &[LoadIndex], eligible: &[Arc<Backend>], now: u64) -> Option<usize> {
        let valid = |i: Option<usize>| i.filter(|&i| i < eligible.len());
        if let Some(u) = valid(trees[0].least()) {
            return Some(u);
        }
        let score = |i: usize| {
            let k = eligible[i].in_flight();
            estimate(&eligible[i], now, k).map(|avg| avg * (k + 1) as f64)
        };
        let busy = valid(trees[1].least()).and_then(|i| Some((i, score(i)?)));
        let idle = valid(trees[2].least()).and_then(|i| Some((i, score(i)?)));
        match (busy, idle) {
            (Some((b, sb)), Some((i, si))) => {
                Some(if si < sb || (si == sb && i < b) { i } else { b })
            }
            (Some((b, _)), None) => Some(b),
            (None, Some((i, _))) => Some(i),
            (None, None) => None,
        }
    }

    /// The rules while a ramp runs, by one scan: a ramping backend's score is divided by
    /// its share, and rule 1 gives a ramping backend without a sample one request (its
    /// probe) — until that answers it waits, so a cold backend is not handed every request
    /// that arrives while its first one is slow.
    fn ramped(
        eligible: &[Arc<Backend>],
        ctx: &PickCtx<'_>,
        now: u64,
        ramp: &Ramp,
    ) -> Option<usize> {
        lowest(
            eligible.len(),
            |i| ctx.allows(&eligible[i]),
            |i| {
                let k = eligible[i].in_flight();
                match estimate(&eligible[i], now, k) {
                    None if k == 0 || ramp.share(i) == 1.0 => (0u8, k as f64),
                    None => (2, k as f64),
                    Some(avg) => (1, ramp.scale(i, avg * (k + 1) as f64)),
                }
            },
        )
    }

    /// The rules by one scan over `eligible` (O(n)).
    pub(crate) fn scan(eligible: &[Arc<Backend>], ctx: &PickCtx<'_>, now: u64) -> Option<usize> {
        let mut unsampled: Option<(usize, u64)> = None;
        let mut sampled: Option<(usize, f64)> = None;
        for (i, b) in eligible.iter().enumerate() {
            if !ctx.allows(b) {
                continue;
            }
            let k = b.in_flight();
            match estimate(b, now, k) {
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
        let i = LeastResponseTime::scan(bs, &PickCtx::default(), now).unwrap();
        bs[i].name.chars().next().unwrap()
    }

    #[test]
    fn unsampled_first_then_latency_times_queue() {
        let bs = backends(&[1, 1, 1]);
        let t = 10_000 * MS;
        assert_eq!(pick(&bs, t), 'A');
        super::super::record_latency_at(&bs[0], Duration::from_millis(30), t);
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
        super::super::record_latency_at(&bs[1], Duration::from_millis(10), t);
        super::super::record_latency_at(&bs[2], Duration::from_millis(20), t);
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
    fn a_large_pool_asks_to_have_its_index_renewed_every_minute() {
        let base = 10_000 * MS;
        let big = backends(&vec![1; super::super::load_index::MIN_INDEXED]);
        let p = LeastResponseTime::new_at(&big, base);
        assert!(p.index().is_some());
        assert!(!p.index_is_old(base + 59_000 * MS));
        assert!(p.index_is_old(base + 61_000 * MS));
        let small = LeastResponseTime::new_at(&backends(&[1, 1]), base);
        assert!(small.index().is_none() && !small.index_is_old(base + 3_600_000 * MS));
    }

    #[test]
    fn the_average_is_the_ewma_with_alpha() {
        let bs = backends(&[1]);
        let t = 10_000 * MS;
        super::super::record_latency_at(&bs[0], Duration::from_millis(100), t);
        super::super::record_latency_at(&bs[0], Duration::from_millis(200), t + MS);
        // alpha 0.1: 100 + 0.1 × 100
        let est = estimate(&bs[0], t + MS, 1).unwrap();
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
            super::super::record_latency_at(b, Duration::from_millis(10), t);
        }
        for _ in 0..20 {
            super::super::record_latency_at(&bs[2], Duration::from_millis(100), t);
        }
        // C is fast again from now on. Traffic: one request every 5 ms, answered at once.
        let mut first_c = None;
        let mut c_picks = 0;
        for n in 0..2000u64 {
            t += step;
            let i = LeastResponseTime::scan(&bs, &PickCtx::default(), t).unwrap();
            if i == 2 {
                c_picks += 1;
                first_c.get_or_insert(n * step);
            }
            super::super::record_latency_at(&bs[i], Duration::from_millis(10), t);
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
        super::super::record_latency_at(&bs[0], Duration::from_millis(10), t);
        super::super::record_latency_at(&bs[1], Duration::from_millis(100), t);
        // Fresh samples on A keep it current; B fades: 100 ms × e^(-idle/1 s) < 10 ms
        // only after ln 10 ≈ 2.3 s.
        let mut probes = Vec::new();
        for n in 1..=1000u64 {
            let now = t + n * 5 * MS;
            let i = LeastResponseTime::scan(&bs, &PickCtx::default(), now).unwrap();
            super::super::record_latency_at(
                &bs[i],
                Duration::from_millis(if i == 0 { 10 } else { 100 }),
                now,
            );
            if i == 1 {
                probes.push(n * 5);
            }
        }
        assert!(!probes.is_empty() && probes.len() <= 3, "{probes:?} ms");
        assert!(probes[0] >= 2000, "{probes:?}");
        // With a request in flight (it hangs) it never looks cheaper.
        let _g = bs[1].begin_request();
        let est = estimate(&bs[1], t + 3_600_000 * MS, 1).unwrap();
        assert!(est >= 100.0 * MS as f64, "{est}");
    }
}
