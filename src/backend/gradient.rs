//! Adaptive concurrency (`max_conns = "auto"`, `docs/operations.md`, "Adaptive
//! concurrency"): a backend's limit on requests in flight follows its latency, as
//! Netflix's concurrency-limits `Gradient2Limit` does. The limit shrinks when the
//! short-term latency rises above the long-term one (requests queue inside the backend)
//! and grows, a few slots at a time, while it does not and the limit is in use.
//!
//! Two departures from Gradient2, each against the limit creeping up under a long
//! overload: the long-term latency learns a rise slowly (over [`LONG_RISE`], whatever
//! the traffic) and a fall at once, so latency that grows because requests queue does
//! not become the new normal; and a limit starts small ([`INITIAL`]), so that its first
//! windows measure the backend unqueued.
//!
//! The request path only adds each latency to the current window (three relaxed atomic
//! operations, for a backend with an adaptive limit only); the pool's upkeep task closes
//! windows and moves the limit, so the arithmetic and its state stay on the control side.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The limit an adaptive backend starts with (within its bounds).
const INITIAL: f64 = 4.0;
/// How much higher than the long-term latency the short-term one may be before the
/// limit shrinks.
const TOLERANCE: f64 = 1.5;
/// The share of a new limit taken at each step (the rest is the old one).
const SMOOTHING: f64 = 0.2;
/// The fewest slots added at each step while nothing queues (the square root of the
/// limit when that is more): room to find out whether more would be served as fast.
const QUEUE: f64 = 4.0;
/// How long the long-term latency takes to learn most of a rise.
const LONG_RISE: Duration = Duration::from_secs(300);
/// The share of a fall the long-term latency learns per window.
const LONG_FALL: f64 = 0.5;
/// A window closes once it holds this many answers ...
const MIN_SAMPLES: u64 = 10;
/// ... and has lasted this long, or once it has lasted [`MAX_WINDOW`].
const MIN_WINDOW: Duration = Duration::from_millis(100);
/// The longest window: a backend with little traffic still gets its limit looked at.
const MAX_WINDOW: Duration = Duration::from_secs(1);

/// One answer more in a window's word: the count in the high bits, above the summed
/// latencies in microseconds ([`SUM_BITS`] of them: about twelve days of latency).
const ONE_SAMPLE: u64 = 1 << SUM_BITS;
/// The bits of a window's word that hold its summed latencies.
const SUM_BITS: u32 = 40;

/// One backend's adaptive limit.
#[derive(Debug)]
pub(crate) struct Gradient {
    /// The current window: its answers ([`ONE_SAMPLE`]s) and their latencies summed in
    /// microseconds, in one word, so that one atomic add counts an answer whole and a
    /// window is taken whole.
    window: AtomicU64,
    /// The most requests in flight seen as an answer came, in the current window.
    peak: AtomicU64,
    /// Control side only.
    state: Mutex<State>,
    /// The least and the most the limit may be.
    bounds: (u32, u32),
}

#[derive(Debug)]
struct State {
    limit: f64,
    /// The long-term latency, in nanoseconds; 0 before the first window.
    long_ns: f64,
    window_start: Instant,
}

impl Gradient {
    /// A limit between `min` and `max`, starting at [`INITIAL`] within them.
    pub(crate) fn new(min: u32, max: u32) -> Gradient {
        let (min, max) = (min.max(1), max.max(min.max(1)));
        Gradient {
            window: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            state: Mutex::new(State {
                limit: INITIAL.clamp(f64::from(min), f64::from(max)),
                long_ns: 0.0,
                window_start: Instant::now(),
            }),
            bounds: (min, max),
        }
    }

    /// The limit now, rounded.
    pub(crate) fn limit(&self) -> u32 {
        self.lock().limit.round() as u32
    }

    /// Adds an answer that took `latency` with `in_flight` requests on the backend.
    #[inline]
    pub(crate) fn sample(&self, latency: Duration, in_flight: u64) {
        // A latency over an hour counts as an hour: it cannot carry into the count.
        let micros = (latency.as_micros() as u64).min(3_600_000_000);
        self.window
            .fetch_add(ONE_SAMPLE + micros, Ordering::Relaxed);
        self.peak.fetch_max(in_flight, Ordering::Relaxed);
    }

