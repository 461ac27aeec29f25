//! One pick contract: a strategy yields candidates in its order of preference, and one
//! caller applies what the request allows — not tried yet, the trial claim of a
//! half-open backend — by taking the first candidate it accepts ([`Picker::select`]).
//! The shape is pingora-load-balancing's `select_with(key, max_iterations, accept)` over
//! its `BackendIter`: no strategy knows about retries or trials, and a new rule of
//! admission (a connection cap, say) is one more condition in the caller's `accept`.
//!
//! The order each family of strategies yields (`docs/strategies.md` has the reasons):
//! - rotating (round robin, smooth WRR): their choice, then the following backends in
//!   pool order, so retries spread the way the rotation does;
//! - ranking (the least-connections family, least response time, the two-choice ones):
//!   their rule, then their rule again over the backends not yielded yet;
//! - hashing (ring, Maglev): owners clockwise (ring) or slot by slot (Maglev) from the
//!   key's position; with a balance factor, first those under their load bound, then all
//!   of them again in the same order.

use std::sync::Arc;

use super::bounded::LoadBound;
use super::{Maglev, PickCtx, Picker, Ring};
use crate::backend::Backend;

/// The candidates of one pick, as eligible indexes in the strategy's order. A rotating or
/// ranking walk names each eligible backend once; a hashing walk names an owner at each
/// of its points or slots, and ends after at most two passes over them.
#[derive(Debug)]
pub(crate) struct Candidates<'a> {
    eligible: &'a [Arc<Backend>],
    walk: Walk<'a>,
}

#[derive(Debug)]
enum Walk<'a> {
    /// `left` more, from `next` on in pool order.
    Rotate { next: usize, left: usize },
    /// The picker's rule over the backends not yielded yet: those in `yielded`, and
    /// `last`, kept apart so that a pick that stops at its first candidate (nearly all)
    /// allocates nothing.
    Rank {
        picker: &'a Picker,
        key: Option<u64>,
        yielded: Vec<u64>,
        last: Option<u64>,
    },
    /// A hashing walk.
    Hash(HashWalk<'a>),
}

/// The owners of a hash ring's points or of a Maglev table's slots.
#[derive(Debug, Clone, Copy)]
pub(super) enum Owners<'a> {
    /// Points of a ring.
    Ring(&'a Ring),
    /// Slots of a Maglev table.
    Table(&'a Maglev),
}

impl Owners<'_> {
    fn len(&self) -> usize {
        match self {
            Owners::Ring(r) => r.len(),
            Owners::Table(t) => t.slots(),
        }
    }

    #[inline]
    fn at(&self, position: usize) -> usize {
        match self {
            Owners::Ring(r) => r.owner_at(position),
            Owners::Table(t) => t.owner_at(position),
        }
    }
}

/// Owners from `start` on, wrapping; with a load bound, a first pass over those it
/// admits and a second over all of them. A pass offers each owner once, at its first
/// point or slot, and ends when it has offered every eligible backend: a pick in a pool
/// whose backends are all at their `max_conns` tries each once, not once per point of
/// the ring or slot of the Maglev table.
#[derive(Debug)]
pub(super) struct HashWalk<'a> {
    owners: Owners<'a>,
    start: usize,
    step: usize,
    bound: Option<LoadBound<'a>>,
    second_pass: bool,
    /// Eligible backends, the most a pass can offer.
    n: usize,
    offered: Offered,
}

/// The owners a pass has offered. The first is only noted when a second is asked for,
/// so the usual pick (its first candidate taken) touches nothing; past the first 64
/// backends the set grows a word per 64 (only in a large pool whose pick goes on).
#[derive(Debug, Default)]
struct Offered {
    first: Option<usize>,
    low: u64,
    high: Vec<u64>,
    count: usize,
}

impl Offered {
    /// Notes `i` as offered now; false when this pass offered it already.
    fn insert(&mut self, i: usize) -> bool {
        if self.count == 0 {
            self.first = Some(i);
            self.count = 1;
            return true;
        }
        if let Some(f) = self.first.take() {
            self.set(f);
        }
        if !self.set(i) {
            return false;
        }
        self.count += 1;
        true
    }

    /// Sets `i`'s bit; false when it was set.
    fn set(&mut self, i: usize) -> bool {
        let bit = 1u64 << (i % 64);
        let word = match i / 64 {
            0 => &mut self.low,
            w => {
                if self.high.len() < w {
                    self.high.resize(w, 0);
                }
                &mut self.high[w - 1]
            }
        };
        let fresh = *word & bit == 0;
        *word |= bit;
        fresh
    }
}

