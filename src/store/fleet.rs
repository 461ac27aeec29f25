//! One instance's link to the store: it loads the prefix, applies it, watches it and
//! applies every change (bursts coalesced), and resynchronises after losing etcd
//! (`docs/fleet.md`, "How changes travel").
//!
//! The site changes only here, in the order of the store's revisions, so every
//! instance applies the same sequence; admin writes ([`super::writes`]) go to etcd and
//! come back through the watch like anybody else's.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::etcd::{Change, Compare, Etcd, Kv, Op, StoreError};
use super::model::{self, Mirror, ACME, GENERATION, INSTANCES, ROUTES_KEY};
use crate::config::StoreSpec;
use crate::pool::{Event, Tagged};
use crate::reload::Reloader;
use crate::site::Site;

/// A burst of changes is applied at once when no other change comes within this long…
const QUIET: Duration = Duration::from_millis(10);
/// …or when its first change is this old.
const MAX_COALESCE: Duration = Duration::from_millis(100);
/// Longest wait between two attempts to reach etcd again.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The store as this instance sees it.
pub(crate) struct Fleet {
    pub(crate) etcd: Etcd,
    /// `PREFIX/`.
    pub(crate) prefix: String,
    /// This instance's id in the registry.
    pub(crate) id: String,
    /// Its proxy listener, as the registry shows it.
    pub(crate) listen: String,
    pub(crate) site: Arc<Site>,
    reloader: Arc<Reloader>,
    mirror: Mutex<Mirror>,
    connected: AtomicBool,
    /// The store revision whose configuration this instance applied last.
    applied: AtomicI64,
    /// Every revision up to this one has been applied: what a write waits for.
    seen: watch::Sender<i64>,
    /// What was left out at the last apply, so that it is reported once.
    left_out: Mutex<Vec<(String, String)>>,
    /// Told when the registry's lease cannot be renewed: etcd is gone even if the watch
    /// has not noticed yet.
    pub(crate) lost: tokio::sync::Notify,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("prefix", &self.prefix)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Ends the watch task with the loop that reads it.
struct AbortOnDrop(tokio::task::JoinHandle<Result<(), StoreError>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// This instance's id: host name, process id and a random part, unique while it runs
/// (a successor started by an upgrade has its own).
fn instance_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "fulcrum".into());
    // The process id alone may repeat: containers on one host name all run as pid 1.
    format!("{host}-{}-{:04x}", std::process::id(), fastrand::u16(..))
}

impl Fleet {
    /// The link to the store `spec`, for the site `site` (not yet started).
    pub(crate) fn new(
        spec: &StoreSpec,
        site: Arc<Site>,
        reloader: Arc<Reloader>,
        listen: std::net::SocketAddr,
    ) -> Fleet {
        let id = instance_id();
        crate::loops::set_instance(&id);
        Fleet {
            etcd: Etcd::new(&spec.endpoints),
            prefix: spec.prefix.clone(),
            id,
            listen: listen.to_string(),
            site,
            reloader,
            mirror: Mutex::new(Mirror::default()),
            connected: AtomicBool::new(false),
            applied: AtomicI64::new(0),
            seen: watch::channel(0).0,
            left_out: Mutex::new(Vec::new()),
            lost: tokio::sync::Notify::new(),
        }
    }

    /// Whether the instance is in touch with etcd now.
    pub(crate) fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// The store revision whose configuration this instance applied last.
    pub(crate) fn applied(&self) -> i64 {
        self.applied.load(Ordering::Relaxed)
    }

