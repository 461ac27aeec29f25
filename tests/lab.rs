//! The strategy lab (`docs/lab.md`): `fulcrum lab` runs each scenario's scripted demo
//! backends through a fresh fulcrum per strategy and reports who wins; bad input exits
//! 2 naming the valid values. Short runs here; docs/lab.md has the full ones.

mod common;

use std::time::{Duration, Instant};

use common::{admin, client, get, run_fulcrum, Fulcrum, TestBackend};
use serde_json::Value;

/// One measuring run at a time: two at once on two cores would measure each other.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `fulcrum lab` with `args` and a JSON report; the report and the table.
fn lab(tag: &str, args: &[&str]) -> (Value, String) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("fulcrum-lab-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, svg) = (dir.join("report.json"), dir.join("chart.svg"));
    let mut all = vec!["lab"];
    all.extend_from_slice(args);
    all.extend([
        "--json",
        json.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let (status, out, err) = run_fulcrum(&all);
    assert_eq!(status.code(), Some(0), "{all:?}: {err}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg") && chart.trim_end().ends_with("</svg>"));
    let _ = std::fs::remove_dir_all(&dir);
    (report, out)
}

/// The result row of `strategy`.
fn row<'a>(report: &'a Value, strategy: &str) -> &'a Value {
    report["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["strategy"] == strategy)
        .unwrap_or_else(|| panic!("no row {strategy}: {report}"))
}

fn p99(report: &Value, strategy: &str) -> f64 {
    row(report, strategy)["p99_ms"].as_f64().unwrap()
}

#[test]
fn bad_input_exits_2_naming_the_valid_values() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["--scenario", "nope"],
            "valid: slow-backend, flapping, heterogeneous, warmup, hot-key, overload, brownout",
        ),
        (
            &[
                "--scenario",
                "warmup",
                "--strategies",
                "round_robin,fastest",
            ],
            "valid: all, round_robin",
        ),
        (
            &["--scenario", "warmup", "--rps", "0"],
            "expected an integer from 1 to 5000",
        ),
        (
            &["--scenario", "warmup", "--seconds", "121"],
            "expected an integer from 1 to 120",
        ),
        (&["--strategies", "all"], "--scenario <NAME>"),
    ];
    for (args, want) in cases {
        let mut all = vec!["lab"];
        all.extend_from_slice(args);
        let (status, _, err) = run_fulcrum(&all);
        assert_eq!(status.code(), Some(2), "{all:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(want), "{all:?}: {err}");
    }
}

#[test]
fn a_slow_backend_costs_round_robin_its_tail_and_not_the_latency_aware() {
    let (r, table) = lab(
        "slow",
        &[
            "--scenario",
            "slow-backend",
            "--strategies",
            "round_robin,least_response_time,peak_ewma,round_robin+hedge",
            "--seconds",
            "6",
        ],
    );
    println!("{table}");
    assert_eq!(r["scenario"], "slow-backend");
    assert_eq!(r["seed"], 1);
    // A 6 s run's p99 is its 18th-slowest request, and the latency-aware strategies
    // send a fixed few requests to b3 before they see it is slow: p90 is the robust
    // test here; docs/lab.md has the p99 of a full run.
    let p90 = |s: &str| row(&r, s)["p90_ms"].as_f64().unwrap();
    for s in ["least_response_time", "peak_ewma"] {
        assert!(p90(s) * 4.0 <= p90("round_robin"), "{s}: {}", row(&r, s));
        assert!(p99(&r, s) < p99(&r, "round_robin"), "{s}: {}", row(&r, s));
        assert!(
            row(&r, s)["share"]["b3"].as_f64().unwrap() < 0.25,
            "{}",
            row(&r, s)
        );
    }
    // Hedged requests leave the slow backend's answers to another backend after 25 ms:
    // round robin's tail, cut (a full run: p99 41 ms against 123).
    let hedged = "round_robin+hedge";
    assert!(
        p90(hedged) * 2.0 <= p90("round_robin"),
        "{}",
        row(&r, hedged)
    );
    assert!(
        p99(&r, hedged) * 2.0 <= p99(&r, "round_robin"),
        "{}",
        row(&r, hedged)
    );
    // The same seed, the same requests for every strategy.
    let n = row(&r, "round_robin")["requests"].clone();
    assert!(r["results"]
        .as_array()
        .unwrap()
        .iter()
        .all(|x| x["requests"] == n));
    // The best p90 (the fifth column) is marked, and it is not round robin's.
    let p90_field = |l: &str| l.split_whitespace().nth(4).unwrap_or("").to_string();
    let rr_line = table
        .lines()
        .find(|l| l.starts_with("round_robin"))
        .unwrap();
    assert!(!p90_field(rr_line).ends_with('*'), "{table}");
    assert!(
        table.lines().skip(1).any(|l| p90_field(l).ends_with('*')),
        "{table}"
    );
}

