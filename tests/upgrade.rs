//! Binary upgrade (`--upgrade-socket`, `--upgrade`): the listening sockets pass to the
//! new process and no client sees a refused, reset or failed request.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;

fn socket_path(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fulcrum-upgrade-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("upgrade.sock")
}

fn serve_args(backend: &TestBackend, sock: &Path, upgrade: bool) -> Vec<String> {
    let mut v: Vec<String> = [
        "--backend",
        &backend.spec(),
        "--upgrade-socket",
        sock.to_str().unwrap(),
        "--access-log",
        "off",
        "--workers",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if upgrade {
        v.push("--upgrade".into());
    }
    v
}

fn start(backend: &TestBackend, sock: &Path, upgrade: bool) -> Fulcrum {
    let args = serve_args(backend, sock, upgrade);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Fulcrum::start(&args)
}

#[test]
fn five_upgrades_in_a_row_refuse_no_connection() {
    let a = TestBackend::start("A");
    let sock = socket_path("five");
    let mut current = start(&a, &sock, false);
    let (proxy, admin) = (current.proxy, current.admin);
    let load = Load::start(proxy, 4, 3);
    std::thread::sleep(Duration::from_millis(300));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "only this user may take the sockets");
    for round in 0..5 {
        let mut next = start(&a, &sock, true);
        assert_eq!(
            (next.proxy, next.admin),
            (proxy, admin),
            "round {round}: same sockets"
        );
        let st = current.wait_exit(Duration::from_secs(15));
        assert_eq!(
            st.and_then(|s| s.code()),
            Some(0),
            "round {round}: the old process drains and exits 0; log:\n{}",
            current.log()
        );
        // Counted once the old one is gone: the new one serves alone.
        let before = load.ok.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            load.ok.load(Ordering::Relaxed) > before,
            "round {round}: traffic goes on"
        );
        std::mem::swap(&mut current, &mut next);
    }
    let (ok, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "{} failed of {}: {:?}",
        failures.len(),
        ok + failures.len() as u64,
        &failures[..failures.len().min(10)]
    );
    assert!(ok > 100, "only {ok} requests ran");
    // The last process owns the admin port and the upgrade socket.
    let (_, body, _) = run_curl(&format!("http://{admin}/admin/status"));
    assert!(body.contains("\"backends\""), "{body}");
    assert!(sock.exists());
    current.signal("TERM");
    assert_eq!(
        current
            .wait_exit(Duration::from_secs(15))
            .and_then(|s| s.code()),
        Some(0)
    );
    assert!(!sock.exists(), "a stop removes the upgrade socket");
}

fn run_curl(url: &str) -> (u16, String, String) {
    let out = std::process::Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", url])
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.parse().unwrap_or(0), body.to_string(), String::new())
}

#[test]
fn a_new_process_that_cannot_start_leaves_the_old_one_serving() {
    let a = TestBackend::start("A");
    let sock = socket_path("fail");
    let mut old = start(&a, &sock, false);
    let load = Load::start(old.proxy, 2, 3);
    let s = sock.to_str().unwrap();
    let spec = a.spec();
    // Refused before it reaches the old process: a bad value.
    let (st, _, err) = run_fulcrum(&[
        "serve",
        "--backend",
        &spec,
        "--upgrade-socket",
        s,
        "--upgrade",
        "--strategy",
        "nope",
    ]);
    assert_eq!(st.code(), Some(2), "{err}");
    // Refused after it received the sockets: set to another address.
    let (st, _, err) = run_fulcrum(&[
        "serve",
        "--backend",
        &spec,
        "--upgrade-socket",
        s,
        "--upgrade",
        "--listen",
        "127.0.0.1:1",
        "--admin",
        "127.0.0.1:0",
    ]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("--upgrade") && err.contains("listen"), "{err}");
    // Without --upgrade, the socket path of a live process is refused.
    let (st, _, err) = run_fulcrum(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--upgrade-socket",
        s,
    ]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("--upgrade"), "{err}");
    // More workers than one hand-over can carry.
    let (st, _, err) = run_fulcrum(&["serve", "--workers", "300", "--upgrade-socket", s]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("workers") && err.contains("252"), "{err}");
    // --upgrade alone names what it lacks.
    let (st, _, err) = run_fulcrum(&["serve", "--upgrade"]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("--upgrade-socket"), "{err}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        old.child.try_wait().unwrap().is_none(),
        "the old one still runs"
    );
    // Only the successor set to another address got as far as a hand-over; the probe of
    // the process started without --upgrade was no upgrade at all.
    assert_eq!(
        old.log().matches("upgrade failed").count(),
        1,
        "{}",
        old.log()
    );
    // And a good upgrade still goes through.
    let _next = start(&a, &sock, true);
    assert_eq!(
        old.wait_exit(Duration::from_secs(15))
            .and_then(|s| s.code()),
        Some(0)
    );
    let (ok, failures) = load.finish();
    assert!(failures.is_empty(), "{failures:?}");
    assert!(ok > 20, "only {ok} requests ran");
}

