//! Who may come in by address (`docs/policies.md`, "Who may come in") over real sockets:
//! `deny_clients`/`allow_clients` closing connections at accept on the plain, TLS and
//! QUIC listeners (and after a trusted proxy's PROXY header), a route's `allow`/`deny`
//! judging the client IP through `X-Forwarded-For` and the PROXY protocol, reloads, and
//! bad lists.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::tls::*;
use common::*;

/// Sends `request` and reads what comes back until the close: `None` when nothing
/// did (the connection was closed at accept).
fn exchange(addr: SocketAddr, request: &[u8]) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let _ = s.write_all(request);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    (!out.is_empty()).then(|| String::from_utf8_lossy(&out).into_owned())
}

/// `GET path` with `extra` header lines (and `Connection: close`).
fn get_line(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: a.test\r\n{extra}connection: close\r\n\r\n").into_bytes()
}

fn status_of(answer: &str) -> u16 {
    answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// fulcrum with the configuration `text` (written as `access-NAME`), health checks slow.
fn start_with(name: &str, text: &str) -> Fulcrum {
    let cfg = config_file("access", name, text);
    Fulcrum::start(&[
        "--config",
        cfg.to_str().unwrap(),
        "--health-interval",
        "60s",
    ])
}

/// The value of `fulcrum_clients_denied_total{where=…}`.
async fn denied(f: &Fulcrum, at: &str) -> u64 {
    metric(
        f,
        &format!("fulcrum_clients_denied_total{{where=\"{at}\"}}"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_top_level_lists_close_connections_at_accept_on_every_listener() {
    let pki = Pki::new("access-accept");
    pki.leaf("a", &["a.test"]);
    let a = TestBackend::start("A");
    let text = |deny: &str, allow: &str| {
        format!(
            "deny_clients = [{deny}]\nallow_clients = [{allow}]\ntls_listen = \"127.0.0.1:0\"\n[tls]\nhttp3 = true\n[[tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\n[[backends]]\nurl = \"{}\"\n",
            pki.arg("a.pem"),
            pki.arg("a.key"),
            a.url()
        )
    };
    let cfg = config_file("access", "accept", &text("\"127.0.0.0/8\"", ""));
    let f = Fulcrum::start(&[
        "--config",
        cfg.to_str().unwrap(),
        "--health-interval",
        "60s",
    ]);
    let https = https_addr(&f);
    // Plain: closed without a byte; TLS: no handshake; QUIC: nothing comes back.
    assert_eq!(exchange(f.proxy, &get_line("/", "")), None);
    let tcp = tokio::net::TcpStream::connect(https).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("a.test").unwrap();
    assert!(
        pki.client(&[b"http/1.1"]).connect(name, tcp).await.is_err(),
        "no TLS handshake"
    );
    let quic = tokio::time::timeout(
        Duration::from_secs(2),
        common::h3::h3_connection_with(https, "a.test", &pki.ca_der(), None),
    )
    .await;
    assert!(quic.is_err(), "no QUIC handshake");
    assert!(denied(&f, "accept").await >= 3);
    assert_eq!(a.requests(), 0, "nothing reached the backend");
    // The admin listener is not a proxy listener.
    assert_eq!(
        get(&client(), &f.admin_url("/admin/status")).await.status,
        200
    );

    // A reload: 127.0.0.1 allowed by name, the rest refused.
    std::fs::write(&cfg, text("\"192.0.2.0/24\"", "\"127.0.0.1\", \"::1\"")).unwrap();
    f.signal("HUP");
    assert!(
        f.log_line(&["reloaded"], Duration::from_secs(10)).is_some(),
        "{}",
        f.log()
    );
    let answer = exchange(f.proxy, &get_line("/", "")).expect("an answer");
    assert_eq!(status_of(&answer), 200, "{answer}");
    // An allow list that leaves 127.0.0.1 out.
    std::fs::write(&cfg, text("", "\"10.0.0.0/8\", \"2001:db8::/32\"")).unwrap();
    f.signal("HUP");
    assert!(f
        .log_line(&["reloaded", "reloaded"], Duration::from_secs(10))
        .is_some());
    let closed = async {
        for _ in 0..50 {
            if exchange(f.proxy, &get_line("/", "")).is_none() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    };
    assert!(closed.await, "closed once 127.0.0.1 is not allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_allow_and_deny_judge_the_client_through_trusted_proxies() {
    let a = TestBackend::start("A");
    let text = format!(
        "trusted_proxies = [\"127.0.0.1\"]\n[[pools]]\nname = \"web\"\nbackends = [{{ url = \"{}\" }}]\n[[routes]]\npool = \"web\"\npath_prefix = \"/inside\"\nallow = [\"10.0.0.0/8\", \"2001:db8::/32\"]\ndeny = [\"10.6.6.6\"]\n[[routes]]\npool = \"web\"\npath_prefix = \"/open\"\ndeny = [\"192.0.2.0/24\"]\n",
        a.url()
    );
    let f = start_with("route", &text);
    let before = a.requests();
    for (path, xff, want) in [
        ("/inside/a", "10.1.2.3", 200),
        ("/inside/b", "2001:db8::5", 200),
        ("/inside/c", "::ffff:10.4.4.4", 200),
        ("/inside/d", "10.6.6.6", 403),
        ("/inside/e", "192.0.2.9", 403),
        ("/open/f", "192.0.2.9", 403),
        ("/open/g", "198.51.100.1", 200),
    ] {
        let answer = exchange(
            f.proxy,
            &get_line(path, &format!("x-forwarded-for: {xff}\r\n")),
        )
        .unwrap();
        assert_eq!(status_of(&answer), want, "{path} from {xff}: {answer}");
        if want == 403 {
            assert!(answer.ends_with("forbidden\n"), "{answer}");
        }
    }
    // Without a forwarded address the client is the peer, 127.0.0.1: not inside.
    let answer = exchange(f.proxy, &get_line("/inside/h", "")).unwrap();
    assert_eq!(status_of(&answer), 403);
    assert_eq!(
        a.requests() - before,
        4,
        "no refused request reached the backend"
    );
    assert_eq!(denied(&f, "route").await, 4);
    // The admin API shows the lists as given, and refuses a bad one.
    let c = client();
    let routes = get(&c, &f.admin_url("/admin/routes")).await.json();
    assert_eq!(
        routes[0]["allow"],
        serde_json::json!(["10.0.0.0/8", "2001:db8::/32"])
    );
    let bad = r#"[{"pool":"web","allow":["10.0.0.1/8"]}]"#;
    let got = admin(&c, "PUT", &f.admin_url("/admin/routes"), bad).await;
    assert_eq!(got.status, 400, "{}", got.text());
    assert!(got.text().contains("10.0.0.1/8"), "{}", got.text());
}

/// `n` addresses two apart from `10.0.0.0` on, as TOML list items: a list long enough to be
/// indexed by /16.
fn long_list(n: u32) -> String {
    (0..n)
        .map(|i| format!("\"10.{}.{}.{}\"", i / 32768, i / 128 % 256, i % 128 * 2))
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_long_lists_judge_an_untrusted_peer_by_its_own_address() {
    let a = TestBackend::start("A");
    let list = long_list(600);
    // Without trusted proxies the client is the peer, 127.0.0.1, whatever it forwards.
    let text = format!(
        "[[pools]]\nname = \"web\"\nbackends = [{{ url = \"{}\" }}]\n\
         [[routes]]\npool = \"web\"\npath_prefix = \"/shut\"\ndeny = [{list}, \"127.0.0.0/31\"]\n\
         [[routes]]\npool = \"web\"\npath_prefix = \"/near\"\ndeny = [{list}, \"126.255.255.255\", \"127.0.0.2\"]\n\
         [[routes]]\npool = \"web\"\npath_prefix = \"/only\"\nallow = [{list}]\n\
         [[routes]]\npool = \"web\"\npath_prefix = \"/mine\"\nallow = [{list}, \"127.0.0.1\"]\n\
         [[routes]]\npool = \"web\"\npath_prefix = \"/metered\"\nallow = [{list}, \"127.0.0.1\"]\n\
         rate_limit = {{ rate = 1, per = \"1h\" }}\n",
        a.url()
    );
    let f = start_with("long", &text);
    let before = a.requests();
    for (path, want) in [
        ("/shut", 403),
        ("/near", 200),
        ("/only", 403),
        ("/mine", 200),
    ] {
        // A forged forwarded address from the list's other side changes nothing.
        let forged = "x-forwarded-for: 10.0.0.2\r\n";
        let answer = exchange(f.proxy, &get_line(path, forged)).unwrap();
        assert_eq!(status_of(&answer), want, "{path}: {answer}");
    }
    // A client the list lets by still meets the route's next step: its rate limit.
    for want in [200, 429] {
        let answer = exchange(f.proxy, &get_line("/metered", "")).unwrap();
        assert_eq!(status_of(&answer), want, "/metered: {answer}");
    }
    assert_eq!(
        a.requests() - before,
        3,
        "no refused request reached the backend"
    );
    assert_eq!(denied(&f, "route").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_the_proxy_protocol_names_whom_the_lists_judge() {
    let a = TestBackend::start("A");
    let text = format!(
        "accept_proxy_protocol = true\ntrusted_proxies = [\"127.0.0.1\"]\ndeny_clients = [\"203.0.113.0/24\"]\n[[pools]]\nname = \"web\"\nbackends = [{{ url = \"{}\" }}]\n[[routes]]\npool = \"web\"\nallow = [\"10.0.0.0/8\"]\n",
        a.url()
    );
    let f = start_with("proxy", &text);
    let via = |src: &str| {
        let mut r = format!("PROXY TCP4 {src} 10.0.0.1 5555 80\r\n").into_bytes();
        r.extend_from_slice(&get_line("/x", ""));
        exchange(f.proxy, &r)
    };
    assert_eq!(via("10.2.2.2").map(|a| status_of(&a)), Some(200));
    assert_eq!(
        via("198.51.100.7").map(|a| status_of(&a)),
        Some(403),
        "the route's allow list"
    );
    assert_eq!(
        via("203.0.113.9"),
        None,
        "deny_clients, judged on the header's address"
    );
    assert_eq!(denied(&f, "accept").await, 1);
}

#[test]
fn bad_lists_exit_2_naming_them() {
    let pool = "[[pools]]\nname = \"web\"\nbackends = [{ url = \"http://127.0.0.1:9\" }]\n";
    let top = "[[backends]]\nurl = \"http://127.0.0.1:9\"\n";
    let cases = [
        (
            format!("deny_clients = [\"10.0.0.0/33\"]\n{top}"),
            "deny_clients",
            "'10.0.0.0/33'",
        ),
        (
            format!("allow_clients = [\"example.com\"]\n{top}"),
            "allow_clients",
            "'example.com'",
        ),
        (
            format!("{pool}[[routes]]\npool = \"web\"\nallow = [\"10.0.0.1/8\"]\n"),
            "line 6",
            "bits set past its prefix length",
        ),
        (
            format!("{pool}[[routes]]\npool = \"web\"\ndeny = \"10.0.0.0/8\"\n"),
            "line 6",
            "deny: expected a list",
        ),
    ];
    for (i, (text, names, says)) in cases.iter().enumerate() {
        let cfg = config_file("access-bad", &format!("case{i}"), text);
        let (status, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
        assert_eq!(status.code(), Some(2), "{text}: {err}");
        assert!(err.contains(names) && err.contains(says), "{text}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}
