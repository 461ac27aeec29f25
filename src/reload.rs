//! Configuration reload (`SIGHUP`, `POST /admin/reload`): the file is read again and
//! validated whole — with the command line's flags on top, as at start-up — and the
//! difference is applied to the live pool. An invalid file changes nothing.
//!
//! What is applied live: backends added (appended in file order), removed, re-weighted,
//! the strategy and the hash balance factor. A backend whose URL stays keeps its live numbers (in flight, latency
//! average, counters, health); one whose name changed is replaced. Backends started by
//! `POST /admin/backends/spawn` are runtime objects and are left alone. Backends added
//! through the API are not in the file, so a reload removes them, as HAProxy's and
//! nginx's reloads forget runtime changes. Settings that shape listeners, threads or the
//! request path's fixed parts are reported in `restart_required` and keep their running
//! value until a restart.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::config::{self, RawFlags, Settings};
use crate::pool::Pool;

/// What a reload changed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Report {
    /// Names of backends added.
    pub(crate) added: Vec<String>,
    /// Names of backends removed.
    pub(crate) removed: Vec<String>,
    /// Names of backends re-weighted (or renamed, i.e. replaced).
    pub(crate) updated: Vec<String>,
    /// The strategy now in use.
    pub(crate) strategy: &'static str,
    /// Settings that changed in the file but only apply after a restart.
    pub(crate) restart_required: Vec<&'static str>,
}

/// Why a reload did nothing.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ReloadError {
    /// fulcrum runs without `--config`.
    NoConfigFile,
    /// The file is unreadable or invalid (the first error).
    Invalid(String),
}

impl std::fmt::Display for ReloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReloadError::NoConfigFile => {
                f.write_str("fulcrum was started without --config: nothing to reload")
            }
            ReloadError::Invalid(e) => write!(f, "config not reloaded: {e}"),
        }
    }
}

/// Re-reads the config file and applies it.
#[derive(Debug)]
pub(crate) struct Reloader {
    flags: RawFlags,
    pool: Arc<Pool>,
    /// The settings in force; one reload at a time.
    current: Mutex<Settings>,
}

impl Reloader {
    /// A reloader for a process started with `flags` and `settings`.
    pub(crate) fn new(flags: RawFlags, settings: Settings, pool: Arc<Pool>) -> Reloader {
        Reloader {
            flags,
            pool,
            current: Mutex::new(settings),
        }
    }

    /// Reloads; on error nothing has changed.
    pub(crate) fn reload(&self) -> Result<Report, ReloadError> {
        if self.flags.config.is_none() {
            return Err(ReloadError::NoConfigFile);
        }
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let next = config::build(&self.flags).map_err(|errors| {
            ReloadError::Invalid(
                errors
                    .first()
                    .map_or_else(|| "invalid".to_string(), |e| e.to_string()),
            )
        })?;
        let mut report = Report {
            added: Vec::new(),
            removed: Vec::new(),
            updated: Vec::new(),
            strategy: next.strategy.name(),
            restart_required: config::options::restart_required(&current, &next),
        };
        let wanted: HashSet<&str> = next.backends.iter().map(|b| b.url.as_str()).collect();
        for b in self.pool.backends() {
            if b.spawn.is_none()
                && !wanted.contains(b.url.as_str())
                && self.pool.remove(b.id).is_ok()
            {
                report.removed.push(b.name.clone());
            }
        }
        for spec in &next.backends {
            let existing = self.pool.backends().into_iter().find(|b| b.url == spec.url);
            match existing {
                // Spawned backends are runtime objects; the file does not manage them.
                Some(b) if b.spawn.is_some() => {}
                None => {
                    if self.pool.add(spec.clone()).is_ok() {
                        report.added.push(spec.name.clone());
                    }
                }
                Some(b) if b.name != spec.name => {
                    // A name is part of every label and log line: replace the backend.
                    if self.pool.remove(b.id).is_ok() && self.pool.add(spec.clone()).is_ok() {
                        report.updated.push(spec.name.clone());
                    }
                }
                Some(b) if b.weight() != spec.weight => {
                    if self.pool.update(b.id, Some(spec.weight), None).is_ok() {
                        report.updated.push(spec.name.clone());
                    }
                }
                Some(_) => {}
            }
        }
        if self.pool.strategy() != next.strategy {
            self.pool.set_strategy(next.strategy);
        }
        if current.hash_balance_factor != next.hash_balance_factor {
            self.pool.set_hash_balance_factor(next.hash_balance_factor);
        }
        tracing::info!(
            added = ?report.added,
            removed = ?report.removed,
            updated = ?report.updated,
            strategy = report.strategy,
            restart_required = ?report.restart_required,
            "configuration reloaded"
        );
        *current = next;
        Ok(report)
    }
}
