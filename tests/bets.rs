//! The smarter bets over real processes: success-rate ejection, load reported by the
//! backends, adaptive concurrency and `POST /admin/explain`.

mod common;

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");

/// A `fulcrum backend` process on a free port, killed when dropped.
struct DemoBackend {
    child: Child,
    port: u16,
    name: String,
}

impl DemoBackend {
    fn start(name: &str, extra: &[&str]) -> DemoBackend {
        let port = free_port();
        let child = Command::new(BIN)
            .args(["backend", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--name", name])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a demo backend");
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "backend {name} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        DemoBackend {
            child,
            port,
            name: name.into(),
        }
    }

    /// The `--backend` value naming it.
    fn spec(&self) -> String {
        format!("http://127.0.0.1:{},name={}", self.port, self.name)
    }
}

impl Drop for DemoBackend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// fulcrum over `backends`, with `extra` flags.
fn over(backends: &[DemoBackend], extra: &[&str]) -> Fulcrum {
    let mut args: Vec<String> = Vec::new();
    for b in backends {
        args.push("--backend".into());
        args.push(b.spec());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Fulcrum::start(&args)
}

/// Sends `n` GETs, `clients` at a time; returns how many answered 5xx.
async fn load(c: &HttpClient, f: &Fulcrum, n: usize, clients: usize) -> usize {
    let url = f.url("/");
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (c, url) = (c.clone(), url.clone());
        let share = n / clients + usize::from(i < n % clients);
        tasks.push(tokio::spawn(async move {
            let mut failed = 0;
            for _ in 0..share {
                if get(&c, &url).await.status.is_server_error() {
                    failed += 1;
                }
            }
            failed
        }));
    }
    let mut failed = 0;
    for t in tasks {
        failed += t.await.unwrap();
    }
    failed
}

/// Each backend's `ejected` flag, by name.
async fn ejected(c: &HttpClient, f: &Fulcrum) -> Vec<(String, bool)> {
    status(c, f).await["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let name = b["name"].as_str().unwrap().to_string();
            (name, b["ejected"].as_bool().unwrap())
        })
        .collect()
}