/// A stand-in for a running fulcrum that hands its sockets over but never says `ok`.
fn reluctant_predecessor(sock: &Path) -> (std::net::TcpListener, std::thread::JoinHandle<String>) {
    use std::io::Read;
    use std::os::fd::AsFd;
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let unix = std::os::unix::net::UnixListener::bind(sock).unwrap();
    let kept = proxy.try_clone().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = unix.accept().unwrap();
        let mut hello = [0u8; 24];
        s.read_exact(&mut hello).unwrap();
        let text = b"fulcrum-upgrade/1 proxy admin\n";
        let fds = [proxy.as_fd(), admin.as_fd()];
        let mut space = vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
        assert!(control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)));
        rustix::net::sendmsg(
            &s,
            &[std::io::IoSlice::new(text)],
            &mut control,
            rustix::net::SendFlags::empty(),
        )
        .unwrap();
        let mut ready = [0u8; 6];
        s.read_exact(&mut ready).unwrap();
        // Gone without `ok`.
        String::from_utf8_lossy(&hello).into_owned() + &String::from_utf8_lossy(&ready)
    });
    (kept, t)
}

#[test]
fn a_successor_the_old_process_never_lets_go_of_stops() {
    let a = TestBackend::start("A");
    let sock = socket_path("reluctant");
    let (proxy, predecessor) = reluctant_predecessor(&sock);
    let spec = a.spec();
    let (st, _, err) = run_fulcrum(&[
        "serve",
        "--backend",
        &spec,
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--upgrade-socket",
        sock.to_str().unwrap(),
        "--upgrade",
    ]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("the old process serves on"), "{err}");
    let said = predecessor.join().unwrap();
    assert_eq!(said, "fulcrum-upgrade/1 hello\nready\n");
    // It let the sockets go again: a new connection waits for the old process.
    proxy.set_nonblocking(true).unwrap();
    let _probe = std::net::TcpStream::connect(proxy.local_addr().unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        proxy.accept().is_ok(),
        "the connection waits for the old process"
    );
}

/// Clients that each make a new TLS connection per request (handshake, one GET) to
/// `addr` until stopped; returns the requests that succeeded and what failed.
fn tls_load(
    pki: std::sync::Arc<common::tls::Pki>,
    addr: std::net::SocketAddr,
    clients: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(u64, Vec<String>)> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let tasks: Vec<_> = (0..clients)
                .map(|_| {
                    let (pki, stop) = (pki.clone(), stop.clone());
                    tokio::spawn(async move {
                        let (mut ok, mut failed) = (0u64, Vec::new());
                        while !stop.load(Ordering::Relaxed) {
                            match one_tls_request(&pki, addr).await {
                                Ok(()) => ok += 1,
                                Err(e) => failed.push(e),
                            }
                        }
                        (ok, failed)
                    })
                })
                .collect();
            let mut all = (0, Vec::new());
            for t in tasks {
                let (ok, failed) = t.await.unwrap();
                all.0 += ok;
                all.1.extend(failed);
            }
            all
        })
    })
}

async fn one_tls_request(pki: &common::tls::Pki, addr: std::net::SocketAddr) -> Result<(), String> {
    use rustls::pki_types::ServerName;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::try_from("a.test").unwrap();
    let s = pki
        .client(&[b"http/1.1"])
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let mut sender = common::tls::h1(s).await;
    match common::tls::get_h1(&mut sender, "a.test", "/x").await.0 {
        200 => Ok(()),
        s => Err(format!("status {s}")),
    }
}

#[test]
fn an_upgrade_under_tls_load_fails_no_handshake() {
    let a = TestBackend::start("A");
    let pki = std::sync::Arc::new(common::tls::Pki::new("upgrade"));
    pki.leaf("a", &["a.test"]);
    let sock = socket_path("tls");
    let tls = [
        "--tls-listen".to_string(),
        "127.0.0.1:0".into(),
        "--tls-cert".into(),
        pki.arg("a.pem"),
        "--tls-key".into(),
        pki.arg("a.key"),
        // HTTP/3 on too: the UDP sockets are handed over with the TCP ones.
        "--http3".into(),
        "on".into(),
    ];
    let launch = |upgrade: bool| {
        let mut args = serve_args(&a, &sock, upgrade);
        args.extend(tls.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Fulcrum::start(&args)
    };
    let mut current = launch(false);
    let https = common::tls::https_addr(&current);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = tls_load(pki.clone(), https, 4, stop.clone());
    std::thread::sleep(Duration::from_millis(300));
    for round in 0..2 {
        let mut next = launch(true);
        assert_eq!(
            common::tls::https_addr(&next),
            https,
            "round {round}: the same socket"
        );
        let st = current.wait_exit(Duration::from_secs(15));
        assert_eq!(
            st.and_then(|s| s.code()),
            Some(0),
            "round {round}:\n{}",
            current.log()
        );
        std::mem::swap(&mut current, &mut next);
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let (ok, failures) = load.join().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} failed: {:?}",
        failures.len(),
        ok + failures.len() as u64,
        &failures[..failures.len().min(10)]
    );
    assert!(ok > 50, "only {ok} TLS requests ran");
}
