//! The request path's clock: the monotonic clock as one number of nanoseconds.
//!
//! std's `Instant` reads the same clock (`CLOCK_MONOTONIC`), but it checks every
//! reading and does every subtraction and addition on seconds and nanoseconds apart,
//! with checks: about 26 instructions to read, 37 to subtract. A request read the
//! clock eight times and subtracted six (its start, the send and the answer upstream,
//! the connection's age and its return to the pool, its end, the deadlines, the log
//! line's time), about 590 instructions of the cost guard's 20 900 (docs/performance.md,
//! "The request path's clock"). A [`Stamp`] is the reading as a `u64`: subtracting is one
//! instruction. No crate offers this without more: `quanta` reads the TSC after a
//! calibration, `coarsetime` is coarse; this is the plain clock, read plainly.

use std::time::Duration;

/// A reading of the monotonic clock, in nanoseconds (since boot, as Linux counts it:
/// 584 years fit). Readings of one process compare and subtract; they mean nothing
/// to another machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Stamp(u64);

impl Stamp {
    /// Now.
    #[inline]
    pub(crate) fn now() -> Stamp {
        Stamp(read(libc::CLOCK_MONOTONIC))
    }

    /// A stamp from nanoseconds as [`Stamp::ns`] gives them.
    #[inline]
    pub(crate) const fn from_ns(ns: u64) -> Stamp {
        Stamp(ns)
    }

    /// The reading in nanoseconds.
    #[inline]
    pub(crate) const fn ns(self) -> u64 {
        self.0
    }

    /// The time from `earlier` to this stamp; zero when `earlier` is later.
    #[inline]
    pub(crate) fn since(self, earlier: Stamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// This stamp plus `d`, or the clock's end when that does not fit.
    #[inline]
    pub(crate) fn after(self, d: Duration) -> Stamp {
        let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Stamp(self.0.saturating_add(d))
    }

    /// The tokio instant of this stamp, for a timer (two clock readings: for what arms
    /// a timer, not for every request).
    pub(crate) fn to_tokio(self) -> tokio::time::Instant {
        let now = Stamp::now();
        let base = tokio::time::Instant::now();
        if self >= now {
            base.checked_add(self.since(now)).unwrap_or(base)
        } else {
            base.checked_sub(now.since(self)).unwrap_or(base)
        }
    }
}

/// Nanoseconds since the Unix epoch on the wall clock (`CLOCK_REALTIME`): the time
/// stamps of log lines.
#[inline]
pub(crate) fn unix_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

/// `clock`'s reading in nanoseconds.
#[inline]
fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec that clock_gettime only writes. Both clocks
    // exist on every Linux, so the call does not fail (std's `Instant` and
    // `SystemTime` rely on the same); were it to, `ts` would stay zero.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    // Neither field is negative: the monotonic clock counts from boot, the wall clock
    // from 1970 (a clock set before 1970 would read as far in the future, not crash);
    // `tv_nsec` is below a second.
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_move_with_std_instant() {
        let (s0, i0) = (Stamp::now(), std::time::Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (s1, i1) = (Stamp::now(), std::time::Instant::now());
        let ours = s1.since(s0).as_nanos() as i128;
        let std = i1.duration_since(i0).as_nanos() as i128;
        assert!(ours >= 20_000_000, "{ours}");
        // Loose: a thread preempted between the paired reads on a busy machine.
        assert!((ours - std).abs() < 50_000_000, "{ours} vs {std}");
        assert_eq!(s0.since(s1), Duration::ZERO);
    }

    #[test]
    fn after_saturates_and_adds() {
        let s = Stamp::from_ns(5);
        assert_eq!(s.after(Duration::from_nanos(7)).ns(), 12);
        assert_eq!(s.after(Duration::MAX).ns(), u64::MAX);
    }

    #[test]
    fn the_wall_clock_is_the_system_time() {
        let std = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i128;
        let ours = unix_ns() as i128;
        assert!((ours - std).abs() < 1_000_000_000, "{ours} vs {std}");
    }

    #[tokio::test]
    async fn a_stamp_becomes_the_tokio_instant_as_far_away() {
        let later = Stamp::now().after(Duration::from_millis(300));
        let at = later.to_tokio();
        let left = at.saturating_duration_since(tokio::time::Instant::now());
        // Never further than asked; less by however long this thread waited between.
        assert!(left > Duration::from_millis(150) && left <= Duration::from_millis(300));
    }
}
