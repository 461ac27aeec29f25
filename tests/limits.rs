//! The limits a client cannot talk its way past (`docs/operations.md`, "Limits"), over
//! real sockets: a reader that stops taking an answer (`send_timeout`) on every front
//! end, a request body over `max_request_body`, and an HTTP/2 connection that opens no
//! stream.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};

use common::*;

/// 64 MiB: more than the kernel buffers between a backend, fulcrum and a client can hold.
const HUGE: &str = "/big/67108864";

/// Waits until `n` requests are in flight to the backends of `f`.
async fn until_requests_in_flight(f: &Fulcrum, n: u64, limit: Duration) -> bool {
    let c = client();
    eventually(limit, || async {
        active_conns(&c, f).await.values().sum::<u64>() == n
    })
    .await
}

/// An HTTP/2 connection by prior knowledge to `f` whose client pings every second (so
/// that its connection is never silent), driven on its own task.
async fn pinging_h2(
    f: &Fulcrum,
) -> (
    hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
) {
    let tcp = tokio::net::TcpStream::connect(f.proxy).await.unwrap();
    let (h2, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(Duration::from_secs(1))
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    (h2, tokio::spawn(conn))
}

/// Waits until no request to any backend of `f` is in flight; how long it took.
async fn until_no_request_in_flight(f: &Fulcrum, limit: Duration) -> Option<Duration> {
    let c = client();
    let t = Instant::now();
    while t.elapsed() < limit {
        if active_conns(&c, f).await.values().all(|&n| n == 0) {
            return Some(t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Reads `s` to its end (or an error), at most `limit`; whether it ended.
fn ends_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let t = Instant::now();
    let mut buf = vec![0u8; 1 << 20];
    while t.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return true,
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_closed_after_the_send_timeout() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &["--send-timeout", "1s", "--health-interval", "60s"]);
    let proxy = f.proxy;
    // The fast path (a GET) and hyper's HTTP/1.1 (a request with a body).
    for request in [
        format!("GET {HUGE} HTTP/1.1\r\nHost: h\r\n\r\n"),
        format!("POST {HUGE} HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\nx"),
    ] {
        let mut s = TcpStream::connect(proxy).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        assert!(
            until_requests_in_flight(&f, 1, Duration::from_secs(5)).await,
            "{request:?} reaches the backend"
        );
        let freed = until_no_request_in_flight(&f, Duration::from_secs(10)).await;
        assert!(
            freed.is_some_and(|d| d >= Duration::from_millis(900)),
            "{request:?}: the backend's slot is freed after the send timeout ({freed:?})"
        );
        let ended =
            tokio::task::spawn_blocking(move || ends_within(&mut s, Duration::from_secs(10)))
                .await
                .unwrap();
        assert!(ended, "{request:?}: the connection is closed");
    }
    // HTTP/2: a stream the client gives no window to, while it pings.
    let (mut h2, conn) = pinging_h2(&f).await;
    let req = http::Request::get(format!("http://h.test{HUGE}"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let freed = until_no_request_in_flight(&f, Duration::from_secs(10)).await;
    assert!(freed.is_some(), "h2: the backend's slot is freed");
    let ended = tokio::time::timeout(Duration::from_secs(10), conn).await;
    assert!(ended.is_ok(), "h2: the connection is closed");
    drop(resp);
    // A reader that takes the answer, however slowly, is not cut.
    let mut s = TcpStream::connect(proxy).unwrap();
    s.write_all(b"GET /big/4194304 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        .unwrap();
    let got = tokio::task::spawn_blocking(move || {
        let mut n = 0;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            std::thread::sleep(Duration::from_millis(100));
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return n,
                Ok(k) => n += k,
            }
        }
    })
    .await
    .unwrap();
    assert!(got > 4_194_304, "the slow reader got it all: {got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_over_the_limit_gets_413() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(
        &[&a],
        &["--max-request-body", "1k", "--health-interval", "60s"],
    );
    let answer = |req: Vec<u8>| raw_exchange(f.proxy, &req, Duration::from_secs(5));
    // A stated length over the limit: refused before anything is forwarded.
    let mut req =
        b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 2000\r\nConnection: close\r\n\r\n"
            .to_vec();
    req.extend(vec![b'x'; 2000]);
    let r = answer(req);
    assert!(r.starts_with("HTTP/1.1 413"), "{r}");
    assert_eq!(a.requests(), 0);
    // A chunked body that grows over it: cut, 413.
    let mut req =
        b"POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            .to_vec();
    for _ in 0..4 {
        req.extend(b"200\r\n");
        req.extend(vec![b'y'; 512]);
        req.extend(b"\r\n");
    }
    req.extend(b"0\r\n\r\n");
    let r = answer(req);
    assert!(r.starts_with("HTTP/1.1 413"), "{r}");
    // At the limit it passes.
    let mut req =
        b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 1024\r\nConnection: close\r\n\r\n"
            .to_vec();
    req.extend(vec![b'z'; 1024]);
    let r = answer(req);
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains("x-body-len: 1024"), "{r}");
    // A pool sets its own.
    let cfg = config_file(
        "limits",
        "pool-body",
        &format!(
            "max_request_body = \"1m\"\n[[pools]]\nname = \"small\"\nmax_request_body = \"100\"\n[[pools.backends]]\nurl = \"{}\"\n[[routes]]\npool = \"small\"\n",
            a.url()
        ),
    );
    let g = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let mut req =
        b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 101\r\nConnection: close\r\n\r\n"
            .to_vec();
    req.extend(vec![b'x'; 101]);
    let r = raw_exchange(g.proxy, &req, Duration::from_secs(5));
    assert!(r.starts_with("HTTP/1.1 413"), "{r}");
}

#[test]
fn bad_limits_are_refused_with_their_name() {
    for (args, name) in [
        (&["--send-timeout", "0s"][..], "send_timeout"),
        (&["--send-timeout", "5"][..], "send_timeout"),
        (&["--max-request-body", "lots"][..], "max_request_body"),
        (
            &["--upgrade-protocols", "web socket"][..],
            "upgrade_protocols",
        ),
    ] {
        let mut all = vec!["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let (st, _, err) = run_fulcrum(&all);
        assert_eq!(st.code(), Some(2), "{args:?}: {err}");
        let flag = name.replace('_', "-");
        assert!(err.contains(name) || err.contains(&flag), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let cfg = config_file(
        "limits",
        "bad",
        "send_timeout = \"1s\"\nmax_request_body = \"1x\"\n",
    );
    let (st, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(
        err.contains("line 2") && err.contains("max_request_body"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_h2_connection_is_closed_with_goaway_after_the_idle_timeout() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &["--health-interval", "60s"]);
    // Its client pings every second: a PING is not a request.
    let (mut h2, conn) = pinging_h2(&f).await;
    let t = Instant::now();
    // One request, then nothing: the idle time counts from its end.
    let req = http::Request::get("http://h.test/one")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let _ = resp.into_body().collect().await;
    let ended = tokio::time::timeout(Duration::from_secs(14), conn).await;
    assert!(ended.is_ok(), "closed within the idle timeout");
    assert!(
        t.elapsed() >= Duration::from_secs(9),
        "not before it: {:?}",
        t.elapsed()
    );
    // The connection ended cleanly: a GOAWAY, not a reset.
    assert!(ended.unwrap().unwrap().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_tunnel_holds_its_connection_slot() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(
        &[&a],
        &["--max-connections", "2", "--health-interval", "60s"],
    );
    let upgrade =
        b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
    let tunnel = move |proxy| {
        let mut s = TcpStream::connect(proxy).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(upgrade).unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 101"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        );
        s
    };
    let proxy = f.proxy;
    let (first, second) = tokio::task::spawn_blocking(move || (tunnel(proxy), tunnel(proxy)))
        .await
        .unwrap();
    // Both slots are held by the tunnels: a third client waits in the kernel's queue.
    let third = tokio::task::spawn_blocking(move || {
        let t = Instant::now();
        let r = raw_exchange(
            proxy,
            b"GET /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            Duration::from_secs(10),
        );
        (r, t.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(first);
    let (r, waited) = third.await.unwrap();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(
        waited >= Duration::from_millis(1400),
        "served only once a tunnel closed: {waited:?}"
    );
    drop(second);
}
