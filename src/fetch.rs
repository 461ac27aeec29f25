//! One HTTP/1.1 request on a connection of its own, for what fulcrum fetches for itself
//! (an ACME CA's directory and orders, a route's JWK set): TLS for `https://` through
//! the rustls configuration the `https://` backends use — the system's roots or a
//! configured CA file — so no second TLS stack comes in. Such requests are minutes
//! apart, so nothing is pooled; the answer's body is read whole, within a size limit.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::net::TcpStream;

/// The error of a body sent.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Connects to the request's host (TLS for `https://`), sends it in origin form with a
/// `Host` field, and returns the answer with its body read (at most `max_body` bytes).
/// The caller bounds the time.
pub(crate) async fn send<B>(
    tls: Arc<ClientConfig>,
    req: Request<B>,
    max_body: usize,
) -> Result<Response<Bytes>, String>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = req.into_parts();
    let https = parts.uri.scheme() == Some(&http::uri::Scheme::HTTPS);
    let authority = parts
        .uri
        .authority()
        .cloned()
        .ok_or("a URL without a host")?;
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("connecting to {authority}: {e}"))?;
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = target.parse().map_err(|e| format!("{e}"))?;
    let value = http::HeaderValue::from_str(authority.as_str()).map_err(|e| format!("{e}"))?;
    parts.headers.insert(http::header::HOST, value);
    let req = Request::from_parts(parts, body);
    if https {
        let name = ServerName::try_from(host.to_string()).map_err(|e| format!("{e}"))?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {authority}: {e}"))?;
        exchange(stream, req, max_body).await
    } else {
        exchange(tcp, req, max_body).await
    }
}

async fn exchange<S, B>(io: S, req: Request<B>, max_body: usize) -> Result<Response<Bytes>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("{e}"))?;
    // The connection runs until the answer's body has been read, then ends with it.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let answer = sender.send_request(req).await.map_err(|e| format!("{e}"))?;
    let (parts, body) = answer.into_parts();
    use http_body_util::BodyExt as _;
    let body = http_body_util::Limited::new(body, max_body)
        .collect()
        .await
        .map_err(|e| format!("the answer's body: {e}"))?
        .to_bytes();
    Ok(Response::from_parts(parts, body))
}
