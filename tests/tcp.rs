//! TCP pools and TLS passthrough (`docs/tcp.md`): real fulcrum processes in front of
//! real TCP echo backends and a real TLS backend with its own certificate.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

/// A TCP backend: says its name and a newline on each connection, then echoes what it
/// reads; at the client's end it ends its side too (a half-close answered).
struct Echo {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Echo {
    fn start(name: &'static str) -> Echo {
        Self::start_on(name, "127.0.0.1:0".parse().unwrap())
    }

    fn start_on(name: &'static str, at: SocketAddr) -> Echo {
        let listener = TcpListener::bind(at).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            for s in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut s) = s else { continue };
                std::thread::spawn(move || {
                    let _ = s.write_all(format!("{name}\n").as_bytes());
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                    let _ = s.shutdown(Shutdown::Write);
                });
            }
        });
        Echo {
            addr,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("tcp://{}", self.addr)
    }

    /// Stops accepting: new connections are refused.
    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The config of one TCP pool `pg` (with `extra` pool keys) over `backends`, its
/// listener, and an HTTP pool beside it.
fn tcp_config(backends: &[&Echo], extra: &str, top: &str) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ url = \"{}\" }}", b.url()))
        .collect();
    format!(
        "{top}access_log_format = \"json\"\n\
         [[pools]]\nname = \"web\"\nbackends = [{{ url = \"http://127.0.0.1:9\" }}]\n\
         [[pools]]\nname = \"pg\"\nmode = \"tcp\"\nbackends = [{}]\n{extra}\n\
         [[routes]]\npool = \"web\"\n\
         [[tcp_listeners]]\nlisten = \"127.0.0.1:0\"\npool = \"pg\"\n",
        list.join(", ")
    )
}

fn start(group: &str, text: &str, args: &[&str]) -> Fulcrum {
    let file = config_file("tcp", group, text);
    let mut all = vec!["--config", file.to_str().unwrap()];
    all.extend_from_slice(args);
    Fulcrum::start(&all)
}

/// The TCP listener's address, from the start-up log.
fn tcp_addr(f: &Fulcrum) -> SocketAddr {
    let log = f.log();
    let at = log.find("tcp listening on ").expect("a tcp listener") + 17;
    let rest = &log[at..];
    rest[..rest.find(' ').unwrap()].parse().unwrap()
}

/// A connection through fulcrum and the name of the backend that took it.
fn open(addr: SocketAddr) -> (TcpStream, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut name = Vec::new();
    let mut b = [0u8; 1];
    while s.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
        name.push(b[0]);
    }
    (s, String::from_utf8(name).unwrap())
}

/// Writes `text` and reads its echo back.
fn echo(s: &mut TcpStream, text: &[u8]) -> Vec<u8> {
    s.write_all(text).unwrap();
    let mut got = vec![0u8; text.len()];
    s.read_exact(&mut got).unwrap();
    got
}

#[test]
fn round_robin_and_least_connections_over_tcp() {
    let (a, b) = (Echo::start("A"), Echo::start("B"));
    let f = start("rr", &tcp_config(&[&a, &b], "", ""), &[]);
    let addr = tcp_addr(&f);
    let names: Vec<String> = (0..4).map(|_| open(addr).1).collect();
    assert_eq!(
        names,
        ["A", "B", "A", "B"],
        "round robin, connection by connection"
    );
    let (mut held, first) = open(addr);
    assert_eq!(echo(&mut held, b"select 1;"), b"select 1;");

    let lc = start(
        "lc",
        &tcp_config(&[&a, &b], "strategy = \"least_connections\"", ""),
        &[],
    );
    let addr = tcp_addr(&lc);
    // Long-lived connections: each new one goes where the fewest are open.
    let mut held: Vec<(TcpStream, String)> = (0..4).map(|_| open(addr)).collect();
    let on = |held: &Vec<(TcpStream, String)>, n: &str| held.iter().filter(|(_, h)| h == n).count();
    assert_eq!(
        (on(&held, "A"), on(&held, "B")),
        (2, 2),
        "even while they stay open"
    );
    held.retain(|(_, n)| n != "A");
    std::thread::sleep(Duration::from_millis(100));
    let next: Vec<String> = (0..2).map(|_| open(addr).1).collect();
    assert_eq!(
        next,
        ["A", "A"],
        "both go to the backend whose connections ended"
    );
    let _ = first;
}

