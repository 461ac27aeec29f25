//! TLS termination (`docs/tls.md`): the certificates, chosen by the client's SNI name,
//! and the rustls server configuration the HTTPS listener hands each handshake.
//!
//! The configuration is swapped whole on reload ([`Tls::reload`]): a handshake takes the
//! one current when it starts, so new handshakes get new certificates and open
//! connections keep theirs. The session-ticket key and the session cache outlive a
//! reload, so a client resumes across it (nginx and HAProxy keep theirs the same way).
//! Client certificates (`[tls.client_auth]`) are asked for by one verifier
//! (`mtls::LiveVerifier`) that every configuration, TCP's and QUIC's, holds, and that a
//! reload swaps the inside of.

use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use rustls::pki_types::CertificateDer;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ProducesTickets, ResolvesServerCert, StoresServerSessions};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use crate::config::client_auth;
use crate::config::pem::read_cert;
use crate::config::tls::{CertPaths, TlsSettings};
use crate::mtls::{ClientAuth, LiveVerifier};
use crate::obtained::Obtained;
use crate::x509::CertInfo;

/// Sessions kept for resumption by id (TLS 1.2 clients without tickets), as nginx's
/// `ssl_session_cache` holds them; tickets need no memory here.
const SESSION_CACHE: usize = 4096;

/// The ALPN protocols offered, preferred first: HTTP/2, then HTTP/1.1.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The ALPN protocol of `tls-alpn-01` (RFC 8737): a handshake that offers it is the CA
/// checking a name, and gets the challenge certificate.
pub(crate) const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// One certificate and the DNS names it is for (lowercase; `*.` for a wildcard).
#[derive(Debug)]
struct Served {
    names: Vec<String>,
    key: Arc<CertifiedKey>,
}

/// One certificate as `GET /admin/certificates` lists it.
#[derive(Debug, Clone, serde::Serialize, PartialEq)]
pub(crate) struct CertView {
    /// The DNS names it is for (a client CA: its subject; a pool's client certificate:
    /// its DNS names, else its subject).
    pub(crate) names: Vec<String>,
    /// Its expiry, RFC 3339.
    pub(crate) not_after: String,
    /// Its issuer's common name.
    pub(crate) issuer: String,
    /// `file` (`[[tls.certs]]`, `--tls-cert`), `acme`, `client_ca` (`[tls.client_auth]`)
    /// or `pool:NAME` (a pool's `tls_client_cert`).
    pub(crate) source: String,
    /// When it is renewed, RFC 3339 (ACME only).
    pub(crate) renew_at: Option<String>,
}

fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

impl CertView {
    fn new(names: &[String], info: &CertInfo, source: &str) -> CertView {
        CertView {
            names: names.to_vec(),
            not_after: rfc3339(info.not_after),
            issuer: info.issuer.clone(),
            source: source.to_string(),
            renew_at: None,
        }
    }

    /// The DER certificate `der` as listed under `source`, named by its DNS names, else
    /// by its subject; `None` when it does not parse.
    pub(crate) fn of_der(der: &[u8], source: &str) -> Option<CertView> {
        let info = CertInfo::read(der)?;
        let names = crate::x509::Names::read(der)?;
        let shown = match names.dns.is_empty() {
            true => vec![names.subject],
            false => names.dns,
        };
        Some(CertView::new(&shown, &info, source))
    }
}

/// Chooses the certificate for a handshake: the first file certificate whose names hold
/// the SNI name exactly, else the first with a wildcard for it (`*.example.com` covers
/// one label), else ACME's for its names (none until it is issued: the handshake fails),
/// else the first file certificate, else ACME's (the default, also for a client that
/// sends no name). A handshake offering only `acme-tls/1` gets the challenge
/// certificate for its name, or nothing.
#[derive(Debug)]
struct BySni {
    certs: Vec<Served>,
    obtained: Option<Arc<Obtained>>,
}

