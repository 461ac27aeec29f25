//! The proxy on the wire: pass-through, streaming, headers, own answers.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_method_path_query_headers_body_and_status_through() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &[]);
    let c = client();
    for method in ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
        let r = send(
            &c,
            method,
            &f.url("/some/path?a=1&b=%20x&a=2"),
            &[("x-custom", "v1"), ("content-type", "text/plain")],
            if method == "GET" {
                Bytes::new()
            } else {
                Bytes::from_static(b"hello")
            },
        )
        .await;
        assert_eq!(r.status, 200, "{method}");
        assert_eq!(r.header("x-method"), Some(method));
        assert_eq!(r.header("x-uri"), Some("/some/path?a=1&b=%20x&a=2"));
        let seen = a.stats.last_headers.lock().unwrap().clone().unwrap();
        assert_eq!(seen["x-custom"], "v1");
        assert_eq!(seen["content-type"], "text/plain");
        let expected_len = if method == "GET" { "0" } else { "5" };
        assert_eq!(r.header("x-body-len"), Some(expected_len), "{method}");
        assert_eq!(r.text(), "A");
    }
    let r = send(&c, "HEAD", &f.url("/x"), &[], Bytes::new()).await;
    assert_eq!((r.status.as_u16(), r.body.len()), (200, 0));
    for code in [418u16, 500, 503, 404, 201] {
        let r = get(&c, &f.url(&format!("/status/{code}"))).await;
        assert_eq!(r.status.as_u16(), code);
        assert_eq!(r.text(), "A", "the backend's own body passes unchanged");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_five_mib_each_way() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &[]);
    let c = client();
    let five = 5 * 1024 * 1024;
    let up: Vec<u8> = (0..five).map(|i| (i % 251) as u8).collect();
    let r = send(&c, "POST", &f.url("/echo"), &[], up.clone()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), five);
    assert!(r.body == up, "echoed body differs");
    let r = get(&c, &f.url(&format!("/big/{five}"))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), five);
    assert!(r.body.iter().all(|&b| b == b'x'));
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_stream_without_being_held_whole() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &["--workers", "1"]);
    let c = client();
    // Warm up, then measure the peak resident set across 64 MiB each way.
    get(&c, &f.url("/big/1024")).await;
    let before = vm_hwm_kib(f.child.id());
    let n = 64 * 1024 * 1024;
    let (tx, rx) = tokio::sync::mpsc::channel::<
        Result<hyper::body::Frame<Bytes>, std::convert::Infallible>,
    >(4);
    tokio::spawn(async move {
        let chunk = Bytes::from(vec![7u8; 256 * 1024]);
        for _ in 0..(n / chunk.len()) {
            if tx
                .send(Ok(hyper::body::Frame::data(chunk.clone())))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let body = http_body_util::StreamBody::new(ReceiverStream(rx));
    let streaming_client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http::<http_body_util::StreamBody<ReceiverStream>>();
    let req = http::Request::post(f.url("/echo")).body(body).unwrap();
    let resp = streaming_client.request(req).await.unwrap();
    let mut got = 0usize;
    let mut b = resp.into_body();
    while let Some(fr) = b.frame().await {
        got += fr.unwrap().data_ref().map(|d| d.len()).unwrap_or(0);
    }
    assert_eq!(got, n);
    let r = get(&c, &f.url(&format!("/big/{n}"))).await;
    assert_eq!(r.body.len(), n);
    let after = vm_hwm_kib(f.child.id());
    assert!(
        after - before < 24 * 1024,
        "peak RSS grew by {} KiB while streaming 64 MiB each way",
        after - before
    );
}

struct ReceiverStream(
    tokio::sync::mpsc::Receiver<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>,
);
impl futures_util::Stream for ReceiverStream {
    type Item = Result<hyper::body::Frame<Bytes>, std::convert::Infallible>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_forwarded_headers_are_set_fresh_and_appended() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &[]);
    let c = client();
    let seen = || a.stats.last_headers.lock().unwrap().clone().unwrap();
    get(&c, &f.url("/")).await;
    let h = seen();
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["x-forwarded-host"], f.proxy.to_string());
    assert_eq!(
        h["host"],
        f.proxy.to_string(),
        "Host passes as the client sent it"
    );
    send(
        &c,
        "GET",
        &f.url("/"),
        &[
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "evil"),
        ],
        Bytes::new(),
    )
    .await;
    let h = seen();
    assert_eq!(h["x-forwarded-for"], "203.0.113.9, 127.0.0.1");
    assert_eq!(
        h["x-forwarded-proto"], "http",
        "an untrusted client's value is replaced"
    );
    assert_eq!(h["x-forwarded-host"], f.proxy.to_string());
    // Several incoming lines are merged into one.
    let raw = "GET / HTTP/1.1\r\nHost: example.test\r\nX-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 2.2.2.2, 3.3.3.3\r\nConnection: close\r\n\r\n";
    let out = raw_exchange(f.proxy, raw.as_bytes(), Duration::from_secs(5));
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let h = seen();
    assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
    assert_eq!(h["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 3.3.3.3, 127.0.0.1");
    assert_eq!(h["host"], "example.test");
    assert_eq!(h["x-forwarded-host"], "example.test");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_proxies_keep_their_forwarded_proto_and_host() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &["--trusted-proxies", "127.0.0.0/8"]);
    let c = client();
    send(
        &c,
        "GET",
        &f.url("/"),
        &[
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "shop.test"),
        ],
        Bytes::new(),
    )
    .await;
    let h = a.stats.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(h["x-forwarded-for"], "203.0.113.9, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "https");
    assert_eq!(h["x-forwarded-host"], "shop.test");
}

