//! What the hardening of part three's binary holds, over real sockets (`docs/security.md`):
//! rate-limit keys a client cannot aim, one `Alt-Svc`, redirects without a `Host`, load
//! reports that cannot be read, watched files that are not regular files.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use common::*;

/// Sends `request` from the local address `from` and reads the answer's status line.
fn status_from(from: IpAddr, to: SocketAddr, request: &[u8]) -> String {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&SocketAddr::new(from, 0).into()).unwrap();
    sock.connect(&to.into()).unwrap();
    let mut s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if out.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    text.lines().next().unwrap_or("").to_string()
}

#[test]
fn a_header_value_never_spends_an_addresss_rate_limit() {
    let api = TestBackend::start("api");
    let cfg = config_file(
        "audit",
        "keys",
        &format!(
            "[[pools]]\nname = \"api\"\nbackends = [{{ url = \"{}\" }}]\n\n\
             [[routes]]\npool = \"api\"\n\
             rate_limit = {{ rate = 1, per = \"60s\", burst = 0, key = \"header:x-api-key\" }}\n",
            api.url()
        ),
    );
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let local: IpAddr = "127.0.0.1".parse().unwrap();
    // This value's unkeyed 64-bit hash was the key of 127.0.23.252's bucket.
    let aimed = b"GET / HTTP/1.1\r\nHost: a\r\nx-api-key: N.T5(4k(\r\nConnection: close\r\n\r\n";
    assert!(status_from(local, f.proxy, aimed).contains(" 200 "));
    assert!(
        status_from(local, f.proxy, aimed).contains(" 429 "),
        "the value has a bucket of its own"
    );
    let victim: IpAddr = "127.0.23.252".parse().unwrap();
    let plain = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let line = status_from(victim, f.proxy, plain);
    assert!(line.contains(" 200 "), "the address's own bucket: {line}");
}

/// The `alt-svc` fields of a GET of `/` over TLS with HTTP/1.1 through `addr`.
async fn alt_svcs_over_tls_h1(pki: &common::tls::Pki, addr: SocketAddr) -> Vec<String> {
    let mut h1 = common::tls::h1_over_tls(pki, addr, "a.test").await;
    let req = http::Request::get("/")
        .header("host", "a.test")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let rsp = h1.send_request(req).await.unwrap();
    assert_eq!(rsp.status(), 200);
    let all = rsp.headers().get_all("alt-svc").iter();
    all.map(|v| v.to_str().unwrap().to_string()).collect()
}

/// A backend that says `Alt-Svc` over h2 or TLS: the client of fulcrum's TLS h1 listener
/// sees fulcrum's one with HTTP/3 on, none without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_alt_svc_whatever_the_backend_speaks() {
    use common::tls::*;
    let pki = Pki::new("audit-alt-svc");
    pki.leaf("a", &["a.test"]);
    let h2c = H2Backend::plain("h2c");
    let tls = H2Backend::tls("tls", &pki, "backend", &["localhost"]);
    for http3 in [true, false] {
        for (url, protocol) in [
            (format!("http://127.0.0.1:{}", h2c.addr.port()), "h2"),
            (format!("https://localhost:{}", tls.addr.port()), "http1"),
            (format!("https://localhost:{}", tls.addr.port()), "h2"),
        ] {
            let tag = format!("alt-{http3}-{protocol}");
            let cfg = config_file(
                "audit",
                &tag,
                &format!(
                    "tls_listen = \"127.0.0.1:0\"\nprotocol = \"{protocol}\"\n\
                     tls_ca_file = \"{}\"\n[[backends]]\nurl = \"{url}\"\n\
                     [tls]\nhttp3 = {http3}\n\
                     [[tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\n",
                    pki.arg("ca.pem"),
                    pki.arg("a.pem"),
                    pki.arg("a.key")
                ),
            );
            let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
            let addr = https_addr(&f);
            let got = alt_svcs_over_tls_h1(&pki, addr).await;
            let want: Vec<String> = match http3 {
                true => vec![format!("h3=\":{}\"; ma=86400", addr.port())],
                false => vec![],
            };
            assert_eq!(got, want, "{url} over {protocol}, http3 {http3}");
        }
    }
}

