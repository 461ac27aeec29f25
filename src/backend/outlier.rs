//! Passive outlier detection (`docs/operations.md`, "Passive outlier detection"): every
//! decision of it is made here — which outcomes count as failures in a row, when they
//! eject a backend, for how long, how much of a pool may be out at once, when an
//! ejection ends half-open and what the trial request then decides.
//!
//! The request path only records outcomes. What an outcome asks of the pool (an
//! ejection, or the news that a trial passed) is left here as news, and the pool's
//! control side is woken to act on it: a worker never takes the pool's lock nor
//! rebuilds a routing table.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::outlier::SuccessRate;
use crate::config::OutlierSettings;

/// Consecutive failures on live traffic that eject a backend.
pub(crate) const EJECT_AFTER_FAILURES: u32 = 5;
/// Length of the first ejection; the n-th lasts n times as long.
pub(crate) const EJECTION_BASE: Duration = Duration::from_secs(30);
/// Longest ejection.
pub(crate) const EJECTION_MAX: Duration = Duration::from_secs(300);

/// No trial: the backend takes traffic normally.
const TRIAL_NONE: u8 = 0;
/// An ejection just ended: the next request that picks it is the trial.
const TRIAL_OPEN: u8 = 1;
/// The trial request is in flight; nobody else may use the backend.
const TRIAL_RUNNING: u8 = 2;

/// News for the control side: an ejection is asked for.
const NEWS_EJECT: u8 = 1;
/// News for the control side: the half-open trial passed.
const NEWS_RESTORED: u8 = 2;

/// The built-in passive checks (every pool's unless it sets its own).
pub(crate) const DEFAULTS: OutlierSettings = OutlierSettings {
    consecutive_failures: EJECT_AFTER_FAILURES,
    base_ejection: EJECTION_BASE,
    max_ejection: EJECTION_MAX,
    max_ejected_percent: 50,
    success_rate: None,
};

/// Why a backend is ejected (the `reason` of its `ejection` event).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Reason {
    /// `consecutive_failures` failures in a row (or a failed half-open trial).
    ConsecutiveFailures,
    /// A success rate far below its pool's ([`below_success_rate`]).
    SuccessRate,
}

/// One answer more, successful or not, in a success-rate window: the total in the high
/// half of the word, the successes in the low half.
const WINDOW_ANSWER: u64 = 1 << 32;

/// What one outcome on live traffic asks the pool to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutlierAction {
    /// Nothing.
    None,
    /// Enough failures in a row: eject it.
    Eject,
    /// The half-open trial failed: eject it again, for longer.
    TrialFailed,
    /// The half-open trial succeeded: full traffic again.
    Restored,
}

/// What the control side is to act on, taken from a backend at once
/// ([`Outlier::take_news`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct News {
    /// Its failures ask for an ejection (or a failed trial for a longer one).
    pub(crate) eject: bool,
    /// Its trial request passed.
    pub(crate) restored: bool,
}

/// One backend's outlier state.
#[derive(Debug)]
pub(crate) struct Outlier {
    /// Its pool's passive checks.
    settings: OutlierSettings,
    /// Failures seen on live traffic in a row.
    consecutive_failures: AtomicU32,
    /// How often it has been ejected (sets the length of the next ejection).
    ejections: AtomicU32,
    /// When the current ejection ends (control side only).
    ejected_until: Mutex<Option<Instant>>,
    ejected: AtomicBool,
    /// Half-open after an ejection: `TRIAL_OPEN` until one request has been let through,
    /// `TRIAL_RUNNING` while it is in flight.
    trial: AtomicU8,
    /// `NEWS_*` bits not yet acted on by the control side.
    news: AtomicU8,
    /// Answers in the current success-rate window (`WINDOW_ANSWER`s) and successes
    /// among them, in one word so that one atomic add counts both. Counted only when
    /// the pool has success-rate ejection on.
    window: AtomicU64,
}

