//! A split route's choice of pool (`docs/traffic.md`, "Splits").
//!
//! Without a key, smooth weighted round robin (nginx's): one cycle of the schedule is
//! computed when the routing table is built, and each request takes the next place in it
//! with one atomic increment, so 95/5 sends exactly 5 of every 100 to the small side, and
//! no lock is taken. With `split_key`, weighted rendezvous hashing: each side scores the
//! key's hash (XXH3-64, as every placement, `strategy::key`) seeded with its pool's name,
//! divided by its weight, and the best score wins. So one key always lands on one side
//! while the weights stay, and raising one side's weight only moves keys onto that side
//! (its scores improve; no other's change).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::config::split::SplitSpec;
use crate::config::HashKey;
use crate::strategy::key::{placement_hash, placement_hash_seeded};

/// What a split keeps across routing tables while its route keeps its conditions and
/// sides: its place in the schedule and how many requests each side took.
#[derive(Debug)]
struct Kept {
    /// The sides' pool names, in order.
    names: Vec<String>,
    /// The next place in the schedule.
    next: AtomicU64,
    /// Requests each side took.
    taken: Box<[AtomicU64]>,
}

/// A split route's sides, ready for the request path.
#[derive(Debug)]
pub(crate) struct Splitter {
    /// Each side's pool, by its index in the routing's pools.
    pools: Vec<usize>,
    /// Each side's weight.
    weights: Vec<u32>,
    /// One cycle of smooth weighted round robin: side indices.
    schedule: Box<[u8]>,
    /// Each side's seed for rendezvous hashing (its pool name's hash).
    seeds: Vec<u64>,
    /// `split_key`.
    key: Option<HashKey>,
    kept: Arc<Kept>,
}

impl Splitter {
    /// The splitter of `spec`, whose sides' pools are at `pools`; it goes on from
    /// `old`'s place and counts when `old` had the same sides.
    pub(crate) fn new(spec: &SplitSpec, pools: Vec<usize>, old: Option<&Splitter>) -> Splitter {
        let weights: Vec<u32> = spec.sides.iter().map(|s| s.weight).collect();
        let names: Vec<String> = spec.sides.iter().map(|s| s.pool.clone()).collect();
        let kept = match old {
            Some(o) if o.kept.names == names => Arc::clone(&o.kept),
            _ => Arc::new(Kept {
                taken: names.iter().map(|_| AtomicU64::new(0)).collect(),
                names,
                next: AtomicU64::new(0),
            }),
        };
        Splitter {
            pools,
            schedule: schedule(&weights),
            seeds: (spec.sides.iter())
                .map(|s| placement_hash(s.pool.as_bytes()))
                .collect(),
            weights,
            key: spec.key.clone(),
            kept,
        }
    }

    /// `split_key`, when the route has one.
    pub(crate) fn key(&self) -> Option<&HashKey> {
        self.key.as_ref()
    }

    /// The pool (its index in the routing's pools) of the next request, whose key hashed
    /// to `key` (`None`: it has none, and takes the next place of the schedule); counted.
    #[inline]
    pub(crate) fn pick(&self, key: Option<u64>) -> usize {
        let side = match key {
            None => self.place(self.kept.next.fetch_add(1, Ordering::Relaxed)),
            Some(h) => self.rendezvous(h),
        };
        if let Some(t) = self.kept.taken.get(side) {
            t.fetch_add(1, Ordering::Relaxed);
        }
        self.pools.get(side).copied().unwrap_or(0)
    }

    /// What [`Self::pick`] would say, without taking the place or counting: the pool's
    /// index and whether the key placed it (`POST /admin/explain`).
    pub(crate) fn peek(&self, key: Option<u64>) -> (usize, bool) {
        let side = match key {
            None => self.place(self.kept.next.load(Ordering::Relaxed)),
            Some(h) => self.rendezvous(h),
        };
        (self.pools.get(side).copied().unwrap_or(0), key.is_some())
    }

    /// The side at place `n` of the schedule.
    fn place(&self, n: u64) -> usize {
        let at = (n % self.schedule.len() as u64) as usize;
        self.schedule.get(at).map_or(0, |&s| usize::from(s))
    }

    /// The side whose weighted score of `h` is best (the lowest `-ln(u) / weight`).
    fn rendezvous(&self, h: u64) -> usize {
        let mut best = (f64::INFINITY, 0);
        for (i, (&w, &seed)) in self.weights.iter().zip(&self.seeds).enumerate() {
            if w == 0 {
                continue;
            }
            let x = placement_hash_seeded(&h.to_le_bytes(), seed);
            // A uniform number in (0, 1): the hash's top 53 bits, never 0.
            let u = ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let score = -u.ln() / f64::from(w);
            if score < best.0 {
                best = (score, i);
            }
        }
        best.1
    }

