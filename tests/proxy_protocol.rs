//! The PROXY protocol (`docs/tls.md`, "PROXY protocol"), over real sockets: headers of
//! both versions read in front of client connections (plain and TLS), a connection
//! without a valid one closed with no harm to others, and headers written in front of
//! backend connections, checked byte for byte.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::tls::*;
use common::*;

/// Sends `bytes` then reads until the peer closes (at most 5 s).
fn exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

const REQUEST: &[u8] = b"GET /pp HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";

fn v2_header(family: u8, addrs: &[u8]) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend([0x21, family]);
    h.extend((addrs.len() as u16).to_be_bytes());
    h.extend_from_slice(addrs);
    h
}

#[test]
fn headers_of_both_versions_name_the_client_and_bad_ones_close_the_connection() {
    let a = TestBackend::start("A");
    let f = Fulcrum::over(
        &[&a],
        &[
            "--accept-proxy-protocol",
            "on",
            "--trusted-proxies",
            "127.0.0.1/32",
        ],
    );
    let seen = || {
        let h = a.stats.last_headers.lock().unwrap().clone().unwrap();
        h["x-forwarded-for"].to_str().unwrap().to_string()
    };
    let v1 = [&b"PROXY TCP4 203.0.113.7 10.0.0.1 5555 80\r\n"[..], REQUEST].concat();
    assert!(exchange(f.proxy, &v1).starts_with("HTTP/1.1 200"));
    assert_eq!(seen(), "203.0.113.7");
    let mut addrs = Vec::new();
    addrs.extend(
        "2001:db8::5"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    addrs.extend(
        "2001:db8::1"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    addrs.extend([0x1f, 0x90, 0x00, 0x50]);
    let v2 = [v2_header(0x21, &addrs), REQUEST.to_vec()].concat();
    assert!(exchange(f.proxy, &v2).starts_with("HTTP/1.1 200"));
    assert_eq!(seen(), "2001:db8::5");
    let requests = a.requests();
    // No header, a v2 header whose length is short of its addresses, a v1 line that
    // never ends: each connection is closed with nothing written, and reaches nothing.
    let short = [v2_header(0x11, &[10, 0, 0, 1]), REQUEST.to_vec()].concat();
    let endless = [&b"PROXY TCP4 "[..], &[b'1'; 200], REQUEST].concat();
    for bad in [REQUEST.to_vec(), short, endless] {
        assert_eq!(
            exchange(f.proxy, &bad),
            "",
            "{:?}",
            String::from_utf8_lossy(&bad)
        );
    }
    assert_eq!(a.requests(), requests);
    // LOCAL (a proxy's own health check): the connection's own peer stands.
    let mut local = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    local.extend([0x20, 0x00, 0, 0]);
    assert!(exchange(f.proxy, &[local, REQUEST.to_vec()].concat()).starts_with("HTTP/1.1 200"));
    assert_eq!(seen(), "127.0.0.1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tls_listener_reads_the_header_before_the_handshake() {
    let pki = Pki::new("pp");
    pki.leaf("a", &["a.test"]);
    let a = TestBackend::start("A");
    let f = Fulcrum::over(
        &[&a],
        &[
            "--accept-proxy-protocol",
            "on",
            "--trusted-proxies",
            "127.0.0.0/8",
            "--tls-listen",
            "127.0.0.1:0",
            "--tls-cert",
            &pki.arg("a.pem"),
            "--tls-key",
            &pki.arg("a.key"),
        ],
    );
    let mut tcp = tokio::net::TcpStream::connect(https_addr(&f))
        .await
        .unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut tcp, b"PROXY TCP4 198.51.100.4 10.0.0.1 4000 443\r\n")
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("a.test").unwrap();
    let s = pki
        .client(&[b"http/1.1"])
        .connect(name, tcp)
        .await
        .expect("handshake");
    let mut sender = h1(s).await;
    assert_eq!(get_h1(&mut sender, "a.test", "/").await.0, 200);
    let h = a.stats.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(h["x-forwarded-for"], "198.51.100.4");
    assert_eq!(h["x-forwarded-proto"], "https");
}

#[test]
fn a_header_from_a_peer_that_is_not_a_trusted_proxy_closes_the_connection() {
    let a = TestBackend::start("A");
    // 127.0.0.1, the test's own address, is not among the trusted proxies.
    let f = Fulcrum::over(
        &[&a],
        &[
            "--accept-proxy-protocol",
            "on",
            "--trusted-proxies",
            "10.0.0.0/8",
        ],
    );
    let seen = || {
        let h = a.stats.last_headers.lock().unwrap().clone().unwrap();
        h["x-forwarded-for"].to_str().unwrap().to_string()
    };
    // It claims a trusted address, to have its own X-Forwarded-For believed.
    let claim = [
        &b"PROXY TCP4 10.1.1.1 10.0.0.1 5555 80\r\n"[..],
        b"GET /pp HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 1.2.3.4\r\nConnection: close\r\n\r\n",
    ]
    .concat();
    assert_eq!(exchange(f.proxy, &claim), "");
    let mut v2 = v2_header(0x11, &[10, 1, 1, 1, 10, 0, 0, 1, 0x15, 0xb3, 0, 80]);
    v2.extend_from_slice(REQUEST);
    assert_eq!(exchange(f.proxy, &v2), "");
    assert_eq!(a.requests(), 0, "neither reached the backend");
    // Without a header it is an ordinary client: its own address, its XFF not believed.
    let plain =
        b"GET /pp HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 1.2.3.4\r\nConnection: close\r\n\r\n";
    assert!(exchange(f.proxy, plain).starts_with("HTTP/1.1 200"));
    assert_eq!(seen(), "1.2.3.4, 127.0.0.1");
    // A method that starts like the header's first bytes is still served.
    let put = b"PUT /pp HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    assert!(exchange(f.proxy, put).starts_with("HTTP/1.1 200"));
    // Accepting headers without saying from whom is a configuration error.
    let (status, _, err) = run_fulcrum(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--accept-proxy-protocol",
        "on",
    ]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("accept_proxy_protocol") && err.contains("trusted_proxies"),
        "{err}"
    );
}

/// A backend that records every connection's bytes up to the end of its first head and
/// answers 200, closing.
fn recording_backend() -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&seen);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let keep = Arc::clone(&keep);
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(5))).ok();
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                // The end of the request head: a version 2 header starts with CRLF CRLF.
                let whole = |b: &[u8]| {
                    let start = b.windows(10).position(|w| w == b"HTTP/1.1\r\n");
                    start.is_some_and(|at| b[at..].windows(4).any(|w| w == b"\r\n\r\n"))
                };
                while !whole(&got) {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                keep.lock().unwrap().push(got);
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                );
            });
        }
    });
    (addr, seen)
}