#[test]
fn half_close_and_a_mebibyte_each_way() {
    let a = Echo::start("A");
    let f = start("bytes", &tcp_config(&[&a], "", ""), &[]);
    let (mut s, name) = open(tcp_addr(&f));
    assert_eq!(name, "A");
    let data: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    let mut writer = s.try_clone().unwrap();
    let sent = data.clone();
    let w = std::thread::spawn(move || {
        writer.write_all(&sent).unwrap();
        // Half-close: the backend sees the end and ends its side after the echo.
        writer.shutdown(Shutdown::Write).unwrap();
    });
    let mut got = Vec::new();
    s.read_to_end(&mut got)
        .expect("the echo, then the backend's own end");
    w.join().unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "the bytes came back as sent");
    let line = f
        .log_line(
            &["\"proto\":\"tcp\"", "\"end\":\"closed\""],
            Duration::from_secs(5),
        )
        .expect("an access log line");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let fields = &v["fields"];
    assert_eq!(fields["bytes_in"], 1024 * 1024);
    assert_eq!(fields["bytes_out"], 1024 * 1024 + 2, "the name line too");
    assert_eq!(fields["pool"], "pg");
    assert!(fields["duration_ms"].as_f64().unwrap() > 0.0);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        assert_eq!(
            metric(&f, "fulcrum_tcp_connections_total{pool=\"pg\"}").await,
            1
        );
        let up = "fulcrum_tcp_bytes_total{pool=\"pg\",direction=\"client_to_backend\"}";
        assert_eq!(metric(&f, up).await, 1024 * 1024);
        let pool = get(&client(), &f.admin_url("/admin/pools/pg")).await.json();
        assert_eq!(pool["mode"], "tcp");
        assert_eq!(pool["tcp"]["connections"], 1);
        let web = get(&client(), &f.admin_url("/admin/pools/web"))
            .await
            .json();
        assert_eq!(
            (&web["mode"], &web["tcp"]),
            (&"http".into(), &serde_json::Value::Null)
        );
    });
}

