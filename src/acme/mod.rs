//! Automatic HTTPS (`docs/tls.md`, "Certificates from ACME"): the task that keeps
//! `[tls.acme]`'s certificate current. It serves the stored certificate when there is a
//! good one, orders one when there is none, renews it `renew_before` its expiry (or at a
//! third of its lifetime left, if sooner) and retries a failure with backoff, never
//! touching the request path: the listeners read what it installs in [`Obtained`].

mod client;
mod order;
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
use storage::Storage;

/// The first retry after a failure; each next one waits twice as long.
const FIRST_RETRY: Duration = Duration::from_secs(120);
/// Retries are at most this far apart.
const LAST_RETRY: Duration = Duration::from_secs(3600);

/// One certificate's keeper.
pub(crate) struct Acme {
    settings: AcmeSettings,
    obtained: Arc<Obtained>,
    storage: Arc<dyn Storage>,
    hub: Arc<Hub>,
}

/// The renewal time of a certificate: `renew_before` its expiry or a third of its
/// lifetime before it, whichever is sooner. A `renew_before` of half the lifetime or
/// more (30 days against a 6-day certificate) would renew at once: the third is taken.
pub(crate) fn renew_at(info: &crate::x509::CertInfo, renew_before: Duration) -> SystemTime {
    let lifetime = info.lifetime();
    let third = lifetime / 3;
    let before = if renew_before >= lifetime / 2 {
        third
    } else {
        renew_before.max(third)
    };
    info.not_after
        .checked_sub(before)
        .unwrap_or(info.not_before)
}

/// How long to wait after the `n`th failure in a row (from 1): 2 min doubling to an
/// hour, ±10 % so that a fleet's instances do not retry together. Five attempts in the
/// first hour stay within public CAs' failed-validation limits.
fn retry_after(n: u32) -> Duration {
    let base = FIRST_RETRY.saturating_mul(1 << n.saturating_sub(1).min(10));
    base.min(LAST_RETRY).mul_f64(0.9 + fastrand::f64() * 0.2)
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
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

    /// The stored certificate's file name, after the first domain.
    fn file(&self, ext: &str) -> String {
        format!("certs/{}.{ext}", self.settings.domains[0])
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

    /// Keeps the certificate current until `stop`: serves the stored one, orders when
    /// it is due (one instance of a fleet at a time, under the storage's lock), takes
    /// what another instance stored.
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        if self.adopt_stored().await {
            if let Some(i) = self.obtained.issued() {
                tracing::info!(names = ?i.names, renew_at = %rfc3339(i.renew_at), "acme: serving the stored certificate");
            }
        }
        let mut changes = self.storage.changes();
        let mut failures = 0;
        loop {
            match wait_for(self.due_in(), &mut changes, &mut stop).await {
                Woken::Stop => return,
                Woken::Changed => {
                    self.adopt_stored().await;
                    continue;
                }
                Woken::Due => {}
            }
            let pause = match self.storage.lock().await {
                Ok(Some(lock)) => self.order_locked(lock, &mut failures).await,
                // Another instance orders: its certificate comes as a change.
                Ok(None) => retry_after(1),
                Err(e) => self.failed(e, &mut failures),
            };
            if !pause.is_zero() {
                if let Woken::Stop = wait_for(pause, &mut changes, &mut stop).await {
                    return;
                }
                self.adopt_stored().await;
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
    /// how long to wait before the next attempt (zero after a success).
    async fn order_locked(&self, lock: storage::Lock, failures: &mut u32) -> Duration {
        if self.adopt_stored().await && !self.due_in().is_zero() {
            return Duration::ZERO;
        }
        let renewing = self.obtained.issued().is_some();
        self.emit("ordered", None, None);
        let obtained = self.obtain().await;
        drop(lock);
        match obtained {
            Ok(issued) => {
                *failures = 0;
                let action = if renewing { "renewed" } else { "issued" };
                tracing::info!(names = ?issued.names, not_after = %rfc3339(issued.info.not_after), "acme: certificate {action}");
                self.emit(action, None, Some(issued.renew_at));
                self.obtained.install(issued);
                Duration::ZERO
            }
            Err(e) => self.failed(e, failures),
        }
    }

    /// Counts and reports a failure; how long until the next attempt.
    fn failed(&self, error: String, failures: &mut u32) -> Duration {
        *failures += 1;
        crate::stats::bump(&self.hub.stats.acme_failures);
        let wait = retry_after(*failures);
        tracing::warn!(%error, retry_in = ?wait, "acme: obtaining the certificate failed; the current one (if any) keeps serving");
        self.emit("failed", Some(error), Some(SystemTime::now() + wait));
        wait
    }

    /// One order, from the account to the stored certificate.
    async fn obtain(&self) -> Result<Issued, String> {
        let storage = self.storage.as_ref();
        let account = order::account(&self.settings, storage).await?;
        let pem = order::order(&self.settings, &account, &self.obtained, storage).await?;
        let issued = self.ready(pem.chain.as_bytes(), pem.key.as_bytes())?;
        self.storage
            .put(&self.file("key"), pem.key.into_bytes())
            .await?;
        self.storage
            .put(&self.file("crt"), pem.chain.into_bytes())
            .await?;
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
        let chain = self.storage.get(&self.file("crt")).await?;
        let key = self.storage.get(&self.file("key")).await?;
        let (Some(chain), Some(key)) = (chain, key) else {
            return Ok(None);
        };
        let issued = self.ready(&chain, &key)?;
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

/// What ended a wait.
enum Woken {
    Due,
    Changed,
    Stop,
}

/// Waits `wait`, or until another instance stores a certificate, or `stop`.
async fn wait_for(
    wait: Duration,
    changes: &mut Option<watch::Receiver<u64>>,
    stop: &mut watch::Receiver<bool>,
) -> Woken {
    if *stop.borrow() {
        return Woken::Stop;
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
        _ = tokio::time::sleep(wait) => Woken::Due,
        _ = changed => Woken::Changed,
        _ = stop.changed() => Woken::Stop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::x509::CertInfo;
    use std::time::UNIX_EPOCH;

    fn info(days: u64) -> CertInfo {
        CertInfo {
            not_before: UNIX_EPOCH,
            not_after: UNIX_EPOCH + Duration::from_secs(days * 86_400),
            issuer: String::new(),
        }
    }

    #[test]
    fn renewal_is_renew_before_or_a_third_of_the_lifetime_whichever_is_sooner() {
        let day = |d: u64| UNIX_EPOCH + Duration::from_secs(d * 86_400);
        let days = |d: u64| Duration::from_secs(d * 86_400);
        assert_eq!(renew_at(&info(90), days(30)), day(60));
        assert_eq!(
            renew_at(&info(90), days(10)),
            day(60),
            "a third left comes sooner"
        );
        assert_eq!(renew_at(&info(90), days(40)), day(50));
        assert_eq!(
            renew_at(&info(6), days(30)),
            day(4),
            "30 days of a 6-day certificate: a third"
        );
    }

    #[test]
    fn retries_double_from_two_minutes_to_an_hour() {
        let near = |d: Duration, secs: f64| (d.as_secs_f64() / secs - 1.0).abs() <= 0.1 + 1e-9;
        assert!(near(retry_after(1), 120.0));
        assert!(near(retry_after(2), 240.0));
        assert!(near(retry_after(5), 1920.0));
        assert!(near(retry_after(6), 3600.0));
        assert!(near(retry_after(u32::MAX), 3600.0));
    }
}
