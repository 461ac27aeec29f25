//! TLS test support: a private CA with leaf certificates made at test time, a client
//! that checks the chain but not the names, and HTTP/1.1 over a TLS connection.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::Fulcrum;

/// A private CA and the leaf certificates it signs, written as PEM files in a
/// directory of the test's own.
pub struct Pki {
    pub dir: PathBuf,
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
        std::fs::write(dir.join("ca.pem"), cert.pem()).unwrap();
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

    /// The CA's certificate, for a client that trusts it.
    pub fn ca_der(&self) -> CertificateDer<'static> {
        self.ca_der.clone()
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

/// An HTTP/1.1 client connection over TLS to `addr` (SNI `name`), its driver spawned.
pub async fn h1_over_tls(
    pki: &Pki,
    addr: std::net::SocketAddr,
    name: &str,
) -> hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>> {
    let s = connect(pki, addr, name, &[b"http/1.1"]).await;
    let (h1, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    h1
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
    // The previous exchange's end may not have reached the connection's task yet.
    sender
        .ready()
        .await
        .expect("the connection takes another request");
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

/// A backend of its own for the HTTP/2 and TLS tests: hyper's server, HTTP/1.1 and
/// HTTP/2 (by ALPN over TLS, by the preface in the clear). Paths:
/// - `/sleep/MS`: answers after MS milliseconds;
/// - `/stream/N`: N data frames, then the trailers `grpc-status: 0`, `grpc-message: ok`;
/// - `/echo`: the request body back, and its trailers as the response's, plus
///   `grpc-status: 0`;
/// - `/test.Echo/Unary`, `/test.Echo/Stream`, `/test.Echo/Fail`: a gRPC service over
///   raw bytes (the message back; three copies of it; status 5 `nope`);
/// - anything else: 200 with body NAME.
///
/// Every answer has `x-backend: NAME`, `x-version` (`HTTP/1.1` or `HTTP/2.0`) and
/// `x-connections` (connections that carried a request other than `/health` so far).
pub struct H2Backend {
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for H2Backend {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl H2Backend {
    /// In the clear (h2c prior knowledge or HTTP/1.1).
    pub fn plain(name: &'static str) -> H2Backend {
        Self::start(name, None)
    }

    /// Over TLS with the leaf `file` of `pki` (made for `names`), offering h2 and
    /// http/1.1 by ALPN.
    pub fn tls(name: &'static str, pki: &Pki, file: &str, names: &[&str]) -> H2Backend {
        Self::tls_offering(name, pki, file, names, &[b"h2", b"http/1.1"])
    }

    /// As [`Self::tls`], offering `alpn` only (none: the server ignores ALPN).
    pub fn tls_offering(
        name: &'static str,
        pki: &Pki,
        file: &str,
        names: &[&str],
        alpn: &[&[u8]],
    ) -> H2Backend {
        pki.leaf(file, names);
        let chain = CertificateDer::pem_file_iter(pki.path(&format!("{file}.pem")))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(pki.path(&format!("{file}.key")))
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Self::start(
            name,
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
        )
    }

    fn start(name: &'static str, tls: Option<tokio_rustls::TlsAcceptor>) -> H2Backend {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
                loop {
                    let (tcp, _) = tokio::select! {
                        a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                        _ = &mut stopped => break,
                    };
                    let (accepted, tls) = (accepted.clone(), tls.clone());
                    let counted = Arc::new(std::sync::atomic::AtomicBool::new(false));
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req| {
                            // Connections that carried traffic (health probes do not count).
                            use std::sync::atomic::Ordering::SeqCst;
                            if req.uri().path() != "/health" && !counted.swap(true, SeqCst) {
                                accepted.fetch_add(1, SeqCst);
                            }
                            answer(name, accepted.load(SeqCst), req)
                        });
                        let builder = hyper_util::server::conn::auto::Builder::new(
                            hyper_util::rt::TokioExecutor::new(),
                        );
                        let _ = match tls {
                            Some(acceptor) => match acceptor.accept(tcp).await {
                                Ok(s) => builder.serve_connection(TokioIo::new(s), svc).await,
                                Err(_) => return,
                            },
                            None => builder.serve_connection(TokioIo::new(tcp), svc).await,
                        };
                    });
                }
            });
        });
        H2Backend {
            addr,
            stop: Some(stop),
        }
    }
}

type Boxed = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

