//! The dashboard in a real headless Chromium: `tests/browser/dashboard.test.mjs` drives the
//! page that a real fulcrum serves, with backends it spawned itself.
//!
//! Needs Node.js, Debian's Chromium (`/usr/bin/chromium`, or `FULCRUM_CHROMIUM`) and
//! `npm ci` done in `tests/browser`; `.ci/browser-setup.sh` provides all three, and the
//! test runs it itself when something is missing. If that cannot help, the tests fail,
//! saying so: they are never skipped.
//!
//! Screenshots land in `target/tmp/dashboard-screenshots/`; they are copied to `docs/img/`
//! when one is missing there, or every time with `FULCRUM_UPDATE_SCREENSHOTS=1`.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// Health interval of the fulcrum under test, and its unhealthy threshold (the default).
const HEALTH_INTERVAL_MS: u64 = 500;
const UNHEALTHY_THRESHOLD: u64 = 3;
/// How soon the page must show a killed backend as down: the checks' own detection time
/// plus a margin for a busy machine.
const DOWN_WITHIN_MS: u64 = HEALTH_INTERVAL_MS * UNHEALTHY_THRESHOLD + 4500;
/// The browser script gives up by itself after 100 s; this is the last resort.
const SCRIPT_LIMIT: Duration = Duration::from_secs(150);
const TOKEN: &str = "dashboard-test-token-7f3a";

/// One Chromium at a time: both tests are timing-sensitive on a small machine.
static BROWSER: Mutex<()> = Mutex::new(());

fn browser_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")
}

fn chromium() -> PathBuf {
    std::env::var_os("FULCRUM_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots")
}

/// Installs what the browser test needs when something is missing (once per run), so
/// the README's single test command works on a fresh machine; then fails (never skips)
/// if anything is still missing.
fn require_browser_tools() {
    static SETUP: std::sync::Once = std::sync::Once::new();
    if !missing_browser_tools().is_empty() {
        SETUP.call_once(|| {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/browser-setup.sh");
            eprintln!("dashboard test: running {}", script.display());
            let _ = Command::new("bash").arg(&script).status();
        });
    }
    let missing = missing_browser_tools();
    assert!(
        missing.is_empty(),
        "the dashboard browser test cannot run, missing: {}.\n\
         Run `bash .ci/browser-setup.sh` once (it installs Debian's chromium and runs \
         `npm ci` in tests/browser), then run the tests again.",
        missing.join("; ")
    );
}

fn missing_browser_tools() -> Vec<String> {
    let mut missing = Vec::new();
    let node = Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !node.is_ok_and(|s| s.success()) {
        missing.push("Node.js (`node` on PATH)".to_string());
    }
    if !browser_dir()
        .join("node_modules/playwright-core/package.json")
        .is_file()
    {
        missing.push("tests/browser/node_modules (npm ci in tests/browser)".to_string());
    }
    if !chromium().is_file() {
        missing.push(format!("Chromium at {}", chromium().display()));
    }
    missing
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Spawns a demo backend through the admin API and checks the answer.
async fn spawn_backend(c: &HttpClient, f: &Fulcrum, token: Option<&str>, body: &str) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("authorization", a.as_str()));
    }
    let r = send(
        c,
        "POST",
        &f.admin_url("/admin/backends/spawn"),
        &headers,
        body.to_string(),
    )
    .await;
    assert_eq!(r.status, 201, "spawn {body}: {}", r.text());
    let b = r.json();
    assert!(b["pid"].is_u64() && b["port"].is_u64(), "{b}");
}

/// A TCP backend that echoes what it reads until the client half-closes, on its own
/// thread per connection.
fn tcp_echo() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = conn;
                let Ok(mut w) = r.try_clone() else { return };
                let _ = std::io::copy(&mut r, &mut w);
            });
        }
    });
    addr
}

/// `n` bytes through fulcrum's TCP listener at `addr` and back; the connection, still
/// open.
fn tcp_round_trip(addr: SocketAddr, n: usize) -> std::net::TcpStream {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // Written from a thread of its own: the echo comes back while it is being sent.
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || w.write_all(&vec![b'x'; n]).unwrap());
    let mut back = vec![0u8; n];
    s.read_exact(&mut back).unwrap();
    writer.join().unwrap();
    s
}

