//! Configuration reload (`SIGHUP`, `POST /admin/reload`): the file is read again and
//! validated whole — with the command line's flags on top, as at start-up — and the
//! difference is applied to the live pools and routes. An invalid file changes nothing.
//!
//! What is applied live: pools added and removed, backends added (appended in file
//! order), removed, re-weighted, each pool's strategy and hash balance factor, and the
//! routes. Pools and routes change in one step (`Site::replace`): backends and pools
//! that arrive are in place before the routes point at them, and those that leave go
//! only once no route does. A pool that stays (same name) keeps its backends; a backend
//! whose URL stays keeps its live numbers (in flight, latency average, counters,
//! health); one whose name changed is replaced. Backends started by
//! `POST /admin/backends/spawn` are runtime objects and are left alone. Backends and
//! pools added through the API are not in the file, so a reload removes them, as
//! HAProxy's and nginx's reloads forget runtime changes. Settings that shape
//! listeners, threads or a pool's fixed parts are reported in `restart_required` and
//! keep their running value until a restart.

use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::config::{self, PoolSpec, RawFlags, Settings};
use crate::pool::{Apply, Changes, Pool, Source, Wanted};
use crate::site::Site;

/// What a reload changed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Report {
    /// Names of backends added.
    pub(crate) added: Vec<String>,
    /// Names of backends removed.
    pub(crate) removed: Vec<String>,
    /// Names of backends re-weighted (or renamed, i.e. replaced).
    pub(crate) updated: Vec<String>,
    /// The strategy of the first pool now.
    pub(crate) strategy: &'static str,
    /// Names of pools added.
    pub(crate) pools_added: Vec<String>,
    /// Names of pools removed.
    pub(crate) pools_removed: Vec<String>,
    /// Settings that changed in the file but only apply after a restart (a pool's own
    /// as `pools.NAME.KEY`).
    pub(crate) restart_required: Vec<String>,
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
    site: Arc<Site>,
    /// The settings in force; one reload at a time.
    current: Mutex<Settings>,
    /// The HTTPS listener's certificates, read again on every reload.
    tls: Option<Arc<crate::tls::Tls>>,
}

impl Reloader {
    /// A reloader for a process started with `flags` and `settings`.
    pub(crate) fn new(
        flags: RawFlags,
        settings: Settings,
        site: Arc<Site>,
        tls: Option<Arc<crate::tls::Tls>>,
    ) -> Reloader {
        Reloader {
            flags,
            site,
            current: Mutex::new(settings),
            tls,
        }
    }

    /// The HTTPS listener's certificates, when there is one.
    pub(crate) fn tls(&self) -> Option<&Arc<crate::tls::Tls>> {
        self.tls.as_ref()
    }

    /// The settings in force (the top-level values new pools build on).
    pub(crate) fn settings(&self) -> Settings {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The per-pool values given on the command line (`--health-interval 1s`, …), as
    /// option keys and texts: what seeds an empty store's first pool.
    pub(crate) fn pool_flags(&self) -> Vec<(&'static str, String)> {
        self.flags
            .values
            .iter()
            .filter(|(k, _)| crate::config::pools::pool_option(k).is_some())
            .cloned()
            .collect()
    }

    /// Reloads; on error nothing has changed. systemd hears of it when it runs under
    /// it: reloading, then ready again, whatever the outcome.
    pub(crate) fn reload(&self) -> Result<Report, ReloadError> {
        if self.flags.config.is_none() {
            return Err(ReloadError::NoConfigFile);
        }
        crate::notify::reloading();
        let r = self.apply();
        crate::notify::ready();
        r
    }

    /// Reads the file again and applies it.
    fn apply(&self) -> Result<Report, ReloadError> {
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
            strategy: next
                .pools
                .first()
                .map_or(next.pool.strategy.name(), |p| p.settings.strategy.name()),
            pools_added: Vec::new(),
            pools_removed: Vec::new(),
            restart_required: config::options::restart_required(&current, &next)
                .into_iter()
                .chain((current.tls.acme != next.tls.acme).then_some("tls.acme"))
                .chain(tcp_changes(&current, &next))
                .map(String::from)
                .collect(),
        };
        // The certificates are read before anything changes: a bad one refuses the
        // whole reload, and the old ones stay.
        let certs = match (&self.tls, next.tls.listen.is_some()) {
            (Some(tls), true) => Some(tls.prepare(&next.tls).map_err(ReloadError::Invalid)?),
            _ => None,
        };
        // Before the pools: a pool's new `discover` asks the new servers.
        self.site.resolvers.set(next.resolvers.clone());
        self.site.set_clients(&next.clients);
        // In fleet mode pools, backends and routes are the store's: the file has none.
        // A store given or taken away by the file only counts after a restart
        // (`restart_required`); until then, the running mode holds.
        if current.store.is_none() && next.store.is_none() {
            let before = self
                .site
                .replace(
                    |before| self.arrive(before, &next, &mut report),
                    next.routes.clone(),
                )
                .map_err(|e| ReloadError::Invalid(e.to_string()))?;
            // Only now that no route sends requests the old way.
            leave(&before, &next, &mut report);
        } else if let Some(first) = self.site.first() {
            report.strategy = first.strategy().name();
        }
        if let (Some(tls), Some(certs)) = (&self.tls, certs) {
            tls.install(certs);
        }
        // Pools' client certificates at the same paths, renewed since (the new
        // configuration checked them).
        crate::transport::reread_client_certs();
        crate::trace::install(next.tracing.as_ref());
        tracing::info!(
            added = ?report.added,
            removed = ?report.removed,
            updated = ?report.updated,
            pools_added = ?report.pools_added,
            pools_removed = ?report.pools_removed,
            strategy = report.strategy,
            restart_required = ?report.restart_required,
            "configuration reloaded"
        );
        *current = next;
        Ok(report)
    }

