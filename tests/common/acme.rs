//! ACME test support: Debian's `pebble` (Let's Encrypt's test CA) and
//! `pebble-challtestsrv` (its DNS, answering every name with 127.0.0.1) on ephemeral
//! ports, pebble's own HTTPS certificate made at test time, and a TLS client that trusts
//! pebble's root and checks names as a browser would.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::tls::Pki;
use super::{free_port, Fulcrum};

/// A name pebble refuses to issue for (its `domainBlocklist`).
pub const REFUSED: &str = "refused.acme.test";

/// A running pebble and its DNS server, killed on drop.
pub struct Pebble {
    pebble: Option<Child>,
    dns: Child,
    /// The directory URL.
    pub directory: String,
    /// The management interface (pebble's roots).
    pub management: SocketAddr,
    /// Trust for pebble's own HTTPS (`[tls.acme] ca_file`).
    pub ca_file: PathBuf,
    log: Arc<Mutex<String>>,
    pki: Pki,
}

impl Pebble {
    /// Starts pebble validating `http-01` on `http_port` and `tls-alpn-01` on
    /// `tls_port` of 127.0.0.1, issuing certificates valid `validity` seconds (pebble's
    /// default of five years when `None`).
    pub fn start(tag: &str, http_port: u16, tls_port: u16, validity: Option<u64>) -> Pebble {
        let pki = Pki::new(&format!("pebble-{tag}"));
        pki.leaf("pebble", &["127.0.0.1", "localhost"]);
        let (listen, management, dns_port) = (free_port(), free_port(), free_port());
        let dns = Command::new("pebble-challtestsrv")
            .args(["-dns01", &format!("127.0.0.1:{dns_port}")])
            .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
            .args(["-management", &format!("127.0.0.1:{}", free_port())])
            .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pebble-challtestsrv (Debian's pebble package) runs");
        let config = serde_json::json!({"pebble": {
            "listenAddress": format!("127.0.0.1:{listen}"),
            "managementListenAddress": format!("127.0.0.1:{management}"),
            "certificate": pki.arg("pebble.pem"),
            "privateKey": pki.arg("pebble.key"),
            "httpPort": http_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
            "domainBlocklist": [REFUSED],
            "certificateValidityPeriod": validity.unwrap_or(0),
        }});
        let path = pki.path("pebble.json");
        std::fs::write(&path, config.to_string()).unwrap();
        let mut me = Pebble {
            pebble: None,
            dns,
            directory: format!("https://127.0.0.1:{listen}/dir"),
            management: SocketAddr::from(([127, 0, 0, 1], management)),
            ca_file: pki.path("ca.pem"),
            log: Arc::new(Mutex::new(String::new())),
            pki,
        };
        me.run(&path, dns_port);
        me
    }

    fn run(&mut self, config: &std::path::Path, dns_port: u16) {
        let mut child = Command::new("pebble")
            .args(["-config", config.to_str().unwrap()])
            .args([
                "-dnsserver",
                &format!("127.0.0.1:{dns_port}"),
                "-strict=false",
            ])
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("pebble (Debian's pebble package) runs");
        let out = child.stdout.take().unwrap();
        let log = Arc::clone(&self.log);
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut l = log.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        self.pebble = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.log().contains("ACME directory available") {
            assert!(
                Instant::now() < deadline,
                "pebble did not start:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What pebble printed.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Orders placed with pebble so far.
    pub fn orders(&self) -> usize {
        self.log().matches("POST /order-plz").count()
    }

    /// Stops pebble (its DNS server keeps running).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.pebble.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Pebble's root certificate (made anew at each start), from its management API.
    pub async fn root(&self) -> CertificateDer<'static> {
        let tcp = TcpStream::connect(self.management).await.unwrap();
        let tls = self
            .pki
            .client(&[b"http/1.1"])
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        let req = http::Request::get("/roots/0")
            .header("host", "localhost")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let rsp = send.send_request(req).await.unwrap();
        use http_body_util::BodyExt as _;
        let pem = rsp.into_body().collect().await.unwrap().to_bytes();
        CertificateDer::from_pem_slice(&pem).expect("pebble's root is PEM")
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        self.stop();
        let _ = self.dns.kill();
        let _ = self.dns.wait();
    }
}

/// A TLS client that trusts only `root` and checks the server's name.
pub fn verifying_client(root: &CertificateDer<'static>) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// A handshake with `addr` for `name`, the chain checked against `client`'s root.
pub async fn handshake(
    client: &tokio_rustls::TlsConnector,
    addr: SocketAddr,
    name: &str,
) -> Result<TlsStream<TcpStream>, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
    client.connect(name, tcp).await.map_err(|e| e.to_string())
}

/// The `[tls.acme]` certificate `/admin/certificates` lists, if issued.
pub fn acme_cert(f: &Fulcrum) -> Option<serde_json::Value> {
    let body = super::raw_exchange(
        f.admin,
        b"GET /admin/certificates HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    let json = &body[body.find("\r\n\r\n")? + 4..];
    let list: serde_json::Value = serde_json::from_str(json).ok()?;
    list.as_array()?
        .iter()
        .find(|c| c["source"] == "acme")
        .cloned()
}

/// Waits up to `limit` for an ACME certificate whose `not_after` is not `old`.
pub fn wait_for_cert(f: &Fulcrum, old: Option<&str>, limit: Duration) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(c) = acme_cert(f) {
            if old != c["not_after"].as_str() {
                return c;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no new ACME certificate within {limit:?}; log:\n{}",
            f.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A TCP relay on `port` that hands each connection to the next of `targets` in turn:
/// one port for pebble to validate on, shared by a fleet's instances as a load balancer
/// in front of them would share it.
pub struct RoundRobin {
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl RoundRobin {
    pub fn start(port: u16, targets: Vec<SocketAddr>) -> RoundRobin {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("relay port");
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut next = 0;
            while !stopped.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let _ = client.set_nonblocking(false);
                let target = targets[next % targets.len()];
                next += 1;
                if let Ok(server) = std::net::TcpStream::connect(target) {
                    for (from, to) in [(&client, &server), (&server, &client)] {
                        let (mut from, mut to) =
                            (from.try_clone().unwrap(), to.try_clone().unwrap());
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut from, &mut to);
                            let _ = to.shutdown(std::net::Shutdown::Both);
                        });
                    }
                }
            }
        });
        RoundRobin { stop }
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