/// The page itself: served at `/`, as HTML, without a token.
async fn check_page_served(c: &HttpClient, f: &Fulcrum) {
    let r = get(c, &f.admin_url("/")).await;
    assert_eq!(r.status, 200, "GET / answered {}: {}", r.status, r.text());
    let ct = r.header("content-type").unwrap_or("");
    assert!(ct.starts_with("text/html"), "GET / content-type {ct}");
    assert!(
        r.text().contains("data-testid=\"topology\""),
        "GET / is not the dashboard"
    );
}

/// Runs the browser script against `admin` and fails with its output unless it passes.
fn run_browser_script(admin: SocketAddr, token: Option<&str>) {
    run_tour(admin, token, "tour");
}

/// Runs the browser script's tour `which` (`tour`, or `pools`).
fn run_tour(admin: SocketAddr, token: Option<&str>, which: &str) {
    run_tour_with(admin, token, which, &[]);
}

/// The same, with `env` set for the script.
fn run_tour_with(admin: SocketAddr, token: Option<&str>, which: &str, env: &[(&str, String)]) {
    let shots = screenshot_dir();
    std::fs::create_dir_all(&shots).unwrap();
    let mut cmd = Command::new("node");
    cmd.current_dir(browser_dir())
        .arg("dashboard.test.mjs")
        .arg(format!("http://{admin}"))
        .env("FULCRUM_CHROMIUM", chromium())
        .env("DASHBOARD_SCREENSHOTS", &shots)
        .env("DASHBOARD_DOWN_WITHIN_MS", DOWN_WITHIN_MS.to_string())
        .env("DASHBOARD_TOUR", which)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(t) = token {
        cmd.arg(t);
    }
    let started = Instant::now();
    let mut child = cmd.spawn().expect("start node");
    let output = Arc::new(Mutex::new(String::new()));
    let readers: Vec<_> = [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ]
    .into_iter()
    .map(|pipe| {
        let out = Arc::clone(&output);
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                println!("{line}");
                let mut o = out.lock().unwrap();
                o.push_str(&line);
                o.push('\n');
            }
        })
    })
    .collect();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if started.elapsed() > SCRIPT_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for r in readers {
        let _ = r.join();
    }
    let out = output.lock().unwrap().clone();
    match status {
        Some(st) if st.success() => {
            println!(
                "browser test passed in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        Some(st) => panic!(
            "browser test failed ({st}); screenshots in {}; output:\n{out}",
            shots.display()
        ),
        None => panic!(
            "browser test still running after {} s; output:\n{out}",
            SCRIPT_LIMIT.as_secs()
        ),
    }
}

/// Copies the screenshots that `docs/dashboard.md` shows into `docs/img/`.
fn publish_screenshots(names: &[&str]) {
    let update = std::env::var("FULCRUM_UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1");
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/img");
    for name in names {
        let from = screenshot_dir().join(name);
        let to = docs.join(name);
        if from.is_file() && (update || !to.exists()) {
            std::fs::create_dir_all(&docs).unwrap();
            std::fs::copy(&from, &to).unwrap();
        }
    }
}

/// Starts `fulcrum serve` with `FULCRUM_ADMIN_TOKEN` in its environment.
fn start_with_token(token: &str, args: &[&str]) -> Fulcrum {
    Fulcrum::start_env(
        &["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"],
        args,
        &[("FULCRUM_ADMIN_TOKEN", token)],
    )
}

