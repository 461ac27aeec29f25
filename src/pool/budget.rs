//! The retry budget (`docs/operations.md`): retries stay under 20 % of recent requests plus a floor of
//! 3 per second, so a sick pool is never hit by a retry storm.
//!
//! Written here rather than taken from tower's `TpsBudget` because the request path is
//! not a tower stack; the shape is the same: a ring of per-second slots of atomics,
//! shared by every worker, read and written without a lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Seconds of history the budget looks at.
const WINDOW_SECS: u64 = 10;
/// Retries allowed per request in the window.
const RATIO: f64 = 0.2;
/// Retries allowed per second whatever the traffic.
const MIN_PER_SEC: u64 = 3;

/// Why a request went to another backend: a `retry_on` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryReason {
    /// No connection could be made.
    Connect,
    /// The connection broke before any answer byte.
    Reset,
    /// No answer head in time.
    Timeout,
    /// An answer whose status the entry at this index of `retry_on`'s statuses lists.
    Status(usize),
}

/// Retries sent to another backend, by the entry that sent them
/// (`fulcrum_retries_total{pool,reason}`).
#[derive(Debug)]
pub(crate) struct Retried {
    connect: AtomicU64,
    reset: AtomicU64,
    timeout: AtomicU64,
    /// One per status entry of `retry_on`, in its order.
    statuses: Box<[AtomicU64]>,
}

impl Retried {
    /// Counts for a pool whose `retry_on` lists `statuses` entries of status.
    pub(crate) fn new(statuses: usize) -> Retried {
        Retried {
            connect: AtomicU64::new(0),
            reset: AtomicU64::new(0),
            timeout: AtomicU64::new(0),
            statuses: (0..statuses).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Counts one retry sent for `reason`.
    pub(crate) fn count(&self, reason: RetryReason) {
        let c = match reason {
            RetryReason::Connect => &self.connect,
            RetryReason::Reset => &self.reset,
            RetryReason::Timeout => &self.timeout,
            RetryReason::Status(i) => match self.statuses.get(i) {
                Some(c) => c,
                None => return,
            },
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Each reason's count, named as `retry_on` writes it (`labels` its status
    /// entries').
    pub(crate) fn each(&self, labels: &[String]) -> Vec<(String, u64)> {
        let fixed = [
            ("connect", &self.connect),
            ("reset", &self.reset),
            ("timeout", &self.timeout),
        ];
        let fixed = fixed.map(|(n, c)| (n.to_string(), c.load(Ordering::Relaxed)));
        let statuses = (labels.iter().zip(self.statuses.iter()))
            .map(|(l, c)| (l.clone(), c.load(Ordering::Relaxed)));
        fixed.into_iter().chain(statuses).collect()
    }
}

#[derive(Debug, Default)]
struct Slot {
    /// The second this slot currently counts (seconds since `start`).
    second: AtomicU64,
    requests: AtomicU64,
    retries: AtomicU64,
}

/// Counts requests and retries over the last [`WINDOW_SECS`] seconds.
#[derive(Debug)]
pub(crate) struct RetryBudget {
    start: Instant,
    slots: [Slot; WINDOW_SECS as usize],
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryBudget {
    /// An empty budget.
    pub(crate) fn new() -> Self {
        RetryBudget {
            start: Instant::now(),
            slots: Default::default(),
        }
    }

    fn now_second(&self) -> u64 {
        self.start.elapsed().as_secs()
    }

    /// The slot for `second`, cleared first if it still holds an older second.
    fn slot(&self, second: u64) -> &Slot {
        let slot = &self.slots[(second % WINDOW_SECS) as usize];
        let held = slot.second.load(Ordering::Acquire);
        if held != second
            && slot
                .second
                .compare_exchange(held, second, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            // A count landing between the exchange and these stores is lost; the budget
            // is an estimate and stays one.
            slot.requests.store(0, Ordering::Relaxed);
            slot.retries.store(0, Ordering::Relaxed);
        }
        slot
    }

    /// Counts a client request.
    pub(crate) fn deposit(&self) {
        self.deposit_at(self.now_second());
    }

    /// Takes one retry from the budget if there is room; `false` means do not retry.
    pub(crate) fn withdraw(&self) -> bool {
        self.withdraw_at(self.now_second())
    }

    fn deposit_at(&self, second: u64) {
        self.slot(second).requests.fetch_add(1, Ordering::Relaxed);
    }

    fn withdraw_at(&self, second: u64) -> bool {
        let current = self.slot(second);
        let (mut requests, mut retries) = (0u64, 0u64);
        let oldest = second.saturating_sub(WINDOW_SECS - 1);
        for s in &self.slots {
            let at = s.second.load(Ordering::Acquire);
            if at >= oldest && at <= second {
                requests += s.requests.load(Ordering::Relaxed);
                retries += s.retries.load(Ordering::Relaxed);
            }
        }
        let seconds = (second - oldest + 1).min(WINDOW_SECS);
        let allowed = (requests as f64 * RATIO) as u64 + MIN_PER_SEC * seconds;
        if retries < allowed {
            current.retries.fetch_add(1, Ordering::Relaxed);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_allows_three_per_second_without_traffic() {
        let b = RetryBudget::new();
        let granted = (0..10).filter(|_| b.withdraw_at(0)).count();
        assert_eq!(granted, 3);
    }

    #[test]
    fn retries_stay_under_a_fifth_of_requests_plus_the_floor() {
        let b = RetryBudget::new();
        let mut granted = 0;
        for second in 0..30 {
            for _ in 0..1000 {
                b.deposit_at(second);
                // every request fails and asks for two retries
                for _ in 0..2 {
                    if b.withdraw_at(second) {
                        granted += 1;
                    }
                }
            }
        }
        let requests = 30_000.0;
        assert!(
            granted as f64 <= requests * 0.2 + 3.0 * 30.0 + 1.0,
            "{granted}"
        );
        assert!(granted as f64 >= requests * 0.19, "{granted}");
    }

    #[test]
    fn old_seconds_fall_out_of_the_window() {
        let b = RetryBudget::new();
        for _ in 0..100 {
            b.deposit_at(0);
        }
        let first = (0..100).filter(|_| b.withdraw_at(0)).count();
        assert_eq!(first, 20 + 3);
        // eleven seconds later only the floor is left
        let later = (0..100).filter(|_| b.withdraw_at(11)).count();
        assert_eq!(later, 3 * 10);
    }
}
