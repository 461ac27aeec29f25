//! Heads that must not reach a backend, over real sockets: `CONNECT`, ambiguous framing,
//! a missing, repeated or malformed `Host`; the target's authority in absolute form; a
//! backend's oversized answer head; and retries counted only when they are made.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// Sends `request` on a fresh connection; the answer and whether the proxy closed the
/// connection after it (rather than the read timing out).
fn exchange(f: &Fulcrum, request: &[u8]) -> (String, bool) {
    let t = Instant::now();
    let r = raw_exchange(f.proxy, request, Duration::from_secs(4));
    (r, t.elapsed() < Duration::from_secs(3))
}

#[test]
fn connect_is_refused_with_405_and_allow() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &["--health-interval", "60s"]);
    let before = a.requests();
    let (r, closed) = exchange(
        &f,
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    );
    assert!(r.starts_with("HTTP/1.1 405"), "{r}");
    let lower = r.to_ascii_lowercase();
    assert!(lower.contains("\r\nallow: get, head, post"), "{r}");
    assert!(closed, "the connection ends after a refused head: {r}");
    assert_eq!(a.requests(), before, "nothing reached the backend");
}

#[test]
fn length_with_transfer_encoding_is_refused_before_the_backend() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &["--health-interval", "60s"]);
    let before = a.requests();
    let (r, closed) = exchange(
        &f,
        b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n\
          0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n",
    );
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");
    assert_eq!(
        r.matches("HTTP/1.1 ").count(),
        1,
        "one answer, then the close: {r}"
    );
    assert!(closed, "{r}");
    assert_eq!(a.requests(), before, "nothing reached the backend");
}

#[test]
fn host_must_be_one_valid_authority() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &["--health-interval", "60s"]);
    let before = a.requests();
    let heads: [&[u8]; 8] = [
        // Two Host lines, on the fast path and on hyper's.
        b"GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\nContent-Length: 0\r\n\r\n",
        // None on HTTP/1.1.
        b"GET / HTTP/1.1\r\nX-A: 1\r\n\r\n",
        b"DELETE / HTTP/1.1\r\n\r\n",
        // Not host[:port].
        b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: user@evil/x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost:\r\n\r\n",
        b"PUT / HTTP/1.1\r\nHost: a.example:80x\r\nContent-Length: 0\r\n\r\n",
    ];
    for head in heads {
        let (r, closed) = exchange(&f, head);
        let shown = String::from_utf8_lossy(head);
        assert!(r.starts_with("HTTP/1.1 400"), "{shown:?}: {r}");
        assert!(r.contains("Host"), "{shown:?}: {r}");
        assert!(closed, "{shown:?}: {r}");
    }
    assert_eq!(a.requests(), before, "nothing reached the backend");
    // HTTP/1.0 may leave Host out; it gets the backend's.
    let (r, _) = exchange(&f, b"GET /old HTTP/1.0\r\n\r\n");
    assert!(
        r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200"),
        "{r}"
    );
}

#[test]
fn an_absolute_target_names_the_authority() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &["--health-interval", "60s"]);
    let (r, _) = exchange(
        &f,
        b"GET http://a.example/x HTTP/1.1\r\nHost: b.example\r\nConnection: close\r\n\r\n",
    );
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let h = a.stats.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(
        h["host"], "a.example",
        "the target's authority replaces Host"
    );
    assert_eq!(h.get_all("host").iter().count(), 1);
    assert_eq!(h["x-forwarded-host"], "a.example");
}

