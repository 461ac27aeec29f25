use std::sync::Arc;

use std::time::Duration;

use super::estimate::{fade, idle_ns, PEAK};
use super::ramp::Ramp;
use super::PickCtx;
use crate::backend::{clock_ns, Backend};

/// `peak_ewma`: time constant of the decay, both of old samples against new ones and of
/// the estimate of an idle backend (linkerd's and finagle's 10 s).
pub(crate) const PEAK_DECAY: Duration = Duration::from_secs(10);
/// `peak_ewma`: what a backend without a sample is taken to cost per request while its
/// first answer is awaited (finagle's rule: free while idle, expensive while unknown).
pub(crate) const PEAK_UNSAMPLED_PENALTY: Duration = Duration::from_secs(1);

/// Folds a sample of `x` ns, `elapsed` after the previous one, into the peak-EWMA
/// estimate: a sample above the estimate replaces it at once (the peak); a lower one
/// pulls it down with a weight that grows with the time since the last sample.
pub(crate) fn fold_peak(b: &Backend, x: f64, elapsed: Option<u64>) {
    let keep = (-(elapsed.unwrap_or(0) as f64) / PEAK_DECAY.as_nanos() as f64).exp();
    b.estimates().update(PEAK, |prev| match prev {
        Some(c) if x <= c => c * keep + x * (1.0 - keep),
        _ => x,
    });
}

/// The `peak_ewma` cost at `now`: the peak-EWMA latency (faded toward zero with
/// [`PEAK_DECAY`] while nothing is in flight) × (in flight + 1). Unsampled, it is 0
/// while idle and [`PEAK_UNSAMPLED_PENALTY`] × (in flight + 1) while its first answer
/// is awaited.
#[inline]
pub(crate) fn peak_cost(b: &Backend, now: u64, in_flight: u64) -> f64 {
    let estimate = match b.estimates().get(PEAK) {
        None if in_flight == 0 => 0.0,
        None => PEAK_UNSAMPLED_PENALTY.as_nanos() as f64,
        Some(c) => fade(c, idle_ns(b, now, in_flight), PEAK_DECAY),
    };
    estimate * (in_flight + 1) as f64
}

/// The raw peak-EWMA estimate, `None` until the first sample.
#[cfg(test)]
fn peak_latency(b: &Backend) -> Option<Duration> {
    b.estimates()
        .get(PEAK)
        .map(|c| Duration::from_nanos(c as u64))
}

/// Two distinct random indices among the eligible backends `ctx` allows, uniformly
/// (`fastrand`, thread-local); one when only one is allowed, none when none is.
#[inline]
pub(crate) fn pair(eligible: &[Arc<Backend>], ctx: &PickCtx<'_>) -> Option<(usize, Option<usize>)> {
    if ctx.tried.is_empty() {
        let n = eligible.len();
        return match n {
            0 => None,
            1 => Some((0, None)),
            _ => {
                let a = fastrand::usize(..n);
                let mut b = fastrand::usize(..n - 1);
                if b >= a {
                    b += 1;
                }
                Some((a, Some(b)))
            }
        };
    }
    // A retry (rare): draw among the backends not tried yet.
    let allowed: Vec<usize> = (0..eligible.len())
        .filter(|&i| ctx.allows(&eligible[i]))
        .collect();
    match allowed.len() {
        0 => None,
        1 => Some((allowed[0], None)),
        n => {
            let a = fastrand::usize(..n);
            let mut b = fastrand::usize(..n - 1);
            if b >= a {
                b += 1;
            }
            Some((allowed[a], Some(allowed[b])))
        }
    }
}

