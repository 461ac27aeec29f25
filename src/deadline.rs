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
//!
//! The deadline is a `clock::Stamp` (moving it reads no tokio instant); the timer is
//! armed on tokio's clock. So a `Deadline` follows real time only: under tokio's paused
//! test clock it would fire early and re-arm until real time caught up.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::time::Sleep;

use crate::clock::Stamp;

/// A deadline backed by one lazily re-armed timer (see the module documentation).
#[derive(Debug)]
pub(crate) struct Deadline {
    /// Armed on first use; boxed with what its polls need, so that a deadline is two
    /// words in what carries it (a response body moves with every request).
    timer: Option<Box<Timer>>,
    /// On the request path's clock: moving the deadline reads no tokio instant, and
    /// only arming the timer converts (`Stamp::to_tokio`).
    at: Stamp,
}

/// An armed deadline's timer.
#[derive(Debug)]
struct Timer {
    sleep: Pin<Box<Sleep>>,
    /// What it is armed for: never later than the deadline.
    armed: Stamp,
    /// The waker it was last polled with and kept (a poll the task's budget refused
    /// keeps none). Polled again by the same task before it has gone off, the timer is
    /// not polled: it holds that waker already. A poll of
    /// tokio's timer registers the waker anew and draws on the task's budget, about 230
    /// instructions, and a connection's deadlines are polled whenever the connection is
    /// (`docs/performance.md`, "Timers polled only when due").
    polled_by: Option<Waker>,
}

impl Deadline {
    /// A deadline at `at`; no timer is armed until it is waited for.
    pub(crate) fn new(at: Stamp) -> Deadline {
        Deadline { timer: None, at }
    }

    /// Moves the deadline to `at`. Moving it later costs nothing now; moving it earlier
    /// than the armed timer re-arms the timer.
    #[inline]
    pub(crate) fn set(&mut self, at: Stamp) {
        self.at = at;
        if let Some(t) = &mut self.timer {
            if t.armed > at {
                t.sleep.as_mut().reset(at.to_tokio());
                t.armed = at;
                t.polled_by = None;
            }
        }
    }

    /// Ready once the deadline has passed.
    pub(crate) fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let at = self.at;
        let t = self.timer.get_or_insert_with(|| {
            Box::new(Timer {
                sleep: Box::pin(tokio::time::sleep_until(at.to_tokio())),
                armed: at,
                polled_by: None,
            })
        });
        // Whether it went off is one load of its state, no clock read.
        let same_task = t
            .polled_by
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()));
        if same_task && !t.sleep.is_elapsed() {
            return Poll::Pending;
        }
        loop {
            // A task out of budget is refused before the timer is looked at: its waker is
            // not left with the timer then, and the next poll must poll it again.
            let ran = tokio::task::coop::has_budget_remaining();
            // Pending here means another task's waker, or none, was kept (the same
            // task's returned above): keep this one, when the poll ran.
            if t.sleep.as_mut().poll(cx).is_pending() {
                t.polled_by = ran.then(|| cx.waker().clone());
                return Poll::Pending;
            }
            // Gone off: the timer gave its waker away.
            t.polled_by = None;
            if Stamp::now() >= self.at {
                return Poll::Ready(());
            }
            // It went off for an earlier deadline: wait on for the current one.
            t.sleep.as_mut().reset(self.at.to_tokio());
            t.armed = self.at;
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

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test]
    async fn expires_at_the_latest_deadline_not_the_first() {
        let t0 = Stamp::now();
        let mut d = Deadline::new(t0.after(ms(300)));
        // Arm the timer for the first deadline, then move the deadline later.
        assert!(poll_fn(|cx| Poll::Ready(d.poll_expired(cx)))
            .await
            .is_pending());
        d.set(t0.after(ms(600)));
        d.expired().await;
        assert!(Stamp::now() >= t0.after(ms(600)));
    }

    #[tokio::test]
    async fn a_deadline_first_polled_out_of_budget_still_goes_off() {
        // A channel with more messages than a task's budget: taking them until one is
        // refused spends the budget within one poll.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..1000 {
            tx.send(i).ok();
        }
        let t0 = Stamp::now();
        let mut d = Deadline::new(t0.after(ms(30)));
        let mut first = true;
        let waited = tokio::time::timeout(
            Duration::from_secs(5),
            poll_fn(|cx| {
                if std::mem::take(&mut first) {
                    while rx.poll_recv(cx).is_ready() {}
                    // Refused for want of budget: the timer keeps no waker.
                    assert!(d.poll_expired(cx).is_pending());
                }
                d.poll_expired(cx)
            }),
        )
        .await;
        assert!(waited.is_ok(), "the deadline never went off");
        assert!(Stamp::now() >= t0.after(ms(30)));
    }

    #[tokio::test]
    async fn a_deadline_polled_again_by_its_task_is_not_polled_until_due() {
        let t0 = Stamp::now();
        let mut d = Deadline::new(t0.after(ms(40)));
        let mut polls = 0;
        poll_fn(|cx| {
            polls += 1;
            // Polled over and over by the same task: each poll after the first skips
            // the timer, and the timer still wakes the task when it goes off.
            if polls < 50 {
                cx.waker().wake_by_ref();
            }
            d.poll_expired(cx)
        })
        .await;
        assert!(Stamp::now() >= t0.after(ms(40)));
        assert!(polls >= 50, "{polls}");
    }

    #[tokio::test]
    async fn a_deadline_moved_earlier_rearms_the_timer() {
        let t0 = Stamp::now();
        let mut d = Deadline::new(t0.after(Duration::from_secs(60)));
        assert!(poll_fn(|cx| Poll::Ready(d.poll_expired(cx)))
            .await
            .is_pending());
        d.set(t0.after(ms(50)));
        d.expired().await;
        let waited = Stamp::now().since(t0);
        // Far from the first deadline's minute: the timer was re-armed.
        assert!(
            waited >= ms(50) && waited < Duration::from_secs(10),
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn expired_stays_expired_until_moved() {
        let t0 = Stamp::now();
        let mut d = Deadline::new(t0.after(ms(10)));
        d.expired().await;
        // Already past: resolves at once (a poll, no wait).
        assert!(poll_fn(|cx| Poll::Ready(d.poll_expired(cx)))
            .await
            .is_ready());
        let before = Stamp::now();
        d.set(before.after(ms(30)));
        d.expired().await;
        assert!(Stamp::now().since(before) >= ms(30));
    }
}
