//! Slow start for the strategies that ignore weights.
//!
//! The weighted strategies ramp a joining or recovering backend through its effective
//! weight. Round robin, least connections, power of two, least response time and peak
//! EWMA have no weight to lower, so while a ramp runs their picker carries a [`Ramp`]: each
//! eligible backend's share of its full traffic (10 % → 100 % over `slow_start`), read
//! when the picker is built. The pool rebuilds the picker every 250 ms while a ramp runs
//! and once when it ends, so the shares follow the ramp with no clock read or lock per
//! pick, and a pool with nothing ramping has no `Ramp` at all (the pick path is the one
//! without slow start).
//!
//! How each family applies the share (`docs/operations.md`, "Slow start", has the
//! measured ramps):
//! - the ranking strategies divide a backend's load or cost by its share, so a backend at
//!   a tenth of its ramp looks ten times as busy: `(in flight + 1) ÷ share` for least
//!   connections and power of two, latency × (in flight + 1) ÷ share for least response
//!   time and peak EWMA. That is HAProxy's leastconn with `slowstart` (connections per
//!   unit of ramped weight) and Envoy's least request with `slow_start_config`;
//! - round robin rotates by weights proportional to the shares (smooth WRR), as Envoy's
//!   round robin does with slow start.

use std::sync::Arc;

use crate::backend::Backend;

/// Shares of their full traffic, per eligible backend, while at least one ramps.
#[derive(Debug)]
pub(crate) struct Ramp {
    shares: Box<[f64]>,
}

/// Whole weights the round-robin ramp rotates by: a backend at full share has this many.
pub(crate) const ROTATION_SCALE: f64 = 100.0;

impl Ramp {
    /// The shares of `eligible` now, or `None` when no backend ramps.
    pub(crate) fn of(eligible: &[Arc<Backend>]) -> Option<Ramp> {
        let shares: Box<[f64]> = eligible.iter().map(|b| b.ramp_fraction()).collect();
        shares.iter().any(|&s| s < 1.0).then_some(Ramp { shares })
    }

    /// The share of the backend at eligible index `i` (1 for one that does not ramp).
    #[inline]
    pub(crate) fn share(&self, i: usize) -> f64 {
        self.shares.get(i).copied().unwrap_or(1.0)
    }

    /// `cost` of the backend at `i` as the ramp sees it: divided by its share.
    #[inline]
    pub(crate) fn scale(&self, i: usize, cost: f64) -> f64 {
        cost / self.share(i)
    }

    /// The whole weights round robin rotates by while the ramp runs.
    pub(crate) fn rotation_weights(&self) -> Vec<u32> {
        self.shares
            .iter()
            .map(|s| ((s * ROTATION_SCALE).round() as u32).max(1))
            .collect()
    }
}