#[test]
fn a_stopped_backend_leaves_the_rotation() {
    let (mut a, b) = (Echo::start("A"), Echo::start("B"));
    let health = "health = { interval = \"200ms\", unhealthy_threshold = 1 }";
    let f = start("stop", &tcp_config(&[&a, &b], health, ""), &[]);
    let addr = tcp_addr(&f);
    a.stop();
    // Before the probe notices, a refused connect is tried again on the other backend.
    for _ in 0..4 {
        assert_eq!(open(addr).1, "B");
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let down = rt.block_on(eventually(Duration::from_secs(5), || async {
        let pool = get(&client(), &f.admin_url("/admin/pools/pg")).await.json();
        pool["backends"][0]["healthy"] == false
    }));
    assert!(down, "the connect check marks it down");
    // Back on the same port: healthy again, in the rotation again.
    let _a = Echo::start_on("A", a.addr);
    let up = rt.block_on(eventually(Duration::from_secs(5), || async {
        let pool = get(&client(), &f.admin_url("/admin/pools/pg")).await.json();
        pool["backends"][0]["healthy"] == true
    }));
    assert!(up);
    let names: Vec<String> = (0..4).map(|_| open(addr).1).collect();
    assert!(names.contains(&"A".to_string()), "{names:?}");
}

#[test]
fn a_long_lived_connection_survives_a_reload_and_an_upgrade() {
    let a = Echo::start("A");
    let dir = std::env::temp_dir().join(format!("fulcrum-tcp-upgrade-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("upgrade.sock");
    let top = format!("upgrade_socket = \"{}\"\nworkers = 2\n", sock.display());
    let text = tcp_config(&[&a], "", &top);
    let file = config_file("tcp", "upgrade", &text);
    let args = ["--config", file.to_str().unwrap()];
    let mut old = Fulcrum::start(&args);
    let addr = tcp_addr(&old);
    let (mut s, _) = open(addr);
    assert_eq!(echo(&mut s, b"begin;"), b"begin;");
    old.signal("HUP");
    assert!(old
        .log_line(&["configuration reloaded"], Duration::from_secs(5))
        .is_some());
    assert_eq!(echo(&mut s, b"after reload"), b"after reload");

    let mut upgrade = args.to_vec();
    upgrade.push("--upgrade");
    let new = Fulcrum::start(&upgrade);
    assert_eq!(tcp_addr(&new), addr, "the TCP listener was handed over");
    // The old process serves no new connection but keeps the open one.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(echo(&mut s, b"after upgrade"), b"after upgrade");
    let (mut fresh, _) = open(addr);
    assert_eq!(echo(&mut fresh, b"new"), b"new");
    assert!(
        old.child.try_wait().unwrap().is_none(),
        "the old process waits for it"
    );
    drop(s);
    let st = old.wait_exit(Duration::from_secs(10));
    assert_eq!(st.and_then(|s| s.code()), Some(0), "{}", old.log());
    assert_eq!(echo(&mut fresh, b"still"), b"still");
}

#[test]
fn bad_tcp_configs_exit_2_naming_the_key() {
    let cases = [
        (
            "[[pools]]\nname = \"pg\"\nmode = \"tcp\"\nbackends = [{ url = \"tcp://127.0.0.1:5432\" }]\n[[routes]]\npool = \"pg\"\n",
            "TCP pool 'pg'",
        ),
        (
            "[[pools]]\nname = \"web\"\nbackends = [{ url = \"http://127.0.0.1:1\" }]\n[[routes]]\npool = \"web\"\n[[tcp_listeners]]\nlisten = \"127.0.0.1:0\"\npool = \"web\"\n",
            "'web' is an HTTP pool",
        ),
        (
            "[[pools]]\nname = \"web\"\nbackends = [{ url = \"tcp://127.0.0.1:5432\" }]\n",
            "needs a pool with mode = \"tcp\"",
        ),
        (
            "[[pools]]\nname = \"pg\"\nmode = \"tcp\"\nbackends = [{ url = \"http://127.0.0.1:5432\" }]\n[[tcp_listeners]]\nlisten = \"127.0.0.1:0\"\npool = \"pg\"\n",
            "its backends are tcp://",
        ),
        (
            "tls_listen = \"127.0.0.1:0\"\n[[pools]]\nname = \"pg\"\nmode = \"tcp\"\nbackends = [{ url = \"tcp://127.0.0.1:5432\" }]\n[[tls_passthrough]]\nsni = \"not a name!\"\npool = \"pg\"\n",
            "is not a server name",
        ),
        (
            "[[pools]]\nname = \"pg\"\nmode = \"tcp\"\nbackends = [{ url = \"tcp://127.0.0.1\" }]\n[[tcp_listeners]]\nlisten = \"127.0.0.1:0\"\npool = \"pg\"\n",
            "names its port",
        ),
        ("[[pools]]\nname = \"pg\"\nmode = \"udp\"\n", "valid: http, tcp"),
    ];
    for (i, (text, says)) in cases.iter().enumerate() {
        let file = config_file("tcp", &format!("bad{i}"), text);
        let (st, _, err) = run_fulcrum(&["check", "--config", file.to_str().unwrap()]);
        assert_eq!(st.code(), Some(2), "case {i}: {err}");
        assert!(err.contains(says), "case {i}: wanted {says:?} in {err}");
        assert!(err.contains("line "), "case {i}: the line is named: {err}");
    }
    // A tcp:// backend on the command line makes no HTTP pool either.
    let (st, _, err) = run_fulcrum(&["check", "--backend", "tcp://127.0.0.1:5432"]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(
        err.contains("--backend") || err.contains("backend"),
        "{err}"
    );
}

#[test]
fn the_admin_api_keeps_each_pool_to_its_kind_of_backend() {
    let a = Echo::start("A");
    let f = start("admin", &tcp_config(&[&a], "", ""), &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = client();
        let r = admin(
            &c,
            "POST",
            &f.admin_url("/admin/pools/pg/backends"),
            r#"{"url":"http://127.0.0.1:8000"}"#,
        )
        .await;
        assert_eq!(r.status, 400, "{}", r.text());
        let r = admin(
            &c,
            "POST",
            &f.admin_url("/admin/pools/web/backends"),
            r#"{"url":"tcp://127.0.0.1:8000"}"#,
        )
        .await;
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(r.text().contains("mode"), "{}", r.text());
        let r = admin(
            &c,
            "POST",
            &f.admin_url("/admin/pools/pg/backends"),
            &format!(
                r#"{{"url":"{}","name":"A2"}}"#,
                a.url().replace("127.0.0.1", "localhost")
            ),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.text());
    });
}

#[test]
fn tcp_listener_allow_and_deny_and_a_closed_pool() {
    let a = Echo::start("A");
    let text = tcp_config(&[&a], "", "").replace(
        "pool = \"pg\"\n",
        "pool = \"pg\"\ndeny = [\"127.0.0.0/8\"]\n",
    );
    let f = start("deny", &text, &[]);
    let mut s = TcpStream::connect(tcp_addr(&f)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 8];
    let n = s.read(&mut b).unwrap_or(0);
    assert_eq!(n, 0, "a denied client is closed before any byte");
}

#[test]
fn a_pool_with_nothing_to_give_closes_the_connection_and_says_why() {
    let mut a = Echo::start("A");
    let addr = a.addr;
    a.stop();
    let f = start("none", &tcp_config(&[&a], "retries = 1", ""), &[]);
    let mut s = TcpStream::connect(tcp_addr(&f)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    let mut b = [0u8; 8];
    assert!(matches!(s.read(&mut b), Ok(0) | Err(_)));
    assert!(started.elapsed() < Duration::from_secs(3));
    let line = f
        .log_line(&["\"proto\":\"tcp\""], Duration::from_secs(5))
        .unwrap();
    assert!(
        line.contains("connect_failed") || line.contains("no_backend"),
        "{line}"
    );
    let _ = addr;
}

mod passthrough {
    use super::*;
    use common::tls::{connect, get_h1, h1, https_addr, leaf_of, H2Backend, Pki};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    /// fulcrum with a certificate for www.example.com, an HTTP pool over `web`, and
    /// db.example.com and *.mq.example.com passed through to `backend`.
    fn start_with(pki: &Pki, web: &TestBackend, backend: &H2Backend, tag: &str) -> Fulcrum {
        pki.leaf("fulcrum", &["www.example.com", "db.example.com"]);
        let text = format!(
            "tls_listen = \"127.0.0.1:0\"\naccess_log_format = \"json\"\n\
             [[tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\n\
             [[pools]]\nname = \"web\"\nbackends = [{{ url = \"{}\" }}]\n\
             [[pools]]\nname = \"pg\"\nmode = \"tcp\"\nbackends = [{{ url = \"tcp://{}\" }}]\n\
             [[routes]]\npool = \"web\"\n\
             [[tls_passthrough]]\nsni = \"db.example.com\"\npool = \"pg\"\n\
             [[tls_passthrough]]\nsni = \"*.mq.example.com\"\npool = \"pg\"\n",
            pki.arg("fulcrum.pem"),
            pki.arg("fulcrum.key"),
            web.url(),
            backend.addr
        );
        start(tag, &text, &[])
    }

    fn pem(pki: &Pki, file: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(pki.path(file)).unwrap()
    }

    #[tokio::test]
    async fn names_passed_through_reach_the_backends_own_certificate() {
        let pki = Pki::new("tcp-pass");
        let backend = H2Backend::tls(
            "T",
            &pki,
            "backend",
            &["db.example.com", "a.mq.example.com"],
        );
        let web = TestBackend::start("W");
        let f = start_with(&pki, &web, &backend, "pass");
        let addr = https_addr(&f);
        for name in ["db.example.com", "a.mq.example.com"] {
            let s = connect(&pki, addr, name, &[b"http/1.1"]).await;
            assert_eq!(
                leaf_of(&s),
                pem(&pki, "backend.pem"),
                "{name}: the backend's own"
            );
            let (status, who, proto) = get_h1(&mut h1(s).await, name, "/").await;
            assert_eq!((status, who.as_str()), (200, "T"), "{name}");
            assert_eq!(proto, "", "{name}: nothing of fulcrum's in between");
        }
        // A name of fulcrum's certificate, and one of nobody's: terminated here.
        for name in ["www.example.com", "other.example.org"] {
            let s = connect(&pki, addr, name, &[b"http/1.1"]).await;
            assert_eq!(leaf_of(&s), pem(&pki, "fulcrum.pem"), "{name}: fulcrum's");
            let (status, who, proto) = get_h1(&mut h1(s).await, name, "/").await;
            assert_eq!(
                (status, who.as_str(), proto.as_str()),
                (200, "W", "https"),
                "{name}"
            );
        }
        let line = f
            .log_line(
                &["\"proto\":\"tcp\"", "\"pool\":\"pg\""],
                Duration::from_secs(5),
            )
            .expect("a TCP access line for a passed-through connection");
        assert!(line.contains("\"bytes_in\":"), "{line}");
    }

    /// The ClientHello `config` writes for `name`, its handshake message re-framed into
    /// two records.
    fn hello_in_two_records(conn: &mut rustls::ClientConnection) -> (Vec<u8>, Vec<u8>) {
        let mut first = Vec::new();
        conn.write_tls(&mut first).unwrap();
        let mut msg = Vec::new();
        let mut at = 0;
        while at + 5 <= first.len() {
            let len = u16::from_be_bytes([first[at + 3], first[at + 4]]) as usize;
            msg.extend_from_slice(&first[at + 5..at + 5 + len]);
            at += 5 + len;
        }
        let record = |part: &[u8]| {
            let mut r = vec![22, 3, 1];
            r.extend((part.len() as u16).to_be_bytes());
            r.extend(part);
            r
        };
        let half = msg.len() / 2;
        (record(&msg[..half]), record(&msg[half..]))
    }

    #[test]
    fn a_client_hello_split_over_two_records_and_segments() {
        let pki = Pki::new("tcp-split");
        let backend = H2Backend::tls("T", &pki, "backend", &["db.example.com"]);
        let web = TestBackend::start("W");
        let f = start_with(&pki, &web, &backend, "split");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pki.ca_der()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = "db.example.com".try_into().unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let (one, two) = hello_in_two_records(&mut conn);
        let mut tcp = TcpStream::connect(https_addr(&f)).unwrap();
        tcp.set_nodelay(true).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        tcp.write_all(&one).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        tcp.write_all(&two).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        tls.write_all(b"GET / HTTP/1.1\r\nHost: db.example.com\r\nConnection: close\r\n\r\n")
            .expect("the backend's handshake, verified against its own name");
        let mut answer = String::new();
        let _ = tls.read_to_string(&mut answer);
        assert!(
            answer.to_ascii_lowercase().contains("x-backend: t"),
            "{answer}"
        );
    }

    #[test]
    fn a_client_that_sends_nothing_is_closed_at_the_hello_deadline() {
        let pki = Pki::new("tcp-quiet");
        let backend = H2Backend::tls("T", &pki, "backend", &["db.example.com"]);
        let web = TestBackend::start("W");
        let f = start_with(&pki, &web, &backend, "quiet");
        // One says nothing; another half a ClientHello, then nothing.
        let mut quiet = TcpStream::connect(https_addr(&f)).unwrap();
        let mut s = TcpStream::connect(https_addr(&f)).unwrap();
        s.write_all(&[22, 3, 1, 0x02, 0x00, 1, 0, 1]).unwrap();
        quiet
            .set_read_timeout(Some(Duration::from_secs(9)))
            .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(9))).unwrap();
        let started = Instant::now();
        let mut b = [0u8; 8];
        let n = quiet.read(&mut b);
        let took = started.elapsed();
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
        assert!(
            took >= Duration::from_secs(4) && took < Duration::from_secs(8),
            "closed after {took:?}"
        );
        // Closed too; its bytes never reached a backend.
        assert!(matches!(s.read(&mut b), Ok(0) | Err(_)));
    }

    #[tokio::test]
    async fn a_hello_cut_short_by_its_end_closes_at_once_and_spins_nothing() {
        let pki = Pki::new("tcp-end");
        let backend = H2Backend::tls("T", &pki, "backend", &["db.example.com"]);
        let web = TestBackend::start("W");
        let f = start_with(&pki, &web, &backend, "end");
        let addr = https_addr(&f);
        // Half a ClientHello, then the client's end: on every worker.
        let started = Instant::now();
        for _ in 0..4 {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&[22, 3, 1, 0x02, 0x00, 1, 0, 1]).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(9))).unwrap();
            let mut b = [0u8; 8];
            assert!(matches!(s.read(&mut b), Ok(0) | Err(_)));
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        // The workers are free: a name passed through and one terminated still work.
        for (name, who) in [("db.example.com", "T"), ("www.example.com", "W")] {
            let s = connect(&pki, addr, name, &[b"http/1.1"]).await;
            assert_eq!(get_h1(&mut h1(s).await, name, "/").await.1, who);
        }
    }
}

