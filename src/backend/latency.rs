//! A backend's latency: the average the admin API shows, and the cells the strategies
//! keep their own estimates in. Every cell is one atomic word updated by
//! compare-and-swap: the request path folds a sample in without a lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Sentinel for "no latency sample yet" in the EWMA cells.
const NO_SAMPLE: u64 = u64::MAX;
/// Sentinel for "never sampled" in the time stamp of the last sample.
const NEVER: u64 = u64::MAX;

/// Nanoseconds on the monotonic clock (the request path's, `clock::Stamp`): the time
/// stamps of the latency estimates.
#[inline]
pub fn clock_ns() -> u64 {
    crate::clock::Stamp::now().ns()
}

/// How many estimate cells a backend has for the strategies ([`Estimates`]).
pub(crate) const ESTIMATE_CELLS: usize = 2;

/// Latency estimates the strategies keep on a backend, one `f64` cell each (in an
/// `AtomicU64`, updated by compare-and-swap), empty until the first sample and emptied
/// when the backend's measurements are cleared. Which cell means what, and how a sample
/// folds into it, is the business of the strategy that owns the cell
/// (`strategy::estimate`); the backend only stores them, so that a strategy switch finds
/// them up to date.
#[derive(Debug)]
pub(crate) struct Estimates([AtomicU64; ESTIMATE_CELLS]);

impl Estimates {
    fn new() -> Estimates {
        Estimates([const { AtomicU64::new(NO_SAMPLE) }; ESTIMATE_CELLS])
    }

    /// The value of `cell`, `None` while it is empty.
    #[inline]
    pub(crate) fn get(&self, cell: usize) -> Option<f64> {
        let bits = self.0[cell].load(Ordering::Relaxed);
        (bits != NO_SAMPLE).then(|| f64::from_bits(bits))
    }

    /// Replaces the value of `cell` with `next(value)`, atomically.
    #[inline]
    pub(crate) fn update(&self, cell: usize, next: impl Fn(Option<f64>) -> f64) {
        let _ = self.0[cell].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
            Some(next((bits != NO_SAMPLE).then(|| f64::from_bits(bits))).to_bits())
        });
    }

    fn clear(&self) {
        for c in &self.0 {
            c.store(NO_SAMPLE, Ordering::Relaxed);
        }
    }
}

/// The latency numbers of one backend.
#[derive(Debug)]
pub(crate) struct Latency {
    /// Latency EWMA in nanoseconds as f64 bits; `NO_SAMPLE` when unsampled. This is the
    /// average the admin API shows as `avg_latency_ms`.
    ewma: AtomicU64,
    /// The weight of a new sample (`--ewma-alpha`).
    alpha: f64,
    /// The strategies' own latency estimates.
    pub(crate) estimates: Estimates,
    /// [`clock_ns`] of the last latency sample; `NEVER` before the first.
    sampled_at: AtomicU64,
}

impl Latency {
    /// No sample yet; new samples weigh `alpha`.
    pub(crate) fn new(alpha: f64) -> Latency {
        Latency {
            ewma: AtomicU64::new(NO_SAMPLE),
            alpha,
            estimates: Estimates::new(),
            sampled_at: AtomicU64::new(NEVER),
        }
    }

    /// Folds one sample into the average and notes its time; returns the time since the
    /// sample before it (`None` for the first).
    ///
    /// Two samples that land at the same moment each take the time since the sample
    /// before them from one `swap` of the time stamp, so elapsed time is never counted
    /// twice; the order in which their values are folded in may differ from the order of
    /// their time stamps by the width of the race, which moves an average by a rounding
    /// error.
    pub(crate) fn note(&self, sample: Duration, now: u64) -> Option<u64> {
        let x = sample.as_nanos() as f64;
        let alpha = self.alpha;
        let _ = self
            .ewma
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let next = if bits == NO_SAMPLE {
                    x
                } else {
                    let prev = f64::from_bits(bits);
                    prev + alpha * (x - prev)
                };
                Some(next.to_bits())
            });
        match self.sampled_at.swap(now, Ordering::Relaxed) {
            NEVER => None,
            t => Some(now.saturating_sub(t)),
        }
    }

    /// The average, `None` until the first sample.
    pub(crate) fn average(&self) -> Option<Duration> {
        let bits = self.ewma.load(Ordering::Relaxed);
        (bits != NO_SAMPLE).then(|| Duration::from_nanos(f64::from_bits(bits) as u64))
    }

    /// The EWMA weight of a new sample.
    pub(crate) fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Forgets the average, every estimate and the time of the last sample.
    pub(crate) fn clear(&self) {
        self.ewma.store(NO_SAMPLE, Ordering::Relaxed);
        self.estimates.clear();
        self.sampled_at.store(NEVER, Ordering::Relaxed);
    }

    /// [`clock_ns`] of the last sample, `None` before the first.
    #[inline]
    pub(crate) fn sampled_at(&self) -> Option<u64> {
        match self.sampled_at.load(Ordering::Relaxed) {
            NEVER => None,
            t => Some(t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_average_is_seeded_by_the_first_sample() {
        let l = Latency::new(0.5);
        assert_eq!(l.average(), None);
        assert_eq!(l.note(Duration::from_millis(100), 10), None);
        assert_eq!(l.average(), Some(Duration::from_millis(100)));
        assert_eq!(l.note(Duration::from_millis(200), 25), Some(15));
        assert_eq!(l.average(), Some(Duration::from_millis(150)));
        l.clear();
        assert_eq!((l.average(), l.sampled_at()), (None, None));
    }
}