impl BySni {
    fn find(&self, name: &str) -> Option<&Served> {
        let name = name.to_ascii_lowercase();
        let exact = self.certs.iter().find(|c| c.names.contains(&name));
        exact.or_else(|| {
            let (_, parent) = name.split_once('.')?;
            let wildcard = format!("*.{parent}");
            self.certs.iter().find(|c| c.names.contains(&wildcard))
        })
    }
}

/// The certificates in force, read at each handshake (QUIC's configuration is made
/// once, and a reload swaps what this reads).
#[derive(Debug)]
struct LiveSni(Arc<ArcSwap<BySni>>);

impl ResolvesServerCert for LiveSni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.load().resolve(hello)
    }
}

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name();
        let Some(obtained) = &self.obtained else {
            let chosen = name.and_then(|n| self.find(n));
            return chosen.or(self.certs.first()).map(|c| Arc::clone(&c.key));
        };
        if hello
            .alpn()
            .is_some_and(|mut p| p.any(|p| p == ACME_TLS_ALPN))
        {
            return name.and_then(|n| obtained.alpn_answer(n));
        }
        if let Some(c) = name.and_then(|n| self.find(n)) {
            return Some(Arc::clone(&c.key));
        }
        let issued = || obtained.issued().map(|i| Arc::clone(&i.key));
        match name {
            Some(n) if obtained.covers(&n.to_ascii_lowercase()) => issued(),
            _ => self
                .certs
                .first()
                .map(|c| Arc::clone(&c.key))
                .or_else(issued),
        }
    }
}

/// What the HTTPS listener serves, swapped whole on reload.
pub(crate) struct Tls {
    config: ArcSwap<ServerConfig>,
    /// The resolver inside `config`: for the ACME check before a handshake, and for
    /// QUIC's configuration, which reads it at each handshake ([`LiveSni`]).
    files: Arc<ArcSwap<BySni>>,
    /// With ACME: `config` without client certificates, for `acme-tls/1` handshakes.
    acme_config: ArcSwapOption<ServerConfig>,
    /// The file certificates of `config` and the client CAs, as listed.
    listed: ArcSwap<Vec<CertView>>,
    ticketer: Arc<dyn ProducesTickets>,
    sessions: Arc<dyn StoresServerSessions>,
    obtained: Option<Arc<Obtained>>,
    /// `[tls.client_auth]`'s verifier, asked by every handshake, TCP or QUIC.
    verifier: Arc<LiveVerifier>,
}

/// A configuration read by [`Tls::prepare`], for [`Tls::install`].
pub(crate) struct Prepared {
    config: Arc<ServerConfig>,
    /// With ACME: the same without client certificates, for `acme-tls/1` handshakes.
    acme_config: Option<Arc<ServerConfig>>,
    sni: Arc<BySni>,
    listed: Vec<CertView>,
    client_auth: Option<ClientAuth>,
    /// The client CA bundle, as `GET /admin/certificates` lists it.
    client_cas: Vec<CertView>,
}

/// What one [`Tls`] keeps across reloads: its session keys, ACME's certificate and the
/// client certificate verifier.
struct Kept<'a> {
    obtained: &'a Option<Arc<Obtained>>,
    ticketer: &'a Arc<dyn ProducesTickets>,
    sessions: &'a Arc<dyn StoresServerSessions>,
    verifier: &'a Arc<LiveVerifier>,
}

/// The configuration for `settings`' certificates (and ACME's), with its resolver and
/// list, and its client certificate verifier.
fn prepare(settings: &TlsSettings, kept: Kept<'_>) -> Result<Prepared, String> {
    let (served, listed) = read_certs(&settings.certs)?;
    let (client_auth, client_cas) = match &settings.client_auth {
        Some(a) => {
            let files = client_auth::load(a).map_err(|e| format!("{}: {e}", a.origin))?;
            let cas = ca_views(&files.cas);
            (Some(ClientAuth::new(a, files)?), cas)
        }
        None => (None, Vec::new()),
    };
    let sni = Arc::new(BySni {
        certs: served,
        obtained: kept.obtained.clone(),
    });
    let verifier = Arc::clone(kept.verifier) as Arc<dyn ClientCertVerifier>;
    let config = server_config(Arc::clone(&sni), &kept, verifier)?;
    let acme_config = match kept.obtained {
        Some(_) => Some(Arc::new(acme_check_config(Arc::clone(&sni))?)),
        None => None,
    };
    Ok(Prepared {
        config: Arc::new(config),
        acme_config,
        sni,
        listed,
        client_auth,
        client_cas,
    })
}

