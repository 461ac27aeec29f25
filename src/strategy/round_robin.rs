use std::sync::atomic::{AtomicUsize, Ordering};

/// Rotates over the eligible backends, ignoring weights. One shared counter, so N
/// concurrent requests over k backends split exactly N/k; a new picker (any pool change)
/// starts again at the first backend.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl RoundRobin {
    /// A rotation that starts at index 0.
    pub(crate) fn new() -> Self {
        RoundRobin::default()
    }

    /// A rotation that goes on from `position` (see [`Self::position`]).
    pub(crate) fn starting_at(position: usize) -> Self {
        RoundRobin {
            next: AtomicUsize::new(position),
        }
    }

    /// How many picks this rotation has made.
    pub(crate) fn position(&self) -> usize {
        self.next.load(Ordering::Relaxed)
    }

    /// The index the next pick takes, without taking it (`n > 0`).
    pub(crate) fn peek(&self, n: usize) -> usize {
        self.position() % n
    }

    /// The next index in `0..n` (`n > 0`).
    #[inline]
    pub(crate) fn pick(&self, n: usize) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % n
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::*;

    #[test]
    fn a_rebuilt_rotation_goes_on_where_it_was() {
        let bs = backends(&[1, 1, 1]);
        let p = Picker::build(StrategyKind::RoundRobin, &bs);
        assert_eq!(sequence(&p, &bs, 4), "ABCA");
        let p2 = Picker::build(StrategyKind::RoundRobin, &bs).continuing(Some(&p));
        assert_eq!(sequence(&p2, &bs, 2), "BC");
        let fresh = Picker::build(StrategyKind::RoundRobin, &bs).continuing(None);
        assert_eq!(sequence(&fresh, &bs, 1), "A");
    }

    #[test]
    fn rotates_in_pool_order() {
        let bs = backends(&[5, 1, 1]);
        let p = Picker::build(StrategyKind::RoundRobin, &bs);
        assert_eq!(sequence(&p, &bs, 9), "ABCABCABC");
    }
}
