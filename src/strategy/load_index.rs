//! An index of the least loaded backend for `least_connections`,
//! `weighted_least_connections` and `least_response_time` over large pools: a tournament
//! tree whose root names the backend with the lowest key, ties to the lowest index, so a
//! pick reads one word instead of scanning every backend.
//!
//! No crate offers a lock-free min-tree whose leaves are updated by many threads, hence
//! this one. Every node is one `AtomicU64` packing `key:32 | index:16 | version:16`,
//! ordered by its top 48 bits (lowest key, then lowest index). A backend whose load
//! changed recomputes its leaf from its own counter and then each ancestor from its two
//! children, each with the same step: read the node, read its inputs, compare-and-swap
//! the result with the version bumped. A writer whose inputs went stale meanwhile loses
//! its CAS to the one that changed them and tries again, so once the writers stop every
//! node is the minimum of its children (whoever wrote a node last read its inputs after
//! every earlier write to them). A walk stops at the first node whose winner did not
//! change. The version makes a CAS fail even when another writer put back the same
//! winner in between (no ABA).
//!
//! Cost: a pick is one load; a request's start and end each walk at most log₂ n nodes
//! (usually a few: the walk stops where the winner is unchanged). Pools below
//! [`MIN_INDEXED`] backends keep the plain scan, which is cheaper there.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::estimate::{route_sample, FADE};
use super::PickCtx;
use crate::backend::{Backend, LoadWatch};

/// Pools from this many eligible backends up are indexed; below it a scan is cheap
/// (tens of ns) and a request's start and end cost nothing extra.
pub(crate) const MIN_INDEXED: usize = 64;
/// The 16-bit index field bounds the indexed pool size.
pub(crate) const MAX_INDEXED: usize = u16::MAX as usize;

const EMPTY_KEY: u64 = u32::MAX as u64;
const EMPTY: u64 = (EMPTY_KEY << 32) | (0xFFFF << 16);

#[inline]
fn pack(key: u64, index: usize, version: u64) -> u64 {
    (key << 32) | ((index as u64 & 0xFFFF) << 16) | (version & 0xFFFF)
}

/// The ordering part of a node: key, then index.
#[inline]
fn rank(node: u64) -> u64 {
    node >> 16
}

/// How a backend's state becomes a key; a backend outside the tree's group has none.
#[derive(Debug)]
pub(crate) enum Key {
    /// Requests in flight.
    InFlight,
    /// Requests in flight ÷ the effective weight the picker was built with, as the
    /// bits of an `f32` (positive floats order like their bits). Equal quotients give
    /// equal keys; distinct ones stay distinct while loads stay under about 10⁴ per
    /// backend, far beyond what a backend holds.
    PerWeight(Box<[f64]>),
    /// `least_response_time`, backends without a sample: requests in flight.
    Unsampled,
    /// `least_response_time`, sampled backends with requests in flight: average ×
    /// (in flight + 1), as `f32` bits.
    Busy,
    /// `least_response_time`, sampled idle backends. Their estimate fades as
    /// `avg · e^(−(now − sampled_at)/τ)`, the same factor for all of them, so their order
    /// does not change with time: it is the order of `ln(avg) + (sampled_at − base)/τ`,
    /// a key fixed between two events. `base` (the index's birth) keeps that sum small,
    /// so its `f32` keeps five significant digits; the pool renews the index every
    /// minute.
    Idle {
        /// [`crate::backend::clock_ns`] when the index was built.
        base: u64,
    },
}

/// Order-preserving map of an `f32` onto `u32` (negative numbers included).
#[inline]
fn ordered(x: f32) -> u64 {
    let bits = x.to_bits();
    (if bits >> 31 == 1 {
        !bits
    } else {
        bits | 1 << 31
    }) as u64
}

/// The tree over one snapshot's eligible backends (pool order).
#[derive(Debug)]
pub(crate) struct LoadIndex {
    /// Implicit binary tree: root at 1, children of i at 2i and 2i+1, leaf j at
    /// `leaves + j`.
    nodes: Box<[AtomicU64]>,
    leaves: usize,
    key: Key,
}

/// Where a backend's leaf is in the indexes its current picker reads.
#[derive(Debug)]
pub(crate) struct LoadSlot {
    /// The indexes (one per group of backends the strategy ranks apart).
    pub(crate) trees: Arc<[LoadIndex]>,
    /// The backend's position in each.
    pub(crate) leaf: usize,
}

