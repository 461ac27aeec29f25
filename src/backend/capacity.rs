//! A backend's connection limit (`docs/operations.md`, "Connection limits and the
//! queue"): its requests in flight, its `max_conns` (HAProxy's `maxconn`) and how many
//! of its pool's queued requests the strategy would have sent to it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The load numbers of one backend that a limit is checked against.
#[derive(Debug)]
pub(crate) struct Capacity {
    /// At most this many requests in flight; 0 = no limit.
    max_conns: AtomicU32,
    in_flight: AtomicU64,
    /// Requests waiting in its pool's queue that the strategy would have sent here.
    pub(crate) queued: AtomicU64,
}

impl Capacity {
    /// Nothing in flight, at most `max_conns` (0: no limit).
    pub(crate) fn new(max_conns: u32) -> Capacity {
        Capacity {
            max_conns: AtomicU32::new(max_conns),
            in_flight: AtomicU64::new(0),
            queued: AtomicU64::new(0),
        }
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

    /// Sets the limit (applies to the next pick).
    pub(crate) fn set_max_conns(&self, n: u32) {
        self.max_conns.store(n, Ordering::Relaxed);
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
        let c = Capacity::new(2);
        assert_eq!(c.claim(), Some(true));
        assert_eq!(c.claim(), Some(true));
        assert_eq!(c.claim(), None);
        c.leave();
        assert_eq!(c.in_flight(), 1);
        c.set_max_conns(0);
        assert_eq!(c.claim(), Some(false), "no limit: the caller counts it");
        assert_eq!(c.in_flight(), 1);
    }
}
