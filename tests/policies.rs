//! Route policies over real sockets (`docs/policies.md`): real fulcrum processes and
//! real backends.

mod common;

use common::*;

fn two_routes(extra: &str) -> String {
    format!(
        "[[pools]]\nname = \"api\"\n[[pools]]\nname = \"web\"\n\n\
         [[routes]]\npool = \"api\"\npath_prefix = \"/api\"\n{extra}\n\
         [[routes]]\npool = \"web\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_and_response_headers_are_set_and_removed_on_their_route_only() {
    let api = TestBackend::start("api");
    let web = TestBackend::start("web");
    let policies = "request_headers = { set = { \"x-env\" = \"prod\", \"x-client\" = \"{client_ip} for {host}\" }, remove = [\"x-debug\"] }\n\
                    response_headers = { set = { \"strict-transport-security\" = \"max-age=63072000\" }, remove = [\"x-method\"] }\n";
    let cfg = config_file("policies", "headers", &two_routes(policies));
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let c = client();
    for (pool, b) in [("api", &api), ("web", &web)] {
        let body = format!(r#"{{"url": "{}"}}"#, b.url());
        let r = admin(
            &c,
            "POST",
            &f.admin_url(&format!("/admin/pools/{pool}/backends")),
            &body,
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let req = [("x-debug", "1"), ("x-env", "dev"), ("host", "shop.example")];
    let r = send(&c, "GET", &f.url("/api/items"), &req, "").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("strict-transport-security"),
        Some("max-age=63072000")
    );
    assert_eq!(r.header("x-method"), None, "removed from the answer");
    assert!(
        r.header("x-request-id").is_some(),
        "fulcrum's own fields stay"
    );
    let seen = api.stats.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(seen.get("x-debug"), None);
    assert_eq!(seen["x-env"], "prod");
    assert_eq!(seen["x-client"], "127.0.0.1 for shop.example");
    // The other route runs no policy.
    let r = send(&c, "GET", &f.url("/page"), &req, "").await;
    assert_eq!(
        (r.backend().as_str(), r.header("strict-transport-security")),
        ("web", None)
    );
    assert_eq!(r.header("x-method"), Some("GET"));
    let seen = web.stats.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(
        (
            seen["x-debug"].to_str().unwrap(),
            seen["x-env"].to_str().unwrap()
        ),
        ("1", "dev")
    );
    // The admin API shows them as configured, and takes them back the same way.
    let routes = get(&c, &f.admin_url("/admin/routes")).await.json();
    assert_eq!(
        routes[0]["request_headers"]["set"]["x-env"], "prod",
        "{routes}"
    );
    assert_eq!(
        routes[0]["response_headers"]["remove"][0], "x-method",
        "{routes}"
    );
    assert!(routes[1].get("request_headers").is_none(), "{routes}");
    let mut changed = routes.clone();
    changed[1]["response_headers"] = serde_json::json!({"set": {"x-frame-options": "DENY"}});
    let put = admin(
        &c,
        "PUT",
        &f.admin_url("/admin/routes"),
        &changed.to_string(),
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.text());
    let r = get(&c, &f.url("/page")).await;
    assert_eq!(r.header("x-frame-options"), Some("DENY"));
    // A bad one is refused whole, and nothing changes.
    changed[0]["request_headers"] = serde_json::json!({"set": {"content-length": "0"}});
    let put = admin(
        &c,
        "PUT",
        &f.admin_url("/admin/routes"),
        &changed.to_string(),
    )
    .await;
    assert_eq!(put.status, 400, "{}", put.text());
    assert!(put.text().contains("content-length"), "{}", put.text());
    let after = get(&c, &f.admin_url("/admin/routes")).await.json();
    assert_eq!(
        after[0]["request_headers"]["set"]["x-env"], "prod",
        "{after}"
    );
}

#[test]
fn bad_policies_are_refused_with_their_line() {
    for (extra, why) in [
        (
            "request_headers = { set = { \"transfer-encoding\" = \"x\" } }\n",
            "cannot be set or removed",
        ),
        (
            "response_headers = { add = { \"x\" = \"1\" } }\n",
            "response_headers.add",
        ),
        (
            "request_headers = { set = { \"x-a\" = \"{user}\" } }\n",
            "unknown '{user}'",
        ),
        ("rate_limitt = 5\n", "unknown key 'routes.rate_limitt'"),
    ] {
        let cfg = config_file("policies", "bad", &two_routes(extra));
        let (st, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
        assert_eq!(st.code(), Some(2), "{extra}: {err}");
        assert!(
            err.contains("line 9") && err.contains(why),
            "{extra}: {err}"
        );
    }
}
