//! HTTP/2 from clients on fulcrum's own codec (`docs/http2.md`), over real sockets:
//! requests and answers against the `h2` crate's client, large bodies each way under
//! flow control, curl and nghttp over h2c and TLS, and the graceful close's two GOAWAYs.

mod common;

use std::convert::Infallible;
use std::io::Write;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use common::tls::*;
use common::*;

/// A hyper HTTP/1.1 backend on an ephemeral port, each request answered by `answer`.
async fn hyper_backend<F, Fut, B>(answer: F) -> std::net::SocketAddr
where
    F: Fn(hyper::Request<Incoming>) -> Fut + Copy + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<hyper::Response<B>, Infallible>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), service_fn(answer))
                    .await;
            });
        }
    });
    addr
}

/// An HTTP/1.1 backend (hyper) that answers each request with its body, its `x-*`
/// fields back as `x-echo-*` (every value, in order), and `x-pad` fields as long as the
/// request's `x-answer-pad` asks: an answer head long enough for CONTINUATION frames.
async fn echo_backend() -> std::net::SocketAddr {
    hyper_backend(echo).await
}

/// The echo backend's answer (see [`echo_backend`]).
async fn echo(r: hyper::Request<Incoming>) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let (parts, body) = r.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut a = hyper::Response::builder().status(200);
    for (n, v) in &parts.headers {
        if let Some(rest) = n.as_str().strip_prefix("x-") {
            a = a.header(format!("x-echo-{rest}"), v);
        }
    }
    let pad: usize = (parts.headers.get("x-answer-pad"))
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    for i in 0..pad / 1000 {
        a = a.header(format!("x-pad-{i}"), "p".repeat(1000));
    }
    Ok(a.body(Full::new(body)).unwrap())
}

/// A backend that counts what it is sent (`x-seen`) and answers `/down/N` with N bytes.
async fn count_and_send(
    r: hyper::Request<Incoming>,
) -> Result<hyper::Response<impl hyper::body::Body<Data = Bytes, Error = Infallible>>, Infallible> {
    let down: u64 = (r.uri().path().strip_prefix("/down/"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let mut body = r.into_body();
    let mut seen = 0u64;
    while let Some(Ok(f)) = body.frame().await {
        seen += f.data_ref().map_or(0, |d| d.len() as u64);
    }
    let chunk = Bytes::from(vec![b'z'; 256 * 1024]);
    let frames = (down / chunk.len() as u64) as usize;
    let stream = futures_util::stream::iter(
        std::iter::repeat_n(chunk, frames).map(|c| Ok::<_, Infallible>(Frame::data(c))),
    );
    Ok(hyper::Response::builder()
        .header("x-seen", seen.to_string())
        .body(StreamBody::new(stream))
        .unwrap())
}

/// An `h2` client connection to `addr` by prior knowledge.
async fn h2_client(addr: std::net::SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send.ready().await.unwrap()
}

/// A small deterministic generator (xorshift), so that a failure names its case.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A field value: visible ASCII and inner spaces.
    fn value(&mut self) -> String {
        let len = 1 + self.below(40) as usize;
        let mut v: String = (0..len)
            .map(|_| (b'!' + self.below(94) as u8) as char)
            .collect();
        if len > 2 {
            v.replace_range(1..2, " ");
        }
        v
    }
}

/// One generated request: method, path, `x-*` fields, body, and the answer's padding.
struct Case {
    method: http::Method,
    path: String,
    fields: Vec<(String, String)>,
    body: Vec<u8>,
    pad: usize,
}

fn case(seed: u64) -> Case {
    let mut g = Gen(seed * 0x9e37_79b9 + 1);
    let method =
        [http::Method::GET, http::Method::POST, http::Method::PUT][g.below(3) as usize].clone();
    let fields = (0..g.below(12))
        .map(|_| (format!("x-f{}", g.below(5)), g.value()))
        .collect();
    let sizes = [0, 1, 999, 70_000, 300_000];
    let body = match method {
        http::Method::GET => Vec::new(),
        _ => (0..sizes[g.below(5) as usize])
            .map(|i| (i % 251) as u8)
            .collect(),
    };
    let pad = [0, 0, 20_000][g.below(3) as usize];
    Case {
        method,
        path: format!("/c/{seed}?q={}", g.below(1000)),
        fields,
        body,
        pad,
    }
}

/// Sends `c` on `send` and checks the answer against what was sent.
async fn round_trip(mut send: h2::client::SendRequest<Bytes>, seed: u64, authority: String) {
    let c = case(seed);
    let mut r = http::Request::builder()
        .method(c.method.clone())
        .uri(format!("http://{authority}{}", c.path))
        .header("x-answer-pad", c.pad.to_string());
    for (n, v) in &c.fields {
        r = r.header(n, v);
    }
    let end = c.body.is_empty();
    let (answer, mut body) = send.send_request(r.body(()).unwrap(), end).unwrap();
    if !end {
        // Frames of 16 KiB as the window allows.
        for chunk in c.body.chunks(16 * 1024) {
            body.reserve_capacity(chunk.len());
            while body.capacity() < chunk.len() {
                std::future::poll_fn(|cx| body.poll_capacity(cx))
                    .await
                    .unwrap()
                    .unwrap();
            }
            body.send_data(Bytes::copy_from_slice(chunk), false)
                .unwrap();
        }
        body.send_data(Bytes::new(), true).unwrap();
    }
    let answer = answer.await.unwrap();
    assert_eq!(answer.status(), 200, "case {seed}");
    let h = answer.headers().clone();
    for name in ["f0", "f1", "f2", "f3", "f4"] {
        let sent: Vec<&str> = (c.fields.iter())
            .filter(|(n, _)| n[2..] == *name)
            .map(|(_, v)| v.as_str())
            .collect();
        let echoed: Vec<&str> = (h.get_all(format!("x-echo-{name}")).iter())
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(echoed, sent, "case {seed}: x-{name}");
    }
    assert_eq!(
        h.keys()
            .filter(|k| k.as_str().starts_with("x-pad-"))
            .count(),
        c.pad / 1000
    );
    // The request's id, once, on the answer as on the request the backend saw.
    assert_eq!(h.get_all("x-request-id").iter().count(), 1, "case {seed}");
    let id = h["x-request-id"].to_str().unwrap();
    assert_eq!(id.len(), 32, "case {seed}: {id}");
    assert_eq!(h["x-echo-request-id"], id, "case {seed}");
    let mut got = Vec::new();
    let mut recv = answer.into_body();
    while let Some(data) = recv.data().await {
        let data = data.unwrap();
        recv.flow_control().release_capacity(data.len()).unwrap();
        got.extend_from_slice(&data);
    }
    assert_eq!(got.len(), c.body.len(), "case {seed}");
    assert!(got == c.body, "case {seed}: the body came back changed");
}

/// Requests made by the `h2` crate's client — methods, repeated fields, bodies up to
/// 300 KiB (past the 64 KiB default window), answer heads of 20 KB (past one frame) —
/// reach the backend and come back as sent, many streams at once on one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_answers_cross_the_codec_as_the_h2_client_sent_them() {
    let backend = echo_backend().await;
    let url = format!("http://{backend}");
    let f = Fulcrum::start(&["--backend", &url, "--health-interval", "60s"]);
    let send = h2_client(f.proxy).await;
    let calls: Vec<_> = (0..60)
        .map(|seed| {
            let send = send.clone();
            let authority = format!("a.test:{}", f.proxy.port());
            tokio::spawn(round_trip(send, seed, authority))
        })
        .collect();
    for call in calls {
        call.await.unwrap();
    }
}

