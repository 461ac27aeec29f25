use std::fmt::Write as _;
use std::sync::Arc;

use super::key::placement_hash;
use super::select::{HashWalk, Owners};
#[cfg(test)]
use super::PickCtx;
use crate::backend::Backend;

/// Points on the ring per unit of weight.
pub(crate) const POINTS_PER_WEIGHT: u32 = 150;

/// A consistent-hash ring (`consistent_hash`, `ip_hash`): 150 points per unit of weight
/// for each backend, each point at the hash of `URL#i` (see [`super::key`]); a key goes to
/// the first point at or after its hash, clockwise, wrapping at the end.
///
/// The ring is a function of the set of (URL, weight) pairs alone: points are sorted by
/// hash, and two points with the same hash by URL. Removing a backend therefore moves
/// only the keys that sat on its points, and putting it back restores every key exactly.
///
/// A lookup is a jump through a bucket index on the top bits of the hash (about one
/// point per bucket) and a binary search within the bucket: O(1) expected, O(log n) worst.
#[derive(Debug)]
pub struct Ring {
    /// The points, by ascending hash: a lookup reads the hash and its owner from one
    /// cache line.
    points: Box<[Point]>,
    /// `buckets[b]`: the first point whose hash has top bits ≥ `b`; one extra at the end.
    buckets: Box<[u32]>,
    shift: u32,
    /// (id, weight) of the backends it was built over, in eligible order.
    members: Box<[(u64, u32)]>,
}

/// One point: its hash and the eligible index that owns it.
#[derive(Debug, Clone, Copy)]
struct Point {
    hash: u64,
    owner: u32,
}

/// The (id, weight) of every eligible backend: what a ring or a table depends on.
pub(super) fn members(eligible: &[Arc<Backend>]) -> Box<[(u64, u32)]> {
    eligible
        .iter()
        .map(|b| (b.id, b.control.weight()))
        .collect()
}

/// The points of eligible backend `i`, unsorted.
fn points_of(i: usize, b: &Backend, out: &mut Vec<Point>) {
    let mut key = String::with_capacity(b.url.len() + 8);
    for p in 0..b.control.weight() * POINTS_PER_WEIGHT {
        key.clear();
        let _ = write!(key, "{}#{}", b.url, p);
        out.push(Point {
            hash: placement_hash(key.as_bytes()),
            owner: i as u32,
        });
    }
}

/// The order of points on the ring: by hash, then by URL.
#[inline]
fn ring_order(eligible: &[Arc<Backend>], a: &Point, b: &Point) -> std::cmp::Ordering {
    a.hash.cmp(&b.hash).then_with(|| {
        eligible[a.owner as usize]
            .url
            .cmp(&eligible[b.owner as usize].url)
    })
}

impl Ring {
    /// Builds the ring over `eligible` with their configured weights (slow start does
    /// not apply: a ring that followed a ramp would move keys at every step).
    pub(crate) fn new(eligible: &[Arc<Backend>]) -> Ring {
        let total: usize = eligible
            .iter()
            .map(|b| (b.control.weight() * POINTS_PER_WEIGHT) as usize)
            .sum();
        let mut points: Vec<Point> = Vec::with_capacity(total);
        for (i, b) in eligible.iter().enumerate() {
            points_of(i, b, &mut points);
        }
        points.sort_unstable_by(|a, b| ring_order(eligible, a, b));
        Self::finish(points, eligible)
    }

    /// The ring over `eligible`, derived from `previous` (built over an earlier set):
    /// the points of backends still there with the same weight are kept in their order,
    /// and only those of new or reweighted backends are hashed, sorted and merged in. The
    /// result is the ring [`Ring::new`] builds, at a fraction of the cost when a large
    /// pool changes by a few backends (a health flip, a weight edit).
    pub(crate) fn from_previous(previous: &Ring, eligible: &[Arc<Backend>]) -> Ring {
        let now = members(eligible);
        let index: std::collections::HashMap<(u64, u32), u32> = now
            .iter()
            .enumerate()
            .map(|(i, &m)| (m, i as u32))
            .collect();
        // Old eligible index → new one, for backends kept with the same weight.
        let remap: Vec<Option<u32>> = previous
            .members
            .iter()
            .map(|m| index.get(m).copied())
            .collect();
        let mut kept = vec![false; eligible.len()];
        for &i in remap.iter().flatten() {
            kept[i as usize] = true;
        }
        let mut fresh = Vec::new();
        for (i, b) in eligible.iter().enumerate() {
            if !kept[i] {
                points_of(i, b, &mut fresh);
            }
        }
        fresh.sort_unstable_by(|a, b| ring_order(eligible, a, b));
        let old = previous.points.iter().filter_map(|p| {
            remap[p.owner as usize].map(|owner| Point {
                hash: p.hash,
                owner,
            })
        });
        let mut points = Vec::with_capacity(old.size_hint().1.unwrap_or(0) + fresh.len());
        let mut fresh = fresh.into_iter().peekable();
        for p in old {
            while let Some(f) = fresh.next_if(|f| ring_order(eligible, f, &p).is_lt()) {
                points.push(f);
            }
            points.push(p);
        }
        points.extend(fresh);
        Self::finish(points, eligible)
    }

