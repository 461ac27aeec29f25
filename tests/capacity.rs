//! Capacity controls (`docs/operations.md`, "Backups and panic mode", "Passive outlier
//! detection"): backups take traffic only while no primary is eligible, panic mode
//! spreads over every backend below the threshold, and the passive checks follow each
//! pool's own thresholds — over real sockets and processes.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;

/// Which backends `n` requests to `/` reach, by name.
async fn spread(c: &HttpClient, f: &Fulcrum, n: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        let r = get(c, &f.url("/")).await;
        assert_eq!(r.status, 200, "{}", r.text());
        *seen.entry(r.backend()).or_default() += 1;
    }
    seen
}

fn names(m: &BTreeMap<String, usize>) -> Vec<&str> {
    m.keys().map(String::as_str).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_take_traffic_only_while_every_primary_is_down() {
    let (p1, p2, b) = (
        TestBackend::start("P1"),
        TestBackend::start("P2"),
        TestBackend::start("B"),
    );
    let f = Fulcrum::start(&[
        "--backend",
        &p1.spec(),
        "--backend",
        &p2.spec(),
        "--backend",
        &format!("{},backup", b.spec()),
        "--health-interval",
        "200ms",
    ]);
    let c = client();
    let st = status(&c, &f).await;
    assert_eq!(st["backends"][2]["backup"], true);
    assert_eq!(st["pools"][0]["picking"], "primaries");
    assert_eq!(names(&spread(&c, &f, 10).await), ["P1", "P2"]);
    let mut events = EventStream::open(&f);
    // Both primaries fail their health checks: the backup takes everything.
    p1.set_health(500);
    p2.set_health(500);
    let over = eventually(Duration::from_secs(5), || async {
        status(&client(), &f).await["pools"][0]["picking"] == "backups"
    })
    .await;
    assert!(over, "{}", status(&c, &f).await);
    assert_eq!(names(&spread(&c, &f, 10).await), ["B"]);
    // One primary returns: it takes the traffic back, alone.
    p1.set_health(200);
    let back = eventually(Duration::from_secs(5), || async {
        status(&client(), &f).await["pools"][0]["picking"] == "primaries"
    })
    .await;
    assert!(back);
    assert_eq!(names(&spread(&c, &f, 10).await), ["P1"]);
    let got = tokio::task::spawn_blocking(move || {
        let on = events.find(Duration::from_secs(3), |e| e["type"] == "backups");
        let off = events.find(Duration::from_secs(3), |e| e["type"] == "backups");
        (on, off)
    })
    .await
    .unwrap();
    let (on, off) = (got.0.expect("backups on"), got.1.expect("backups off"));
    assert_eq!(
        (on["active"].as_bool(), on["pool"].as_str()),
        (Some(true), Some("default"))
    );
    assert_eq!(off["active"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_mode_spreads_over_every_backend_below_the_threshold() {
    let bs: Vec<TestBackend> = (0..4)
        .map(|i| TestBackend::start(&format!("B{i}")))
        .collect();
    let mut args: Vec<String> = Vec::new();
    for b in &bs {
        args.extend(["--backend".into(), b.spec()]);
    }
    args.extend(["--health-interval".into(), "200ms".into()]);
    args.extend(["--panic-threshold".into(), "50".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let f = Fulcrum::start(&args);
    let c = client();
    // Two of four failing their checks: 50 % eligible is not below 50 %.
    bs[0].set_health(500);
    bs[1].set_health(500);
    let two_down = eventually(Duration::from_secs(5), || async {
        let st = status(&client(), &f).await;
        st["backends"][1]["healthy"] == false && st["backends"][0]["healthy"] == false
    })
    .await;
    assert!(two_down);
    assert_eq!(names(&spread(&c, &f, 8).await), ["B2", "B3"]);
    // A third: too few; the pool balances over all four (they still answer).
    bs[2].set_health(500);
    let panic = eventually(Duration::from_secs(5), || async {
        status(&client(), &f).await["pools"][0]["picking"] == "panic"
    })
    .await;
    assert!(panic);
    assert_eq!(names(&spread(&c, &f, 12).await), ["B0", "B1", "B2", "B3"]);
    let m = get(&c, &f.admin_url("/metrics")).await.text();
    let panicked: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix(r#"fulcrum_panic_total{pool="default"} "#))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(panicked >= 12.0, "{m}");
    for b in &bs {
        b.set_health(200);
    }
    let calm = eventually(Duration::from_secs(5), || async {
        status(&client(), &f).await["pools"][0]["picking"] == "primaries"
    })
    .await;
    assert!(calm);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pool_ejects_by_its_own_thresholds() {
    let (a, b, x, y) = (
        TestBackend::start("A"),
        TestBackend::start("B"),
        TestBackend::start("X"),
        TestBackend::start("Y"),
    );
    let entry = |t: &TestBackend| {
        format!(
            "[[pools.backends]]\nurl = \"{}\"\nname = \"{}\"\n",
            t.url(),
            t.name
        )
    };
    let cfg = config_file("capacity", 
        "outlier",
        &format!(
            "retries = 0\n\
             [[pools]]\nname = \"quick\"\noutlier = {{ consecutive_failures = 2, base_ejection = \"10s\" }}\n{}{}\
             [[pools]]\nname = \"off\"\noutlier = {{ consecutive_failures = 0 }}\n{}{}\
             [[routes]]\npool = \"quick\"\npath_prefix = \"/q\"\n[[routes]]\npool = \"off\"\n",
            entry(&a),
            entry(&b),
            entry(&x),
            entry(&y)
        ),
    );
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap(), "--health-interval", "1m"]);
    let c = client();
    a.set_failing(true);
    x.set_failing(true);
    for _ in 0..8 {
        get(&c, &f.url("/q/1")).await;
        get(&c, &f.url("/o/1")).await;
    }
    let pools = get(&c, &f.admin_url("/admin/pools")).await.json();
    let quick = &pools[0]["backends"];
    assert_eq!(
        (quick[0]["name"].as_str(), quick[0]["ejected"].as_bool()),
        (Some("A"), Some(true))
    );
    let off = &pools[1]["backends"];
    assert_eq!(
        (off[0]["name"].as_str(), off[0]["ejected"].as_bool()),
        (Some("X"), Some(false))
    );
    assert!(off[0]["errors"].as_u64().unwrap() >= 2, "{off}");
    // An ejection of 10 s (not the default 30 s) is announced.
    let m = get(&c, &f.admin_url("/metrics")).await.text();
    assert!(
        m.contains(r#"fulcrum_ejections_total{backend="A",pool="quick"} 1"#),
        "{m}"
    );
}

/// Two backends with `max_conns = 2` each, and a pool queue of `max_queue` waiting
/// `queue_timeout`.
fn limited(a: &TestBackend, b: &TestBackend, queue: &[&str]) -> Fulcrum {
    let mut args = vec![
        "--backend".to_string(),
        format!("{},max_conns=2", a.spec()),
        "--backend".to_string(),
        format!("{},max_conns=2", b.spec()),
    ];
    args.extend(queue.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Fulcrum::start(&args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_limit_queue_and_are_served_in_arrival_order() {
    let (a, b) = (TestBackend::start("A"), TestBackend::start("B"));
    let f = limited(&a, &b, &[]);
    let c = client();
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..10 {
        let (c, url) = (c.clone(), f.url(&format!("/sleep/400?n={i}")));
        tasks.push(tokio::spawn(async move {
            let r = get(&c, &url).await;
            (r.status.as_u16(), started.elapsed())
        }));
        // A known arrival order.
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let st = status(&c, &f).await;
    let in_flight: u64 = st["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["active_conns"].as_u64().unwrap())
        .sum();
    assert_eq!(in_flight, 4, "{st}");
    assert_eq!(st["pools"][0]["queue_length"], 6, "{st}");
    assert_eq!(st["backends"][0]["max_conns"], 2);
    let m = get(&c, &f.admin_url("/metrics")).await.text();
    assert!(
        m.contains("fulcrum_pool_queue_length{pool=\"default\"} 6"),
        "{m}"
    );
    let mut done = Vec::new();
    for t in tasks {
        done.push(t.await.unwrap());
    }
    assert!(
        done.iter().all(|(s, _)| *s == 200),
        "none refused: {done:?}"
    );
    // Four at a time, in the order they came: each wave ends before the next one's.
    let wave = |k: usize| k / 4;
    for (i, (_, ti)) in done.iter().enumerate() {
        for (j, (_, tj)) in done.iter().enumerate() {
            if wave(i) < wave(j) {
                assert!(
                    ti < tj,
                    "request {i} ({ti:?}) finished after {j} ({tj:?}): {done:?}"
                );
            }
        }
    }
    assert_eq!(status(&c, &f).await["pools"][0]["queue_length"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_runs_out_and_a_full_queue_refuses_at_once() {
    let (a, b) = (TestBackend::start("A"), TestBackend::start("B"));
    let f = limited(&a, &b, &["--queue-timeout", "300ms", "--max-queue", "2"]);
    let c = client();
    let mut busy = Vec::new();
    for _ in 0..4 {
        let (c, url) = (c.clone(), f.url("/sleep/1500"));
        busy.push(tokio::spawn(
            async move { get(&c, &url).await.status.as_u16() },
        ));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let (c, url) = (c.clone(), f.url("/x"));
        waiting.push(tokio::spawn(async move {
            let t = std::time::Instant::now();
            let r = get(&c, &url).await;
            (
                r.status.as_u16(),
                r.header("retry-after").map(str::to_string),
                r.text(),
                t.elapsed(),
            )
        }));
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A third waiter finds the queue full: 503 at once.
    let t = std::time::Instant::now();
    let r = get(&c, &f.url("/x")).await;
    assert_eq!(
        (r.status.as_u16(), r.text().as_str()),
        (503, "queue full, retry later\n")
    );
    assert!(
        t.elapsed() < Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    for w in waiting {
        let (status, retry, text, took) = w.await.unwrap();
        assert_eq!(
            (status, retry.as_deref(), text.as_str()),
            (503, Some("1"), "queue timeout\n")
        );
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_millis(1200),
            "{took:?}"
        );
    }
    let m = get(&c, &f.admin_url("/metrics")).await.text();
    assert!(
        m.contains("fulcrum_queue_timeouts_total{pool=\"default\"} 2"),
        "{m}"
    );
    for t in busy {
        assert_eq!(t.await.unwrap(), 200);
    }
    // Lifting the limit lets a waiter go at once.
    let r = admin(
        &c,
        "PATCH",
        &f.admin_url("/admin/backends/0"),
        r#"{"max_conns":-1}"#,
    )
    .await;
    assert_eq!(r.status, 400, "state unchanged on a bad value");
    assert_eq!(status(&c, &f).await["backends"][0]["max_conns"], 2);
}

/// The value the answer's `Set-Cookie: SRV=…` gives, and the whole header.
fn cookie_of(r: &Got) -> Option<(String, String)> {
    let line = r.header("set-cookie")?.to_string();
    let value = line.strip_prefix("SRV=")?.split(';').next()?.to_string();
    Some((value, line))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sticky_client_stays_on_its_backend_through_switches_and_a_drain() {
    let bs: Vec<TestBackend> = (0..3)
        .map(|i| TestBackend::start(&format!("S{i}")))
        .collect();
    let mut args: Vec<String> = Vec::new();
    for b in &bs {
        args.extend(["--backend".into(), b.spec()]);
    }
    args.extend(["--health-interval".into(), "200ms".into()]);
    args.extend([
        "--sticky-cookie".into(),
        "SRV".into(),
        "--sticky-max-age".into(),
        "1h".into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let f = Fulcrum::start(&args);
    let c = client();
    // Without the cookie: balanced, and given one.
    let first = get(&c, &f.url("/")).await;
    let (value, line) = cookie_of(&first).expect("a sticky cookie");
    assert_eq!(
        line,
        format!("SRV={value}; Path=/; HttpOnly; SameSite=Lax; Max-Age=3600")
    );
    assert_eq!(value.len(), 16, "{value}");
    assert!(
        !line.contains("127.0.0.1"),
        "the cookie does not reveal the address"
    );
    let home = first.backend();
    let cookie = format!("other=1; SRV={value}");
    let url = f.url("/");
    let headers = [("cookie", cookie.as_str())];
    let with_cookie = || send(&c, "GET", &url, &headers, bytes::Bytes::new());
    for i in 0..100 {
        if i == 40 {
            assert_eq!(set_strategy(&c, &f, "lc").await.status, 200);
        }
        let r = with_cookie().await;
        assert_eq!(r.backend(), home, "request {i}");
        assert!(
            r.header("set-cookie").is_none(),
            "a valid cookie is not set again"
        );
    }
    // The cookie never reached the backend; the client's other cookies did.
    let served = bs.iter().find(|b| b.name == home).unwrap();
    let seen = served.stats.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(
        seen.get("cookie").map(|v| v.to_str().unwrap()),
        Some("other=1")
    );
    // Draining: no new sessions, the sticky one stays.
    let id = status(&c, &f).await["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == home.as_str())
        .unwrap()["id"]
        .clone();
    let r = admin(
        &c,
        "PATCH",
        &f.admin_url(&format!("/admin/backends/{id}")),
        r#"{"state":"draining"}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    for _ in 0..10 {
        assert_eq!(with_cookie().await.backend(), home);
        assert_ne!(
            get(&c, &f.url("/")).await.backend(),
            home,
            "a new session avoids it"
        );
    }
    // Down: the strategy picks another, and the cookie is replaced.
    served.set_health(500);
    let down = eventually(Duration::from_secs(5), || async {
        with_cookie().await.backend() != home
    })
    .await;
    assert!(down);
    let r = with_cookie().await;
    let (new_value, _) = cookie_of(&r).expect("a new cookie");
    assert_ne!(new_value, value);
}

#[test]
fn capacity_settings_out_of_range_are_refused_naming_the_key() {
    for (args, key) in [
        (vec!["--panic-threshold", "101"], "--panic-threshold"),
        (
            vec!["--outlier-consecutive-failures", "-1"],
            "--outlier-consecutive-failures",
        ),
        (
            vec!["--outlier-max-ejected-percent", "120"],
            "--outlier-max-ejected-percent",
        ),
        (
            vec!["--outlier-base-ejection", "0s"],
            "--outlier-base-ejection",
        ),
        (
            vec!["--backend", "http://127.0.0.1:1,backup=yes"],
            "--backend",
        ),
        (vec!["--sticky-cookie", "a b"], "--sticky-cookie"),
        (vec!["--max-queue", "-1"], "--max-queue"),
        (vec!["--queue-timeout", "0s"], "--queue-timeout"),
        (
            vec!["--backend", "http://127.0.0.1:1,max_conns=x"],
            "--backend",
        ),
        (vec!["--sticky-max-age", "1"], "--sticky-max-age"),
    ] {
        let mut all = vec!["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"];
        all.extend(args);
        let (st, _, err) = run_fulcrum(&all);
        assert_eq!(st.code(), Some(2), "{err}");
        assert!(err.contains(key), "{key}: {err}");
    }
    for (text, line, key) in [
        ("panic_threshold = 200\n", "line 1", "panic_threshold"),
        (
            "[outlier]\nmax_ejection = \"5\"\n",
            "line 2",
            "outlier.max_ejection",
        ),
        ("[outlier]\nbase_ejection = \"10m\"\n", "", "base_ejection"),
        (
            "[[backends]]\nurl = \"http://127.0.0.1:1\"\nbackup = 1\n",
            "line 3",
            "backends.backup",
        ),
        ("[sticky]\ncookie = \"a;b\"\n", "line 2", "sticky.cookie"),
        (
            "[sticky]\ncookie = \"S\"\n[[pools]]\nname = \"a\"\n[[pools]]\nname = \"b\"\n[[routes]]\npool = \"a\"\npath_prefix = \"/a\"\n[[routes]]\npool = \"b\"\n",
            "",
            "the cookie 'S' is pool 'a''s too",
        ),
        (
            "[[backends]]\nurl = \"http://127.0.0.1:1\"\nmax_conns = 2000000\n",
            "line 3",
            "backends.max_conns",
        ),
    ] {
        let cfg = config_file("capacity", &format!("bad-{}", key.replace('.', "-")), text);
        let (st, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
        assert_eq!(st.code(), Some(2), "{text}: {err}");
        assert!(err.contains(line) && err.contains(key), "{text}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_pool_with_a_bad_capacity_value_is_refused_and_nothing_changes() {
    let f = Fulcrum::start(&[]);
    let c = client();
    for bad in [
        r#"{"name":"p","panic_threshold":101}"#,
        r#"{"name":"p","outlier":{"consecutive_failures":-1}}"#,
        r#"{"name":"p","outlier":{"bogus":1}}"#,
        r#"{"name":"p","backends":[{"url":"http://127.0.0.1:1","backup":"yes"}]}"#,
    ] {
        let r = admin(&c, "POST", &f.admin_url("/admin/pools"), bad).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
    }
    let pools = get(&c, &f.admin_url("/admin/pools")).await.json();
    assert_eq!(pools.as_array().unwrap().len(), 1);
    let ok = r#"{"name":"p","panic_threshold":50,"outlier":{"consecutive_failures":3},"backends":[{"url":"http://127.0.0.1:1","backup":true}]}"#;
    let r = admin(&c, "POST", &f.admin_url("/admin/pools"), ok).await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["backends"][0]["backup"], true);
}

/// Seconds of slow start in [`slow_start_ramps_every_strategy_without_weights`].
const RAMP_SECS: u64 = 4;

/// The share of C, added to a loaded pool of A and B with `--slow-start 4s` under
/// `strategy`, in each second from its arrival to one second after its ramp ended.
async fn ramp_of(strategy: &'static str) -> Vec<f64> {
    let (a, b, new) = (
        TestBackend::start("A"),
        TestBackend::start("B"),
        TestBackend::start("C"),
    );
    let f = Fulcrum::over(
        &[&a, &b],
        &[
            "--strategy",
            strategy,
            "--slow-start",
            &format!("{RAMP_SECS}s"),
        ],
    );
    let c = client();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(std::time::Instant, bool)>();
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (c, url, stop, tx) = (c.clone(), f.url("/sleep/25"), stop.clone(), tx.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = get(&c, &url).await;
                    assert_eq!(r.status, 200, "{}", r.text());
                    let _ = tx.send((std::time::Instant::now(), r.backend() == "C"));
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let body = format!(r#"{{"url": "{}", "name": "C"}}"#, new.url());
    let added = admin(&c, "POST", &f.admin_url("/admin/backends"), &body).await;
    assert_eq!(added.status, 201, "{}", added.text());
    let t0 = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(RAMP_SECS + 1)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in clients {
        task.await.expect("client");
    }
    drop(tx);
    let mut windows = vec![(0u32, 0u32); RAMP_SECS as usize + 1];
    while let Some((at, to_new)) = rx.recv().await {
        let Some(second) = at.checked_duration_since(t0).map(|d| d.as_secs() as usize) else {
            continue;
        };
        if let Some(w) = windows.get_mut(second) {
            w.0 += u32::from(to_new);
            w.1 += 1;
        }
    }
    windows
        .iter()
        .map(|&(n, all)| f64::from(n) / f64::from(all.max(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_start_ramps_every_strategy_without_weights() {
    let strategies = [
        "round_robin",
        "least_connections",
        "power_of_two",
        "least_response_time",
        "peak_ewma",
    ];
    let runs: Vec<_> = strategies
        .iter()
        .map(|&s| tokio::spawn(ramp_of(s)))
        .collect();
    let mut failures = Vec::new();
    println!("share of the joining backend per second (fair share 0.33):");
    for (s, run) in strategies.iter().zip(runs) {
        let shares = run.await.expect("ramp");
        let row: Vec<String> = shares.iter().map(|x| format!("{x:.2}")).collect();
        println!("{s:>20}: {}", row.join("  "));
        let (first, last) = (shares[0], shares[RAMP_SECS as usize]);
        // Without slow start the newcomer takes its full share (a third; a quarter under
        // least connections, whose ties go to the lower index) from the first second.
        // The ramp gives it well under that at first, and its share once it is over.
        if !(first < 0.2 && last > 0.2 && 2.0 * first < last) {
            failures.push(format!("{s}: {row:?}"));
        }
    }
    assert!(failures.is_empty(), "no ramp: {failures:?}");
}