/// An answer fulcrum makes itself (no backend takes the request: 502) carries the
/// request id too, once, over HTTP/2 as over HTTP/1.1; a client's own `X-Request-Id` is
/// not taken from an untrusted peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_fulcrum_makes_itself_carries_one_request_id() {
    let dead = format!("http://127.0.0.1:{}", free_port());
    let f = Fulcrum::start(&["--backend", &dead, "--health-interval", "60s"]);
    let mut send = h2_client(f.proxy).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let r = http::Request::builder()
            .uri("http://a.test/x")
            .header("x-request-id", "mine")
            .body(())
            .unwrap();
        let (answer, _) = send.send_request(r, true).unwrap();
        let answer = answer.await.unwrap();
        assert_eq!(answer.status(), 502);
        let ids: Vec<_> = answer.headers().get_all("x-request-id").iter().collect();
        assert_eq!(ids.len(), 1, "{ids:?}");
        assert_eq!(ids[0].len(), 32, "{ids:?}");
        seen.push(ids[0].clone());
        send = send.ready().await.unwrap();
    }
    assert_ne!(seen[0], seen[1], "each request its own id");
}

/// 128 MiB up and 128 MiB down through one stream each (128 windows' worth; a
/// gibibyte with the release build is in `docs/performance.md`): the windows keep the
/// proxy's memory flat, whatever the body's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_streams_up_and_down_with_memory_bounded() {
    const GIB: u64 = 128 << 20;
    let backend = hyper_backend(count_and_send).await;
    let url = format!("http://{backend}");
    let f = Fulcrum::start(&["--backend", &url, "--health-interval", "60s"]);
    let mut send = h2_client(f.proxy).await;
    let before = rss_kib(f.child.id());
    // Up.
    let r = http::Request::post("http://a/up").body(()).unwrap();
    let (answer, mut body) = send.send_request(r, false).unwrap();
    let chunk = Bytes::from(vec![b'u'; 64 * 1024]);
    let mut peak = before;
    for i in 0..GIB / chunk.len() as u64 {
        body.reserve_capacity(chunk.len());
        while body.capacity() == 0 {
            std::future::poll_fn(|cx| body.poll_capacity(cx))
                .await
                .unwrap()
                .unwrap();
        }
        let n = body.capacity().min(chunk.len());
        body.send_data(chunk.slice(..n), false).unwrap();
        if n < chunk.len() {
            let rest = chunk.slice(n..);
            body.reserve_capacity(rest.len());
            while body.capacity() < rest.len() {
                std::future::poll_fn(|cx| body.poll_capacity(cx))
                    .await
                    .unwrap()
                    .unwrap();
            }
            body.send_data(rest, false).unwrap();
        }
        if i % 4096 == 0 {
            peak = peak.max(rss_kib(f.child.id()));
        }
    }
    body.send_data(Bytes::new(), true).unwrap();
    let answer = answer.await.unwrap();
    assert_eq!(answer.headers()["x-seen"], GIB.to_string());
    // Down, read at the client's pace.
    let r = http::Request::get(format!("http://a/down/{GIB}"))
        .body(())
        .unwrap();
    send = send.ready().await.unwrap();
    let (answer, _) = send.send_request(r, true).unwrap();
    let mut recv = answer.await.unwrap().into_body();
    let mut got = 0u64;
    while let Some(data) = recv.data().await {
        let data = data.unwrap();
        got += data.len() as u64;
        recv.flow_control().release_capacity(data.len()).unwrap();
        if got % (64 << 20) < data.len() as u64 {
            peak = peak.max(rss_kib(f.child.id()));
        }
    }
    assert_eq!(got, GIB);
    let grown = peak.saturating_sub(before);
    assert!(grown < 64 * 1024, "RSS grew by {grown} KiB");
}