    pub(crate) fn mirror(&self) -> MutexGuard<'_, Mirror> {
        // Nothing panics while holding it.
        self.mirror.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until everything up to `revision` is applied here, for at most `limit`.
    pub(crate) async fn applied_up_to(&self, revision: i64, limit: Duration) -> bool {
        let mut rx = self.seen.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|r| *r >= revision))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// A revision to wait for: the registry's changes move it too.
    pub(crate) fn seen_changes(&self) -> watch::Receiver<i64> {
        self.seen.subscribe()
    }

    /// Keeps the site in step with the store until `stop` flips; `loaded` hears once,
    /// after the first load (a start waits for it: `docs/fleet.md`, "Starting").
    pub(crate) async fn run(
        self: Arc<Self>,
        mut stop: watch::Receiver<bool>,
        loaded: std::sync::mpsc::Sender<i64>,
    ) {
        let mut loaded = Some(loaded);
        let mut backoff = Duration::from_millis(100);
        let mut first = true;
        loop {
            let r = tokio::select! {
                r = self.sync_and_follow(&mut first, &mut loaded) => r,
                _ = stop.changed() => return,
            };
            let was = self.connected.swap(false, Ordering::Relaxed);
            match r {
                Err(StoreError::Compacted(rev)) => {
                    tracing::info!(
                        compacted = rev,
                        "store: the watch's revision was compacted; reading the prefix again"
                    );
                    continue;
                }
                Err(e) if was => {
                    tracing::warn!(error = ?e, "store: etcd lost; serving the last configuration, admin writes refused until it is back");
                    backoff = Duration::from_millis(100);
                }
                // Before the first load the start waits (and says so when it gives up).
                Err(e) if first => {
                    tracing::debug!(error = ?e, "store: etcd not read yet; retrying")
                }
                Err(e) => tracing::debug!(error = ?e, "store: etcd still unreachable"),
                Ok(()) => {}
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.changed() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Reads the prefix, applies it, then follows the watch until it fails.
    async fn sync_and_follow(
        &self,
        first: &mut bool,
        loaded: &mut Option<std::sync::mpsc::Sender<i64>>,
    ) -> Result<(), StoreError> {
        let (mut revision, mut kvs) = self.etcd.range_prefix(&self.prefix).await?;
        if *first && !self.has_config(&kvs) {
            self.seed().await?;
            (revision, kvs) = self.etcd.range_prefix(&self.prefix).await?;
        }
        self.resync(&kvs);
        let newest = kvs
            .iter()
            .filter(|kv| {
                self.relative(&kv.key)
                    .is_some_and(|k| !k.starts_with(INSTANCES) && !k.starts_with(ACME))
            })
            .map(|kv| kv.mod_revision)
            .max()
            .unwrap_or(0);
        self.apply_mirror(newest, *first);
        if *first {
            tracing::info!(revision, prefix = %self.prefix, "store: configuration loaded");
        } else {
            tracing::info!(revision, "store: etcd back; configuration read again");
        }
        *first = false;
        self.connected.store(true, Ordering::Relaxed);
        self.seen.send_replace(revision);
        if let Some(tx) = loaded.take() {
            let _ = tx.send(revision);
        }
        self.follow(revision + 1).await
    }

    /// Whether the prefix holds any pool or route list.
    fn has_config(&self, kvs: &[Kv]) -> bool {
        kvs.iter().any(|kv| {
            self.relative(&kv.key)
                .is_some_and(|k| k.starts_with("pools/") || k == ROUTES_KEY)
        })
    }

    /// An empty store gets the embedded default: the pool `default` (with the
    /// top-level strategy) and a route that takes everything to it. If another
    /// instance seeds it first, its seed stands.
    async fn seed(&self) -> Result<(), StoreError> {
        let top = self.reloader.settings();
        let mut draft = model::empty_draft(crate::config::DEFAULT_POOL);
        draft
            .values
            .push(("strategy", top.pool.strategy.name().to_string()));
        // The per-pool values of the command line go with it (`--health-interval`, …).
        for (k, v) in self.reloader.pool_flags() {
            if k != "strategy" {
                draft.values.push((k, v));
            }
        }
        let pool_key = self.key(&model::pool_key(&draft.name));
        let routes_key = self.key(ROUTES_KEY);
        let routes = model::routes_value(&[crate::config::RouteSpec::catch_all(&draft.name)]);
        let ops = [
            Op::Put(
                pool_key.clone(),
                model::pool_value(&draft).to_string().into(),
            ),
            Op::Put(routes_key.clone(), routes.to_string().into()),
            Op::Put(self.key(GENERATION), self.id.clone().into_bytes()),
        ];
        let compares = [Compare::Mod(&pool_key, 0), Compare::Mod(&routes_key, 0)];
        self.etcd.txn(&compares, &ops).await?;
        Ok(())
    }

    /// The key `key` relative to the prefix, if it is under it.
    pub(crate) fn relative<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.prefix.as_str())
    }

    /// The full key of `relative`.
    pub(crate) fn key(&self, relative: &str) -> String {
        format!("{}{relative}", self.prefix)
    }

    /// Replaces the mirror by what a read of the whole prefix found; a value that does
    /// not parse keeps its last good version.
    fn resync(&self, kvs: &[Kv]) {
        let mut m = self.mirror();
        let old = std::mem::take(&mut *m);
        for kv in kvs {
            // ACME's keys are its own (`store/acme.rs`).
            let Some(key) = self.relative(&kv.key).filter(|k| !k.starts_with(ACME)) else {
                continue;
            };
            if let Some(e) = old.entries.get(key) {
                m.entries.insert(key.to_string(), e.clone());
            }
            if let Err(e) = m.put(key, kv) {
                self.skipped(key, &e);
            }
        }
    }

    /// Follows the watch from `from`, applying each burst of changes in one go.
    async fn follow(&self, from: i64) -> Result<(), StoreError> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let etcd = self.etcd.clone();
        let prefix = self.prefix.clone();
        let mut watch = AbortOnDrop(tokio::spawn(async move {
            etcd.watch(&prefix, from, |rev, changes| {
                tx.send((rev, changes)).is_ok()
            })
            .await
        }));
        loop {
            let first = tokio::select! {
                Some(batch) = rx.recv() => batch,
                r = &mut watch.0 => {
                    return r.unwrap_or_else(|e| Err(StoreError::Protocol(e.to_string())));
                }
                _ = self.lost.notified() => {
                    return Err(StoreError::Unreachable("the registry's lease cannot be renewed".into()));
                }
            };
            let mut bursts = vec![first];
            let started = tokio::time::Instant::now();
            while started.elapsed() < MAX_COALESCE {
                match tokio::time::timeout(QUIET, rx.recv()).await {
                    Ok(Some(b)) => bursts.push(b),
                    _ => break,
                }
            }
            self.take_in(bursts);
        }
    }

    /// Takes a burst of watched changes into the mirror and applies them.
    fn take_in(&self, bursts: Vec<(i64, Vec<Change>)>) {
        let revision = bursts.iter().map(|(r, _)| *r).max().unwrap_or(0);
        let mut config = 0usize;
        // The newest configuration change: the registry's own writes do not count.
        let mut newest = 0;
        {
            let mut m = self.mirror();
            for change in bursts.into_iter().flat_map(|(_, c)| c) {
                let (key, kv, rev) = match &change {
                    Change::Put(kv) => (kv.key.as_str(), Some(kv), kv.mod_revision),
                    Change::Delete { key, revision } => (key.as_str(), None, *revision),
                };
                let Some(key) = self.relative(key).filter(|k| !k.starts_with(ACME)) else {
                    continue;
                };
                if !key.starts_with(INSTANCES) {
                    config += 1;
                    newest = newest.max(rev);
                }
                match kv {
                    Some(kv) => {
                        if let Err(e) = m.put(key, kv) {
                            self.skipped(key, &e);
                        }
                    }
                    None => m.delete(key),
                }
            }
        }
        if config > 0 {
            self.apply_mirror(newest, false);
            tracing::info!(
                revision = newest,
                changes = config,
                "store: changes applied"
            );
        }
        self.seen.send_replace(revision);
    }

    /// Applies the mirror to the site as revision `revision` (that of the newest
    /// configuration change in it: instances with the same configuration show the same
    /// revision, whatever else they read).
    fn apply_mirror(&self, revision: i64, first: bool) {
        let started = std::time::Instant::now();
        // Pools take the built-in defaults for what the store leaves out, never this
        // instance's top-level settings: every instance runs the same pools.
        let desired = self.mirror().desired(&crate::config::Settings::default());
        match super::apply::apply(&self.site, desired, first) {
            Ok(left_out) => self.report_left_out(left_out),
            Err(e) => {
                tracing::error!(revision, error = %e, "store: configuration not applied; the last one stays");
                self.skipped(ROUTES_KEY, &e.to_string());
                return;
            }
        }
        self.applied.store(revision, Ordering::Relaxed);
        tracing::debug!(
            revision,
            micros = started.elapsed().as_micros() as u64,
            "store: configuration applied"
        );
    }

    /// Why the object at `key` (in full) was left out at the last apply, if it was.
    pub(crate) fn left_out_reason(&self, key: &str) -> Option<String> {
        let key = self.relative(key)?;
        let list = self.left_out.lock().unwrap_or_else(|e| e.into_inner());
        list.iter()
            .find(|(k, _)| k == key)
            .map(|(_, why)| why.clone())
    }

    /// Says once what is left out of the configuration.
    fn report_left_out(&self, now: Vec<(String, String)>) {
        let mut before = self.left_out.lock().unwrap_or_else(|e| e.into_inner());
        for (key, why) in &now {
            if !before.contains(&(key.clone(), why.clone())) {
                self.skipped(key, why);
            }
        }
        *before = now;
    }

    /// Reports an object of the store that is not applied: a warning and an event.
    fn skipped(&self, key: &str, error: &str) {
        tracing::warn!(key = %self.key(key), error, "store: value skipped; its last good version stays");
        let pool = key
            .strip_prefix("pools/")
            .or_else(|| {
                key.strip_prefix("backends/")
                    .and_then(|r| r.split('/').next())
            })
            .unwrap_or("");
        self.site.hub.send(Tagged {
            pool: Arc::from(pool),
            event: Event::StoreSkipped {
                key: self.key(key),
                error: error.to_string(),
            },
        });
    }
}