/// A backend that records the first line it reads (a PROXY v1 header) and says it back.
fn header_backend() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut line = Vec::new();
                let mut b = [0u8; 1];
                while s.read(&mut b).unwrap_or(0) == 1 {
                    line.push(b[0]);
                    if b[0] == b'\n' {
                        break;
                    }
                }
                // A connect check sends a LOCAL header or nothing: no answer needed.
                let _ = s.write_all(&line);
                let _ = s.write_all(b"ok\n");
            });
        }
    });
    addr
}

#[test]
fn proxy_headers_in_and_out() {
    let backend = header_backend();
    let text = format!(
        "trusted_proxies = [\"127.0.0.1\"]\n\
         [[pools]]\nname = \"web\"\nbackends = [{{ url = \"http://127.0.0.1:9\" }}]\n\
         [[pools]]\nname = \"pg\"\nmode = \"tcp\"\nsend_proxy_protocol = \"v1\"\n\
         backends = [{{ url = \"tcp://{backend}\" }}]\n\
         [[routes]]\npool = \"web\"\n\
         [[tcp_listeners]]\nlisten = \"127.0.0.1:0\"\npool = \"pg\"\naccept_proxy_protocol = true\n\
         deny = [\"192.0.2.0/24\"]\n"
    );
    let f = start("pp", &text, &[]);
    let addr = tcp_addr(&f);
    // A trusted peer names its client; the backend is told that client.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"PROXY TCP4 198.51.100.7 10.0.0.1 40000 6432\r\n")
        .unwrap();
    let mut got = String::new();
    let mut b = [0u8; 256];
    while !got.contains("ok\n") {
        match s.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.push_str(&String::from_utf8_lossy(&b[..n])),
        }
    }
    assert!(
        got.starts_with("PROXY TCP4 198.51.100.7 10.0.0.1 40000 6432\r\n"),
        "{got:?}"
    );
    // The client it names is judged by the listener's deny list.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"PROXY TCP4 192.0.2.9 10.0.0.1 40000 6432\r\n")
        .unwrap();
    assert!(matches!(s.read(&mut b), Ok(0) | Err(_)), "a denied client");
    // Without a header, a trusted peer is closed.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(12))).unwrap();
    s.write_all(b"hello\r\n").unwrap();
    assert!(matches!(s.read(&mut b), Ok(0) | Err(_)), "no header");
}

