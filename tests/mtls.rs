//! Mutual TLS (`docs/tls.md`, "Mutual TLS") over real sockets: client certificates made
//! at test time (rcgen) checked by the HTTPS listener for h1, h2 and h3, a route's name
//! rule, `X-Forwarded-Client-Cert`, CRLs, a reload of the CA bundle, and a pool's own
//! certificate presented to a backend that requires one.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::h3::*;
use common::tls::*;
use common::*;

/// A CA for client certificates, its certificate written to `FILE`.
struct ClientCa {
    dir: std::path::PathBuf,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

/// A client's chain and key.
type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

impl ClientCa {
    fn new(dir: &Path, file: &str, cn: &str) -> ClientCa {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join(file), cert.pem()).unwrap();
        ClientCa {
            dir: dir.to_path_buf(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A client certificate with serial `serial`, these DNS and URI names and the common
    /// name `cn`; expired when `expired`. Written to `FILE.pem`/`FILE.key` too.
    fn client(
        &self,
        file: &str,
        cn: &str,
        dns: &[&str],
        uris: &[&str],
        serial: u64,
        expired: bool,
    ) -> Identity {
        let mut params =
            rcgen::CertificateParams::new(dns.iter().map(|d| d.to_string()).collect::<Vec<_>>())
                .unwrap();
        for u in uris {
            params
                .subject_alt_names
                .push(rcgen::SanType::URI((*u).try_into().unwrap()));
        }
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.serial_number = Some(rcgen::SerialNumber::from(serial));
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::write(self.dir.join(format!("{file}.pem")), cert.pem()).unwrap();
        std::fs::write(self.dir.join(format!("{file}.key")), key.serialize_pem()).unwrap();
        let der = PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        (vec![cert.der().clone()], der)
    }

    /// A CRL revoking `serials`, written to `file`.
    fn crl(&self, file: &str, serials: &[u64]) {
        let revoked = serials
            .iter()
            .map(|s| rcgen::RevokedCertParams {
                serial_number: rcgen::SerialNumber::from(*s),
                revocation_time: rcgen::date_time_ymd(2024, 1, 1),
                reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                invalidity_date: None,
            })
            .collect();
        let crl = rcgen::CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2024, 1, 1),
            next_update: rcgen::date_time_ymd(2099, 1, 1),
            crl_number: rcgen::SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: revoked,
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        }
        .signed_by(&self.issuer)
        .unwrap();
        std::fs::write(self.dir.join(file), crl.pem().unwrap()).unwrap();
    }
}

/// A client configuration trusting the test PKI's CA, presenting `id` when given.
fn client_config(pki: &Pki, id: Option<&Identity>, alpn: &[&[u8]]) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca_der()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match id {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// A TLS connection to fulcrum as `id`; `None` when the handshake fails.
async fn tls_as(
    pki: &Pki,
    addr: std::net::SocketAddr,
    id: Option<&Identity>,
    alpn: &[&[u8]],
) -> Option<tokio_rustls::client::TlsStream<TcpStream>> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config(pki, id, alpn)));
    tls_with(&connector, addr).await
}

/// A TLS connection through `connector`, which resumes a session it holds a ticket for.
async fn tls_with(
    connector: &tokio_rustls::TlsConnector,
    addr: std::net::SocketAddr,
) -> Option<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("a.test").unwrap();
    connector.connect(name, tcp).await.ok()
}