#[test]
fn a_host_redirect_without_a_host_is_a_400_not_an_empty_authority() {
    let cfg = config_file(
        "audit",
        "redirect",
        "[[routes]]\nredirect = { to = \"https://{host}{path}\" }\n",
    );
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let r = raw_exchange(f.proxy, b"GET /a HTTP/1.0\r\n\r\n", Duration::from_secs(4));
    assert!(r.starts_with("HTTP/1.0 400 "), "{r}");
    assert!(!r.to_ascii_lowercase().contains("location"), "{r}");
    let r = raw_exchange(
        f.proxy,
        b"GET /a HTTP/1.0\r\nHost: b.test\r\n\r\n",
        Duration::from_secs(4),
    );
    assert!(r.contains("\r\nlocation: https://b.test/a\r\n"), "{r}");
}

/// Open descriptors of a process.
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Two fulcrums, each the other's backend: a request goes round once, is seen by its
/// `Via` and answered 508; health probes cost one hop each, never a fan-out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_through_two_fulcrums_is_answered_508_and_fans_nothing_out() {
    let c = client();
    // Probes every 200 ms, each a 508; a backend never marked down for them, so that the
    // request below goes round rather than meeting an empty pool.
    let probes = ["--health-interval", "200ms", "--unhealthy-threshold", "100"];
    let a = Fulcrum::start(&probes);
    let b_backend = format!("http://{}", a.proxy);
    let mut args = vec!["--backend", b_backend.as_str()];
    args.extend(probes);
    let b = Fulcrum::start(&args);
    let body = format!(r#"{{"url": "http://{}"}}"#, b.proxy);
    let r = admin(&c, "POST", &a.admin_url("/admin/backends"), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = send(&c, "GET", &a.url("/x"), &[], "").await;
    assert_eq!(r.status, 508, "{}", r.text());
    // Probes go on for a while: each costs one hop and one 508.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for f in [&a, &b] {
        let (fds, rss) = (descriptors(f.child.id()), rss_kib(f.child.id()));
        eprintln!("a fulcrum of the loop: {fds} descriptors, {rss} KiB");
        assert!(fds < 200, "{fds} descriptors");
        assert!(rss < 100 * 1024, "{rss} KiB");
    }
    // Every request forwarded carries Via with the client's protocol.
    let echo = TestBackend::start("echo");
    let f = Fulcrum::over(&[&echo], &[]);
    let r = send(&c, "GET", &f.url("/headers"), &[("via", "1.0 squid")], "").await;
    assert_eq!(r.status, 200);
    let seen = echo.stats.last_headers.lock().unwrap().clone().unwrap();
    let via = seen
        .get("via")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    assert!(via.starts_with("1.0 squid, 1.1 fulcrum-"), "{via}");
}

/// A backend that is this fulcrum's own listener is refused: exit 2 from a config, 400
/// from the admin API, left out with an error by discovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_is_this_fulcrum_is_refused_wherever_it_is_named() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let cfg = config_file(
        "audit",
        "own",
        &format!("listen = \"{listen}\"\n[[backends]]\nurl = \"http://localhost:{port}\"\n"),
    );
    let (st, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("own listener"), "{err}");
    let c = client();
    let f = Fulcrum::start(&[]);
    let body = format!(r#"{{"url": "http://{}"}}"#, f.proxy);
    let r = admin(&c, "POST", &f.admin_url("/admin/backends"), &body).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"].as_str().unwrap().contains("own listener"));
    // Discovery: the own address left out, the others taken, the error names it.
    let other = TestBackend::start("other");
    let list = config_file(
        "audit",
        "own-list",
        &format!(
            r#"[{{"url": "{}"}}, {{"url": "http://{}"}}]"#,
            other.url(),
            f.proxy
        ),
    );
    let discover = format!("file={}", list.display());
    let g = Fulcrum::start(&["--discover", &discover]);
    let body = format!(
        r#"[{{"url": "{}"}}, {{"url": "http://{}"}}]"#,
        other.url(),
        g.proxy
    );
    std::fs::write(&list, body).unwrap();
    let ok = eventually(Duration::from_secs(4), || async {
        let p = get(&c, &g.admin_url("/admin/pools/default")).await.json();
        p["discovery"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("own listener"))
            && p["backends"].as_array().is_some_and(|b| b.len() == 1)
    })
    .await;
    let p = get(&c, &g.admin_url("/admin/pools/default")).await.json();
    assert!(ok, "{p}");
    assert_eq!(p["backends"][0]["url"], other.url());
}