#[test]
fn a_response_head_over_64_kib_is_a_502_however_it_arrives() {
    // A head just over 64 KiB (65.7 KB) in one write: the reads that bring it in leave it
    // incomplete at 64 KiB and complete at the next one.
    let addr = answering_backend((0..10).map(|i| (format!("x-f{i}"), "v".repeat(6560))));
    let backend = format!("http://{addr}");
    let f = Fulcrum::start(&[
        "--backend",
        &backend,
        "--health-interval",
        "60s",
        "--retries",
        "0",
    ]);
    let (r, _) = exchange(
        &f,
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    );
    assert!(r.starts_with("HTTP/1.1 502"), "{}", &r[..r.len().min(200)]);
    // Through hyper's client (a request with a body) too.
    let (r, _) = exchange(
        &f,
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
    );
    assert!(r.starts_with("HTTP/1.1 502"), "{}", &r[..r.len().min(200)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_counted_only_when_one_is_made() {
    // A port nothing listens on: every attempt fails to connect.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let backend = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    // Health checks would soon take the dead backend out (503): keep it in.
    let f = Fulcrum::start(&[
        "--backend",
        &backend,
        "--health-interval",
        "60s",
        "--unhealthy-threshold",
        "100",
    ]);
    let c = client();
    for _ in 0..3 {
        assert_eq!(get(&c, &f.url("/")).await.status, 502);
    }
    let retries = retries_line(&c, &f).await;
    assert_eq!(
        retries, "fulcrum_retries_total 0",
        "no other backend to retry on"
    );
    let line = f
        .log_line(&["\"status\":502"], Duration::from_secs(2))
        .or_else(|| f.log_line(&["status=502"], Duration::from_secs(2)))
        .unwrap_or_else(|| f.log());
    assert!(
        line.contains("retries=0") || line.contains("\"retries\":0"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_the_clients_doing_not_the_backends() {
    use std::io::{Read, Write};
    let a = TestBackend::start("A");
    let f = Fulcrum::over(
        &[&a],
        &["--health-interval", "60s", "--upstream-timeout", "1s"],
    );
    // Six clients, more than the five failures in a row that eject a backend, start an
    // upload of 1000 bytes, send 10 and stall.
    let proxy = f.proxy;
    let stalled: Vec<_> = (0..6)
        .map(|_| {
            tokio::task::spawn_blocking(move || {
                let mut s = std::net::TcpStream::connect(proxy).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                s.write_all(
                    b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 1000\r\n\r\n0123456789",
                )
                .unwrap();
                let mut out = Vec::new();
                let mut buf = [0u8; 1024];
                while !out.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => out.extend_from_slice(&buf[..n]),
                    }
                }
                String::from_utf8_lossy(&out).into_owned()
            })
        })
        .collect();
    for h in stalled {
        let r = h.await.unwrap();
        assert!(r.starts_with("HTTP/1.1 408"), "{r}");
    }
    // The backend is neither ejected nor charged with errors, and it still serves.
    let c = client();
    let backends = get(&c, &f.admin_url("/admin/backends")).await.json();
    assert_eq!(backends[0]["ejected"], false, "{backends}");
    assert_eq!(backends[0]["errors"], 0, "{backends}");
    assert_eq!(get(&c, &f.url("/after")).await.status, 200);
}

/// The `fulcrum_retries_total` series of the metrics summed over pools and reasons,
/// as one line.
async fn retries_line(c: &HttpClient, f: &Fulcrum) -> String {
    let m = get(c, &f.admin_url("/metrics")).await.text();
    let series: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("fulcrum_retries_total{"))
        .collect();
    assert!(!series.is_empty(), "{m}");
    let n: u64 = (series.iter())
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    format!("fulcrum_retries_total {n}")
}

/// A fresh connection's GET through the proxy answers 200.
fn fresh_get_ok(addr: std::net::SocketAddr, path: &str) -> bool {
    // A loopback Host: the admin API refuses others (DNS rebinding).
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    raw_exchange(addr, req.as_bytes(), Duration::from_secs(3)).starts_with("HTTP/1.1 200")
}

fn open_idle(addr: std::net::SocketAddr, n: usize) -> Vec<std::net::TcpStream> {
    (0..n)
        .map(|_| std::net::TcpStream::connect(addr).expect("connect"))
        .collect()
}

#[test]
fn idle_connections_on_one_listener_do_not_starve_the_other() {
    let a = TestBackend::start("A");
    let spec = a.spec();
    // 256 descriptors: the admin API may hold 16 connections, the proxy 88.
    let f = Fulcrum::start_with_file_limit(
        256,
        &[
            "--backend",
            &spec,
            "--health-interval",
            "200ms",
            "--access-log",
            "off",
        ],
    );
    // More idle admin connections than the process has descriptors.
    let idle_admin = open_idle(f.admin, 400);
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..20 {
        assert!(
            fresh_get_ok(f.proxy, "/"),
            "proxy request {i} with the admin port full; log:\n{}",
            f.log()
        );
    }
    drop(idle_admin);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !fresh_get_ok(f.admin, "/admin/status") {
        assert!(Instant::now() < deadline, "the admin API recovers");
        std::thread::sleep(Duration::from_millis(50));
    }
    // More idle proxy connections than the proxy's cap: the admin API and the health
    // checker keep their descriptors.
    let idle_proxy = open_idle(f.proxy, 300);
    std::thread::sleep(Duration::from_millis(1000));
    for i in 0..10 {
        let r = raw_exchange(
            f.admin,
            b"GET /admin/backends HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            Duration::from_secs(3),
        );
        assert!(r.starts_with("HTTP/1.1 200"), "admin request {i}: {r}");
        assert!(
            r.contains("\"healthy\":true"),
            "the backend stays healthy: {r}"
        );
    }
    drop(idle_proxy);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !fresh_get_ok(f.proxy, "/") {
        assert!(Instant::now() < deadline, "the proxy recovers");
        std::thread::sleep(Duration::from_millis(50));
    }
    // An admin connection that sends nothing is closed after the header timeout.
    let mut lone = std::net::TcpStream::connect(f.admin).unwrap();
    lone.set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 64];
    let n = std::io::Read::read(&mut lone, &mut buf).unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    assert!(
        t.elapsed() >= Duration::from_secs(9) && t.elapsed() < Duration::from_secs(13),
        "closed after {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_none_of_which_left_goes_to_another_backend_whatever_its_method() {
    // A port nothing listens on, first in the pool: every attempt there fails to connect.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{},name=dead", dead.local_addr().unwrap());
    drop(dead);
    let good = TestBackend::start("G");
    let f = Fulcrum::start(&[
        "--backend",
        &dead_url,
        "--backend",
        &good.spec(),
        "--health-interval",
        "60s",
        "--unhealthy-threshold",
        "100",
    ]);
    let c = client();
    // Round robin sends each request to the dead one first (its retry moved the
    // rotation on): each goes on to G, with its body whole.
    for (i, method) in ["POST", "PUT", "PATCH", "POST"].iter().enumerate() {
        let body = format!("payload {i} {}", "x".repeat(i * 1000));
        let r = send(&c, method, &f.url("/echo"), &[], body.clone()).await;
        assert_eq!(r.status, 200, "{method}: {}", r.text());
        assert_eq!(r.backend(), "G");
        assert_eq!(r.text(), body, "{method}: the body arrives whole");
        // Under the retry budget's floor (3 a second).
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(good.requests(), 4);
    // The request that went on carries the client's Host and one X-Forwarded-For, not
    // what was made up for the dead backend.
    let seen = good.stats.last_headers.lock().unwrap().clone().unwrap();
    let hosts: Vec<_> = seen.get_all("host").iter().collect();
    assert_eq!(hosts, [f.proxy.to_string().as_str()], "{seen:?}");
    assert_eq!(
        seen.get_all("x-forwarded-for").iter().count(),
        1,
        "{seen:?}"
    );
    let retries = retries_line(&c, &f).await;
    assert_eq!(
        retries, "fulcrum_retries_total 4",
        "each landed on the dead one first"
    );
}

#[test]
fn a_backend_that_stops_taking_an_upload_is_charged_not_the_client() {
    use std::io::{Read, Write};
    // Reads the head and a little of the body, then reads nothing more.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            let mut s = s;
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            held.push(s);
        }
    });
    let f = Fulcrum::start(&[
        "--backend",
        &format!("http://{addr},name=deaf"),
        "--health-interval",
        "60s",
        "--upstream-timeout",
        "1s",
    ]);
    let mut s = std::net::TcpStream::connect(f.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let size = 64 << 20;
    let head = format!("POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: {size}\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // The client sends as fast as it is let; the writes block once the backend stops.
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'x'; 1 << 16];
        for _ in 0..(size / chunk.len()) {
            if w.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    let answer = String::from_utf8_lossy(&out).into_owned();
    assert!(answer.starts_with("HTTP/1.1 504"), "{answer}");
    drop(s);
    let _ = writer.join();
    let r = raw_exchange(
        f.admin,
        b"GET /admin/backends/0 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        Duration::from_secs(3),
    );
    assert!(r.contains("\"errors\":1"), "the backend is charged: {r}");
}

// ------------------------------------------------------------------ §11a, amended rules

#[test]
fn host_named_in_connection_is_still_forwarded() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &["--health-interval", "60s"]);
    for request in [
        // The fast path's span fields.
        &b"GET /named HTTP/1.1\r\nHost: client.example\r\nConnection: close, Host\r\n\r\n"[..],
        // hyper's map (a body), with Content-Length named as well.
        b"POST /named HTTP/1.1\r\nHost: client.example\r\nContent-Length: 5\r\nConnection: close, Host, Content-Length\r\n\r\nhello",
    ] {
        let (r, _) = exchange(&f, request);
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        let h = a.stats.last_headers.lock().unwrap().clone().unwrap();
        assert_eq!(h["host"], "client.example", "{h:?}");
        assert_eq!(h["x-forwarded-host"], "client.example", "{h:?}");
    }
    assert_eq!(
        a.stats
            .last_body_len
            .load(std::sync::atomic::Ordering::SeqCst),
        5
    );
}

/// An HTTP/2 connection by prior knowledge, written by hand: the preface, empty
/// SETTINGS, then one HEADERS frame (stream 1, END_STREAM | END_HEADERS) whose block is
/// `hpack`; the first byte of the answer's header block on stream 1 (`0x88` = 200,
/// `0x8c` = 400: HPACK's static table).
fn h2_by_hand(addr: std::net::SocketAddr, hpack: &[u8]) -> Option<u8> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend([0, 0, 0, 4, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&(hpack.len() as u32).to_be_bytes()[1..]);
    out.extend([1, 0x5, 0, 0, 0, 1]);
    out.extend_from_slice(hpack);
    s.write_all(&out).unwrap();
    loop {
        let (kind, _, stream, payload) = read_h2_frame(&mut s)?;
        if kind == 1 && stream == 1 {
            return payload.first().copied();
        }
        if kind == 3 || kind == 7 {
            return None; // RST_STREAM, GOAWAY
        }
    }
}

#[test]
fn an_h2_request_with_neither_authority_nor_host_gets_400() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &["--health-interval", "60s"]);
    // :method GET, :scheme http, :path "/x": no :authority, no host.
    let bare = [0x82, 0x86, 0x44, 0x02, b'/', b'x'];
    assert_eq!(h2_by_hand(f.proxy, &bare), Some(0x8c), "400");
    assert_eq!(a.requests(), 0, "nothing reached the backend");
    // With a host field it goes through.
    let mut with_host = bare.to_vec();
    with_host.extend([0x40, 4]);
    with_host.extend_from_slice(b"host");
    with_host.push(6);
    with_host.extend_from_slice(b"h.test");
    assert_eq!(h2_by_hand(f.proxy, &with_host), Some(0x88), "200");
    assert_eq!(a.requests(), 1);
}