/// `power_of_two`: two random eligible backends, fewer in flight wins (Envoy's
/// `LEAST_REQUEST` with two choices); a tie goes to the first drawn, so idle pools
/// spread evenly. The bet: the shorter queue of two random ones is nearly as good as the
/// shortest of all (Mitzenmacher's power of two choices), at O(1) and without every
/// worker herding onto the same least-loaded backend. Weights are not used; while slow
/// start ramps a backend, loads compare as (in flight + 1) ÷ share ([`Ramp`]).
#[derive(Debug, Default)]
pub struct PowerOfTwo {
    ramp: Option<Ramp>,
}

impl PowerOfTwo {
    /// Over `eligible`, with the ramp of any backend slow start ramps.
    pub(crate) fn new(eligible: &[Arc<Backend>]) -> Self {
        PowerOfTwo {
            ramp: Ramp::of(eligible),
        }
    }

    /// O(1): two random draws, two loads.
    #[inline]
    pub(crate) fn pick(&self, eligible: &[Arc<Backend>], ctx: &PickCtx<'_>) -> Option<usize> {
        let (a, b) = pair(eligible, ctx)?;
        let Some(b) = b else { return Some(a) };
        let wins = match &self.ramp {
            None => eligible[b].in_flight() < eligible[a].in_flight(),
            Some(r) => {
                let load = |i: usize| r.scale(i, (eligible[i].in_flight() + 1) as f64);
                load(b) < load(a)
            }
        };
        Some(if wins { b } else { a })
    }
}

/// `peak_ewma`: two random eligible backends, the lower [`peak_cost`] wins
/// (linkerd's and finagle's balancer); a tie goes to the first drawn. The bet: latency
/// spikes announce trouble, so an estimate that jumps to every peak at once and forgets
/// it slowly (τ = 10 s) routes around a backend as soon as it falters, and the pending
/// count makes the estimate a queueing cost. While slow start ramps a backend, its cost
/// is divided by its share ([`Ramp`]).
#[derive(Debug, Default)]
pub struct PeakEwma {
    ramp: Option<Ramp>,
}

impl PeakEwma {
    /// Over `eligible`, with the ramp of any backend slow start ramps.
    pub(crate) fn new(eligible: &[Arc<Backend>]) -> Self {
        PeakEwma {
            ramp: Ramp::of(eligible),
        }
    }

    /// O(1): two random draws, one clock read, two estimates.
    #[inline]
    pub(crate) fn pick(&self, eligible: &[Arc<Backend>], ctx: &PickCtx<'_>) -> Option<usize> {
        self.pick_at(eligible, ctx, clock_ns())
    }

