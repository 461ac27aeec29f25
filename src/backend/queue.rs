//! A pool's FIFO queue (`docs/operations.md`, "Connection limits and the queue"): a
//! request that finds every eligible backend at its `max_conns` waits here, up to the
//! pool's `queue_timeout`, instead of being refused, as HAProxy's `maxconn` queues it.
//! A finished request on a limited backend wakes the oldest waiter, which then picks
//! again. The lock is only held to push, pop or remove an entry, never across a wait.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::Backend;

/// Why a request could not wait for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueError {
    /// The queue holds `max_queue` requests already.
    Full,
    /// No slot came free within `queue_timeout`.
    Timeout,
}

struct Waiter {
    ticket: u64,
    wake: oneshot::Sender<()>,
    /// The backend the strategy would have picked: its `queued` counts this request.
    preferred: Option<Arc<Backend>>,
}

/// One pool's waiting requests, oldest first.
#[derive(Default)]
pub(crate) struct Queue {
    waiters: Mutex<VecDeque<Waiter>>,
    /// `waiters.len()`, readable without the lock.
    len: AtomicUsize,
    next_ticket: AtomicU64,
    /// Bumped by every `release`: a request that saw every backend full and finds it
    /// moved when it comes to wait knows a slot came free meanwhile, and picks again
    /// instead of sleeping through that slot.
    epoch: AtomicU64,
    /// Requests answered 503 because their wait ran out.
    pub(crate) timeouts: AtomicU64,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").field("len", &self.len()).finish()
    }
}

/// Takes a waiter out of the queue when its wait ends, however it ends (a wake, the
/// timeout, or the request's future dropped because its client went away).
struct Leave<'a> {
    queue: &'a Queue,
    ticket: u64,
    /// The wait ended with its wake, which the request then uses.
    used: bool,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        let mut w = self.queue.lock();
        let pos = w.iter().position(|x| x.ticket == self.ticket);
        if let Some(gone) = pos.and_then(|p| w.remove(p)) {
            unqueue(&gone);
        }
        self.queue.len.store(w.len(), Ordering::Relaxed);
        drop(w);
        // Woken (no longer queued) but gone without using the wake: its client went
        // away, or the wait ran out in the same instant. The next waiter gets it.
        if pos.is_none() && !self.used {
            self.queue.release();
        }
    }
}

