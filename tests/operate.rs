//! Operating fulcrum: metrics, the event stream, spawned backends, the access log,
//! reload, the traffic generator, admin safety — over real sockets and processes.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;

/// The value of one series in a Prometheus text answer.
fn series(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
}

async fn metrics(c: &HttpClient, f: &Fulcrum) -> String {
    let r = get(c, &f.admin_url("/metrics")).await;
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("application/openmetrics-text"));
    r.text()
}

fn pid_alive(pid: u64) -> bool {
    // A zombie still has a /proc entry; its state is Z.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_every_request_exactly_and_follow_health() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let c = client();
    let f = Fulcrum::over(
        &[&a, &b],
        &[
            "--health-interval",
            "200ms",
            "--unhealthy-threshold",
            "1",
            "--healthy-threshold",
            "1",
        ],
    );
    for _ in 0..10 {
        assert_eq!(get(&c, &f.url("/")).await.status, 200);
    }
    for _ in 0..4 {
        get(&c, &f.url("/status/503")).await;
    }
    let m = metrics(&c, &f).await;
    let ok_a = series(
        &m,
        r#"fulcrum_requests_total{backend="A",code="2xx",pool="default"}"#,
    )
    .unwrap();
    let ok_b = series(
        &m,
        r#"fulcrum_requests_total{backend="B",code="2xx",pool="default"}"#,
    )
    .unwrap();
    let err_a = series(
        &m,
        r#"fulcrum_requests_total{backend="A",code="5xx",pool="default"}"#,
    )
    .unwrap();
    let err_b = series(
        &m,
        r#"fulcrum_requests_total{backend="B",code="5xx",pool="default"}"#,
    )
    .unwrap();
    assert_eq!((ok_a, ok_b), (5.0, 5.0), "{m}");
    assert_eq!(err_a + err_b, 4.0, "{m}");
    assert_eq!(
        series(
            &m,
            r#"fulcrum_request_duration_seconds_count{backend="A",pool="default"}"#
        ),
        Some(ok_a + err_a)
    );
    assert_eq!(
        series(&m, r#"fulcrum_strategy_info{strategy="round_robin"}"#),
        Some(1.0)
    );
    for name in [
        "fulcrum_backend_active_requests{backend=\"A\",pool=\"default\"}",
        "fulcrum_backend_latency_ewma_seconds{backend=\"A\",pool=\"default\"}",
        "fulcrum_backend_effective_weight{backend=\"A\",pool=\"default\"}",
        "fulcrum_backend_effective_load{backend=\"A\",pool=\"default\"}",
        "fulcrum_ejections_total{backend=\"A\",pool=\"default\"}",
        "fulcrum_retries_total{pool=\"default\",reason=\"connect\"}",
        "fulcrum_shed_total",
        "fulcrum_no_backend_total",
    ] {
        assert!(series(&m, name).is_some(), "{name} missing:\n{m}");
    }
    assert!(
        series(
            &m,
            r#"fulcrum_health_checks_total{backend="A",result="success",pool="default"}"#
        )
        .unwrap()
            >= 1.0
    );
    assert_eq!(
        series(&m, r#"fulcrum_backend_up{backend="B",pool="default"}"#),
        Some(1.0)
    );

    // Health flips show in backend_up.
    b.set_health(500);
    assert!(
        eventually(Duration::from_secs(5), || async {
            series(
                &metrics(&c, &f).await,
                r#"fulcrum_backend_up{backend="B",pool="default"}"#,
            ) == Some(0.0)
        })
        .await
    );
    // With B out, N more requests add exactly N to A.
    for _ in 0..7 {
        assert_eq!(get(&c, &f.url("/")).await.status, 200);
    }
    let m = metrics(&c, &f).await;
    assert_eq!(
        series(
            &m,
            r#"fulcrum_requests_total{backend="A",code="2xx",pool="default"}"#
        ),
        Some(ok_a + 7.0)
    );
    assert!(
        series(
            &m,
            r#"fulcrum_health_checks_total{backend="B",result="failure",pool="default"}"#
        )
        .unwrap()
            >= 1.0
    );
    b.set_health(200);
    assert!(
        eventually(Duration::from_secs(5), || async {
            series(
                &metrics(&c, &f).await,
                r#"fulcrum_backend_up{backend="B",pool="default"}"#,
            ) == Some(1.0)
        })
        .await
    );

    // Nothing eligible: counted as such.
    let f2 = Fulcrum::start(&[]);
    for _ in 0..3 {
        assert_eq!(get(&c, &f2.url("/")).await.status, 503);
    }
    assert_eq!(
        series(&metrics(&c, &f2).await, "fulcrum_no_backend_total"),
        Some(3.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_reports_switches_requests_and_pool_changes() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let c = client();
    let f = Fulcrum::over(&[&a], &[]);
    let mut ev = EventStream::open(&f);

    let t0 = Instant::now();
    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/strategy"),
        r#"{"strategy":"lc"}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    let e = tokio::task::block_in_place(|| {
        ev.find(Duration::from_secs(1), |v| v["type"] == "strategy")
    })
    .expect("a strategy event within a second");
    assert_eq!(e["strategy"], "least_connections");
    assert!(t0.elapsed() < Duration::from_secs(1));

    get(&c, &f.url("/hello")).await;
    let e =
        tokio::task::block_in_place(|| ev.find(Duration::from_secs(2), |v| v["type"] == "request"))
            .expect("a request event");
    assert_eq!(e["backend"], "A");
    assert_eq!(e["status"], 200);
    assert_eq!(e["path"], "/hello");
    assert!(e["latency_ms"].as_f64().unwrap() >= 0.0);

    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/backends"),
        &format!(r#"{{"url":"{}","name":"B"}}"#, b.url()),
    )
    .await;
    assert_eq!(r.status, 201);
    let e = tokio::task::block_in_place(|| {
        ev.find(Duration::from_secs(2), |v| v["type"] == "backend_added")
    })
    .expect("backend_added");
    assert_eq!(e["backend"]["name"], "B");
    let r = admin(
        &c,
        "PATCH",
        &f.admin_url("/admin/backends/1"),
        r#"{"weight":3}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    let e = tokio::task::block_in_place(|| {
        ev.find(Duration::from_secs(2), |v| v["type"] == "backend_updated")
    })
    .expect("backend_updated");
    assert_eq!(e["backend"]["weight"], 3);
    assert_eq!(
        admin(&c, "DELETE", &f.admin_url("/admin/backends/1"), "")
            .await
            .status,
        204
    );
    let e = tokio::task::block_in_place(|| {
        ev.find(Duration::from_secs(2), |v| v["type"] == "backend_removed")
    })
    .expect("backend_removed");
    assert_eq!(e["id"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_does_not_slow_the_proxy() {
    let a = TestBackend::start("A");
    let c = client();
    let f = Fulcrum::over(&[&a], &[]);
    let run = |n: usize| {
        let c = c.clone();
        let url = f.url("/");
        async move {
            let t = Instant::now();
            for _ in 0..n {
                assert_eq!(get(&c, &url).await.status, 200);
            }
            t.elapsed()
        }
    };
    let baseline = run(1500).await;
    // Subscribers that never read a byte (their socket buffers fill up).
    let mut stuck = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(f.admin).unwrap();
        s.write_all(b"GET /admin/events HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            .unwrap();
        stuck.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let with_stuck = run(1500).await;
    assert!(
        with_stuck < baseline * 3 + Duration::from_secs(1),
        "baseline {baseline:?}, with stuck subscribers {with_stuck:?}"
    );
    // The admin API still answers.
    assert_eq!(get(&c, &f.admin_url("/admin/status")).await.status, 200);
    drop(stuck);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_kill_revive_delete_and_nothing_is_left_behind() {
    let c = client();
    let mut f = Fulcrum::start(&[
        "--health-interval",
        "200ms",
        "--unhealthy-threshold",
        "1",
        "--healthy-threshold",
        "1",
    ]);
    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/backends/spawn"),
        r#"{"name":"s1","latency_ms":1}"#,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let s1 = r.json();
    assert_eq!(s1["spawned"], true);
    assert_eq!(s1["name"], "s1");
    let pid1 = s1["pid"].as_u64().unwrap();
    let port = s1["port"].as_u64().unwrap();
    assert_eq!(s1["url"], format!("http://127.0.0.1:{port}"));
    assert!(pid_alive(pid1));
    let r = admin(&c, "POST", &f.admin_url("/admin/backends/spawn"), "{}").await;
    assert_eq!(r.status, 201);
    let pid2 = r.json()["pid"].as_u64().unwrap();

    // Traffic reaches both.
    let mut names = std::collections::HashSet::new();
    for _ in 0..6 {
        let r = get(&c, &f.url("/")).await;
        assert_eq!(r.status, 200);
        names.insert(r.json()["backend"].as_str().unwrap().to_string());
    }
    assert_eq!(names.len(), 2, "{names:?}");

    // Kill: the process is gone (reaped, not a zombie), health notices, traffic moves.
    let r = admin(&c, "POST", &f.admin_url("/admin/backends/0/kill"), "").await;
    assert_eq!(r.status, 200);
    assert!(r.json()["pid"].is_null());
    assert!(eventually(Duration::from_secs(3), || async { !pid_alive(pid1) }).await);
    assert!(
        eventually(Duration::from_secs(5), || async {
            status(&c, &f).await["backends"][0]["healthy"] == false
        })
        .await
    );
    for _ in 0..6 {
        let r = get(&c, &f.url("/")).await;
        assert_eq!(r.status, 200);
        assert_ne!(r.json()["backend"], "s1");
    }
    assert_eq!(
        admin(&c, "POST", &f.admin_url("/admin/backends/0/kill"), "")
            .await
            .status,
        409,
        "not running"
    );

    // Revive on the same port.
    let r = admin(&c, "POST", &f.admin_url("/admin/backends/0/revive"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["port"], port);
    let pid3 = r.json()["pid"].as_u64().unwrap();
    assert!(pid_alive(pid3));
    assert!(
        eventually(Duration::from_secs(5), || async {
            get(&c, &f.url("/")).await.json()["backend"] == "s1"
        })
        .await
    );
    assert_eq!(
        admin(&c, "POST", &f.admin_url("/admin/backends/0/revive"), "")
            .await
            .status,
        409,
        "already running"
    );

    // A configured backend is not spawned: 409.
    let plain = TestBackend::start("P");
    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/backends"),
        &format!(r#"{{"url":"{}"}}"#, plain.url()),
    )
    .await;
    let id = r.json()["id"].as_u64().unwrap();
    assert_eq!(
        admin(
            &c,
            "POST",
            &f.admin_url(&format!("/admin/backends/{id}/kill")),
            ""
        )
        .await
        .status,
        409
    );
    // A name that looks like a flag is still a name.
    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/backends/spawn"),
        r#"{"name":"-x"}"#,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["name"], "-x");
    // Bad input.
    for body in [
        r#"{"weight":0}"#,
        r#"{"latency_ms":-1}"#,
        r#"{"bogus":1}"#,
        "nope",
    ] {
        let r = admin(&c, "POST", &f.admin_url("/admin/backends/spawn"), body).await;
        assert_eq!(r.status, 400, "{body}");
    }

    // DELETE stops the process.
    assert_eq!(
        admin(&c, "DELETE", &f.admin_url("/admin/backends/0"), "")
            .await
            .status,
        204
    );
    assert!(eventually(Duration::from_secs(3), || async { !pid_alive(pid3) }).await);

    // Exit stops the rest.
    f.signal("TERM");
    assert!(f.wait_exit(Duration::from_secs(12)).is_some());
    assert!(eventually(Duration::from_secs(3), || async { !pid_alive(pid2) }).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_fulcrum_leaves_no_spawned_backend() {
    let c = client();
    let mut f = Fulcrum::start(&[]);
    let r = admin(&c, "POST", &f.admin_url("/admin/backends/spawn"), "{}").await;
    assert_eq!(r.status, 201);
    let pid = r.json()["pid"].as_u64().unwrap();
    f.signal("KILL");
    f.wait_exit(Duration::from_secs(5));
    assert!(eventually(Duration::from_secs(3), || async { !pid_alive(pid) }).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_has_one_line_per_request_in_text_and_json() {
    let a = TestBackend::start("A");
    let c = client();
    let f = Fulcrum::over(&[&a], &[]);
    get(&c, &f.url("/logged?x=1")).await;
    let line = f
        .log_line(&["path=/logged?x=1"], Duration::from_secs(2))
        .expect("an access log line");
    for part in [
        " access ",
        "client=127.0.0.1",
        "method=GET",
        "status=200",
        "backend=\"A\"",
        "upstream_ms=",
        "total_ms=",
        "retries=0",
    ] {
        assert!(line.contains(part), "{part} in {line}");
    }

    let j = Fulcrum::over(&[&a], &["--log-format", "json"]);
    get(&c, &j.url("/json-logged")).await;
    let line = j
        .log_line(&["/json-logged"], Duration::from_secs(2))
        .expect("a JSON access log line");
    let v: serde_json::Value = serde_json::from_str(&line).expect(&line);
    let fields = &v["fields"];
    assert_eq!(fields["message"], "access");
    assert_eq!(fields["status"], 200);
    assert_eq!(fields["backend"], "A");
    assert_eq!(fields["method"], "GET");

    // A client that gives up while the backend thinks is logged and counted too (499).
    let r = tokio::time::timeout(Duration::from_millis(300), get(&c, &f.url("/sleep/1500"))).await;
    assert!(r.is_err(), "the request was meant to be abandoned");
    assert!(
        f.log_line(&["path=/sleep/1500", "status=499"], Duration::from_secs(3))
            .is_some(),
        "{}",
        f.log()
    );
    let m = metrics(&c, &f).await;
    assert_eq!(
        series(
            &m,
            r#"fulcrum_requests_total{backend="A",code="4xx",pool="default"}"#
        ),
        Some(1.0),
        "{m}"
    );

    // Off by flag.
    let off = Fulcrum::over(&[&a], &["--access-log", "off"]);
    get(&c, &off.url("/not-logged")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!off.log().contains("/not-logged"));
}

fn write_config(path: &std::path::Path, strategy: &str, backends: &[(&str, u32, &str)]) {
    let mut t = format!("strategy = \"{strategy}\"\n[health]\ninterval = \"500ms\"\n");
    for (url, w, name) in backends {
        t.push_str(&format!(
            "[[backends]]\nurl = \"{url}\"\nweight = {w}\nname = \"{name}\"\n"
        ));
    }
    std::fs::write(path, t).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_load_changes_the_pool_without_failing_a_request() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let cb = TestBackend::start("C");
    let dir = std::env::temp_dir().join(format!("fulcrum-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("fulcrum.toml");
    write_config(
        &cfg,
        "round_robin",
        &[(&a.url(), 1, "A"), (&b.url(), 1, "B")],
    );
    let c = client();
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    // Live numbers of A that must survive.
    for _ in 0..10 {
        get(&c, &f.url("/")).await;
    }
    let a_requests = status(&c, &f).await["backends"][0]["requests"]
        .as_u64()
        .unwrap();

    // A steady request stream for the whole test.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let c = c.clone();
        let url = f.url("/");
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0u32, 0u32);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match get(&c, &url).await.status.as_u16() {
                    200 => ok += 1,
                    _ => failed += 1,
                }
            }
            (ok, failed)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    // SIGHUP: B goes, C comes, A is re-weighted, the strategy changes.
    write_config(&cfg, "wrr", &[(&a.url(), 3, "A"), (&cb.url(), 1, "C")]);
    f.signal("HUP");
    assert!(
        eventually(Duration::from_secs(3), || async {
            status(&c, &f).await["strategy"] == "weighted_round_robin"
        })
        .await,
        "{}",
        f.log()
    );
    let s = status(&c, &f).await;
    let names: Vec<&str> = s["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["A", "C"]);
    assert_eq!(s["backends"][0]["weight"], 3);
    assert_eq!(s["backends"][0]["id"], 0, "A kept its identity");
    assert!(s["backends"][0]["requests"].as_u64().unwrap() >= a_requests);

    // A broken file: refused, nothing changes.
    std::fs::write(&cfg, "strategy = \"bogus\"\n").unwrap();
    let r = admin(&c, "POST", &f.admin_url("/admin/reload"), "").await;
    assert_eq!(r.status, 400);
    assert!(r.json()["error"].as_str().unwrap().contains("bogus"));
    f.signal("HUP");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(f.log().contains("the running configuration stays"));
    assert_eq!(status(&c, &f).await["strategy"], "weighted_round_robin");

    // A backend added through the admin API is the API's: a reload leaves it.
    let d = TestBackend::start("D");
    let body = format!(r#"{{"url": "{}", "name": "D"}}"#, d.url());
    let r = admin(&c, "POST", &f.admin_url("/admin/backends"), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["source"], "admin");

    // POST /admin/reload applies a good file and says what changed.
    write_config(
        &cfg,
        "wrr",
        &[(&a.url(), 3, "A"), (&cb.url(), 1, "C"), (&b.url(), 2, "B")],
    );
    let r = admin(&c, "POST", &f.admin_url("/admin/reload"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["added"], serde_json::json!(["B"]));
    assert_eq!(r.json()["removed"], serde_json::json!([]));
    let s = status(&c, &f).await;
    let owned: Vec<(&str, &str)> = s["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["name"].as_str().unwrap(), b["source"].as_str().unwrap()))
        .collect();
    assert_eq!(
        owned,
        [
            ("A", "config"),
            ("C", "config"),
            ("D", "admin"),
            ("B", "config")
        ]
    );

    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = load.await.unwrap();
    assert!(ok > 50, "{ok}");
    assert_eq!(failed, 0, "no request failed across reloads");

    // Without a config file there is nothing to reload.
    let plain = Fulcrum::start(&[]);
    assert_eq!(
        admin(&c, "POST", &plain.admin_url("/admin/reload"), "")
            .await
            .status,
        409
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_traffic_generator_sends_real_requests_through_the_proxy() {
    let a = TestBackend::start("A");
    let c = client();
    let f = Fulcrum::over(&[&a], &["--access-log", "off"]);
    for body in [
        r#"{"rps":0,"seconds":1}"#,
        r#"{"rps":5001,"seconds":1}"#,
        r#"{"rps":10,"seconds":601}"#,
        r#"{"rps":10,"seconds":1,"path":"nope"}"#,
    ] {
        assert_eq!(
            admin(&c, "POST", &f.admin_url("/admin/traffic"), body)
                .await
                .status,
            400,
            "{body}"
        );
    }
    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/traffic"),
        r#"{"rps":200,"seconds":2,"path":"/gen"}"#,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["running"], true);
    assert_eq!(
        admin(
            &c,
            "POST",
            &f.admin_url("/admin/traffic"),
            r#"{"rps":1,"seconds":1}"#
        )
        .await
        .status,
        409
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            get(&c, &f.admin_url("/admin/traffic")).await.json()["running"] == false
        })
        .await
    );
    let p = get(&c, &f.admin_url("/admin/traffic")).await.json();
    let sent = p["sent"].as_u64().unwrap();
    assert!((300..=500).contains(&sent), "{p}");
    assert!(p["ok"].as_u64().unwrap() >= sent - 5, "{p}");
    assert!(p["p50_ms"].as_f64().is_some());
    // The backend saw them.
    assert!(a.requests() >= sent - 5);

    // DELETE stops a run at once.
    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/traffic"),
        r#"{"rps":50,"seconds":600}"#,
    )
    .await;
    assert_eq!(r.status, 201);
    let r = admin(&c, "DELETE", &f.admin_url("/admin/traffic"), "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["running"], false);
    let sent = r.json()["sent"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        get(&c, &f.admin_url("/admin/traffic")).await.json()["sent"],
        sent
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_safety_tokens_origins_and_documents() {
    let a = TestBackend::start("A");
    let c = client();
    // Token from the environment guards /metrics and /admin/*, not the dashboard page.
    let t = Fulcrum::start_env(
        &["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"],
        &["--backend", &a.spec()],
        &[("FULCRUM_ADMIN_TOKEN", "t0ken")],
    );
    let admin_addr = t.admin;
    let url = |p: &str| format!("http://{admin_addr}{p}");
    assert_eq!(get(&c, &url("/metrics")).await.status, 401);
    assert_eq!(get(&c, &url("/admin/events")).await.status, 401);
    let ok = send(
        &c,
        "GET",
        &url("/metrics"),
        &[("authorization", "Bearer t0ken")],
        Bytes::new(),
    )
    .await;
    assert_eq!(ok.status, 200);
    let page = get(&c, &url("/")).await;
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    drop(t);

    // A page on another origin cannot change anything, even without a token.
    let f = Fulcrum::over(&[&a], &[]);
    for (k, v) in [
        ("origin", "http://evil.example"),
        ("sec-fetch-site", "cross-site"),
    ] {
        let r = send(
            &c,
            "POST",
            &f.admin_url("/admin/strategy"),
            &[(k, v), ("content-type", "text/plain")],
            r#"{"strategy":"lc"}"#,
        )
        .await;
        assert_eq!(r.status, 403, "{k}");
        assert!(r.json()["error"].is_string());
        assert!(r.header("access-control-allow-origin").is_none());
    }
    assert_eq!(status(&c, &f).await["strategy"], "round_robin");
    // Without a token only loopback host names are believed (DNS rebinding).
    for (host, want) in [
        ("evil.test:9090", 403),
        ("10.0.0.1", 403),
        ("localhost:1", 200),
        ("127.0.0.1", 200),
        ("[::1]:9090", 200),
    ] {
        let r = send(
            &c,
            "GET",
            &f.admin_url("/admin/status"),
            &[("host", host)],
            Bytes::new(),
        )
        .await;
        assert_eq!(r.status, want, "{host}");
    }
    // Names label metrics: no quotes, no duplicates.
    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/backends"),
        r#"{"url":"http://127.0.0.1:9","name":"a\"} 1"}"#,
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/backends"),
        r#"{"url":"http://127.0.0.1:9","name":"A"}"#,
    )
    .await;
    assert_eq!(r.status, 409, "{}", r.text());
    // The same origin (the dashboard) may.
    let origin = format!("http://{}", f.admin);
    let r = send(
        &c,
        "POST",
        &f.admin_url("/admin/strategy"),
        &[
            ("origin", origin.as_str()),
            ("content-type", "application/json"),
        ],
        r#"{"strategy":"lc"}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    // A JSON array is not an object, whatever serde would make of it.
    for (m, p, body) in [
        ("PATCH", "/admin/backends/0", r#"[5, "draining"]"#),
        ("POST", "/admin/strategy", r#"["rr"]"#),
        ("GET", "/admin/backends/+0", ""),
    ] {
        assert_eq!(
            admin(&c, m, &f.admin_url(p), body).await.status,
            400,
            "{m} {p}"
        );
    }
    assert_eq!(status(&c, &f).await["backends"][0]["state"], "active");
    let m = get(&c, &f.admin_url("/metrics")).await.text();
    assert!(m.contains(r#"le="+Inf""#), "{m}");
    // No state-changing GET: every write route refuses GET.
    for p in [
        "/admin/reload",
        "/admin/backends/spawn",
        "/admin/backends/0/kill",
    ] {
        let r = get(&c, &f.admin_url(p)).await;
        assert_eq!(r.status, 405, "{p}");
        assert!(r.header("allow").is_some(), "{p}");
    }

    // The OpenAPI document is served and names every route.
    let doc = get(&c, &f.admin_url("/admin/openapi.json")).await.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for p in [
        "/admin/status",
        "/admin/strategy",
        "/admin/backends",
        "/admin/backends/{id}",
        "/admin/backends/{id}/degrade",
        "/admin/backends/{id}/recover",
        "/admin/backends/spawn",
        "/admin/backends/{id}/kill",
        "/admin/backends/{id}/revive",
        "/admin/reload",
        "/admin/explain",
        "/admin/traffic",
        "/admin/lab",
        "/admin/fleet",
        "/admin/routes/{index}/mirror",
        "/admin/certificates",
        "/admin/events",
        "/metrics",
    ] {
        assert!(doc["paths"][p].is_object(), "{p} missing from the document");
    }
}