#[test]
fn only_websocket_is_tunnelled_and_an_h2c_upgrade_goes_on_as_plain_http() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &["--health-interval", "60s"]);
    // h2c smuggling: the Upgrade and its Connection token never reach the backend.
    let (r, _) = exchange(
        &f,
        b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings, close\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
    );
    let h = a.stats.last_headers.lock().unwrap().clone().unwrap();
    assert!(h.get("upgrade").is_none(), "{h:?}");
    assert!(h.get("http2-settings").is_none(), "{h:?}");
    assert!(
        !r.starts_with("HTTP/1.1 101"),
        "no tunnel: {}",
        &r[..r.len().min(200)]
    );
    // A websocket upgrade still is one.
    let (r, _) = exchange(
        &f,
        b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    );
    assert!(r.starts_with("HTTP/1.1 101"), "{r}");
    // upgrade_protocols names the list: without websocket, no tunnel either.
    let g = Fulcrum::over(
        &[&a],
        &[
            "--health-interval",
            "60s",
            "--upgrade-protocols",
            "x-custom",
        ],
    );
    let (r, _) = exchange(
        &g,
        b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    );
    assert!(!r.starts_with("HTTP/1.1 101"), "{}", &r[..r.len().min(200)]);
    let h = a.stats.last_headers.lock().unwrap().clone().unwrap();
    assert!(h.get("upgrade").is_none(), "{h:?}");
}

