//! What a pool keeps of discovery (`docs/discovery.md`): its `discover` setting, which
//! its discovery task follows, and what the last lookup did, for the admin API and
//! the metrics. The lookups themselves are `crate::discovery`'s.

use std::sync::{Arc, MutexGuard};
use std::time::SystemTime;

use tokio::sync::watch;

use super::Pool;
use crate::config::DiscoverSpec;

/// What discovery last did for a pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct DiscoveryStatus {
    /// When a lookup or read last succeeded.
    pub(crate) updated_at: Option<SystemTime>,
    /// When the next lookup or read is due.
    pub(crate) next_at: Option<SystemTime>,
    /// Why the last lookup or read failed; `None` when it succeeded.
    pub(crate) error: Option<String>,
    /// Lookups that changed the backends.
    pub(crate) changed: u64,
    /// Lookups that found the backends as they were.
    pub(crate) unchanged: u64,
    /// Lookups that failed (the last good set stayed).
    pub(crate) errors: u64,
}

impl Pool {
    /// Its `discover` setting now.
    pub(crate) fn discover(&self) -> Option<Arc<DiscoverSpec>> {
        self.discover.borrow().clone()
    }

    /// Follows its `discover` setting.
    pub(crate) fn discover_watch(&self) -> watch::Receiver<Option<Arc<DiscoverSpec>>> {
        self.discover.subscribe()
    }

    /// Sets its `discover` setting (a reload, the store); its discovery task takes the
    /// new one. The same setting again changes nothing.
    pub(crate) fn set_discover(&self, spec: Option<&DiscoverSpec>) {
        self.discover.send_if_modified(|cur| {
            if cur.as_deref() == spec {
                return false;
            }
            *cur = spec.map(|s| Arc::new(s.clone()));
            true
        });
    }

    /// What discovery last did, to read or to change.
    pub(crate) fn discovery(&self) -> MutexGuard<'_, DiscoveryStatus> {
        // Nothing panics while holding it; the status stays consistent either way.
        self.discovery.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many of its backends discovery found.
    pub(crate) fn discovered_count(&self) -> usize {
        (self.snapshot().backends.iter())
            .filter(|b| b.control.source().is_discovered())
            .count()
    }
}