#[test]
fn headers_sent_to_backends_name_the_client_byte_for_byte() {
    for version in ["v1", "v2"] {
        let (addr, seen) = recording_backend();
        let backend = format!("http://{addr}");
        let f = Fulcrum::start(&[
            "--backend",
            &backend,
            "--send-proxy-protocol",
            version,
            "--health-interval",
            "100ms",
        ]);
        for _ in 0..2 {
            let mut s = TcpStream::connect(f.proxy).unwrap();
            let client = s.local_addr().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(REQUEST).unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            assert!(
                out.starts_with(b"HTTP/1.1 200"),
                "{}",
                String::from_utf8_lossy(&out)
            );
            let conns = seen.lock().unwrap().clone();
            let got = conns
                .iter()
                .rev()
                .find(|c| c.windows(7).any(|w| w == b"GET /pp"))
                .expect("the request reached the backend")
                .clone();
            let want = match version {
                "v1" => format!(
                    "PROXY TCP4 127.0.0.1 127.0.0.1 {} {}\r\n",
                    client.port(),
                    f.proxy.port()
                )
                .into_bytes(),
                _ => {
                    let mut addrs = vec![127, 0, 0, 1, 127, 0, 0, 1];
                    addrs.extend(client.port().to_be_bytes());
                    addrs.extend(f.proxy.port().to_be_bytes());
                    v2_header(0x11, &addrs)
                }
            };
            assert_eq!(
                &got[..want.len()],
                &want[..],
                "{version}: {:?}",
                String::from_utf8_lossy(&got)
            );
            assert!(got[want.len()..].starts_with(b"GET /pp HTTP/1.1\r\n"));
        }
        // Health probes send a header too, naming no client.
        let probe = match version {
            "v1" => b"PROXY UNKNOWN\r\n".to_vec(),
            _ => [&b"\r\n\r\n\0\r\nQUIT\n"[..], &[0x20, 0x00, 0, 0]].concat(),
        };
        let probed = || {
            let conns = seen.lock().unwrap();
            conns
                .iter()
                .any(|c| c.starts_with(&probe) && c.windows(7).any(|w| w == b"/health"))
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !probed() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(probed(), "{version}: a probe with its header");
    }
    let (status, _, err) = run_fulcrum(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--send-proxy-protocol",
        "v3",
    ]);
    assert_eq!(status.code(), Some(2));
    assert!(
        err.contains("send_proxy_protocol") || err.contains("send-proxy-protocol"),
        "{err}"
    );
    let (status, _, err) = run_fulcrum(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--send-proxy-protocol",
        "v1",
        "--protocol",
        "h2",
    ]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("shares connections between clients"), "{err}");
}