/// A backend that answers every request, written by hand: `200`, a length of 2, the
/// header `fields` given, and `ok`.
fn answering_backend(fields: impl Iterator<Item = (String, String)>) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let mut head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n".to_vec();
    for (n, v) in fields {
        head.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
    }
    head.extend_from_slice(b"\r\nok");
    let head = std::sync::Arc::new(head);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let head = std::sync::Arc::clone(&head);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = s.write_all(&head);
            });
        }
    });
    addr
}

/// A backend that answers every request with a head of `fields` header lines.
fn many_fields_backend(fields: usize) -> std::net::SocketAddr {
    answering_backend((0..fields).map(|i| (format!("x-f{i}"), "v".to_string())))
}

#[test]
fn a_backend_answer_over_the_field_limit_is_a_502_with_a_reason() {
    let addr = many_fields_backend(140);
    let backend = format!("http://{addr},name=wide");
    let f = Fulcrum::start(&[
        "--backend",
        &backend,
        "--health-interval",
        "60s",
        "--retries",
        "0",
    ]);
    for request in [
        &b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
    ] {
        let (r, _) = exchange(&f, request);
        assert!(r.starts_with("HTTP/1.1 502"), "{}", &r[..r.len().min(200)]);
    }
    let line = f.log_line(
        &["over the limits (128 header fields"],
        Duration::from_secs(2),
    );
    assert!(line.is_some(), "a log line says why:\n{}", f.log());
    let m = raw_exchange(
        f.admin,
        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        Duration::from_secs(3),
    );
    let counted = m
        .lines()
        .find(|l| {
            l.starts_with("fulcrum_bad_responses_total")
                && l.contains("reason=\"head_too_large\"")
                && l.contains("backend=\"wide\"")
        })
        .unwrap_or_else(|| panic!("{m}"));
    assert!(counted.ends_with(" 2"), "{counted}");
    // Within the limit (120 lines and the length) the answer passes, on both paths.
    let addr = many_fields_backend(120);
    let backend = format!("http://{addr}");
    let g = Fulcrum::start(&["--backend", &backend, "--health-interval", "60s"]);
    for request in [
        &b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
    ] {
        let (r, _) = exchange(&g, request);
        assert!(r.starts_with("HTTP/1.1 200"), "{}", &r[..r.len().min(200)]);
    }
}

