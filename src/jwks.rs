//! Key sets fetched from a `jwks_url` (`docs/policies.md`, "Bearer tokens (JWT)"): one
//! [`Source`] per URL, shared by every route and every routing table that names it, so
//! a reload keeps the set it holds. A task per source fetches it at start, every
//! `jwks_refresh`, with backoff while none is held, and when a token names a `kid` the
//! set lacks (at most once per [`KID_REFETCH`]); a failed fetch keeps the last good set
//! and is counted. The request path only loads the set (`arc-swap`): no fetch is ever
//! awaited by a request, except the one an unknown `kid` started, and that for at most
//! [`FETCH_TIMEOUT`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use http::Uri;
use tokio::sync::{watch, Notify};

use crate::jwt::KeySet;

/// A fetch (connection, answer and body) takes at most this long.
pub(crate) const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// An unknown `kid` starts a fetch at most this often.
pub(crate) const KID_REFETCH: Duration = Duration::from_secs(10);
/// A key set is at most this large.
const MAX_BODY: usize = 1 << 20;
/// While no set is held, fetches are retried after 1 s, doubling up to this.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// One `jwks_url`'s keys.
#[derive(Debug)]
pub(crate) struct Source {
    /// The URL.
    pub(crate) url: Uri,
    refresh: Duration,
    keys: ArcSwapOption<KeySet>,
    /// Fetches that failed.
    failures: AtomicU64,
    /// A fetch has ended, well or not (start waits for it).
    tried: AtomicBool,
    /// When an unknown `kid` last asked for a fetch, and the count of ended fetches that
    /// means the fetch it asked for has ended.
    kid_fetch: Mutex<Option<(Instant, u64)>>,
    /// Counts fetches that started.
    started: AtomicU64,
    /// Wakes the task for a fetch now.
    wake: Arc<Notify>,
    /// Counts fetches that ended: waiters for a fetch watch it.
    ended: watch::Sender<u64>,
}

/// Every source in use, by URL and refresh; a source lives while a routing table holds
/// it.
static SOURCES: Mutex<Vec<(SourceKey, Weak<Source>)>> = Mutex::new(Vec::new());

/// A source's URL and refresh period.
type SourceKey = (String, Duration);
/// The runtime the fetch tasks run on, once the process has one for its control tasks;
/// sources made before wait in [`PENDING`].
static RUNTIME: OnceLock<tokio::runtime::Handle> = OnceLock::new();
static PENDING: Mutex<Vec<Weak<Source>>> = Mutex::new(Vec::new());

/// The source of `url`, made (and its task started) if no routing table holds one.
pub(crate) fn source(url: &Uri, refresh: Duration) -> Arc<Source> {
    let key = (url.to_string(), refresh);
    let mut all = SOURCES.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|(_, w)| w.strong_count() > 0);
    if let Some(s) = all
        .iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, w)| w.upgrade())
    {
        return s;
    }
    let s = Arc::new(Source {
        url: url.clone(),
        refresh,
        keys: ArcSwapOption::empty(),
        failures: AtomicU64::new(0),
        tried: AtomicBool::new(false),
        kid_fetch: Mutex::new(None),
        started: AtomicU64::new(0),
        wake: Arc::new(Notify::new()),
        ended: watch::channel(0).0,
    });
    all.push((key, Arc::downgrade(&s)));
    drop(all);
    match RUNTIME.get() {
        Some(rt) => {
            rt.spawn(run(Arc::downgrade(&s)));
        }
        None => PENDING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(&s)),
    }
    s
}

/// Runs the fetch tasks on `rt` from now on, those of sources made before included.
pub(crate) fn start(rt: &tokio::runtime::Handle) {
    let _ = RUNTIME.set(rt.clone());
    let pending = std::mem::take(&mut *PENDING.lock().unwrap_or_else(|e| e.into_inner()));
    for s in pending {
        rt.spawn(run(s));
    }
}

