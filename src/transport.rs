//! How fulcrum reaches a backend (`docs/tls.md`, "HTTPS and HTTP/2 backends"): TCP, then
//! for an `https://` backend TLS with SNI from the URL's host, verified against the
//! system roots or the pool's `tls_ca_file` (or not at all with `tls_verify = false`),
//! offering by ALPN the HTTP version the pool speaks.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::config::{BackendTransport, Protocol};

/// A backend's way in: TLS or not, and the HTTP version.
#[derive(Debug, Clone, Default)]
pub(crate) struct Transport {
    tls: Option<(Arc<ClientConfig>, ServerName<'static>)>,
    /// HTTP/2 (`protocol = "h2"`).
    pub(crate) h2: bool,
    /// The PROXY header sent first on each connection (`send_proxy_protocol`).
    pub(crate) send_proxy: Option<crate::proxy_protocol::Version>,
}

impl Transport {
    /// How to reach a backend at `host` (`https` when its URL says so) in a pool set
    /// to `settings`.
    pub(crate) fn new(https: bool, host: &str, settings: &BackendTransport) -> Transport {
        let h2 = settings.protocol == Protocol::H2;
        let tls = https.then(|| {
            // An IP address is verified as one and sends no SNI; a name is both.
            let name = ServerName::try_from(host.trim_matches(['[', ']']).to_string())
                .unwrap_or_else(|_| ServerName::try_from("invalid.invalid").expect("a DNS name"));
            (client_config(settings), name)
        });
        Transport {
            tls,
            h2,
            send_proxy: settings.send_proxy,
        }
    }

    /// Plain TCP and HTTP/1.1, connections shared by every client: what the inline
    /// exchange (`proxy::wire`) speaks.
    pub(crate) fn is_plain_http1(&self) -> bool {
        self.tls.is_none() && !self.h2 && self.send_proxy.is_none()
    }

    /// Whether the backend is reached over TLS (`https://`).
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The stream to speak HTTP on, over the connected `tcp`: the TLS handshake done
    /// for an `https://` backend (its failure is a connect failure).
    pub(crate) async fn open(&self, tcp: TcpStream) -> io::Result<Stream> {
        match &self.tls {
            None => Ok(Stream::Plain(tcp)),
            Some((config, name)) => {
                let connector = tokio_rustls::TlsConnector::from(Arc::clone(config));
                let tls = connector.connect(name.clone(), tcp).await?;
                // A server that ignores ALPN would get the HTTP/2 preface over HTTP/1.1.
                if self.h2 && tls.get_ref().1.alpn_protocol() != Some(&b"h2"[..]) {
                    return Err(io::Error::other("the backend did not agree to h2 by ALPN"));
                }
                Ok(Stream::Tls(Box::new(tls)))
            }
        }
    }
}

/// A connection to a backend, plain or TLS.
#[derive(Debug)]
pub(crate) enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The system's trusted roots, read once (`rustls-native-certs`: the OpenSSL store
/// paths, `SSL_CERT_FILE`, `SSL_CERT_DIR`).
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        if found.certs.is_empty() {
            tracing::warn!(errors = ?found.errors, "no system root certificates found: https backends will fail verification unless their pool sets tls_ca_file");
        }
        found.certs
    })
}

/// The client configuration for `settings`, made once per distinct setting (the CA
/// file is read when the first pool with it is made; `tls_ca_file` is fixed until a
/// restart; a client certificate is read again on every reload,
/// [`reread_client_certs`]).
pub(crate) fn client_config(settings: &BackendTransport) -> Arc<ClientConfig> {
    type Key = (Option<PathBuf>, bool, Protocol, Option<(PathBuf, PathBuf)>);
    static MADE: OnceLock<Mutex<HashMap<Key, Arc<ClientConfig>>>> = OnceLock::new();
    let pair = settings.client_pair().map(|c| (c.cert, c.key));
    let key = (
        settings.ca_file.clone(),
        settings.verify,
        settings.protocol,
        pair,
    );
    let mut made = MADE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    Arc::clone(
        made.entry(key)
            .or_insert_with(|| Arc::new(build_client_config(settings))),
    )
}