#[test]
fn hop_by_hop_headers_are_removed() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &[]);
    let raw = "GET /x HTTP/1.1\r\nHost: h\r\nConnection: close, x-private\r\nX-Private: secret\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\nTrailer: x-t\r\nUpgrade: h2c\r\nProxy-Authorization: Basic Zm9v\r\nX-Kept: yes\r\n\r\n";
    let out = raw_exchange(f.proxy, raw.as_bytes(), Duration::from_secs(5));
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let h = a.stats.last_headers.lock().unwrap().clone().unwrap();
    for gone in [
        "x-private",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
    ] {
        assert!(!h.contains_key(gone), "{gone} reached the backend: {h:?}");
    }
    assert_eq!(h["x-kept"], "yes");
    assert!(
        h.get("connection")
            .is_none_or(|v| !v.to_str().unwrap().contains("x-private")),
        "{h:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_port_gives_502() {
    let port = free_port();
    // Health checks would take the dead backend out of rotation (then: 503); keep it in.
    let f = Fulcrum::start(&[
        "--backend",
        &format!("http://127.0.0.1:{port}"),
        "--retries",
        "0",
        "--unhealthy-threshold",
        "100",
    ]);
    let r = get(&client(), &f.url("/")).await;
    assert_eq!(r.status, 502);
    assert!(!r.text().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_requests_are_retried_on_another_backend_after_a_connect_failure() {
    let a = TestBackend::start("A");
    let port = free_port();
    let dead_spec = format!("http://127.0.0.1:{port},name=dead");
    // A high threshold keeps the dead backend in rotation despite its failed probes.
    let keep = ["--unhealthy-threshold", "100"];
    let f = Fulcrum::start(&[
        "--backend",
        &dead_spec,
        "--backend",
        &a.spec(),
        keep[0],
        keep[1],
    ]);
    let c = client();
    // POST is not idempotent: it is not retried (round robin sends every other one to the
    // dead backend).
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            send(&c, "POST", &f.url("/"), &[], "x")
                .await
                .status
                .as_u16(),
        );
    }
    assert!(
        statuses.contains(&502) && statuses.contains(&200),
        "{statuses:?}"
    );
    // Paced under the retry budget's floor (3 a second), every GET is rescued (and the dead
    // backend is ejected at its fifth failure in a row).
    for _ in 0..6 {
        let r = get(&c, &f.url("/")).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.backend(), "A");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    drop(f);
    // With --retries 0 nothing is retried.
    let f = Fulcrum::start(&[
        "--backend",
        &dead_spec,
        "--backend",
        &a.spec(),
        "--retries",
        "0",
        keep[0],
        keep[1],
    ]);
    let first = get(&c, &f.url("/")).await;
    assert_eq!(first.status, 502);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_timeout_gives_504() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &["--upstream-timeout", "300ms"]);
    let t = Instant::now();
    let r = get(&client(), &f.url("/sleep/3000")).await;
    assert_eq!(r.status, 504);
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );
    let r = get(&client(), &f.url("/sleep/50")).await;
    assert_eq!(r.status, 200);
}