/// curl and nghttp, over h2c (prior knowledge) and over TLS (ALPN h2), get their answer
/// through the codec.
#[test]
fn curl_and_nghttp_are_served_over_h2c_and_tls() {
    let a = TestBackend::start("A");
    let pki = Pki::new("h2-front-clients");
    pki.leaf("site", &["localhost"]);
    let (cert, key) = (pki.path("site.pem"), pki.path("site.key"));
    let tls_port = free_port();
    let tls_listen = format!("127.0.0.1:{tls_port}");
    let f = Fulcrum::over(
        &[&a],
        &[
            "--tls-listen",
            &tls_listen,
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--health-interval",
            "60s",
        ],
    );
    let h2c = f.url("/h2c");
    let tls = format!("https://localhost:{tls_port}/tls");
    let resolve = format!("localhost:{tls_port}:127.0.0.1");
    let ca = pki.path("ca.pem");
    let runs: Vec<(&str, Vec<&str>)> = vec![
        (
            "curl",
            vec![
                "-sS",
                "--http2-prior-knowledge",
                "-w",
                "%{http_version}",
                &h2c,
            ],
        ),
        (
            "curl",
            vec![
                "-sS",
                "--http2",
                "--cacert",
                ca.to_str().unwrap(),
                "--resolve",
                &resolve,
                "-w",
                "%{http_version}",
                &tls,
            ],
        ),
        ("nghttp", vec!["-n", "--stat", &h2c]),
        ("nghttp", vec!["-n", "--stat", &tls]),
    ];
    for (tool, args) in runs {
        let out = std::process::Command::new(tool)
            .args(&args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{tool} {args:?}: {err}");
        match tool {
            "curl" => assert!(text.ends_with('2'), "{tool} {args:?}: {text}"),
            _ => assert!(
                text.contains("/h2c") || text.contains("/tls"),
                "{tool}: {text}"
            ),
        }
    }
    assert!(a.requests() >= 4);
}

/// A stop closes an HTTP/2 connection in RFC 9113 §6.8's two steps: a GOAWAY naming the
/// last id possible and a PING; after the PING's answer a GOAWAY naming the last stream
/// opened. A stream opened between the two is still answered.
#[test]
fn a_stop_sends_two_goaways_around_a_ping() {
    let backend = raw_backend(Duration::from_millis(300), String::new(), "slow");
    let url = format!("http://{backend}");
    let f = Fulcrum::start(&["--backend", &url, "--health-interval", "60s"]);
    let mut s = std::net::TcpStream::connect(f.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let get = [0x82, 0x86, 0x84, 0x41, 0x01, b'a'];
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(4, 0, 0, &[]));
    out.extend(h2_frame(1, 0x5, 1, &get));
    s.write_all(&out).unwrap();
    // The request is at the backend; the stop comes.
    std::thread::sleep(Duration::from_millis(100));
    f.signal("TERM");
    let mut ping = None;
    let mut goaways = Vec::new();
    let mut answered = Vec::new();
    while let Some((kind, flags, stream, payload)) = read_h2_frame(&mut s) {
        match kind {
            7 => {
                goaways.push(u32::from_be_bytes(payload[..4].try_into().unwrap()) & 0x7fff_ffff);
                if goaways.len() == 1 {
                    continue;
                }
            }
            6 if flags & 1 == 0 => {
                ping = Some(payload.clone());
                // A stream opened before the PING's answer.
                let mut more = h2_frame(1, 0x5, 3, &get);
                more.extend(h2_frame(6, 1, 0, &payload));
                s.write_all(&more).unwrap();
            }
            1 => answered.push(stream),
            _ => {}
        }
        if answered.len() == 2 {
            break;
        }
    }
    assert!(ping.is_some(), "no PING after the first GOAWAY");
    assert_eq!(goaways, [(1 << 31) - 1, 3]);
    answered.sort();
    assert_eq!(answered, [1, 3]);
}
