use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// nginx's smooth weighted round robin: every pick adds each backend's weight to its
/// `current`, takes the largest (ties to the lowest index) and subtracts the total from
/// the winner. Weights 5,3,2 give `A B C A A B A C B A`.
///
/// The sequence is periodic: after `sum(w) / gcd(w)` picks every `current` is back at
/// zero. When that period is small enough the whole schedule is computed once at build
/// time, and a pick is one atomic increment and a table read — no lock on the request
/// path. Pools whose schedule would be too large to precompute fall back to running the
/// algorithm live under a mutex.
#[derive(Debug)]
pub struct SmoothWeightedRoundRobin {
    mode: Mode,
}

#[derive(Debug)]
enum Mode {
    Table {
        weights: Box<[i64]>,
        schedule: Box<[u32]>,
        next: AtomicUsize,
    },
    Live {
        weights: Box<[i64]>,
        total: i64,
        current: Mutex<Box<[i64]>>,
    },
}

/// Work allowed to precompute a schedule (period × backends).
const MAX_PRECOMPUTE_WORK: u64 = 8 << 20;
/// Largest schedule kept (entries of 4 bytes).
const MAX_SCHEDULE: u64 = 1 << 20;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// One step of the algorithm: returns the winner and updates `current`.
#[inline]
fn step(weights: &[i64], total: i64, current: &mut [i64]) -> usize {
    let mut best = 0;
    for i in 0..weights.len() {
        current[i] += weights[i];
        if current[i] > current[best] {
            best = i;
        }
    }
    current[best] -= total;
    best
}

impl SmoothWeightedRoundRobin {
    /// Builds the schedule for `weights` (pool order, each ≥ 1).
    pub fn new(weights: &[u32]) -> Self {
        let g = weights.iter().fold(0u64, |g, &w| gcd(g, w as u64)).max(1);
        let reduced: Box<[i64]> = weights.iter().map(|&w| (w as u64 / g) as i64).collect();
        let total: i64 = reduced.iter().sum();
        let period = total as u64;
        let n = weights.len() as u64;
        if period <= MAX_SCHEDULE && period.saturating_mul(n) <= MAX_PRECOMPUTE_WORK {
            let mut current = vec![0i64; reduced.len()];
            let schedule = (0..period)
                .map(|_| step(&reduced, total, &mut current) as u32)
                .collect();
            SmoothWeightedRoundRobin {
                mode: Mode::Table {
                    weights: reduced,
                    schedule,
                    next: AtomicUsize::new(0),
                },
            }
        } else {
            let current = Mutex::new(vec![0i64; reduced.len()].into_boxed_slice());
            SmoothWeightedRoundRobin {
                mode: Mode::Live {
                    weights: reduced,
                    total,
                    current,
                },
            }
        }
    }

    /// Carries the rotation over from the picker this one replaces when both run the
    /// same weights (a republish that changed nothing the algorithm sees, such as the
    /// last step of a slow start that rounds to the same whole weight), so the sequence
    /// continues instead of restarting.
    pub fn continuing(self, previous: &SmoothWeightedRoundRobin) -> Self {
        match (&self.mode, &previous.mode) {
            (
                Mode::Table { weights, next, .. },
                Mode::Table {
                    weights: pw,
                    next: pn,
                    ..
                },
            ) if weights == pw => {
                next.store(pn.load(Ordering::Relaxed), Ordering::Relaxed);
            }
            (
                Mode::Live {
                    weights, current, ..
                },
                Mode::Live {
                    weights: pw,
                    current: pc,
                    ..
                },
            ) if weights == pw => {
                let prev = pc.lock().unwrap_or_else(|e| e.into_inner()).clone();
                *current.lock().unwrap_or_else(|e| e.into_inner()) = prev;
            }
            _ => {}
        }
        self
    }