/// Each request on a reused upstream connection gets the whole timeout, counted from
/// its own send: an earlier request's deadline passing mid-request times nothing out,
/// and a later request that hangs still times out on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_timeout_restarts_for_each_request_on_a_reused_connection() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(
        &[&a],
        &[
            "--upstream-timeout",
            "400ms",
            "--retries",
            "0",
            "--workers",
            "1",
        ],
    );
    let c = client();
    assert_eq!(get(&c, &f.url("/")).await.status, 200);
    // The first request's deadline passes while this one waits: 250 + 300 > 400 ms.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(get(&c, &f.url("/sleep/300")).await.status, 200);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(get(&c, &f.url("/sleep/300")).await.status, 200);
    let t = Instant::now();
    assert_eq!(get(&c, &f.url("/sleep/3000")).await.status, 504);
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(390) && waited < Duration::from_millis(1500),
        "{waited:?}"
    );
    let s = status(&c, &f).await;
    assert_eq!(s["backends"][0]["requests"], 4);
}

#[test]
fn oversized_request_headers_get_431() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &[]);
    let big = "v".repeat(70 * 1024);
    let raw = format!("GET / HTTP/1.1\r\nHost: h\r\nX-Big: {big}\r\nConnection: close\r\n\r\n");
    let out = raw_exchange(f.proxy, raw.as_bytes(), Duration::from_secs(5));
    assert!(
        out.starts_with("HTTP/1.1 431"),
        "{}",
        &out[..out.len().min(200)]
    );
    // Just over 64 KiB: within hyper's read buffer, so the proxy's own limit answers.
    let big = "v".repeat(64 * 1024 + 100);
    let raw = format!("GET / HTTP/1.1\r\nHost: h\r\nX-Big: {big}\r\nConnection: close\r\n\r\n");
    let out = raw_exchange(f.proxy, raw.as_bytes(), Duration::from_secs(5));
    assert!(
        out.starts_with("HTTP/1.1 431"),
        "{}",
        &out[..out.len().min(200)]
    );
    let before = a.requests();
    let ok = "v".repeat(48 * 1024);
    let raw = format!("GET / HTTP/1.1\r\nHost: h\r\nX-Big: {ok}\r\nConnection: close\r\n\r\n");
    let out = raw_exchange(f.proxy, raw.as_bytes(), Duration::from_secs(5));
    assert!(
        out.starts_with("HTTP/1.1 200"),
        "{}",
        &out[..out.len().min(200)]
    );
    assert_eq!(
        a.requests(),
        before + 1,
        "refused heads never reach the backend"
    );
}

#[test]
fn garbage_request_line_gets_400_and_the_next_client_is_served() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &[]);
    let out = raw_exchange(
        f.proxy,
        b"\x16\x03garbage here\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    let out = raw_exchange(
        f.proxy,
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}

#[test]
fn slow_request_head_gets_408() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &[]);
    let t = Instant::now();
    let out = raw_exchange(
        f.proxy,
        b"GET / HTTP/1.1\r\nHost: h\r\n",
        Duration::from_secs(15),
    );
    assert!(out.starts_with("HTTP/1.1 408"), "{out:?}");
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_secs(9) && waited < Duration::from_secs(13),
        "{waited:?}"
    );
}