    /// The pools of `next` in order: those that stay, with their new backends and
    /// strategy, and new ones, not yet reachable.
    fn arrive(&self, before: &[Arc<Pool>], next: &Settings, report: &mut Report) -> Vec<Arc<Pool>> {
        let mut pools = Vec::with_capacity(next.pools.len());
        for spec in &next.pools {
            match before.iter().find(|p| *p.name == *spec.name) {
                Some(p) => {
                    self.note_fixed_changes(p, spec, next, report);
                    add_and_update(p, spec, report);
                    pools.push(Arc::clone(p));
                }
                None => {
                    report.pools_added.push(spec.name.clone());
                    report
                        .added
                        .extend(spec.backends.iter().map(|b| b.name.clone()));
                    pools.push(Arc::new(Pool::new(
                        spec,
                        Arc::clone(&self.site.hub),
                        Source::Config,
                    )));
                }
            }
        }
        pools
    }

    /// Lists the settings of a pool that stays which changed but are fixed while it
    /// runs. The single-pool form's are the top-level ones, reported as such already.
    fn note_fixed_changes(&self, p: &Pool, spec: &PoolSpec, next: &Settings, report: &mut Report) {
        if next.pool_drafts.is_empty() {
            return;
        }
        let (a, b) = (&p.settings, &spec.settings);
        let fixed = [
            (a.mode != b.mode).then_some("mode"),
            (a.idle_timeout != b.idle_timeout).then_some("idle_timeout"),
            (a.health.kind != b.health.kind).then_some("health.kind"),
        ];
        let keys = config::options::pool_restart_required(a, b).into_iter();
        for key in keys.chain(fixed.into_iter().flatten()) {
            report
                .restart_required
                .push(format!("pools.{}.{key}", spec.name));
        }
    }
}

/// The TCP settings that changed, each fixed until a restart (`docs/tcp.md`).
fn tcp_changes(a: &Settings, b: &Settings) -> impl Iterator<Item = &'static str> {
    [
        (a.tcp_listeners != b.tcp_listeners).then_some("tcp_listeners"),
        (a.tls_passthrough != b.tls_passthrough).then_some("tls_passthrough"),
        (a.tcp_drain_timeout != b.tcp_drain_timeout).then_some("tcp_drain_timeout"),
    ]
    .into_iter()
    .flatten()
}

/// Applies the file's backends of `spec` to `pool` (the backends that leave go once the
/// new routes are in force, [`leave`]), and sets the strategy and the balance factor.
fn add_and_update(pool: &Pool, spec: &PoolSpec, report: &mut Report) {
    let how = Apply {
        ramp: true,
        remove_unlisted: false,
    };
    let changes = pool.set_members(Source::Config, file_list(spec), how);
    note(changes, report);
    pool.set_discover(spec.discover.as_ref());
    if pool.strategy() != spec.settings.strategy {
        pool.set_strategy(spec.settings.strategy);
    }
    pool.set_hash_balance_factor(spec.settings.hash_balance_factor);
}

/// The backends the file gives `spec`, as the config source's list.
fn file_list(spec: &PoolSpec) -> Vec<Wanted> {
    spec.backends.iter().cloned().map(Wanted::spec).collect()
}

/// Adds what joined or changed to the report; what was left out is logged.
fn note(changes: Changes, report: &mut Report) {
    report.added.extend(changes.added);
    report.updated.extend(changes.updated);
    for (url, _, why) in changes.refused {
        tracing::warn!(url, why, "a backend of the file was left out");
    }
}

/// Once the new routes are in force: the backends the file no longer lists leave the
/// pools that stay, and the spawned processes of pools that went stop once their
/// requests in flight have finished.
fn leave(before: &[Arc<Pool>], next: &Settings, report: &mut Report) {
    for p in before {
        match next.pools.iter().find(|s| *s.name == *p.name) {
            Some(spec) => remove_unwanted(p, spec, report),
            None => {
                report.pools_removed.push(p.name.to_string());
                for b in p.backends() {
                    report.removed.push(b.name.clone());
                    crate::spawn::Spawner::stop_when_idle(&b);
                }
            }
        }
    }
}

/// Removes the file's backends of `pool` that `spec` no longer lists; the admin API's
/// and the spawned ones stay. A pool that now has `discover` keeps them until its
/// first good lookup replaces them (`docs/discovery.md`, "Reload and fleet mode"):
/// never an empty pool in between.
fn remove_unwanted(pool: &Pool, spec: &PoolSpec, report: &mut Report) {
    if spec.discover.is_some() {
        return;
    }
    let how = Apply {
        ramp: true,
        remove_unlisted: true,
    };
    let changes = pool.set_members(Source::Config, file_list(spec), how);
    // Nothing is added or refused now that `add_and_update` did not add or refuse.
    report
        .removed
        .extend(changes.removed.iter().map(|b| b.name.clone()));
}
