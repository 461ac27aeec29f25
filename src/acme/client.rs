//! The HTTP client instant-acme talks to the CA through.
//!
//! Written here rather than taking instant-acme's default (hyper-rustls with the
//! platform verifier): this one trusts what `[tls.acme] ca_file` names, or the system's
//! roots, through the same rustls configuration the `https://` backends use, and brings
//! no second TLS stack. An order is a dozen requests minutes apart, so each request opens
//! its own connection; nothing is pooled.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use hyper_util::rt::TokioIo;
use instant_acme::{BodyWrapper, BytesResponse, Error, HttpClient};
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::net::TcpStream;

/// One request to the CA, connection and answer's body included, takes at most this
/// long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// An answer's body is at most this large (a certificate chain is a few kilobytes).
const MAX_BODY: usize = 1 << 20;

/// Sends each request on a connection of its own.
pub(super) struct Client {
    tls: Arc<ClientConfig>,
}

impl Client {
    /// Trusts `ca_file`'s certificates, else the system's roots.
    pub(super) fn new(ca_file: Option<std::path::PathBuf>) -> Client {
        let settings = crate::config::BackendTransport {
            ca_file,
            ..Default::default()
        };
        Client {
            tls: crate::transport::client_config(&settings),
        }
    }
}

fn other(e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Other(Box::new(e))
}

impl HttpClient for Client {
    fn request(
        &self,
        req: Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, Error>> + Send>> {
        let tls = Arc::clone(&self.tls);
        Box::pin(async move {
            match tokio::time::timeout(REQUEST_TIMEOUT, send(tls, req)).await {
                Ok(answer) => answer,
                Err(_) => Err(Error::Str("the ACME CA did not answer within 30 s")),
            }
        })
    }
}

/// Connects to the request's host (TLS for `https://`), sends it in origin form with a
/// `Host` field, and returns the answer with its body read (so that the timeout and
/// the size limit cover it too).
async fn send(
    tls: Arc<ClientConfig>,
    req: Request<BodyWrapper<Bytes>>,
) -> Result<BytesResponse, Error> {
    let (mut parts, body) = req.into_parts();
    let https = parts.uri.scheme() == Some(&http::uri::Scheme::HTTPS);
    let Some(authority) = parts.uri.authority().cloned() else {
        return Err(Error::Str("an ACME URL without a host"));
    };
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(other)?;
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = target.parse().map_err(other)?;
    let value = http::HeaderValue::from_str(authority.as_str()).map_err(other)?;
    parts.headers.insert(http::header::HOST, value);
    let req = Request::from_parts(parts, body);
    if https {
        let name = ServerName::try_from(host).map_err(other)?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .map_err(other)?;
        exchange(stream, req).await
    } else {
        exchange(tcp, req).await
    }
}

async fn exchange<S>(io: S, req: Request<BodyWrapper<Bytes>>) -> Result<BytesResponse, Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(other)?;
    // The connection runs until the answer's body has been read, then ends with it.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let answer = sender.send_request(req).await.map_err(other)?;
    let (parts, body) = answer.into_parts();
    use http_body_util::BodyExt as _;
    let body = http_body_util::Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(Error::Other)?
        .to_bytes();
    Ok(BytesResponse {
        parts,
        body: Box::new(body),
    })
}
