use std::sync::Arc;

use super::load_index::{first_pick, Key};
use super::{LoadIndex, PickCtx};
use crate::backend::Backend;

/// Lowest in-flight ÷ effective weight; ties to the lowest index. The bet: a backend's
/// capacity is proportional to its weight, so requests in flight per unit of weight
/// say who will answer soonest.
///
/// The effective weights (slow start applied) are read when the picker is built; the
/// pool rebuilds it every 250 ms while a ramp runs, so a ramping backend's share follows
/// the ramp without a lock or a clock read per pick. Loads are compared as
/// `a.in_flight × b.weight < b.in_flight × a.weight`, with no division.
///
/// Pools of [`super::load_index::MIN_INDEXED`] backends or more keep a [`LoadIndex`]
/// keyed by in-flight ÷ weight, as [`super::LeastConnections`] does.
#[derive(Debug)]
pub struct WeightedLeastConnections {
    weights: Box<[f64]>,
    index: Option<Arc<[LoadIndex]>>,
}

impl WeightedLeastConnections {
    /// Over `eligible` (pool order) with their effective weights now.
    pub(crate) fn new(eligible: &[Arc<Backend>]) -> Self {
        let weights: Box<[f64]> = eligible.iter().map(|b| b.effective_weight()).collect();
        WeightedLeastConnections {
            index: LoadIndex::new(eligible, Key::PerWeight(weights.clone()))
                .map(|x| Arc::from([x])),
            weights,
        }
    }

    /// Its index, if the pool is large enough to have one.
    pub(crate) fn index(&self) -> Option<&Arc<[LoadIndex]>> {
        self.index.as_ref()
    }

    /// The index's answer for a first pick, else a scan.
    #[inline]
    pub(crate) fn pick(&self, eligible: &[Arc<Backend>], ctx: &PickCtx<'_>) -> Option<usize> {
        first_pick(self.index.as_ref(), eligible.len(), ctx).or_else(|| self.scan(eligible, ctx))
    }

    /// Scans the eligible backends once (O(n)); stops at the first idle one.
    #[inline]
    pub(crate) fn scan(&self, eligible: &[Arc<Backend>], ctx: &PickCtx<'_>) -> Option<usize> {
        let mut best: Option<(usize, f64, f64)> = None;
        for (i, b) in eligible.iter().enumerate() {
            if !ctx.allows(b) {
                continue;
            }
            let load = b.in_flight() as f64;
            let w = self.weights[i];
            if best.is_none_or(|(_, bl, bw)| load * bw < bl * w) {
                best = Some((i, load, w));
                if load == 0.0 {
                    break; // 0 ÷ w: nothing after it can be lower
                }
            }
        }
        best.map(|(i, _, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::*;

    #[test]
    fn load_per_unit_of_weight_with_ties_to_the_lowest_index() {
        let bs = backends(&[2, 1, 1]);
        let p = Picker::build(StrategyKind::WeightedLeastConnections, &bs);
        assert_eq!(sequence(&p, &bs, 2), "AA", "all idle: lowest index");
        let _a1 = bs[0].begin_request();
        // A 1/2, B 0, C 0
        assert_eq!(sequence(&p, &bs, 1), "B");
        let _b1 = bs[1].begin_request();
        // A 1/2, B 1/1, C 0
        assert_eq!(sequence(&p, &bs, 1), "C");
        let _c1 = bs[2].begin_request();
        // A 1/2, B 1, C 1: A
        assert_eq!(sequence(&p, &bs, 1), "A");
        let _a2 = bs[0].begin_request();
        // A 2/2 = B 1/1 = C 1/1: tie, lowest index
        assert_eq!(sequence(&p, &bs, 1), "A");
        let _a3 = bs[0].begin_request();
        // A 3/2 > B 1: B
        assert_eq!(sequence(&p, &bs, 1), "B");
    }

    #[test]
    fn slow_start_lowers_the_weight_it_is_built_with() {
        use std::time::{Duration, Instant};
        let spec = |port: u16, name: &str| {
            crate::config::backend_spec(&format!("http://127.0.0.1:{port}"), Some(10), Some(name))
                .unwrap()
        };
        let a =
            Arc::new(Backend::new(0, spec(1, "A"), 0.1).with_slow_start(Duration::from_secs(100)));
        let b = Arc::new(Backend::new(1, spec(2, "B"), 0.1));
        a.start_ramp(Instant::now());
        let bs = vec![a, b];
        let p = Picker::build(StrategyKind::WeightedLeastConnections, &bs);
        // A ramps at about 1 of its 10: one request in flight there weighs like ten on B.
        let _g = bs[0].begin_request();
        let _h: Vec<_> = (0..5).map(|_| bs[1].begin_request()).collect();
        assert_eq!(sequence(&p, &bs, 1), "B");
    }
}
