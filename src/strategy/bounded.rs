use std::sync::Arc;

use crate::backend::Backend;

/// Bounded load for the hashing strategies (`--hash-balance-factor c`; Google's
/// "consistent hashing with bounded loads", HAProxy's and Envoy's `hash_balance_factor`).
///
/// With T requests in flight over the eligible backends and this request about to be
/// placed, backend i may hold at most `max(1, ceil(c × (T + 1) × wᵢ / W))` — its
/// weight's share of c times the load, W the sum of the weights. A backend at its cap
/// is passed over and the walk goes on clockwise (ring) or to the next slot (Maglev).
/// An idle backend is always under its cap, so the sum T — one pass over the in-flight
/// counts, O(n) — is taken only when the key's backend is busy.
#[derive(Debug)]
pub(super) struct LoadBound<'a> {
    factor: Option<f64>,
    eligible: &'a [Arc<Backend>],
    members: &'a [(u64, u32)],
    /// T + 1, once computed.
    load: Option<f64>,
    total_weight: f64,
}

impl<'a> LoadBound<'a> {
    /// `members` are the (id, weight) pairs the ring or table was built with.
    pub(super) fn new(
        factor: Option<f64>,
        eligible: &'a [Arc<Backend>],
        members: &'a [(u64, u32)],
    ) -> Self {
        LoadBound {
            factor,
            eligible,
            members,
            load: None,
            total_weight: 0.0,
        }
    }

    /// Whether eligible backend `i` may take one more request.
    #[inline]
    pub(super) fn admits(&mut self, i: usize) -> bool {
        let Some(c) = self.factor else {
            return true;
        };
        let k = self.eligible[i].in_flight();
        if k == 0 {
            return true;
        }
        let load = match self.load {
            Some(l) => l,
            None => {
                let t: u64 = self.eligible.iter().map(|b| b.in_flight()).sum();
                self.total_weight = self.members.iter().map(|m| m.1 as f64).sum();
                *self.load.insert((t + 1) as f64)
            }
        };
        let w = self.members[i].1 as f64;
        let cap = (c * load * w / self.total_weight).ceil().max(1.0);
        (k as f64) < cap
    }
}
