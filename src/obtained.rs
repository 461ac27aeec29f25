//! What fulcrum obtains from an ACME CA (`docs/tls.md`, "Certificates from ACME"), shared
//! by the task that orders it, the TLS listener that serves it and the plain listener
//! that answers the CA: the issued certificate, and the answers to the CA's pending
//! challenges (`http-01` tokens, `tls-alpn-01` certificates).
//!
//! The certificate is read on every handshake for its names, lock-free; the challenges
//! are read only by the CA's own requests, so a mutex is enough for them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use arc_swap::ArcSwapOption;
use rustls::sign::CertifiedKey;

use crate::x509::CertInfo;

/// An issued certificate, ready to serve.
#[derive(Debug)]
pub(crate) struct Issued {
    /// The chain and its key.
    pub(crate) key: Arc<CertifiedKey>,
    /// The names it is for, lower case.
    pub(crate) names: Vec<String>,
    /// Its validity and issuer.
    pub(crate) info: CertInfo,
    /// When it is renewed.
    pub(crate) renew_at: SystemTime,
}

/// The certificate for `[tls.acme]`'s names and the answers to pending challenges.
#[derive(Debug, Default)]
pub(crate) struct Obtained {
    /// The names ordered: until their certificate is issued, a handshake for one fails
    /// rather than getting another certificate.
    names: Vec<String>,
    issued: ArcSwapOption<Issued>,
    /// `http-01`: token → key authorization.
    tokens: Mutex<HashMap<String, String>>,
    /// `tls-alpn-01`: name → the challenge certificate for it.
    alpn: Mutex<HashMap<String, Arc<CertifiedKey>>>,
}

/// The path prefix of `http-01` requests (RFC 8555 §8.3).
pub(crate) const HTTP01_PREFIX: &str = "/.well-known/acme-challenge/";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each change is one insert or remove: a panic elsewhere cannot leave a map half made.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Obtained {
    /// For the certificate of `names`, not issued yet.
    pub(crate) fn new(names: Vec<String>) -> Obtained {
        Obtained {
            names,
            ..Obtained::default()
        }
    }

    /// Whether `name` (lower case) is one of the names ordered.
    pub(crate) fn covers(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    /// The certificate served now, if issued.
    pub(crate) fn issued(&self) -> Option<Arc<Issued>> {
        self.issued.load_full()
    }

    /// Serves `cert` from the next handshake on; open connections keep theirs.
    pub(crate) fn install(&self, cert: Issued) {
        self.issued.store(Some(Arc::new(cert)));
    }

    /// The `http-01` answer for `token`.
    pub(crate) fn http_answer(&self, token: &str) -> Option<String> {
        lock(&self.tokens).get(token).cloned()
    }

    /// The `tls-alpn-01` certificate for `name`.
    pub(crate) fn alpn_answer(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        lock(&self.alpn).get(&name.to_ascii_lowercase()).cloned()
    }

    /// Answers `http-01` for `token` with `key_authorization` until [`Self::forget_token`].
    pub(crate) fn answer_token(&self, token: &str, key_authorization: &str) {
        lock(&self.tokens).insert(token.to_string(), key_authorization.to_string());
    }

    /// Stops answering `http-01` for `token`.
    pub(crate) fn forget_token(&self, token: &str) {
        lock(&self.tokens).remove(token);
    }

    /// Answers `tls-alpn-01` for `name` with `cert` until [`Self::forget_alpn`].
    pub(crate) fn answer_alpn(&self, name: &str, cert: Arc<CertifiedKey>) {
        lock(&self.alpn).insert(name.to_ascii_lowercase(), cert);
    }

    /// Stops answering every challenge (the store's answers are read again whole).
    pub(crate) fn forget_answers(&self) {
        lock(&self.tokens).clear();
        lock(&self.alpn).clear();
    }

    /// Stops answering `tls-alpn-01` for `name`.
    pub(crate) fn forget_alpn(&self, name: &str) {
        lock(&self.alpn).remove(&name.to_ascii_lowercase());
    }
}
