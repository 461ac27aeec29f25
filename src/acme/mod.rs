//! Automatic HTTPS (`docs/tls.md`, "Certificates from ACME"): the task that keeps
//! `[tls.acme]`'s certificate current. It serves the stored certificate when there is a
//! good one, orders one when there is none, renews it when due ([`schedule`]) and
//! retries a failure with backoff, never touching the request path: the listeners read
//! what it installs in [`Obtained`].

mod client;
mod order;
mod schedule;
pub(crate) mod storage;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::watch;

use crate::config::acme::AcmeSettings;
use crate::obtained::{Issued, Obtained};
use crate::pool::Hub;
use crate::pool::{Event, Tagged};
pub(crate) use schedule::renew_at;
use schedule::{Backoff, BACKOFF, FIRST_RETRY};
use storage::Storage;

/// An order (account, challenges, issuance) that takes longer is abandoned, so that a
/// CA that stalls does not hold the fleet's lock for ever.
const ORDER_TIMEOUT: Duration = Duration::from_secs(600);

/// One certificate's keeper.
pub(crate) struct Acme {
    settings: AcmeSettings,
    obtained: Arc<Obtained>,
    storage: Arc<dyn Storage>,
    hub: Arc<Hub>,
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// What ended a wait.
enum Woken {
    /// The time came.
    Due,
    /// The process stops.
    Stop,
}

impl Acme {
    /// A keeper for `settings`' certificate, installing it in `obtained`.
    pub(crate) fn new(
        settings: AcmeSettings,
        obtained: Arc<Obtained>,
        storage: Arc<dyn Storage>,
        hub: Arc<Hub>,
    ) -> Acme {
        Acme {
            settings,
            obtained,
            storage,
            hub,
        }
    }

    /// The stored certificate's name, after the first domain: the chain, then its key,
    /// in one PEM value (written in one go: never a key beside another's chain).
    fn stored_name(&self) -> String {
        format!("certs/{}.pem", self.settings.domains[0])
    }

    fn emit(&self, action: &'static str, error: Option<String>, next: Option<SystemTime>) {
        self.hub.send(Tagged {
            pool: Arc::from(""),
            event: Event::Acme {
                action,
                names: self.settings.domains.clone(),
                error,
                next: next.map(rfc3339),
            },
        });
    }

    /// Serves the stored certificate, if it is good: called before the listeners
    /// accept, so that a restart serves it from the first handshake.
    pub(crate) async fn load_stored(&self) {
        if self.adopt_stored().await {
            if let Some(i) = self.obtained.issued() {
                tracing::info!(names = ?i.names, renew_at = %rfc3339(i.renew_at), "acme: serving the stored certificate");
            }
        }
    }

    /// Keeps the certificate current until `stop`: orders when it is due and the
    /// stored backoff allows (one instance of a fleet at a time, under the storage's
    /// lock), and takes what another instance stored meanwhile.
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut changes = self.storage.changes();
        loop {
            if let Woken::Stop = self.until_due(&mut changes, &mut stop).await {
                return;
            }
            let backoff = Backoff::parse(self.storage.get(BACKOFF).await.unwrap_or_default());
            let pause = match backoff.wait(SystemTime::now()) {
                d if !d.is_zero() => d,
                _ => match self.storage.lock().await {
                    Ok(Some(lock)) => self.order_locked(lock).await,
                    // Another instance orders: its certificate comes as a change.
                    Ok(None) => FIRST_RETRY,
                    Err(e) => self.failed(e).await,
                },
            };
            let until = tokio::time::Instant::now() + pause;
            if let Woken::Stop = self.pause(until, &mut changes, &mut stop).await {
                return;
            }
        }
    }