    /// Each side's pool name and the requests it took.
    pub(crate) fn taken(&self) -> Vec<(&str, u64)> {
        (self.kept.names.iter())
            .zip(self.kept.taken.iter())
            .map(|(n, t)| (n.as_str(), t.load(Ordering::Relaxed)))
            .collect()
    }
}

/// One cycle of smooth weighted round robin over `weights` (divided by their greatest
/// common divisor, so 95/5 is a cycle of 20): each place's side index.
fn schedule(weights: &[u32]) -> Box<[u8]> {
    let g = weights.iter().fold(0, |g, &w| gcd(g, w)).max(1);
    let w: Vec<i64> = weights.iter().map(|&x| i64::from(x / g)).collect();
    let total: i64 = w.iter().sum();
    let mut current = vec![0i64; w.len()];
    let mut out = Vec::with_capacity(total.max(1) as usize);
    for _ in 0..total {
        for (c, &wi) in current.iter_mut().zip(&w) {
            *c += wi;
        }
        // The first of the highest, as nginx.
        let (best, _) =
            (current.iter().enumerate())
                .fold((0, i64::MIN), |b, (i, &c)| if c > b.1 { (i, c) } else { b });
        current[best] -= total;
        out.push(best as u8);
    }
    if out.is_empty() {
        out.push(0);
    }
    out.into_boxed_slice()
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::split::Side;

    fn spec(sides: &[(&str, u32)], key: Option<HashKey>) -> SplitSpec {
        SplitSpec {
            sides: (sides.iter())
                .map(|&(p, w)| Side {
                    pool: p.into(),
                    weight: w,
                })
                .collect(),
            key,
        }
    }

    #[test]
    fn round_robin_is_exact_and_smooth() {
        let s = Splitter::new(&spec(&[("v1", 95), ("v2", 5)], None), vec![3, 7], None);
        let picks: Vec<usize> = (0..200).map(|_| s.pick(None)).collect();
        assert_eq!(picks.iter().filter(|&&p| p == 7).count(), 10);
        // Smooth: the small side's requests are spread, never two in a row.
        assert!(picks.windows(2).all(|w| !(w[0] == 7 && w[1] == 7)));
        assert_eq!(s.taken(), [("v1", 190), ("v2", 10)]);
        let three = schedule(&[5, 1, 1]);
        assert_eq!(&*three, &[0, 0, 1, 0, 2, 0, 0]);
        assert_eq!(&*schedule(&[0, 4]), &[1]);
    }

    #[test]
    fn a_key_stays_on_its_side_and_moves_only_onto_a_heavier_one() {
        let at = |w1: u32, w2: u32, w3: u32| {
            let sides = [("a", w1), ("b", w2), ("c", w3)];
            let s = Splitter::new(&spec(&sides, Some(HashKey::ClientIp)), vec![0, 1, 2], None);
            (0..3000u64)
                .map(|k| s.pick(Some(placement_hash(&k.to_le_bytes()))))
                .collect::<Vec<_>>()
        };
        let before = at(50, 30, 20);
        assert_eq!(before, at(50, 30, 20), "the same key, the same side");
        let share = |v: &[usize], side| v.iter().filter(|&&p| p == side).count();
        assert!(
            (1350..1650).contains(&share(&before, 0)),
            "{}",
            share(&before, 0)
        );
        assert!(
            (450..750).contains(&share(&before, 2)),
            "{}",
            share(&before, 2)
        );
        let after = at(50, 30, 60);
        for (b, a) in before.iter().zip(&after) {
            assert!(a == b || *a == 2, "a key moved from {b} to {a}");
        }
        assert!(share(&after, 2) > share(&before, 2));
        // A side of weight 0 takes no key.
        assert_eq!(share(&at(50, 0, 20), 1), 0);
    }

    #[test]
    fn the_place_and_counts_are_kept_for_the_same_sides() {
        let old = Splitter::new(&spec(&[("v1", 1), ("v2", 1)], None), vec![0, 1], None);
        assert_eq!(old.pick(None), 0);
        let same = Splitter::new(&spec(&[("v1", 1), ("v2", 3)], None), vec![0, 1], Some(&old));
        assert_eq!(same.taken(), [("v1", 1), ("v2", 0)]);
        let other = Splitter::new(&spec(&[("v3", 1), ("v2", 1)], None), vec![0, 1], Some(&old));
        assert_eq!(other.taken(), [("v3", 0), ("v2", 0)]);
    }
}
