//! Client certificates on the HTTPS listener (`docs/tls.md`, "Mutual TLS"): rustls's
//! `WebPkiClientVerifier` over `[tls.client_auth]`'s CAs and CRLs, behind one verifier
//! every handshake asks (TCP and QUIC alike) whose inside a reload swaps, and the count
//! of refused handshakes by reason.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};

use crate::config::client_auth::{ClientAuthFiles, ClientAuthSettings, Mode};
use crate::identity::ClientCert;

/// The reasons a client certificate is refused, as `fulcrum_tls_client_auth_failures_total`
/// labels them.
pub(crate) const REASONS: [&str; 5] = ["unknown_ca", "expired", "revoked", "missing", "other"];

/// Refused handshakes per reason in [`REASONS`] order, for the whole process.
static FAILURES: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

/// Refused handshakes per reason, in [`REASONS`] order.
pub(crate) fn failures() -> [u64; 5] {
    std::array::from_fn(|i| FAILURES[i].load(Ordering::Relaxed))
}

fn count(reason: usize) {
    FAILURES[reason].fetch_add(1, Ordering::Relaxed);
}

/// Counts a handshake that failed because a client sent no certificate where one is
/// required (rustls refuses it before any verifier is asked).
pub(crate) fn note_handshake_error(e: &Error) {
    if matches!(e, Error::NoCertificatesPresented) {
        note_missing();
    }
}

/// Counts a handshake refused because the client sent no certificate.
pub(crate) fn note_missing() {
    count(3);
}

/// The reason a verification error counts under.
fn reason_of(e: &Error) -> usize {
    match e {
        Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer => 0,
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => 1,
            CertificateError::Revoked => 2,
            _ => 4,
        },
        _ => 4,
    }
}

/// One `[tls.client_auth]` made into a verifier.
#[derive(Debug)]
pub(crate) struct ClientAuth {
    inner: Arc<dyn ClientCertVerifier>,
    /// Its number among those made: a worker's remembered chains are this one's only.
    generation: u64,
}

/// Chains a worker verified, by the SHA-256 of their certificates, with the time they
/// are valid in (`[not_before, not_after]`, Unix seconds), for the [`ClientAuth`] of
/// `generation`. Per worker thread: no lock on the handshake path.
#[derive(Default)]
struct Verified {
    generation: u64,
    chains: std::collections::HashMap<[u8; 32], (u64, u64)>,
}

/// Chains remembered per worker at most; the whole set is dropped when it is full.
const REMEMBERED: usize = 4096;

thread_local! {
    static VERIFIED: std::cell::RefCell<Verified> = std::cell::RefCell::default();
}

