//! The process's file descriptors as a budget (`docs/operations.md`, "Limits").
//!
//! A client connection takes one descriptor, and each connection to a backend takes
//! another; an HTTP/2 client with many requests in flight to HTTP/1.1 backends holds
//! one backend connection per request. Counting connections alone (a cap of half the
//! descriptors, two each) lets such clients take every descriptor, and then the admin
//! API cannot accept and the health checks cannot connect. So every socket the proxy
//! side opens or accepts takes a [`Descriptor`] from one budget, sized to leave the admin
//! API its own connections and a reserve for the health checks, logs and children.
//! Without a descriptor, a client connection waits in the kernel's queue and a request
//! that needs a new backend connection is answered 503, as shedding does.
//!
//! The budget is the process's, as the open-file limit it stands for is: one static,
//! set when the listeners start ([`set_limit`]). That keeps a [`Descriptor`] free of any
//! pointer (a backend connection, moved with every answer, carries no extra bytes).

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// How many descriptors may be taken at once, and how many are.
#[derive(Debug)]
struct Budget {
    limit: AtomicUsize,
    taken: AtomicUsize,
    /// Woken when one is given back.
    freed: Notify,
}

impl Budget {
    const fn new() -> Budget {
        Budget {
            limit: AtomicUsize::new(usize::MAX),
            taken: AtomicUsize::new(0),
            freed: Notify::const_new(),
        }
    }

    /// Takes one if the limit allows.
    fn take_one(&self) -> bool {
        let limit = self.limit.load(Ordering::Relaxed);
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |t| {
                (t < limit).then_some(t + 1)
            })
            .is_ok()
    }

    fn give_back(&self) {
        self.taken.fetch_sub(1, Ordering::AcqRel);
        self.freed.notify_one();
    }
}

/// The process's budget.
static PROCESS: Budget = Budget::new();

/// Sets how many descriptors the proxy side may hold at once (those held already stay
/// counted).
pub(crate) fn set_limit(n: usize) {
    PROCESS.limit.store(n.max(1), Ordering::Relaxed);
}

/// One descriptor of the budget, given back when dropped (with the socket it stands
/// for).
#[derive(Debug)]
pub(crate) struct Descriptor(());

impl Drop for Descriptor {
    fn drop(&mut self) {
        PROCESS.give_back();
    }
}

/// A descriptor if one is free now.
pub(crate) fn try_take() -> Option<Descriptor> {
    // `then`, not `then_some`: a `Descriptor` built for nothing would give one back
    // when dropped, and the budget would let a socket more through each time.
    PROCESS.take_one().then(|| Descriptor(()))
}

/// A descriptor, once one is free.
pub(crate) async fn take() -> Descriptor {
    loop {
        let freed = PROCESS.freed.notified();
        tokio::pin!(freed);
        // Registered before the check, so a descriptor given back in between wakes it.
        freed.as_mut().enable();
        if let Some(d) = try_take() {
            return d;
        }
        freed.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_gives_no_more_than_its_limit_until_one_comes_back() {
        let b = Budget::new();
        b.limit.store(2, Ordering::Relaxed);
        assert!(b.take_one() && b.take_one());
        assert!(!b.take_one());
        b.give_back();
        assert!(b.take_one());
        // A lower limit leaves those held counted.
        b.limit.store(1, Ordering::Relaxed);
        b.give_back();
        assert!(!b.take_one());
        b.give_back();
        assert!(b.take_one());
    }

    #[test]
    fn a_descriptor_is_free_of_any_pointer() {
        assert_eq!(std::mem::size_of::<Descriptor>(), 0);
    }
}
