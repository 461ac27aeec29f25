//! HTTP/2 to backends (`protocol = "h2"`, `docs/tls.md`): requests multiplexed over a
//! few connections, h2c by prior knowledge and h2 by ALPN over TLS, and trailers both
//! ways, so that a gRPC call's `grpc-status` reaches its client — over real sockets.

mod common;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};

use common::tls::*;
use common::*;

/// An HTTP/2 (prior knowledge) connection to fulcrum's plain listener.
async fn h2c_to(
    f: &Fulcrum,
) -> hyper::client::conn::http2::SendRequest<
    http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>,
> {
    let tcp = tokio::net::TcpStream::connect(f.proxy).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_pool_multiplexes_a_hundred_requests_over_a_few_connections() {
    let backend = H2Backend::plain("h2c");
    let url = format!("http://127.0.0.1:{}", backend.addr.port());
    let f = Fulcrum::start(&["--backend", &url, "--protocol", "h2", "--workers", "2"]);
    let c = client();
    let calls: Vec<_> = (0..100)
        .map(|i| {
            let (c, url) = (c.clone(), f.url(&format!("/n/{i}")));
            tokio::spawn(async move { get(&c, &url).await })
        })
        .collect();
    let mut most = 0;
    for call in calls {
        let r = call.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-version"), Some("HTTP/2.0"));
        assert_eq!(r.text(), "h2c");
        most = most.max(r.header("x-connections").unwrap().parse::<u32>().unwrap());
    }
    // One connection per worker, more only when one runs out of streams.
    assert!(most <= 4, "{most} connections for 100 requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_reach_the_client_and_the_backend() {
    let backend = H2Backend::plain("grpc");
    let url = format!("http://127.0.0.1:{}", backend.addr.port());
    let f = Fulcrum::start(&["--backend", &url, "--protocol", "h2"]);
    let mut h2 = h2c_to(&f).await;
    // A streaming answer: its chunks, then its trailers, whole.
    let req = http::Request::post("http://grpc.test/stream/5")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::new()).boxed())
        .unwrap();
    let resp = h2.send_request(req).await.expect("response");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let (mut data, mut trailers) = (Vec::new(), None);
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("frame");
        if let Some(d) = frame.data_ref() {
            data.extend_from_slice(d);
        } else if let Ok(t) = frame.into_trailers() {
            trailers = Some(t);
        }
    }
    assert_eq!(String::from_utf8_lossy(&data).lines().count(), 5);
    let t = trailers.expect("trailers");
    assert_eq!(
        (
            t["grpc-status"].to_str().unwrap(),
            t["grpc-message"].to_str().unwrap()
        ),
        ("0", "ok")
    );
    // The client's trailers reach the backend (it echoes them back).
    let mut client_trailers = http::HeaderMap::new();
    client_trailers.insert("x-checksum", "abc".parse().unwrap());
    let frames = vec![
        Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b"payload"))),
        Ok(Frame::trailers(client_trailers)),
    ];
    let req = http::Request::post("http://grpc.test/echo")
        .header("content-type", "application/grpc")
        .body(StreamBody::new(futures_util::stream::iter(frames)).boxed())
        .unwrap();
    let resp = h2.send_request(req).await.expect("response");
    let collected = resp.into_body().collect().await.unwrap();
    let t = collected.trailers().cloned().expect("trailers");
    assert_eq!(t["x-checksum"], "abc");
    assert_eq!(t["grpc-status"], "0");
    assert_eq!(&collected.to_bytes()[..], b"payload");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_over_tls_to_a_backend_is_chosen_by_alpn() {
    let pki = Pki::new("h2tls");
    let backend = H2Backend::tls("h2tls", &pki, "backend", &["localhost"]);
    let cfg = config_file(
        "h2",
        "tls",
        &format!(
            "protocol = \"h2\"\ntls_ca_file = \"{}\"\n[[backends]]\nurl = \"https://localhost:{}\"\n",
            pki.arg("ca.pem"),
            backend.addr.port()
        ),
    );
    // One worker: each worker keeps its own upstream connections, and the client's
    // connection could otherwise land on either.
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap(), "--workers", "1"]);
    let c = client();
    for _ in 0..5 {
        let r = get(&c, &f.url("/")).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-version"), Some("HTTP/2.0"));
    }
    let r = get(&c, &f.url("/")).await;
    assert_eq!(
        r.header("x-connections"),
        Some("1"),
        "one connection, reused"
    );
    let _ = Duration::ZERO;
}

