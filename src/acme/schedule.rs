//! When ACME acts: the renewal time of a certificate, and the backoff after failures,
//! kept in the storage (`backoff.json`) so that a restart, or the next instance of a
//! fleet to take the lock, honours it too.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::x509::CertInfo;

/// The first retry after a failure; each next one waits twice as long.
pub(super) const FIRST_RETRY: Duration = Duration::from_secs(120);
/// Retries are at most this far apart.
const LAST_RETRY: Duration = Duration::from_secs(3600);

/// The stored backoff's name.
pub(super) const BACKOFF: &str = "backoff.json";

/// The renewal time of a certificate: `renew_before` its expiry or a third of its
/// lifetime before it, whichever is sooner; `renew_before` counts for at most half
/// the lifetime (30 days against a 6-day certificate renews at half-life, not at once).
pub(crate) fn renew_at(info: &CertInfo, renew_before: Duration) -> SystemTime {
    let lifetime = info.lifetime();
    let before = renew_before.min(lifetime / 2).max(lifetime / 3);
    info.not_after
        .checked_sub(before)
        .unwrap_or(info.not_before)
}

/// How long to wait after the `n`th failure in a row (from 1): 2 min doubling to an
/// hour, ±10 % so that a fleet's instances do not retry together. Five attempts in the
/// first hour stay within public CAs' failed-validation limits.
pub(super) fn retry_after(n: u32) -> Duration {
    let base = FIRST_RETRY.saturating_mul(1 << n.saturating_sub(1).min(10));
    base.min(LAST_RETRY).mul_f64(0.9 + fastrand::f64() * 0.2)
}

/// Failures in a row, and no attempt before `not_before` (seconds since the epoch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Backoff {
    pub(super) failures: u32,
    pub(super) not_before: u64,
}

fn epoch_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Backoff {
    /// Reads the stored value; anything unreadable is no backoff.
    pub(super) fn parse(bytes: Option<Vec<u8>>) -> Backoff {
        bytes
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// The backoff after one more failure at `now`, and the wait it sets.
    pub(super) fn failed(self, now: SystemTime) -> (Backoff, Duration) {
        let failures = self.failures.saturating_add(1);
        let wait = retry_after(failures);
        let next = Backoff {
            failures,
            not_before: epoch_secs(now + wait),
        };
        (next, wait)
    }

    /// How long from `now` until an attempt is allowed.
    pub(super) fn wait(&self, now: SystemTime) -> Duration {
        Duration::from_secs(self.not_before.saturating_sub(epoch_secs(now)))
    }

    pub(super) fn to_json(self) -> Vec<u8> {
        serde_json::to_vec(&self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(days: u64) -> CertInfo {
        CertInfo {
            not_before: UNIX_EPOCH,
            not_after: UNIX_EPOCH + Duration::from_secs(days * 86_400),
            issuer: String::new(),
        }
    }

    #[test]
    fn renewal_is_renew_before_or_a_third_of_the_lifetime_whichever_is_sooner() {
        let day = |d: u64| UNIX_EPOCH + Duration::from_secs(d * 86_400);
        let days = |d: u64| Duration::from_secs(d * 86_400);
        assert_eq!(renew_at(&info(90), days(30)), day(60));
        assert_eq!(
            renew_at(&info(90), days(10)),
            day(60),
            "a third left comes sooner"
        );
        assert_eq!(renew_at(&info(90), days(40)), day(50));
        assert_eq!(renew_at(&info(90), days(44)), day(46));
        assert_eq!(
            renew_at(&info(90), days(60)),
            day(45),
            "at most half the lifetime"
        );
        assert_eq!(
            renew_at(&info(6), days(30)),
            day(3),
            "30 days of a 6-day certificate"
        );
    }

    #[test]
    fn retries_double_from_two_minutes_to_an_hour() {
        let near = |d: Duration, secs: f64| (d.as_secs_f64() / secs - 1.0).abs() <= 0.1 + 1e-9;
        assert!(near(retry_after(1), 120.0));
        assert!(near(retry_after(2), 240.0));
        assert!(near(retry_after(5), 1920.0));
        assert!(near(retry_after(6), 3600.0));
        assert!(near(retry_after(u32::MAX), 3600.0));
    }

    #[test]
    fn the_backoff_survives_a_round_trip_and_counts_on() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let (b, wait) = Backoff::default().failed(now);
        assert_eq!(b.failures, 1);
        assert_eq!(b.wait(now).as_secs(), wait.as_secs());
        let again = Backoff::parse(Some(b.to_json()));
        assert_eq!(again, b);
        let (b2, _) = again.failed(now);
        assert_eq!(b2.failures, 2);
        assert_eq!(
            Backoff::parse(Some(b"garbage".to_vec())),
            Backoff::default()
        );
        assert_eq!(Backoff::parse(None).wait(now), Duration::ZERO);
    }
}
