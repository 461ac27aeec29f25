//! Discovery (`docs/discovery.md`): pools whose backends come from SRV records, A/AAAA
//! records or a watched file instead of a list.
//!
//! One task per pool, on the control runtime beside the health checks, follows the
//! pool's `discover` setting: it looks the name up again when the answer's TTL runs
//! out (clamped to [1 s, interval]), or reads the file again when it changes, and
//! hands what it found to the one membership path (`Pool::set_members`), which keeps
//! what stays, adds what joined and drains what left. A failed lookup or a bad file
//! changes nothing: the last good set stays, and the error is kept for the admin API.

mod dns;
mod file;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use tokio::sync::{watch, Notify};

use crate::config::discover::{DiscoverSpec, Target, MIN_INTERVAL};
use crate::config::BackendSpec;
use crate::pool::{Apply, Event, Pool, Source, Wanted};

/// The DNS servers discovery asks, shared by every pool's task and changed by a
/// reload; empty: those of `/etc/resolv.conf`.
#[derive(Debug, Clone)]
pub(crate) struct Resolvers(Arc<ArcSwap<Vec<SocketAddr>>>);

impl Default for Resolvers {
    fn default() -> Self {
        Resolvers(Arc::new(ArcSwap::from_pointee(Vec::new())))
    }
}

impl Resolvers {
    /// Sets the servers; each pool's next lookup asks them.
    pub(crate) fn set(&self, servers: Vec<SocketAddr>) {
        if **self.0.load() != servers {
            self.0.store(Arc::new(servers));
        }
    }

    fn get(&self) -> Arc<Vec<SocketAddr>> {
        self.0.load_full()
    }
}