    /// The ring of sorted `points`: adds the bucket index.
    fn finish(points: Vec<Point>, eligible: &[Arc<Backend>]) -> Ring {
        // About two points per bucket, at least 16 buckets.
        let bits = (usize::BITS - (points.len() / 2).max(16).leading_zeros()).min(24);
        let shift = 64 - bits;
        let mut buckets = Vec::with_capacity((1 << bits) + 1);
        let mut p = 0usize;
        for bucket in 0..(1u64 << bits) {
            while p < points.len() && (points[p].hash >> shift) < bucket {
                p += 1;
            }
            buckets.push(p as u32);
        }
        buckets.push(points.len() as u32);
        Ring {
            points: points.into_boxed_slice(),
            buckets: buckets.into_boxed_slice(),
            shift,
            members: members(eligible),
        }
    }

    /// Whether this ring was built over exactly these backends and weights.
    pub(crate) fn built_for(&self, members: &[(u64, u32)]) -> bool {
        *self.members == *members
    }

    /// Number of points.
    pub(crate) fn len(&self) -> usize {
        self.points.len()
    }

    /// The first point at or after `key`, clockwise.
    #[inline]
    fn first_point(&self, key: u64) -> usize {
        let b = (key >> self.shift) as usize;
        let (lo, hi) = (self.buckets[b] as usize, self.buckets[b + 1] as usize);
        let p = lo + self.points[lo..hi].partition_point(|p| p.hash < key);
        if p == self.points.len() {
            0
        } else {
            p
        }
    }