fn unqueue(w: &Waiter) {
    if let Some(b) = &w.preferred {
        b.queued().fetch_sub(1, Ordering::Relaxed);
    }
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Waiter>> {
        // Nothing panics while holding it; the deque stays consistent either way.
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Requests waiting now.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// The release count, read before a pick that may end in a wait.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// A place in the line: a request keeps the one of its first wait.
    pub(crate) fn ticket(&self) -> u64 {
        self.next_ticket.fetch_add(1, Ordering::Relaxed)
    }

    /// Waits until a slot is freed (`Ok`) or `deadline` passes, queued behind everyone
    /// already waiting, or, when `returning` (a waiter woken whose slot was taken), back
    /// at the place its `ticket` gives it, even in a full queue: waiters woken together
    /// that all lost keep their order. At most `max` wait at once. `seen` is the
    /// [`Self::epoch`] read before the pick that found no slot: a release since then
    /// returns at once. `Ok(true)`: it waited in line and was woken; `Ok(false)`: it
    /// never queued (a slot came free first), so it holds no place yet.
    pub(crate) async fn wait(
        &self,
        max: usize,
        deadline: tokio::time::Instant,
        (ticket, returning): (u64, bool),
        preferred: Option<Arc<Backend>>,
        seen: u64,
    ) -> Result<bool, QueueError> {
        let (wake, woken) = oneshot::channel();
        {
            let mut w = self.lock();
            if self.epoch() != seen {
                return Ok(false);
            }
            if w.len() >= max && !returning {
                return Err(QueueError::Full);
            }
            if let Some(b) = &preferred {
                b.queued().fetch_add(1, Ordering::Relaxed);
            }
            let waiter = Waiter {
                ticket,
                wake,
                preferred,
            };
            if returning {
                let at = w.iter().position(|x| x.ticket > ticket).unwrap_or(w.len());
                w.insert(at, waiter);
            } else {
                w.push_back(waiter);
            }
            self.len.store(w.len(), Ordering::Relaxed);
        }
        let mut leave = Leave {
            queue: self,
            ticket,
            used: false,
        };
        match tokio::time::timeout_at(deadline, woken).await {
            Ok(_) => {
                leave.used = true;
                Ok(true)
            }
            Err(_) => {
                self.timeouts.fetch_add(1, Ordering::Relaxed);
                Err(QueueError::Timeout)
            }
        }
    }

    /// A slot came free: wakes the oldest waiter (one whose request is still there).
    pub(crate) fn release(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if self.len() == 0 {
            return;
        }
        let mut w = self.lock();
        while let Some(next) = w.pop_front() {
            unqueue(&next);
            if next.wake.send(()).is_ok() {
                break;
            }
        }
        self.len.store(w.len(), Ordering::Relaxed);
    }

    /// Wakes `n` waiters (a limit was raised), or every one for `None`.
    pub(crate) fn release_many(&self, n: Option<usize>) {
        for _ in 0..n.unwrap_or(usize::MAX).min(self.len()) {
            self.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn the_oldest_waiter_is_woken_first_and_a_full_queue_refuses() {
        let q = Arc::new(Queue::default());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let (queue, order) = (Arc::clone(&q), Arc::clone(&order));
            tasks.push(tokio::spawn(async move {
                queue
                    .wait(3, deadline, (queue.ticket(), false), None, queue.epoch())
                    .await
                    .unwrap();
                order.lock().unwrap().push(i);
            }));
            while q.len() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(
            q.wait(3, deadline, (q.ticket(), false), None, q.epoch())
                .await,
            Err(QueueError::Full)
        );
        for _ in 0..3 {
            q.release();
            tokio::task::yield_now().await;
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
        assert_eq!(q.len(), 0);
    }

    #[tokio::test]
    async fn woken_waiters_that_lost_their_slot_go_back_in_their_order() {
        let q = Arc::new(Queue::default());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let (first, second) = (q.ticket(), q.ticket());
        let newcomer = q.ticket();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        // The newcomer queued while the two woken ones were picking; they come back in
        // the order they lost, second first, and still go before it — and the queue is
        // full (max 1), which a returning waiter may exceed.
        for (place, name) in [
            ((newcomer, false), "newcomer"),
            ((second, true), "second"),
            ((first, true), "first"),
        ] {
            let (queue, order) = (Arc::clone(&q), Arc::clone(&order));
            let before = q.len();
            tasks.push(tokio::spawn(async move {
                queue
                    .wait(1, deadline, place, None, queue.epoch())
                    .await
                    .unwrap();
                order.lock().unwrap().push(name);
            }));
            while q.len() == before {
                tokio::task::yield_now().await;
            }
        }
        for _ in 0..3 {
            q.release();
            tokio::task::yield_now().await;
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["first", "second", "newcomer"]);
    }

    #[tokio::test]
    async fn a_slot_freed_on_the_way_into_the_queue_is_not_missed() {
        let q = Queue::default();
        let seen = q.epoch();
        // Every backend was full at the pick; then a request ended, before this one
        // came to wait.
        q.release();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let r = tokio::time::timeout(
            Duration::from_millis(100),
            q.wait(8, deadline, (q.ticket(), false), None, seen),
        );
        assert_eq!(
            r.await,
            Ok(Ok(false)),
            "it picks again at once, holding no place"
        );
        assert_eq!(q.len(), 0);
    }

    #[tokio::test]
    async fn a_wait_runs_out_and_a_dropped_waiter_leaves() {
        let q = Queue::default();
        let soon = tokio::time::Instant::now() + Duration::from_millis(20);
        assert_eq!(
            q.wait(8, soon, (q.ticket(), false), None, q.epoch()).await,
            Err(QueueError::Timeout)
        );
        assert_eq!((q.len(), q.timeouts.load(Ordering::Relaxed)), (0, 1));
        let later = tokio::time::Instant::now() + Duration::from_secs(5);
        let gone = tokio::time::timeout(
            Duration::from_millis(20),
            q.wait(8, later, (q.ticket(), false), None, q.epoch()),
        );
        assert!(gone.await.is_err());
        assert_eq!(
            q.len(),
            0,
            "a request whose client went away left the queue"
        );
    }
}
