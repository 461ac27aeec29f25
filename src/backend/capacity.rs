//! A backend's connection limit (`docs/operations.md`, "Connection limits and the
//! queue"): its requests in flight, its `max_conns` (HAProxy's `maxconn`), fixed or
//! adaptive ([`super::gradient`]), and how many of its pool's queued requests the
//! strategy would have sent to it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::gradient::Gradient;

pub(crate) use crate::config::AUTO_CONNS as AUTO;

/// The load numbers of one backend that a limit is checked against.
#[derive(Debug)]
pub(crate) struct Capacity {
    /// At most this many requests in flight; 0 = no limit.
    max_conns: AtomicU32,
    in_flight: AtomicU64,
    /// Requests waiting in its pool's queue that the strategy would have sent here.
    pub(crate) queued: AtomicU64,
    /// Whether the limit is adaptive (then `max_conns` is the gradient's limit now).
    adaptive: AtomicBool,
    /// The adaptive limit, made the first time it is asked for.
    gradient: OnceLock<Gradient>,
    /// The least and the most an adaptive limit may be (its pool's `max_conns_auto`).
    bounds: (u32, u32),
    /// Held by whatever changes the limit on the control side (the upkeep's step, an
    /// API or reload change), so that a step computed for an adaptive limit is never
    /// stored over a fixed one set meanwhile.
    control: std::sync::Mutex<()>,
}

impl Capacity {
    /// Nothing in flight, at most `max_conns` (0: no limit; [`AUTO`]: adaptive, within
    /// `bounds`).
    pub(crate) fn new(max_conns: u32, bounds: (u32, u32)) -> Capacity {
        let c = Capacity {
            max_conns: AtomicU32::new(0),
            in_flight: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            adaptive: AtomicBool::new(false),
            gradient: OnceLock::new(),
            bounds,
            control: std::sync::Mutex::new(()),
        };
        c.set_max_conns(max_conns);
        c
    }

    /// Whether its limit is adaptive.
    #[inline]
    pub(crate) fn adaptive(&self) -> bool {
        self.adaptive.load(Ordering::Relaxed)
    }

    /// The limit as configured: a number, or [`AUTO`].
    pub(crate) fn configured(&self) -> u32 {
        match self.adaptive() {
            true => AUTO,
            false => self.max_conns(),
        }
    }

    /// Adds an answer's latency to an adaptive limit's window.
    #[inline]
    pub(crate) fn sample(&self, latency: Duration) {
        if let Some(g) = self.gradient.get() {
            g.sample(latency, self.in_flight());
        }
    }

    /// Moves an adaptive limit when its window is due at `now`: `Some((was, now))` when
    /// it changed. Control side only.
    pub(crate) fn adjust(&self, now: Instant) -> Option<(u32, u32)> {
        let _control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        if !self.adaptive() {
            return None;
        }
        let limit = self.gradient.get()?.adjust(now)?;
        let was = self.max_conns.swap(limit, Ordering::Relaxed);
        (was != limit).then_some((was, limit))
    }

    /// Requests in flight.
    #[inline]
    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The limit on requests in flight; 0 = none.
    #[inline]
    pub(crate) fn max_conns(&self) -> u32 {
        self.max_conns.load(Ordering::Relaxed)
    }

    /// Sets the limit (applies to the next pick): a number (0: none), or [`AUTO`].
    pub(crate) fn set_max_conns(&self, n: u32) {
        let _control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        if n == AUTO {
            let (min, max) = self.bounds;
            let g = self.gradient.get_or_init(|| Gradient::new(min, max));
            if !self.adaptive() {
                g.reset();
            }
            self.max_conns.store(g.limit(), Ordering::Relaxed);
            self.adaptive.store(true, Ordering::Relaxed);
        } else {
            self.adaptive.store(false, Ordering::Relaxed);
            self.max_conns.store(n, Ordering::Relaxed);
        }
    }

    /// Counts one more request in flight, whatever the limit.
    #[inline]
    pub(crate) fn enter(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one request fewer in flight.
    #[inline]
    pub(crate) fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Takes one slot: `None` at the limit; `Some(true)` when the slot is counted in
    /// flight already (a limited backend, counted atomically with the check),
    /// `Some(false)` when there is no limit and the caller counts it.
    pub(crate) fn claim(&self) -> Option<bool> {
        let max = self.max_conns();
        if max == 0 {
            return Some(false);
        }
        let mut n = self.in_flight.load(Ordering::Relaxed);
        loop {
            if n >= u64::from(max) {
                return None;
            }
            match self.in_flight.compare_exchange_weak(
                n,
                n + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(true),
                Err(now) => n = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limited_backend_counts_its_slot_when_it_gives_it() {
        let c = Capacity::new(2, (1, 1000));
        assert_eq!(c.claim(), Some(true));
        assert_eq!(c.claim(), Some(true));
        assert_eq!(c.claim(), None);
        c.leave();
        assert_eq!(c.in_flight(), 1);
        c.set_max_conns(0);
        assert_eq!(c.claim(), Some(false), "no limit: the caller counts it");
        assert_eq!(c.in_flight(), 1);
    }

    #[test]
    fn an_adaptive_limit_starts_within_its_bounds_and_turns_fixed_again() {
        let c = Capacity::new(AUTO, (1, 8));
        assert!(c.adaptive());
        assert_eq!((c.max_conns(), c.configured()), (4, AUTO));
        let c = Capacity::new(AUTO, (1, 2));
        assert_eq!(c.max_conns(), 2);
        c.set_max_conns(3);
        assert_eq!((c.max_conns(), c.configured()), (3, 3));
        assert_eq!(c.adjust(Instant::now()), None);
    }
}