impl Outlier {
    /// Not ejected, no failures, under `settings`.
    pub(crate) fn new(settings: OutlierSettings) -> Outlier {
        Outlier {
            settings,
            consecutive_failures: AtomicU32::new(0),
            ejections: AtomicU32::new(0),
            ejected_until: Mutex::new(None),
            ejected: AtomicBool::new(false),
            trial: AtomicU8::new(TRIAL_NONE),
            news: AtomicU8::new(0),
            window: AtomicU64::new(0),
        }
    }

    /// Counts one outcome seen on live traffic (a 5xx answer, a connect failure, a broken
    /// exchange or a timeout is a failure) and says what the pool should do about it.
    /// Anything but [`OutlierAction::None`] is also left as news for the control side.
    pub(crate) fn record(&self, ok: bool, was_trial: bool) -> OutlierAction {
        if self.settings.success_rate.is_some() {
            self.window
                .fetch_add(WINDOW_ANSWER + u64::from(ok), Ordering::Relaxed);
        }
        let action = self.judge(ok, was_trial);
        let bit = match action {
            OutlierAction::None => return action,
            OutlierAction::Eject | OutlierAction::TrialFailed => NEWS_EJECT,
            OutlierAction::Restored => NEWS_RESTORED,
        };
        self.news.fetch_or(bit, Ordering::AcqRel);
        action
    }

    fn judge(&self, ok: bool, was_trial: bool) -> OutlierAction {
        if ok {
            self.consecutive_failures.store(0, Ordering::Relaxed);
            if was_trial && self.end_trial() {
                return OutlierAction::Restored;
            }
            return OutlierAction::None;
        }
        if was_trial && self.end_trial() {
            return OutlierAction::TrialFailed;
        }
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        let after = self.settings.consecutive_failures;
        if after > 0 && n >= after && !self.ejected() {
            OutlierAction::Eject
        } else {
            OutlierAction::None
        }
    }

    /// Ends the current success-rate window: its (successes, answers), counting again
    /// from zero.
    pub(crate) fn take_window(&self) -> (u32, u32) {
        let w = self.window.swap(0, Ordering::Relaxed);
        (w as u32, (w >> 32) as u32)
    }

    /// Takes the news left by the request path since the last call.
    pub(crate) fn take_news(&self) -> News {
        let bits = self.news.swap(0, Ordering::AcqRel);
        News {
            eject: bits & NEWS_EJECT != 0,
            restored: bits & NEWS_RESTORED != 0,
        }
    }