/// The client CA bundle's certificates as listed: each CA by its subject.
fn ca_views(cas: &[CertificateDer<'static>]) -> Vec<CertView> {
    cas.iter()
        .filter_map(|der| {
            let info = CertInfo::read(der)?;
            let subject = crate::x509::Names::read(der)?.subject;
            Some(CertView::new(&[subject], &info, "client_ca"))
        })
        .collect()
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// Loads `settings`' certificates (the default first), beside ACME's certificate
    /// when there is one, and its client certificate verifier.
    pub(crate) fn new(
        settings: &TlsSettings,
        obtained: Option<Arc<Obtained>>,
    ) -> Result<Tls, String> {
        let ticketer = rustls::crypto::ring::Ticketer::new()
            .map_err(|e| format!("cannot make a session-ticket key: {e}"))?;
        let sessions: Arc<dyn StoresServerSessions> =
            rustls::server::ServerSessionMemoryCache::new(SESSION_CACHE);
        let verifier = Arc::new(LiveVerifier::default());
        let kept = Kept {
            obtained: &obtained,
            ticketer: &ticketer,
            sessions: &sessions,
            verifier: &verifier,
        };
        let first = prepare(settings, kept)?;
        let tls = Tls {
            config: ArcSwap::new(Arc::clone(&first.config)),
            acme_config: ArcSwapOption::empty(),
            files: Arc::new(ArcSwap::new(Arc::clone(&first.sni))),
            listed: ArcSwap::default(),
            ticketer,
            sessions,
            obtained,
            verifier,
        };
        tls.install(first);
        Ok(tls)
    }

    /// Reads `settings`' certificates and client CAs again into a configuration for
    /// [`Self::install`]; the current one stays in force until then, and on an error.
    pub(crate) fn prepare(&self, settings: &TlsSettings) -> Result<Prepared, String> {
        let kept = Kept {
            obtained: &self.obtained,
            ticketer: &self.ticketer,
            sessions: &self.sessions,
            verifier: &self.verifier,
        };
        prepare(settings, kept)
    }

    /// Serves `prepared` from the next handshake on; open connections keep theirs.
    pub(crate) fn install(&self, prepared: Prepared) {
        self.verifier.set(prepared.client_auth);
        self.config.store(prepared.config);
        self.acme_config.store(prepared.acme_config);
        self.files.store(prepared.sni);
        let mut listed = prepared.listed;
        listed.extend(prepared.client_cas);
        self.listed.store(Arc::new(listed));
    }

    /// Whether handshakes ask for client certificates.
    pub(crate) fn asks_client_certs(&self) -> bool {
        self.verifier.is_on()
    }

    /// The client certificate verifier, for the identity of a finished handshake.
    pub(crate) fn client_verifier(&self) -> Arc<LiveVerifier> {
        Arc::clone(&self.verifier)
    }

    /// The TLS of QUIC (HTTP/3): TLS 1.3 only, ALPN `h3`, no early data (0-RTT off),
    /// over the same certificates, read at each handshake so a reload reaches it. Its
    /// tickets and session cache are its own: a ticket from a TCP connection does not
    /// resume a QUIC one.
    pub(crate) fn quic_crypto(
        &self,
    ) -> Result<Arc<quinn::crypto::rustls::QuicServerConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| format!("QUIC: {e}"))?
            .with_client_cert_verifier(Arc::clone(&self.verifier) as Arc<dyn ClientCertVerifier>)
            .with_cert_resolver(Arc::new(LiveSni(Arc::clone(&self.files))));
        config.alpn_protocols = vec![b"h3".to_vec()];
        config.ticketer = rustls::crypto::ring::Ticketer::new()
            .map_err(|e| format!("cannot make a session-ticket key: {e}"))?;
        config.session_storage = rustls::server::ServerSessionMemoryCache::new(SESSION_CACHE);
        quinn::crypto::rustls::QuicServerConfig::try_from(config)
            .map(Arc::new)
            .map_err(|e| format!("QUIC: {e}"))
    }

    /// Every certificate served: the files', then ACME's once issued.
    pub(crate) fn certificates(&self) -> Vec<CertView> {
        let mut out = Vec::clone(&self.listed.load());
        if let Some(issued) = self.obtained.as_ref().and_then(|o| o.issued()) {
            let mut view = CertView::new(&issued.names, &issued.info, "acme");
            view.renew_at = Some(rfc3339(issued.renew_at));
            out.push(view);
        }
        out
    }

    /// The acceptor for the next handshake.
    pub(crate) fn acceptor(&self) -> Acceptor {
        Acceptor {
            config: self.config.load_full(),
            verifier: Arc::clone(&self.verifier),
            acme: self.obtained.as_ref().map(|o| AcmeParts {
                obtained: Arc::clone(o),
                files: self.files.load_full(),
                plain: self.acme_config.load_full(),
            }),
        }
    }
}

