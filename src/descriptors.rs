//! The process's file descriptors as a budget (`docs/operations.md`, "Connection caps").
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

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The descriptors the proxy side may hold at once: client connections and backend
/// connections together.
#[derive(Debug, Clone)]
pub(crate) struct Descriptors(Arc<Semaphore>);

/// One descriptor of the budget, given back when dropped (with the socket it stands
/// for).
#[derive(Debug)]
pub(crate) struct Descriptor(#[allow(dead_code)] OwnedSemaphorePermit);

impl Descriptors {
    /// A budget of `n` descriptors.
    pub(crate) fn new(n: usize) -> Descriptors {
        Descriptors(Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS))))
    }

    /// A descriptor if one is free now.
    pub(crate) fn try_take(&self) -> Option<Descriptor> {
        Arc::clone(&self.0).try_acquire_owned().ok().map(Descriptor)
    }

    /// A descriptor, once one is free.
    pub(crate) async fn take(&self) -> Descriptor {
        match Arc::clone(&self.0).acquire_owned().await {
            Ok(p) => Descriptor(p),
            // The semaphore is never closed.
            Err(_) => std::future::pending().await,
        }
    }

    /// How many are free now.
    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        self.0.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_goes_back_when_dropped() {
        let d = Descriptors::new(2);
        let a = d.try_take().unwrap();
        let b = d.try_take().unwrap();
        assert!(d.try_take().is_none());
        drop(a);
        assert_eq!(d.available(), 1);
        drop(b);
        assert_eq!(d.available(), 2);
    }
}
