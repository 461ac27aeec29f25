use std::sync::Arc;

use super::load_index::{first_pick, Key};
use super::ramp::{lowest, Ramp};
use super::{LoadIndex, PickCtx};
use crate::backend::Backend;

/// Fewest requests in flight wins; ties to the lowest index. Reads the in-flight
/// counts the backends keep themselves, so nothing here can drift from the truth.
///
/// Pools of [`super::load_index::MIN_INDEXED`] backends or more keep a [`LoadIndex`]
/// that the backends update as their requests start and end, so a first pick is one
/// read; a retry (which must leave tried backends out) and smaller pools scan.
///
/// While slow start ramps a backend, the picker has a [`Ramp`] instead of an index and
/// scans by (in flight + 1) ÷ share (see [`super::ramp`]).
#[derive(Debug, Default)]
pub struct LeastConnections {
    index: Option<Arc<[LoadIndex]>>,
    ramp: Option<Ramp>,
}

impl LeastConnections {
    /// Over `eligible` (pool order), indexed when the pool is large.
    pub(crate) fn new(eligible: &[Arc<Backend>]) -> Self {
        if let Some(ramp) = Ramp::of(eligible) {
            return LeastConnections {
                index: None,
                ramp: Some(ramp),
            };
        }
        LeastConnections {
            index: LoadIndex::new(eligible, Key::InFlight).map(|x| Arc::from([x])),
            ramp: None,
        }
    }

    /// Its index, if the pool is large enough to have one.
    pub(crate) fn index(&self) -> Option<&Arc<[LoadIndex]>> {
        self.index.as_ref()
    }

    /// The index's answer for a first pick, else a scan.
    #[inline]
    pub(crate) fn pick(&self, eligible: &[Arc<Backend>], ctx: &PickCtx<'_>) -> Option<usize> {
        if let Some(ramp) = &self.ramp {
            return Self::ramped(eligible, ctx, ramp);
        }
        first_pick(self.index.as_ref(), eligible.len(), ctx).or_else(|| Self::scan(eligible, ctx))
    }

    /// The scan while a ramp runs: lowest (in flight + 1) ÷ share.
    fn ramped(eligible: &[Arc<Backend>], ctx: &PickCtx<'_>, ramp: &Ramp) -> Option<usize> {
        lowest(
            eligible.len(),
            |i| ctx.allows(&eligible[i]),
            |i| ramp.scale(i, (eligible[i].in_flight() + 1) as f64),
        )
    }

    /// Scans the eligible backends once (O(n)).
    #[inline]
    pub(crate) fn scan(eligible: &[Arc<Backend>], ctx: &PickCtx<'_>) -> Option<usize> {
        let mut best: Option<(usize, u64)> = None;
        for (i, b) in eligible.iter().enumerate() {
            if !ctx.allows(b) {
                continue;
            }
            let load = b.in_flight();
            if best.is_none_or(|(_, l)| load < l) {
                best = Some((i, load));
                if load == 0 {
                    break; // nothing beats an idle backend at the lowest index
                }
            }
        }
        best.map(|(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::*;

    #[test]
    fn ties_go_to_the_lowest_index_and_load_is_followed() {
        let bs = backends(&[1, 1, 1]);
        let p = Picker::build(StrategyKind::LeastConnections, &bs);
        assert_eq!(sequence(&p, &bs, 3), "AAA");
        let g0 = bs[0].begin_request();
        assert_eq!(sequence(&p, &bs, 1), "B");
        let g1 = bs[1].begin_request();
        assert_eq!(sequence(&p, &bs, 1), "C");
        let _g2 = bs[2].begin_request();
        let _g3 = bs[2].begin_request();
        assert_eq!(sequence(&p, &bs, 1), "A");
        drop(g1);
        assert_eq!(sequence(&p, &bs, 1), "B");
        drop(g0);
        assert_eq!(sequence(&p, &bs, 1), "A");
    }
}