    /// Waits until the certificate is due, taking any newer one another instance stores.
    async fn until_due(
        &self,
        changes: &mut Option<watch::Receiver<u64>>,
        stop: &mut watch::Receiver<bool>,
    ) -> Woken {
        loop {
            let due = self
                .obtained
                .issued()
                .map_or(SystemTime::now(), |i| i.renew_at);
            let wait = due.duration_since(SystemTime::now()).unwrap_or_default();
            match wait_for(wait, changes, stop).await {
                Some(woken) => return woken,
                None => {
                    self.adopt_stored().await;
                }
            }
        }
    }

    /// Waits until `until` (a change only adopts a newer certificate meanwhile: the
    /// pause after a failure is kept whatever the store does).
    async fn pause(
        &self,
        until: tokio::time::Instant,
        changes: &mut Option<watch::Receiver<u64>>,
        stop: &mut watch::Receiver<bool>,
    ) -> Woken {
        loop {
            let wait = until.saturating_duration_since(tokio::time::Instant::now());
            match wait_for(wait, changes, stop).await {
                Some(woken) => return woken,
                None => {
                    self.adopt_stored().await;
                }
            }
        }
    }

    /// How long until the certificate is due (zero without one).
    fn due_in(&self) -> Duration {
        let due = self
            .obtained
            .issued()
            .map_or(SystemTime::now(), |i| i.renew_at);
        due.duration_since(SystemTime::now()).unwrap_or_default()
    }

    /// Orders holding `lock` (unless another instance has just stored a fresh one);
    /// how long to pause before looking again.
    async fn order_locked(&self, lock: storage::Lock) -> Duration {
        if self.adopt_stored().await && !self.due_in().is_zero() {
            return Duration::ZERO;
        }
        let renewing = self.obtained.issued().is_some();
        self.emit("ordered", None, None);
        let obtained = match tokio::time::timeout(ORDER_TIMEOUT, self.obtain()).await {
            Ok(r) => r,
            Err(_) => Err(format!("the order took over {ORDER_TIMEOUT:?}; abandoned")),
        };
        let pause = match obtained {
            Ok(issued) => {
                let _ = self
                    .storage
                    .put(BACKOFF, Backoff::default().to_json())
                    .await;
                let action = if renewing { "renewed" } else { "issued" };
                tracing::info!(names = ?issued.names, not_after = %rfc3339(issued.info.not_after), "acme: certificate {action}");
                self.emit(action, None, Some(issued.renew_at));
                self.obtained.install(issued);
                // A certificate due as soon as it is issued (a clock far off, an odd
                // lifetime) must not be ordered again in a loop.
                if self.due_in().is_zero() {
                    FIRST_RETRY
                } else {
                    Duration::ZERO
                }
            }
            Err(e) => self.failed(e).await,
        };
        drop(lock);
        pause
    }

    /// Counts and reports a failure, and stores the backoff it sets; the pause.
    async fn failed(&self, error: String) -> Duration {
        crate::stats::bump(&self.hub.stats.acme_failures);
        let before = Backoff::parse(self.storage.get(BACKOFF).await.unwrap_or_default());
        let (backoff, wait) = before.failed(SystemTime::now());
        if let Err(e) = self.storage.put(BACKOFF, backoff.to_json()).await {
            tracing::debug!(error = %e, "acme: the backoff is not stored");
        }
        tracing::warn!(%error, retry_in = ?wait, "acme: obtaining the certificate failed; the current one (if any) keeps serving");
        self.emit("failed", Some(error), Some(SystemTime::now() + wait));
        wait
    }

    /// One order, from the account to the certificate, stored (a certificate the
    /// storage cannot keep is still served).
    async fn obtain(&self) -> Result<Issued, String> {
        let storage = self.storage.as_ref();
        let account = order::account(&self.settings, storage).await?;
        let pem = match order::order(&self.settings, &account, &self.obtained, storage).await {
            Err(e) if e.contains("accountDoesNotExist") => {
                order::forget_account(storage).await;
                return Err(format!(
                    "{e}; the stored account is dropped: the next attempt registers again"
                ));
            }
            other => other?,
        };
        let issued = self.ready(pem.chain.as_bytes(), pem.key.as_bytes())?;
        let value = format!("{}{}", pem.chain, pem.key).into_bytes();
        if let Err(e) = self.storage.put(&self.stored_name(), value).await {
            tracing::warn!(error = %e, "acme: the new certificate is served but not stored");
        }
        Ok(issued)
    }

