//! Backends that answer in every way HTTP/1.1 allows (chunked, close-delimited, interim
//! answers, HEAD, closed keep-alive connections, broken or malformed answers), over real
//! sockets: the proxy must pass each through correctly and keep its accounting right.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

/// What a scripted backend does with one request.
struct Reply {
    /// Written in these pieces, with a short pause between them.
    pieces: Vec<Vec<u8>>,
    /// Close the connection afterwards.
    close: bool,
}

fn reply(text: &str, close: bool) -> Reply {
    Reply {
        pieces: vec![text.as_bytes().to_vec()],
        close,
    }
}

/// A backend answering every request (health probes included) with `script(path)`.
/// Returns its address and the number of connections it accepted.
fn scripted(script: fn(&str) -> Reply) -> (SocketAddr, Arc<AtomicU64>) {
    scripted_idle(script, Duration::from_secs(10))
}

/// As [`scripted`], closing a connection that stays idle for `idle` between requests.
fn scripted_idle(script: fn(&str) -> Reply, idle: Duration) -> (SocketAddr, Arc<AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicU64::new(0));
    let n = Arc::clone(&conns);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            n.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || serve(s, script, idle));
        }
    });
    (addr, conns)
}

fn serve(mut s: TcpStream, script: fn(&str) -> Reply, idle: Duration) {
    let _ = s.set_read_timeout(Some(idle));
    let mut pending = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let end = loop {
            if let Some(i) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(k) => pending.extend_from_slice(&buf[..k]),
            }
        };
        let head = String::from_utf8_lossy(&pending[..end]).into_owned();
        pending.drain(..end);
        let path = head.split(' ').nth(1).unwrap_or("/").to_string();
        let r = script(&path);
        for p in &r.pieces {
            if s.write_all(p).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if r.close {
            return;
        }
    }
}

