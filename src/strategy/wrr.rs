use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// nginx's smooth weighted round robin: every pick adds each backend's weight to its
/// `current`, takes the largest (ties to the lowest index) and subtracts the total from
/// the winner. Weights 5,3,2 give `A B C A A B A C B A`.
///
/// The sequence is periodic: after `sum(w) / gcd(w)` picks every `current` is back at
/// zero. When that period is small enough (up to 2²⁰ picks) the whole schedule is
/// computed once at build time, and a pick is one atomic increment and a table read — no
/// lock on the request path. Pools whose schedule would be larger (thousands of
/// backends with weights in the hundreds) run the algorithm live under a mutex.
///
/// Either way the algorithm runs as [`Stepper`]: O(distinct weights) per pick instead of
/// nginx's O(backends), with exactly nginx's sequence.
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
        stepper: Mutex<Stepper>,
    },
}

/// Largest schedule kept (entries of 4 bytes).
const MAX_SCHEDULE: u64 = 1 << 20;
/// Work allowed to precompute a schedule (period × distinct weights).
const MAX_PRECOMPUTE_WORK: u64 = 64 << 20;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// nginx's smooth WRR in O(distinct weights) per step (nginx's own loop is O(backends);
/// no crate implements this, hence by hand).
///
/// After `t` steps, backend i's `current` is `t·wᵢ − total·cᵢ`, where `cᵢ` counts its
/// wins. Within one weight class the `t·w` part is shared, so the class's best is the
/// member with the fewest wins, ties to the lowest index — and since members start
/// equal and only the best wins, a class simply rotates through its members in index
/// order: `round` wins each for those at and after `at`, `round + 1` for those before.
/// A step compares each class's head (`(t+1)·w − total·round`, ties to the lowest
/// index) and advances the winning class. After a full period every count equals its
/// weight and every `current` is zero, so the counters restart there and stay small.
#[derive(Debug, Clone)]
struct Stepper {
    classes: Box<[Class]>,
    total: i64,
    /// Steps taken in this period.
    t: i64,
}

#[derive(Debug, Clone)]
struct Class {
    weight: i64,
    /// Pool indices, ascending.
    members: Box<[u32]>,
    at: usize,
    round: i64,
}

impl Stepper {
    /// For reduced weights (each ≥ 1, not empty).
    fn new(weights: &[i64]) -> Stepper {
        let mut by_weight: std::collections::BTreeMap<i64, Vec<u32>> = Default::default();
        for (i, &w) in weights.iter().enumerate() {
            by_weight.entry(w).or_default().push(i as u32);
        }
        Stepper {
            classes: by_weight
                .into_iter()
                .map(|(weight, members)| Class {
                    weight,
                    members: members.into_boxed_slice(),
                    at: 0,
                    round: 0,
                })
                .collect(),
            total: weights.iter().sum(),
            t: 0,
        }
    }

    /// The next winner's pool index.
    #[inline]
    fn step(&mut self) -> usize {
        let t1 = self.t + 1;
        let mut best: Option<(usize, i64, u32)> = None;
        for (c, class) in self.classes.iter().enumerate() {
            // t ≤ total and round ≤ weight ≤ 1000, so both products stay under
            // 1000 × total: in i64 for any pool below 9 × 10¹² backends.
            let value = t1 * class.weight - self.total * class.round;
            let idx = class.members[class.at];
            if best.is_none_or(|(_, v, i)| value > v || (value == v && idx < i)) {
                best = Some((c, value, idx));
            }
        }
        let Some((c, _, idx)) = best else {
            return 0; // no classes: only for an empty pool, which is never stepped
        };
        let class = &mut self.classes[c];
        class.at += 1;
        if class.at == class.members.len() {
            class.at = 0;
            class.round += 1;
        }
        self.t += 1;
        if self.t == self.total {
            // Every backend has won exactly its weight: all `current`s are zero again.
            self.t = 0;
            for class in self.classes.iter_mut() {
                class.round = 0;
            }
        }
        idx as usize
    }
}

impl SmoothWeightedRoundRobin {
    /// Builds the schedule for `weights` (pool order, each ≥ 1).
    pub(crate) fn new(weights: &[u32]) -> Self {
        let g = weights.iter().fold(0u64, |g, &w| gcd(g, w as u64)).max(1);
        let reduced: Box<[i64]> = weights.iter().map(|&w| (w as u64 / g) as i64).collect();
        let mut stepper = Stepper::new(&reduced);
        let period = stepper.total as u64;
        let work = period.saturating_mul(stepper.classes.len() as u64);
        if period <= MAX_SCHEDULE && work <= MAX_PRECOMPUTE_WORK {
            let schedule = (0..period).map(|_| stepper.step() as u32).collect();
            SmoothWeightedRoundRobin {
                mode: Mode::Table {
                    weights: reduced,
                    schedule,
                    next: AtomicUsize::new(0),
                },
            }
        } else {
            SmoothWeightedRoundRobin {
                mode: Mode::Live {
                    weights: reduced,
                    stepper: Mutex::new(stepper),
                },
            }
        }
    }