    /// Serves the stored certificate if it is good and newer than the one served;
    /// whether it did.
    async fn adopt_stored(&self) -> bool {
        let stored = match self.stored().await {
            Ok(Some(s)) => s,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(error = %e, "acme: the stored certificate is not used");
                return false;
            }
        };
        let newer = self
            .obtained
            .issued()
            .is_none_or(|now| stored.info.not_after > now.info.not_after);
        if newer {
            self.obtained.install(stored);
        }
        newer
    }

    /// The stored certificate, if there is one for every name that has not expired.
    async fn stored(&self) -> Result<Option<Issued>, String> {
        let Some(pem) = self.storage.get(&self.stored_name()).await? else {
            return Ok(None);
        };
        let issued = self.ready(&pem, &pem)?;
        if issued.info.not_after <= SystemTime::now() {
            return Err("it has expired".into());
        }
        let missing: Vec<&String> = self
            .settings
            .domains
            .iter()
            .filter(|d| !issued.names.contains(d))
            .collect();
        if !missing.is_empty() {
            return Err(format!("it is not for {missing:?}"));
        }
        Ok(Some(issued))
    }

    /// A chain and key (PEM) ready to serve, with the renewal time.
    fn ready(&self, chain: &[u8], key: &[u8]) -> Result<Issued, String> {
        let certified = certified(chain, key)?;
        let leaf = certified.end_entity_cert().map_err(|e| e.to_string())?;
        let info = crate::x509::CertInfo::read(leaf).ok_or("the certificate does not parse")?;
        let names = webpki::EndEntityCert::try_from(leaf)
            .map_err(|e| format!("the certificate: {e:?}"))?
            .valid_dns_names()
            .map(str::to_ascii_lowercase)
            .collect();
        Ok(Issued {
            key: certified,
            names,
            renew_at: renew_at(&info, self.settings.renew_before),
            info,
        })
    }
}

/// A chain and its key, PEM, ready to sign handshakes; the key checked to be the
/// leaf's.
pub(crate) fn certified(chain: &[u8], key: &[u8]) -> Result<Arc<CertifiedKey>, String> {
    let certified = signing(chain, key)?;
    certified
        .keys_match()
        .map_err(|e| format!("the key is not the certificate's: {e}"))?;
    Ok(certified)
}

/// A `tls-alpn-01` challenge certificate and its key, PEM, ready to sign the CA's
/// handshake. Its key is not checked against it: the check parses the certificate
/// with webpki, which refuses the critical `acmeIdentifier` extension it carries.
pub(crate) fn challenge_certified(cert: &[u8], key: &[u8]) -> Result<Arc<CertifiedKey>, String> {
    signing(cert, key)
}

fn signing(chain: &[u8], key: &[u8]) -> Result<Arc<CertifiedKey>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the chain: {e}"))?;
    if certs.is_empty() {
        return Err("the chain is empty".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("the key: {e}"))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("the key: {e}"))?;
    Ok(Arc::new(CertifiedKey::new(certs, signer)))
}

/// Waits `wait` (`Due`), or `stop` (`Stop`); `None` when another instance stored a
/// certificate first.
async fn wait_for(
    wait: Duration,
    changes: &mut Option<watch::Receiver<u64>>,
    stop: &mut watch::Receiver<bool>,
) -> Option<Woken> {
    if *stop.borrow() {
        return Some(Woken::Stop);
    }
    let changed = async {
        match changes {
            Some(c) => {
                if c.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::time::sleep(wait) => Some(Woken::Due),
        _ = changed => None,
        _ = stop.changed() => Some(Woken::Stop),
    }
}