#[test]
fn the_hashing_strategies_spread_many_clients_over_every_backend() {
    let (r, table) = lab(
        "clients",
        &[
            "--scenario",
            "slow-backend",
            "--strategies",
            "consistent_hash,ip_hash,maglev,round_robin",
            "--seconds",
            "3",
        ],
    );
    println!("{table}");
    // A thousand clients, each with its own address: every hashing row reaches every
    // backend, none with all of the traffic.
    for s in ["consistent_hash", "ip_hash", "maglev"] {
        let share = row(&r, s)["share"].as_object().unwrap().clone();
        assert_eq!(share.len(), 3, "{s}: {share:?}");
        for (b, v) in &share {
            let v = v.as_f64().unwrap();
            assert!((0.15..0.55).contains(&v), "{s}: {b} took {v}");
        }
        assert!(row(&r, s).get("single_backend").is_none(), "{}", row(&r, s));
    }
}

#[test]
fn heterogeneous_capacity_is_found_by_weights_and_latency() {
    let (r, table) = lab(
        "hetero",
        &[
            "--scenario",
            "heterogeneous",
            "--strategies",
            "round_robin,weighted_least_connections,least_response_time",
            "--seconds",
            "5",
        ],
    );
    println!("{table}");
    let rr = p99(&r, "round_robin");
    for s in ["weighted_least_connections", "least_response_time"] {
        assert!(p99(&r, s) < rr, "{s}: {} against {rr}", p99(&r, s));
    }
}