    /// Carries the rotation over from the picker this one replaces when both run the
    /// same weights (a republish that changed nothing the algorithm sees, such as the
    /// last step of a slow start that rounds to the same whole weight), so the sequence
    /// continues instead of restarting.
    pub(crate) fn continuing(self, previous: &SmoothWeightedRoundRobin) -> Self {
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
                Mode::Live { weights, stepper },
                Mode::Live {
                    weights: pw,
                    stepper: ps,
                },
            ) if weights == pw => {
                let prev = ps.lock().unwrap_or_else(|e| e.into_inner()).clone();
                *stepper.lock().unwrap_or_else(|e| e.into_inner()) = prev;
            }
            _ => {}
        }
        self
    }

    /// Starts the rotation at a random point of its schedule: a schedule rebuilt with
    /// new weights every 250 ms (round robin under slow start) would otherwise begin at
    /// the first backend each time, and a pool with few requests per rebuild would send
    /// them all there. Live schedules (huge pools) keep their start.
    pub(crate) fn starting_anywhere(self) -> Self {
        if let Mode::Table { schedule, next, .. } = &self.mode {
            next.store(fastrand::usize(..schedule.len().max(1)), Ordering::Relaxed);
        }
        self
    }

    /// The index the next pick takes, without taking it (the pool must not be empty).
    pub(crate) fn peek(&self) -> usize {
        match &self.mode {
            Mode::Table { schedule, next, .. } => {
                schedule[next.load(Ordering::Relaxed) % schedule.len()] as usize
            }
            Mode::Live { stepper, .. } => {
                let mut copy = stepper.lock().unwrap_or_else(|e| e.into_inner()).clone();
                copy.step()
            }
        }
    }

    /// The next index (the pool must not be empty).
    #[inline]
    pub(crate) fn pick(&self) -> usize {
        match &self.mode {
            Mode::Table { schedule, next, .. } => {
                let i = next.fetch_add(1, Ordering::Relaxed) % schedule.len();
                schedule[i] as usize
            }
            // A poisoned lock only means another pick panicked mid-step; the numbers
            // are still usable.
            Mode::Live { stepper, .. } => stepper.lock().unwrap_or_else(|e| e.into_inner()).step(),
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

    /// nginx's loop, as nginx writes it: the reference.
    fn nginx_step(weights: &[i64], current: &mut [i64]) -> usize {
        let total: i64 = weights.iter().sum();
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

    #[test]
    fn live_mode_matches_table_mode() {
        let weights = [5u32, 3, 2];
        let table = SmoothWeightedRoundRobin::new(&weights);
        let reduced: Box<[i64]> = weights.iter().map(|&w| w as i64).collect();
        let live = SmoothWeightedRoundRobin {
            mode: Mode::Live {
                stepper: Mutex::new(Stepper::new(&reduced)),
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
    fn ten_thousand_backends_with_weights_to_ten_precompute() {
        let weights: Vec<u32> = (0..10_000).map(|i| 1 + (i % 10)).collect();
        let p = SmoothWeightedRoundRobin::new(&weights);
        assert!(matches!(p.mode, Mode::Table { .. }));
    }

    #[test]
    fn huge_pools_fall_back_to_live_mode() {
        let weights: Vec<u32> = (0..10_000).map(|i| 1 + (i % 1000)).collect();
        let p = SmoothWeightedRoundRobin::new(&weights);
        assert!(matches!(p.mode, Mode::Live { .. }));
        let reduced: Vec<i64> = weights.iter().map(|&w| w as i64).collect();
        let mut current = vec![0i64; weights.len()];
        for _ in 0..200 {
            assert_eq!(p.pick(), nginx_step(&reduced, &mut current));
        }
    }

    proptest! {
        /// The stepper is nginx's loop, step for step, across period boundaries — with
        /// many equal weights, so ties inside and across classes are exercised.
        #[test]
        fn the_stepper_is_nginx(weights in proptest::collection::vec(1i64..=6, 1..40)) {
            let mut stepper = Stepper::new(&weights);
            let mut current = vec![0i64; weights.len()];
            let total: i64 = weights.iter().sum();
            for _ in 0..(2 * total + 7) {
                prop_assert_eq!(stepper.step(), nginx_step(&weights, &mut current));
            }
        }

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
