//! Slow start (`docs/operations.md`, "Slow start"): a backend that joins or recovers
//! ramps its share of traffic from a tenth to all of it over `--slow-start`, as
//! HAProxy's `slowstart` and Envoy's slow start mode do.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The share a ramp starts at.
const FIRST_SHARE: f64 = 0.1;

/// One backend's ramp.
#[derive(Debug)]
pub(crate) struct Ramp {
    /// How long a ramp lasts; zero = no slow start.
    length: Duration,
    /// When the current ramp began (control side only).
    since: Mutex<Option<Instant>>,
}

impl Ramp {
    /// No ramp running; a ramp lasts `length` (zero: never ramps).
    pub(crate) fn new(length: Duration) -> Ramp {
        Ramp {
            length,
            since: Mutex::new(None),
        }
    }

    /// Starts a ramp (the backend joined or recovered); no-op without slow start.
    pub(crate) fn start(&self, now: Instant) {
        if !self.length.is_zero() {
            *self.since.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
        }
    }

    /// The share of its weight a ramping backend has at `now`: 10 % at the start, 100 %
    /// at the end; `None` when it is not ramping.
    pub(crate) fn share(&self, now: Instant) -> Option<f64> {
        let since = (*self.since.lock().unwrap_or_else(|e| e.into_inner()))?;
        let t = now.saturating_duration_since(since).as_secs_f64() / self.length.as_secs_f64();
        (t < 1.0).then_some(FIRST_SHARE + (1.0 - FIRST_SHARE) * t)
    }

    /// Ends a ramp whose time is up; returns whether a ramp was running before the call.
    pub(crate) fn step(&self, now: Instant) -> bool {
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        match *since {
            Some(t) if now.saturating_duration_since(t) >= self.length => {
                *since = None;
                true
            }
            Some(_) => true,
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_ramps_from_a_tenth_to_all_of_it() {
        let r = Ramp::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(r.share(t0), None);
        r.start(t0);
        assert!((r.share(t0).unwrap() - 0.1).abs() < 1e-9);
        assert!((r.share(t0 + Duration::from_secs(5)).unwrap() - 0.55).abs() < 1e-9);
        assert_eq!(r.share(t0 + Duration::from_secs(10)), None);
        assert!(r.step(t0 + Duration::from_secs(5)));
        assert!(
            r.step(t0 + Duration::from_secs(10)),
            "the last step reports the change"
        );
        assert!(!r.step(t0 + Duration::from_secs(11)));
        let off = Ramp::new(Duration::ZERO);
        off.start(t0);
        assert_eq!(off.share(t0), None);
    }
}
