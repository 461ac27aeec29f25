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
    let s = common::tls::connect(pki, addr, "a.test", &[b"http/1.1"]).await;
    let (mut h1, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
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