#[test]
fn idle_connections_end_and_max_conns_queues_the_next() {
    let a = Echo::start("A");
    let extra = "idle_timeout = \"1s\"\nmax_conns = 1\nqueue_timeout = \"3s\"";
    let f = start("idle", &tcp_config(&[&a], extra, ""), &[]);
    let addr = tcp_addr(&f);
    let (mut first, _) = open(addr);
    // The second waits for the first's slot.
    let waiter = std::thread::spawn(move || {
        let started = Instant::now();
        let (mut s, name) = open(addr);
        assert_eq!(name, "A");
        assert_eq!(echo(&mut s, b"x"), b"x");
        started.elapsed()
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(echo(&mut first, b"busy"), b"busy");
    // Silent for the idle timeout: closed, and the waiter gets the slot.
    let started = Instant::now();
    let mut b = [0u8; 4];
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert!(matches!(first.read(&mut b), Ok(0) | Err(_)));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let waited = waiter.join().unwrap();
    assert!(
        waited >= Duration::from_millis(900),
        "it waited in the queue: {waited:?}"
    );
    assert!(f
        .log_line(&["\"end\":\"idle\""], Duration::from_secs(3))
        .is_some());
}

#[test]
fn a_backend_reset_resets_the_client_and_deny_clients_holds_for_tcp() {
    // A backend that resets every connection once it has read something.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let backend = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let mut s = s;
            let mut b = [0u8; 16];
            let _ = s.read(&mut b);
            let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
        }
    });
    let text = format!(
        "[[pools]]\nname = \"web\"\nbackends = [{{ url = \"http://127.0.0.1:9\" }}]\n\
         [[pools]]\nname = \"pg\"\nmode = \"tcp\"\nbackends = [{{ url = \"tcp://{backend}\" }}]\n\
         [[routes]]\npool = \"web\"\n\
         [[tcp_listeners]]\nlisten = \"127.0.0.1:0\"\npool = \"pg\"\n"
    );
    let f = start("reset", &text, &["--access-log-format", "json"]);
    let mut s = TcpStream::connect(tcp_addr(&f)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"query").unwrap();
    let mut b = [0u8; 8];
    let r = s.read(&mut b);
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "a reset, not a clean end: {r:?}"
    );
    assert!(f
        .log_line(&["\"end\":\"reset\""], Duration::from_secs(3))
        .is_some());
    // The top-level list closes a TCP listener's clients too.
    let denied = text.replacen("[[pools]]", "deny_clients = [\"127.0.0.1\"]\n[[pools]]", 1);
    let g = start("reset-deny", &denied, &[]);
    let mut s = TcpStream::connect(tcp_addr(&g)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(matches!(s.read(&mut b), Ok(0) | Err(_)));
}