/// Success-rate flags: a one-second window, passive consecutive-failure checks off so
/// that only the success rate can eject.
const SUCCESS_RATE: [&str; 4] = [
    "--outlier-consecutive-failures",
    "0",
    "--outlier-success-rate",
    "interval=1s,min_hosts=3,min_requests=20,stdev_factor=1.5",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_failing_fast_is_ejected_by_its_success_rate_within_two_intervals() {
    let backends = vec![
        DemoBackend::start("a", &[]),
        DemoBackend::start("b", &[]),
        DemoBackend::start("c", &[]),
        DemoBackend::start("d", &[]),
        DemoBackend::start("sick", &["--error-rate", "0.35"]),
    ];
    let f = over(&backends, &SUCCESS_RATE);
    let c = client();
    let mut events = EventStream::open(&f);
    let t = Instant::now();
    let mut out = false;
    while t.elapsed() < Duration::from_millis(2200) && !out {
        load(&c, &f, 100, 4).await;
        out = ejected(&c, &f).await.contains(&("sick".into(), true));
    }
    assert!(out, "not ejected after {:?}", t.elapsed());
    let e = events.find(Duration::from_secs(2), |e| {
        e["type"] == "ejection" && e["backend"] == "sick" && e["ejected"] == true
    });
    let e = e.expect("an ejection event");
    assert_eq!(e["reason"], "success_rate", "{e}");
    let others = ejected(&c, &f).await;
    assert_eq!(others.iter().filter(|(_, e)| *e).count(), 1, "{others:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_failing_as_a_whole_ejects_nobody() {
    let backends: Vec<_> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|n| DemoBackend::start(n, &["--error-rate", "0.3"]))
        .collect();
    let f = over(&backends, &SUCCESS_RATE);
    let c = client();
    let t = Instant::now();
    let mut failed = 0;
    let mut sent = 0;
    while t.elapsed() < Duration::from_millis(3500) {
        failed += load(&c, &f, 100, 4).await;
        sent += 100;
        let now = ejected(&c, &f).await;
        assert!(now.iter().all(|(_, e)| !e), "{now:?}");
    }
    let share = failed as f64 / sent as f64;
    assert!(
        (0.2..0.4).contains(&share),
        "the pool fails as a whole: {share}"
    );
}

/// `POST /admin/explain` with `body`; the answer's JSON.
async fn explain(c: &HttpClient, f: &Fulcrum, body: &str) -> serde_json::Value {
    let r = admin(c, "POST", &f.admin_url("/admin/explain"), body).await;
    assert_eq!(r.status, 200, "{body}: {}", r.text());
    r.json()
}

/// The name of the backend with `id` in the first pool.
async fn name_of(c: &HttpClient, f: &Fulcrum, id: &serde_json::Value) -> String {
    let s = status(c, f).await;
    let b = s["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| &b["id"] == id);
    b.unwrap_or_else(|| panic!("no backend {id}"))["name"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_the_backend_the_next_request_gets_under_consistent_hashing() {
    let bs: Vec<_> = ["A", "B", "C", "D"]
        .iter()
        .map(|n| TestBackend::start(n))
        .collect();
    let refs: Vec<&TestBackend> = bs.iter().collect();
    let f = Fulcrum::over(
        &refs,
        &[
            "--strategy",
            "consistent_hash",
            "--hash-key",
            "header:x-user",
        ],
    );
    let c = client();
    let mut seen = std::collections::BTreeSet::new();
    for user in ["ann", "bob", "cy", "dee", "eve", "fay", "gus", "hal"] {
        let body = format!(r#"{{"path": "/cart", "headers": {{"x-user": "{user}"}}}}"#);
        let e = explain(&c, &f, &body).await;
        assert_eq!(e["route"], 0, "{e}");
        assert_eq!(e["strategy"], "consistent_hash", "{e}");
        let named = name_of(&c, &f, &e["backend"]).await;
        let got = send(&c, "GET", &f.url("/cart"), &[("x-user", user)], "").await;
        assert_eq!(got.backend(), named, "{user}: {e}");
        assert_eq!(e["candidates"].as_array().unwrap().len(), 4, "{e}");
        assert!(e["why"].as_str().unwrap().contains(&named), "{e}");
        seen.insert(named);
    }
    assert!(seen.len() >= 2, "the keys spread: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_explain_calls_change_no_counter_and_do_not_move_round_robin() {
    let bs: Vec<_> = ["A", "B", "C"]
        .iter()
        .map(|n| TestBackend::start(n))
        .collect();
    let refs: Vec<&TestBackend> = bs.iter().collect();
    let f = Fulcrum::over(&refs, &[]);
    let c = client();
    for _ in 0..4 {
        assert_eq!(get(&c, &f.url("/")).await.status, 200);
    }
    let before = status(&c, &f).await;
    let metrics_before = get(&c, &f.admin_url("/metrics")).await.text();
    let mut named = Vec::new();
    for _ in 0..100 {
        named.push(explain(&c, &f, "{}").await["backend"].clone());
    }
    assert!(named.windows(2).all(|w| w[0] == w[1]), "{named:?}");
    let after = status(&c, &f).await;
    for (b, a) in before["backends"]
        .as_array()
        .unwrap()
        .iter()
        .zip(after["backends"].as_array().unwrap())
    {
        assert_eq!(b["requests"], a["requests"], "{b} {a}");
    }
    let requests = |m: &str| -> Vec<String> {
        m.lines()
            .filter(|l| l.starts_with("fulcrum_requests_total"))
            .map(String::from)
            .collect()
    };
    let metrics_after = get(&c, &f.admin_url("/metrics")).await.text();
    assert_eq!(requests(&metrics_before), requests(&metrics_after));
    let next = get(&c, &f.url("/")).await.backend();
    assert_eq!(
        next,
        name_of(&c, &f, &named[0]).await,
        "the rotation did not move"
    );
    let moved = explain(&c, &f, "{}").await;
    assert_ne!(
        moved["backend"], named[0],
        "a real request moves it: {moved}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_says_why_a_backend_is_not_a_candidate_and_refuses_a_bad_question() {
    let bs: Vec<_> = ["A", "B", "C"]
        .iter()
        .map(|n| TestBackend::start(n))
        .collect();
    let refs: Vec<&TestBackend> = bs.iter().collect();
    let f = Fulcrum::over(&refs, &["--strategy", "least_connections"]);
    let c = client();
    let r = admin(
        &c,
        "PATCH",
        &f.admin_url("/admin/backends/1"),
        r#"{"state": "draining"}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let e = explain(&c, &f, "{}").await;
    let cands = e["candidates"].as_array().unwrap();
    assert_eq!(cands[1]["eligible"], false, "{e}");
    assert_eq!(cands[1]["reason"], "draining", "{e}");
    assert_eq!(cands[0]["reason"], serde_json::Value::Null, "{e}");
    assert_eq!(
        cands[0]["score"], 0.0,
        "least connections' score is in flight: {e}"
    );
    assert_eq!(e["backend"], 0, "{e}");
    for bad in [
        r#"{"method": "G T"}"#,
        r#"{"path": "no slash"}"#,
        r#"{"speed": 1}"#,
        "[1]",
        // A form feed (whitespace to `u8::is_ascii_whitespace`) and a vertical tab are
        // not JSON's whitespace (RFC 8259 §2): not an empty question.
        "\x0c",
        " \x0b ",
    ] {
        let r = admin(&c, "POST", &f.admin_url("/admin/explain"), bad).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.json()["error"].is_string(), "{bad}");
    }
    // JSON's own whitespace is no body at all: the default question.
    assert_eq!(explain(&c, &f, " \r\n\t").await["backend"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_a_redirect_a_rate_limit_and_missing_credentials() {
    let api = TestBackend::start("api");
    let dir = std::env::temp_dir().join(format!("fulcrum-bets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let users = dir.join("htpasswd");
    std::fs::write(
        &users,
        format!("alice:{}\n", bcrypt::hash("s3cret", 4).unwrap()),
    )
    .unwrap();
    let cfg = config_file(
        "bets",
        "explain",
        &format!(
            "[[pools]]\nname = \"api\"\nbackends = [{{ url = \"{}\", name = \"api\" }}]\n\n\
             [[routes]]\nhost = \"old.example\"\nredirect = {{ to = \"https://new.example{{path}}\", status = 301 }}\n\n\
             [[routes]]\npool = \"api\"\npath_prefix = \"/ops\"\nbasic_auth = {{ realm = \"ops\", users_file = \"{}\" }}\n\n\
             [[routes]]\npool = \"api\"\npath_prefix = \"/lan\"\ndeny = [\"10.0.0.0/8\"]\n\n\
             [[routes]]\npool = \"api\"\nrate_limit = {{ rate = 1, per = \"1m\", burst = 0 }}\n",
            api.url(),
            users.display()
        ),
    );
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let c = client();
    let e = explain(&c, &f, r#"{"host": "old.example", "path": "/a"}"#).await;
    assert_eq!(
        (e["route"].clone(), e["backend"].clone()),
        (0.into(), serde_json::Value::Null)
    );
    assert_eq!(e["step"], "redirect", "{e}");
    assert!(
        e["why"]
            .as_str()
            .unwrap()
            .contains("301 to https://new.example/a"),
        "{e}"
    );
    let e = explain(&c, &f, r#"{"path": "/ops/x"}"#).await;
    assert!(e["why"].as_str().unwrap().contains("401"), "{e}");
    assert_eq!(e["step"], "basic_auth", "{e}");
    // The client lists: a denied address is named by the `allow` step.
    let e = explain(&c, &f, r#"{"path": "/lan/x", "client_ip": "10.1.2.3"}"#).await;
    assert_eq!(
        (e["route"].clone(), e["step"].clone()),
        (2.into(), "allow".into()),
        "{e}"
    );
    let e = explain(&c, &f, r#"{"path": "/lan/x"}"#).await;
    assert_eq!(
        (e["step"].clone(), e["backend"].is_u64()),
        (serde_json::Value::Null, true),
        "{e}"
    );
    let good = format!("Basic {}", base64_of("alice:s3cret"));
    let body = format!(r#"{{"path": "/ops/x", "headers": {{"authorization": "{good}"}}}}"#);
    // Credentials no request has verified yet: explain checks no password.
    let e = explain(&c, &f, &body).await;
    let why = e["why"].as_str().unwrap_or_default();
    assert!(why.contains("basic auth would verify these"), "{e}");
    let r = send(&c, "GET", &f.url("/ops/x"), &[("authorization", &good)], "").await;
    assert_eq!(r.status, 200);
    // Nor does it say which credentials a request verified before.
    let e = explain(&c, &f, &body).await;
    let why = e["why"].as_str().unwrap_or_default();
    assert!(why.contains("basic auth would verify these"), "{e}");
    // The rate limit: explain spends nothing of the allowance.
    for _ in 0..5 {
        let e = explain(&c, &f, r#"{"path": "/x"}"#).await;
        assert_eq!(e["route"], 3, "{e}");
        assert!(e["backend"].is_u64(), "{e}");
        assert!(e["step"].is_null(), "{e}");
    }
    assert_eq!(get(&c, &f.url("/x")).await.status, 200);
    let e = explain(&c, &f, r#"{"path": "/x"}"#).await;
    assert!(e["why"].as_str().unwrap().contains("429"), "{e}");
    assert_eq!(e["step"], "rate_limit", "{e}");
    assert_eq!(get(&c, &f.url("/x")).await.status, 429);
}

fn base64_of(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A backend that answers every request 200 with `report` as its
/// `endpoint-load-metrics` field (none when empty), keeping connections alive; its name
/// in `x-backend`.
fn reporting_backend(name: &'static str, report: &'static str) -> std::net::SocketAddr {
    let field = match report {
        "" => String::new(),
        r => format!("endpoint-load-metrics: {r}\r\n"),
    };
    raw_backend(
        Duration::ZERO,
        format!("x-backend: {name}\r\n{field}"),
        "ok",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_reported_load_a_backend_reporting_twice_the_utilization_gets_half_the_share() {
    let busy = reporting_backend("busy", "TEXT cpu_utilization=0.8, rps_fractional=100");
    let calm = reporting_backend(
        "calm",
        "TEXT application_utilization=0.4, cpu_utilization=0.9, rps_fractional=100",
    );
    let bad = reporting_backend("bad", "TEXT cpu_utilization=lots");
    let f = Fulcrum::start(&[
        "--backend",
        &format!("http://{busy},name=busy"),
        "--backend",
        &format!("http://{calm},name=calm"),
        "--backend",
        &format!("http://{bad},name=bad"),
        "--strategy",
        "orca",
    ]);
    let c = client();
    let r = get(&c, &f.url("/")).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("endpoint-load-metrics"),
        None,
        "the report never reaches the client"
    );
    // The reports arrive, and the weights are recomputed every second.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        get(&c, &f.url("/")).await;
    }
    let mut counts = std::collections::HashMap::<String, u32>::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        let r = get(&c, &f.url("/")).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("endpoint-load-metrics"), None);
        *counts
            .entry(r.header("x-backend").unwrap().to_string())
            .or_default() += 1;
    }
    let ratio = f64::from(counts["busy"]) / f64::from(counts["calm"]);
    assert!(
        (0.4..=0.6).contains(&ratio),
        "busy ÷ calm = {ratio}: {counts:?}"
    );
    // The one whose report cannot be read gets the mean weight: between the two.
    assert!(
        counts["bad"] > counts["busy"] && counts["bad"] < counts["calm"],
        "{counts:?}"
    );
    let s = status(&c, &f).await;
    let util: Vec<_> = s["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["reported_utilization"].clone())
        .collect();
    assert_eq!(
        util,
        vec![
            serde_json::json!(0.8),
            serde_json::json!(0.4),
            serde_json::Value::Null
        ]
    );
    let m = get(&c, &f.admin_url("/metrics")).await.text();
    let malformed = m
        .lines()
        .find(|l| l.starts_with("fulcrum_load_reports_malformed_total{backend=\"bad\""))
        .unwrap_or_else(|| panic!("{m}"));
    let n: f64 = malformed.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 10.0, "{malformed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demo_backend_reports_its_own_load() {
    let b = DemoBackend::start(
        "r",
        &[
            "--report-load",
            "--latency-ms",
            "20",
            "--max-concurrency",
            "4",
        ],
    );
    let f = over(std::slice::from_ref(&b), &["--strategy", "reported_load"]);
    let c = client();
    let t = Instant::now();
    let mut util = serde_json::Value::Null;
    while t.elapsed() < Duration::from_secs(4) && util.is_null() {
        load(&c, &f, 20, 4).await;
        util = status(&c, &f).await["backends"][0]["reported_utilization"].clone();
    }
    let u = util.as_f64().unwrap_or_else(|| panic!("no report: {util}"));
    // Four clients on four slots of 20 ms: busy most of the time.
    assert!(u > 0.3 && u <= 1.0, "{u}");
}

#[test]
fn bad_settings_of_the_bets_exit_2_naming_them() {
    let cases: [(&str, &str); 6] = [
        (
            "[outlier]\nsuccess_rate = { stdev_factor = 0 }\n",
            "line 2: outlier.success_rate: success_rate.stdev_factor",
        ),
        (
            "[outlier]\nsuccess_rate = { min_hosts = 0 }\n",
            "line 2: outlier.success_rate: success_rate.min_hosts",
        ),
        (
            "backends = [{ url = \"http://127.0.0.1:1\", max_conns = \"fast\" }]\n",
            "max_conns 'fast'",
        ),
        ("max_conns = \"fast\"\n", "invalid max_conns 'fast'"),
        (
            "max_conns_auto = { min = 9, max = 3 }\n",
            "min 9 is over max 3",
        ),
        (
            "[outlier]\nsuccess_rate = { interval = \"2h\" }\n",
            "success_rate.interval",
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let cfg = config_file("bets", &format!("bad{i}"), text);
        let (status, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
        assert_eq!(status.code(), Some(2), "{text}: {err}");
        assert!(err.contains(want), "{text}: {err}");
    }
    // A number or "auto", at the top and in a pool.
    for text in [
        "max_conns = 8\nbackends = [{ url = \"http://127.0.0.1:1\" }]\n",
        "[[pools]]\nname = \"p\"\nmax_conns = \"auto\"\nmax_conns_auto = { min = 2 }\nbackends = [{ url = \"http://127.0.0.1:1\" }]\n",
    ] {
        let cfg = config_file("bets", "good", text);
        let (status, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
        assert_eq!(status.code(), Some(0), "{text}: {err}");
    }
    for (flag, value) in [
        ("--outlier-success-rate", "stdev_factor=-1"),
        ("--max-conns", "fast"),
        ("--backend", "http://127.0.0.1:1,max_conns=fast"),
    ] {
        let (status, _, err) = run_fulcrum(&["serve", flag, value]);
        assert_eq!(status.code(), Some(2), "{flag} {value}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains(value.rsplit('=').next().unwrap()),
            "{flag}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adaptive_limit_shows_in_backend_and_follows_latency() {
    let b = DemoBackend::start("slow4", &["--latency-ms", "20", "--max-concurrency", "4"]);
    let f = over(
        std::slice::from_ref(&b),
        &[
            "--max-conns",
            "auto",
            "--max-conns-auto",
            "min=2,max=50",
            "--max-queue",
            "1000",
            "--queue-timeout",
            "5s",
        ],
    );
    let c = client();
    let b0 = status(&c, &f).await["backends"][0].clone();
    assert_eq!(b0["max_conns_mode"], "auto", "{b0}");
    assert_eq!(b0["max_conns"], 4, "it starts small: {b0}");
    // Thirty clients at once on four workers: the limit stays near where requests start
    // to queue inside the backend, and the rest wait in fulcrum's queue.
    let t = Instant::now();
    let mut seen = Vec::new();
    while t.elapsed() < Duration::from_secs(4) {
        let failed = load(&c, &f, 120, 30).await;
        assert_eq!(failed, 0);
        seen.push(
            status(&c, &f).await["backends"][0]["max_conns"]
                .as_u64()
                .unwrap(),
        );
    }
    let last = *seen.last().unwrap();
    assert!((2..=16).contains(&last), "the limit: {seen:?}");
    assert!(seen.iter().any(|&l| l != 4), "it moves: {seen:?}");
}
