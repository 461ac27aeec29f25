use std::sync::Arc;
use std::time::Duration;

use super::SmoothWeightedRoundRobin;
use crate::backend::Backend;

/// How often the weights are recomputed from the latest reports.
pub(crate) const REWEIGH_EVERY: Duration = Duration::from_secs(1);

/// How far from the median of the reported weights one may be, either way.
const MAX_RATIO: f64 = 10.0;

/// The largest whole weight of the rotation: weights are relative, and a hundred steps
/// keep them to a percent with a short schedule.
const SCALE: f64 = 100.0;

/// Load reported by the backends (ORCA, as gRPC's and Envoy's client-side weighted
/// round robin): smooth weighted round robin whose weights are each backend's requests
/// per second ÷ its utilization — what it serves per unit of capacity it spends, so its
/// capacity — from its latest report no older than three minutes. A backend without a
/// fresh report (or whose report says nothing usable) gets the mean weight of the
/// others (per unit of configured weight); while no backend has reported, the configured weights rule (it is then
/// weighted round robin). The pool rebuilds the picker every [`REWEIGH_EVERY`], which
/// recomputes the weights.
///
/// Requests per second are the report's `rps_fractional`; without it, the rate of
/// requests fulcrum sent the backend since the picker before this one was built.
#[derive(Debug)]
pub struct ReportedLoad {
    rotation: SmoothWeightedRoundRobin,
    /// Each eligible backend's id, weight (relative, before rounding) and request count
    /// when this picker was built.
    weights: Box<[(u64, f64, u64)]>,
    /// When it was built ([`crate::backend::clock_ns`]).
    built_at: u64,
}

impl ReportedLoad {
    /// Over `eligible` at `now`, going on from `previous` (its request counts give the
    /// rates of backends whose reports have none).
    pub(crate) fn new(
        eligible: &[Arc<Backend>],
        now: u64,
        previous: Option<&ReportedLoad>,
    ) -> Self {
        let raw = weights(eligible, now, previous);
        let max = raw.iter().copied().fold(0.0, f64::max);
        let whole: Vec<u32> = raw
            .iter()
            .map(|w| ((w / max * SCALE).round() as u32).max(1))
            .collect();
        ReportedLoad {
            // Rebuilt every second: started anywhere, or the first backends of a pool
            // with few requests per second would get more than their share.
            rotation: SmoothWeightedRoundRobin::new(&whole).starting_anywhere(),
            weights: (eligible.iter().zip(&raw))
                .map(|(b, &w)| (b.id, w, b.requests()))
                .collect(),
            built_at: now,
        }
    }

    /// The next index (the pool must not be empty).
    #[inline]
    pub(crate) fn pick(&self) -> usize {
        self.rotation.pick()
    }

    /// The index the next pick takes, without taking it.
    pub(crate) fn peek(&self) -> usize {
        self.rotation.peek()
    }

    /// The weight of the backend `id` in this rotation (relative), if it is in it.
    pub(crate) fn weight_of(&self, id: u64) -> Option<f64> {
        self.weights.iter().find(|w| w.0 == id).map(|w| w.1)
    }

    /// Whether the weights are due to be recomputed at `now`.
    pub(crate) fn is_due(&self, now: u64) -> bool {
        now.saturating_sub(self.built_at) >= REWEIGH_EVERY.as_nanos() as u64
    }
}

