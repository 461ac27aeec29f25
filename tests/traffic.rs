//! Shifting traffic (`docs/traffic.md`) over real sockets: split routes sharing their
//! requests among pools by weight or by key, weights moved live, the pool taken in the
//! access log, metrics and `explain`, and bad splits refused.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;

/// Two pools of one backend each, `v1` (A) and `v2` (B), behind the routes `routes`.
fn two_pools(a: &TestBackend, b: &TestBackend, routes: &str) -> String {
    format!(
        "[[pools]]\nname = \"v1\"\nbackends = [{{ url = \"{}\" }}]\n[[pools]]\nname = \"v2\"\nbackends = [{{ url = \"{}\" }}]\n{routes}",
        a.url(),
        b.url()
    )
}

fn start(tag: &str, text: &str) -> Fulcrum {
    let cfg = config_file("traffic", tag, text);
    Fulcrum::start(&[
        "--config",
        cfg.to_str().unwrap(),
        "--health-interval",
        "60s",
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_sends_exactly_its_share_and_moves_live() {
    let (a, b) = (TestBackend::start("A"), TestBackend::start("B"));
    let routes =
        "[[routes]]\nsplit = [{ pool = \"v1\", weight = 95 }, { pool = \"v2\", weight = 5 }]\n";
    let f = start("split", &two_pools(&a, &b, routes));
    let c = client();
    let mut seen = HashMap::new();
    for _ in 0..200 {
        let got = get(&c, &f.url("/x")).await;
        assert_eq!(got.status, 200);
        *seen.entry(got.backend()).or_insert(0) += 1;
    }
    assert_eq!(seen.get("B"), Some(&10), "{seen:?}");
    assert_eq!(seen.get("A"), Some(&190), "{seen:?}");
    let series = "fulcrum_route_split_total{route=\"0\",pool=\"v2\"}";
    assert_eq!(metric(&f, series).await, 10);
    assert!(f
        .log_line(&["access", "pool=\"v2\""], Duration::from_secs(5))
        .is_some());
    // The admin API shows the split as given; explain names the side.
    let routes = get(&c, &f.admin_url("/admin/routes")).await.json();
    assert_eq!(
        routes[0]["split"][1],
        serde_json::json!({"pool": "v2", "weight": 5})
    );
    let e = admin(
        &c,
        "POST",
        &f.admin_url("/admin/explain"),
        r#"{"path": "/x"}"#,
    )
    .await;
    assert_eq!(e.json()["split"]["by"], "round_robin", "{}", e.text());

    // Weights moved while requests run: none fails, and then all go to v2.
    let load = Load::start(f.proxy, 4, 0);
    tokio::time::sleep(Duration::from_millis(200)).await;
    for w in [50, 0] {
        let body = format!(
            r#"[{{"split": [{{"pool": "v1", "weight": {w}}}, {{"pool": "v2", "weight": 100}}]}}]"#
        );
        let got = admin(&c, "PUT", &f.admin_url("/admin/routes"), &body).await;
        assert_eq!(got.status, 200, "{}", got.text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (ok, failures) = load.finish();
    assert!(
        ok > 100 && failures.is_empty(),
        "{ok} answered, failures: {failures:?}"
    );
    for _ in 0..20 {
        assert_eq!(get(&c, &f.url("/x")).await.backend(), "B");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_key_keeps_each_client_on_one_side() {
    let (a, b) = (TestBackend::start("A"), TestBackend::start("B"));
    let routes = "[[routes]]\nsplit = [{ pool = \"v1\", weight = 50 }, { pool = \"v2\", weight = 50 }]\nsplit_key = \"header:x-user\"\n";
    let f = start("key", &two_pools(&a, &b, routes));
    let c = client();
    let mut sides: HashMap<String, String> = HashMap::new();
    for round in 0..4 {
        for user in 0..30 {
            let (name, url) = (format!("u{user}"), f.url("/k"));
            let got = send(&c, "GET", &url, &[("x-user", &name)], "").await;
            let side = got.backend();
            let first = sides.entry(name.clone()).or_insert_with(|| side.clone());
            assert_eq!(*first, side, "{name} moved in round {round}");
        }
    }
    let on_b = sides.values().filter(|s| *s == "B").count();
    assert!((5..=25).contains(&on_b), "{on_b} of 30 users on B");
    // The key's side is what explain says.
    let q = r#"{"path": "/k", "headers": {"x-user": "u0"}}"#;
    let e = admin(&c, "POST", &f.admin_url("/admin/explain"), q)
        .await
        .json();
    assert_eq!(e["split"]["by"], "split_key");
    let want = if sides["u0"] == "A" { "v1" } else { "v2" };
    assert_eq!(e["split"]["pool"], want);
    // A cookie key, through the fast path's span fields, stays put too.
    let text = two_pools(&a, &b, &routes.replace("header:x-user", "cookie:sid"));
    let g = start("cookie", &text);
    let mut by_cookie = HashMap::new();
    for i in 0..60 {
        let sid = format!("s{}", i % 12);
        let cookie = format!("a=1; sid={sid}");
        let got = send(&c, "GET", &g.url("/c"), &[("cookie", &cookie)], "").await;
        let first = by_cookie.entry(sid).or_insert_with(|| got.backend());
        assert_eq!(*first, got.backend());
    }
}

#[test]
fn bad_splits_exit_2_naming_them() {
    let (a, b) = (TestBackend::start("A"), TestBackend::start("B"));
    for (routes, says) in [
        ("split = [{ pool = \"v1\", weight = 1001 }, { pool = \"v2\", weight = 1 }]", "0 to 1000"),
        ("split = [{ pool = \"v1\", weight = 0 }, { pool = \"v2\", weight = 0 }]", "every weight is 0"),
        ("split = [{ pool = \"v1\", weight = 1 }, { pool = \"v3\", weight = 1 }]", "unknown pool 'v3'"),
        ("pool = \"v1\"\nsplit = [{ pool = \"v2\", weight = 1 }]", "has no pool"),
        ("pool = \"v1\"\nsplit_key = \"client_ip\"", "split_key needs a split"),
        ("split = [{ pool = \"v1\", weight = 1 }, { pool = \"v2\", weight = 1 }]\nsplit_key = \"path\"", "split_key"),
    ] {
        let text = two_pools(&a, &b, &format!("[[routes]]\n{routes}\n"));
        let cfg = config_file("traffic", "bad", &text);
        let (code, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
        assert_eq!(code.code(), Some(2), "{routes}: {err}");
        assert!(err.contains(says), "{routes}: {err}");
        assert!(err.contains("line"), "{routes}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_refuses_a_bad_split_and_keeps_the_routes() {
    let (a, b) = (TestBackend::start("A"), TestBackend::start("B"));
    let f = start(
        "admin",
        &two_pools(
            &a,
            &b,
            "[[routes]]\npool = \"v1\"\n[[routes]]\npool = \"v2\"\npath_prefix = \"/b\"\n",
        ),
    );
    let c = client();
    let url = f.admin_url("/admin/routes");
    for (body, says) in [
        (
            r#"[{"split": [{"pool": "v1", "weight": 2000}]}]"#,
            "0 to 1000",
        ),
        (r#"[{"split": [{"pool": "v9", "weight": 1}]}]"#, "v9"),
        (
            r#"[{"pool": "v1", "split": [{"pool": "v2", "weight": 1}]}]"#,
            "has no pool",
        ),
        (r#"[{"split": []}]"#, "1 to 16"),
    ] {
        let got = admin(&c, "PUT", &url, body).await;
        assert_eq!(got.status, 400, "{body}: {}", got.text());
        assert!(got.text().contains(says), "{body}: {}", got.text());
    }
    assert_eq!(get(&c, &url).await.json()[0]["pool"], "v1");
    // A pool a split names cannot be removed.
    let put = r#"[{"split": [{"pool": "v1", "weight": 1}, {"pool": "v2", "weight": 1}]}]"#;
    assert_eq!(admin(&c, "PUT", &url, put).await.status, 200);
    let del = admin(&c, "DELETE", &f.admin_url("/admin/pools/v2"), "").await;
    assert_eq!(del.status, 409, "{}", del.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_keeps_its_conditions_keeps_its_rate_limit_across_changes() {
    let (a, b) = (TestBackend::start("A"), TestBackend::start("B"));
    let limited = "[[routes]]\npool = \"v1\"\npath_prefix = \"/l\"\nrate_limit = { rate = 1, per = \"1m\", burst = 1 }\n";
    let f = start(
        "kept",
        &two_pools(&a, &b, &format!("{limited}[[routes]]\npool = \"v2\"\n")),
    );
    let c = client();
    let status = |got: Got| got.status.as_u16();
    for _ in 0..2 {
        assert_eq!(status(get(&c, &f.url("/l")).await), 200);
    }
    assert_eq!(status(get(&c, &f.url("/l")).await), 429);
    // The list changes after it (a route added): the limited route keeps its bucket.
    let url = f.admin_url("/admin/routes");
    let same = r#"[{"pool": "v1", "path_prefix": "/l", "rate_limit": {"rate": 1, "per": "1m", "burst": 1}},
                   {"pool": "v2", "path_prefix": "/b"}, {"pool": "v2"}]"#;
    assert_eq!(admin(&c, "PUT", &url, same).await.status, 200);
    assert_eq!(
        status(get(&c, &f.url("/l")).await),
        429,
        "the bucket was kept"
    );
    assert_eq!(
        metric(&f, "fulcrum_rate_limited_total{route=\"0\"}").await,
        2
    );
    // Its conditions change: a new route, a new bucket.
    let moved = same.replace("\"/l\"", "\"/m\"");
    assert_eq!(admin(&c, "PUT", &url, &moved).await.status, 200);
    assert_eq!(
        status(get(&c, &f.url("/m")).await),
        200,
        "a new route starts afresh"
    );
}
