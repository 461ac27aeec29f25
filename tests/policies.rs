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
        ("rate_limit = { rate = 0 }\n", "rate_limit.rate"),
        (
            "rate_limit = { rate = 5, per = \"1 minute\" }\n",
            "rate_limit.per",
        ),
        (
            "rate_limit = { rate = 5, key = \"cookie:s\" }\n",
            "rate_limit.key",
        ),
        (
            "redirect = { to = \"https://x{path}\", status = 200 }\n",
            "redirect.status",
        ),
    ] {
        let cfg = config_file("policies", "bad", &two_routes(extra));
        let (st, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
        assert_eq!(st.code(), Some(2), "{extra}: {err}");
        assert!(
            err.contains("line 9") && err.contains(why),
            "{extra}: {err}"
        );
    }
    // A redirect with a pool: at the route's line.
    let extra = "redirect = { to = \"https://x{path}\" }\n";
    let cfg = config_file("policies", "bad", &two_routes(extra));
    let (st, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(
        err.contains("line 6") && err.contains("has no pool"),
        "{err}"
    );
}

/// Reads one `RateLimit-*` or `Retry-After` field as a number.
fn num(r: &Got, name: &str) -> u64 {
    r.header(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}: {:?}", r.headers))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_answers_429_over_the_limit_per_key_and_never_reaches_the_backend() {
    let api = TestBackend::start("api");
    let web = TestBackend::start("web");
    let limit = "rate_limit = { rate = 2, per = \"1s\", burst = 2, key = \"header:x-api-key\" }\n";
    let cfg = config_file("policies", "rate", &two_routes(limit));
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let c = client();
    for (pool, b) in [("api", &api), ("web", &web)] {
        let body = format!(r#"{{"url": "{}"}}"#, b.url());
        admin(
            &c,
            "POST",
            &f.admin_url(&format!("/admin/pools/{pool}/backends")),
            &body,
        )
        .await;
    }
    let key_a = [("x-api-key", "a")];
    // Burst 2 beyond the rate: three at once, then 429.
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let r = send(&c, "GET", &f.url("/api/x"), &key_a, "").await;
        statuses.push(r.status.as_u16());
        assert_eq!(num(&r, "ratelimit-limit"), 2);
        if r.status == 429 {
            assert!(num(&r, "retry-after") >= 1);
            assert_eq!(num(&r, "ratelimit-remaining"), 0);
            assert_eq!(r.text(), "too many requests\n");
        }
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    assert_eq!(
        api.requests(),
        3,
        "a refused request never reaches the backend"
    );
    // Another key has its own allowance; the other route has no limit.
    let r = send(&c, "GET", &f.url("/api/x"), &[("x-api-key", "b")], "").await;
    assert_eq!(
        (r.status.as_u16(), num(&r, "ratelimit-remaining")),
        (200, 2)
    );
    let r = send(&c, "GET", &f.url("/page"), &key_a, "").await;
    assert_eq!(
        (r.status.as_u16(), r.header("ratelimit-limit")),
        (200, None)
    );
    // Half a second later the steady rate lets one more through.
    tokio::time::sleep(std::time::Duration::from_millis(550)).await;
    let r = send(&c, "GET", &f.url("/api/x"), &key_a, "").await;
    assert_eq!(r.status, 200);
    let m = get(&c, &f.admin_url("/metrics")).await.text();
    assert!(
        m.contains("fulcrum_rate_limited_total{route=\"0\"} 2"),
        "{m}"
    );
    assert!(
        !m.contains("fulcrum_rate_limited_total{route=\"1\"}"),
        "{m}"
    );
    let routes = get(&c, &f.admin_url("/admin/routes")).await.json();
    assert_eq!(
        routes[0]["rate_limit"]["key"], "header:x-api-key",
        "{routes}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_route_answers_with_its_location_and_reaches_no_pool() {
    let web = TestBackend::start("web");
    let cfg = config_file(
        "policies",
        "redirect",
        "[[pools]]\nname = \"web\"\n\n\
         [[routes]]\nhost = \"old.example.com\"\nredirect = { to = \"https://new.example.com{path}{query}\", status = 301 }\n\n\
         [[routes]]\nhost = \"plain.example\"\nredirect = { to = \"{scheme}://www.{host}{path}\" }\n\n\
         [[routes]]\npool = \"web\"\n",
    );
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let c = client();
    let body = format!(r#"{{"url": "{}"}}"#, web.url());
    admin(&c, "POST", &f.admin_url("/admin/pools/web/backends"), &body).await;
    let r = send(
        &c,
        "GET",
        &f.url("/a/b?x=1&y=2"),
        &[("host", "old.example.com")],
        "",
    )
    .await;
    assert_eq!(r.status, 301);
    assert_eq!(
        r.header("location"),
        Some("https://new.example.com/a/b?x=1&y=2")
    );
    let r = send(
        &c,
        "POST",
        &f.url("/form"),
        &[("host", "plain.example")],
        "a=1",
    )
    .await;
    assert_eq!(r.status, 308, "the default keeps the method");
    assert_eq!(r.header("location"), Some("http://www.plain.example/form"));
    assert_eq!(web.requests(), 0, "a redirect reaches no pool");
    assert_eq!(get(&c, &f.url("/")).await.backend(), "web");
    let routes = get(&c, &f.admin_url("/admin/routes")).await.json();
    assert!(routes[0].get("pool").is_none(), "{routes}");
    assert_eq!(routes[0]["redirect"]["status"], 301, "{routes}");
    let mut bad = routes.clone();
    bad[0]["pool"] = serde_json::json!("web");
    let put = admin(&c, "PUT", &f.admin_url("/admin/routes"), &bad.to_string()).await;
    assert_eq!(put.status, 400, "{}", put.text());
    assert!(put.text().contains("has no pool"), "{}", put.text());
    // Sent back as it was shown: taken.
    let put = admin(
        &c,
        "PUT",
        &f.admin_url("/admin/routes"),
        &routes.to_string(),
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_lets_good_credentials_through_and_answers_401_otherwise() {
    use base64::Engine;
    let api = TestBackend::start("api");
    let dir = config_file("policies", "auth", "");
    let users = dir.with_file_name("htpasswd");
    let hash = bcrypt::hash("s3cret", 6).unwrap();
    std::fs::write(&users, format!("# ops\nalice:{hash}\n")).unwrap();
    let auth = format!(
        "basic_auth = {{ realm = \"ops\", users_file = \"{}\" }}\n",
        users.display()
    );
    let cfg = config_file("policies", "auth", &two_routes(&auth));
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let c = client();
    let body = format!(r#"{{"url": "{}"}}"#, api.url());
    admin(&c, "POST", &f.admin_url("/admin/pools/api/backends"), &body).await;
    let basic = |u: &str, p: &str| {
        let t = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
        format!("Basic {t}")
    };
    for h in [
        None,
        Some(basic("alice", "wrong")),
        Some(basic("bob", "s3cret")),
    ] {
        let headers: Vec<(&str, &str)> = h.iter().map(|v| ("authorization", v.as_str())).collect();
        let r = send(&c, "GET", &f.url("/api/x"), &headers, "").await;
        assert_eq!(r.status, 401, "{h:?}");
        assert_eq!(r.header("www-authenticate"), Some("Basic realm=\"ops\""));
    }
    assert_eq!(api.requests(), 0);
    let good = basic("alice", "s3cret");
    for _ in 0..3 {
        let r = send(&c, "GET", &f.url("/api/x"), &[("authorization", &good)], "").await;
        assert_eq!(r.status, 200);
    }
    assert_eq!(api.requests(), 3);
    let routes = get(&c, &f.admin_url("/admin/routes")).await.json();
    assert_eq!(routes[0]["basic_auth"]["realm"], "ops", "{routes}");
    assert!(
        !routes.to_string().contains(&hash),
        "the users file's content is never shown"
    );
    // The file is read again on reload: alice's new password only.
    std::fs::write(
        &users,
        format!("alice:{}\n", bcrypt::hash("n3w", 6).unwrap()),
    )
    .unwrap();
    let r = admin(&c, "POST", &f.admin_url("/admin/reload"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(&c, "GET", &f.url("/api/x"), &[("authorization", &good)], "").await;
    assert_eq!(
        r.status, 401,
        "the old password is forgotten with the old file"
    );
    let r = send(
        &c,
        "GET",
        &f.url("/api/x"),
        &[("authorization", &basic("alice", "n3w"))],
        "",
    )
    .await;
    assert_eq!(r.status, 200);
}

#[test]
fn bad_users_files_are_refused_with_their_line() {
    let dir = config_file("policies", "authbad", "");
    let users = dir.with_file_name("htpasswd");
    std::fs::write(&users, "alice:$apr1$abc$0123456789\n").unwrap();
    for (file, why) in [
        (
            users.display().to_string(),
            "line 1: user 'alice' has a hash that is not bcrypt",
        ),
        (
            "/nonexistent/htpasswd".to_string(),
            "cannot read '/nonexistent/htpasswd'",
        ),
    ] {
        let auth = format!("basic_auth = {{ realm = \"ops\", users_file = \"{file}\" }}\n");
        let cfg = config_file("policies", "authbad", &two_routes(&auth));
        let (st, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
        assert_eq!(st.code(), Some(2), "{err}");
        assert!(err.contains("line 9") && err.contains(why), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_connections_has_the_new_one_closed() {
    use std::io::{Read, Write};
    let b = TestBackend::start("b");
    let f = Fulcrum::over(&[&b], &["--max-connections-per-client", "2"]);
    let c = client();
    let get_on = |s: &mut std::net::TcpStream| -> String {
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(3)))
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = s.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let mut one = std::net::TcpStream::connect(f.proxy).unwrap();
    let mut two = std::net::TcpStream::connect(f.proxy).unwrap();
    assert!(get_on(&mut one).starts_with("HTTP/1.1 200"));
    assert!(get_on(&mut two).starts_with("HTTP/1.1 200"));
    let mut three = std::net::TcpStream::connect(f.proxy).unwrap();
    assert_eq!(get_on(&mut three), "", "the third is closed at once");
    let m = get(&c, &f.admin_url("/metrics")).await.text();
    assert!(
        m.contains("fulcrum_client_connections_refused_total 1"),
        "{m}"
    );
    // One goes: a new one is taken again.
    drop(one);
    let ok = eventually(std::time::Duration::from_secs(3), || async {
        let mut s = std::net::TcpStream::connect(f.proxy).unwrap();
        get_on(&mut s).starts_with("HTTP/1.1 200")
    })
    .await;
    assert!(ok);
    assert!(
        get_on(&mut two).starts_with("HTTP/1.1 200"),
        "the others go on"
    );
}

/// A route whose basic auth has alice (password `s3cret`, bcrypt `cost`) in front of
/// `api`; the fulcrum and the `Basic` value of `user:password`.
fn auth_route(api: &TestBackend, tag: &str, cost: u32) -> Fulcrum {
    let users = config_file("policies", tag, "").with_file_name(format!("{tag}.htpasswd"));
    let hash = bcrypt::hash("s3cret", cost).unwrap();
    std::fs::write(&users, format!("alice:{hash}\n")).unwrap();
    let cfg = config_file(
        "policies",
        tag,
        &format!(
            "[[pools]]\nname = \"api\"\nbackends = [{{ url = \"{}\" }}]\n\n\
             [[routes]]\npool = \"api\"\n\
             basic_auth = {{ realm = \"ops\", users_file = \"{}\" }}\n",
            api.url(),
            users.display()
        ),
    );
    Fulcrum::start(&["--config", cfg.to_str().unwrap()])
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    let t = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {t}")
}

/// CPU seconds the process has used (user + system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: f64 = (fields
        .get(11)
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0))
        + (fields
            .get(12)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0));
    ticks / 100.0
}

/// The median time of 15 requests with `auth`, each a 401.
async fn median_401(c: &HttpClient, f: &Fulcrum, auth: &str) -> std::time::Duration {
    let mut times = Vec::new();
    for _ in 0..15 {
        let t = std::time::Instant::now();
        let r = send(c, "GET", &f.url("/x"), &[("authorization", auth)], "").await;
        times.push(t.elapsed());
        assert_eq!(r.status, 401);
    }
    times.sort();
    times[7]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_user_takes_as_long_as_a_wrong_password() {
    let api = TestBackend::start("api");
    // htpasswd -B's own cost, far below the old fixed decoy's 10.
    let f = auth_route(&api, "timing", 5);
    let c = client();
    let wrong = median_401(&c, &f, &basic("alice", "wrong")).await;
    let unknown = median_401(&c, &f, &basic("nosuchuser", "wrong")).await;
    let (a, b) = (wrong.as_secs_f64(), unknown.as_secs_f64());
    eprintln!("medians of 15: wrong password {wrong:?}, unknown user {unknown:?}");
    assert!(
        a.max(b) / a.min(b) <= 1.5,
        "wrong password {wrong:?}, unknown user {unknown:?}"
    );
    // alice's password under another name lets nobody in.
    let r = send(
        &c,
        "GET",
        &f.url("/x"),
        &[("authorization", &basic("bob", "s3cret"))],
        "",
    )
    .await;
    assert_eq!(r.status, 401);
}

/// `n` requests with unknown users on one h2c connection to `f`, sent at once: the
/// connection's handle and each request's answer and stream.
async fn unknown_users_over_h2(
    f: &Fulcrum,
    n: usize,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    Vec<(h2::client::ResponseFuture, h2::SendStream<bytes::Bytes>)>,
) {
    let tcp = tokio::net::TcpStream::connect(f.proxy).await.unwrap();
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut h2 = h2.ready().await.unwrap();
    let mut answers = Vec::new();
    for i in 0..n {
        let req = http::Request::get(format!("http://a.test/x/{i}"))
            .header("authorization", basic(&format!("nobody{i}"), "x"))
            .body(())
            .unwrap();
        answers.push(h2.send_request(req, true).unwrap());
        h2 = h2.ready().await.unwrap();
    }
    (h2, answers)
}

/// More h2 streams with unknown users than the cores and the queue of 64 take (100 on
/// 2 cores), each reset 20 ms later: the checks that had not started never start, so
/// fulcrum's CPU stays near what the cores' worth of checks costs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_auth_streams_cost_what_the_cores_run_not_what_was_asked() {
    let api = TestBackend::start("api");
    let f = auth_route(&api, "resets", 7);
    let c = client();
    let pid = f.child.id();
    // One check's cost, for the figure in the failure message.
    let t = std::time::Instant::now();
    let r = send(
        &c,
        "GET",
        &f.url("/x"),
        &[("authorization", &basic("nobody", "x"))],
        "",
    )
    .await;
    assert_eq!(r.status, 401);
    let one = t.elapsed();
    let before = cpu_seconds(pid);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let streams = cores + 98;
    let (h2, answers) = unknown_users_over_h2(&f, streams).await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    for (_, mut stream) in answers {
        stream.send_reset(h2::Reason::CANCEL);
    }
    drop(h2);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let spent = cpu_seconds(pid) - before;
    eprintln!("{spent:.2} CPU-seconds after {streams} reset checks (one check: {one:?})");
    // About one check per core runs; the bound leaves room for a slow machine.
    let bound = 0.5f64.max(cores as f64 * 2.0 * one.as_secs_f64());
    assert!(
        spent <= bound,
        "{spent:.2} CPU-seconds after {streams} reset checks (one check: {one:?})"
    );
    // Still answering.
    let r = send(
        &c,
        "GET",
        &f.url("/x"),
        &[("authorization", &basic("alice", "s3cret"))],
        "",
    )
    .await;
    assert_eq!(r.status, 200);
}

/// More checks at once than the cores run and 64 more wait for: the rest are answered
/// 503 with `Retry-After: 1` at once, the others 401 once checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_past_the_cores_and_the_queue_get_503_at_once() {
    let api = TestBackend::start("api");
    let f = auth_route(&api, "busy", 4);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let streams = cores + 98;
    let (_h2, answers) = unknown_users_over_h2(&f, streams).await;
    let (mut busy, mut refused) = (0, 0);
    for (answer, _) in answers {
        let r = answer.await.unwrap();
        match r.status().as_u16() {
            503 => {
                assert_eq!(r.headers()["retry-after"], "1");
                busy += 1;
            }
            401 => refused += 1,
            other => panic!("{other}"),
        }
    }
    assert_eq!(busy + refused, streams);
    assert!(
        busy >= 1 && refused >= cores,
        "{busy} busy, {refused} refused"
    );
}
