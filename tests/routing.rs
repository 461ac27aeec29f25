//! Pools and routes (`docs/routing.md`): requests land on the pool their route names,
//! pools live apart (strategy, health, failures), the admin API changes pools and
//! routes, a reload moves a route under load without losing a request, and `check`
//! names every mistake with its line — over real sockets and processes.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;

fn backend_entry(b: &TestBackend) -> String {
    format!(
        "[[pools.backends]]\nurl = \"{}\"\nname = \"{}\"\n",
        b.url(),
        b.name
    )
}

async fn get_as(c: &HttpClient, f: &Fulcrum, path: &str, headers: &[(&str, &str)]) -> Got {
    send(c, "GET", &f.url(path), headers, Bytes::new()).await
}

fn series(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_lands_on_the_pool_its_route_names() {
    let (a1, a2, w) = (
        TestBackend::start("A1"),
        TestBackend::start("A2"),
        TestBackend::start("W"),
    );
    let cfg = config_file("routing", 
        "land",
        &format!(
            "[[pools]]\nname = \"api\"\n{}{}\
             [[pools]]\nname = \"web\"\n{}\
             [[routes]]\npool = \"api\"\nhost = \"api.example.com\"\n\
             [[routes]]\npool = \"api\"\npath_prefix = \"/api\"\nstrip_path_prefix = true\n\
             [[routes]]\npool = \"api\"\nheaders = {{ \"x-canary\" = \"1\" }}\nmethods = [\"GET\"]\n\
             [[routes]]\npool = \"web\"\nhost = \"*.example.com\"\n",
            backend_entry(&a1),
            backend_entry(&a2),
            backend_entry(&w)
        ),
    );
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let c = client();
    let api = |g: &Got| g.backend().starts_with('A');
    // Exact host, any case, any port.
    for host in ["api.example.com", "API.Example.COM:8080"] {
        let r = get_as(&c, &f, "/x", &[("host", host)]).await;
        assert!(api(&r) && r.status == 200, "{host}: {}", r.backend());
        assert_eq!(r.header("x-uri"), Some("/x"));
    }
    // A wildcard takes names below it at any depth, not the name itself.
    for host in ["shop.example.com", "a.b.example.com"] {
        let r = get_as(&c, &f, "/y", &[("host", host)]).await;
        assert_eq!(r.backend(), "W", "{host}");
    }
    let r = get_as(&c, &f, "/y", &[("host", "example.com")]).await;
    assert_eq!((r.status.as_u16(), r.text().as_str()), (404, "no route\n"));
    // A prefix, segment-aware, stripped.
    let r = get_as(&c, &f, "/api/users?q=1", &[("host", "other.net")]).await;
    assert!(api(&r), "{}", r.backend());
    assert_eq!(r.header("x-uri"), Some("/users?q=1"));
    let r = get_as(&c, &f, "/api", &[("host", "other.net")]).await;
    assert_eq!(r.header("x-uri"), Some("/"));
    let r = get_as(&c, &f, "/apix", &[("host", "other.net")]).await;
    assert_eq!(r.status, 404);
    // A header with exactly that value, and the method.
    let r = get_as(&c, &f, "/z", &[("host", "other.net"), ("x-canary", "1")]).await;
    assert!(api(&r), "{}", r.backend());
    let r = get_as(&c, &f, "/z", &[("host", "other.net"), ("x-canary", "2")]).await;
    assert_eq!(r.status, 404);
    let r = send(
        &c,
        "POST",
        &f.url("/z"),
        &[("host", "other.net"), ("x-canary", "1")],
        "b",
    )
    .await;
    assert_eq!(r.status, 404);
    // Round robin within the api pool: both of its backends, nothing of web's.
    let before = w.requests();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        seen.insert(
            get_as(&c, &f, "/v", &[("host", "api.example.com")])
                .await
                .backend(),
        );
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["A1", "A2"]);
    assert_eq!(w.requests(), before);

    let m = get(&c, &f.admin_url("/metrics")).await.text();
    assert_eq!(
        series(&m, r#"fulcrum_route_requests_total{route="0"}"#),
        Some(8.0),
        "{m}"
    );
    assert_eq!(
        series(&m, r#"fulcrum_route_requests_total{route="3"}"#),
        Some(2.0),
        "{m}"
    );
    assert_eq!(series(&m, "fulcrum_no_route_total"), Some(4.0), "{m}");
    assert!(
        m.contains(r#"fulcrum_requests_total{backend="W",code="2xx",pool="web"} 2"#),
        "{m}"
    );
    let pools = get(&c, &f.admin_url("/admin/pools")).await.json();
    assert_eq!(pools[0]["name"], "api");
    assert_eq!(pools[0]["routes"], serde_json::json!([0, 1, 2]));
    assert_eq!(pools[1]["routes"], serde_json::json!([3]));
    assert_eq!(pools[1]["backends"][0]["pool"], "web");
    assert_eq!(
        pools[1]["backends"][0]["id"], 2,
        "ids are global, in config order"
    );
    let routes = get(&c, &f.admin_url("/admin/routes")).await.json();
    assert_eq!(routes[1]["path_prefix"], "/api");
    assert_eq!(routes[1]["strip_path_prefix"], true);
    assert_eq!(routes[2]["headers"]["x-canary"], "1");
    assert_eq!(routes[3]["host"], "*.example.com");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_live_apart_strategy_health_and_failures() {
    let (a1, a2, w1, w2) = (
        TestBackend::start("A1"),
        TestBackend::start("A2"),
        TestBackend::start("W1"),
        TestBackend::start("W2"),
    );
    let cfg = config_file("routing", 
        "apart",
        &format!(
            "[[pools]]\nname = \"web\"\n{}{}\
             [[pools]]\nname = \"api\"\nhealth = {{ path = \"/health\", interval = \"200ms\" }}\n{}{}\
             [[routes]]\npool = \"api\"\npath_prefix = \"/api\"\n\
             [[routes]]\npool = \"web\"\n",
            backend_entry(&w1),
            backend_entry(&w2),
            backend_entry(&a1),
            backend_entry(&a2)
        ),
    );
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap(), "--health-interval", "1m"]);
    let c = client();
    let mut events = EventStream::open(&f);
    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/pools/api/strategy"),
        r#"{"strategy":"lc"}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["strategy"], "least_connections");
    // The event says which pool switched.
    let ev = tokio::task::spawn_blocking(move || {
        events.find(Duration::from_secs(5), |e| e["type"] == "strategy")
    })
    .await
    .unwrap()
    .expect("a strategy event");
    assert_eq!(
        (ev["pool"].as_str(), ev["strategy"].as_str()),
        (Some("api"), Some("least_connections"))
    );
    let web = get(&c, &f.admin_url("/admin/pools/web/strategy"))
        .await
        .json();
    assert_eq!(web["strategy"], "round_robin");
    // The single-pool routes address the first pool.
    assert_eq!(
        get(&c, &f.admin_url("/admin/strategy")).await.json()["strategy"],
        "round_robin"
    );
    let unknown = get(&c, &f.admin_url("/admin/pools/nope/strategy")).await;
    assert_eq!(unknown.status, 404);
    assert!(unknown.json()["error"].as_str().unwrap().contains("nope"));

    // A1 dies: the api pool's own checks (every 200 ms) take it out; web, meanwhile,
    // answers every request.
    drop(a1);
    let a1_down = eventually(Duration::from_secs(5), || async {
        let r = get(&c, &f.url("/w")).await;
        assert_eq!(r.status, 200);
        assert!(r.backend().starts_with('W'));
        let api = get(&c, &f.admin_url("/admin/pools/api")).await.json();
        api["backends"][0]["healthy"] == false
    })
    .await;
    assert!(a1_down, "the api pool's health checks did not notice");
    for _ in 0..10 {
        let r = get(&c, &f.url("/api/x")).await;
        assert_eq!((r.status.as_u16(), r.backend()), (200, "A2".into()));
    }
    let web = get(&c, &f.admin_url("/admin/pools/web")).await.json();
    for b in web["backends"].as_array().unwrap() {
        assert_eq!(
            (b["healthy"].as_bool(), b["errors"].as_u64()),
            (Some(true), Some(0))
        );
    }
    // Round robin over web went on evenly.
    assert!(w1.requests().abs_diff(w2.requests()) <= 1);
    // The web pool's checks run every minute: they probed once, at start-up.
    assert_eq!(w1.probes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_and_routes_change_through_the_admin_api_all_or_nothing() {
    let (w, x) = (TestBackend::start("W"), TestBackend::start("X"));
    let f = Fulcrum::start(&["--backend", &w.spec()]);
    let c = client();
    let url = |p: &str| f.admin_url(p);
    let body = format!(
        r#"{{"name":"extra","strategy":"p2c","retries":0,"health":{{"interval":"1s"}},"backends":[{{"url":"{}","name":"X"}}]}}"#,
        x.url()
    );
    let r = admin(&c, "POST", &url("/admin/pools"), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["strategy"], "power_of_two");
    let x_id = r.json()["backends"][0]["id"].as_u64().unwrap();
    assert_eq!(x_id, 1, "ids are global");
    assert_eq!(
        admin(&c, "POST", &url("/admin/pools"), &body).await.status,
        409
    );
    for bad in [
        r#"{"name":"Bad Name"}"#,
        r#"{"name":"p","strategy":"bogus"}"#,
        r#"{"name":"p","listen":"127.0.0.1:1"}"#,
        r#"{"name":"p","backends":[{"url":"gopher://x"}]}"#,
    ] {
        let r = admin(&c, "POST", &url("/admin/pools"), bad).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.json()["error"].is_string());
    }
    // No route reaches it yet.
    assert_eq!(get(&c, &f.url("/x/1")).await.backend(), "W");
    // A list with one bad route changes nothing.
    let before = get(&c, &url("/admin/routes")).await.text();
    for bad in [
        r#"[{"pool":"extra","path_prefix":"/x"},{"pool":"nope"}]"#,
        r#"[{"pool":"extra","host":"a b"}]"#,
        r#"[{"pool":"extra","strip_path_prefix":true}]"#,
        r#"{"pool":"extra"}"#,
    ] {
        let r = send(
            &c,
            "PUT",
            &url("/admin/routes"),
            &[("content-type", "application/json")],
            bad.to_string(),
        )
        .await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert_eq!(get(&c, &url("/admin/routes")).await.text(), before);
    }
    let dup = format!(
        r#"{{"name":"twice","backends":[{{"url":"{0}"}},{{"url":"{0}/"}}]}}"#,
        x.url()
    );
    let r = admin(&c, "POST", &url("/admin/pools"), &dup).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("duplicate backend name"), "{}", r.text());
    let r = send(
        &c,
        "PUT",
        &url("/admin/routes"),
        &[("content-type", "application/json")],
        "[]".to_string(),
    )
    .await;
    assert_eq!(
        r.status, 400,
        "an empty list would answer 404 to everything"
    );
    let good = r#"[{"pool":"extra","path_prefix":"/x"},{"pool":"default"}]"#;
    let r = send(
        &c,
        "PUT",
        &url("/admin/routes"),
        &[("content-type", "application/json")],
        good.to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get(&c, &f.url("/x/1")).await.backend(), "X");
    assert_eq!(get(&c, &f.url("/y")).await.backend(), "W");
    // A backend of any pool by its id; a pool's own backends list.
    let b = get(&c, &url(&format!("/admin/backends/{x_id}")))
        .await
        .json();
    assert_eq!(b["pool"], "extra");
    let r = admin(
        &c,
        "POST",
        &url("/admin/pools/extra/backends"),
        &format!(r#"{{"url":"{}"}}"#, x.url()),
    )
    .await;
    assert_eq!(r.status, 409, "the URL is in that pool already");
    let r = admin(
        &c,
        "POST",
        &url("/admin/pools/extra/backends"),
        &format!(r#"{{"url":"{}","name":"W2"}}"#, w.url()),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    // A pool a route names cannot go; once the routes let go of it, it can.
    assert_eq!(
        send(&c, "DELETE", &url("/admin/pools/extra"), &[], Bytes::new())
            .await
            .status,
        409
    );
    let r = send(
        &c,
        "PUT",
        &url("/admin/routes"),
        &[("content-type", "application/json")],
        r#"[{"pool":"default"}]"#.to_string(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        send(&c, "DELETE", &url("/admin/pools/extra"), &[], Bytes::new())
            .await
            .status,
        204
    );
    assert_eq!(get(&c, &url("/admin/pools/extra")).await.status, 404);
    assert_eq!(
        send(
            &c,
            "DELETE",
            &url("/admin/pools/default"),
            &[],
            Bytes::new()
        )
        .await
        .status,
        409
    );
    assert_eq!(get(&c, &f.url("/x/1")).await.backend(), "W");
    let st = status(&c, &f).await;
    assert_eq!(st["pools"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_moves_a_route_under_load_loses_no_request() {
    let (w, a) = (TestBackend::start("W"), TestBackend::start("A"));
    let pools = format!(
        "[[pools]]\nname = \"web\"\n{}[[pools]]\nname = \"api\"\n{}",
        backend_entry(&w),
        backend_entry(&a)
    );
    // The load's GET /x goes to api, then to web and back; api keeps a route of its own.
    let v1 = format!(
        "{pools}[[routes]]\npool = \"api\"\npath_prefix = \"/x\"\n[[routes]]\npool = \"web\"\n"
    );
    let v2 = format!("{pools}[[routes]]\npool = \"api\"\nhost = \"internal.example\"\n[[routes]]\npool = \"web\"\n");
    let cfg = config_file("routing", "move", &v1);
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let c = client();
    assert_eq!(get(&c, &f.url("/x")).await.backend(), "A");
    let w_id = get(&c, &f.admin_url("/admin/pools/web")).await.json()["backends"][0]["id"].clone();
    let load = Load::start(f.proxy, 4, 3);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for round in 0..6 {
        std::fs::write(&cfg, if round % 2 == 0 { &v2 } else { &v1 }).unwrap();
        let r = admin(&c, "POST", &f.admin_url("/admin/reload"), "").await;
        assert_eq!(r.status, 200, "{}", r.text());
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    std::fs::write(&cfg, &v2).unwrap();
    f.signal("HUP");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (ok, failures) = tokio::task::spawn_blocking(move || load.finish())
        .await
        .unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} failed: {:?}",
        failures.len(),
        ok,
        &failures[..failures.len().min(5)]
    );
    assert!(ok > 100, "{ok}");
    assert_eq!(get(&c, &f.url("/x")).await.backend(), "W");
    let r = get_as(&c, &f, "/x", &[("host", "internal.example")]).await;
    assert_eq!(r.backend(), "A");
    // The backends that stayed kept their ids and counters.
    let web = get(&c, &f.admin_url("/admin/pools/web")).await.json();
    assert_eq!(web["backends"][0]["id"], w_id);
    assert!(web["backends"][0]["requests"].as_u64().unwrap() > 50);
    // A pool the file no longer has goes, with its route.
    std::fs::write(
        &cfg,
        format!("[[pools]]\nname = \"web\"\n{}", backend_entry(&w)),
    )
    .unwrap();
    let r = admin(&c, "POST", &f.admin_url("/admin/reload"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["pools_removed"], serde_json::json!(["api"]));
    let r = get_as(&c, &f, "/", &[("host", "internal.example")]).await;
    assert_eq!(r.backend(), "W");
}

#[test]
fn check_names_each_pool_and_route_mistake_with_its_line() {
    let pool = |name: &str| format!("[[pools]]\nname = \"{name}\"\n");
    let cases: Vec<(String, &str, &str)> = vec![
        (
            format!(
                "{}[[routes]]\npool = \"nope\"\n[[routes]]\npool = \"api\"\n",
                pool("api")
            ),
            "line 4",
            "unknown pool 'nope'",
        ),
        (
            format!("{}{}[[routes]]\npool = \"api\"\n", pool("api"), pool("web")),
            "line 4",
            "no route reaches pool 'web'",
        ),
        (
            format!("{}{}", pool("api"), pool("web")),
            "line 4",
            "several pools and no [[routes]]",
        ),
        (
            format!("{}{}[[routes]]\npool = \"api\"\n", pool("api"), pool("api")),
            "line 4",
            "duplicate pool name 'api'",
        ),
        (
            format!(
                "{}[[routes]]\npool = \"api\"\nhost = \"a..b\"\n",
                pool("api")
            ),
            "line 5",
            "invalid host",
        ),
        (
            format!(
                "{}[[routes]]\npool = \"api\"\npath_prefix = \"v1\"\n",
                pool("api")
            ),
            "line 5",
            "invalid path prefix",
        ),
        (
            format!(
                "{}retries = \"x\"\n[[routes]]\npool = \"api\"\n",
                pool("api")
            ),
            "line 3",
            "pools.retries",
        ),
        (
            format!(
                "{}listen = \"127.0.0.1:1\"\n[[routes]]\npool = \"api\"\n",
                pool("api")
            ),
            "line 3",
            "not a per-pool key",
        ),
        (
            format!(
                "[[backends]]\nurl = \"http://127.0.0.1:1\"\n{}[[routes]]\npool = \"api\"\n",
                pool("api")
            ),
            "line 1",
            "put the backends in a pool",
        ),
        (
            format!("{}[[routes]]\npool = \"api\"\ncolour = 1\n", pool("api")),
            "line 5",
            "routes.colour",
        ),
        (
            format!("{}[[routes]]\npool = \"api\"\nmethods = [\"G T\"]\n", pool("api")),
            "line 5",
            "invalid method 'G T'",
        ),
        (
            format!("{}[[routes]]\npool = \"api\"\nstrip_path_prefix = true\n", pool("api")),
            "line 5",
            "needs a path_prefix",
        ),
        (
            format!(
                "{}[[pools.backends]]\nurl = \"http://127.0.0.1:1/\"\n[[pools.backends]]\nurl = \"http://127.0.0.1:1\"\n[[routes]]\npool = \"api\"\n",
                pool("api")
            ),
            "pool 'api'",
            "duplicate backend name '127.0.0.1:1'",
        ),
    ];
    for (i, (text, line, what)) in cases.iter().enumerate() {
        let cfg = config_file("routing", &format!("check{i}"), text);
        let (st, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
        assert_eq!(st.code(), Some(2), "{text}\n{err}");
        // One mistake, one line: no follow-on error about what the mistake left out.
        assert_eq!(err.trim().lines().count(), 1, "{text}\n{err}");
        assert!(
            err.contains(line) && err.contains(what),
            "{text}\nwanted {line}: {what}\ngot {err}"
        );
        let (st, _, err) = run_fulcrum(&[
            "serve",
            "--config",
            cfg.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ]);
        assert_eq!(st.code(), Some(2), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let good = format!(
        "strategy = \"lc\"\n{}strategy = \"rr\"\nhealth = {{ path = \"/hz\" }}\n[[pools.backends]]\nurl = \"http://127.0.0.1:1\"\n\
         [[routes]]\npool = \"api\"\nhost = \"*.example.com\"\npath_prefix = \"/v1\"\nmethods = [\"GET\"]\nheaders = {{ \"x-a\" = \"1\" }}\nstrip_path_prefix = true\n",
        pool("api")
    );
    let cfg = config_file("routing", "good", &good);
    let (st, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
    assert_eq!(st.code(), Some(0), "{err}");
}