/// One GET over `s`, read to its close: the status, the answer, and whether the session
/// was resumed; `None` when the connection was refused.
async fn get_over(
    mut s: tokio_rustls::client::TlsStream<TcpStream>,
    path: &str,
) -> Option<(u16, bool)> {
    let resumed = s.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
    let req = format!("GET {path} HTTP/1.1\r\nhost: a.test\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
        .await
        .ok()?
        .ok()?;
    let status = String::from_utf8_lossy(got.get(9..12)?).parse().ok()?;
    Some((status, resumed))
}

/// One HTTP/1.1 GET over a new TLS connection as `id`, with `extra` header lines:
/// the status and the answer's head, or `None` when the connection was refused
/// (in TLS 1.3 a refused client certificate shows as the first read failing).
async fn h1_get(
    pki: &Pki,
    addr: std::net::SocketAddr,
    id: Option<&Identity>,
    path: &str,
    extra: &str,
) -> Option<(u16, String)> {
    let mut s = tls_as(pki, addr, id, &[b"http/1.1"]).await?;
    let req = format!("GET {path} HTTP/1.1\r\nhost: a.test\r\n{extra}connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text.get(9..12)?.parse().ok()?;
    Some((status, text))
}

/// The value of the field `name` in an HTTP/1.1 answer's text.
fn field<'t>(answer: &'t str, name: &str) -> Option<&'t str> {
    answer.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The lowercase hex SHA-256 of `der`, as XFCC's `Hash`.
fn sha256_hex(der: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, der)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fulcrum with the HTTPS listener (HTTP/3 too), `[tls.client_auth]` as `auth`
/// (TOML lines), a route `/secure` with `rule` and a plain route, over `backend`.
fn mtls_fulcrum(
    pki: &Pki,
    tag: &str,
    auth: &str,
    rule: &str,
    backend: &TestBackend,
) -> (Fulcrum, std::path::PathBuf) {
    let text = format!(
        "tls_listen = \"127.0.0.1:0\"\naccess_log_format = \"json\"\n[tls]\nhttp3 = true\n[[tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\n[tls.client_auth]\n{auth}\n[[pools]]\nname = \"web\"\nbackends = [{{ url = \"{}\" }}]\n[[routes]]\npool = \"web\"\npath_prefix = \"/secure\"\nclient_cert = {rule}\n[[routes]]\npool = \"web\"\n",
        pki.arg("a.pem"),
        pki.arg("a.key"),
        backend.url(),
    );
    let cfg = config_file("mtls", tag, &text);
    let f = Fulcrum::start(&[
        "--config",
        cfg.to_str().unwrap(),
        "--health-interval",
        "60s",
    ]);
    (f, cfg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_names_rule_holds_over_h1_h2_and_h3_and_xfcc_is_ours_alone() {
    let pki = Pki::new("mtls-rule");
    pki.leaf("a", &["a.test"]);
    let ca = ClientCa::new(&pki.dir, "clients.pem", "clients CA");
    let web = ca.client("web", "web", &[], &["spiffe://prod.example/web"], 10, false);
    let api = ca.client(
        "api",
        "api, the \"edge\"",
        &["api.svc.example"],
        &[],
        11,
        false,
    );
    let other = ca.client("other", "other", &["api.other.example"], &[], 12, false);
    let a = TestBackend::start("A");
    let auth = format!("ca_file = \"{}\"", pki.arg("clients.pem"));
    let rule = "{ sans = [\"spiffe://prod.example/web\", \"*.svc.example\"] }";
    let (f, _) = mtls_fulcrum(&pki, "rule", &auth, rule, &a);
    let addr = https_addr(&f);

    // h1: the URI name, then the wildcard; a forged XFCC never reaches the backend.
    let forged = "x-forwarded-client-cert: Hash=forged;Subject=\"CN=admin\"\r\n";
    let (status, text) = h1_get(&pki, addr, Some(&web), "/secure/web", forged)
        .await
        .unwrap();
    assert_eq!(status, 200, "{text}");
    let xfcc = field(&text, "x-seen-xfcc").expect("XFCC reached the backend");
    let expected = format!(
        "Hash={};Subject=\"CN=web\";URI=spiffe://prod.example/web",
        sha256_hex(&web.0[0])
    );
    assert_eq!(xfcc, expected);
    let (status, text) = h1_get(&pki, addr, Some(&api), "/secure/a", "")
        .await
        .unwrap();
    assert_eq!(status, 200, "{text}");
    let xfcc = field(&text, "x-seen-xfcc").unwrap();
    assert!(
        xfcc.contains(r#"Subject="CN=api\, the \"edge\"";DNS=api.svc.example"#),
        "{xfcc}"
    );
    // Another name, and none at all: 403; the plain route still answers, without XFCC.
    let (status, text) = h1_get(&pki, addr, Some(&other), "/secure/a", "")
        .await
        .unwrap();
    assert_eq!(status, 403, "{text}");
    assert!(text.ends_with("client certificate required\n"), "{text}");
    let (status, _) = h1_get(&pki, addr, None, "/secure/a", "").await.unwrap();
    assert_eq!(status, 403);
    let (status, text) = h1_get(&pki, addr, None, "/open", forged).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        field(&text, "x-seen-xfcc"),
        None,
        "the client's own XFCC is removed: {text}"
    );

    // Explain, told the connection's certificate by its names: the rule's answer.
    let c = client();
    for (cert, step) in [
        (r#"{"sans": ["spiffe://prod.example/web"]}"#, None),
        (r#"{"sans": ["API.svc.example"]}"#, None),
        (r#"{"sans": ["api.other.example"]}"#, Some("client_cert")),
        ("null", Some("client_cert")),
    ] {
        let q = format!(r#"{{"path": "/secure/x", "client_cert": {cert}}}"#);
        let e = admin(&c, "POST", &f.admin_url("/admin/explain"), &q).await;
        assert_eq!(e.status, 200, "{}", e.text());
        let e = e.json();
        assert_eq!(e["step"].as_str(), step, "{cert}: {e}");
        assert_eq!(e["backend"].is_u64(), step.is_none(), "{cert}: {e}");
    }
    let q = r#"{"path": "/secure/x", "client_cert": {"names": []}}"#;
    let e = admin(&c, "POST", &f.admin_url("/admin/explain"), q).await;
    assert_eq!(e.status, 400, "{}", e.text());

    // h2 (the fast path hands nothing over: hyper's h2 front end).
    for (id, want) in [(Some(&web), 200), (Some(&other), 403), (None, 403)] {
        let s = tls_as(&pki, addr, id, &[b"h2"]).await.unwrap();
        let (mut h2, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            TokioIo::new(s),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        let req = http::Request::get("https://a.test/secure/h2")
            .header("x-forwarded-client-cert", "forged")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = h2.send_request(req).await.unwrap();
        assert_eq!(
            resp.status().as_u16(),
            want,
            "h2 as {:?}",
            id.map(|i| sha256_hex(&i.0[0]))
        );
        if want == 200 {
            let seen = resp.headers()["x-seen-xfcc"].to_str().unwrap();
            assert_eq!(seen, expected, "ours alone, the forged one gone");
        }
        let _ = resp.into_body().collect().await;
        // The open route: whatever the certificate, the client's own XFCC never passes.
        let req = http::Request::get("https://a.test/open/h2")
            .header("x-forwarded-client-cert", "forged")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = h2.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let seen = resp
            .headers()
            .get("x-seen-xfcc")
            .map(|v| v.to_str().unwrap().to_string());
        let ours = id.map(|i| format!("Hash={}", sha256_hex(&i.0[0])));
        assert_eq!(
            seen.as_deref().map(|s| &s[..69]),
            ours.as_deref(),
            "h2 open route"
        );
    }

    // h3: the identity from QUIC's handshake.
    for (id, want) in [(Some(&web), 200), (None, 403)] {
        let tls = client_config(&pki, id, &[]);
        let (mut h3, _quic) = h3_connection_tls(addr, "a.test", tls, None).await;
        let (status, headers, _) =
            h3_request(&mut h3, "GET", "https://a.test/secure/h3", None).await;
        assert_eq!(status, want, "h3");
        if want == 200 {
            assert_eq!(headers["x-seen-xfcc"].to_str().unwrap(), expected);
        }
    }

    // The json access log names the subject, or null.
    let line = f
        .log_line(
            &["\"path\":\"/secure/web\"", "\"status\":200"],
            Duration::from_secs(5),
        )
        .expect("an access line");
    assert!(line.contains("\"client_cert\":\"CN=web\""), "{line}");
    let line = f
        .log_line(&["\"path\":\"/open\""], Duration::from_secs(5))
        .expect("an access line");
    assert!(line.contains("\"client_cert\":null"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_expired_revoked_and_missing_certificates_are_refused_and_counted() {
    let pki = Pki::new("mtls-refused");
    pki.leaf("a", &["a.test"]);
    let ca = ClientCa::new(&pki.dir, "clients.pem", "clients CA");
    let good = ca.client("good", "good", &["good.svc.example"], &[], 20, false);
    let expired = ca.client("old", "old", &["old.svc.example"], &[], 21, true);
    let revoked = ca.client("gone", "gone", &["gone.svc.example"], &[], 22, false);
    ca.crl("revoked.pem", &[22]);
    let stranger_ca = ClientCa::new(&pki.dir, "strangers.pem", "strangers CA");
    let stranger = stranger_ca.client(
        "stranger",
        "stranger",
        &["good.svc.example"],
        &[],
        20,
        false,
    );
    let a = TestBackend::start("A");
    let auth = format!(
        "ca_file = \"{}\"\nmode = \"require\"\ncrl_files = [\"{}\"]",
        pki.arg("clients.pem"),
        pki.arg("revoked.pem")
    );
    let (f, _) = mtls_fulcrum(&pki, "refused", &auth, "{}", &a);
    let addr = https_addr(&f);
    let (status, _) = h1_get(&pki, addr, Some(&good), "/secure/x", "")
        .await
        .unwrap();
    assert_eq!(
        status, 200,
        "a verified certificate passes `client_cert = {{}}`"
    );
    for (id, what) in [
        (&stranger, "another CA's"),
        (&expired, "an expired"),
        (&revoked, "a revoked"),
    ] {
        assert!(
            h1_get(&pki, addr, Some(id), "/open", "").await.is_none(),
            "{what} certificate is refused"
        );
    }
    assert!(
        h1_get(&pki, addr, None, "/open", "").await.is_none(),
        "none, in require mode"
    );
    let c = client();
    let metrics = get(&c, &f.admin_url("/metrics")).await.text();
    for reason in ["unknown_ca", "expired", "revoked", "missing"] {
        let line = format!("\nfulcrum_tls_client_auth_failures_total{{reason=\"{reason}\"}} 1\n");
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    }
    // The admin API lists the client CA bundle.
    let certs = get(&c, &f.admin_url("/admin/certificates")).await.json();
    let ca_row = certs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["source"] == "client_ca")
        .expect("the client CA listed");
    assert_eq!(ca_row["names"][0], "CN=clients CA");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_swaps_the_ca_bundle_and_open_connections_keep_going() {
    let pki = Pki::new("mtls-reload");
    pki.leaf("a", &["a.test"]);
    let one = ClientCa::new(&pki.dir, "one.pem", "CA one");
    let two = ClientCa::new(&pki.dir, "two.pem", "CA two");
    let by_one = one.client("by-one", "by-one", &["x.svc.example"], &[], 30, false);
    let by_two = two.client("by-two", "by-two", &["x.svc.example"], &[], 31, false);
    let a = TestBackend::start("A");
    let auth = |file: &str| format!("ca_file = \"{}\"\nmode = \"require\"", pki.arg(file));
    let (f, cfg) = mtls_fulcrum(&pki, "reload", &auth("one.pem"), "{}", &a);
    let addr = https_addr(&f);
    let s = tls_as(&pki, addr, Some(&by_one), &[b"http/1.1"])
        .await
        .unwrap();
    let mut open = h1(s).await;
    assert_eq!(get_h1(&mut open, "a.test", "/secure/1").await.0, 200);
    assert!(h1_get(&pki, addr, Some(&by_two), "/open", "")
        .await
        .is_none());
    // A client that resumes its sessions: its second connection is a resumed one.
    let resuming = tokio_rustls::TlsConnector::from(Arc::new(client_config(
        &pki,
        Some(&by_one),
        &[b"http/1.1"],
    )));
    let first = get_over(tls_with(&resuming, addr).await.unwrap(), "/secure/full").await;
    assert_eq!(first, Some((200, false)));
    let second = get_over(tls_with(&resuming, addr).await.unwrap(), "/secure/resumed").await;
    assert_eq!(
        second,
        Some((200, true)),
        "the session resumed before the reload"
    );
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace(&pki.arg("one.pem"), &pki.arg("two.pem"));
    std::fs::write(&cfg, text).unwrap();
    f.signal("HUP");
    assert!(
        f.log_line(&["reloaded"], Duration::from_secs(10)).is_some(),
        "{}",
        f.log()
    );
    assert_eq!(
        get_h1(&mut open, "a.test", "/secure/2").await.0,
        200,
        "the open connection keeps its certificate"
    );
    assert!(
        h1_get(&pki, addr, Some(&by_one), "/open", "")
            .await
            .is_none(),
        "CA one is no longer trusted"
    );
    // A session of CA one's certificate does not resume past the reload.
    let again = match tls_with(&resuming, addr).await {
        Some(s) => get_over(s, "/secure/after").await,
        None => None,
    };
    assert_eq!(again, None, "refused, though it holds a ticket");
    assert_eq!(
        h1_get(&pki, addr, Some(&by_two), "/secure/3", "")
            .await
            .map(|r| r.0),
        Some(200)
    );
}

/// A TLS backend that requires a client certificate from `ca` and answers every
/// request `200` with `x-client: CN` of the certificate presented; its address.
fn strict_backend(pki: &Pki, ca_file: &Path) -> std::net::SocketAddr {
    pki.leaf("backend", &["backend.test"]);
    let chain: Vec<CertificateDer<'static>> =
        rustls::pki_types::pem::PemObject::pem_file_iter(pki.path("backend.pem"))
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
    let key: PrivateKeyDer<'static> =
        rustls::pki_types::pem::PemObject::from_pem_file(pki.path("backend.key")).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_file_iter(ca_file).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::clone(&provider),
    )
    .build()
    .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut s) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let cn = s
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first().cloned())
                        .map(|c| {
                            let text = String::from_utf8_lossy(c.as_ref()).into_owned();
                            if text.contains("fulcrum-pool") {
                                "fulcrum-pool"
                            } else {
                                "other"
                            }
                        })
                        .unwrap_or("none");
                    let mut buf = vec![0u8; 4096];
                    loop {
                        let mut head = Vec::new();
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                        }
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-client: {cn}\r\n\r\nok"
                        );
                        if s.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_presents_its_certificate_to_a_backend_that_requires_one() {
    let pki = Pki::new("mtls-pool");
    let ca = ClientCa::new(&pki.dir, "clients.pem", "clients CA");
    ca.client("pool", "fulcrum-pool", &[], &[], 40, false);
    let backend = strict_backend(&pki, &pki.path("clients.pem"));
    let url = format!("https://127.0.0.1:{}", backend.port());
    let text = format!(
        "[[pools]]\nname = \"with\"\ntls_ca_file = \"{ca}\"\ntls_verify = false\ntls_client_cert = \"{cert}\"\ntls_client_key = \"{key}\"\nbackends = [{{ url = \"{url}\" }}]\n[[pools]]\nname = \"without\"\ntls_verify = false\nbackends = [{{ url = \"{url}\" }}]\n[[routes]]\npool = \"without\"\npath_prefix = \"/without\"\n[[routes]]\npool = \"with\"\n",
        ca = pki.arg("ca.pem"),
        cert = pki.arg("pool.pem"),
        key = pki.arg("pool.key"),
    );
    let cfg = config_file("mtls", "pool", &text);
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap(), "--health-interval", "1s"]);
    let c = client();
    let got = get(&c, &f.url("/with")).await;
    assert_eq!(got.status, 200, "{}", f.log());
    assert_eq!(got.header("x-client"), Some("fulcrum-pool"));
    // Without a certificate the backend refuses every handshake, health checks included.
    let refused = get(&c, &f.url("/without")).await;
    assert!(
        refused.status == 502 || refused.status == 503,
        "{}",
        refused.status
    );
    let certs = get(&c, &f.admin_url("/admin/certificates")).await.json();
    let row = certs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["source"] == "pool:with")
        .expect("the pool's certificate listed");
    assert_eq!(row["names"][0], "CN=fulcrum-pool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_client_auth_settings_exit_2_naming_them() {
    let pki = Pki::new("mtls-bad");
    pki.leaf("a", &["a.test"]);
    let ca = ClientCa::new(&pki.dir, "clients.pem", "clients CA");
    let other = ClientCa::new(&pki.dir, "other.pem", "other CA");
    other.crl("other-crl.pem", &[1]);
    ca.client("pool", "pool", &[], &[], 50, false);
    pki.leaf("stray", &["stray.test"]);
    let base = |auth: &str, route: &str, pool: &str| {
        format!(
            "tls_listen = \"127.0.0.1:0\"\n[[tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\n{auth}\n[[pools]]\nname = \"web\"\n{pool}backends = [{{ url = \"http://127.0.0.1:9\" }}]\n[[routes]]\npool = \"web\"\n{route}\n",
            pki.arg("a.pem"),
            pki.arg("a.key")
        )
    };
    let ca_file = pki.arg("clients.pem");
    let cases = [
        (
            base(
                "[tls.client_auth]\nca_file = \"/nonexistent/ca.pem\"",
                "",
                "",
            ),
            "line 5: tls.client_auth",
            "/nonexistent/ca.pem",
        ),
        (
            base(
                &format!(
                    "[tls.client_auth]\nca_file = \"{ca_file}\"\ncrl_files = [\"{}\"]",
                    pki.arg("other-crl.pem")
                ),
                "",
                "",
            ),
            "tls.client_auth",
            "issued by a CA that is not in",
        ),
        (
            base(
                &format!("[tls.client_auth]\nca_file = \"{ca_file}\"\nmode = \"sometimes\""),
                "",
                "",
            ),
            "tls.client_auth.mode",
            "expected optional or require",
        ),
        (
            base(
                &format!("[tls.client_auth]\nca_file = \"{ca_file}\""),
                "client_cert = { sans = \"web\" }",
                "",
            ),
            "routes",
            "client_cert.sans: expected a list of strings",
        ),
        (
            base("", "client_cert = {}", ""),
            "routes.client_cert",
            "it needs [tls.client_auth]",
        ),
        (
            base(
                "",
                "",
                &format!(
                    "tls_client_cert = \"{}\"\ntls_client_key = \"{}\"\n",
                    pki.arg("pool.pem"),
                    pki.arg("stray.key")
                ),
            ),
            "pool 'web': tls_client_key",
            "does not belong",
        ),
    ];
    for (i, (text, names, says)) in cases.iter().enumerate() {
        let cfg = config_file("mtls-bad", &format!("case{i}"), text);
        let (status, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
        assert_eq!(status.code(), Some(2), "case {i}: {err}");
        assert!(err.contains(names) && err.contains(says), "case {i}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    // The admin API refuses a bad rule, and one no listener can verify, with 400.
    let a = TestBackend::start("A");
    let f = Fulcrum::over(&[&a], &["--health-interval", "60s"]);
    let c = client();
    for (body, says) in [
        (
            r#"[{"pool":"default","client_cert":{"sans":"web"}}]"#,
            "expected a list of strings",
        ),
        (
            r#"[{"pool":"default","client_cert":{}}]"#,
            "needs [tls.client_auth]",
        ),
    ] {
        let got = admin(&c, "PUT", &f.admin_url("/admin/routes"), body).await;
        assert_eq!(got.status, 400, "{}", got.text());
        assert!(got.text().contains(says), "{}", got.text());
    }
    assert_eq!(
        get(&c, &f.url("/")).await.status,
        200,
        "the routes in force are unchanged"
    );
}