impl<'a> HashWalk<'a> {
    /// The walk from `start`, with the load bound of `factor` when there is one.
    pub(super) fn new(
        owners: Owners<'a>,
        start: usize,
        eligible: &'a [Arc<Backend>],
        members: &'a [(u64, u32)],
        factor: Option<f64>,
    ) -> Self {
        HashWalk {
            owners,
            start,
            step: 0,
            bound: factor.map(|f| LoadBound::new(Some(f), eligible, members)),
            second_pass: false,
            n: eligible.len(),
            offered: Offered::default(),
        }
    }
}

impl Iterator for HashWalk<'_> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        let len = self.owners.len();
        loop {
            if self.step == len || self.offered.count == self.n {
                if self.bound.is_none() || self.second_pass {
                    return None;
                }
                self.second_pass = true;
                self.step = 0;
                self.offered = Offered::default();
            }
            let owner = self.owners.at((self.start + self.step) % len);
            self.step += 1;
            // The second pass offers every owner again, in the same order: the first the
            // caller takes is the first it may use, whatever the loads are by then.
            let admitted = self.second_pass || self.bound.as_mut().is_none_or(|b| b.admits(owner));
            if admitted && self.offered.insert(owner) {
                return Some(owner);
            }
        }
    }
}

impl Iterator for Candidates<'_> {
    type Item = usize;

    // Always inlined, as `candidates` is: a pick that takes its first candidate then
    // runs no call at all.
    #[inline(always)]
    fn next(&mut self) -> Option<usize> {
        match &mut self.walk {
            Walk::Rotate { next, left } => {
                if *left == 0 {
                    return None;
                }
                let i = *next;
                *left -= 1;
                *next = if i + 1 == self.eligible.len() {
                    0
                } else {
                    i + 1
                };
                Some(i)
            }
            Walk::Rank {
                picker,
                key,
                yielded,
                last,
            } => {
                if let Some(id) = last.take() {
                    yielded.push(id);
                }
                let ctx = PickCtx {
                    tried: yielded,
                    key: *key,
                };
                let i = picker.rank(self.eligible, &ctx)?;
                *last = Some(self.eligible[i].id);
                Some(i)
            }
            Walk::Hash(walk) => walk.next(),
        }
    }
}