    /// The owners clockwise from `key`'s point ([`super::Candidates`]): with a balance
    /// factor, first those under their bound, then all of them again.
    #[inline]
    pub(super) fn walk<'a>(
        &'a self,
        eligible: &'a [Arc<Backend>],
        key: u64,
        factor: Option<f64>,
    ) -> HashWalk<'a> {
        let start = if self.points.is_empty() {
            0
        } else {
            self.first_point(key)
        };
        HashWalk::new(Owners::Ring(self), start, eligible, &self.members, factor)
    }

    /// The eligible index that owns point `position`.
    #[inline]
    pub(super) fn owner_at(&self, position: usize) -> usize {
        self.points[position].owner as usize
    }

    /// The first owner of [`Self::walk`] that `ctx` allows.
    #[cfg(test)]
    fn pick(
        &self,
        eligible: &[Arc<Backend>],
        ctx: &PickCtx<'_>,
        factor: Option<f64>,
    ) -> Option<usize> {
        self.walk(eligible, ctx.key.unwrap_or(0), factor)
            .find(|&i| ctx.allows(&eligible[i]))
    }

    /// Which eligible index owns `key` (no retries, no bound).
    #[cfg(test)]
    pub(crate) fn owner(&self, key: u64) -> Option<usize> {
        (!self.points.is_empty()).then(|| self.points[self.first_point(key)].owner as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// The URL each key goes to.
    fn mapping(bs: &[Arc<Backend>], keys: &[u64]) -> Vec<String> {
        let ring = Ring::new(bs);
        keys.iter()
            .map(|&k| bs[ring.owner(k).unwrap()].url.clone())
            .collect()
    }

    fn keys(n: usize) -> Vec<u64> {
        (0..n)
            .map(|i| placement_hash(format!("key-{i}").as_bytes()))
            .collect()
    }

    #[test]
    fn points_are_placed_as_documented() {
        let bs = pool_of(&[(8001, 2)]);
        let ring = Ring::new(&bs);
        assert_eq!(ring.len(), 300);
        let first = placement_hash(b"http://127.0.0.1:8001#0");
        let hashes: Vec<u64> = ring.points.iter().map(|p| p.hash).collect();
        assert!(hashes.is_sorted());
        assert_eq!(
            ring.first_point(first),
            hashes.binary_search(&first).unwrap()
        );
        assert_eq!(
            ring.first_point(first + 1),
            hashes.partition_point(|&h| h <= first)
        );
        // A key past the last point wraps to the first.
        assert_eq!(ring.first_point(u64::MAX), 0);
    }

    #[test]
    fn keys_spread_within_a_fifth_of_fair_over_four_backends() {
        let keys = keys(10_000);
        for base in [8000u16, 9100, 20000, 31337] {
            let bs = pool_of(&[(base, 1), (base + 1, 1), (base + 2, 1), (base + 3, 1)]);
            let mut counts: HashMap<String, usize> = HashMap::new();
            for url in mapping(&bs, &keys) {
                *counts.entry(url).or_default() += 1;
            }
            for (url, n) in &counts {
                assert!(
                    (2000..=3000).contains(n),
                    "{url}: {n} of 10000 ({counts:?})"
                );
            }
        }
    }

    #[test]
    fn weights_take_their_share() {
        let bs = pool_of(&[(8001, 3), (8002, 1)]);
        let m = mapping(&bs, &keys(10_000));
        let heavy = m.iter().filter(|u| u.ends_with(":8001")).count();
        assert!((6750..=8250).contains(&heavy), "{heavy}");
    }

    #[test]
    fn retries_walk_clockwise_to_the_next_untried_backend() {
        let bs = backends(&[1, 1, 1]);
        let ring = Ring::new(&bs);
        for k in keys(200) {
            let first = ring.owner(k).unwrap();
            let tried = [bs[first].id];
            let ctx = PickCtx {
                tried: &tried,
                key: Some(k),
            };
            let second = ring.pick(&bs, &ctx, None).unwrap();
            assert_ne!(second, first);
            // It is the owner of the first point after the key that is not `first`'s.
            let mut p = ring.first_point(k);
            while ring.points[p].owner as usize == first {
                p = (p + 1) % ring.len();
            }
            assert_eq!(second, ring.points[p].owner as usize);
            let all: Vec<u64> = bs.iter().map(|b| b.id).collect();
            let none = PickCtx {
                tried: &all,
                key: Some(k),
            };
            assert_eq!(ring.pick(&bs, &none, None), None);
        }
    }

    #[test]
    fn a_bounded_ring_walks_past_busy_backends() {
        let bs = backends(&[1, 1, 1]);
        let ring = Ring::new(&bs);
        let k = keys(1)[0];
        let home = ring.owner(k).unwrap();
        let ctx = PickCtx {
            tried: &[],
            key: Some(k),
        };
        // Everyone idle: the key's own backend.
        assert_eq!(ring.pick(&bs, &ctx, Some(1.25)), Some(home));
        // The home backend holds 2 of 2 in flight: its cap is ceil(1.25 × 3 / 3) = 2.
        let _g: Vec<_> = (0..2).map(|_| bs[home].begin_request()).collect();
        let moved = ring.pick(&bs, &ctx, Some(1.25)).unwrap();
        assert_ne!(moved, home);
        // Without a factor nothing changes.
        assert_eq!(ring.pick(&bs, &ctx, None), Some(home));
        // A factor large enough admits it: ceil(3.0 × 3 / 3) = 3 > 2.
        assert_eq!(ring.pick(&bs, &ctx, Some(3.0)), Some(home));
    }

    fn pool_strategy() -> impl Strategy<Value = Vec<(u16, u32)>> {
        proptest::collection::btree_map(1024u16..60000, 1u32..4, 2..9)
            .prop_map(|m| m.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Removing a backend moves only its own keys; restoring it restores every key.
        #[test]
        fn removal_moves_only_its_keys_and_restoring_restores(
            pool in pool_strategy(),
            victim in any::<prop::sample::Index>(),
        ) {
            let keys = keys(2000);
            let all = pool_of(&pool);
            let before = mapping(&all, &keys);
            let v = victim.index(all.len());
            let gone = all[v].url.clone();
            let rest: Vec<_> = all.iter().enumerate().filter(|(i, _)| *i != v).map(|(_, b)| Arc::clone(b)).collect();
            let after = mapping(&rest, &keys);
            for (b, a) in before.iter().zip(&after) {
                if *b != gone {
                    prop_assert_eq!(b, a);
                }
            }
            // Back at the end of the pool (a new id, as the admin API gives it).
            let mut back = rest.clone();
            back.push(backend_at(99, all[v].url.rsplit(':').next().unwrap().parse().unwrap(), all[v].control.weight()));
            prop_assert_eq!(mapping(&back, &keys), before);
        }

        /// A ring derived from the previous one is the ring built afresh.
        #[test]
        fn a_derived_ring_is_the_fresh_ring(
            before in pool_strategy(),
            after in pool_strategy(),
        ) {
            // Backends are identified by id; give equal ports equal ids so that some are
            // kept, some reweighted, some removed and some added.
            let pool = |ps: &[(u16, u32)]| -> Vec<Arc<Backend>> {
                ps.iter().map(|&(port, w)| backend_at(port as u64, port, w)).collect()
            };
            let (old, new) = (pool(&before), pool(&after));
            let fresh = Ring::new(&new);
            let derived = Ring::from_previous(&Ring::new(&old), &new);
            prop_assert_eq!(fresh.points.len(), derived.points.len());
            for (f, d) in fresh.points.iter().zip(derived.points.iter()) {
                prop_assert_eq!((f.hash, f.owner), (d.hash, d.owner));
            }
            prop_assert_eq!(&fresh.buckets, &derived.buckets);
            prop_assert!(derived.built_for(&members(&new)));
        }

        /// Adding a backend moves keys only to it.
        #[test]
        fn an_added_backend_takes_keys_only_to_itself(pool in pool_strategy(), port in 60001u16..65000) {
            let keys = keys(2000);
            let bs = pool_of(&pool);
            let before = mapping(&bs, &keys);
            let mut more = bs.clone();
            more.push(backend_at(77, port, 1));
            let added = more[more.len() - 1].url.clone();
            let after = mapping(&more, &keys);
            let mut moved = 0;
            for (b, a) in before.iter().zip(&after) {
                if b != a {
                    prop_assert_eq!(a, &added);
                    moved += 1;
                }
            }
            prop_assert!(moved > 0);
        }
    }
}
