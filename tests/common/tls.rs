//! TLS test support: a private CA with leaf certificates made at test time, a client
//! that checks the chain but not the names, and HTTP/1.1 over a TLS connection.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::Fulcrum;

/// A private CA and the leaf certificates it signs, written as PEM files in a
/// directory of the test's own.
pub struct Pki {
    dir: PathBuf,
    ca: rcgen::Issuer<'static, rcgen::KeyPair>,
    ca_der: CertificateDer<'static>,
}

impl Pki {
    pub fn new(tag: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("fulcrum-tls-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "fulcrum test CA");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Pki {
            dir,
            ca_der: cert.der().clone(),
            ca: rcgen::Issuer::new(params, key),
        }
    }

    /// A leaf for `names`, written to `FILE.pem` and `FILE.key`; returns its DER.
    pub fn leaf(&self, file: &str, names: &[&str]) -> CertificateDer<'static> {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &self.ca)
            .unwrap();
        std::fs::write(self.path(&format!("{file}.pem")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{file}.key")), key.serialize_pem()).unwrap();
        cert.der().clone()
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    pub fn arg(&self, file: &str) -> String {
        self.path(file).to_str().unwrap().to_string()
    }

    /// A client that offers `alpn` and takes whatever certificate it is given (signed
    /// by this CA, checked in [`AnyName`]), whatever its names: the tests compare the
    /// certificate itself, including the default one served for an unknown name.
    pub fn client(&self, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyName {
                provider,
                ca: self.ca_der.clone(),
            }))
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }
}

/// Verifies the handshake's signatures and that the chain ends at the test CA, but not
/// the names.
#[derive(Debug)]
struct AnyName {
    provider: Arc<rustls::crypto::CryptoProvider>,
    ca: CertificateDer<'static>,
}

impl rustls::client::danger::ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _name: &ServerName<'_>,
        _ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let anchor = webpki::anchor_from_trusted_cert(&self.ca)
            .map_err(|e| rustls::Error::General(format!("{e:?}")))?;
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|e| rustls::Error::General(format!("{e:?}")))?;
        cert.verify_for_usage(
            self.provider.signature_verification_algorithms.all,
            &[anchor],
            intermediates,
            now,
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )
        .map_err(|e| rustls::Error::General(format!("not signed by the test CA: {e:?}")))?;
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
            &self.provider.signature_verification_algorithms,
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
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The HTTPS listener's address, from the start-up log.
pub fn https_addr(f: &Fulcrum) -> std::net::SocketAddr {
    let log = f.log();
    let at = log.find("https listening on ").expect("an https listener") + 19;
    let rest = &log[at..];
    let end = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
    rest[..end].parse().expect("address")
}

/// A TLS connection to `addr` for SNI `name`.
pub async fn connect(
    pki: &Pki,
    addr: std::net::SocketAddr,
    name: &str,
    alpn: &[&[u8]],
) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from(name.to_string()).unwrap();
    pki.client(alpn)
        .connect(name, tcp)
        .await
        .expect("handshake")
}

pub fn leaf_of(s: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    s.get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// One GET over an HTTP/1.1 connection already handshaken; returns status, backend,
/// the `X-Forwarded-Proto` the backend saw.
pub async fn get_h1(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    host: &str,
    path: &str,
) -> (u16, String, String) {
    let req = http::Request::get(path)
        .header("host", host)
        .body(Empty::new())
        .unwrap();
    let resp = sender.send_request(req).await.expect("response");
    let (parts, body) = resp.into_parts();
    let _ = body.collect().await;
    let h = |n: &str| {
        parts
            .headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    (parts.status.as_u16(), h("x-backend"), h("x-seen-proto"))
}

pub async fn h1(s: TlsStream<TcpStream>) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}
