//! A deadline that moves often and rarely expires, with one timer re-armed lazily.
//!
//! Every request on a keep-alive connection has deadlines (its head must arrive within
//! the header timeout; the backend must answer within the upstream timeout), and they
//! almost never expire. Arming a fresh tokio timer for each one puts an entry into the
//! timer wheel and takes it out again per request. Instead, a connection keeps one
//! timer; moving the deadline later only records the new instant, and when the timer
//! goes off early it is re-armed for the deadline as it stands then. So a busy
//! connection touches the wheel about once per timeout period instead of twice per
//! request, the way HAProxy and nginx leave a connection's timer in place and check the
//! real expiry when it fires. tokio offers no such timer, hence this small one.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::time::{Instant, Sleep};

/// A deadline backed by one lazily re-armed timer (see the module documentation).
#[derive(Debug)]
pub(crate) struct Deadline {
    /// Armed on first use; never later than `at`.
    timer: Option<Pin<Box<Sleep>>>,
    at: Instant,
}

impl Deadline {
    /// A deadline at `at`; no timer is armed until it is waited for.
    pub(crate) fn new(at: Instant) -> Deadline {
        Deadline { timer: None, at }
    }

    /// Moves the deadline to `at`. Moving it later costs nothing now; moving it earlier
    /// than the armed timer re-arms the timer.
    pub(crate) fn set(&mut self, at: Instant) {
        self.at = at;
        if let Some(t) = &mut self.timer {
            if t.deadline() > at {
                t.as_mut().reset(at);
            }
        }
    }

    /// Ready once the deadline has passed.
    pub(crate) fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let at = self.at;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        loop {
            ready!(timer.as_mut().poll(cx));
            if Instant::now() >= at {
                return Poll::Ready(());
            }
            // It went off for an earlier deadline: wait on for the current one.
            timer.as_mut().reset(at);
        }
    }

    /// Resolves once the deadline has passed.
    pub(crate) async fn expired(&mut self) {
        poll_fn(|cx| self.poll_expired(cx)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn expires_at_the_latest_deadline_not_the_first() {
        let t0 = Instant::now();
        let mut d = Deadline::new(t0 + Duration::from_millis(100));
        // Arm the timer for the first deadline, then move the deadline later.
        assert!(poll_fn(|cx| Poll::Ready(d.poll_expired(cx)))
            .await
            .is_pending());
        d.set(t0 + Duration::from_millis(250));
        d.expired().await;
        assert!(Instant::now() >= t0 + Duration::from_millis(250));
        assert!(Instant::now() < t0 + Duration::from_millis(260));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_moved_earlier_rearms_the_timer() {
        let t0 = Instant::now();
        let mut d = Deadline::new(t0 + Duration::from_secs(60));
        assert!(poll_fn(|cx| Poll::Ready(d.poll_expired(cx)))
            .await
            .is_pending());
        d.set(t0 + Duration::from_millis(50));
        d.expired().await;
        let waited = Instant::now() - t0;
        assert!(waited >= Duration::from_millis(50) && waited < Duration::from_millis(60));
    }

    #[tokio::test(start_paused = true)]
    async fn expired_stays_expired_until_moved() {
        let t0 = Instant::now();
        let mut d = Deadline::new(t0 + Duration::from_millis(10));
        d.expired().await;
        // Already past: resolves at once.
        d.expired().await;
        assert!(Instant::now() < t0 + Duration::from_millis(20));
        d.set(Instant::now() + Duration::from_millis(30));
        let before = Instant::now();
        d.expired().await;
        assert!(Instant::now() - before >= Duration::from_millis(30));
    }
}