impl LoadWatch for LoadSlot {
    /// Brings `backend`'s leaf up to date in every tree.
    #[inline]
    fn refresh(&self, backend: &Backend) {
        for t in self.trees.iter() {
            t.refresh(self.leaf, backend);
        }
    }
}

/// The first tree's answer for the first candidate over `n` eligible backends; `None`
/// for a later candidate (which must leave those already offered out: the caller
/// scans), or without an index.
#[inline]
pub(crate) fn first_pick(
    index: Option<&Arc<[LoadIndex]>>,
    n: usize,
    ctx: &PickCtx<'_>,
) -> Option<usize> {
    if !ctx.tried.is_empty() {
        return None;
    }
    index.and_then(|x| x[0].least()).filter(|&i| i < n)
}

impl LoadIndex {
    /// An index over `eligible` with `key`; `None` when the pool is outside the indexed
    /// sizes.
    pub(crate) fn new(eligible: &[Arc<Backend>], key: Key) -> Option<LoadIndex> {
        let n = eligible.len();
        if !(MIN_INDEXED..=MAX_INDEXED).contains(&n) {
            return None;
        }
        let leaves = n.next_power_of_two();
        let index = LoadIndex {
            nodes: (0..2 * leaves).map(|_| AtomicU64::new(EMPTY)).collect(),
            leaves,
            key,
        };
        for (i, b) in eligible.iter().enumerate() {
            let key = index.key_of(i, b);
            index.nodes[leaves + i].store(pack(key, i, 0), Ordering::Relaxed);
        }
        for i in (1..leaves).rev() {
            let l = index.nodes[2 * i].load(Ordering::Relaxed);
            let r = index.nodes[2 * i + 1].load(Ordering::Relaxed);
            index.nodes[i].store(if rank(r) < rank(l) { r } else { l }, Ordering::Relaxed);
        }
        Some(index)
    }

    #[inline]
    fn key_of(&self, leaf: usize, b: &Backend) -> u64 {
        let k = b.in_flight();
        let key = match &self.key {
            Key::InFlight => k,
            Key::PerWeight(w) => ((k as f64 / w[leaf]) as f32).to_bits() as u64,
            Key::Unsampled => match route_sample(b) {
                None => k,
                Some(_) => EMPTY_KEY,
            },
            Key::Busy => match route_sample(b) {
                Some((avg, _)) if k > 0 => ((avg * (k + 1) as f64) as f32).to_bits() as u64,
                _ => EMPTY_KEY,
            },
            Key::Idle { base } => match route_sample(b) {
                Some((avg, at)) if k == 0 => {
                    let since = (at as i64).wrapping_sub(*base as i64) as f64;
                    ordered((avg.ln() + since / FADE.as_nanos() as f64) as f32)
                }
                _ => EMPTY_KEY,
            },
        };
        if key == EMPTY_KEY {
            EMPTY_KEY
        } else {
            key.min(EMPTY_KEY - 1)
        }
    }

    /// The least loaded backend's index, ties to the lowest.
    #[inline]
    pub(crate) fn least(&self) -> Option<usize> {
        let root = self.nodes[1].load(Ordering::Acquire);
        (root >> 32 != EMPTY_KEY).then_some(((root >> 16) & 0xFFFF) as usize)
    }

    /// Brings `leaf` up to date with `backend`'s load, then its ancestors as far as the
    /// winner changes.
    pub(crate) fn refresh(&self, leaf: usize, backend: &Backend) {
        let mut at = self.leaves + leaf;
        let changed = self.settle(at, |old| pack(self.key_of(leaf, backend), leaf, old + 1));
        if !changed {
            return;
        }
        while at > 1 {
            at /= 2;
            let changed = self.settle(at, |old| {
                let l = self.nodes[2 * at].load(Ordering::Acquire);
                let r = self.nodes[2 * at + 1].load(Ordering::Acquire);
                let best = if rank(r) < rank(l) { r } else { l };
                (best & !0xFFFF) | ((old + 1) & 0xFFFF)
            });
            if !changed {
                return;
            }
        }
    }

