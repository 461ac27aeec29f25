//! ACME in fleet mode (`docs/tls.md`, "ACME in a fleet"): the account and the
//! certificates under `PREFIX/acme/`, one orderer at a time under a lease
//! (`acme/lock`), and the challenge answers (`acme/challenges/…`) written with that
//! lease so that every instance gives them and they go when the order ends or its
//! instance dies.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::watch;

use super::etcd::{Change, Compare, Etcd, Op, StoreError, Written};
use crate::acme::storage::{Answer, Lock, Storage};
use crate::obtained::Obtained;

/// The lock outlives a dead orderer this long; renewed every third of it.
const LOCK_TTL: Duration = Duration::from_secs(30);
/// How long an answer is given to reach every instance's watch before the CA is told
/// to look (a watch on a healthy cluster delivers in milliseconds).
const PROPAGATION: Duration = Duration::from_millis(300);

const LOCK: &str = "lock";
const HTTP: &str = "challenges/http/";
const ALPN: &str = "challenges/alpn/";

/// One instance's ACME storage in the store.
pub(crate) struct FleetAcme {
    etcd: Etcd,
    /// `PREFIX/acme/`.
    prefix: String,
    /// Written into the lock: who orders.
    id: String,
    obtained: Arc<Obtained>,
    changes: watch::Sender<u64>,
    /// The lock's lease while this instance holds it.
    lease: Arc<Mutex<Option<i64>>>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct AlpnValue {
    cert: String,
    key: String,
}

fn unreachable(e: StoreError) -> String {
    format!("the store: {e:?}")
}

impl FleetAcme {
    /// Under `fleet`'s prefix, in its etcd, for `obtained`.
    pub(crate) fn new(fleet: &super::fleet::Fleet, obtained: Arc<Obtained>) -> FleetAcme {
        FleetAcme {
            etcd: fleet.etcd.clone(),
            prefix: fleet.key(super::model::ACME),
            id: fleet.id.clone(),
            obtained,
            changes: watch::channel(0).0,
            lease: Arc::new(Mutex::new(None)),
        }
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Follows `acme/` until `stop`: gives the answers other instances publish, ticks
    /// [`Storage::changes`] when a certificate is stored.
    pub(crate) async fn follow(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut backoff = Duration::from_millis(200);
        loop {
            let followed = tokio::select! {
                r = self.sync_and_watch() => r,
                _ = stop.changed() => return,
            };
            if let Err(e) = followed {
                tracing::debug!(error = ?e, "acme: the store's watch ended; following again");
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.changed() => return,
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    async fn sync_and_watch(&self) -> Result<(), StoreError> {
        let (revision, kvs) = self.etcd.range_prefix(&self.prefix).await?;
        // Answers withdrawn while the watch was down are not in the read.
        self.obtained.forget_answers();
        for kv in kvs {
            self.take(Change::Put(kv));
        }
        self.changes.send_modify(|n| *n += 1);
        self.etcd
            .watch(&self.prefix, revision + 1, |_, changes| {
                changes.into_iter().for_each(|c| self.take(c));
                true
            })
            .await
    }

    /// One change under `acme/`, taken in.
    fn take(&self, change: Change) {
        let (key, value) = match &change {
            Change::Put(kv) => (kv.key.as_str(), Some(kv.value.as_slice())),
            Change::Delete { key, .. } => (key.as_str(), None),
        };
        let Some(name) = key.strip_prefix(self.prefix.as_str()) else {
            return;
        };
        if name.starts_with("certs/") && value.is_some() {
            self.changes.send_modify(|n| *n += 1);
        } else if let Some(token) = name.strip_prefix(HTTP) {
            match value {
                Some(v) => self
                    .obtained
                    .answer_token(token, &String::from_utf8_lossy(v)),
                None => self.obtained.forget_token(token),
            }
        } else if let Some(host) = name.strip_prefix(ALPN) {
            match value.map(alpn_answer) {
                Some(Ok(cert)) => self.obtained.answer_alpn(host, cert),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, key, "acme: an unusable challenge answer in the store")
                }
                None => self.obtained.forget_alpn(host),
            }
        }
    }
}

fn alpn_answer(value: &[u8]) -> Result<Arc<rustls::sign::CertifiedKey>, String> {
    let v: AlpnValue = serde_json::from_slice(value).map_err(|e| e.to_string())?;
    crate::acme::challenge_certified(v.cert.as_bytes(), v.key.as_bytes())
}

/// The lock's holding: its lease renewed until dropped, then revoked (its answers go
/// with it); a revoke that cannot run (the process stopping) leaves the lease to expire
/// within [`LOCK_TTL`].
struct Held {
    etcd: Etcd,
    lease: i64,
    renewing: tokio::task::JoinHandle<()>,
    shared: Arc<Mutex<Option<i64>>>,
    runtime: tokio::runtime::Handle,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.renewing.abort();
        *self.shared.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let (etcd, lease) = (self.etcd.clone(), self.lease);
        self.runtime.spawn(async move {
            if let Err(e) = etcd.revoke_lease(lease).await {
                tracing::debug!(error = ?e, "acme: the lock's lease is left to expire");
            }
        });
    }
}

impl Storage for FleetAcme {
    fn get<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, String>> {
        Box::pin(async move {
            let kv = self.etcd.get(&self.key(name)).await.map_err(unreachable)?;
            Ok(kv.map(|kv| kv.value))
        })
    }