/// Each eligible backend's weight at `now`: requests per second ÷ utilization from a
/// fresh report, else the mean of those per unit of configured weight times its own,
/// then times its slow-start share; its effective weight (configured, slow start
/// applied) when no backend has a usable report.
fn weights(eligible: &[Arc<Backend>], now: u64, previous: Option<&ReportedLoad>) -> Vec<f64> {
    let measured = |b: &Backend| -> Option<f64> {
        let p = previous?;
        let &(_, _, count) = p.weights.iter().find(|w| w.0 == b.id)?;
        let secs = now.saturating_sub(p.built_at) as f64 / 1e9;
        (secs > 0.0).then(|| b.requests().saturating_sub(count) as f64 / secs)
    };
    let own: Vec<Option<f64>> = eligible
        .iter()
        .map(|b| {
            let r = b.load_report(now)?;
            let rps = r.rps.or_else(|| measured(b))?;
            let u = r.utilization?;
            Some(rps / u).filter(|w| u > 0.0 && rps > 0.0 && w.is_finite())
        })
        .collect();
    // A backend cannot take the pool by what it says of itself: a weight is kept within
    // [`MAX_RATIO`] of the reporting backends' median either way (the median, as one
    // outlandish report would move a mean).
    let mut known: Vec<f64> = own.iter().flatten().copied().collect();
    known.sort_by(f64::total_cmp);
    let own: Vec<Option<f64>> = match known.get(known.len().saturating_sub(1) / 2) {
        None => own,
        Some(&median) => {
            let (lo, hi) = (median / MAX_RATIO, median * MAX_RATIO);
            own.into_iter()
                .map(|w| w.map(|w| w.clamp(lo, hi)))
                .collect()
        }
    };
    // The mean per unit of configured weight: with the default weights all 1, the mean
    // weight; in a pool weighted 1 : 2 : 4, a backend that has not reported yet is not
    // sent twice what it can take while the others' reports come first.
    let per_unit: Vec<f64> = (own.iter().zip(eligible))
        .filter_map(|(w, b)| Some(w.as_ref()? / f64::from(b.control.weight().max(1))))
        .collect();
    if per_unit.is_empty() {
        return eligible.iter().map(|b| b.effective_weight()).collect();
    }
    let mean = per_unit.iter().sum::<f64>() / per_unit.len() as f64;
    (own.into_iter().zip(eligible))
        .map(|(w, b)| w.unwrap_or(mean * f64::from(b.control.weight().max(1))) * b.ramp_fraction())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::backend::clock_ns;

    #[test]
    fn weights_follow_rps_over_utilization_and_the_unreported_get_the_mean() {
        let bs = backends(&[1, 1, 1, 1]);
        bs[0].note_load_report(b"TEXT cpu_utilization=0.8, rps_fractional=100");
        bs[1].note_load_report(b"TEXT cpu_utilization=0.4, rps_fractional=100");
        bs[2].note_load_report(
            b"TEXT application_utilization=0.2, cpu_utilization=0.9, rps_fractional=100",
        );
        let w = weights(&bs, clock_ns(), None);
        assert_eq!(&w[..3], &[125.0, 250.0, 500.0]);
        assert!((w[3] - 875.0 / 3.0).abs() < 1e-9, "{w:?}");
        // Weighted 1 : 2 : 4, the two larger reporting what they can take: the one that
        // has not reported gets the mean per unit of weight, not the mean.
        // A backend that says it idles at any rate gets ten times the mean, not the pool.
        let bs = backends(&[1, 1, 1]);
        bs[0].note_load_report(b"TEXT cpu_utilization=0.000001, rps_fractional=100");
        bs[1].note_load_report(b"TEXT cpu_utilization=0.5, rps_fractional=100");
        bs[2].note_load_report(b"TEXT cpu_utilization=0.5, rps_fractional=1e308");
        let w = weights(&bs, clock_ns(), None);
        assert!(w.iter().all(|w| w.is_finite()), "{w:?}");
        assert!(w[0] <= 10.0 * (w[0] + w[1] + w[2]) / 3.0 + 1e-6, "{w:?}");
        let bs = backends(&[1, 2, 4]);
        bs[1].note_load_report(b"TEXT cpu_utilization=0.5, rps_fractional=100");
        bs[2].note_load_report(b"TEXT cpu_utilization=0.5, rps_fractional=200");
        assert_eq!(weights(&bs, clock_ns(), None), vec![100.0, 200.0, 400.0]);
        let p = ReportedLoad::new(&bs, clock_ns(), None);
        let mut counts = [0usize; 4];
        for _ in 0..1000 {
            counts[p.pick()] += 1;
        }
        let ratio = counts[1] as f64 / counts[0] as f64;
        assert!((1.9..2.1).contains(&ratio), "{counts:?}");
    }

    #[test]
    fn until_a_backend_reports_the_configured_weights_rule() {
        let bs = backends(&[1, 5, 2]);
        assert_eq!(weights(&bs, clock_ns(), None), vec![1.0, 5.0, 2.0]);
        let p = ReportedLoad::new(&bs, clock_ns(), None);
        let mut counts = [0usize; 3];
        for _ in 0..800 {
            counts[p.pick()] += 1;
        }
        assert_eq!(counts, [100, 500, 200]);
        assert!(!p.is_due(clock_ns()));
    }
}