/// Reads frames until the connection ends; the error code of its GOAWAY, if one came.
fn goaway_code(s: &mut std::net::TcpStream) -> Option<u32> {
    let mut code = None;
    while let Some((kind, _, _, payload)) = read_h2_frame(s) {
        if kind == 7 && payload.len() >= 8 {
            code = Some(u32::from_be_bytes([
                payload[4], payload[5], payload[6], payload[7],
            ]));
        }
    }
    code
}

/// An HPACK block: `:method GET`, `:scheme http`, `:path /`, `:authority a`.
const GET_A: [u8; 6] = [0x82, 0x86, 0x84, 0x41, 0x01, b'a'];

/// A backend, fulcrum in front of it, and a connection to fulcrum with the start of an
/// HTTP/2 conversation to send (the preface and empty SETTINGS).
fn h2_flood_target() -> (TestBackend, Fulcrum, std::net::TcpStream, Vec<u8>) {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &["--health-interval", "60s"]);
    let s = std::net::TcpStream::connect(f.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(4, 0, 0, &[]));
    (a, f, s, out)
}

/// HTTP/2 rapid reset (CVE-2023-44487): a client that opens streams and cancels each
/// at once makes the backend do nothing for most of them, and its connection is
/// closed with `ENHANCE_YOUR_CALM`; other clients go on being served.
#[test]
fn an_h2_rapid_reset_flood_is_cut_off_and_costs_the_backend_nothing() {
    use std::io::Write;
    let (a, f, mut s, mut out) = h2_flood_target();
    let cancel = 8u32.to_be_bytes();
    let streams = 10_000u32;
    for i in 0..streams {
        let id = 1 + 2 * i;
        out.extend(h2_frame(1, 0x5, id, &GET_A));
        out.extend(h2_frame(3, 0, id, &cancel));
    }
    let before = rss_kib(f.child.id());
    // The server may close before it has read it all.
    let _ = s.write_all(&out);
    assert_eq!(
        goaway_code(&mut s),
        Some(0xb),
        "GOAWAY with ENHANCE_YOUR_CALM"
    );
    assert!(
        a.requests() < 200,
        "{} of {streams} cancelled streams reached the backend",
        a.requests()
    );
    let grown = rss_kib(f.child.id()).saturating_sub(before);
    assert!(grown < 16 * 1024, "RSS grew by {grown} KiB");
    let ok = client_get(&f, "/after");
    assert_eq!(ok, 200);
}