    /// The next index (the pool must not be empty).
    #[inline]
    pub fn pick(&self) -> usize {
        match &self.mode {
            Mode::Table { schedule, next, .. } => {
                let i = next.fetch_add(1, Ordering::Relaxed) % schedule.len();
                schedule[i] as usize
            }
            Mode::Live {
                weights,
                total,
                current,
            } => {
                // A poisoned lock only means another pick panicked mid-step; the
                // numbers are still usable.
                let mut cur = current.lock().unwrap_or_else(|e| e.into_inner());
                step(weights, *total, &mut cur)
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

    #[test]
    fn nginx_sequences() {
        let bs = backends(&[5, 3, 2]);
        let p = Picker::build(StrategyKind::WeightedRoundRobin, &bs);
        assert_eq!(sequence(&p, &bs, 20), "ABCAABACBAABCAABACBA");
        let bs = backends(&[5, 1, 1]);
        let p = Picker::build(StrategyKind::WeightedRoundRobin, &bs);
        assert_eq!(sequence(&p, &bs, 7), "AABACAA");
    }

    #[test]
    fn live_mode_matches_table_mode() {
        let weights = [5u32, 3, 2];
        let table = SmoothWeightedRoundRobin::new(&weights);
        let reduced: Box<[i64]> = weights.iter().map(|&w| w as i64).collect();
        let live = SmoothWeightedRoundRobin {
            mode: Mode::Live {
                total: reduced.iter().sum(),
                current: Mutex::new(vec![0; 3].into_boxed_slice()),
                weights: reduced,
            },
        };
        for _ in 0..100 {
            assert_eq!(table.pick(), live.pick());
        }
    }

    #[test]
    fn a_rebuild_with_the_same_weights_continues_the_sequence() {
        let old = SmoothWeightedRoundRobin::new(&[5, 3, 2]);
        let first: Vec<usize> = (0..4).map(|_| old.pick()).collect();
        assert_eq!(first, [0, 1, 2, 0]);
        let same = SmoothWeightedRoundRobin::new(&[5, 3, 2]).continuing(&old);
        let rest: Vec<usize> = (0..6).map(|_| same.pick()).collect();
        assert_eq!(rest, [0, 1, 0, 2, 1, 0], "A B A C B A continues");
        // Different weights start their own sequence.
        let other = SmoothWeightedRoundRobin::new(&[1, 1]).continuing(&same);
        assert_eq!(other.pick(), 0);
    }

    #[test]
    fn huge_pools_fall_back_to_live_mode() {
        let weights: Vec<u32> = (0..10_000).map(|i| 1 + (i % 1000)).collect();
        let p = SmoothWeightedRoundRobin::new(&weights);
        assert!(matches!(p.mode, Mode::Live { .. }));
        // Reference: the algorithm as nginx writes it.
        let total: i64 = weights.iter().map(|&w| w as i64).sum();
        let mut current = vec![0i64; weights.len()];
        for _ in 0..200 {
            let mut best = 0;
            for i in 0..weights.len() {
                current[i] += weights[i] as i64;
                if current[i] > current[best] {
                    best = i;
                }
            }
            current[best] -= total;
            assert_eq!(p.pick(), best);
        }
    }

    proptest! {
        /// Over one period (the sum of the weights) every backend is picked exactly
        /// its weight's number of times, and no backend waits longer than it should.
        #[test]
        fn shares_are_exact(weights in proptest::collection::vec(1u32..=1000, 1..12)) {
            let p = SmoothWeightedRoundRobin::new(&weights);
            let total: u32 = weights.iter().sum();
            let mut counts = vec![0u32; weights.len()];
            for _ in 0..total {
                counts[p.pick()] += 1;
            }
            prop_assert_eq!(&counts, &weights);
            // and again for a second period
            for _ in 0..total {
                counts[p.pick()] += 1;
            }
            let doubled: Vec<u32> = weights.iter().map(|w| w * 2).collect();
            prop_assert_eq!(counts, doubled);
        }
    }
}