/// Waits (at most [`FETCH_TIMEOUT`]) until every source in use has fetched once, well
/// or not: a start serves its first request with the keys it can have (§12a).
pub(crate) fn wait_first_fetches() {
    let until = Instant::now() + FETCH_TIMEOUT + Duration::from_millis(100);
    let pending = || {
        let all = SOURCES.lock().unwrap_or_else(|e| e.into_inner());
        all.iter()
            .filter_map(|(_, w)| w.upgrade())
            .any(|s| !s.tried.load(Ordering::Acquire))
    };
    while pending() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Source {
    /// The keys held; `None` until a fetch succeeded.
    #[inline]
    pub(crate) fn keys(&self) -> Option<Arc<KeySet>> {
        self.keys.load_full()
    }

    /// Fetches that failed.
    pub(crate) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// While the first fetch has not ended (a URL new at a reload): a receiver that
    /// changes when it does.
    pub(crate) fn first_fetch(&self) -> Option<watch::Receiver<u64>> {
        // Subscribed before the check: a fetch ending in between still changes it.
        let rx = self.ended.subscribe();
        (!self.tried.load(Ordering::Acquire)).then_some(rx)
    }

    /// Starts a fetch for an unknown `kid`, unless one was asked for within
    /// [`KID_REFETCH`]; the receiver of the count of ended fetches, and the count it
    /// reaches when the fetch asked for has ended (reached already when it ended within
    /// [`KID_REFETCH`]: the caller checks the token against the keys as they are now,
    /// which may have come since it read them).
    ///
    /// A fetch under way when the `kid` is first seen may bring the set from before the
    /// rotation: the fetch asked for is the one after it.
    pub(crate) fn fetch_for_kid(&self) -> (watch::Receiver<u64>, u64) {
        let now = Instant::now();
        // Subscribed first: a fetch ending after the count is read still changes it.
        let rx = self.ended.subscribe();
        let ended = *rx.borrow();
        let mut last = self.kid_fetch.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, until)) = *last {
            if now.duration_since(at) < KID_REFETCH {
                // The fetch asked for then has not ended yet: wait for it too (a key
                // rotation sends many new tokens at once).
                return (rx, until);
            }
        }
        let started = self.started.load(Ordering::Acquire);
        let until = started.max(ended) + 1;
        *last = Some((now, until));
        self.wake.notify_one();
        (rx, until)
    }

    /// One fetch: the set, or why not.
    async fn fetch(&self) -> Result<KeySet, String> {
        let tls = crate::transport::client_config(&crate::config::BackendTransport::default());
        let req = http::Request::get(self.url.clone())
            .header(
                http::header::ACCEPT,
                "application/jwk-set+json, application/json",
            )
            .header(http::header::USER_AGENT, "fulcrum")
            .header(http::header::VIA, crate::loops::probe_value())
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| e.to_string())?;
        let sent = crate::fetch::send(tls, req, MAX_BODY);
        let answer = match tokio::time::timeout(FETCH_TIMEOUT, sent).await {
            Ok(a) => a?,
            Err(_) => return Err(format!("no answer within {FETCH_TIMEOUT:?}")),
        };
        if !answer.status().is_success() {
            return Err(format!("answered {}", answer.status()));
        }
        KeySet::parse(answer.body())
    }

    /// Ends a fetch: the set kept (or the failure counted), waiters woken.
    fn ended(&self, outcome: Result<KeySet, String>) {
        match outcome {
            Ok(set) => {
                tracing::info!(url = %self.url, keys = set.len(), "jwks: key set fetched");
                self.keys.store(Some(Arc::new(set)));
            }
            Err(why) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                let held = self.keys.load().is_some();
                tracing::warn!(url = %self.url, error = %why, keeping_last_set = held, "jwks: fetch failed");
            }
        }
        self.tried.store(true, Ordering::Release);
        self.ended.send_modify(|n| *n += 1);
    }
}

/// Fetches `source` now, then every `refresh` (after a failure with no set held: with
/// backoff), or at once when woken; ends once no routing table holds the source (seen
/// within 5 s: the task holds it only while it fetches).
async fn run(source: Weak<Source>) {
    let Some(wake) = source.upgrade().map(|s| Arc::clone(&s.wake)) else {
        return;
    };
    let mut backoff = Duration::from_secs(1);
    loop {
        let Some(s) = source.upgrade() else {
            return;
        };
        s.started.fetch_add(1, Ordering::Release);
        let outcome = s.fetch().await;
        let held = outcome.is_ok() || s.keys.load().is_some();
        s.ended(outcome);
        let wait = match held {
            false => {
                let b = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                b
            }
            true => {
                backoff = Duration::from_secs(1);
                s.refresh
            }
        };
        drop(s);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let nap = deadline.min(tokio::time::Instant::now() + Duration::from_secs(5));
            tokio::select! {
                _ = wake.notified() => break,
                _ = tokio::time::sleep_until(nap) => {}
            }
            if source.strong_count() == 0 {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
        }
    }
}