async fn answer(
    name: &'static str,
    connections: u64,
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<Boxed>, std::convert::Infallible> {
    use hyper::body::Frame;
    let version = format!("{:?}", req.version());
    let path = req.uri().path().to_string();
    if let Some(method) = path.strip_prefix("/test.Echo/") {
        return Ok(grpc_answer(name, method.to_string(), req).await);
    }
    if let Some(ms) = path.strip_prefix("/sleep/") {
        tokio::time::sleep(std::time::Duration::from_millis(ms.parse().unwrap_or(0))).await;
    }
    let body: Boxed = if let Some(n) = path.strip_prefix("/stream/") {
        let n: usize = n.parse().unwrap_or(1);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, hyper::Error>>(4);
        tokio::spawn(async move {
            for i in 0..n {
                let _ = tx
                    .send(Ok(Frame::data(Bytes::from(format!("chunk-{i}\n")))))
                    .await;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            let mut t = http::HeaderMap::new();
            t.insert("grpc-status", "0".parse().unwrap());
            t.insert("grpc-message", "ok".parse().unwrap());
            let _ = tx.send(Ok(Frame::trailers(t))).await;
        });
        BodyExt::boxed(http_body_util::StreamBody::new(tokio_stream_from(rx)))
    } else if path == "/echo" {
        let collected = req.into_body().collect().await;
        let (data, trailers) = match collected {
            Ok(c) => {
                let t = c.trailers().cloned();
                (c.to_bytes(), t)
            }
            Err(_) => (Bytes::new(), None),
        };
        let mut t = trailers.unwrap_or_default();
        t.insert("grpc-status", "0".parse().unwrap());
        let frames = vec![
            Ok::<_, hyper::Error>(Frame::data(data)),
            Ok(Frame::trailers(t)),
        ];
        BodyExt::boxed(http_body_util::StreamBody::new(futures_util::stream::iter(
            frames,
        )))
    } else {
        BodyExt::boxed(http_body_util::Full::new(Bytes::from(name)).map_err(|e| match e {}))
    };
    let mut resp = http::Response::new(body);
    let h = resp.headers_mut();
    h.insert("x-backend", name.parse().unwrap());
    h.insert("x-version", version.parse().unwrap());
    h.insert("x-connections", connections.to_string().parse().unwrap());
    // Its own services, which must never reach a client of fulcrum's.
    h.insert("alt-svc", "h3=\":18463\"; ma=60".parse().unwrap());
    Ok(resp)
}

/// The frames a channel receives, as a stream.
fn tokio_stream_from<T>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// The gRPC length-prefixed messages of `body` (RFC: 1 byte flag, 4 bytes length).
pub fn grpc_messages(mut body: &[u8]) -> Vec<Bytes> {
    let mut out = Vec::new();
    while body.len() >= 5 {
        let n = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        if body.len() < 5 + n {
            break;
        }
        out.push(Bytes::copy_from_slice(&body[5..5 + n]));
        body = &body[5 + n..];
    }
    out
}

fn grpc_frame(m: &[u8]) -> Bytes {
    let mut v = vec![0u8];
    v.extend((m.len() as u32).to_be_bytes());
    v.extend_from_slice(m);
    Bytes::from(v)
}

/// A gRPC method of the test service: `Unary` echoes its message, `Stream` answers it
/// three times, `Fail` answers status 5.
async fn grpc_answer(
    name: &'static str,
    method: String,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<Boxed> {
    use hyper::body::Frame;
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let messages = grpc_messages(&body);
    let first = messages.first().cloned().unwrap_or_default();
    let (replies, status, message) = match method.as_str() {
        "Unary" => (vec![first], "0", "ok"),
        "Stream" => (vec![first.clone(), first.clone(), first], "0", "ok"),
        _ => (Vec::new(), "5", "nope"),
    };
    let mut frames: Vec<Result<Frame<Bytes>, hyper::Error>> = replies
        .iter()
        .map(|m| Ok(Frame::data(grpc_frame(m))))
        .collect();
    let mut t = http::HeaderMap::new();
    t.insert("grpc-status", status.parse().unwrap());
    t.insert("grpc-message", message.parse().unwrap());
    frames.push(Ok(Frame::trailers(t)));
    let mut resp = http::Response::new(BodyExt::boxed(http_body_util::StreamBody::new(
        futures_util::stream::iter(frames),
    )));
    let h = resp.headers_mut();
    h.insert("content-type", "application/grpc".parse().unwrap());
    h.insert("x-backend", name.parse().unwrap());
    resp
}