    /// Sets node `at` to `compute(its version)` by compare-and-swap, again until it
    /// holds; returns whether its rank changed.
    #[inline]
    fn settle(&self, at: usize, compute: impl Fn(u64) -> u64) -> bool {
        let node = &self.nodes[at];
        let mut old = node.load(Ordering::Acquire);
        loop {
            let new = compute(old & 0xFFFF);
            match node.compare_exchange_weak(old, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return rank(new) != rank(old),
                Err(now) => old = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::*;
    use super::*;
    use proptest::prelude::*;

    /// The scans the index stands in for.
    fn scan(bs: &[Arc<Backend>], weighted: bool) -> Option<usize> {
        if weighted {
            WeightedLeastConnections::new(bs).scan(bs, &PickCtx::default())
        } else {
            LeastConnections::scan(bs, &PickCtx::default())
        }
    }

    fn index(bs: &[Arc<Backend>], weighted: bool) -> Arc<LoadIndex> {
        let key = if weighted {
            Key::PerWeight(bs.iter().map(|b| b.effective_weight()).collect())
        } else {
            Key::InFlight
        };
        Arc::new(LoadIndex::new(bs, key).unwrap())
    }

    #[test]
    fn small_and_huge_pools_are_not_indexed() {
        assert!(LoadIndex::new(&backends(&[1; 3]), Key::InFlight).is_none());
        let bs: Vec<u32> = vec![1; MIN_INDEXED];
        assert!(LoadIndex::new(&backends(&bs), Key::InFlight).is_some());
    }

    #[test]
    fn ordered_keeps_the_order_of_floats() {
        let xs = [
            f32::NEG_INFINITY,
            -1e9,
            -2.5,
            -1e-9,
            -0.0,
            0.0,
            1e-9,
            2.5,
            1e9,
            f32::INFINITY,
        ];
        for w in xs.windows(2) {
            assert!(ordered(w[0]) < ordered(w[1]), "{} {}", w[0], w[1]);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// After every start or end of a request the index names what the scan finds.
        #[test]
        fn the_index_is_the_scan(
            weights in proptest::collection::vec(1u32..=5, MIN_INDEXED..MIN_INDEXED + 40),
            ops in proptest::collection::vec((any::<prop::sample::Index>(), any::<bool>()), 1..300),
            weighted in any::<bool>(),
        ) {
            let bs = backends(&weights);
            let idx = index(&bs, weighted);
            let mut guards: Vec<Vec<crate::backend::RequestGuard>> = bs.iter().map(|_| Vec::new()).collect();
            for (which, start) in ops {
                let i = which.index(bs.len());
                if start || guards[i].is_empty() {
                    guards[i].push(bs[i].begin_request());
                } else {
                    guards[i].pop();
                }
                idx.refresh(i, &bs[i]);
                prop_assert_eq!(idx.least(), scan(&bs, weighted));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// `least_response_time` from its three indexes is the scan, at every step of a
        /// timeline of starts, ends and latency samples, with idle backends fading.
        #[test]
        fn least_response_time_from_the_index_is_the_scan(
            ops in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..4, 1u64..40, 0u64..300), 1..250),
            unsampled in 0usize..3,
        ) {
            const MS: u64 = 1_000_000;
            let bs = backends(&vec![1; MIN_INDEXED + 9]);
            let mut now = 50_000 * MS;
            let lrt = LeastResponseTime::new_at(&bs, now - 20_000 * MS);
            let trees = Arc::clone(lrt.index().unwrap());
            let refresh = |i: usize| trees.iter().for_each(|t| t.refresh(i, &bs[i]));
            let mut guards: Vec<Vec<crate::backend::RequestGuard>> = bs.iter().map(|_| Vec::new()).collect();
            // Every backend sampled but the first `unsampled`.
            for (i, b) in bs.iter().enumerate().skip(unsampled) {
                crate::strategy::record_latency_at(b, std::time::Duration::from_millis(5 + (i as u64 * 7) % 50), now - (i as u64 % 9) * 700 * MS);
                refresh(i);
            }
            for (which, op, ms, advance) in ops {
                let i = which.index(bs.len());
                now += advance * MS;
                match op {
                    0 => guards[i].push(bs[i].begin_request()),
                    1 => { guards[i].pop(); }
                    _ => crate::strategy::record_latency_at(&bs[i], std::time::Duration::from_millis(ms), now),
                }
                refresh(i);
                let ctx = PickCtx::default();
                prop_assert_eq!(lrt.pick_at(&bs, &ctx, now), LeastResponseTime::scan(&bs, &ctx, now));
            }
        }
    }

    /// Threads starting and ending requests on overlapping backends at once leave the
    /// index exact once they stop.
    #[test]
    fn concurrent_writers_leave_it_exact() {
        let bs = backends(&vec![1; 300]);
        for weighted in [false, true] {
            let idx = index(&bs, weighted);
            std::thread::scope(|s| {
                for t in 0..4u64 {
                    let (bs, idx) = (&bs, &idx);
                    s.spawn(move || {
                        let mut held = Vec::new();
                        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t;
                        for _ in 0..20_000 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            // Crowd a few backends so that writers collide.
                            let i = (x % 8) as usize * 37 % bs.len();
                            if x & 0x100 != 0 || held.is_empty() {
                                held.push((i, bs[i].begin_request()));
                                idx.refresh(i, &bs[i]);
                            } else {
                                let (j, g) = held.swap_remove((x >> 9) as usize % held.len());
                                drop(g);
                                idx.refresh(j, &bs[j]);
                            }
                        }
                        // Keep some requests in flight past the end.
                        while held.len() > 5 {
                            let (j, g) = held.pop().unwrap();
                            drop(g);
                            idx.refresh(j, &bs[j]);
                        }
                        std::mem::forget(held);
                    });
                }
            });
            assert_eq!(idx.least(), scan(&bs, weighted), "weighted: {weighted}");
            assert_ne!(idx.least(), None);
        }
    }

    /// Through a real pool: backends keep the index current by themselves as requests
    /// start and end and samples arrive, across a health flip and a weight edit (new snapshots, new
    /// indexes), and a switch to another strategy detaches them.
    #[test]
    fn a_pool_keeps_its_index_current() {
        use crate::pool::Pool;
        use std::time::Duration;
        let n = MIN_INDEXED + 44;
        let specs: Vec<_> = (0..n)
            .map(|i| {
                let url = format!("http://127.0.0.1:{}", 20_000 + i);
                crate::config::backend_spec(&url, Some(1 + (i % 4) as u32), None).unwrap()
            })
            .collect();
        let kinds = [
            StrategyKind::LeastConnections,
            StrategyKind::WeightedLeastConnections,
            StrategyKind::LeastResponseTime,
        ];
        for kind in kinds {
            let pool = Pool::of_backends(specs.clone(), kind);
            let scan = |pool: &Pool| {
                let snap = pool.snapshot();
                let (eligible, ctx) = (&snap.eligible, PickCtx::default());
                let found = match kind {
                    StrategyKind::LeastConnections => LeastConnections::scan(eligible, &ctx),
                    StrategyKind::LeastResponseTime => {
                        LeastResponseTime::scan(eligible, &ctx, crate::backend::clock_ns())
                    }
                    _ => WeightedLeastConnections::new(eligible).scan(eligible, &ctx),
                };
                let picked = snap.pick(&ctx);
                let found = found.map(|i| &eligible[i]);
                if let (StrategyKind::LeastResponseTime, Some(p), Some(f)) = (kind, picked, found) {
                    // Idle backends sampled microseconds apart fade to estimates equal
                    // within the index's f32 keys (and the pick and the scan read the
                    // clock at different moments): either is a right answer then.
                    let now = crate::backend::clock_ns();
                    let score = |b: &Backend| {
                        let k = b.in_flight();
                        crate::strategy::least_time::estimate(b, now, k)
                            .map(|avg| avg * (k + 1) as f64)
                    };
                    if let (Some(sp), Some(sf)) = (score(p), score(f)) {
                        if (sp - sf).abs() <= 1e-5 * sf {
                            return (Some(f.id), Some(f.id));
                        }
                    }
                }
                (picked.map(|b| b.id), found.map(|b| b.id))
            };
            let mut held = Vec::new();
            for round in 0..3 * n {
                let snap = pool.snapshot();
                let b = snap.pick(&PickCtx::default()).unwrap();
                held.push(b.begin_request());
                if round % 2 == 0 {
                    crate::strategy::record_latency(
                        b,
                        Duration::from_millis(1 + (round as u64 * 13) % 40),
                    );
                }
                if round % 3 == 2 {
                    held.swap_remove(round * 7 % held.len());
                }
                let (picked, scanned) = scan(&pool);
                assert_eq!(picked, scanned, "{kind:?} round {round}");
                if round == n {
                    pool.mark_health(5, false);
                }
                if round == 2 * n {
                    pool.update(7, Some(9), None, None).unwrap();
                }
            }
            assert!(matches!(scan(&pool), (Some(_), Some(_))));
            pool.set_strategy(StrategyKind::RoundRobin);
            assert!(pool.backends().iter().all(|b| !b.is_watched()));
        }
    }
}
