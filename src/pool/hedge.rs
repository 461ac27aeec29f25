//! A pool's hedging (`docs/traffic.md`, "Hedged requests"): when a hedge goes out, and
//! how the hedges sent fared (`fulcrum_hedges_total{pool,result}`).
//!
//! With `hedge.after = "pNN"` the delay is that percentile of the pool's last 1 000
//! answer heads, kept in a ring of atomics every worker writes without a lock. Finding a
//! percentile sorts a copy of the ring, so it is found again only every 50 samples and
//! read from a cell in between.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::config::HedgeAfter;

/// Answer heads a percentile is taken over.
const WINDOW: usize = 1000;
/// Answer heads seen before a percentile is trusted: no hedge before.
const MIN_SAMPLES: u64 = 100;
/// Samples between two findings of the percentile.
const REFRESH: u64 = 50;

/// A pool's hedging: its rule and its counts.
#[derive(Debug)]
pub(crate) struct Hedging {
    after: HedgeAfter,
    /// Most hedges per request.
    pub(crate) max: u32,
    /// The last answer heads' latencies in microseconds, for `pNN` (empty otherwise).
    window: Box<[AtomicU32]>,
    /// Samples written so far (the next one goes at this modulo the window).
    written: AtomicU64,
    /// The percentile last found: the low 32 bits of the count it was found at, then
    /// its value in microseconds; one word, so that no worker reads one without the
    /// other. 0: none found yet.
    found: AtomicU64,
    /// Hedges whose answer was used, and the others.
    won: AtomicU64,
    lost: AtomicU64,
}

impl Hedging {
    /// The hedging of a pool whose `hedge.after` is `after`.
    pub(crate) fn new(after: HedgeAfter, max: u32) -> Hedging {
        let len = match after {
            HedgeAfter::Percentile(_) => WINDOW,
            HedgeAfter::Fixed(_) => 0,
        };
        Hedging {
            after,
            max,
            window: (0..len).map(|_| AtomicU32::new(0)).collect(),
            written: AtomicU64::new(0),
            found: AtomicU64::new(0),
            won: AtomicU64::new(0),
            lost: AtomicU64::new(0),
        }
    }

    /// Notes an answer head's latency (only a percentile rule keeps them).
    #[inline]
    pub(crate) fn sample(&self, latency: Duration) {
        if self.window.is_empty() {
            return;
        }
        let n = self.written.fetch_add(1, Ordering::Relaxed);
        let us = u32::try_from(latency.as_micros()).unwrap_or(u32::MAX);
        self.window[(n % WINDOW as u64) as usize].store(us, Ordering::Relaxed);
    }

    /// How long a request waits for an answer head before a hedge goes out; `None`: no
    /// hedge (a percentile over fewer than 100 answer heads).
    pub(crate) fn delay(&self) -> Option<Duration> {
        let q = match self.after {
            HedgeAfter::Fixed(d) => return Some(d),
            HedgeAfter::Percentile(q) => q,
        };
        let written = self.written.load(Ordering::Relaxed);
        if written < MIN_SAMPLES {
            return None;
        }
        let found = self.found.load(Ordering::Relaxed);
        let (at, us) = (found >> 32, found & u64::from(u32::MAX));
        let stale = u64::from((written as u32).wrapping_sub(at as u32)) >= REFRESH;
        if found != 0 && !stale {
            return Some(Duration::from_micros(us));
        }
        // Two requests may find it at once; both store about the same figure.
        let us = self.percentile(q, written)?;
        self.found.store(
            (written & u64::from(u32::MAX)) << 32 | us,
            Ordering::Relaxed,
        );
        Some(Duration::from_micros(us))
    }

    /// The `q`th percentile of the samples in the window, `written` of them so far
    /// (a slot counted but not written yet, still 0, left out).
    fn percentile(&self, q: f64, written: u64) -> Option<u64> {
        let len = written.min(WINDOW as u64) as usize;
        let mut v: Vec<u32> = (self.window[..len].iter())
            .map(|s| s.load(Ordering::Relaxed))
            .filter(|&us| us != 0)
            .collect();
        if v.is_empty() {
            return None;
        }
        // The nearest rank; the small subtraction keeps `99.9 × 1000 / 100` at 999
        // where floating point makes it 999.0000000000001.
        let rank = ((q * v.len() as f64) / 100.0 - 1e-9).ceil() as usize;
        let i = rank.clamp(1, v.len()) - 1;
        let (_, nth, _) = v.select_nth_unstable(i);
        Some(u64::from((*nth).max(1)))
    }

    /// Counts a hedge sent: `won` when its answer was the one used.
    pub(crate) fn count(&self, won: bool) {
        let c = if won { &self.won } else { &self.lost };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Hedges won and lost so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let won = self.won.load(Ordering::Relaxed);
        (won, self.lost.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_delay_needs_no_samples() {
        let h = Hedging::new(HedgeAfter::Fixed(Duration::from_millis(50)), 1);
        assert_eq!(h.delay(), Some(Duration::from_millis(50)));
        h.sample(Duration::from_millis(1));
        assert_eq!(h.written.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_percentile_waits_for_100_samples_then_follows_the_last_thousand() {
        let h = Hedging::new(HedgeAfter::Percentile(95.0), 1);
        for ms in 1..=99 {
            h.sample(Duration::from_millis(ms));
        }
        assert_eq!(h.delay(), None);
        h.sample(Duration::from_millis(100));
        assert_eq!(h.delay(), Some(Duration::from_millis(95)));
        // Slower answers push the old ones out of the window.
        for _ in 0..WINDOW {
            h.sample(Duration::from_millis(700));
        }
        assert_eq!(h.delay(), Some(Duration::from_millis(700)));
    }

    #[test]
    fn p99_9_of_a_thousand_is_the_999th() {
        let h = Hedging::new(HedgeAfter::Percentile(99.9), 1);
        for ms in 1..=1000 {
            h.sample(Duration::from_millis(ms));
        }
        assert_eq!(h.delay(), Some(Duration::from_millis(999)));
    }
}