    /// Starts afresh at [`INITIAL`] (the limit turned adaptive again after being fixed).
    pub(crate) fn reset(&self) {
        let mut s = self.lock();
        let (min, max) = (f64::from(self.bounds.0), f64::from(self.bounds.1));
        s.limit = INITIAL.clamp(min, max);
        s.long_ns = 0.0;
        s.window_start = Instant::now();
        self.window.store(0, Ordering::Relaxed);
        self.peak.store(0, Ordering::Relaxed);
    }

    /// Closes the window when it is due at `now` and moves the limit; returns the new
    /// limit when the window closed.
    pub(crate) fn adjust(&self, now: Instant) -> Option<u32> {
        let mut s = self.lock();
        let age = now.saturating_duration_since(s.window_start);
        let n = self.window.load(Ordering::Relaxed) >> SUM_BITS;
        if age < MIN_WINDOW || (n < MIN_SAMPLES && age < MAX_WINDOW) {
            return None;
        }
        s.window_start = now;
        let w = self.window.swap(0, Ordering::Relaxed);
        let peak = self.peak.swap(0, Ordering::Relaxed);
        let (n, sum_us) = (w >> SUM_BITS, w & (ONE_SAMPLE - 1));
        if n == 0 {
            return Some(s.limit.round() as u32);
        }
        let short = sum_us as f64 * 1000.0 / n as f64;
        s.limit = self.next_limit(&mut s, short, age, peak);
        Some(s.limit.round() as u32)
    }

    /// Gradient2's step for a window of `age` whose answers averaged `short` ns, with at
    /// most `peak` in flight.
    fn next_limit(&self, s: &mut State, short: f64, age: Duration, peak: u64) -> f64 {
        let short = short.max(1.0);
        s.long_ns = match s.long_ns {
            0.0 => short,
            long if short > long => {
                let share = (age.as_secs_f64() / LONG_RISE.as_secs_f64()).min(1.0);
                long + (short - long) * share
            }
            long => long + (short - long) * LONG_FALL,
        };
        // Not using half of it: nothing says more would help, nothing to shrink for.
        if (peak as f64) < s.limit / 2.0 {
            return s.limit;
        }
        let gradient = (TOLERANCE * s.long_ns / short).clamp(0.5, 1.0);
        let next = s.limit * gradient + s.limit.sqrt().max(QUEUE);
        let next = s.limit * (1.0 - SMOOTHING) + next * SMOOTHING;
        next.clamp(f64::from(self.bounds.0), f64::from(self.bounds.1))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while holding it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `windows` windows of 20 answers of `latency(limit)` with the limit in use.
    fn run(g: &Gradient, windows: usize, latency: impl Fn(u32) -> Duration) -> u32 {
        let mut t = Instant::now();
        for _ in 0..windows {
            let limit = g.limit();
            for _ in 0..20 {
                g.sample(latency(limit), u64::from(limit));
            }
            t += MIN_WINDOW;
            g.adjust(t);
        }
        g.limit()
    }

    #[test]
    fn the_limit_grows_while_latency_holds() {
        let g = Gradient::new(1, 1000);
        assert_eq!(g.limit(), 4);
        let grown = run(&g, 30, |_| Duration::from_millis(20));
        assert!(grown >= 25, "{grown}");
    }

    #[test]
    fn the_limit_settles_where_requests_start_to_queue() {
        // Eight workers: over eight in flight, requests queue inside the backend.
        let queued = |l: u32| Duration::from_millis(20 * u64::from(l.max(8)) / 8);
        let g = Gradient::new(1, 1000);
        let settled = run(&g, 200, queued);
        assert!((8..=20).contains(&settled), "{settled}");
        // A minute more of overload: it does not creep far.
        let later = run(&g, 600, queued);
        assert!(later <= 25, "{later}");
    }

    #[test]
    fn an_idle_backend_keeps_its_limit_and_bounds_hold() {
        let g = Gradient::new(2, 3);
        assert_eq!(g.limit(), 3);
        let t = Instant::now();
        assert_eq!(g.adjust(t), None, "the window is not over");
        g.sample(Duration::from_millis(5), 1);
        assert_eq!(
            g.adjust(t + MAX_WINDOW),
            Some(3),
            "one in flight of 3: unchanged"
        );
        let g = Gradient::new(2, 1000);
        let before = run(&g, 50, |_| Duration::from_millis(10));
        let slow = run(&g, 100, |_| Duration::from_millis(100));
        // Halved at each step, plus the few slots that probe for more.
        assert!(before >= 40 && slow <= 8, "{before} then {slow}");
    }
}