/// The candidate of a ranking pick with the lowest `score` among those `allows` admits,
/// ties to the lowest index; `None` when it admits none. The ramped scans share it.
#[inline]
pub(crate) fn lowest<S: PartialOrd>(
    n: usize,
    allows: impl Fn(usize) -> bool,
    score: impl Fn(usize) -> S,
) -> Option<usize> {
    let mut best: Option<(usize, S)> = None;
    for i in (0..n).filter(|&i| allows(i)) {
        let s = score(i);
        if best.as_ref().is_none_or(|(_, b)| s < *b) {
            best = Some((i, s));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn ramping(id: u64, since: Duration) -> Arc<Backend> {
        let spec = crate::config::backend_spec(&format!("http://127.0.0.1:{}", 1 + id), None, None)
            .unwrap();
        let b = Backend::new(id, spec, 0.1).with_slow_start(Duration::from_secs(10));
        b.start_ramp(Instant::now() - since);
        Arc::new(b)
    }

    #[test]
    fn no_ramp_without_a_ramping_backend() {
        let spec = crate::config::backend_spec("http://127.0.0.1:1", None, None).unwrap();
        let b = Arc::new(Backend::new(0, spec, 0.1));
        assert!(Ramp::of(&[b]).is_none());
    }

    #[test]
    fn a_ramping_backend_has_its_share_and_the_rest_all_of_theirs() {
        let spec = crate::config::backend_spec("http://127.0.0.1:9", None, None).unwrap();
        let full = Arc::new(Backend::new(9, spec, 0.1));
        let r = Ramp::of(&[ramping(0, Duration::from_secs(5)), full]).unwrap();
        assert!((r.share(0) - 0.55).abs() < 0.01, "{}", r.share(0));
        assert_eq!(r.share(1), 1.0);
        assert!((r.scale(0, 1.0) - 1.0 / 0.55).abs() < 0.05);
        let w = r.rotation_weights();
        assert!((54..=56).contains(&w[0]) && w[1] == 100, "{w:?}");
    }

    /// A, ramping at about a tenth of its share, and B at full share, both measured at
    /// 10 ms when `sampled`.
    fn a_ramping_and_b_full(sampled: bool) -> Vec<Arc<Backend>> {
        let spec = crate::config::backend_spec("http://127.0.0.1:9", None, Some("B")).unwrap();
        let a = {
            let spec = crate::config::backend_spec("http://127.0.0.1:8", None, Some("A")).unwrap();
            let b = Backend::new(0, spec, 0.1).with_slow_start(Duration::from_secs(1000));
            b.start_ramp(Instant::now());
            Arc::new(b)
        };
        let bs = vec![a, Arc::new(Backend::new(1, spec, 0.1))];
        if sampled {
            for b in &bs {
                crate::strategy::record_latency(b, Duration::from_millis(10));
            }
        }
        bs
    }

    #[test]
    fn every_strategy_without_weights_holds_a_ramping_backend_back() {
        use super::super::test_util::sequence;
        use super::super::{Picker, StrategyKind};
        for kind in [
            StrategyKind::LeastConnections,
            StrategyKind::PowerOfTwo,
            StrategyKind::LeastResponseTime,
            StrategyKind::PeakEwma,
        ] {
            let bs = a_ramping_and_b_full(true);
            let p = Picker::build(kind, &bs);
            assert_eq!(
                sequence(&p, &bs, 5),
                "BBBBB",
                "{kind:?}: idle, B is cheaper"
            );
            // Five in flight on B: (5 + 1) against A's (0 + 1) ÷ 0.1 — still B.
            let five: Vec<_> = (0..5).map(|_| bs[1].begin_request()).collect();
            assert_eq!(sequence(&p, &bs, 1), "B", "{kind:?}");
            // Ten more on B: now A, at a tenth of its share, is the cheaper one.
            let ten: Vec<_> = (0..10).map(|_| bs[1].begin_request()).collect();
            assert_eq!(sequence(&p, &bs, 1), "A", "{kind:?}");
            drop((five, ten));
        }
        let bs = a_ramping_and_b_full(false);
        let p = Picker::build(StrategyKind::RoundRobin, &bs);
        let a = sequence(&p, &bs, 1100).matches('A').count();
        assert!((90..=110).contains(&a), "round robin: A got {a} of 1100");
    }

    #[test]
    fn a_cold_backend_gets_one_probe_from_least_response_time() {
        use super::super::{PickCtx, Picker, StrategyKind};
        let bs = a_ramping_and_b_full(false);
        crate::strategy::record_latency(&bs[1], Duration::from_millis(10));
        let p = Picker::build(StrategyKind::LeastResponseTime, &bs);
        let first = p.pick(&bs, &PickCtx::default()).unwrap();
        assert_eq!(first, 0, "the unsampled backend is probed");
        let _probe = bs[0].begin_request();
        let _b: Vec<_> = (0..20).map(|_| bs[1].begin_request()).collect();
        assert_eq!(
            p.pick(&bs, &PickCtx::default()),
            Some(1),
            "it waits for its answer"
        );
    }

    #[test]
    fn lowest_takes_the_first_of_equal_scores() {
        let scores = [3.0, 1.0, 1.0, 2.0];
        assert_eq!(lowest(4, |_| true, |i| scores[i]), Some(1));
        assert_eq!(lowest(4, |i| i != 1, |i| scores[i]), Some(2));
        assert_eq!(lowest(4, |_| false, |i| scores[i]), None);
    }
}
