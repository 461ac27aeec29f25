//! Certificates from ACME (`docs/tls.md`, "Certificates from ACME") against a real CA:
//! Debian's pebble, validating real `http-01` requests and real `tls-alpn-01` handshakes
//! on fulcrum's listeners; the chain checked by a real TLS client against pebble's root.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;

use common::acme::*;
use common::*;

const NAME: &str = "a.acme.test";

/// A fulcrum with `[tls.acme]` for `domains` on fixed ports (pebble must know them).
struct Site {
    f: Fulcrum,
    https: std::net::SocketAddr,
    storage: std::path::PathBuf,
    config: std::path::PathBuf,
}

fn acme_config(
    tag: &str,
    ports: (u16, u16),
    acme: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("fulcrum-acme-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let storage = dir.join("acme");
    let text = format!(
        "listen = \"127.0.0.1:{}\"\ntls_listen = \"127.0.0.1:{}\"\n[tls.acme]\nstorage = \"{}\"\n{acme}\n",
        ports.0,
        ports.1,
        storage.display()
    );
    (config_file("acme", tag, &text), storage)
}

fn start(config: &std::path::Path, backend: &TestBackend) -> Fulcrum {
    Fulcrum::start_cmd(
        &["serve", "--admin", "127.0.0.1:0"],
        &[
            "--config",
            config.to_str().unwrap(),
            "--backend",
            &backend.spec(),
        ],
    )
}

fn site(tag: &str, pebble: &Pebble, ports: (u16, u16), extra: &str, b: &TestBackend) -> Site {
    let acme = format!(
        "directory = \"{}\"\nca_file = \"{}\"\nemail = \"ops@acme.test\"\n{extra}",
        pebble.directory,
        pebble.ca_file.display()
    );
    let (config, storage) = acme_config(tag, ports, &acme);
    let f = start(&config, b);
    Site {
        https: std::net::SocketAddr::from(([127, 0, 0, 1], ports.1)),
        f,
        storage,
        config,
    }
}

/// One GET for `name` over a verified TLS connection; the status.
async fn get_over_tls(
    client: &tokio_rustls::TlsConnector,
    s: &Site,
    name: &str,
) -> Result<u16, String> {
    let tls = handshake(client, s.https, name).await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::get("/")
        .header("host", name)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let rsp = send.send_request(req).await.map_err(|e| e.to_string())?;
    Ok(rsp.status().as_u16())
}

fn leaf(s: &tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> Vec<u8> {
    s.get_ref().1.peer_certificates().unwrap()[0]
        .as_ref()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http01_issues_within_seconds_the_chain_ends_at_pebbles_root_and_a_restart_reuses_it() {
    let ports = (free_port(), free_port());
    let pebble = Pebble::start("http01", ports.0, ports.1, None);
    let b = TestBackend::start("B1");
    let extra = format!("domains = [\"{NAME}\", \"www.acme.test\"]\nchallenge = \"http-01\"");
    let mut s = site("http01", &pebble, ports, &extra, &b);
    let started = Instant::now();
    let cert = wait_for_cert(&s.f, None, Duration::from_secs(20));
    eprintln!("issued in {:?}", started.elapsed());
    assert_eq!(cert["names"], serde_json::json!([NAME, "www.acme.test"]));
    assert!(
        cert["issuer"]
            .as_str()
            .unwrap()
            .starts_with("Pebble Intermediate CA"),
        "{cert}"
    );
    assert!(cert["renew_at"].as_str().unwrap() < cert["not_after"].as_str().unwrap());
    assert!(
        s.f.log().contains("/.well-known/acme-challenge/"),
        "pebble asked over http"
    );

    // A client that trusts only pebble's root, checking the name, for both names.
    let client = verifying_client(&pebble.root().await);
    for name in [NAME, "www.acme.test"] {
        assert_eq!(get_over_tls(&client, &s, name).await, Ok(200), "{name}");
    }
    let first = leaf(&handshake(&client, s.https, NAME).await.unwrap());

    // Kept private: a 0700 directory, 0600 files.
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: std::path::PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(s.storage.clone()), 0o700);
    assert_eq!(mode(s.storage.join("account.json")), 0o600);
    assert_eq!(mode(s.storage.join(format!("certs/{NAME}.pem"))), 0o600);
    assert_eq!(pebble.orders(), 1);

    // A restart serves the stored certificate at once and orders nothing.
    s.f.signal("TERM");
    s.f.wait_exit(Duration::from_secs(10))
        .expect("fulcrum stops");
    let again = start(&s.config, &b);
    let reused = wait_for_cert(&again, None, Duration::from_secs(5));
    assert_eq!(reused["not_after"], cert["not_after"]);
    assert_eq!(
        leaf(&handshake(&client, s.https, NAME).await.unwrap()),
        first
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(pebble.orders(), 1, "no new order after a restart");
    assert!(again.log().contains("serving the stored certificate"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_alpn01_issues_a_certificate_over_the_tls_listener_alone() {
    // pebble's http-01 port is closed: only the TLS listener can prove the name.
    let ports = (free_port(), free_port());
    let pebble = Pebble::start("alpn", free_port(), ports.1, None);
    let b = TestBackend::start("B1");
    let extra = format!("domains = [\"{NAME}\"]\nchallenge = \"tls-alpn-01\"");
    let s = site("alpn", &pebble, ports, &extra, &b);
    let cert = wait_for_cert(&s.f, None, Duration::from_secs(20));
    assert_eq!(cert["names"], serde_json::json!([NAME]));
    assert!(!s.f.log().contains("/.well-known/acme-challenge/"));
    let client = verifying_client(&pebble.root().await);
    assert_eq!(get_over_tls(&client, &s, NAME).await, Ok(200));
    // The challenge certificate is gone once the order is done: a CA-like handshake
    // offering only acme-tls/1 gets nothing.
    let mut alpn_only = rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAll))
        .with_no_client_auth();
    alpn_only.alpn_protocols = vec![b"acme-tls/1".to_vec()];
    let c = tokio_rustls::TlsConnector::from(Arc::new(alpn_only));
    let tcp = tokio::net::TcpStream::connect(s.https).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from(NAME).unwrap();
    assert!(c.connect(name, tcp).await.is_err());
}

/// Renewal under 500 requests per second of TLS traffic (a new connection every five
/// requests), then pebble stopped: the failed renewal is reported and the stored
/// certificate keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lived_certificate_renews_under_load_and_outlives_the_ca() {
    let ports = (free_port(), free_port());
    // 12-second certificates: renewed when a third is left, 8 s after issue.
    let mut pebble = Pebble::start("renew", ports.0, ports.1, Some(12));
    let b = TestBackend::start("B1");
    let extra = format!("domains = [\"{NAME}\"]\nrenew_before = \"1s\"");
    let s = site("renew", &pebble, ports, &extra, &b);
    let mut events = EventStream::open(&s.f);
    let first = wait_for_cert(&s.f, None, Duration::from_secs(20));
    let client = verifying_client(&pebble.root().await);
    let before = leaf(&handshake(&client, s.https, NAME).await.unwrap());

    let load = TlsLoad::start(&client, &s, 10, Duration::from_millis(20));
    let renewed = events.find(Duration::from_secs(20), |e| {
        e["type"] == "acme" && e["action"] == "renewed"
    });
    assert!(renewed.is_some(), "renewed; log:\n{}", s.f.log());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (ok, failed) = load.finish().await;
    eprintln!("{ok} requests during the renewal, {failed:?} failed");
    assert!(failed.is_empty(), "{failed:?}");
    assert!(ok > 1500, "{ok} requests");
    let second = wait_for_cert(&s.f, first["not_after"].as_str(), Duration::from_secs(1));
    // A client of its own: one that resumes a session from before the renewal rightly
    // keeps that session's certificate.
    let root = pebble.root().await;
    let fresh = verifying_client(&root);
    let after = leaf(&handshake(&fresh, s.https, NAME).await.unwrap());
    assert_ne!(before, after, "new handshakes get the new certificate");
    // Another new client for the end: `client` may still resume a session from the
    // first certificate, as any TLS 1.3 client rightly does while its ticket lives.
    let late = verifying_client(&root);

    // The CA goes away: the next renewal fails, is reported, and the certificate serves.
    pebble.stop();
    let failed = events.find(Duration::from_secs(15), |e| {
        e["type"] == "acme" && e["action"] == "failed"
    });
    let failed = failed.expect("a failed renewal is reported");
    assert!(
        failed["next"].is_string() && failed["error"].is_string(),
        "{failed}"
    );
    let metrics = raw_exchange(
        s.f.admin,
        b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(
        metrics.contains("fulcrum_acme_failures_total 1"),
        "{metrics}"
    );
    assert_eq!(acme_cert(&s.f).unwrap()["not_after"], second["not_after"]);
    assert_eq!(leaf(&handshake(&late, s.https, NAME).await.unwrap()), after);
    assert_eq!(get_over_tls(&client, &s, NAME).await, Ok(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_ca_or_a_refused_name_is_an_event_and_a_metric_and_plain_http_serves() {
    let ports = (free_port(), free_port());
    let pebble = Pebble::start("refused", ports.0, ports.1, None);
    let b = TestBackend::start("B1");
    let extra = format!("domains = [\"{REFUSED}\"]");
    let refused = site("refused", &pebble, ports, &extra, &b);
    let mut events = EventStream::open(&refused.f);
    let e = events.find(Duration::from_secs(10), |e| {
        e["type"] == "acme" && e["action"] == "failed"
    });
    let e = e.expect("the refusal is reported");
    assert!(
        e["error"].as_str().unwrap().contains("rejectedIdentifier")
            || e["error"].as_str().unwrap().contains("blocked"),
        "{e}"
    );
    drop(refused);

    // Nothing listens where the directory is said to be. A file certificate covers one
    // of the two names: it serves that one meanwhile.
    let pki = common::tls::Pki::new("acme-file");
    pki.leaf("www", &["www.acme.test"]);
    let ports = (free_port(), free_port());
    let acme = format!(
        "directory = \"https://127.0.0.1:{}/dir\"\ndomains = [\"{NAME}\", \"www.acme.test\"]",
        free_port()
    );
    let (config, _) = acme_config("unreachable", ports, &acme);
    let file_cert = format!(
        "[[tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\n",
        pki.arg("www.pem"),
        pki.arg("www.key")
    );
    let text = std::fs::read_to_string(&config).unwrap();
    let (top, table) = text.split_at(text.find("[tls.acme]").unwrap());
    std::fs::write(&config, format!("{top}{file_cert}{table}")).unwrap();
    let f = start(&config, &b);
    let mut events = EventStream::open(&f);
    let e = events.find(Duration::from_secs(10), |e| {
        e["type"] == "acme" && e["action"] == "failed"
    });
    assert!(e.is_some(), "reported; log:\n{}", f.log());
    let metrics = raw_exchange(
        f.admin,
        b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(
        metrics.contains("fulcrum_acme_failures_total 1"),
        "{metrics}"
    );
    // Until a certificate is issued a handshake for the name fails; plain HTTP serves.
    let client = verifying_client(&pebble.root().await);
    let https = std::net::SocketAddr::from(([127, 0, 0, 1], ports.1));
    let Err(refused) = handshake(&client, https, NAME).await else {
        panic!("a handshake before any certificate is issued");
    };
    assert!(refused.contains("UnrecognisedName"), "{refused}");
    let tcp = tokio::net::TcpStream::connect(https).await.unwrap();
    let www = rustls::pki_types::ServerName::try_from("www.acme.test").unwrap();
    let s = pki.client(&[b"http/1.1"]).connect(www, tcp).await;
    assert!(s.is_ok(), "the file certificate serves its name: {s:?}");
    let plain = raw_exchange(
        f.proxy,
        b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(plain.starts_with("HTTP/1.1 200"), "{plain}");
}

#[test]
fn bad_acme_settings_exit_2_naming_them() {
    let dir = std::env::temp_dir().join(format!("fulcrum-acme-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let base = "directory = \"https://127.0.0.1:1/dir\"\ndomains = [\"a.acme.test\"]";
    let cases = [
        (
            "challenge",
            format!("{base}\nchallenge = \"http01\""),
            "unknown challenge 'http01' (valid: http-01, tls-alpn-01)",
        ),
        (
            "file",
            format!("{base}\nstorage = \"{}\"", file.display()),
            "is not a directory",
        ),
        (
            "unwritable",
            format!("{base}\nstorage = \"/proc/fulcrum-acme\""),
            "not a writable directory",
        ),
        (
            "wildcard",
            "directory = \"https://ca.test/dir\"\ndomains = [\"*.acme.test\"]".to_string(),
            "dns-01",
        ),
        (
            "nodomains",
            "directory = \"https://ca.test/dir\"".to_string(),
            "missing field 'domains'",
        ),
        (
            "url",
            "directory = \"ca.test\"\ndomains = [\"a.acme.test\"]".to_string(),
            "not an https:// URL",
        ),
        (
            "key",
            format!("{base}\nchalenge = \"http-01\""),
            "unknown key 'tls.acme.chalenge'",
        ),
        (
            "type",
            format!("{base}\nchallenge = 5"),
            "tls.acme.challenge: expected a string",
        ),
        (
            "nodir",
            "directry = \"https://ca.test/dir\"\ndomains = [\"a.acme.test\"]".to_string(),
            "unknown key 'tls.acme.directry'",
        ),
        (
            "empty",
            "directory = \"https://ca.test/dir\"\ndomains = []".to_string(),
            "at least one name",
        ),
        (
            "http",
            "directory = \"http://ca.test/dir\"\ndomains = [\"a.acme.test\"]".to_string(),
            "only for a CA on this host",
        ),
        (
            "renew",
            format!("{base}\nrenew_before = \"0s\""),
            "more than 0",
        ),
    ];
    for (tag, acme, want) in cases {
        let text = format!("tls_listen = \"127.0.0.1:0\"\n[tls.acme]\n{acme}\n");
        let cfg = config_file("acme-bad", tag, &text);
        let (status, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
        assert_eq!(status.code(), Some(2), "{tag}: {err}");
        assert!(err.contains(want), "{tag}: {err}");
        assert!(
            err.contains(" line ") && err.contains("tls.acme"),
            "{tag} names the key and its line: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{tag}: one line: {err}");
    }
    // Without tls_listen there is nowhere to serve it.
    let cfg = config_file(
        "acme-bad",
        "nolisten",
        "[tls.acme]\ndirectory = \"https://ca.test/dir\"\ndomains = [\"a.acme.test\"]\n",
    );
    let (status, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("it needs tls_listen"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Takes any certificate (for a handshake whose certificate is not the point).
#[derive(Debug)]
struct AcceptAll;

impl rustls::client::danger::ServerCertVerifier for AcceptAll {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `clients` loops of verified TLS connections, five requests each, one request every
/// `every` per loop; counts what succeeded and keeps what failed.
struct TlsLoad {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<String>>>,
    ok: Arc<AtomicU64>,
}

impl TlsLoad {
    fn start(
        client: &tokio_rustls::TlsConnector,
        s: &Site,
        clients: usize,
        every: Duration,
    ) -> TlsLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let tasks = (0..clients)
            .map(|_| {
                let (client, stop, ok, addr) =
                    (client.clone(), Arc::clone(&stop), Arc::clone(&ok), s.https);
                tokio::spawn(async move {
                    let mut failed = Vec::new();
                    let mut tick = tokio::time::interval(every);
                    while !stop.load(Ordering::Relaxed) {
                        if let Err(e) = five_requests(&client, addr, &mut tick, &ok).await {
                            failed.push(e);
                        }
                    }
                    failed
                })
            })
            .collect();
        TlsLoad { stop, tasks, ok }
    }

    async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let mut failed = Vec::new();
        for t in self.tasks {
            failed.extend(t.await.unwrap());
        }
        (self.ok.load(Ordering::Relaxed), failed)
    }
}

async fn five_requests(
    client: &tokio_rustls::TlsConnector,
    addr: std::net::SocketAddr,
    tick: &mut tokio::time::Interval,
    ok: &AtomicU64,
) -> Result<(), String> {
    tick.tick().await;
    let tls = handshake(client, addr, NAME).await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    for i in 0..5 {
        if i > 0 {
            tick.tick().await;
        }
        send.ready().await.map_err(|e| e.to_string())?;
        let req = http::Request::get("/")
            .header("host", NAME)
            .body(Empty::<Bytes>::new())
            .unwrap();
        let rsp = send.send_request(req).await.map_err(|e| e.to_string())?;
        if rsp.status() != 200 {
            return Err(format!("status {}", rsp.status()));
        }
        ok.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Three instances of a fleet on one etcd, behind one port for pebble's validations
/// (each connection to the next instance): one order is placed, every instance answers
/// the challenges and serves the certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_places_one_order_and_every_instance_answers_and_serves() {
    let etcd = common::etcd::Etcd::start("acme");
    let store = etcd.store("acme");
    let http = free_port();
    let pebble = Pebble::start("fleet", http, free_port(), None);
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let plain = ports
        .iter()
        .map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], p.0)))
        .collect();
    let _relay = RoundRobin::start(http, plain);
    let acme = format!(
        "directory = \"{}\"\nca_file = \"{}\"\ndomains = [\"{NAME}\"]",
        pebble.directory,
        pebble.ca_file.display()
    );
    let fleet: Vec<Fulcrum> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (config, _) = acme_config(&format!("fleet{i}"), *p, &acme);
            Fulcrum::start_cmd(
                &["serve", "--admin", "127.0.0.1:0"],
                &["--config", config.to_str().unwrap(), "--store", &store],
            )
        })
        .collect();
    let certs: Vec<serde_json::Value> = fleet
        .iter()
        .map(|f| wait_for_cert(f, None, Duration::from_secs(20)))
        .collect();
    assert!(
        certs
            .iter()
            .all(|c| c["not_after"] == certs[0]["not_after"]),
        "{certs:?}"
    );
    let client = verifying_client(&pebble.root().await);
    let mut leaves = Vec::new();
    for p in &ports {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], p.1));
        leaves.push(leaf(
            &handshake(&client, addr, NAME)
                .await
                .expect("a verified chain"),
        ));
    }
    assert!(
        leaves.iter().all(|l| *l == leaves[0]),
        "one certificate for all"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(pebble.orders(), 1, "exactly one order");
    let answered: Vec<usize> = fleet
        .iter()
        .map(|f| {
            f.log()
                .lines()
                .filter(|l| l.contains("/.well-known/acme-challenge/") && l.contains("status=200"))
                .count()
        })
        .collect();
    eprintln!("challenge requests answered per instance: {answered:?}");
    assert!(
        answered.iter().filter(|n| **n > 0).count() >= 2,
        "{answered:?}"
    );
}