#[test]
fn dashboard_tour_in_headless_chromium() {
    require_browser_tools();
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let interval = format!("{HEALTH_INTERVAL_MS}ms");
    let f = Fulcrum::start(&["--health-interval", &interval]);
    let rt = runtime();
    rt.block_on(async {
        let c = client();
        check_page_served(&c, &f).await;
        for (name, latency) in [("alpha", 5), ("beta", 10), ("gamma", 15)] {
            let body = format!(r#"{{"name": "{name}", "latency_ms": {latency}}}"#);
            spawn_backend(&c, &f, None, &body).await;
        }
    });
    run_browser_script(f.admin, None);
    publish_screenshots(&[
        "dashboard-overview.png",
        "dashboard-strategies.png",
        "dashboard-failover.png",
    ]);
}

#[test]
fn dashboard_asks_for_the_admin_token() {
    require_browser_tools();
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let interval = format!("{HEALTH_INTERVAL_MS}ms");
    let f = start_with_token(TOKEN, &["--health-interval", &interval]);
    let rt = runtime();
    rt.block_on(async {
        let c = client();
        // The page is public, the API behind it is not.
        check_page_served(&c, &f).await;
        let r = get(&c, &f.admin_url("/admin/status")).await;
        assert_eq!(r.status, 401, "{}", r.text());
        for name in ["one", "two"] {
            let body = format!(r#"{{"name": "{name}"}}"#);
            spawn_backend(&c, &f, Some(TOKEN), &body).await;
        }
    });
    run_browser_script(f.admin, Some(TOKEN));
    publish_screenshots(&["dashboard-token.png"]);
}

#[test]
fn dashboard_shows_routes_pools_and_backends() {
    require_browser_tools();
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("fulcrum-dash-pools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("fulcrum.toml");
    // Two pools found from files (docs/discovery.md): one read well, one gone.
    let disc = dir.join("disc.json");
    std::fs::write(&disc, "[]").unwrap();
    let discovered = format!(
        "[[pools]]\nname = \"disc\"\ndiscover = {{ file = \"{}\" }}\n\
         [[pools]]\nname = \"lost\"\ndiscover = {{ file = \"{}\" }}\n\
         [[routes]]\npool = \"disc\"\npath_prefix = \"/disc\"\n\
         rate_limit = {{ rate = 1000, burst = 10 }}\ncompress = [\"br\", \"gzip\"]\n\
         [[routes]]\npool = \"lost\"\npath_prefix = \"/lost\"\ndeny = [\"192.0.2.0/24\"]\n\
         jwt = {{ jwks_url = \"http://127.0.0.1:9/jwks.json\" }}\n\
         forward_auth = {{ url = \"http://127.0.0.1:9/check\" }}\n",
        disc.display(),
        dir.join("gone.json").display()
    );
    // A TCP pool over an echo backend, behind a listener of its own (docs/tcp.md).
    let (echo, tcp_port) = (tcp_echo(), free_port());
    let tcp = format!(
        "[[pools]]\nname = \"db\"\nmode = \"tcp\"\nbackends = [{{ url = \"tcp://{echo}\" }}]\n\
         [[tcp_listeners]]\nlisten = \"127.0.0.1:{tcp_port}\"\npool = \"db\"\n"
    );
    std::fs::write(
        &cfg,
        "[[pools]]\nname = \"web\"\n[[pools]]\nname = \"api\"\n".to_string()
            + &tcp
            + &discovered
            + "[[routes]]\npath_prefix = \"/split\"\nsplit = [{ pool = \"web\", weight = 90 }, { pool = \"api\", weight = 10 }]\n"
            + "mirror = { pool = \"api\", compare = true }\n"
            + "[[routes]]\npool = \"api\"\npath_prefix = \"/api\"\n[[routes]]\npool = \"web\"\n",
    )
    .unwrap();
    let interval = format!("{HEALTH_INTERVAL_MS}ms");
    let f = Fulcrum::start(&[
        "--config",
        cfg.to_str().unwrap(),
        "--health-interval",
        &interval,
    ]);
    let rt = runtime();
    rt.block_on(async {
        let c = client();
        for (name, pool) in [
            ("web-a", "web"),
            ("web-b", "web"),
            ("api-a", "api"),
            ("api-b", "api"),
        ] {
            let body = format!(r#"{{"name": "{name}", "latency_ms": 5, "pool": "{pool}"}}"#);
            spawn_backend(&c, &f, None, &body).await;
        }
        // The disc pool finds web-a in its file.
        let web = get(&c, &f.admin_url("/admin/pools/web")).await.json();
        let url = web["backends"][0]["url"].as_str().unwrap().to_string();
        std::fs::write(&disc, format!(r#"[{{"url": "{url}"}}]"#)).unwrap();
        let found = eventually(Duration::from_secs(3), || async {
            let p = get(&c, &f.admin_url("/admin/pools/disc")).await.json();
            p["backends"].as_array().is_some_and(|b| b.len() == 1)
        })
        .await;
        assert!(found, "the disc pool did not find its backend");
    });
    // Two connections, 200 KiB and a byte each way: the page says "2 connections ·
    // 0.2 MiB in · 0.2 MiB out" (one held open while it is looked at).
    let tcp_addr: SocketAddr = format!("127.0.0.1:{tcp_port}").parse().unwrap();
    drop(tcp_round_trip(tcp_addr, 200 * 1024));
    let _open = tcp_round_trip(tcp_addr, 1);
    rt.block_on(async {
        let c = client();
        let counted = eventually(Duration::from_secs(3), || async {
            let p = get(&c, &f.admin_url("/admin/pools/db")).await.json();
            p["tcp"]["bytes_in"].as_u64() == Some(200 * 1024 + 1)
        })
        .await;
        assert!(
            counted,
            "{}",
            get(&c, &f.admin_url("/admin/pools/db")).await.json()
        );
    });
    run_tour(f.admin, None, "pools");
    publish_screenshots(&["dashboard-pools.png", "dashboard-mirror.png"]);
}

#[test]
fn dashboard_shows_the_fleet() {
    require_browser_tools();
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let etcd = common::etcd::Etcd::start("dashboard");
    let store = etcd.store("dash");
    let f = Fulcrum::start(&["--store", &store]);
    let peer = Fulcrum::start(&["--store", &store]);
    let peer_url = format!("http://{}", peer.admin);
    run_tour_with(
        f.admin,
        None,
        "fleet",
        &[("DASHBOARD_FLEET_PEER", peer_url)],
    );
    publish_screenshots(&["dashboard-fleet.png"]);
}

#[test]
fn dashboard_shows_the_certificates() {
    require_browser_tools();
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let pki = common::tls::Pki::new("dashboard-certs");
    pki.leaf("file", &["file.test"]);
    let (http, https) = (free_port(), free_port());
    let pebble = common::acme::Pebble::start("dashboard", http, https, None);
    let dir = std::env::temp_dir().join(format!("fulcrum-dash-acme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let a = TestBackend::start("A");
    let cfg = config_file(
        "dashboard",
        "certs",
        &format!(
            "listen = \"127.0.0.1:{http}\"\ntls_listen = \"127.0.0.1:{https}\"\n\
             [[backends]]\nurl = \"{}\"\n\
             [tls]\nhttp3 = true\n[[tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\n\
             [tls.acme]\ndirectory = \"{}\"\nca_file = \"{}\"\ndomains = [\"a.acme.test\"]\nstorage = \"{}\"\n",
            a.url(),
            pki.arg("file.pem"),
            pki.arg("file.key"),
            pebble.directory,
            pebble.ca_file.display(),
            dir.display()
        ),
    );
    let f = Fulcrum::start_cmd(
        &["serve", "--admin", "127.0.0.1:0"],
        &["--config", cfg.to_str().unwrap()],
    );
    common::acme::wait_for_cert(&f, None, Duration::from_secs(20));
    // Requests over HTTP/1.1 and HTTP/3, for the protocol mix.
    let plain = raw_exchange(
        f.proxy,
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(plain.starts_with("HTTP/1.1 200"), "{plain}");
    let over_h3 = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let addr = format!("127.0.0.1:{https}").parse().unwrap();
        let mut h3 = common::h3::h3_client(addr, "file.test", &pki.ca_der()).await;
        common::h3::h3_request(&mut h3, "GET", "https://file.test/", None)
            .await
            .0
    });
    assert_eq!(over_h3, 200);
    run_tour(f.admin, None, "certs");
    publish_screenshots(&["dashboard-certificates.png"]);
}

#[test]
fn dashboard_runs_the_strategy_lab() {
    require_browser_tools();
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let f = Fulcrum::start(&[]);
    run_tour(f.admin, None, "lab");
    publish_screenshots(&["dashboard-lab.png"]);
}