    fn end_trial(&self) -> bool {
        self.trial
            .compare_exchange(
                TRIAL_RUNNING,
                TRIAL_NONE,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Whether the backend is half-open (an ejection ended, no trial has passed yet).
    #[inline]
    pub(crate) fn half_open(&self) -> bool {
        self.trial.load(Ordering::Relaxed) != TRIAL_NONE
    }

    /// Whether a half-open backend's trial request could be claimed now (none is in
    /// flight).
    pub(crate) fn trial_free(&self) -> bool {
        self.trial.load(Ordering::Relaxed) != TRIAL_RUNNING
    }

    /// Claims the single trial request of a half-open backend; `false` when another
    /// request already has it.
    pub(crate) fn claim_trial(&self) -> bool {
        self.trial
            .compare_exchange(
                TRIAL_OPEN,
                TRIAL_RUNNING,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// The trial request ended without an outcome (the client went away): the next
    /// request may try instead.
    pub(crate) fn release_trial(&self) {
        let _ = self.trial.compare_exchange(
            TRIAL_RUNNING,
            TRIAL_OPEN,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Whether one more ejection keeps the pool within its cap: `ejected` of its
    /// `members` are out already, and at most `max_ejected_percent` of them (rounded
    /// down) may be.
    pub(crate) fn cap_allows(&self, ejected: usize, members: usize) -> bool {
        ejected < members * self.settings.max_ejected_percent as usize / 100
    }

    /// Ejects it (the caller has checked [`Self::cap_allows`]); returns how long for.
    pub(crate) fn eject(&self, now: Instant) -> Duration {
        let n = self.ejections.fetch_add(1, Ordering::Relaxed) + 1;
        let o = &self.settings;
        let d = o.base_ejection.saturating_mul(n).min(o.max_ejection);
        *self.ejected_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(now + d);
        self.trial.store(TRIAL_NONE, Ordering::Relaxed);
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.ejected.store(true, Ordering::Relaxed);
        d
    }

    /// Ends an ejection whose time is up: the backend turns half-open. Returns whether
    /// it did.
    pub(crate) fn end_if_due(&self, now: Instant) -> bool {
        let mut until = self.ejected_until.lock().unwrap_or_else(|e| e.into_inner());
        match *until {
            Some(t) if t <= now => {
                *until = None;
                self.trial.store(TRIAL_OPEN, Ordering::Relaxed);
                self.ejected.store(false, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    /// Ends an ejection at once (the backend came back through the health checks): it
    /// turns half-open like at the end of its time. Returns whether it was ejected.
    pub(crate) fn end_now(&self) -> bool {
        if !self.ejected() {
            return false;
        }
        *self.ejected_until.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.trial.store(TRIAL_OPEN, Ordering::Relaxed);
        self.ejected.store(false, Ordering::Relaxed);
        true
    }

    /// How often it has been ejected.
    pub(crate) fn count(&self) -> u32 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// Ejected now.
    #[inline]
    pub(crate) fn ejected(&self) -> bool {
        self.ejected.load(Ordering::Relaxed)
    }
}

/// How many standard errors of sampling noise a backend's shortfall must exceed, beside
/// Envoy's rule ([`below_success_rate`]).
const NOISE_Z: f64 = 4.0;

/// Which of the backends that qualified in one window, given as (successes, answers),
/// are success-rate outliers under `sr` (indexes into `windows`). Envoy's rule: when at
/// least `min_hosts` qualified, those whose rate is below the mean less `stdev_factor`
/// population standard deviations.
///
/// One addition, so that a pool failing as a whole ejects nobody: rates that differ only
/// by sampling noise (five backends each failing 30 % of 80 requests spread out by
/// chance, and one of them crosses Envoy's line in one window of 30 at a factor of 1.9)
/// do not count. The backend's shortfall from the rate of all the others must also be
/// more than [`NOISE_Z`] standard errors of that difference (a two-proportion test).
/// A backend answering 5xx to a third of its requests while the others do not is many
/// times over that line (`docs/operations.md`, "Success-rate outliers").
///
/// Note that one point among `n` lies at most `sqrt(n - 1)` deviations from the mean, so
/// a factor of 1.9 needs 5 qualifying backends.
pub(crate) fn below_success_rate(windows: &[(u32, u32)], sr: &SuccessRate) -> Vec<usize> {
    if windows.is_empty() || windows.len() < sr.min_hosts as usize {
        return Vec::new();
    }
    let rate = |(ok, n): (u32, u32)| f64::from(ok) / f64::from(n.max(1));
    let n = windows.len() as f64;
    let mean = windows.iter().map(|&w| rate(w)).sum::<f64>() / n;
    let variance = windows
        .iter()
        .map(|&w| (rate(w) - mean).powi(2))
        .sum::<f64>()
        / n;
    let threshold = mean - sr.stdev_factor * variance.sqrt();
    let (all_ok, all_n) = windows.iter().fold((0u64, 0u64), |(o, t), &(ok, n)| {
        (o + u64::from(ok), t + u64::from(n))
    });
    let beyond_noise = |&(ok, n): &(u32, u32)| {
        let (rest_ok, rest_n) = (all_ok - u64::from(ok), all_n - u64::from(n));
        if rest_n == 0 || n == 0 {
            return false;
        }
        let others = rest_ok as f64 / rest_n as f64;
        let pooled = all_ok as f64 / all_n as f64;
        let se = (pooled * (1.0 - pooled) * (1.0 / f64::from(n) + 1.0 / rest_n as f64)).sqrt();
        others - rate((ok, n)) > NOISE_Z * se
    };
    windows
        .iter()
        .enumerate()
        .filter(|(_, &w)| rate(w) < threshold && beyond_noise(&w))
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_failures_in_a_row_ask_for_an_ejection() {
        let o = Outlier::new(DEFAULTS);
        for _ in 0..4 {
            assert_eq!(o.record(false, false), OutlierAction::None);
        }
        assert_eq!(o.record(true, false), OutlierAction::None);
        for _ in 0..4 {
            assert_eq!(o.record(false, false), OutlierAction::None);
        }
        assert_eq!(o.take_news(), News::default());
        assert_eq!(o.record(false, false), OutlierAction::Eject);
        let news = o.take_news();
        assert!(news.eject && !news.restored);
        assert_eq!(o.take_news(), News::default(), "news is taken once");
    }

    #[test]
    fn ejections_grow_and_end_half_open_with_one_trial() {
        let o = Outlier::new(DEFAULTS);
        let t0 = Instant::now();
        assert_eq!(o.eject(t0), EJECTION_BASE);
        assert!(o.ejected());
        assert!(!o.end_if_due(t0 + Duration::from_secs(29)));
        assert!(o.end_if_due(t0 + Duration::from_secs(30)));
        assert!(!o.ejected() && o.half_open());
        assert!(o.claim_trial());
        assert!(!o.claim_trial(), "only one trial at a time");
        assert_eq!(o.record(false, true), OutlierAction::TrialFailed);
        assert_eq!(o.eject(t0), EJECTION_BASE * 2);
        for _ in 0..20 {
            o.eject(t0);
        }
        assert_eq!(o.eject(t0), EJECTION_MAX);
        assert!(o.end_if_due(t0 + EJECTION_MAX));
        assert!(o.claim_trial());
        o.take_news();
        assert_eq!(o.record(true, true), OutlierAction::Restored);
        assert!(o.take_news().restored);
        assert!(!o.half_open());
    }

    #[test]
    fn a_backend_far_below_its_pool_is_an_outlier_a_pool_failing_as_a_whole_is_not() {
        let sr = SuccessRate {
            stdev_factor: 1.9,
            min_hosts: 3,
            ..crate::config::outlier::DEFAULTS
        };
        let of_100 = |oks: &[u32]| oks.iter().map(|&ok| (ok, 100)).collect::<Vec<_>>();
        let sick = of_100(&[100, 100, 99, 100, 50]);
        assert_eq!(below_success_rate(&sick, &sr), vec![4]);
        assert!(below_success_rate(&of_100(&[50, 50, 50, 50, 50]), &sr).is_empty());
        let few = SuccessRate { min_hosts: 6, ..sr };
        assert!(below_success_rate(&sick, &few).is_empty());
        let loose = SuccessRate {
            stdev_factor: 1.0,
            ..sr
        };
        assert_eq!(
            below_success_rate(&of_100(&[100, 100, 60]), &loose),
            vec![2]
        );
        assert!(
            below_success_rate(&of_100(&[100, 100, 60]), &sr).is_empty(),
            "one of three lies at most sqrt(2) deviations below the mean"
        );
        // Envoy's line alone would take the last: its shortfall is sampling noise.
        assert!(below_success_rate(&of_100(&[72, 70, 71, 69, 60]), &loose).is_empty());
        let far = of_100(&[72, 70, 71, 69, 30]);
        assert_eq!(below_success_rate(&far, &loose), vec![4]);
    }

    #[test]
    fn answers_are_counted_in_the_window_only_when_success_rate_is_on() {
        let off = Outlier::new(DEFAULTS);
        off.record(true, false);
        assert_eq!(off.take_window(), (0, 0));
        let on = Outlier::new(OutlierSettings {
            success_rate: Some(crate::config::outlier::DEFAULTS),
            ..DEFAULTS
        });
        for ok in [true, false, true] {
            on.record(ok, false);
        }
        assert_eq!(on.take_window(), (2, 3));
        assert_eq!(on.take_window(), (0, 0));
    }

    #[test]
    fn at_most_the_pools_share_is_out_at_once() {
        let o = Outlier::new(DEFAULTS);
        assert!(!o.cap_allows(0, 1), "a lone backend is never ejected");
        assert!(o.cap_allows(0, 2));
        assert!(!o.cap_allows(1, 2));
        assert!(o.cap_allows(1, 5) && !o.cap_allows(2, 5));
    }
}
