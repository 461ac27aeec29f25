//! Accounting, pool changes, admin errors, signals, the command line and the demo.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;

async fn all_idle(c: &HttpClient, f: &Fulcrum) -> bool {
    eventually(Duration::from_secs(3), || async {
        active_conns(c, f).await.values().all(|&n| n == 0)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_counts_return_to_zero_on_every_path() {
    let a = TestBackend::start("A");
    let c = client();
    let f = Fulcrum::over(&[&a], &["--upstream-timeout", "400ms"]);
    // 5xx answers
    for _ in 0..5 {
        assert_eq!(get(&c, &f.url("/status/500")).await.status, 500);
    }
    assert!(all_idle(&c, &f).await);
    let s = status(&c, &f).await;
    assert_eq!(s["backends"][0]["errors"], 5);
    assert_eq!(s["backends"][0]["requests"], 5);
    // timeouts
    for _ in 0..3 {
        assert_eq!(get(&c, &f.url("/sleep/2000")).await.status, 504);
    }
    assert!(all_idle(&c, &f).await);
    // client aborts: while waiting for headers, and in the middle of a body
    for path in ["/sleep/10000", "/stall"] {
        let url = f.url(path);
        let cc = c.clone();
        let t = tokio::spawn(async move {
            let r = cc.get(url.parse().unwrap()).await;
            if let Ok(r) = r {
                use http_body_util::BodyExt;
                let _ = r.into_body().collect().await;
            }
        });
        assert!(
            eventually(Duration::from_secs(5), || async {
                active_conns(&c, &f).await["A"] == 1
            })
            .await,
            "{path} never reached the backend"
        );
        t.abort();
        assert!(
            all_idle(&c, &f).await,
            "{path}: {:?}",
            active_conns(&c, &f).await
        );
    }
    // a body that is read whole brings the count down before the client returns
    for _ in 0..20 {
        get(&c, &f.url("/big/100000")).await;
        let n = active_conns(&c, &f).await["A"];
        assert_eq!(n, 0, "count still {n} after the whole body arrived");
    }
    let s = status(&c, &f).await;
    let lat = s["backends"][0]["avg_latency_ms"].as_f64().unwrap();
    assert!(lat > 0.0, "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_or_deleted_backends_finish_in_flight_requests_and_get_no_new_ones() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let c = client();
    // Least connections: with both idle the slow request lands on A (lowest index).
    let f = Fulcrum::over(&[&a, &b], &["--strategy", "lc"]);
    for (op, body) in [("PATCH", r#"{"state": "draining"}"#), ("DELETE", "")] {
        let slow = {
            let c = c.clone();
            let url = f.url("/sleep/4000");
            tokio::spawn(async move { get(&c, &url).await })
        };
        assert!(
            eventually(Duration::from_secs(3), || async {
                active_conns(&c, &f).await.get("A") == Some(&1)
            })
            .await
        );
        let r = admin(&c, op, &f.admin_url("/admin/backends/0"), body).await;
        assert!(r.status == 200 || r.status == 204, "{op}: {}", r.status);
        if op == "PATCH" {
            assert_eq!(r.json()["state"], "draining");
            assert_eq!(r.json()["active_conns"], 1);
        }
        let before = a.requests();
        for _ in 0..6 {
            assert_eq!(get(&c, &f.url("/")).await.backend(), "B");
        }
        assert_eq!(a.requests(), before, "{op}: A got new requests");
        let r = slow.await.unwrap();
        assert_eq!((r.status.as_u16(), r.backend().as_str()), (200, "A"));
        if op == "PATCH" {
            assert!(all_idle(&c, &f).await);
            let r = admin(
                &c,
                "PATCH",
                &f.admin_url("/admin/backends/0"),
                r#"{"state": "active"}"#,
            )
            .await;
            assert_eq!(r.status, 200);
            // Active again: idle A (lowest index) takes the next request.
            assert_eq!(get(&c, &f.url("/")).await.backend(), "A");
        }
    }
    let s = status(&c, &f).await;
    assert_eq!(s["backends"].as_array().unwrap().len(), 1);
    assert_eq!(get(&c, &f.admin_url("/admin/backends/0")).await.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_takes_a_backend_out_of_rotation() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let c = client();
    let f = Fulcrum::over(&[&a, &b], &[]);
    let r = admin(
        &c,
        "PATCH",
        &f.admin_url("/admin/backends/1"),
        r#"{"state": "maintenance"}"#,
    )
    .await;
    assert_eq!(r.json()["state"], "maintenance");
    for _ in 0..4 {
        assert_eq!(get(&c, &f.url("/")).await.backend(), "A");
    }
    admin(
        &c,
        "PATCH",
        &f.admin_url("/admin/backends/0"),
        r#"{"state": "maintenance"}"#,
    )
    .await;
    let r = get(&c, &f.url("/")).await;
    assert_eq!(
        (r.status.as_u16(), r.text().trim()),
        (503, "no healthy backend")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_answers_with_its_documented_statuses_and_json_errors() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let c = client();
    let f = Fulcrum::start(&["--backend", &format!("{},weight=5", a.spec())]);
    let base = |p: &str| f.admin_url(p);
    let st = status(&c, &f).await;
    let b0 = &st["backends"][0];
    let expected = serde_json::json!({
        "id": 0, "name": "A", "url": a.url(), "weight": 5, "effective_weight": 5.0, "state": "active",
        "healthy": true, "ejected": false, "active_conns": 0, "avg_latency_ms": null,
        "requests": 0, "errors": 0, "spawned": false, "source": "config", "pool": "default", "backup": false,
        "max_conns": 0, "max_conns_mode": "fixed", "queued": 0, "reported_utilization": null
    });
    assert_eq!(b0, &expected);
    // add
    let r = admin(
        &c,
        "POST",
        &base("/admin/backends"),
        &format!(r#"{{"url": "{}", "weight": 2, "name": "B"}}"#, b.url()),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["id"], 1);
    assert_eq!(r.header("content-type"), Some("application/json"));
    // conflicts and bad input leave the pool unchanged
    let cases: &[(&str, &str, &str, u16)] = &[
        (
            "POST",
            "/admin/backends",
            &format!(r#"{{"url": "{}"}}"#, b.url()),
            409,
        ),
        ("POST", "/admin/backends", r#"{"url": "not a url"}"#, 400),
        (
            "POST",
            "/admin/backends",
            r#"{"url": "http://127.0.0.1:1", "weight": 0}"#,
            400,
        ),
        (
            "POST",
            "/admin/backends",
            r#"{"url": "http://127.0.0.1:1", "weight": 1001}"#,
            400,
        ),
        ("POST", "/admin/backends", r#"{"weight": 3}"#, 400),
        ("POST", "/admin/backends", "{not json", 400),
        ("PATCH", "/admin/backends/0", r#"{"weight": "heavy"}"#, 400),
        ("PATCH", "/admin/backends/0", r#"{"state": "asleep"}"#, 400),
        ("PATCH", "/admin/backends/0", r#"{"colour": "red"}"#, 400),
        ("PATCH", "/admin/backends/abc", r#"{"weight": 2}"#, 400),
        ("PATCH", "/admin/backends/99", r#"{"weight": 2}"#, 404),
        ("GET", "/admin/backends/99", "", 404),
        ("GET", "/admin/backends/-1", "", 400),
        ("DELETE", "/admin/backends/99", "", 404),
        ("GET", "/admin/nothing-here", "", 404),
        ("POST", "/admin/strategy", r#"{"strategy": 5}"#, 400),
        ("POST", "/admin/strategy", "", 400),
    ];
    for (m, p, body, code) in cases {
        let r = admin(&c, m, &base(p), body).await;
        assert_eq!(r.status.as_u16(), *code, "{m} {p} {body}: {}", r.text());
        assert!(r.json()["error"].is_string(), "{m} {p}: {}", r.text());
    }
    // 405 with Allow
    let r = admin(&c, "PUT", &base("/admin/status"), "").await;
    assert_eq!(r.status, 405);
    assert!(r.header("allow").unwrap().contains("GET"));
    assert!(r.json()["error"].is_string());
    let r = admin(&c, "DELETE", &base("/admin/strategy"), "").await;
    assert_eq!(r.status, 405);
    let allow = r.header("allow").unwrap().to_string();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
    // unchanged
    let after = status(&c, &f).await;
    assert_eq!(after["backends"].as_array().unwrap().len(), 2);
    assert_eq!(after["backends"][0]["weight"], 5);
    assert_eq!(after["backends"][0]["state"], "active");
    assert_eq!(after["strategy"], "round_robin");
    // list, get, delete
    let list = get(&c, &base("/admin/backends")).await.json();
    assert_eq!(list.as_array().unwrap().len(), 2);
    let one = get(&c, &base("/admin/backends/1")).await.json();
    assert_eq!(
        (one["name"].as_str(), one["weight"].as_u64()),
        (Some("B"), Some(2))
    );
    let r = admin(&c, "DELETE", &base("/admin/backends/1"), "").await;
    assert_eq!(r.status, 204);
    // a re-added backend gets a new id
    let r = admin(
        &c,
        "POST",
        &base("/admin/backends"),
        &format!(r#"{{"url": "{}"}}"#, b.url()),
    )
    .await;
    assert_eq!(r.json()["id"], 2);
    assert_eq!(
        r.json()["name"],
        b.addr.to_string(),
        "name defaults to host:port"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_accepting_and_drains_requests_in_flight() {
    let a = TestBackend::start("A");
    let c = client();
    let mut f = Fulcrum::over(&[&a], &[]);
    let slow = {
        let c = c.clone();
        let url = f.url("/sleep/1500");
        tokio::spawn(async move { get(&c, &url).await })
    };
    assert!(
        eventually(Duration::from_secs(2), || async {
            a.stats.in_flight.load(std::sync::atomic::Ordering::SeqCst) == 1
        })
        .await
    );
    let t = Instant::now();
    f.signal("TERM");
    // New connections are refused soon after the signal.
    let proxy = f.proxy;
    let refused = eventually(Duration::from_secs(1), || async move {
        std::net::TcpStream::connect(proxy).is_err()
    })
    .await;
    assert!(refused, "still accepting after SIGTERM");
    let r = slow.await.unwrap();
    assert_eq!(r.status, 200, "the request in flight finished");
    let st = tokio::task::spawn_blocking(move || {
        let st = f.wait_exit(Duration::from_secs(12));
        (st, f.log())
    })
    .await
    .unwrap();
    assert_eq!(st.0.and_then(|s| s.code()), Some(0), "{}", st.1);
    assert!(t.elapsed() < Duration::from_secs(11));
}

#[test]
fn sigint_exits_zero_when_idle() {
    let mut f = Fulcrum::start(&[]);
    f.signal("INT");
    let st = f.wait_exit(Duration::from_secs(5));
    assert_eq!(st.and_then(|s| s.code()), Some(0));
}

#[test]
fn bad_flags_exit_2_with_one_line_naming_the_option() {
    let cases: &[(&[&str], &str)] = &[
        (&["serve", "--strategy", "fastest"], "--strategy"),
        (
            &["serve", "--backend", "http://127.0.0.1:1,weight=0"],
            "--backend",
        ),
        (&["serve", "--backend", "127.0.0.1:1"], "--backend"),
        (
            &["serve", "--backend", "http://127.0.0.1:1,weight=x"],
            "--backend",
        ),
        (&["serve", "--health-interval", "5"], "--health-interval"),
        (
            &["serve", "--connect-timeout", "3 parsecs"],
            "--connect-timeout",
        ),
        (&["serve", "--listen", "nowhere"], "--listen"),
        (&["serve", "--ewma-alpha", "0"], "--ewma-alpha"),
        (&["serve", "--ewma-alpha", "1.5"], "--ewma-alpha"),
        (&["serve", "--retries", "-1"], "--retries"),
        (&["serve", "--workers", "0"], "--workers"),
        (&["serve", "--log-format", "xml"], "--log-format"),
        (&["serve", "--hash-key", "body"], "--hash-key"),
        (
            &["serve", "--trusted-proxies", "10.0.0.0/99"],
            "--trusted-proxies",
        ),
        (
            &["serve", "--healthy-threshold", "0"],
            "--healthy-threshold",
        ),
        (&["serve", "--admin", "0.0.0.0:0"], "--admin"),
        (
            &["serve", "--config", "/nonexistent/fulcrum.toml"],
            "--config",
        ),
        (&["serve", "--bogus"], "--bogus"),
        (&["serve", "--listen"], "--listen"),
    ];
    for (args, option) in cases {
        let t = Instant::now();
        let (st, _out, err) = run_fulcrum(args);
        assert_eq!(st.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(option), "{args:?}: {err}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    let (_, _, err) = run_fulcrum(&["serve", "--strategy", "fastest"]);
    assert!(
        err.contains("fastest") && err.contains("round_robin") && err.contains("least_connections"),
        "{err}"
    );
}

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("fulcrum-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("fulcrum.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_file_is_read_and_flags_override_it() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let text = format!(
        "strategy = \"weighted_round_robin\"\nretries = 1\n\n[health]\npath = \"/health\"\ninterval = \"5s\"\n\n[[backends]]\nurl = \"{}\"\nweight = 3\nname = \"A\"\n\n[[backends]]\nurl = \"{}\"\nname = \"B\"\n",
        a.url(),
        b.url()
    );
    let p = temp_file("ok", &text);
    let (st, out, err) = run_fulcrum(&["check", "--config", p.to_str().unwrap()]);
    assert_eq!(st.code(), Some(0), "{out}{err}");
    let c = client();
    let f = Fulcrum::start(&["--config", p.to_str().unwrap()]);
    let s = status(&c, &f).await;
    assert_eq!(s["strategy"], "weighted_round_robin");
    assert_eq!(s["backends"][0]["weight"], 3);
    let mut seq = String::new();
    for _ in 0..4 {
        seq.push_str(&get(&c, &f.url("/")).await.backend());
    }
    assert_eq!(seq, "AABA");
    drop(f);
    let f = Fulcrum::start(&["--config", p.to_str().unwrap(), "--strategy", "rr"]);
    assert_eq!(status(&c, &f).await["strategy"], "round_robin");
}

#[test]
fn check_reports_bad_config_files_with_line_numbers() {
    let p = temp_file(
        "unknown",
        "listen = \"127.0.0.1:8080\"\n\ncolour = \"red\"\n",
    );
    let (st, _, err) = run_fulcrum(&["check", "--config", p.to_str().unwrap()]);
    assert_eq!(st.code(), Some(2));
    assert!(err.contains("line 3") && err.contains("colour"), "{err}");
    let p = temp_file(
        "values",
        "strategy = \"fastest\"\n[[backends]]\nurl = \"http://127.0.0.1:1\"\nweight = 0\n[[backends]]\nurl = \"gopher://x\"\n",
    );
    let (st, _, err) = run_fulcrum(&["check", "--config", p.to_str().unwrap()]);
    assert_eq!(st.code(), Some(2));
    assert!(err.contains("line 1") && err.contains("fastest"), "{err}");
    assert!(err.contains("line 4") && err.contains("weight"), "{err}");
    assert!(err.contains("line 6") && err.contains("gopher"), "{err}");
    // serve refuses the same file with one line, before listening
    let (st, _, err) = run_fulcrum(&["serve", "--config", p.to_str().unwrap()]);
    assert_eq!(st.code(), Some(2));
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_backend_answers_as_documented() {
    let port = common::free_port();
    let child = std::process::Command::new(BIN)
        .args([
            "backend",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--name",
            "demo-a",
            "--latency-ms",
            "1000",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed even when an assertion fails, so no process outlives the test.
    let _child = KillOnDrop(child);
    let c = client();
    let base = format!("http://127.0.0.1:{port}");
    let h = base.clone();
    assert!(
        eventually(Duration::from_secs(5), || {
            let c = c.clone();
            let h = h.clone();
            async move { c.get(format!("{h}/health").parse().unwrap()).await.is_ok() }
        })
        .await
    );
    let t = Instant::now();
    let r = get(&c, &format!("{base}/health")).await;
    assert_eq!(r.status, 200);
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "/health waited for the latency"
    );
    let t = Instant::now();
    let r = send(&c, "POST", &format!("{base}/a/b"), &[], Bytes::new()).await;
    assert!(t.elapsed() >= Duration::from_millis(1000));
    let j = r.json();
    assert_eq!(j["backend"], "demo-a");
    assert_eq!(j["method"], "POST");
    assert_eq!(j["path"], "/a/b");
    assert_eq!(j["latency_ms"], 1000);
    let r = get(&c, &format!("{base}/x?status=503&sleep_ms=1")).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["latency_ms"], 1);
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s.split_whitespace().nth(2).is_none_or(|st| st != "Z"),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_balances_over_spawned_backends_and_leaves_no_child_behind() {
    let mut f = Fulcrum::start_cmd(
        &["demo", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"],
        &[],
    );
    let c = client();
    // The demo spawns its backends once the listeners are up, then adds them.
    let pid = f.child.id();
    assert!(
        eventually(Duration::from_secs(10), || async {
            // Three in the first pool (web), two in api.
            children_of(pid).len() == 5
                && status(&client(), &f).await["backends"]
                    .as_array()
                    .is_some_and(|b| b.len() == 3)
        })
        .await,
        "demo children: {:?}",
        children_of(pid)
    );
    let kids = children_of(pid);
    // The traffic generator runs from the start.
    assert!(
        eventually(Duration::from_secs(5), || async {
            get(&c, &f.admin_url("/admin/traffic")).await.json()["sent"]
                .as_u64()
                .unwrap_or(0)
                > 0
        })
        .await
    );
    // The generator's requests share the rotation; every backend still answers soon.
    let mut names = std::collections::BTreeSet::new();
    for _ in 0..60 {
        let r = get(&c, &f.url("/hello")).await;
        assert_eq!(r.status, 200);
        names.insert(r.json()["backend"].as_str().unwrap().to_string());
        if names.len() == 3 {
            break;
        }
    }
    assert_eq!(names.len(), 3, "{names:?}");
    let s = status(&c, &f).await;
    assert_eq!(s["backends"].as_array().unwrap().len(), 3);
    // `/api/…` goes to the second pool.
    let r = get(&c, &f.url("/api/items")).await;
    assert_eq!(r.status, 200);
    let name = r.json()["backend"].as_str().unwrap().to_string();
    assert!(name.starts_with("api-"), "{name}");
    let pools = s["pools"].as_array().unwrap();
    let names: Vec<&str> = pools.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["web", "api"]);
    assert_eq!(pools[1]["strategy"], "round_robin");
    f.signal("INT");
    let st = tokio::task::spawn_blocking(move || {
        let st = f.wait_exit(Duration::from_secs(12));
        (st, f)
    })
    .await
    .unwrap();
    assert_eq!(st.0.and_then(|s| s.code()), Some(0), "{}", st.1.log());
    let gone = eventually(Duration::from_secs(3), || {
        let kids = kids.clone();
        async move { kids.iter().all(|&k| !alive(k)) }
    })
    .await;
    assert!(gone, "children left behind: {kids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shedding_answers_503_with_retry_after_above_max_inflight() {
    let a = TestBackend::start("A");
    let c = client();
    let f = Fulcrum::over(&[&a], &["--max-inflight", "2"]);
    let mut slow = Vec::new();
    for _ in 0..2 {
        let c = c.clone();
        let url = f.url("/sleep/3000");
        slow.push(tokio::spawn(async move { get(&c, &url).await }));
    }
    assert!(
        eventually(Duration::from_secs(3), || async {
            active_conns(&c, &f).await["A"] == 2
        })
        .await
    );
    let t = Instant::now();
    let r = get(&c, &f.url("/")).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(t.elapsed() < Duration::from_secs(1), "shedding waited");
    for s in slow {
        assert_eq!(s.await.unwrap().status, 200);
    }
    assert_eq!(get(&c, &f.url("/")).await.status, 200, "capacity is back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_and_no_content_answers_release_the_count() {
    let a = TestBackend::start("A");
    let c = client();
    let f = Fulcrum::over(&[&a], &[]);
    for _ in 0..5 {
        assert_eq!(
            send(&c, "HEAD", &f.url("/big/1000"), &[], Bytes::new())
                .await
                .status,
            200
        );
        assert_eq!(get(&c, &f.url("/status/204")).await.status, 204);
        assert_eq!(get(&c, &f.url("/status/304")).await.status, 304);
    }
    assert!(all_idle(&c, &f).await, "{:?}", active_conns(&c, &f).await);
    assert_eq!(status(&c, &f).await["backends"][0]["requests"], 15);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_port_is_refused() {
    let first = Fulcrum::start(&[]);
    let (st, _, err) = run_fulcrum(&[
        "serve",
        "--listen",
        &first.proxy.to_string(),
        "--admin",
        "127.0.0.1:0",
    ]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("address already in use"), "{err}");
    // the first one is unaffected
    assert_eq!(get(&client(), &first.url("/")).await.status, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_every_admin_route() {
    let a = TestBackend::start("A");
    let dir = std::env::temp_dir().join(format!("fulcrum-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let c = client();
    let f = Fulcrum::start(&[
        "--backend",
        &a.spec(),
        "--admin-token-file",
        token.to_str().unwrap(),
    ]);
    for (m, p, body) in [
        ("GET", "/admin/status", ""),
        ("POST", "/admin/strategy", r#"{"strategy": "lc"}"#),
        ("DELETE", "/admin/backends/0", ""),
    ] {
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("Basic s3cret"),
            Some("Bearer s3cre"),
        ] {
            let mut h = vec![("content-type", "application/json")];
            if let Some(a) = auth {
                h.push(("authorization", a));
            }
            let r = send(&c, m, &f.admin_url(p), &h, body.to_string()).await;
            assert_eq!(r.status, 401, "{m} {p} {auth:?}");
            assert!(r.json()["error"].is_string());
        }
    }
    let status_url = f.admin_url("/admin/status");
    let ok = |v: &'static str| {
        let c = c.clone();
        let url = status_url.clone();
        async move { send(&c, "GET", &url, &[("authorization", v)], Bytes::new()).await }
    };
    let r = ok("Bearer s3cret").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["strategy"], "round_robin", "nothing changed");
    assert_eq!(r.json()["backends"].as_array().unwrap().len(), 1);
    assert_eq!(ok("bearer s3cret").await.status, 200);
    // the proxy itself needs no token
    assert_eq!(get(&c, &f.url("/")).await.status, 200);
}
