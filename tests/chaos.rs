//! Chaos over real processes: backends killed, reloaded, switched, drained and deleted,
//! or silent, under load; thousands of idle or slow connections beside a probe. Each test
//! counts every request and says which may fail (only unsafe ones whose bytes were sent).
//!
//! The tests take turns (`SERIAL`): each loads the machine on its own.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A `fulcrum backend` process, killed with SIGKILL on drop.
struct DemoBackend(Child);

impl DemoBackend {
    fn start(name: &str, port: u16, latency_ms: u64) -> DemoBackend {
        let child = Command::new(BIN)
            .args(["backend", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--name", name, "--latency-ms", &latency_ms.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a demo backend");
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "backend {name} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        DemoBackend(child)
    }
}

impl Drop for DemoBackend {
    fn drop(&mut self) {
        let _ = self.0.kill(); // SIGKILL
        let _ = self.0.wait();
    }
}

/// `--backend` flags for demo backends on `ports`, named `b0`, `b1`, …
fn backend_flags(ports: &[u16]) -> Vec<String> {
    ports
        .iter()
        .enumerate()
        .flat_map(|(i, p)| {
            [
                "--backend".into(),
                format!("http://127.0.0.1:{p},name=b{i}"),
            ]
        })
        .collect()
}

fn start_over(ports: &[u16], extra: &[&str]) -> Fulcrum {
    let mut args = backend_flags(ports);
    args.extend(["--access-log", "off"].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Fulcrum::start(&args)
}

/// A request on a fresh connection; the raw answer.
fn raw(addr: SocketAddr, request: &str) -> String {
    raw_exchange(addr, request.as_bytes(), Duration::from_secs(5))
}

fn admin_json(f: &Fulcrum, method: &str, path: &str, body: &str) -> String {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    raw(f.admin, &req)
}

fn assert_no_failures(what: &str, ok: u64, failures: &[(bool, String)], at_least: u64) {
    assert!(
        failures.is_empty(),
        "{what}: {} of {} failed: {:?}",
        failures.len(),
        ok + failures.len() as u64,
        &failures[..failures.len().min(10)]
    );
    assert!(ok >= at_least, "{what}: only {ok} requests ran");
}

#[test]
fn a_backend_killed_under_get_and_post_load_fails_only_posts_it_was_holding() {
    let _turn = one_at_a_time();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut procs: Vec<Option<DemoBackend>> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| Some(DemoBackend::start(&format!("b{i}"), *p, 20)))
        .collect();
    let f = start_over(&ports, &["--health-interval", "500ms"]);
    let clients = 6;
    let load = Load::start(f.proxy, clients, 2);
    std::thread::sleep(Duration::from_millis(1000));
    procs[1] = None; // kill -9 with requests in flight
    std::thread::sleep(Duration::from_millis(1500));
    procs[1] = Some(DemoBackend::start("b1", ports[1], 20));
    std::thread::sleep(Duration::from_millis(1500));
    let (ok, failures) = load.finish();
    // A GET in flight on the killed backend is sent again elsewhere; a POST it held
    // had its bytes sent and fails with 502; a POST that found it dead is retried.
    let gets: Vec<_> = failures.iter().filter(|(post, _)| !post).collect();
    assert!(gets.is_empty(), "GETs failed: {gets:?}");
    assert!(
        failures.len() <= clients,
        "at most one POST per client was in flight on the killed backend: {failures:?}"
    );
    for (_, e) in &failures {
        assert!(e.contains("502"), "a POST it held gets 502: {e}");
        // "Unreachable" is a connect failure: nothing of that POST was sent, so it
        // should have gone to another backend.
        assert!(!e.contains("unreachable"), "an unsent POST failed: {e}");
    }
    assert!(ok > 300, "only {ok} requests ran");
}

#[test]
fn twenty_reloads_and_fifty_strategy_switches_fail_no_request() {
    let _turn = one_at_a_time();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let _procs: Vec<_> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| DemoBackend::start(&format!("b{i}"), *p, 2))
        .collect();
    let dir = std::env::temp_dir().join(format!("fulcrum-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fulcrum.toml");
    let write_config = |round: usize| {
        let strategies = ["round_robin", "least_connections", "power_of_two", "maglev"];
        let mut text = format!("strategy = \"{}\"\n", strategies[round % strategies.len()]);
        // The third backend leaves and comes back every other round; weights change.
        let present = if round % 2 == 0 { 3 } else { 2 };
        for (i, p) in ports.iter().take(present).enumerate() {
            text.push_str(&format!(
                "[[backends]]\nurl = \"http://127.0.0.1:{p}\"\nname = \"b{i}\"\nweight = {}\n",
                1 + (round + i) % 4
            ));
        }
        // Written beside and renamed over: a reload never reads half a file.
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
    };
    write_config(0);
    let f = Fulcrum::start(&["--config", file.to_str().unwrap(), "--access-log", "off"]);
    let load = Load::start(f.proxy, 4, 3);
    for round in 1..=20 {
        write_config(round);
        f.signal("HUP");
        // One signal at a time: two pending SIGHUPs would be delivered as one.
        let deadline = Instant::now() + Duration::from_secs(5);
        while f.log().matches("SIGHUP").count() < round {
            assert!(
                Instant::now() < deadline,
                "reload {round} not seen:\n{}",
                f.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let names = [
        "round_robin",
        "weighted_round_robin",
        "least_connections",
        "weighted_least_connections",
        "least_response_time",
        "peak_ewma",
        "power_of_two",
        "consistent_hash",
        "ip_hash",
        "maglev",
    ];
    for i in 0..50 {
        let name = names[i % names.len()];
        let r = admin_json(
            &f,
            "POST",
            "/admin/strategy",
            &format!(r#"{{"strategy":"{name}"}}"#),
        );
        assert!(r.starts_with("HTTP/1.1 200"), "switch {i} to {name}: {r}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (ok, failures) = load.finish();
    assert_no_failures("reloads and switches", ok, &failures, 300);
    // The last reload (round 20: three backends) is the pool.
    let status = admin_json(&f, "GET", "/admin/backends", "");
    assert_eq!(status.matches("\"url\"").count(), 3, "{status}");
    assert_eq!(f.log().matches("SIGHUP").count(), 20, "{}", f.log());
}

#[test]
fn drain_then_delete_under_load_fails_no_request() {
    let _turn = one_at_a_time();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let _procs: Vec<_> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| DemoBackend::start(&format!("b{i}"), *p, 30))
        .collect();
    let f = start_over(&ports, &[]);
    let load = Load::start(f.proxy, 6, 2);
    std::thread::sleep(Duration::from_millis(500));
    let r = admin_json(&f, "PATCH", "/admin/backends/1", r#"{"state":"draining"}"#);
    assert!(r.contains("\"draining\""), "{r}");
    // Its requests in flight finish; then it is deleted.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !admin_json(&f, "GET", "/admin/backends/1", "").contains("\"active_conns\":0") {
        assert!(
            Instant::now() < deadline,
            "the drained backend never went idle"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = admin_json(&f, "GET", "/admin/backends/1", "");
    let r = admin_json(&f, "DELETE", "/admin/backends/1", "");
    assert!(r.starts_with("HTTP/1.1 204"), "{r}");
    std::thread::sleep(Duration::from_millis(800));
    let (ok, failures) = load.finish();
    assert_no_failures("drain and delete", ok, &failures, 100);
    let status = admin_json(&f, "GET", "/admin/backends", "");
    assert_eq!(status.matches("\"url\"").count(), 2, "{status}");
    assert!(before.contains("\"requests\""), "{before}");
}

/// A backend that accepts connections and reads, but never answers (its health
/// checks hang too).
fn silent_backend() -> (SocketAddr, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            held.push(s);
            if held.len() > 2000 {
                break;
            }
        }
    });
    (addr, t)
}

#[test]
fn a_backend_that_accepts_and_never_answers_costs_gets_nothing() {
    let _turn = one_at_a_time();
    let ports: Vec<u16> = (0..2).map(|_| free_port()).collect();
    let _procs: Vec<_> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| DemoBackend::start(&format!("b{i}"), *p, 2))
        .collect();
    let (silent, _t) = silent_backend();
    let mut args = backend_flags(&ports);
    args.extend([
        "--backend".to_string(),
        format!("http://{silent},name=silent"),
        "--upstream-timeout".into(),
        "300ms".into(),
        "--access-log".into(),
        "off".into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let f = Fulcrum::start(&args);
    let load = Load::start(f.proxy, 4, 0);
    std::thread::sleep(Duration::from_secs(3));
    let (ok, failures) = load.finish();
    // Each GET that met the silent one timed out there and was sent again elsewhere.
    assert_no_failures("a silent backend", ok, &failures, 200);
    let b = admin_json(&f, "GET", "/admin/backends/2", "");
    assert!(
        b.contains("\"ejected\":true"),
        "the silent backend is ejected: {b}"
    );
}

fn open_idle(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| TcpStream::connect(addr).unwrap_or_else(|e| panic!("idle connection {i}: {e}")))
        .collect()
}

/// GETs on fresh connections for `span`; how many answered 200, and the others.
fn probe_for(addr: SocketAddr, span: Duration) -> (u32, Vec<String>) {
    let (mut ok, mut bad) = (0, Vec::new());
    let end = Instant::now() + span;
    while Instant::now() < end {
        let r = raw(
            addr,
            "GET /probe HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        );
        if r.starts_with("HTTP/1.1 200") {
            ok += 1;
        } else {
            bad.push(r.lines().next().unwrap_or("(nothing)").to_string());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (ok, bad)
}

#[test]
fn ten_thousand_idle_clients_and_a_thousand_idle_admin_connections_leave_a_probe_served() {
    let _turn = one_at_a_time();
    let limit = raise_own_file_limit();
    assert!(
        limit >= 12_000,
        "this test needs 12 000 descriptors; the limit is {limit}"
    );
    let a = TestBackend::start("A");
    // The default cap is half the descriptors (each connection may need an upstream
    // one): an operator expecting 10 000 idle clients sets it, as with HAProxy's maxconn.
    let f = Fulcrum::over(
        &[&a],
        &["--max-connections", "15000", "--access-log", "off"],
    );
    let idle_clients = open_idle(f.proxy, 10_000);
    let idle_admin = open_idle(f.admin, 1_000);
    let (ok, bad) = probe_for(f.proxy, Duration::from_secs(3));
    assert!(
        bad.is_empty(),
        "{} probes failed: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    assert!(ok >= 30, "only {ok} probes ran");
    // The idle ones reached no backend: it saw the probes (and its health checks) only.
    assert_eq!(a.requests(), u64::from(ok));
    drop((idle_clients, idle_admin));
}

/// Connections that send part of a request head and stop (slowloris).
fn slowloris(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut v = open_idle(addr, n);
    for s in &mut v {
        let _ = s.write_all(b"GET /slow HTTP/1.1\r\nHost: t\r\nX-Pad: ");
    }
    v
}

/// Connections that send a head promising 1000 bytes of body, send 10, and stop.
fn slow_bodies(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut v = open_idle(addr, n);
    for s in &mut v {
        let _ =
            s.write_all(b"POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n0123456789");
    }
    v
}

#[test]
fn a_thousand_slowloris_and_a_thousand_slow_bodies_neither_stop_clients_nor_eject_backends() {
    let _turn = one_at_a_time();
    let limit = raise_own_file_limit();
    assert!(
        limit >= 5_000,
        "this test needs 5 000 descriptors; the limit is {limit}"
    );
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let f = Fulcrum::over(
        &[&a, &b],
        &["--upstream-timeout", "3s", "--access-log", "off"],
    );
    let lorises = slowloris(f.proxy, 1000);
    let mut bodies = slow_bodies(f.proxy, 1000);
    // 300 normal requests, ten at a time, while all of those hang on.
    let handles: Vec<_> = (0..10)
        .map(|_| {
            let addr = f.proxy;
            std::thread::spawn(move || (0..30).filter(|_| one_request(addr, false).is_ok()).count())
        })
        .collect();
    let served: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(
        served, 300,
        "normal requests served beside 2 000 slow connections"
    );
    // The stalled uploads end in 408 at the upstream timeout, the client's doing: no
    // backend is charged or ejected.
    let mut answered_408 = 0;
    for s in bodies.iter_mut().take(50) {
        s.set_read_timeout(Some(Duration::from_secs(6))).unwrap();
        let mut buf = [0u8; 64];
        if let Ok(n) = s.read(&mut buf) {
            if buf[..n].starts_with(b"HTTP/1.1 408") {
                answered_408 += 1;
            }
        }
    }
    assert_eq!(answered_408, 50, "stalled uploads are answered 408");
    let backends = admin_json(&f, "GET", "/admin/backends", "");
    assert_eq!(
        backends.matches("\"ejected\":false").count(),
        2,
        "{backends}"
    );
    assert_eq!(backends.matches("\"errors\":0").count(), 2, "{backends}");
    drop((lorises, bodies));
    assert!(one_request(f.proxy, true).is_ok());
}

// ------------------------------------------------------------------ §11a floods

/// Runs `f` on a runtime of its own (the tests above take turns with a plain mutex,
/// held outside any `await`).
fn on_runtime<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// `n` HTTP/2 connections by prior knowledge, each on its own task (aborting it closes
/// the connection); with `path`, each sends that many requests at once (`streams`) and
/// never reads their bodies. A task ends when fulcrum ends its connection.
async fn h2_clients(
    addr: SocketAddr,
    n: usize,
    path: Option<(&'static str, usize)>,
) -> Vec<tokio::task::JoinHandle<()>> {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let mut tasks = Vec::new();
    for _ in 0..n {
        let Ok(tcp) = tokio::net::TcpStream::connect(addr).await else {
            continue;
        };
        tasks.push(tokio::spawn(async move {
            let Ok((mut h2, conn)) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                    .await
            else {
                return;
            };
            let requests = async move {
                let mut held = Vec::new();
                for _ in 0..path.map_or(0, |(_, n)| n) {
                    let path = path.map_or("/", |(p, _)| p);
                    let req = http::Request::get(format!("http://h.test{path}"))
                        .body(http_body_util::Empty::<bytes::Bytes>::new())
                        .unwrap();
                    if h2.ready().await.is_err() {
                        break;
                    }
                    held.push(h2.send_request(req));
                }
                let answers = futures_util::future::join_all(held).await;
                // The sender and the unread answers stay alive with the connection.
                std::future::pending::<()>().await;
                drop((answers, h2));
            };
            tokio::select! {
                _ = conn => {}
                _ = requests => {}
            }
        }));
    }
    tasks
}

#[test]
fn idle_h2_connections_cannot_hold_the_connection_cap() {
    let _turn = one_at_a_time();
    on_runtime(async {
        let ports = [free_port()];
        let _b = DemoBackend::start("b0", ports[0], 1);
        let f = start_over(&ports, &["--max-connections", "100"]);
        // A hundred connections that send their preface and SETTINGS, and nothing more.
        let idle = h2_clients(f.proxy, 100, None).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let t = Instant::now();
        let proxy = f.proxy;
        let answer = tokio::task::spawn_blocking(move || {
            raw_exchange(
                proxy,
                b"GET /late HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
                Duration::from_secs(20),
            )
        })
        .await
        .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            t.elapsed() < Duration::from_secs(12),
            "served once the idle ones were closed: {:?}",
            t.elapsed()
        );
        // Every idle connection was ended by fulcrum.
        for task in idle {
            assert!(
                tokio::time::timeout(Duration::from_secs(5), task)
                    .await
                    .is_ok(),
                "an idle h2 connection still open"
            );
        }
    });
}

#[test]
fn an_h2_descriptor_flood_leaves_the_admin_api_and_health_checks_alone() {
    let _turn = one_at_a_time();
    on_runtime(async {
        raise_own_file_limit();
        let a = TestBackend::start("A");
        let spec = a.spec();
        // 1024 descriptors: the proxy's share is about 450 connections.
        let f = Fulcrum::start_with_file_limit(
            1024,
            &[
                "--backend",
                &spec,
                "--health-interval",
                "200ms",
                "--health-timeout",
                "1s",
                "--access-log",
                "off",
            ],
        );
        // 500 connections with one slow request each, and 20 with twenty each: far more
        // upstream connections than descriptors.
        let mut flood = h2_clients(f.proxy, 500, Some(("/sleep/6000", 1))).await;
        flood.extend(h2_clients(f.proxy, 20, Some(("/sleep/6000", 20))).await);
        let admin = f.admin;
        let watched = tokio::task::spawn_blocking(move || {
            let mut answers = Vec::new();
            let end = Instant::now() + Duration::from_secs(4);
            while Instant::now() < end {
                let t = Instant::now();
                let r = raw_exchange(
                    admin,
                    b"GET /admin/backends HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                    Duration::from_secs(2),
                );
                answers.push((t.elapsed(), r));
                std::thread::sleep(Duration::from_millis(200));
            }
            answers
        })
        .await
        .unwrap();
        let took: Vec<_> = watched.iter().map(|(t, _)| *t).collect();
        assert!(
            watched.len() >= 10,
            "{} answers in 4 s, taking {took:?}:\n{}",
            watched.len(),
            f.log()
        );
        for (took, r) in &watched {
            assert!(r.starts_with("HTTP/1.1 200"), "the admin API answers: {r}");
            assert!(*took < Duration::from_secs(1), "promptly: {took:?}");
            assert!(
                r.contains("\"healthy\":true"),
                "the backend stays healthy: {r}"
            );
        }
        assert!(
            !f.log().contains("Too many open files"),
            "no listener ran out of descriptors:\n{}",
            f.log()
        );
        for t in flood {
            t.abort();
        }
    });
}

#[test]
fn twenty_slow_readers_do_not_hold_the_connection_cap() {
    let _turn = one_at_a_time();
    let a = TestBackend::start("A");
    let f = Fulcrum::over(
        &[&a],
        &[
            "--max-connections",
            "20",
            "--send-timeout",
            "2s",
            "--access-log",
            "off",
        ],
    );
    // Twenty clients ask for 64 MiB each and read none of it.
    let readers: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut s = TcpStream::connect(f.proxy).unwrap();
            s.write_all(b"GET /big/67108864 HTTP/1.1\r\nHost: t\r\n\r\n")
                .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let r = raw_exchange(
        f.proxy,
        b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        Duration::from_secs(15),
    );
    assert!(r.starts_with("HTTP/1.1 200"), "{}", &r[..r.len().min(200)]);
    assert!(
        t.elapsed() < Duration::from_secs(6),
        "a slot freed by the send timeout: {:?}",
        t.elapsed()
    );
    drop(readers);
}

/// wrk's summary of a run: requests and socket errors (connect, read, write, timeout).
fn wrk_summary(out: &str) -> (u64, [u64; 4]) {
    let requests = out
        .lines()
        .find(|l| l.contains("requests in"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let mut errors = [0u64; 4];
    if let Some(l) = out.lines().find(|l| l.contains("Socket errors:")) {
        let nums: Vec<u64> = l
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect();
        for (e, n) in errors.iter_mut().zip(nums) {
            *e = n;
        }
    }
    (requests, errors)
}

#[test]
fn five_upgrades_under_wrk_keep_alive_load_give_no_socket_error() {
    let _turn = one_at_a_time();
    let a = TestBackend::start("A");
    let dir = std::env::temp_dir().join(format!("fulcrum-chaos-wrk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("upgrade.sock");
    let spec = a.spec();
    let args = |upgrade: bool| {
        let mut v = vec![
            "--backend".to_string(),
            spec.clone(),
            "--upgrade-socket".into(),
            sock.to_str().unwrap().into(),
            "--access-log".into(),
            "off".into(),
            "--workers".into(),
            "2".into(),
        ];
        if upgrade {
            v.push("--upgrade".into());
        }
        v
    };
    let start = |upgrade: bool| {
        let a = args(upgrade);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        Fulcrum::start(&a)
    };
    let mut current = start(false);
    // wrk never retries: a keep-alive connection closed under a request is an error.
    let wrk = Command::new("wrk")
        .args([
            "-t2",
            "-c50",
            "-d12s",
            &format!("http://{}/x", current.proxy),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("wrk (Debian's package wrk) runs");
    std::thread::sleep(Duration::from_secs(1));
    for round in 0..5 {
        let mut next = start(true);
        let st = current.wait_exit(Duration::from_secs(15));
        assert_eq!(
            st.and_then(|s| s.code()),
            Some(0),
            "round {round}: the old process drains and exits; log:\n{}",
            current.log()
        );
        std::mem::swap(&mut current, &mut next);
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = wrk.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let (requests, errors) = wrk_summary(&text);
    assert!(requests > 1000, "{text}");
    assert_eq!(
        errors, [0; 4],
        "socket errors (connect, read, write, timeout):\n{text}"
    );
}

/// The resident set of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    kb * 1024
}

#[test]
fn memory_goes_back_after_a_flood_of_idle_connections() {
    let _turn = one_at_a_time();
    on_runtime(async {
        raise_own_file_limit();
        let a = TestBackend::start("A");
        let f = Fulcrum::over(
            &[&a],
            &["--access-log", "off", "--max-connections", "20000"],
        );
        let pid = f.child.id();
        for _ in 0..50 {
            assert!(one_request(f.proxy, false).is_ok());
        }
        std::thread::sleep(Duration::from_millis(300));
        let idle = rss(pid);
        let bound = 2 * idle + 10 * 1024 * 1024;
        // Twice: 6 000 idle HTTP/1.1 connections and 2 000 HTTP/2 ones, then all closed.
        let mut peak = 0;
        for _ in 0..2 {
            let plain = open_idle(f.proxy, 6_000);
            let h2 = h2_clients(f.proxy, 2_000, None).await;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            peak = peak.max(rss(pid));
            drop(plain);
            for t in h2 {
                t.abort();
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(
            peak > bound,
            "the flood must cost memory to show anything: {peak} vs {bound}"
        );
        let t = Instant::now();
        let mut now = rss(pid);
        while now > bound && t.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_secs(1)).await;
            now = rss(pid);
        }
        println!(
            "RSS idle {idle}, peak {peak}, after {:?}: {now}",
            t.elapsed()
        );
        assert!(
            now <= bound,
            "RSS {now} after 60 s, above 2 × {idle} + 10 MiB (peak {peak})"
        );
    });
}