/// The file certificates, ready to serve and as listed.
fn read_certs(certs: &[CertPaths]) -> Result<(Vec<Served>, Vec<CertView>), String> {
    let mut served = Vec::with_capacity(certs.len());
    let mut listed = Vec::with_capacity(certs.len());
    for c in certs {
        let (names, key) = read_cert(c).map_err(|e| format!("{}: {e}", c.origin))?;
        match key.end_entity_cert().ok().and_then(|d| CertInfo::read(d)) {
            Some(info) => listed.push(CertView::new(&names, &info, "file")),
            // rustls took it; only its dates could not be read for the list.
            None => {
                tracing::warn!(certificate = %c.cert.display(), "its validity could not be read: left out of /admin/certificates")
            }
        }
        served.push(Served { names, key });
    }
    Ok((served, listed))
}

/// A fatal `unrecognized_name` alert (RFC 8446 §6.2), as a TLS 1.2 record: what a
/// handshake for an ACME name gets before its certificate is issued.
const UNRECOGNIZED_NAME: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x70];

/// One handshake's configuration.
pub(crate) struct Acceptor {
    config: Arc<ServerConfig>,
    /// The client certificate verifier, for the identity once the handshake is done.
    verifier: Arc<LiveVerifier>,
    acme: Option<AcmeParts>,
}

/// What a handshake needs with ACME on.
struct AcmeParts {
    /// ACME's certificate.
    obtained: Arc<Obtained>,
    /// The file certificates, which win for their names.
    files: Arc<BySni>,
    /// The configuration without client certificates, for the CA's `acme-tls/1` check.
    plain: Option<Arc<ServerConfig>>,
}

impl Acceptor {
    /// The client certificate verifier ([`LiveVerifier::identity`]).
    pub(crate) fn verifier(&self) -> Arc<LiveVerifier> {
        Arc::clone(&self.verifier)
    }

    /// Runs the handshake on `stream`.
    ///
    /// With ACME, the ClientHello is read first: a name ACME orders but has no
    /// certificate for yet (and no file certificate covers) gets `unrecognized_name`
    /// (rustls's resolver can only refuse with `access_denied`), as nginx's
    /// `ssl_reject_handshake` answers.
    pub(crate) async fn accept(
        self,
        stream: tokio::net::TcpStream,
    ) -> std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
        let Some(AcmeParts {
            obtained,
            files,
            plain,
        }) = self.acme
        else {
            return tokio_rustls::TlsAcceptor::from(self.config)
                .accept(stream)
                .await;
        };
        let (accepted, mut stream) = read_hello(stream).await?;
        let hello = accepted.client_hello();
        let acme = hello
            .alpn()
            .is_some_and(|mut p| p.any(|p| p == ACME_TLS_ALPN));
        // A file certificate wins for its names, issued or not.
        let waiting = hello.server_name().is_some_and(|n| {
            obtained.covers(&n.to_ascii_lowercase())
                && obtained.issued().is_none()
                && files.find(n).is_none()
        });
        if waiting && !acme {
            use tokio::io::AsyncWriteExt as _;
            let _ = stream.write_all(&UNRECOGNIZED_NAME).await;
            return Err(std::io::Error::other(
                "no certificate issued yet for the name",
            ));
        }
        // The CA's check is never asked for a client certificate.
        let config = match (acme, plain) {
            (true, Some(plain)) => plain,
            _ => self.config,
        };
        tokio_rustls::StartHandshake::from_parts(accepted, stream)
            .into_stream(config)
            .await
    }
}

