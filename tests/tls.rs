//! TLS termination (`docs/tls.md`) over real sockets, with certificates made at test
//! time: SNI, HTTP/1.1 and HTTP/2 over TLS, `redirect_https`, certificates re-read on
//! reload while open connections keep theirs, bad certificates refused, and clients
//! that do not speak TLS 1.2+ handled without harm to the others.

mod common;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

use common::tls::*;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_picks_the_certificate_and_both_http_versions_proxy() {
    let pki = Pki::new("sni");
    let a = pki.leaf("a", &["a.test"]);
    let b = pki.leaf("b", &["b.test", "*.b.test"]);
    let backend = TestBackend::start("B1");
    let cfg = config_file(
        "tls",
        "sni",
        &format!(
            "tls_listen = \"127.0.0.1:0\"\n[[tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\n\
             [[tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\n",
            pki.arg("a.pem"),
            pki.arg("a.key"),
            pki.arg("b.pem"),
            pki.arg("b.key")
        ),
    );
    let f = Fulcrum::start(&[
        "--config",
        cfg.to_str().unwrap(),
        "--backend",
        &backend.spec(),
    ]);
    let addr = https_addr(&f);
    // Both files' certificates are listed, with their names and issuer.
    let c = client();
    let listed = get(&c, &f.admin_url("/admin/certificates")).await.json();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    assert_eq!(
        listed[1]["names"],
        serde_json::json!(["b.test", "*.b.test"])
    );
    assert_eq!(listed[0]["source"], "file");
    assert_eq!(listed[0]["issuer"], "fulcrum test CA");
    assert!(listed[0]["renew_at"].is_null() && listed[0]["not_after"].is_string());
    for (name, want) in [
        ("a.test", &a),
        ("b.test", &b),
        ("www.b.test", &b),
        ("other.test", &a),
    ] {
        let s = connect(&pki, addr, name, &[b"http/1.1"]).await;
        assert_eq!(&leaf_of(&s), want, "{name}");
    }
    // HTTP/1.1 over TLS, with X-Forwarded-Proto: https.
    let s = connect(&pki, addr, "a.test", &[b"h2", b"http/1.1"]).await;
    assert_eq!(
        s.get_ref().1.alpn_protocol(),
        Some(&b"h2"[..]),
        "h2 preferred"
    );
    let s = connect(&pki, addr, "a.test", &[b"http/1.1"]).await;
    let mut sender = h1(s).await;
    for _ in 0..3 {
        let got = get_h1(&mut sender, "a.test", "/x").await;
        assert_eq!(got, (200, "B1".into(), "https".into()));
    }
    // HTTP/2 over TLS (ALPN h2).
    let s = connect(&pki, addr, "b.test", &[b"h2"]).await;
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut answers = Vec::new();
    for i in 0..10 {
        let req = http::Request::get(format!("https://b.test/h2/{i}"))
            .body(Empty::<Bytes>::new())
            .unwrap();
        answers.push(h2.send_request(req));
    }
    for a in answers {
        let r = a.await.expect("h2 response");
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-seen-proto"], "https");
    }
    // The plain listener still speaks plain HTTP.
    let c = client();
    let r = get(&c, &f.url("/plain")).await;
    assert_eq!(
        (r.status.as_u16(), r.header("x-seen-proto")),
        (200, Some("http"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirect_https_answers_308_to_the_same_url() {
    let pki = Pki::new("redirect");
    pki.leaf("a", &["a.test"]);
    let backend = TestBackend::start("B1");
    let f = Fulcrum::start(&[
        "--backend",
        &backend.spec(),
        "--tls-listen",
        "127.0.0.1:0",
        "--tls-cert",
        &pki.arg("a.pem"),
        "--tls-key",
        &pki.arg("a.key"),
        "--redirect-https",
        "on",
    ]);
    let port = https_addr(&f).port();
    let c = client();
    for method in ["GET", "POST"] {
        let r = send(
            &c,
            method,
            &f.url("/a/b?c=d"),
            &[("host", "shop.test:8080")],
            "x",
        )
        .await;
        assert_eq!(r.status, 308, "{method}");
        assert_eq!(
            r.header("location"),
            Some(format!("https://shop.test:{port}/a/b?c=d").as_str())
        );
    }
    assert_eq!(backend.requests(), 0, "nothing reached the backend");
    let s = connect(&pki, https_addr(&f), "a.test", &[b"http/1.1"]).await;
    let mut sender = h1(s).await;
    assert_eq!(
        get_h1(&mut sender, "a.test", "/").await.0,
        200,
        "https is served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_swaps_the_certificate_and_open_connections_keep_working() {
    let pki = Pki::new("reload");
    let first = pki.leaf("a", &["a.test"]);
    let backend = TestBackend::start("B1");
    let cfg = config_file(
        "tls",
        "reload",
        &format!(
            "tls_listen = \"127.0.0.1:0\"\n[[tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\n",
            pki.arg("a.pem"),
            pki.arg("a.key")
        ),
    );
    let f = Fulcrum::start(&[
        "--config",
        cfg.to_str().unwrap(),
        "--backend",
        &backend.spec(),
    ]);
    let addr = https_addr(&f);
    let before = connect(&pki, addr, "a.test", &[b"http/1.1"]).await;
    assert_eq!(leaf_of(&before), first);
    let mut kept = h1(before).await;
    assert_eq!(get_h1(&mut kept, "a.test", "/1").await.0, 200);

    let second = pki.leaf("a", &["a.test"]);
    let c = client();
    let r = admin(&c, "POST", &f.admin_url("/admin/reload"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let after = connect(&pki, addr, "a.test", &[b"http/1.1"]).await;
    assert_eq!(
        leaf_of(&after),
        second,
        "new handshakes get the new certificate"
    );
    assert_eq!(
        get_h1(&mut kept, "a.test", "/2").await.0,
        200,
        "the old connection works"
    );

    // A broken certificate refuses the reload; the current one stays.
    std::fs::write(
        pki.path("a.pem"),
        "-----BEGIN CERTIFICATE-----\nnot base64\n",
    )
    .unwrap();
    let r = admin(&c, "POST", &f.admin_url("/admin/reload"), "").await;
    assert!(r.status.is_client_error(), "{} {}", r.status, r.text());
    assert!(r.text().contains("a.pem"), "{}", r.text());
    let again = connect(&pki, addr, "a.test", &[b"http/1.1"]).await;
    assert_eq!(leaf_of(&again), second);
    assert_eq!(get_h1(&mut kept, "a.test", "/3").await.0, 200);
}

#[test]
fn a_bad_certificate_or_key_stops_the_start_with_exit_2() {
    let pki = Pki::new("bad");
    pki.leaf("a", &["a.test"]);
    pki.leaf("b", &["b.test"]);
    std::fs::write(pki.path("junk.pem"), "hello\n").unwrap();
    let cases: [(&str, &str, &str); 3] = [
        ("junk.pem", "a.key", "no certificate in"),
        ("a.pem", "b.key", "does not belong to the certificate"),
        ("a.pem", "missing.key", "missing.key"),
    ];
    for (cert, key, says) in cases {
        let (status, _, err) = run_fulcrum(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--tls-listen",
            "127.0.0.1:0",
            "--tls-cert",
            &pki.arg(cert),
            "--tls-key",
            &pki.arg(key),
        ]);
        assert_eq!(status.code(), Some(2), "{cert} {key}: {err}");
        assert!(err.contains(says) && err.contains("--tls-cert"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let (status, _, err) = run_fulcrum(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--tls-listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("tls_listen") && err.contains("certificate"),
        "{err}"
    );
    // In the file, each problem at its line, and `check` finds a bad file too.
    let cfg = config_file(
        "tls",
        "check",
        &format!(
            "tls_listen = \"127.0.0.1:0\"\n\n[[tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\n",
            pki.arg("junk.pem"),
            pki.arg("a.key"),
        ),
    );
    let (status, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("line 3: tls.certs") && err.contains("no certificate in"),
        "{err}"
    );
    let cfg = config_file(
        "tls",
        "check-key",
        "tls_listen = \"127.0.0.1:0\"\n[[tls.certs]]\ncert = \"x.pem\"\n",
    );
    let (status, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("line 2: tls.certs: missing field 'key'"),
        "{err}"
    );
}

/// A TLS 1.0 ClientHello (legacy version 3.1, no supported_versions extension, one
/// RSA suite): what a client stuck on TLS 1.0 sends.
fn tls10_client_hello() -> Vec<u8> {
    let mut body = vec![0x03, 0x01];
    body.extend([7u8; 32]); // random
    body.push(0); // no session id
    body.extend([0x00, 0x02, 0x00, 0x2f]); // TLS_RSA_WITH_AES_128_CBC_SHA
    body.extend([0x01, 0x00]); // null compression
    let mut hs = vec![0x01, 0, (body.len() >> 8) as u8, body.len() as u8];
    hs.extend(body);
    let mut rec = vec![0x16, 0x03, 0x01, (hs.len() >> 8) as u8, hs.len() as u8];
    rec.extend(hs);
    rec
}

/// What the server sends back to `bytes` before it closes (at most 2 s).
fn answer_to(addr: std::net::SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_cannot_speak_tls_12_are_refused_and_others_unaffected() {
    let pki = Pki::new("badclients");
    pki.leaf("a", &["a.test"]);
    let backend = TestBackend::start("B1");
    let f = Fulcrum::start(&[
        "--backend",
        &backend.spec(),
        "--tls-listen",
        "127.0.0.1:0",
        "--tls-cert",
        &pki.arg("a.pem"),
        "--tls-key",
        &pki.arg("a.key"),
    ]);
    let addr = https_addr(&f);
    // A good client holds a connection open through it all.
    let mut good = h1(connect(&pki, addr, "a.test", &[b"http/1.1"]).await).await;
    let old = tokio::task::spawn_blocking(move || answer_to(addr, &tls10_client_hello()));
    let junk =
        tokio::task::spawn_blocking(move || answer_to(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    let old = old.await.unwrap();
    assert_eq!(old.first(), Some(&0x15), "a TLS alert for TLS 1.0: {old:?}");
    let junk = junk.await.unwrap();
    assert!(
        junk.is_empty() || junk[0] == 0x15,
        "plain HTTP on the TLS port: {junk:?}"
    );
    // An unknown name gets the default certificate rather than a failed handshake.
    let other = connect(&pki, addr, "unknown.test", &[b"http/1.1"]).await;
    drop(other);
    assert_eq!(get_h1(&mut good, "a.test", "/still").await.0, 200);
    let fresh = connect(&pki, addr, "a.test", &[b"http/1.1"]).await;
    assert_eq!(get_h1(&mut h1(fresh).await, "a.test", "/new").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_serves_https_with_the_certificate_it_prints() {
    use std::io::BufRead;
    let mut child = std::process::Command::new(BIN)
        .args(["demo", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--backends", "1", "--tls", "--tls-listen", "127.0.0.1:0"])
        .env_remove("FULCRUM_ADMIN_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.trim_start().starts_with("https:"))
    })
    .await
    .unwrap()
    .expect("an https line");
    // "  https:     https://127.0.0.1:PORT/ (self-signed; SHA-256 fingerprint AB:…)"
    let url = line.split_whitespace().nth(1).unwrap();
    let addr: std::net::SocketAddr = url
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let printed = line.rsplit(' ').next().unwrap().trim_end_matches(')');
    let served = first_certificate(addr).await;
    let digest = ring::digest::digest(&ring::digest::SHA256, &served);
    let hex: Vec<String> = digest.as_ref().iter().map(|b| format!("{b:02X}")).collect();
    assert_eq!(
        printed,
        hex.join(":"),
        "the fingerprint printed is the certificate's"
    );
    // The certificate is its own root: trust exactly it, as a user who checked the
    // fingerprint would, and verify the name `localhost` against it.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(served).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let s = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("verified against the printed certificate");
    let mut sender = h1(s).await;
    let mut status = 0;
    for _ in 0..50 {
        status = get_h1(&mut sender, "localhost", "/hello").await.0;
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 200, "the demo's backends answer over https");
    // SAFETY: kill(2) on the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let _ = child.wait();
}

/// The leaf certificate `addr` serves, taken without verifying it.
async fn first_certificate(addr: std::net::SocketAddr) -> CertificateDer<'static> {
    #[derive(Debug)]
    struct Grab(
        Arc<rustls::crypto::CryptoProvider>,
        std::sync::Mutex<Option<CertificateDer<'static>>>,
    );
    impl rustls::client::danger::ServerCertVerifier for Grab {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            *self.1.lock().unwrap() = Some(end_entity.clone().into_owned());
            Err(rustls::Error::General("only looking".into()))
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Err(rustls::Error::General("only looking".into()))
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Err(rustls::Error::General("only looking".into()))
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let grab = Arc::new(Grab(Arc::clone(&provider), std::sync::Mutex::new(None)));
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::clone(&grab) as _)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let _ = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await;
    let got = grab.1.lock().unwrap().take();
    got.expect("a certificate")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_backends_are_verified_against_the_pools_roots() {
    let pki = Pki::new("upstream");
    let secure = H2Backend::tls("secure", &pki, "backend", &["localhost"]);
    let url = format!("https://localhost:{}", secure.addr.port());
    let pool = |name: &str, extra: &str| {
        format!("[[pools]]\nname = \"{name}\"\n{extra}[[pools.backends]]\nurl = \"{url}\"\n")
    };
    let ca = pki.arg("ca.pem");
    let text = [
        pool("private", &format!("tls_ca_file = \"{ca}\"\n")),
        pool("system", ""),
        pool("unverified", "tls_verify = false\n"),
        "[[routes]]\npool = \"private\"\npath_prefix = \"/private\"\n".into(),
        "[[routes]]\npool = \"system\"\npath_prefix = \"/system\"\n".into(),
        "[[routes]]\npool = \"unverified\"\npath_prefix = \"/unverified\"\n".into(),
    ]
    .concat();
    let cfg = config_file("tls", "upstream", &text);
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap(), "--retries", "0"]);
    let c = client();
    let r = get(&c, &f.url("/private/x")).await;
    assert_eq!(
        (r.status.as_u16(), r.text()),
        (200, "secure".into()),
        "verified with tls_ca_file"
    );
    assert_eq!(r.header("x-version"), Some("HTTP/1.1"));
    let r = get(&c, &f.url("/system/x")).await;
    assert_eq!(
        r.status,
        502,
        "a private CA is not among the system roots: {}",
        r.text()
    );
    let r = get(&c, &f.url("/unverified/x")).await;
    assert_eq!(r.status, 200, "tls_verify = false takes any certificate");
    assert!(
        f.log().contains("tls_verify = false"),
        "a warning at start:\n{}",
        f.log()
    );
    // The health checks go over TLS too, verified as the traffic is: the verified
    // pool's backend stays up, the one of the pool without the CA goes down.
    assert!(
        eventually(Duration::from_secs(20), || async {
            let p = get(&c, &f.admin_url("/admin/pools/system")).await.json();
            p["backends"][0]["healthy"] == false
        })
        .await
    );
    let p = get(&c, &f.admin_url("/admin/pools/private")).await.json();
    assert_eq!(p["backends"][0]["healthy"], true);
    // A CA file that is not one stops the start.
    let cfg = config_file(
        "tls",
        "bad-ca",
        &format!("tls_ca_file = \"{}\"\n", pki.arg("backend.key")),
    );
    let (status, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("tls_ca_file") && err.contains("no certificate"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_client_resumes_its_session() {
    let pki = Pki::new("resume");
    pki.leaf("a", &["a.test"]);
    let backend = TestBackend::start("B1");
    let f = Fulcrum::start(&[
        "--backend",
        &backend.spec(),
        "--tls-listen",
        "127.0.0.1:0",
        "--tls-cert",
        &pki.arg("a.pem"),
        "--tls-key",
        &pki.arg("a.key"),
    ]);
    let addr = https_addr(&f);
    // One client configuration, so one session store, across both connections.
    let connector = pki.client(&[b"http/1.1"]);
    let mut kinds = Vec::new();
    for _ in 0..2 {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("a.test").unwrap();
        let s = connector.connect(name, tcp).await.expect("handshake");
        kinds.push(s.get_ref().1.handshake_kind());
        // The exchange reads the session tickets TLS 1.3 sends after the handshake.
        let mut sender = h1(s).await;
        assert_eq!(get_h1(&mut sender, "a.test", "/").await.0, 200);
    }
    use rustls::HandshakeKind::{Full, Resumed};
    assert_eq!(
        kinds,
        [Some(Full), Some(Resumed)],
        "the second handshake resumes"
    );
}