#[test]
fn a_cold_backend_ramps_up_and_a_hot_key_is_bounded() {
    let strategies = "round_robin,weighted_round_robin";
    let args = [
        "--scenario",
        "warmup",
        "--strategies",
        strategies,
        "--seconds",
        "8",
    ];
    let (w, table) = lab("warm", &args);
    println!("{table}");
    for s in strategies.split(',') {
        let ramp: Vec<f64> = row(&w, s)["joiner_share_per_second"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        println!("{s}: the joining backend's share per second: {ramp:?}");
        assert!(ramp.len() >= 3, "{ramp:?}");
        assert!(ramp[0] < 0.2, "{s}: a ramp, not a flood: {ramp:?}");
        assert!(ramp[ramp.len() - 1] > ramp[0], "{s}: {ramp:?}");
    }

    let (h, table) = lab(
        "hot",
        &[
            "--scenario",
            "hot-key",
            "--strategies",
            "maglev",
            "--seconds",
            "5",
        ],
    );
    println!("{table}");
    let plain = row(&h, "maglev");
    let bounded = row(&h, "maglev+bounded");
    let over = |r: &Value| r["max_share_over_fair"].as_f64().unwrap();
    // Where the hot keys land depends on the backends' ports, which differ from run to
    // run: unbounded, the busiest backend may take anything from its fair share to
    // twice it (docs/lab.md). What holds in every run: without the bound every key
    // sticks to one backend; with it the busiest backend stays near its fair share
    // (the bound caps requests in flight, ceil(1.25 × (T + 1) / n), not shares: with
    // about 20 in flight up to 1.3 times it), never above the unbounded one, and most
    // requests still go to their key's usual backend.
    assert_eq!(plain["key_affinity"].as_f64(), Some(1.0), "{plain}");
    assert!(over(bounded) <= 1.4, "{bounded}");
    assert!(
        over(bounded) <= over(plain) + 0.05,
        "{bounded} against {plain}"
    );
    if over(plain) > 1.4 {
        assert!(over(bounded) < over(plain), "{bounded} against {plain}");
    }
    assert!(
        bounded["key_affinity"].as_f64().unwrap() >= 0.6,
        "{bounded}"
    );
}

#[test]
fn overload_sheds_what_it_cannot_serve_and_nothing_hangs() {
    let started = std::time::Instant::now();
    let (r, table) = lab(
        "over",
        &[
            "--scenario",
            "overload",
            "--strategies",
            "least_connections,round_robin+auto,round_robin+unlimited",
            "--seconds",
            "4",
        ],
    );
    println!("{table}");
    let lc = row(&r, "least_connections");
    let (errors, requests) = (
        lc["errors"].as_u64().unwrap(),
        lc["requests"].as_u64().unwrap(),
    );
    assert!(errors > 0 && errors < requests, "{lc}");
    // Served requests wait at most the queue's 500 ms, plus their own service.
    assert!(lc["p99_ms"].as_f64().unwrap() < 1000.0, "{lc}");
    // An adaptive limit: the tail of the unlimited pool halved at least, and fewer
    // than a third refused (a fifth is over the pool's capacity).
    let (auto, unlimited) = (
        row(&r, "round_robin+auto"),
        row(&r, "round_robin+unlimited"),
    );
    let refused = auto["errors"].as_f64().unwrap() / auto["requests"].as_f64().unwrap();
    assert!(refused < 1.0 / 3.0, "{auto}");
    assert!(
        p99(&r, "round_robin+auto") <= 0.5 * p99(&r, "round_robin+unlimited"),
        "{auto} {unlimited}"
    );
    assert_eq!(
        unlimited["errors"], 0,
        "nothing refused without a limit: {unlimited}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(45));
}

#[test]
fn in_a_brownout_success_rate_ejection_cuts_the_errors_to_a_third() {
    let (r, table) = lab(
        "brown",
        &[
            "--scenario",
            "brownout",
            "--strategies",
            "round_robin,round_robin+success_rate",
            "--seconds",
            "6",
        ],
    );
    println!("{table}");
    let errors = |s: &str| {
        let x = row(&r, s);
        x["errors"].as_f64().unwrap() / x["requests"].as_f64().unwrap()
    };
    let (without, with) = (errors("round_robin"), errors("round_robin+success_rate"));
    assert!(without > 0.02, "the brownout fails requests: {without}");
    assert!(with <= without / 3.0, "{with} against {without}");
}

/// The lab's backend processes alive now (a zombie has no command line).
fn lab_backends() -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains("--clock-on-stdin"))
        .count()
}