/// Follows `pool`'s `discover` setting until `stop` flips or the pool is removed. When
/// the setting goes, the backends it found leave.
pub(crate) async fn run(pool: Arc<Pool>, resolvers: Resolvers, mut stop: watch::Receiver<bool>) {
    let mut setting = pool.discover_watch();
    let mut retired = pool.retired();
    loop {
        let spec = setting.borrow_and_update().clone();
        let following = async {
            match &spec {
                Some(s) => follow(&pool, s, &resolvers).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = following => {}
            r = setting.changed() => if r.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
            // Removed before this task first ran counts too.
            _ = retired.wait_for(|r| *r) => return,
        }
        if setting.borrow().is_none() {
            clear_discovered(&pool);
            *pool.discovery() = Default::default();
        } else {
            // Another name or file: the old one's error is not the new one's.
            pool.discovery().error = None;
        }
    }
}

/// Takes out every backend discovery found in `pool` (its `discover` went away), and
/// only those: a list that took the pool's place keeps what it took over.
fn clear_discovered(pool: &Pool) {
    let found: Vec<_> = (pool.backends().into_iter())
        .filter(|b| b.control.source().is_discovered())
        .collect();
    let removed: Vec<String> = (found.iter())
        .filter(|b| pool.remove(b.id).is_ok())
        .map(|b| b.url.clone())
        .collect();
    if !removed.is_empty() {
        pool.emit(Event::Discovery {
            added: Vec::new(),
            removed,
        });
    }
}

/// The source that owns what `spec` finds.
fn source_of(spec: &DiscoverSpec) -> Source {
    match spec.target {
        Target::Srv(_) => Source::Srv,
        Target::Dns { .. } => Source::Dns,
        Target::File(_) => Source::File,
    }
}

/// Looks up or reads `spec` again and again; never returns. The backends found take
/// the pool's scheme unless `spec` names one (`tcp` in a TCP pool).
async fn follow(pool: &Pool, spec: &DiscoverSpec, resolvers: &Resolvers) {
    let spec = &spec.for_mode(pool.settings.mode);
    match &spec.target {
        Target::File(path) => follow_file(pool, spec, path).await,
        _ => follow_dns(pool, spec, resolvers).await,
    }
}

/// The DNS loop: a lookup, then the next one when its TTL runs out; after a failure,
/// again in 1 s, 2 s, 4 s… up to the interval.
async fn follow_dns(pool: &Pool, spec: &DiscoverSpec, resolvers: &Resolvers) {
    let mut servers = resolvers.get();
    let mut resolver = dns::resolver(&servers, spec.interval);
    let mut backoff = MIN_INTERVAL;
    loop {
        let now = resolvers.get();
        // A resolver that could not be made (no /etc/resolv.conf yet) is tried again.
        if !Arc::ptr_eq(&now, &servers) || resolver.is_err() {
            servers = now;
            resolver = dns::resolver(&servers, spec.interval);
        }
        let found = match &resolver {
            Ok(r) => dns::lookup(r, spec).await,
            Err(e) => Err(e.clone()),
        };
        let wait = match found {
            Ok(f) => {
                backoff = MIN_INTERVAL;
                settle(pool, spec, Ok(f.backends), f.valid_for);
                f.valid_for
            }
            Err(e) => {
                let wait = backoff;
                backoff = (backoff * 2).min(spec.interval);
                settle(pool, spec, Err(e), wait);
                wait
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// The file loop: a read now, then one after each change seen, and every interval.
/// Without a watch (the directory is missing, or inotify's limits are reached) the
/// file is read every second, so that a change is still followed within one.
async fn follow_file(pool: &Pool, spec: &DiscoverSpec, path: &std::path::Path) {
    let changed = Arc::new(Notify::new());
    let mut watcher = None;
    let mut told = false;
    loop {
        // A watch whose directory went sees nothing more: watch again.
        if (watcher.as_ref()).is_some_and(|w: &file::Watch| w.lost.load(Ordering::Relaxed)) {
            watcher = None;
        }
        // Watched before it is read: a change in between is not missed.
        if watcher.is_none() {
            match file::watch(path, Arc::clone(&changed)) {
                Ok(w) => watcher = Some(w),
                Err(e) if !told => {
                    tracing::warn!(pool = %pool.name, error = %e, "reading the file every second instead");
                    told = true;
                }
                Err(_) => {}
            }
        }
        let period = if watcher.is_some() {
            spec.interval
        } else {
            MIN_INTERVAL
        };
        let found = file::read_off_runtime(path, pool.settings.max_backends).await;
        settle(pool, spec, found, period);
        file::next_change(&changed, period).await;
    }
}

/// Applies a lookup's outcome to `pool` and notes it: a good set replaces the
/// discovered backends; an error keeps them. `next` is when the next lookup is due.
fn settle(
    pool: &Pool,
    spec: &DiscoverSpec,
    found: Result<Vec<BackendSpec>, String>,
    next: Duration,
) {
    let now = SystemTime::now();
    // The pool's first set joins at full weight, as backends present at start do.
    let ramp = pool.discovery().updated_at.is_some();
    let found = found
        .and_then(|list| fit_mode(pool, list))
        .and_then(|list| within_max(pool, list));
    let (found, own) = match found {
        Ok(list) => match without_own(list) {
            // Nothing left but this fulcrum: a failure, which never empties the pool.
            (list, Some(why)) if list.is_empty() => (Err(why), None),
            (list, own) => (Ok(list), own),
        },
        Err(e) => (Err(e), None),
    };
    let outcome = found.map(|list| apply(pool, source_of(spec), list, ramp));
    let mut st = pool.discovery();
    st.next_at = Some(now + next);
    match outcome {
        Ok(changed) => {
            if let Some(why) = own {
                // The rest is applied; the address left out is named until it goes.
                if st.error.as_deref() != Some(why.as_str()) {
                    tracing::warn!(pool = %pool.name, error = %why, "a discovered backend was left out");
                }
                st.error = Some(why);
            } else if st.error.take().is_some() {
                tracing::info!(pool = %pool.name, "discovery answers again");
            }
            st.updated_at = Some(now);
            if changed {
                st.changed += 1;
            } else {
                st.unchanged += 1;
            }
        }
        Err(e) => {
            if st.error.as_deref() != Some(e.as_str()) {
                tracing::warn!(pool = %pool.name, error = %e, "discovery failed; the last good backends stay");
            }
            st.error = Some(e);
            st.errors += 1;
        }
    }
}

/// `list` when each backend fits the pool's mode (`tcp://` in a TCP pool, `http(s)://`
/// in an HTTP one); else the first misfit, and the last good set stays.
fn fit_mode(pool: &Pool, list: Vec<BackendSpec>) -> Result<Vec<BackendSpec>, String> {
    let mode = pool.settings.mode;
    match list
        .iter()
        .find_map(|b| crate::config::tcp::url_fits(&b.url, mode).err())
    {
        Some(e) => Err(e),
        None => Ok(list),
    }
}

/// `list` without the backends that are this fulcrum's own listeners, and why the
/// first of those was left out (`crate::loops`).
fn without_own(list: Vec<BackendSpec>) -> (Vec<BackendSpec>, Option<String>) {
    let mut why = None;
    let kept = (list.into_iter())
        .filter(|b| {
            let own = crate::loops::own_backend_now(b.authority.as_str(), b.addr);
            let keep = own.is_none();
            why = why.take().or(own);
            keep
        })
        .collect();
    (kept, why)
}

/// `list` when the pool can take it whole: the discovered backends and those of other
/// sources (backups and draining ones count) within its `max_backends`. A list over it
/// is refused whole, so the last good set stays (`docs/discovery.md`, "Limits").
fn within_max(pool: &Pool, list: Vec<BackendSpec>) -> Result<Vec<BackendSpec>, String> {
    let max = pool.settings.max_backends;
    // Another source's backend that the list names passes to discovery: counted once.
    let listed: std::collections::HashSet<&str> = list.iter().map(|b| b.url.as_str()).collect();
    let others = (pool.backends().iter())
        .filter(|b| !b.control.source().is_discovered() && !listed.contains(b.url.as_str()))
        .count();
    match list.len() + others {
        n if n > max => Err(format!(
            "{} backends found, {n} with the pool's others: over its max_backends ({max})",
            list.len()
        )),
        _ => Ok(list),
    }
}

/// Makes the discovered backends of `pool` those of `list` through the membership
/// path; whether anything changed. One `discovery` event tells who joined and left.
fn apply(pool: &Pool, source: Source, list: Vec<BackendSpec>, ramp: bool) -> bool {
    let before = discovered_urls(pool);
    let want = list.into_iter().map(Wanted::spec).collect();
    let how = Apply {
        ramp,
        remove_unlisted: true,
    };
    let changes = pool.set_members(source, want, how);
    for (url, _, why) in &changes.refused {
        tracing::warn!(pool = %pool.name, url, why, "a discovered backend was left out");
    }
    let after = discovered_urls(pool);
    let added: Vec<String> = after.difference(&before).cloned().collect();
    let removed: Vec<String> = before.difference(&after).cloned().collect();
    let changed = !(added.is_empty() && removed.is_empty() && changes.updated.is_empty());
    if !added.is_empty() || !removed.is_empty() {
        tracing::info!(pool = %pool.name, ?added, ?removed, "discovery changed the backends");
        pool.emit(Event::Discovery { added, removed });
    }
    changed
}

fn discovered_urls(pool: &Pool) -> BTreeSet<String> {
    (pool.backends().iter())
        .filter(|b| b.control.source().is_discovered())
        .map(|b| b.url.clone())
        .collect()
}