#[test]
fn a_server_that_speaks_first_is_not_kept_waiting_behind_accept_proxy_protocol() {
    let a = Echo::start("A");
    let text = tcp_config(&[&a], "", "trusted_proxies = [\"10.9.9.9\"]\n").replace(
        "pool = \"pg\"\n",
        "pool = \"pg\"\naccept_proxy_protocol = true\n",
    );
    let f = start("first", &text, &[]);
    // 127.0.0.1 is no trusted proxy: its connection is the protocol's from the start,
    // and the backend's greeting comes without the client saying anything.
    let started = Instant::now();
    let (mut s, name) = open(tcp_addr(&f));
    assert_eq!(name, "A");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // A PROXY header from it is not read: it reaches the backend as data.
    let header = b"PROXY TCP4 198.51.100.7 10.0.0.1 40000 6432\r\n";
    assert_eq!(echo(&mut s, header), header);
}

#[test]
fn a_stop_cuts_open_connections_at_the_drain_and_logs_them() {
    let a = Echo::start("A");
    let mut f = start("cut", &tcp_config(&[&a], "", ""), &[]);
    let (mut s, _) = open(tcp_addr(&f));
    assert_eq!(echo(&mut s, b"open"), b"open");
    f.signal("TERM");
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut b = [0u8; 8];
    let r = s.read(&mut b);
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "cut with a reset, not a clean end: {r:?}"
    );
    let st = f.wait_exit(Duration::from_secs(10));
    assert_eq!(st.and_then(|s| s.code()), Some(0));
    assert!(f.log().contains("\"end\":\"cut\""), "{}", f.log());
}