impl Picker {
    /// The candidates for a request with `key` (the hashing strategies' request key),
    /// in this strategy's order.
    // Always inlined: built and consumed in the same pick, it then lives in registers
    // instead of being copied out of a call.
    #[inline(always)]
    pub(crate) fn candidates<'a>(
        &'a self,
        eligible: &'a [Arc<Backend>],
        key: Option<u64>,
    ) -> Candidates<'a> {
        let n = eligible.len();
        let rotate = |first: usize| Walk::Rotate {
            next: first,
            left: n,
        };
        let walk = match self {
            _ if n == 0 => Walk::Rotate { next: 0, left: 0 },
            Picker::RoundRobin(p) => rotate(p.pick(n)),
            Picker::WeightedRoundRobin(p) => rotate(p.pick()),
            Picker::ReportedLoad(p) => rotate(p.pick()),
            Picker::Ring(r, factor) => Walk::Hash(r.walk(eligible, key.unwrap_or(0), *factor)),
            Picker::Maglev(t, factor) => Walk::Hash(t.walk(eligible, key.unwrap_or(0), *factor)),
            _ => Walk::Rank {
                picker: self,
                key,
                yielded: Vec::new(),
                last: None,
            },
        };
        Candidates { eligible, walk }
    }

    /// The candidates a request with `key` would get now, without moving anything: a
    /// rotation's next position is read, not taken (`POST /admin/explain`).
    pub(crate) fn candidates_now<'a>(
        &'a self,
        eligible: &'a [Arc<Backend>],
        key: Option<u64>,
    ) -> Candidates<'a> {
        let n = eligible.len();
        let walk = match self {
            _ if n == 0 => Walk::Rotate { next: 0, left: 0 },
            Picker::RoundRobin(p) => Walk::Rotate {
                next: p.peek(n),
                left: n,
            },
            Picker::WeightedRoundRobin(p) => Walk::Rotate {
                next: p.peek(),
                left: n,
            },
            Picker::ReportedLoad(p) => Walk::Rotate {
                next: p.peek(),
                left: n,
            },
            // The others read loads and estimates, and change nothing as they walk.
            _ => return self.candidates(eligible, key),
        };
        Candidates { eligible, walk }
    }

    /// The first candidate `accept` takes, as an index into `eligible`; `None` when it
    /// takes none.
    #[inline]
    pub(crate) fn select(
        &self,
        eligible: &[Arc<Backend>],
        key: Option<u64>,
        mut accept: impl FnMut(&Arc<Backend>) -> bool,
    ) -> Option<usize> {
        self.candidates(eligible, key)
            .find(|&i| accept(&eligible[i]))
    }

    /// [`Self::select`] accepting what `ctx` allows (backends not tried yet).
    #[inline]
    pub fn pick(&self, eligible: &[Arc<Backend>], ctx: &PickCtx<'_>) -> Option<usize> {
        if ctx.tried.is_empty() {
            return self.candidates(eligible, ctx.key).next();
        }
        self.select(eligible, ctx.key, |b| ctx.allows(b))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::backends;
    use super::super::{Picker, StrategyKind};
    use crate::config::strategy_kind::NAMES;
    use std::collections::BTreeSet;

    #[test]
    fn every_strategy_offers_every_backend() {
        let bs = backends(&[1, 2, 1, 3, 1]);
        for (kind, name, _) in NAMES {
            let p = Picker::build(*kind, &bs);
            for key in [1u64, 0x9e37_79b9_7f4a_7c15, u64::MAX] {
                let offered: BTreeSet<usize> = p.candidates(&bs, Some(key)).collect();
                assert_eq!(offered, (0..bs.len()).collect(), "{name}");
            }
            assert_eq!(p.candidates(&[], Some(1)).next(), None, "{name}");
        }
    }

    #[test]
    fn the_caller_decides_and_the_strategy_orders() {
        let bs = backends(&[1, 1, 1, 1]);
        let p = Picker::build(StrategyKind::RoundRobin, &bs);
        let order: Vec<usize> = p.candidates(&bs, None).collect();
        assert_eq!(order.len(), 4);
        for w in order.windows(2) {
            assert_eq!(w[1], (w[0] + 1) % 4, "retries follow the rotation");
        }
        // Refusing the first two candidates gives the third, for any strategy.
        for (kind, name, _) in NAMES {
            let p = Picker::build(*kind, &bs);
            let key = Some(0x5555_aaaa_1234_5678);
            let order: Vec<usize> = p.candidates(&bs, key).collect();
            let first_two = [bs[order[0]].id, bs[order[1]].id];
            let chosen = p.select(&bs, key, |b| !first_two.contains(&b.id)).unwrap();
            assert!(!first_two.contains(&bs[chosen].id), "{name}");
            assert_eq!(p.select(&bs, key, |_| false), None, "{name}");
        }
    }

    #[test]
    fn a_hash_walk_offers_each_backend_once_per_pass() {
        let bs = backends(&[1, 2, 1, 3, 1]);
        for kind in [StrategyKind::ConsistentHash, StrategyKind::Maglev] {
            for factor in [None, Some(1.25)] {
                let opts = super::super::PickerOptions {
                    hash_balance_factor: factor,
                };
                let p = Picker::build_with(kind, &bs, &opts, None);
                let walk: Vec<usize> = p.candidates(&bs, Some(7)).collect();
                let passes = if factor.is_some() { 2 } else { 1 };
                assert_eq!(
                    walk.len(),
                    passes * bs.len(),
                    "{kind:?} {factor:?}: {walk:?}"
                );
                let first: BTreeSet<usize> = walk[..bs.len()].iter().copied().collect();
                assert_eq!(first.len(), bs.len(), "{kind:?}: {walk:?}");
            }
        }
    }

    #[test]
    fn the_offered_set_spans_large_pools() {
        let mut o = super::Offered::default();
        assert!(o.insert(200));
        assert!(!o.insert(200), "the first, noted late, is still known");
        assert!(o.insert(3) && o.insert(64) && o.insert(199));
        assert!(!o.insert(64) && !o.insert(3));
        assert_eq!(o.count, 4);
    }

    #[test]
    fn a_bounded_hash_walk_offers_backends_under_their_bound_first() {
        let bs = backends(&[1, 1, 1, 1]);
        for kind in [StrategyKind::ConsistentHash, StrategyKind::Maglev] {
            let p = Picker::build_with(
                kind,
                &bs,
                &super::super::PickerOptions {
                    hash_balance_factor: Some(1.25),
                },
                None,
            );
            let key = Some(42);
            let home = p.candidates(&bs, key).next().unwrap();
            let _busy: Vec<_> = (0..4).map(|_| bs[home].begin_request()).collect();
            let mut walk = p.candidates(&bs, key);
            let first = walk.next().unwrap();
            assert_ne!(first, home, "{kind:?}: the key's backend is over its bound");
            assert!(walk.any(|i| i == home), "{kind:?}: it still comes, last");
        }
    }
}