#[test]
fn the_admin_api_runs_the_lab_reports_it_and_stops_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let backend = TestBackend::start("live");
    let f = Fulcrum::over(&[&backend], &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = client();
        let url = f.admin_url("/admin/lab");
        assert_eq!(get(&c, &url).await.json()["state"], "idle");
        for (body, want) in [
            (r#"{"scenario":"nope"}"#, "valid: slow-backend, flapping"),
            (
                r#"{"scenario":"warmup","strategies":["fastest"]}"#,
                "valid: all, round_robin",
            ),
            (r#"{"scenario":"warmup","rps":0}"#, "from 1 to 5000"),
            (r#"{"scenario":"warmup","seconds":121}"#, "from 1 to 120"),
            (r#"{"scenario":"warmup","speed":1}"#, "unknown field"),
            (r#"{"scenario":"warmup","strategies":[]}"#, "at least one"),
        ] {
            let got = admin(&c, "POST", &url, body).await;
            assert_eq!(got.status, 400, "{body}: {}", got.text());
            assert!(got.json()["error"].as_str().unwrap().contains(want), "{}", got.text());
        }
        assert_eq!(get(&c, &url).await.json()["state"], "idle");

        let body = r#"{"scenario":"slow-backend","strategies":"round_robin,peak_ewma","seconds":2,"seed":7}"#;
        let started = admin(&c, "POST", &url, body).await;
        assert_eq!(started.status, 202, "{}", started.text());
        assert_eq!(started.json()["strategies"], serde_json::json!(["round_robin", "peak_ewma"]));
        assert_eq!(admin(&c, "POST", &url, body).await.status, 409);
        // The instance's own traffic goes on while the lab runs.
        assert_eq!(get(&c, &f.url("/")).await.status, 200);
        let mut saw_progress = false;
        let deadline = Instant::now() + Duration::from_secs(60);
        let done = loop {
            let s = get(&c, &url).await.json();
            saw_progress |= s["progress"]["strategy"].is_string();
            if s["state"] != "running" || Instant::now() > deadline {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(done["state"], "done", "{done}");
        assert!(saw_progress, "{done}");
        let rows = done["report"]["results"].as_array().unwrap();
        assert_eq!(rows.len(), 2, "{done}");
        assert_eq!(done["report"]["seed"], 7);
        assert_eq!(rows[0]["requests"], rows[1]["requests"]);
        assert!(rows.iter().all(|r| r["p99_ms"].as_f64().unwrap() > 0.0), "{done}");
        assert!(done["table"].as_str().unwrap().contains("peak_ewma"));
        assert!(done["svg"].as_str().unwrap().starts_with("<svg"));
        assert!(backend.requests() > 0);

        let long = r#"{"scenario":"warmup","strategies":"round_robin","seconds":60}"#;
        assert_eq!(admin(&c, "POST", &url, long).await.status, 202);
        assert!(common::eventually(Duration::from_secs(10), || async {
            get(&c, &url).await.json()["progress"]["phase"] == "load"
        })
        .await);
        assert!(lab_backends() >= 2);
        let t = Instant::now();
        let stopped = admin(&c, "DELETE", &url, "").await.json();
        assert_eq!(stopped["state"], "stopped", "{stopped}");
        // A clean stop, not the kill after 5 s: quick, and the lab printed its table.
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
        assert!(stopped["table"].is_string(), "{stopped}");
        // The lab stopped and reaped its backends before it exited.
        assert!(common::eventually(Duration::from_secs(3), || async { lab_backends() == 0 }).await);
        assert_eq!(get(&c, &url).await.json()["state"], "stopped");
    });
}

/// Entries of the temporary directory whose name starts `fulcrum-lab-`.
fn lab_leftovers() -> Vec<String> {
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("fulcrum-lab-") && !n.contains(&std::process::id().to_string()))
        .collect()
}

#[test]
fn a_lab_run_leaves_nothing_behind_when_its_parent_is_killed() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let before = lab_leftovers();
    let mut f = Fulcrum::start(&[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = client();
        let url = f.admin_url("/admin/lab");
        let long = r#"{"scenario":"warmup","strategies":"round_robin","seconds":60}"#;
        assert_eq!(admin(&c, "POST", &url, long).await.status, 202);
        assert!(
            common::eventually(Duration::from_secs(10), || async {
                get(&c, &url).await.json()["progress"]["phase"] == "load"
            })
            .await
        );
    });
    assert!(lab_backends() >= 2);
    let _ = f.child.kill(); // SIGKILL: no drop, no handler runs.
    let _ = f.child.wait();
    // The lab hears its parent die, stops and reaps its backends.
    let deadline = Instant::now() + Duration::from_secs(10);
    while lab_backends() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(lab_backends(), 0, "the lab's backends are gone");
    assert_eq!(
        lab_leftovers(),
        before,
        "nothing of the run stays in the temp directory"
    );
}

#[test]
fn long_lived_tcp_sessions_go_further_with_least_connections() {
    let (r, table) = lab(
        "long-lived",
        &[
            "--scenario",
            "long-lived",
            "--strategies",
            "round_robin,least_connections",
            "--seconds",
            "4",
        ],
    );
    println!("{table}");
    let (rr, lc) = (row(&r, "round_robin"), row(&r, "least_connections"));
    // Every query of every session answered, through the TCP pool.
    for x in [rr, lc] {
        assert_eq!(x["errors"], 0, "{x}");
        assert!(x["requests"].as_u64().unwrap() > 1000, "{x}");
    }
    // Round robin sends the slow backend a third of the sessions, which pile up on it;
    // least connections sends it fewer (docs/lab.md: p99 27 ms against 47).
    assert!(
        p99(&r, "least_connections") < p99(&r, "round_robin"),
        "{table}"
    );
    let share = |x: &Value| x["share"]["b3"].as_f64().unwrap_or(0.0);
    assert!(share(lc) < share(rr), "{lc} {rr}");
}