fn build_client_config(settings: &BackendTransport) -> ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("the ring provider supports TLS 1.2 and 1.3");
    let mut config = if settings.verify {
        let mut roots = rustls::RootCertStore::empty();
        let certs = match &settings.ca_file {
            Some(path) => crate::config::pem::read_ca_file(path).unwrap_or_else(|e| {
                // Checked at start; gone since. Nothing verifies: every handshake fails.
                tracing::error!("{e}");
                Vec::new()
            }),
            None => system_roots().to_vec(),
        };
        let (_, ignored) = roots.add_parsable_certificates(certs);
        if ignored > 0 {
            tracing::warn!(
                ignored,
                "root certificates that could not be parsed were ignored"
            );
        }
        with_client_cert(builder.with_root_certificates(roots), settings)
    } else {
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider)));
        with_client_cert(builder, settings)
    };
    config.alpn_protocols = match settings.protocol {
        Protocol::H2 => vec![b"h2".to_vec()],
        Protocol::Http1 => vec![b"http/1.1".to_vec()],
    };
    config
}

/// The configuration presenting the pool's `tls_client_cert`, if it has one.
fn with_client_cert(
    builder: rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert>,
    settings: &BackendTransport,
) -> ClientConfig {
    match settings.client_pair().and_then(|pair| PoolCert::of(&pair)) {
        Some(cert) => builder.with_client_cert_resolver(cert),
        None => builder.with_no_client_auth(),
    }
}

/// A pool's client certificate (`tls_client_cert` and `tls_client_key`): read when the
/// first pool with it is made, and again on every reload (the configuration checked
/// the pair first), so a renewed certificate at the same paths is presented from the
/// next handshake on.
#[derive(Debug)]
struct PoolCert {
    paths: crate::config::pem::CertPaths,
    current: arc_swap::ArcSwap<rustls::sign::CertifiedKey>,
}

/// Pool client certificates by their paths (chain, key).
type PoolCerts = HashMap<(PathBuf, PathBuf), Arc<PoolCert>>;

/// Every pool client certificate made.
fn pool_certs() -> &'static Mutex<PoolCerts> {
    static MADE: OnceLock<Mutex<PoolCerts>> = OnceLock::new();
    MADE.get_or_init(Default::default)
}

impl PoolCert {
    /// The certificate at `paths`, shared by every configuration that names them;
    /// `None` (logged) when it cannot be read.
    fn of(paths: &crate::config::pem::CertPaths) -> Option<Arc<PoolCert>> {
        let mut made = pool_certs().lock().unwrap_or_else(|e| e.into_inner());
        let key = (paths.cert.clone(), paths.key.clone());
        if let Some(c) = made.get(&key) {
            return Some(Arc::clone(c));
        }
        let (_, certified) = crate::config::pem::read_cert(paths)
            .map_err(|e| tracing::error!("tls_client_cert: {e}"))
            .ok()?;
        let cert = Arc::new(PoolCert {
            paths: paths.clone(),
            current: arc_swap::ArcSwap::new(certified),
        });
        made.insert(key, Arc::clone(&cert));
        Some(cert)
    }
}

impl rustls::client::ResolvesClientCert for PoolCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.current.load_full())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Reads every pool client certificate again (a reload): one that cannot be read now
/// keeps the one in use, with an error logged.
pub(crate) fn reread_client_certs() {
    let made = pool_certs().lock().unwrap_or_else(|e| e.into_inner());
    for cert in made.values() {
        match crate::config::pem::read_cert(&cert.paths) {
            Ok((_, certified)) => cert.current.store(certified),
            Err(e) => tracing::error!("tls_client_cert: {e}; the one read before is kept"),
        }
    }
}

/// The leaf of the client certificate at `paths` as presented now.
pub(crate) fn client_cert_leaf(
    paths: &crate::config::pem::CertPaths,
) -> Option<CertificateDer<'static>> {
    let cert = PoolCert::of(paths)?;
    let leaf = cert.current.load().cert.first()?.clone();
    Some(leaf)
}

/// `tls_verify = false`: any certificate for any name is taken; the handshake's
/// signatures are still checked, so the peer holds the key of the certificate it sent.
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
