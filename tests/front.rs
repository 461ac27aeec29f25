//! The client side's HTTP/1.1 fast path (`src/front.rs`) on raw sockets: keep-alive,
//! pipelining, `Connection: close`, HEAD, `Date`, and a connection that leaves the fast
//! path for hyper in the middle (a request with a body) and keeps working.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;

/// Sends `raw` on one connection and reads until the server closes it.
fn exchange(f: &Fulcrum, raw: &str) -> String {
    raw_exchange(f.proxy, raw.as_bytes(), Duration::from_secs(5))
}

/// The answers in `text`, in order: (status line, head, body as far as the next answer).
fn answers(text: &str) -> Vec<(String, String)> {
    text.split("HTTP/1.1 ")
        .skip(1)
        .map(|a| {
            let (head, body) = a.split_once("\r\n\r\n").unwrap_or((a, ""));
            (head.to_ascii_lowercase(), body.to_string())
        })
        .collect()
}

/// The status codes of the answers in `text`, in order.
fn codes(text: &str) -> Vec<String> {
    answers(text)
        .iter()
        .map(|(h, _)| h[..3].to_string())
        .collect()
}

#[test]
fn pipelined_requests_are_answered_in_order_and_close_is_honoured() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &[]);
    // Three requests in one write: two plain, the last asks to close.
    let out = exchange(
        &f,
        "GET /status/201 HTTP/1.1\r\nHost: x\r\n\r\n\
         GET /status/202 HTTP/1.1\r\nHost: x\r\n\r\n\
         GET /status/203 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(codes(&out), ["201", "202", "203"], "{out}");
    let got = answers(&out);
    for (head, body) in &got {
        assert!(head.contains("\r\ndate: "), "{head}");
        assert!(
            head.contains("\r\ncontent-length: 1\r\n") || head.ends_with("content-length: 1"),
            "{head}"
        );
        assert_eq!(body.trim_end_matches("HTTP/1.1 "), "A");
    }
    // Only the last says it closes; the server then did close (the read ended).
    assert!(!got[0].0.contains("connection: close"));
    assert!(got[2].0.contains("connection: close"), "{}", got[2].0);
}

#[test]
fn head_answers_carry_the_length_and_no_body_and_the_connection_goes_on() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &[]);
    let out = exchange(
        &f,
        "HEAD /big/5000 HTTP/1.1\r\nHost: x\r\n\r\n\
         GET /big/3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let got = answers(&out);
    assert_eq!(got.len(), 2, "{out}");
    assert!(got[0].0.contains("content-length: 5000"), "{}", got[0].0);
    assert_eq!(got[0].1, "", "a HEAD answer has no body");
    assert!(got[1].0.contains("content-length: 3"), "{}", got[1].0);
    assert_eq!(got[1].1, "xxx");
}

#[test]
fn a_request_with_a_body_moves_the_connection_to_hyper_mid_way() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &[]);
    let out = exchange(
        &f,
        "GET /status/200 HTTP/1.1\r\nHost: x\r\n\r\n\
         POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\
         GET /status/204 HTTP/1.1\r\nHost: x\r\n\r\n\
         GET /status/200 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(codes(&out), ["200", "200", "204", "200"], "{out}");
    let got = answers(&out);
    assert!(got[1].1.contains("hello"), "{out}");
    assert_eq!(a.requests(), 4);
}

/// A client that goes away while its request waits for the backend: the request is
/// dropped (the backend's count returns to zero), and the proxy keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_request_frees_it() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &[]);
    let c = client();
    let mut s = TcpStream::connect(f.proxy).unwrap();
    s.write_all(b"GET /sleep/10000 HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            active_conns(&c, &f).await["A"] == 1
        })
        .await
    );
    drop(s);
    assert!(
        eventually(Duration::from_secs(3), || async {
            active_conns(&c, &f).await["A"] == 0
        })
        .await
    );
    assert_eq!(get(&c, &f.url("/status/200")).await.status, 200);
    // And a request cut off in the middle of its head is no request at all.
    let mut s = TcpStream::connect(f.proxy).unwrap();
    s.write_all(b"GET /status/200 HTTP/1.1\r\nHo").unwrap();
    drop(s);
    let mut s = TcpStream::connect(f.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /status/200 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
}

/// Requests sent and then the client's half of the connection closed (`nc -N`): every
/// request already sent is answered before the proxy closes its half.
#[test]
fn requests_before_a_half_close_are_all_answered() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &[]);
    let mut s = TcpStream::connect(f.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(
        b"GET /sleep/200 HTTP/1.1\r\nHost: x\r\n\r\n\
          GET /status/202 HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert_eq!(codes(&out), ["200", "202"], "{out}");
}

/// A stop signal while a request head is only half sent: the request, completed
/// afterwards and handed to hyper (it has a body), is still answered — with
/// `connection: close` — before the process exits.
#[test]
fn a_request_completed_after_the_stop_signal_is_answered() {
    let a = TestBackend::start("A");
    let mut f = Fulcrum::over(&[&a], &[]);
    let mut s = TcpStream::connect(f.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    f.signal("TERM");
    std::thread::sleep(Duration::from_millis(300));
    s.write_all(b"Content-Length: 5\r\n\r\nhello").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out:?}");
    assert!(
        out.to_ascii_lowercase().contains("connection: close"),
        "{out}"
    );
    assert!(out.contains("hello"), "{out}");
    assert!(f
        .wait_exit(Duration::from_secs(10))
        .is_some_and(|st| st.success()));
}