/// Messages as raw bytes: the test service needs no schema.
#[derive(Debug, Clone, Default)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Bytes>, tonic::Status> {
        let n = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, n)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_client_calls_through_fulcrum() {
    let backend = H2Backend::plain("grpc");
    let url = format!("http://127.0.0.1:{}", backend.addr.port());
    let f = Fulcrum::start(&["--backend", &url, "--protocol", "h2"]);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", f.proxy))
        .unwrap()
        .connect()
        .await
        .expect("a channel to fulcrum");
    let mut grpc = tonic::client::Grpc::new(channel);
    let path = |m: &'static str| http::uri::PathAndQuery::from_static(m);
    grpc.ready().await.unwrap();
    let reply = grpc
        .unary(
            tonic::Request::new(Bytes::from_static(b"hello")),
            path("/test.Echo/Unary"),
            Raw,
        )
        .await
        .expect("the unary call succeeds");
    assert_eq!(&reply.into_inner()[..], b"hello");
    grpc.ready().await.unwrap();
    let mut stream = grpc
        .server_streaming(
            tonic::Request::new(Bytes::from_static(b"again")),
            path("/test.Echo/Stream"),
            Raw,
        )
        .await
        .expect("the streaming call starts")
        .into_inner();
    let mut got = Vec::new();
    while let Some(m) = stream.message().await.expect("a message or the end") {
        got.push(m);
    }
    assert_eq!(got.len(), 3, "every message of the stream, then its status");
    grpc.ready().await.unwrap();
    let err = grpc
        .unary(
            tonic::Request::new(Bytes::from_static(b"x")),
            path("/test.Echo/Fail"),
            Raw,
        )
        .await
        .expect_err("the backend's status reaches the client");
    assert_eq!((err.code(), err.message()), (tonic::Code::NotFound, "nope"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_connection_opens_when_the_first_carries_a_hundred_streams() {
    let backend = H2Backend::plain("h2c");
    let url = format!("http://127.0.0.1:{}", backend.addr.port());
    let f = Fulcrum::start(&["--backend", &url, "--protocol", "h2", "--workers", "1"]);
    let c = client();
    let calls: Vec<_> = (0..150)
        .map(|_| {
            let (c, url) = (c.clone(), f.url("/sleep/2000"));
            tokio::spawn(async move { get(&c, &url).await })
        })
        .collect();
    let mut most = 0;
    for call in calls {
        let r = call.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        most = most.max(r.header("x-connections").unwrap().parse::<u32>().unwrap());
    }
    assert_eq!(
        most, 2,
        "150 requests at once over streams of 100 per connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_backend_that_does_not_agree_to_h2_fails_its_connect() {
    let pki = Pki::new("noalpn");
    // A server that ignores ALPN (offers nothing): the handshake completes without h2.
    let backend = H2Backend::tls_offering("noalpn", &pki, "backend", &["localhost"], &[]);
    let cfg = config_file(
        "h2",
        "noalpn",
        &format!(
            "protocol = \"h2\"\nretries = 0\ntls_ca_file = \"{}\"\n[[backends]]\nurl = \"https://localhost:{}\"\n",
            pki.arg("ca.pem"),
            backend.addr.port()
        ),
    );
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let r = get(&client(), &f.url("/")).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(
        f.log_line(&["did not agree to h2"], Duration::from_secs(3))
            .is_some(),
        "{}",
        f.log()
    );
}