/// Reads a ClientHello from `stream` (a bad one is answered with rustls's alert).
async fn read_hello(
    mut stream: tokio::net::TcpStream,
) -> std::io::Result<(rustls::server::Accepted, tokio::net::TcpStream)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut acceptor = rustls::server::Acceptor::default();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            if acceptor.read_tls(&mut rest)? == 0 {
                return Err(std::io::Error::other("the ClientHello does not fit"));
            }
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => return Ok((accepted, stream)),
            Ok(None) => {}
            Err((e, mut alert)) => {
                let mut out = Vec::new();
                let _ = alert.write(&mut out);
                let _ = stream.write_all(&out).await;
                return Err(std::io::Error::other(e));
            }
        }
    }
}

/// TLS 1.3 and 1.2 on the `ring` provider, the certificates by SNI, ALPN h2 and
/// http/1.1 (and `acme-tls/1` with ACME), tickets and the session cache.
fn server_config(
    sni: Arc<BySni>,
    kept: &Kept<'_>,
    verifier: Arc<dyn ClientCertVerifier>,
) -> Result<ServerConfig, String> {
    let acme = sni.obtained.is_some();
    let mut config = config_builder()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(sni);
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    if acme {
        config.alpn_protocols.push(ACME_TLS_ALPN.to_vec());
    }
    config.ticketer = Arc::clone(kept.ticketer);
    config.session_storage = Arc::clone(kept.sessions);
    Ok(config)
}

/// The configuration of the ACME CA's `tls-alpn-01` check: `acme-tls/1` alone (a client
/// offering it with other protocols gets that one or none, never HTTP without its client
/// certificate), no client certificate asked, no session to resume later.
fn acme_check_config(sni: Arc<BySni>) -> Result<ServerConfig, String> {
    let mut config = config_builder()?
        .with_no_client_auth()
        .with_cert_resolver(sni);
    config.alpn_protocols = vec![ACME_TLS_ALPN.to_vec()];
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    Ok(config)
}

/// TLS 1.3 and 1.2 on `ring`.
fn config_builder() -> Result<rustls::ConfigBuilder<ServerConfig, rustls::WantsVerifier>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(names: &[&str]) -> Served {
        let cert = rcgen::generate_simple_self_signed(
            names.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
        .unwrap();
        let key =
            rustls_pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let signer = rustls::crypto::ring::sign::any_supported_type(&key).unwrap();
        Served {
            names: names.iter().map(|s| s.to_string()).collect(),
            key: Arc::new(CertifiedKey::new(vec![cert.cert.der().clone()], signer)),
        }
    }

    #[test]
    fn exact_names_first_then_wildcards_then_nothing() {
        let sni = BySni {
            certs: vec![
                served(&["default.test"]),
                served(&["*.example.test"]),
                served(&["api.example.test"]),
            ],
            obtained: None,
        };
        let which = |n: &str| sni.find(n).map(|c| c.names[0].clone()).unwrap_or_default();
        assert_eq!(which("API.example.test"), "api.example.test");
        assert_eq!(which("www.example.test"), "*.example.test");
        assert_eq!(which("a.b.example.test"), "", "a wildcard covers one label");
        assert_eq!(which("example.test"), "");
        assert_eq!(which("default.test"), "default.test");
    }
}