/// Reads an answer of `total` bytes at 1 MiB a second (64 KiB every 62 ms); how many
/// bytes came before the connection ended or `total`.
fn read_slowly(mut s: TcpStream, total: usize) -> usize {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = 0;
    let mut buf = vec![0u8; 64 << 10];
    while got < total {
        let mut chunk = 0;
        while chunk < buf.len() {
            match s.read(&mut buf[chunk..]) {
                Ok(0) | Err(_) => return got + chunk,
                Ok(n) => chunk += n,
            }
        }
        got += chunk;
        std::thread::sleep(Duration::from_millis(62));
    }
    got
}

/// `send_timeout` counts the client's progress: a client reading steadily is never
/// cut, on the fast path (GET) as on hyper's (POST), though fulcrum's own writes wait on
/// the kernel's buffers (the kernel wakes a writer once a third of a multi-megabyte
/// buffer is free) for longer than the timeout; one that reads nothing is cut.
#[test]
fn a_slow_reader_is_not_cut_by_send_timeout_but_a_stalled_one_is() {
    let b = TestBackend::start("big");
    let f = Fulcrum::over(&[&b], &["--send-timeout", "1s"]);
    // More than the kernel buffers hold between fulcrum and the client.
    let total = 10 << 20;
    let mut readers = Vec::new();
    for method in ["GET", "POST"] {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.set_recv_buffer_size(64 << 10).unwrap();
        sock.connect(&f.proxy.into()).unwrap();
        let mut s: TcpStream = sock.into();
        // The GET as the fast path takes it (no body fields); the POST goes to hyper.
        let length = if method == "POST" {
            "content-length: 0\r\n"
        } else {
            ""
        };
        let req = format!(
            "{method} /big/{} HTTP/1.1\r\nHost: a\r\n{length}\r\n",
            64 << 20
        );
        s.write_all(req.as_bytes()).unwrap();
        readers.push(std::thread::spawn(move || read_slowly(s, total)));
    }
    // One that reads nothing at all.
    let mut stalled = TcpStream::connect(f.proxy).unwrap();
    stalled
        .write_all(b"GET /big/67108864 HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    for (r, method) in readers.into_iter().zip(["GET", "POST"]) {
        let got = r.join().unwrap();
        assert!(got >= total, "{method}: cut after {got} bytes");
    }
    // By now the stalled one was closed: its socket reads to an end.
    stalled
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut ended = false;
    for _ in 0..200 {
        match stalled.read(&mut buf) {
            Ok(0) => ended = true,
            Err(e) => {
                ended = !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
            Ok(_) => continue,
        }
        break;
    }
    assert!(ended, "a client that reads nothing is still closed");
}

/// 1 000 idle keep-alive HTTP/1.1 connections, each after one request, cost at most
/// 8 KiB each in fulcrum's RSS (its connection task holds only the fast path's state).
#[test]
fn an_idle_keep_alive_connection_costs_at_most_8_kib() {
    assert!(
        raise_own_file_limit() > 1100,
        "this test holds 1 000 connections"
    );
    let b = TestBackend::start("A");
    let f = Fulcrum::over(&[&b], &["--workers", "1", "--access-log", "off"]);
    let warm = raw_exchange(
        f.proxy,
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        Duration::from_secs(4),
    );
    assert!(warm.starts_with("HTTP/1.1 200"), "{warm}");
    std::thread::sleep(Duration::from_millis(300));
    let before = rss_kib(f.child.id());
    let mut held = Vec::new();
    for _ in 0..1000 {
        let mut s = TcpStream::connect(f.proxy).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => panic!("no answer"),
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        held.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    let per = rss_kib(f.child.id()).saturating_sub(before) as f64 / 1000.0;
    eprintln!("{per:.1} KiB per idle keep-alive connection");
    assert!(per <= 8.0, "{per:.1} KiB per idle connection");
}