    fn put<'a>(&'a self, name: &'a str, value: Vec<u8>) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let put = Op::Put(self.key(name), value);
            self.etcd.txn(&[], &[put]).await.map_err(unreachable)?;
            Ok(())
        })
    }

    fn lock(&self) -> BoxFuture<'_, Result<Option<Lock>, String>> {
        Box::pin(async move {
            let lease = self.etcd.grant_lease(LOCK_TTL).await.map_err(unreachable)?;
            let key = self.key(LOCK);
            let take = Op::PutLease(key.clone(), self.id.clone().into_bytes(), lease);
            match self.etcd.txn(&[Compare::Mod(&key, 0)], &[take]).await {
                Ok(Written::Done(_)) => {}
                other => {
                    let _ = self.etcd.revoke_lease(lease).await;
                    return other.map(|_| None).map_err(unreachable);
                }
            }
            *self.lease.lock().unwrap_or_else(|e| e.into_inner()) = Some(lease);
            let etcd = self.etcd.clone();
            let renewing = tokio::spawn(async move {
                let mut every = tokio::time::interval(LOCK_TTL / 3);
                every.tick().await;
                loop {
                    every.tick().await;
                    if let Err(e) = etcd.keep_alive(lease).await {
                        tracing::warn!(error = ?e, "acme: the order's lock could not be renewed");
                    }
                }
            });
            let held = Held {
                etcd: self.etcd.clone(),
                lease,
                renewing,
                shared: Arc::clone(&self.lease),
                runtime: tokio::runtime::Handle::current(),
            };
            Ok(Some(Box::new(held) as Lock))
        })
    }

    fn publish(&self, answer: Answer) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let lease = *self.lease.lock().unwrap_or_else(|e| e.into_inner());
            let lease = lease.ok_or("an answer is published only under the lock")?;
            let (key, value) = match answer {
                Answer::Http {
                    token,
                    key_authorization,
                } => (
                    self.key(&format!("{HTTP}{token}")),
                    key_authorization.into_bytes(),
                ),
                Answer::Alpn { name, cert, key } => {
                    let v =
                        serde_json::to_vec(&AlpnValue { cert, key }).map_err(|e| e.to_string())?;
                    (self.key(&format!("{ALPN}{name}")), v)
                }
            };
            let put = Op::PutLease(key, value, lease);
            self.etcd.txn(&[], &[put]).await.map_err(unreachable)?;
            tokio::time::sleep(PROPAGATION).await;
            Ok(())
        })
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.changes.subscribe())
    }
}
