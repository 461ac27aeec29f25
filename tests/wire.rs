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
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicU64::new(0));
    let n = Arc::clone(&conns);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            n.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || serve(s, script));
        }
    });
    (addr, conns)
}

fn serve(mut s: TcpStream, script: fn(&str) -> Reply) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
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
    let g = get(&c, &f.url("/after")).await;
    assert_eq!(g.text(), "hello world");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_connection_closed_by_the_backend_is_replaced_unnoticed() {
    // Every answer says keep-alive, and then the backend closes anyway (as one whose
    // idle timeout is short does): the next request must not fail.
    let (addr, conns) = scripted(|_| reply("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", true));
    let f = start(addr);
    let c = client();
    for _ in 0..5 {
        let g = get(&c, &f.url("/")).await;
        assert_eq!((g.status.as_u16(), g.text().as_str()), (200, "ok"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(conns.load(Ordering::SeqCst) >= 5);
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
        "/badchunk" => reply(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            true,
        ),
        _ => reply("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", false),
    });
    let f = start(addr);
    let c = client();
    for path in ["/garbage", "/twolengths", "/silent"] {
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
