//! HTTP/3 from clients (`docs/tls.md`, "HTTP/3") over real sockets: quinn and h3 as the
//! client, with certificates made at test time, through fulcrum to real backends.

mod common;

use std::time::Duration;

use bytes::{Buf as _, Bytes};

use common::h3::*;
use common::tls::*;
use common::*;

/// The HTTP/3 error code `conn` was closed with, within 10 s.
async fn close_code(conn: &quinn::Connection) -> Option<u64> {
    close_of(conn).await.map(|(code, _)| code)
}

/// The HTTP/3 error code and reason `conn` was closed with, within 10 s.
async fn close_of(conn: &quinn::Connection) -> Option<(u64, String)> {
    let closed = tokio::time::timeout(Duration::from_secs(10), conn.closed()).await;
    match closed {
        Ok(quinn::ConnectionError::ApplicationClosed(c)) => Some((
            c.error_code.into_inner(),
            String::from_utf8_lossy(&c.reason).into_owned(),
        )),
        _ => None,
    }
}

fn h3_fulcrum(pki: &Pki, tag: &str, extra: &[&str]) -> (Fulcrum, std::net::SocketAddr) {
    let cfg = config_file(
        "h3",
        tag,
        &format!(
            "tls_listen = \"127.0.0.1:0\"\n[tls]\nhttp3 = true\n[[tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\n",
            pki.arg("a.pem"),
            pki.arg("a.key")
        ),
    );
    let mut args = vec!["--config", cfg.to_str().unwrap()];
    args.extend_from_slice(extra);
    let f = Fulcrum::start(&args);
    let addr = https_addr(&f);
    (f, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h3_get_and_a_10_mb_post_arrive_whole_and_tls_answers_advertise_h3() {
    let pki = Pki::new("h3-basic");
    pki.leaf("a", &["a.test"]);
    let b = TestBackend::start("B1");
    let (f, addr) = h3_fulcrum(&pki, "basic", &["--backend", &b.spec()]);

    // Over TLS (HTTP/1.1), the answer says where HTTP/3 is.
    let mut h1 = h1_over_tls(&pki, addr, "a.test").await;
    let req = http::Request::get("/")
        .header("host", "a.test")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let rsp = h1.send_request(req).await.unwrap();
    let want = format!("h3=\":{}\"; ma=86400", addr.port());
    assert_eq!(rsp.headers()["alt-svc"], want.as_str());
    http_body_util::BodyExt::collect(rsp.into_body())
        .await
        .unwrap();
    h1.ready().await.unwrap();
    // A backend's own Alt-Svc (its services, not this origin's) is replaced.
    let req = http::Request::get("/alt-svc")
        .header("host", "a.test")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let rsp = h1.send_request(req).await.unwrap();
    let all: Vec<_> = rsp.headers().get_all("alt-svc").iter().collect();
    assert_eq!(all, [want.as_str()]);

    let mut h3 = h3_client(addr, "a.test", &pki.ca_der()).await;
    let (status, headers, body) = h3_request(&mut h3, "GET", "https://a.test/hello", None).await;
    assert_eq!(status, 200);
    assert_eq!(body, b"B1");
    assert_eq!(headers["x-backend"], "B1");
    assert!(
        headers.get("alt-svc").is_none(),
        "an h3 answer needs no Alt-Svc"
    );
    let (_, headers, _) = h3_request(&mut h3, "GET", "https://a.test/alt-svc", None).await;
    assert!(headers.get("alt-svc").is_none(), "nor the backend's");
    assert!(headers.get("x-request-id").is_some());

    // 10 MB up and back through /echo, whole and in order.
    let upload: Vec<u8> = (0..10_000_000u32).map(|i| (i % 251) as u8).collect();
    let (status, _, echoed) = h3_request(
        &mut h3,
        "POST",
        "https://a.test/echo",
        Some(Bytes::from(upload.clone())),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(echoed.len(), upload.len());
    assert!(echoed == upload, "the body came back changed");
    // Without a length: streamed upstream chunked, the end found by reading.
    let mut req = http::Request::post("https://a.test/echo").body(()).unwrap();
    req.headers_mut().remove("content-length");
    let mut stream = h3.send_request(req).await.unwrap();
    for _ in 0..10 {
        stream
            .send_data(Bytes::from(vec![7u8; 10_000]))
            .await
            .unwrap();
    }
    stream.finish().await.unwrap();
    assert_eq!(stream.recv_response().await.unwrap().status(), 200);
    let mut n = 0;
    while let Some(chunk) = stream.recv_data().await.unwrap() {
        n += chunk.remaining();
    }
    assert_eq!(n, 100_000);
    // HEAD: the head only.
    let (status, _, body) = h3_request(&mut h3, "HEAD", "https://a.test/hello", None).await;
    assert_eq!(status, 200);
    assert!(body.is_empty());
    let line = f.log_line(
        &["protocol=h3", "path=/echo", "status=200"],
        Duration::from_secs(3),
    );
    assert!(line.is_some(), "the access log names h3:\n{}", f.log());
    // The metrics and the status count requests by protocol.
    let c = client();
    let metrics = get(&c, &f.admin_url("/metrics")).await.text();
    let h3_count = metrics
        .lines()
        .find_map(|l| l.strip_prefix("fulcrum_client_requests_total{protocol=\"h3\"} "))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(h3_count.is_some_and(|n| n >= 4), "{metrics}");
    let status = get(&c, &f.admin_url("/admin/status")).await.json();
    assert!(status["protocols"]["h3"].as_u64() >= Some(4), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h3_request_follows_a_strategy_switch_and_a_drain() {
    let pki = Pki::new("h3-switch");
    pki.leaf("a", &["a.test"]);
    let (b1, b2) = (TestBackend::start("B1"), TestBackend::start("B2"));
    let (f, addr) = h3_fulcrum(
        &pki,
        "switch",
        &["--backend", &b1.spec(), "--backend", &b2.spec()],
    );
    let mut h3 = h3_client(addr, "a.test", &pki.ca_der()).await;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let (_, _, body) = h3_request(&mut h3, "GET", "https://a.test/", None).await;
        seen.insert(String::from_utf8(body).unwrap());
    }
    assert_eq!(seen.len(), 2, "round robin over both: {seen:?}");
    let c = client();
    let r = set_strategy(&c, &f, "consistent_hash").await;
    assert_eq!(r.status, 200);
    let mut one = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let (_, _, body) = h3_request(&mut h3, "GET", "https://a.test/same", None).await;
        one.insert(String::from_utf8(body).unwrap());
    }
    assert_eq!(
        one.len(),
        1,
        "one key, one backend after the switch: {one:?}"
    );
    // Draining B1: new h3 requests go to B2 only.
    let r = admin(
        &c,
        "PATCH",
        &f.admin_url("/admin/backends/0"),
        r#"{"state":"draining"}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    set_strategy(&c, &f, "round_robin").await;
    for _ in 0..4 {
        let (_, _, body) = h3_request(&mut h3, "GET", "https://a.test/", None).await;
        assert_eq!(body, b"B2");
    }
}

#[test]
fn http3_without_tls_listen_or_on_a_taken_udp_port_exits_2() {
    let base = ["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"];
    let backend = ["--backend", "http://127.0.0.1:1", "--http3", "on"];
    let (status, _, err) = run_fulcrum(&[&base[..], &backend[..]].concat());
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("http3") && err.contains("tls_listen"), "{err}");

    let pki = Pki::new("h3-taken");
    pki.leaf("a", &["a.test"]);
    let (cert, key) = (pki.arg("a.pem"), pki.arg("a.key"));
    // The UDP port taken; its TCP twin free (another test's connection may hold it for
    // a moment: then another port is tried).
    for _ in 0..5 {
        let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let listen = format!("127.0.0.1:{}", taken.local_addr().unwrap().port());
        let tls = [
            "--tls-listen",
            &listen,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ];
        let (status, _, err) = run_fulcrum(&[&base[..], &backend[..], &tls[..]].concat());
        assert_eq!(status.code(), Some(2), "{err}");
        if err.contains("(tls_listen)") {
            continue;
        }
        assert!(err.contains("http3, udp") && err.contains(&listen), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        return;
    }
    panic!("no port free for TCP whose UDP twin could be taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_a_stop_an_h3_request_in_flight_finishes_and_its_connection_closes_cleanly() {
    let pki = Pki::new("h3-stop");
    pki.leaf("a", &["a.test"]);
    let a = TestBackend::start("A");
    let (mut f, addr) = h3_fulcrum(&pki, "stop", &["--backend", &a.spec()]);
    let (mut h3, quic) = h3_connection(addr, "a.test", &pki.ca_der()).await;
    let mut slow = h3.clone();
    let in_flight = tokio::spawn(async move {
        h3_request(&mut slow, "GET", "https://a.test/sleep/800", None).await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    f.signal("TERM");
    let (status, _, body) = in_flight.await.unwrap();
    assert_eq!(
        (status, &body[..]),
        (200, &b"A"[..]),
        "the request in flight is answered"
    );
    // GOAWAY, then the close once nothing is in flight: HTTP/3's NO_ERROR.
    assert_eq!(close_code(&quic).await, Some(0x100));
    let refused = h3
        .send_request(http::Request::get("https://a.test/").body(()).unwrap())
        .await;
    assert!(refused.is_err(), "no new request after the stop");
    let st = tokio::task::block_in_place(|| f.wait_exit(Duration::from_secs(10)));
    assert_eq!(st.and_then(|s| s.code()), Some(0), "{}", f.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_h3_connection_is_closed_with_goaway_after_the_idle_timeout() {
    let pki = Pki::new("h3-idle");
    pki.leaf("a", &["a.test"]);
    let a = TestBackend::start("A");
    let (_f, addr) = h3_fulcrum(&pki, "idle", &["--backend", &a.spec()]);
    // Its client pings every second: QUIC's own idle timeout never fires, and a PING is
    // not a request.
    let ping = Some(Duration::from_secs(1));
    let (mut h3, quic) = h3_connection_with(addr, "a.test", &pki.ca_der(), ping).await;
    let t = std::time::Instant::now();
    let (status, _, _) = h3_request(&mut h3, "GET", "https://a.test/one", None).await;
    assert_eq!(status, 200);
    let closed = tokio::time::timeout(Duration::from_secs(14), quic.closed()).await;
    match closed {
        Ok(quinn::ConnectionError::ApplicationClosed(c)) => {
            assert_eq!(c.error_code.into_inner(), 0x100, "H3_NO_ERROR")
        }
        other => panic!("closed by fulcrum within the idle timeout: {other:?}"),
    }
    assert!(
        t.elapsed() >= Duration::from_secs(9),
        "not before it: {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_hands_the_udp_socket_over_and_closes_open_quic_connections() {
    let pki = Pki::new("h3-upgrade");
    pki.leaf("a", &["a.test"]);
    let a = TestBackend::start("A");
    let dir = std::env::temp_dir().join(format!("fulcrum-h3-upgrade-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("upgrade.sock");
    let base = [
        "--backend",
        &a.spec(),
        "--upgrade-socket",
        sock.to_str().unwrap(),
        "--workers",
        "2",
    ];
    let (mut old, addr) = h3_fulcrum(&pki, "upgrade-old", &base);
    let (mut h3, quic) = h3_connection(addr, "a.test", &pki.ca_der()).await;
    let (status, _, _) = h3_request(&mut h3, "GET", "https://a.test/", None).await;
    assert_eq!(status, 200);
    // A slow HTTP/1.1 request keeps the old process draining while new QUIC clients come.
    let proxy = old.proxy;
    let slow = std::thread::spawn(move || {
        raw_exchange(
            proxy,
            b"GET /sleep/2500 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            Duration::from_secs(10),
        )
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (new, new_addr) = h3_fulcrum(&pki, "upgrade-new", &[&base[..], &["--upgrade"]].concat());
    assert_eq!(new_addr, addr, "the same port");
    // The connection open at the hand-over was closed by the old process, saying why.
    assert_eq!(close_of(&quic).await, Some((0x100, "upgrade".to_string())));
    // While the old process still drains, every new connection on the UDP port is the
    // new one's: a datagram read by the old one would be refused or lost.
    for _ in 0..5 {
        let served = tokio::time::timeout(Duration::from_secs(3), async {
            let mut h3 = h3_client(addr, "a.test", &pki.ca_der()).await;
            h3_request(&mut h3, "GET", "https://a.test/", None).await
        })
        .await
        .expect("a new QUIC connection served within 3 s");
        assert_eq!((served.0, &served.2[..]), (200, &b"A"[..]));
    }
    assert!(
        old.child.try_wait().unwrap().is_none(),
        "the old process still drains"
    );
    assert!(slow.join().unwrap().starts_with("HTTP/1.1 200"));
    let st = tokio::task::block_in_place(|| old.wait_exit(Duration::from_secs(15)));
    assert_eq!(st.and_then(|s| s.code()), Some(0), "{}", old.log());
    assert!(new.log().contains("upgrade: serving"), "{}", new.log());
}

/// A client that opens streams and cancels each at once (HTTP/3's rapid reset): its
/// connection is closed with H3_EXCESSIVE_LOAD, the backend sees few of its requests,
/// memory does not follow, and other clients are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h3_flood_of_cancelled_streams_closes_its_connection() {
    let pki = Pki::new("h3-resets");
    pki.leaf("a", &["a.test"]);
    let a = TestBackend::start("A");
    let (f, addr) = h3_fulcrum(
        &pki,
        "resets",
        &["--backend", &a.spec(), "--access-log", "off"],
    );
    let (mut h3, quic) = h3_connection(addr, "a.test", &pki.ca_der()).await;
    let before = rss_kib(f.child.id());
    let streams = 5_000;
    let mut opened = 0;
    for _ in 0..streams {
        let req = http::Request::get("https://a.test/").body(()).unwrap();
        // Bounded: a server that never cut the flood off would leave no stream credit.
        let opening = tokio::time::timeout(Duration::from_secs(10), h3.send_request(req));
        let Ok(Ok(mut s)) = opening.await else {
            break;
        };
        s.stop_stream(::h3::error::Code::H3_REQUEST_CANCELLED);
        s.stop_sending(::h3::error::Code::H3_REQUEST_CANCELLED);
        opened += 1;
    }
    assert!(
        opened < streams,
        "all {streams} streams opened: never cut off"
    );
    assert_eq!(close_code(&quic).await, Some(0x107), "H3_EXCESSIVE_LOAD");
    assert!(
        a.requests() < 300,
        "{} of {opened} cancelled streams reached the backend",
        a.requests()
    );
    let grown = rss_kib(f.child.id()).saturating_sub(before);
    assert!(grown < 16 * 1024, "RSS grew by {grown} KiB");
    let mut other = h3_client(addr, "a.test", &pki.ca_der()).await;
    let (status, _, _) = h3_request(&mut other, "GET", "https://a.test/", None).await;
    assert_eq!(status, 200);
}

/// gRPC over HTTP/3 to an HTTP/2 backend: the answer's trailers (`grpc-status`) reach the
/// HTTP/3 client after its data, and the client's own trailers reach the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_h3_to_an_h2_backend_passes_trailers_both_ways() {
    let pki = Pki::new("h3-grpc");
    pki.leaf("a", &["a.test"]);
    let backend = H2Backend::plain("grpc");
    let url = format!("http://127.0.0.1:{}", backend.addr.port());
    let (_f, addr) = h3_fulcrum(&pki, "grpc", &["--backend", &url, "--protocol", "h2"]);
    let mut h3 = h3_client(addr, "a.test", &pki.ca_der()).await;
    // A streaming answer: five chunks, then its trailers.
    let req = http::Request::post("https://a.test/stream/5")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("content-length", "0")
        .body(())
        .unwrap();
    let mut stream = h3.send_request(req).await.unwrap();
    stream.finish().await.unwrap();
    assert_eq!(stream.recv_response().await.unwrap().status(), 200);
    let mut data = Vec::new();
    while let Some(mut chunk) = stream.recv_data().await.unwrap() {
        data.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
    }
    assert_eq!(String::from_utf8_lossy(&data).lines().count(), 5);
    let t = stream.recv_trailers().await.unwrap().expect("trailers");
    assert_eq!(t["grpc-status"], "0");
    assert_eq!(t["grpc-message"], "ok");
    // The client's trailers reach the backend, which sends them back.
    let req = http::Request::post("https://a.test/echo")
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let mut stream = h3.send_request(req).await.unwrap();
    stream
        .send_data(Bytes::from_static(b"payload"))
        .await
        .unwrap();
    let mut mine = http::HeaderMap::new();
    mine.insert("x-checksum", "abc".parse().unwrap());
    stream.send_trailers(mine).await.unwrap();
    stream.finish().await.unwrap();
    assert_eq!(stream.recv_response().await.unwrap().status(), 200);
    let mut data = Vec::new();
    while let Some(mut chunk) = stream.recv_data().await.unwrap() {
        data.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
    }
    assert_eq!(data, b"payload");
    let t = stream.recv_trailers().await.unwrap().expect("trailers");
    assert_eq!(t["x-checksum"], "abc");
    assert_eq!(t["grpc-status"], "0");
}

/// A client that stops reading its answers (STOP_SENDING) while the backend still
/// thinks: the backend exchanges end within a second, as an h2 RST_STREAM ends them,
/// and the connection serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sending_ends_the_backend_exchange_within_a_second() {
    let pki = Pki::new("h3-stop");
    pki.leaf("a", &["a.test"]);
    let a = TestBackend::start("A");
    let (f, addr) = h3_fulcrum(&pki, "stop", &["--backend", &a.spec()]);
    let c = client();
    let (mut h3, _quic) = h3_connection(addr, "a.test", &pki.ca_der()).await;
    let mut streams = Vec::new();
    for _ in 0..20 {
        let req = http::Request::get("https://a.test/sleep/6000")
            .body(())
            .unwrap();
        let mut s = h3.send_request(req).await.unwrap();
        s.finish().await.unwrap();
        streams.push(s);
    }
    let all_in = eventually(Duration::from_secs(3), || async {
        active_conns(&c, &f).await["A"] == 20
    })
    .await;
    assert!(all_in, "{:?}", active_conns(&c, &f).await);
    for s in &mut streams {
        s.stop_sending(::h3::error::Code::H3_REQUEST_CANCELLED);
    }
    let t = std::time::Instant::now();
    let freed = eventually(Duration::from_secs(3), || async {
        active_conns(&c, &f).await["A"] == 0
    })
    .await;
    assert!(
        freed && t.elapsed() < Duration::from_secs(1),
        "{:?} after {:?}",
        active_conns(&c, &f).await,
        t.elapsed()
    );
    let (status, _, _) = h3_request(&mut h3, "GET", "https://a.test/", None).await;
    assert_eq!(status, 200);
}