fn start(addr: SocketAddr) -> Fulcrum {
    Fulcrum::start(&[
        "--backend",
        &format!("http://{addr}"),
        "--workers",
        "1",
        "--health-interval",
        "60s",
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_answers_pass_decoded_whatever_the_pieces_and_keep_the_connection() {
    let (addr, conns) = scripted(|_| Reply {
        pieces: vec![
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-a: 1\r\nx-a: 2\r\n\r\n5;e=1\r\nhe"
                .to_vec(),
            b"llo\r".to_vec(),
            b"\n6\r\n world\r\n0\r\nx-trailer: t\r\n".to_vec(),
            b"\r\n".to_vec(),
        ],
        close: false,
    });
    let f = start(addr);
    let c = client();
    for _ in 0..3 {
        let g = get(&c, &f.url("/c")).await;
        assert_eq!(g.status, 200);
        assert_eq!(g.text(), "hello world");
        let both: Vec<_> = g.headers.get_all("x-a").iter().collect();
        assert_eq!(both.len(), 2, "repeated header lines both pass");
    }
    // Health probe connection(s) aside, the three requests shared one connection.
    assert!(
        conns.load(Ordering::SeqCst) <= 2,
        "{} connections",
        conns.load(Ordering::SeqCst)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_0_answer_through_hyper_keeps_its_version_and_framing() {
    let (addr, _) = scripted(|_| Reply {
        pieces: vec![
            b"HTTP/1.0 200 OK\r\n\r\nuntil".to_vec(),
            b" the end".to_vec(),
        ],
        close: true,
    });
    let f = start(addr);
    // A request with a body goes through hyper's client and server: the backend's
    // HTTP/1.0 reaches the client, delimited by the close as the backend delimited it.
    let r = raw_exchange(
        f.proxy,
        b"POST /up HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi",
        Duration::from_secs(5),
    );
    assert!(r.starts_with("HTTP/1.0 200 OK\r\n"), "{r}");
    assert!(!r.to_ascii_lowercase().contains("transfer-encoding"), "{r}");
    assert!(r.ends_with("\r\n\r\nuntil the end"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_delimited_and_interim_and_head_answers() {
    let (addr, _) = scripted(|path| {
        match path {
        "/close" => Reply {
            pieces: vec![b"HTTP/1.1 200 OK\r\n\r\nuntil".to_vec(), b" the end".to_vec()],
            close: true,
        },
        "/interim" => reply(
            "HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 4\r\n\r\ndone",
            false,
        ),
        "/old" => reply("HTTP/1.0 200 OK\r\ncontent-length: 3\r\n\r\nold", true),
        // A HEAD answer followed, in a later write, by bytes that look like an answer:
        // they must not become the answer of the connection's next request.
        "/head" => Reply {
            pieces: vec![
                b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n".to_vec(),
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nWRONG".to_vec(),
            ],
            close: false,
        },
        "/reason" => reply("HTTP/1.1 200 Fine Thanks\r\ncontent-length: 2\r\n\r\nok", false),
        "/listed" => reply("HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\nok", false),
        "/twice" => reply("HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nok", false),
        "/chunked-head" => reply("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", false),
        "/nothing" => reply("HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n", false),
        _ => reply("HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\nhello world", false),
    }
    });
    let f = start(addr);
    let c = client();
    let g = get(&c, &f.url("/close")).await;
    assert_eq!(
        (g.status.as_u16(), g.text().as_str()),
        (200, "until the end")
    );
    let g = get(&c, &f.url("/interim")).await;
    assert_eq!((g.status.as_u16(), g.text().as_str()), (201, "done"));
    let g = get(&c, &f.url("/old")).await;
    assert_eq!((g.status.as_u16(), g.text().as_str()), (200, "old"));
    // HEAD: the length is announced, no body follows, the connection stays usable.
    let g = send(&c, "HEAD", &f.url("/head"), &[], "").await;
    assert_eq!(g.status, 200);
    assert_eq!(g.header("content-length"), Some("11"));
    assert!(g.body.is_empty());
    tokio::time::sleep(Duration::from_millis(100)).await;
    for _ in 0..3 {
        let g = get(&c, &f.url("/after")).await;
        assert_eq!(
            g.text(),
            "hello world",
            "bytes sent after an answer leak into the next"
        );
    }
    // A reason phrase of the backend's own passes through; a repeated length is one length.
    let r = raw_exchange(
        f.proxy,
        b"GET /reason HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(r.starts_with("HTTP/1.1 200 Fine Thanks\r\n"), "{r}");
    let g = get(&c, &f.url("/listed")).await;
    assert_eq!((g.status.as_u16(), g.text().as_str()), (200, "ok"));
    // The client sees one length line however many agreeing ones the backend sent; a
    // 204 has none; a HEAD answer without a length is not given one of 0.
    let r = raw_exchange(
        f.proxy,
        b"GET /twice HTTP/1.1\r\nhost: x\r\n\r\n\
          GET /nothing HTTP/1.1\r\nhost: x\r\n\r\n\
          HEAD /chunked-head HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    let answers: Vec<&str> = r.split("HTTP/1.1 ").skip(1).collect();
    assert_eq!(answers.len(), 3, "{r}");
    assert_eq!(answers[0].matches("content-length").count(), 1, "{r}");
    assert!(answers[0].ends_with("\r\n\r\nok"), "{r}");
    assert!(answers[1].starts_with("204"), "{r}");
    assert!(!answers[1].contains("content-length"), "{r}");
    assert!(!answers[2].contains("content-length"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_connections_closed_by_the_backend_are_replaced_unnoticed() {
    // The backend closes a connection after 150 ms without a request, as one with a short
    // keep-alive timeout does; fulcrum pools connections for 60 s.
    let (addr, conns) = scripted_idle(
        |_| reply("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", false),
        Duration::from_millis(150),
    );
    let f = start(addr);
    let c = client();
    for round in 0..3 {
        // Eight at once: eight connections pooled.
        let all: Vec<_> = (0..8)
            .map(|_| {
                let c = c.clone();
                let url = f.url("/");
                tokio::spawn(async move { get(&c, &url).await })
            })
            .collect();
        for r in all {
            let g = r.await.unwrap();
            assert_eq!(
                (g.status.as_u16(), g.text().as_str()),
                (200, "ok"),
                "round {round}"
            );
        }
        // Then, with all of them closed by the backend meanwhile, one request after the
        // other, each of which finds a closed connection first.
        tokio::time::sleep(Duration::from_millis(400)).await;
        for i in 0..8 {
            let g = get(&c, &f.url("/")).await;
            assert_eq!(
                (g.status.as_u16(), g.text().as_str()),
                (200, "ok"),
                "round {round}, request {i}"
            );
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert!(
        conns.load(Ordering::SeqCst) >= 16,
        "the backend did close its idle connections"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_or_broken_answers_give_502_or_an_aborted_body_and_free_the_slot() {
    let (addr, _) = scripted(|path| match path {
        "/garbage" => reply("HTTP/1.1 abc nonsense\r\n\r\n", true),
        "/twolengths" => reply(
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok",
            true,
        ),
        "/silent" => reply("", true),
        "/short" => reply(
            "HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten..",
            true,
        ),
        "/te10" => reply(
            "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            true,
        ),
        "/badchunk" => reply(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            true,
        ),
        _ => reply("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", false),
    });
    let f = start(addr);
    let c = client();
    for path in ["/garbage", "/twolengths", "/silent", "/te10"] {
        let g = get(&c, &f.url(path)).await;
        assert_eq!(g.status, 502, "{path}");
    }
    for path in ["/short", "/badchunk"] {
        let r = c
            .request(
                http::Request::get(f.url(path))
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap(),
            )
            .await;
        // The head may or may not have reached the client before the body broke off;
        // either way the response must not look complete.
        if let Ok(r) = r {
            assert_eq!(r.status(), 200, "{path}");
            let body = http_body_util::BodyExt::collect(r.into_body()).await;
            assert!(
                body.is_err(),
                "{path}: a broken body must not look complete"
            );
        }
    }
    assert!(
        eventually(Duration::from_secs(3), || async {
            active_conns(&c, &f).await.values().all(|&n| n == 0)
        })
        .await,
        "in-flight counts return to 0"
    );
    let g = get(&c, &f.url("/fine")).await;
    assert_eq!((g.status.as_u16(), g.text().as_str()), (200, "ok"));
}
