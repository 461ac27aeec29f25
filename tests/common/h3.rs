//! An HTTP/3 client for the tests: quinn and h3, trusting a test CA.

use std::sync::Arc;

use bytes::{Buf as _, Bytes};
use rustls::pki_types::CertificateDer;

pub type Sender = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// An HTTP/3 connection to `addr` for `name`, trusting `ca`.
pub async fn h3_client(
    addr: std::net::SocketAddr,
    name: &str,
    ca: &CertificateDer<'static>,
) -> Sender {
    h3_connection(addr, name, ca).await.0
}

/// An HTTP/3 connection and its QUIC connection (to see how it was closed).
pub async fn h3_connection(
    addr: std::net::SocketAddr,
    name: &str,
    ca: &CertificateDer<'static>,
) -> (Sender, quinn::Connection) {
    h3_connection_with(addr, name, ca, None).await
}

/// [`h3_connection`] whose client sends a QUIC PING every `ping` (a client that keeps
/// its connection alive at the transport level without sending requests).
pub async fn h3_connection_with(
    addr: std::net::SocketAddr,
    name: &str,
    ca: &CertificateDer<'static>,
    ping: Option<std::time::Duration>,
) -> (Sender, quinn::Connection) {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    h3_connection_tls(addr, name, tls, ping).await
}

/// An HTTP/3 connection over the client configuration `tls` (TLS 1.3; its ALPN is set
/// here), for a client that presents a certificate of its own.
pub async fn h3_connection_tls(
    addr: std::net::SocketAddr,
    name: &str,
    mut tls: rustls::ClientConfig,
    ping: Option<std::time::Duration>,
) -> (Sender, quinn::Connection) {
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut client = quinn::ClientConfig::new(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(ping);
    client.transport_config(Arc::new(transport));
    endpoint.set_default_client_config(client);
    let conn = endpoint
        .connect(addr, name)
        .unwrap()
        .await
        .expect("QUIC handshake");
    let quic = conn.clone();
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        drop(endpoint);
    });
    (send, quic)
}

/// One request over `send`: status, headers and the whole body.
pub async fn h3_request(
    send: &mut Sender,
    method: &str,
    url: &str,
    body: Option<Bytes>,
) -> (u16, http::HeaderMap, Vec<u8>) {
    let mut req = http::Request::builder().method(method).uri(url);
    if let Some(b) = &body {
        req = req.header("content-length", b.len());
    }
    let mut stream = send.send_request(req.body(()).unwrap()).await.unwrap();
    if let Some(b) = body {
        // In pieces, as a client streams an upload.
        for chunk in b.chunks(64 * 1024) {
            stream
                .send_data(Bytes::copy_from_slice(chunk))
                .await
                .unwrap();
        }
    }
    stream.finish().await.unwrap();
    let rsp = stream.recv_response().await.unwrap();
    let mut got = Vec::new();
    while let Some(mut chunk) = stream.recv_data().await.unwrap() {
        got.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
    }
    (rsp.status().as_u16(), rsp.headers().clone(), got)
}