#[test]
fn an_idle_keep_alive_connection_is_closed_without_a_408() {
    use std::io::{Read, Write};
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &[]);
    let mut s = std::net::TcpStream::connect(f.proxy).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut first = vec![0u8; 4096];
    let n = s.read(&mut first).unwrap();
    assert!(first[..n].starts_with(b"HTTP/1.1 200"));
    let t = Instant::now();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(
        t.elapsed() >= Duration::from_secs(9),
        "closed too early: {:?}",
        t.elapsed()
    );
    assert!(
        rest.is_empty(),
        "unsolicited answer: {}",
        String::from_utf8_lossy(&rest)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_prior_knowledge_from_clients() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &[]);
    let c = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    for _ in 0..3 {
        let req = http::Request::post(f.url("/h2/path?q=1"))
            .body(Full::new(Bytes::from_static(b"abc")))
            .unwrap();
        let resp = c.request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.version(), http::Version::HTTP_2);
        assert_eq!(resp.headers()["x-uri"], "/h2/path?q=1");
        assert_eq!(resp.headers()["x-body-len"], "3");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"A");
    }
    let h = a.stats.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(
        h["host"],
        f.proxy.to_string(),
        "the :authority becomes Host"
    );
}

#[test]
fn websocket_upgrade_is_tunnelled() {
    use std::io::{Read, Write};
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &[]);
    let mut s = std::net::TcpStream::connect(f.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    for msg in [&b"ping"[..], b"hello through the tunnel"] {
        s.write_all(msg).unwrap();
        let mut buf = vec![0u8; msg.len()];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(buf, msg);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connections_are_kept_alive_and_reused() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &["--workers", "1"]);
    let c = client();
    for _ in 0..200 {
        assert_eq!(get(&c, &f.url("/")).await.status, 200);
    }
    // Health probes come on connections of their own; count the ones traffic used.
    let conns = a
        .stats
        .traffic_connections
        .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        conns, 1,
        "200 sequential requests used {conns} upstream connections"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_backend_gives_503() {
    let f = Fulcrum::start(&[]);
    let r = get(&client(), &f.url("/anything")).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.text().trim(), "no healthy backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_carries_a_request_id_to_the_backend_and_back() {
    let a = TestBackend::start("A");
    let seen_id = || {
        a.stats.last_headers.lock().unwrap().clone().unwrap()["x-request-id"]
            .to_str()
            .unwrap()
            .to_string()
    };
    let f = Fulcrum::over(&[&a], &[]);
    let c = client();
    let mut ids = std::collections::HashSet::new();
    // Bodiless (the inline path) and with a body (through hyper), and a client's own
    // id, which an untrusted peer cannot set.
    for (method, body, theirs) in [
        ("GET", "", None),
        ("POST", "data", None),
        ("GET", "", Some("mine-1")),
    ] {
        let fields: Vec<(&str, &str)> = theirs.map(|t| ("x-request-id", t)).into_iter().collect();
        let r = send(&c, method, &f.url("/id"), &fields, body).await;
        assert_eq!(r.status, 200);
        let id = r.header("x-request-id").expect("an id back").to_string();
        assert_eq!(id.len(), 32, "{id}");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{id}"
        );
        assert_eq!(seen_id(), id, "the backend saw the same id");
        assert!(ids.insert(id.clone()), "a new id per request");
        assert!(
            f.log_line(
                &["access", &format!("request_id={id}")],
                Duration::from_secs(3)
            )
            .is_some(),
            "the access log shows it"
        );
    }
    // A trusted peer's id is kept, both ways.
    let t = Fulcrum::over(&[&a], &["--trusted-proxies", "127.0.0.1"]);
    let r = send(&c, "GET", &t.url("/id"), &[("x-request-id", "edge-42")], "").await;
    assert_eq!(r.header("x-request-id"), Some("edge-42"));
    assert_eq!(seen_id(), "edge-42");
}