/// A client that sends PINGs without end and never reads their answers (CVE-2019-9512)
/// is cut off once a thousand answers wait unwritten: the connection closes, memory does
/// not follow the flood, and other clients go on being served.
#[test]
fn an_h2_ping_flood_that_is_never_read_closes_its_connection() {
    use std::io::{Read, Write};
    let (a, f, mut s, mut out) = h2_flood_target();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&out).unwrap();
    out.clear();
    for _ in 0..4096 {
        out.extend(h2_frame(6, 0, 0, b"pingping"));
    }
    let before = rss_kib(f.child.id());
    let mut sent = 0usize;
    while sent < 64 << 20 {
        if s.write_all(&out).is_err() {
            break;
        }
        sent += out.len();
    }
    assert!(sent < 64 << 20, "the server read 64 MiB of PINGs");
    // Whatever answers were written before, the connection ends.
    let mut rest = Vec::new();
    let end = s.read_to_end(&mut rest);
    assert!(
        end.is_ok()
            || end
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the connection was not closed: {end:?}"
    );
    after_flood(&a, &f, before, sent);
}

/// A header block that never ends (CONTINUATION frames without END_HEADERS) is cut off:
/// the connection is closed long before the 32 MiB the client would send, memory does
/// not follow what the client sends, and other clients go on being served.
#[test]
fn an_endless_continuation_flood_closes_its_connection() {
    use std::io::Write;
    let (a, f, mut s, mut out) = h2_flood_target();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    out.extend(h2_frame(1, 0x1, 1, &GET_A));
    s.write_all(&out).unwrap();
    // CONTINUATION frames of 16 KiB, up to 32 MiB, each field a literal without
    // indexing with a new name: 100 bytes of name, 100 of value.
    let mut field = vec![0x00, 100];
    field.extend(std::iter::repeat_n(b'x', 100));
    field.push(100);
    field.extend(std::iter::repeat_n(b'y', 100));
    let mut block = Vec::new();
    while block.len() + field.len() <= 16 * 1024 {
        block.extend_from_slice(&field);
    }
    let frame = h2_frame(9, 0, 1, &block);
    let before = rss_kib(f.child.id());
    let mut sent = 0usize;
    let refused = loop {
        if sent >= 32 << 20 {
            break None;
        }
        if let Err(e) = s.write_all(&frame) {
            break Some(e.kind());
        }
        sent += frame.len();
    };
    // Closed by the server, not stalled: a write that timed out would be a server that
    // stopped reading and kept the connection.
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
    assert!(
        matches!(refused, Some(BrokenPipe | ConnectionReset)),
        "after {sent} bytes: {refused:?}"
    );
    let code = goaway_code(&mut s);
    // What the client wrote before the close includes what the kernel's buffers took.
    assert!(
        sent < 16 << 20,
        "{sent} bytes taken before the close (GOAWAY {code:?})"
    );
    after_flood(&a, &f, before, sent);
}

/// What a flood must leave behind: RSS grown under 16 MiB since `before` (KiB), nothing
/// at the backend, and other clients served.
fn after_flood(a: &TestBackend, f: &Fulcrum, before: u64, sent: usize) {
    let grown = rss_kib(f.child.id()).saturating_sub(before);
    assert!(
        grown < 16 * 1024,
        "RSS grew by {grown} KiB after {sent} bytes"
    );
    assert_eq!(a.requests(), 0);
    assert_eq!(client_get(f, "/after"), 200);
}

/// The status of a plain GET through `f`.
fn client_get(f: &Fulcrum, path: &str) -> u16 {
    let text = common::raw_exchange(
        f.proxy,
        format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").as_bytes(),
        Duration::from_secs(5),
    );
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}