/// The key of a presented chain: the SHA-256 of its certificates, each prefixed by its
/// length.
fn chain_key(end_entity: &CertificateDer<'_>, intermediates: &[CertificateDer<'_>]) -> [u8; 32] {
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    for c in std::iter::once(end_entity).chain(intermediates) {
        h.update(&(c.len() as u64).to_be_bytes());
        h.update(c.as_ref());
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(h.finish().as_ref());
    key
}

/// When every presented certificate is valid: the latest `notBefore` and the earliest
/// `notAfter`, Unix seconds.
fn valid_span(
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
) -> Option<(u64, u64)> {
    let secs = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    let mut span = (0, u64::MAX);
    for c in std::iter::once(end_entity).chain(intermediates) {
        let info = crate::x509::CertInfo::read(c)?;
        span = (
            span.0.max(secs(info.not_before)),
            span.1.min(secs(info.not_after)),
        );
    }
    Some(span)
}

impl ClientAuth {
    /// The verifier for `settings` over the files [`crate::config::client_auth::load`]
    /// read: every presented chain checked against the CAs and, when given, the CRLs
    /// (the whole chain; an issuer without a CRL is not taken as revoked).
    pub(crate) fn new(
        settings: &ClientAuthSettings,
        files: ClientAuthFiles,
    ) -> Result<ClientAuth, String> {
        let mut roots = rustls::RootCertStore::empty();
        for ca in files.cas {
            roots.add(ca).map_err(|e| {
                format!(
                    "{}: a CA rustls cannot use: {e}",
                    settings.ca_file.display()
                )
            })?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut b = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
        if !files.crls.is_empty() {
            b = b.with_crls(files.crls).allow_unknown_revocation_status();
        }
        if settings.mode == Mode::Optional {
            b = b.allow_unauthenticated();
        }
        let inner = b.build().map_err(|e| format!("tls.client_auth: {e}"))?;
        static MADE: AtomicU64 = AtomicU64::new(1);
        let generation = MADE.fetch_add(1, Ordering::Relaxed);
        Ok(ClientAuth { inner, generation })
    }

    /// Verifies a presented chain, or finds it verified before on this worker and still
    /// within its validity: a service that reconnects pays the chain's signature checks
    /// once per worker, not per handshake (`docs/performance.md`, "Mutual TLS"). The
    /// handshake's own signature (`CertificateVerify`, the proof that the client holds
    /// the key) is checked every time. A reload makes a new `ClientAuth`, whose
    /// remembered chains start empty, so a new bundle or CRL applies at once.
    fn verify(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let key = chain_key(end_entity, intermediates);
        let at = now.as_secs();
        let known = VERIFIED.with_borrow_mut(|v| {
            if v.generation != self.generation {
                v.generation = self.generation;
                v.chains.clear();
            }
            v.chains
                .get(&key)
                .is_some_and(|&(from, to)| from <= at && at <= to)
        });
        if known {
            return Ok(ClientCertVerified::assertion());
        }
        let verdict = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if let Some(span) = valid_span(end_entity, intermediates) {
            VERIFIED.with_borrow_mut(|v| {
                if v.chains.len() >= REMEMBERED {
                    v.chains.clear();
                }
                v.chains.insert(key, span);
            });
        }
        Ok(verdict)
    }
}

/// The verifier the listener's configurations hold: the current [`ClientAuth`], or none
/// (no certificate asked for). A reload swaps it; a handshake in progress keeps the
/// configuration it started with, but asks this one.
#[derive(Debug)]
pub(crate) struct LiveVerifier {
    current: ArcSwapOption<ClientAuth>,
    /// The CAs' names sent to clients. rustls borrows them from the verifier for the
    /// length of a handshake, so each list made is kept for the process's life: a
    /// reload that changes the bundle adds one (a few hundred bytes).
    hints: ArcSwap<&'static [DistinguishedName]>,
}

impl LiveVerifier {
    /// Asks for client certificates as `auth` says from the next handshake on; `None`:
    /// asks for none.
    pub(crate) fn set(&self, auth: Option<ClientAuth>) {
        let hints = auth.as_ref().map(|a| a.inner.root_hint_subjects().to_vec());
        let now: &[DistinguishedName] = **self.hints.load();
        match hints {
            Some(h)
                if !h
                    .iter()
                    .map(|d| d.as_ref())
                    .eq(now.iter().map(|d| d.as_ref())) =>
            {
                self.hints.store(Arc::new(Vec::leak(h)));
            }
            _ => {}
        }
        self.current.store(auth.map(Arc::new));
    }

    /// Whether client certificates are asked for now.
    pub(crate) fn is_on(&self) -> bool {
        self.current.load().is_some()
    }

    /// The verified identity a finished handshake gives its connection, from the chain
    /// its client presented. A resumed session carries the chain of the handshake it
    /// resumes, which no verifier saw since: it is checked again against the bundle and
    /// CRLs in force now (a new CA, a revocation or an expiry since then refuses it), and
    /// a session without one is refused when one is required now. `resumed` is always
    /// true for QUIC, which does not tell; a chain this worker verified is found in its
    /// memory. `Err`: the connection must be closed (counted). Without
    /// `[tls.client_auth]` a connection has no identity, whatever its session had.
    pub(crate) fn identity(
        &self,
        chain: Option<&[CertificateDer<'_>]>,
        resumed: bool,
    ) -> Result<Option<Arc<ClientCert>>, ()> {
        let Some(auth) = self.current.load_full() else {
            return Ok(None);
        };
        let Some((leaf, intermediates)) = chain.and_then(|c| c.split_first()) else {
            if auth.inner.client_auth_mandatory() {
                note_missing();
                return Err(());
            }
            return Ok(None);
        };
        if resumed {
            if let Err(e) = auth.verify(leaf, intermediates, UnixTime::now()) {
                count(reason_of(&e));
                return Err(());
            }
        }
        Ok(ClientCert::of(chain))
    }

    fn with<T>(&self, f: impl FnOnce(&dyn ClientCertVerifier) -> T, none: T) -> T {
        match self.current.load().as_deref() {
            Some(a) => f(&*a.inner),
            None => none,
        }
    }
}

impl Default for LiveVerifier {
    fn default() -> Self {
        let none: &'static [DistinguishedName] = &[];
        LiveVerifier {
            current: ArcSwapOption::empty(),
            hints: ArcSwap::from_pointee(none),
        }
    }
}

impl ClientCertVerifier for LiveVerifier {
    fn offer_client_auth(&self) -> bool {
        self.with(|v| v.offer_client_auth(), false)
    }

    fn client_auth_mandatory(&self) -> bool {
        self.with(|v| v.client_auth_mandatory(), false)
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        **self.hints.load()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let verdict = match self.current.load().as_deref() {
            Some(auth) => auth.verify(end_entity, intermediates, now),
            None => Err(Error::General("no client certificate was asked for".into())),
        };
        if let Err(e) = &verdict {
            count(reason_of(e));
        }
        verdict
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        let none = Err(Error::General("no client certificate was asked for".into()));
        self.with(|v| v.verify_tls12_signature(message, cert, dss), none)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        let none = Err(Error::General("no client certificate was asked for".into()));
        self.with(|v| v.verify_tls13_signature(message, cert, dss), none)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        let all = || {
            rustls::crypto::ring::default_provider()
                .signature_verification_algorithms
                .supported_schemes()
        };
        self.with(|v| v.supported_verify_schemes(), all())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verification_errors_count_under_their_reason() {
        let unknown = Error::InvalidCertificate(CertificateError::UnknownIssuer);
        let revoked = Error::InvalidCertificate(CertificateError::Revoked);
        let expired = Error::InvalidCertificate(CertificateError::Expired);
        let bad = Error::InvalidCertificate(CertificateError::BadEncoding);
        let named: Vec<_> = [unknown, expired, revoked, bad]
            .iter()
            .map(|e| REASONS[reason_of(e)])
            .collect();
        assert_eq!(named, ["unknown_ca", "expired", "revoked", "other"]);
    }

    #[test]
    fn a_verified_chain_is_remembered_until_it_expires_or_the_bundle_changes() {
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let mut params = rcgen::CertificateParams::new(vec!["web.svc.example".into()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2026, 1, 1);
        params.not_after = rcgen::date_time_ymd(2027, 1, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = params.signed_by(&key, &issuer).unwrap();
        let settings = ClientAuthSettings {
            ca_file: "ca.pem".into(),
            mode: Mode::Require,
            crl_files: Vec::new(),
            origin: "test".into(),
        };
        let files = || ClientAuthFiles {
            cas: vec![ca.der().clone()],
            crls: Vec::new(),
        };
        let auth = ClientAuth::new(&settings, files()).unwrap();
        let at = |y, m, d| {
            UnixTime::since_unix_epoch(std::time::Duration::from_secs(
                rcgen::date_time_ymd(y, m, d).unix_timestamp() as u64,
            ))
        };
        let key_of = chain_key(leaf.der(), &[]);
        let remembered = || VERIFIED.with_borrow(|v| v.chains.contains_key(&key_of));
        assert!(auth.verify(leaf.der(), &[], at(2026, 6, 1)).is_ok());
        assert!(remembered());
        assert!(
            auth.verify(leaf.der(), &[], at(2026, 7, 1)).is_ok(),
            "from memory"
        );
        let late = auth.verify(leaf.der(), &[], at(2027, 6, 1));
        assert!(
            matches!(late, Err(Error::InvalidCertificate(_))),
            "expired since: {late:?}"
        );
        let reloaded = ClientAuth::new(&settings, files()).unwrap();
        assert!(reloaded.verify(leaf.der(), &[], at(2026, 6, 1)).is_ok());
        assert_eq!(VERIFIED.with_borrow(|v| v.generation), reloaded.generation);
    }

    #[test]
    fn without_client_auth_nothing_is_asked() {
        let v = LiveVerifier::default();
        assert!(!v.offer_client_auth() && !v.client_auth_mandatory() && !v.is_on());
        assert!(v.root_hint_subjects().is_empty());
    }
}