    /// Picks as at `now` ([`clock_ns`]).
    #[inline]
    pub(crate) fn pick_at(
        &self,
        eligible: &[Arc<Backend>],
        ctx: &PickCtx<'_>,
        now: u64,
    ) -> Option<usize> {
        let (a, b) = pair(eligible, ctx)?;
        let Some(b) = b else { return Some(a) };
        let cost = |i: usize| {
            let be = &eligible[i];
            let c = peak_cost(be, now, be.in_flight());
            self.ramp.as_ref().map_or(c, |r| r.scale(i, c))
        };
        Some(if cost(b) < cost(a) { b } else { a })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::*;
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    #[test]
    fn pairs_are_distinct_and_cover_every_backend() {
        let bs = backends(&[1, 1, 1, 1]);
        let mut seen = [0usize; 4];
        for _ in 0..4000 {
            let (a, b) = pair(&bs, &PickCtx::default()).unwrap();
            let b = b.unwrap();
            assert_ne!(a, b);
            seen[a] += 1;
            seen[b] += 1;
        }
        for n in seen {
            assert!((1700..=2300).contains(&n), "{seen:?}");
        }
        let one = backends(&[1]);
        assert_eq!(pair(&one, &PickCtx::default()), Some((0, None)));
        assert_eq!(pair(&[], &PickCtx::default()), None);
    }

    #[test]
    fn fewer_in_flight_wins() {
        let bs = backends(&[1, 1]);
        let _g: Vec<_> = (0..3).map(|_| bs[0].begin_request()).collect();
        let p = Picker::build(StrategyKind::PowerOfTwo, &bs);
        assert_eq!(sequence(&p, &bs, 20), "B".repeat(20));
    }

    #[test]
    fn peak_ewma_jumps_to_peaks_and_decays_slowly() {
        let bs = backends(&[1, 1]);
        let s = 1_000_000_000u64;
        let t = 100 * s;
        // Unsampled and idle: free; unsampled and waiting: a penalty.
        assert_eq!(peak_cost(&bs[0], t, 0), 0.0);
        assert!(peak_cost(&bs[0], t, 1) >= 1e9);
        super::super::record_latency_at(&bs[0], Duration::from_millis(10), t);
        super::super::record_latency_at(&bs[0], Duration::from_millis(100), t + s / 100);
        assert_eq!(
            peak_latency(&bs[0]),
            Some(Duration::from_millis(100)),
            "peak"
        );
        // A lower sample 1 s later pulls it down by 1 - e^(-1/10) of the way only.
        super::super::record_latency_at(&bs[0], Duration::from_millis(10), t + s + s / 100);
        let ms = peak_latency(&bs[0]).unwrap().as_secs_f64() * 1e3;
        let expect = 100.0 * (-0.1f64).exp() + 10.0 * (1.0 - (-0.1f64).exp());
        assert!((ms - expect).abs() < 0.01, "{ms} vs {expect}");
        // Cost = estimate × (pending + 1); idle, it fades with τ = 10 s.
        let now = t + s + s / 100;
        let c1 = peak_cost(&bs[0], now, 1);
        assert!((c1 / 1e6 - 2.0 * expect).abs() < 0.01);
        let c0 = peak_cost(&bs[0], now + 10 * s, 0);
        assert!(
            (c0 / 1e6 - expect / std::f64::consts::E).abs() < 0.01,
            "{c0}"
        );
        // B (unsampled, idle) beats A.
        let p = PeakEwma::new(&bs)
            .pick_at(&bs, &PickCtx::default(), now)
            .unwrap();
        assert_eq!(p, 1);
    }

    proptest! {
        /// Whatever the pool's states and the retry's history, P2C picks an eligible
        /// backend that was not tried, and picks one whenever one is left.
        #[test]
        fn p2c_never_picks_an_ineligible_or_tried_backend(
            flags in proptest::collection::vec((any::<bool>(), 0u8..3, any::<bool>()), 1..12),
            tried_mask in any::<u16>(),
            peak in any::<bool>(),
        ) {
            use crate::pool::{AdminState, Pool};
            let specs = (0..flags.len())
                .map(|i| crate::config::backend_spec(&format!("http://127.0.0.1:{}", 3000 + i), None, None).unwrap())
                .collect();
            let kind = if peak { StrategyKind::PeakEwma } else { StrategyKind::PowerOfTwo };
            let pool = Pool::of_backends(specs, kind);
            for (i, (healthy, state, busy)) in flags.iter().enumerate() {
                let st = [AdminState::Active, AdminState::Draining, AdminState::Maintenance][*state as usize];
                pool.update(i as u64, None, Some(st), None).unwrap();
                pool.mark_health(i as u64, *healthy);
                if *busy {
                    std::mem::forget(pool.get(i as u64).unwrap().begin_request());
                }
            }
            let tried: Vec<u64> = (0..flags.len() as u64).filter(|i| tried_mask & (1 << i) != 0).collect();
            let ok: Vec<u64> = pool.backends().iter().filter(|b| b.eligible() && !tried.contains(&b.id)).map(|b| b.id).collect();
            for _ in 0..50 {
                let snap = pool.snapshot();
                let got = snap.pick(&PickCtx { tried: &tried, key: None }).map(|b| b.id);
                match got {
                    Some(id) => prop_assert!(ok.contains(&id), "picked {} of {:?}", id, ok),
                    None => prop_assert!(ok.is_empty()),
                }
            }
        }
    }
}
