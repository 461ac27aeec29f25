//! Mirrors and their comparison (`docs/traffic.md`, "Mirrors", "Compare") over real
//! sockets: a slow mirror never delays the client; copies carry `X-Fulcrum-Mirror` and
//! the body, within `body_limit` and `max_in_flight`; a share chosen by request id;
//! compare finds 10 differing bodies in 150 and calls identical pools `same`; the
//! figures over the admin API, reset, kept across a change of the routes; bad values
//! refused.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// Routes to pool `app`; route 0 (`/m`) mirrors to pool `shadow` with `mirror` (the
/// table's inside); route 1 takes the rest without a mirror.
fn config(app: &str, shadow: &str, mirror: &str) -> String {
    format!(
        "[[pools]]\nname = \"app\"\nbackends = [{{ url = \"{app}\" }}]\n\
         [[pools]]\nname = \"shadow\"\nbackends = [{{ url = \"{shadow}\" }}]\n\
         [[routes]]\npath_prefix = \"/m\"\npool = \"app\"\nmirror = {{ pool = \"shadow\", {mirror} }}\n\
         [[routes]]\npool = \"app\"\n"
    )
}

fn start(tag: &str, text: &str, extra: &[&str]) -> Fulcrum {
    let cfg = config_file("mirror", tag, text);
    let mut args = vec![
        "--config",
        cfg.to_str().unwrap(),
        "--health-interval",
        "60s",
    ];
    args.extend_from_slice(extra);
    Fulcrum::start(&args)
}

async fn figures(c: &HttpClient, f: &Fulcrum) -> serde_json::Value {
    let r = admin(c, "GET", &f.admin_url("/admin/routes/0/mirror"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// A bare HTTP/1.1 backend for bodiless requests: each answered after `delay` with the
/// status and body `answer` gives for its target; the heads it got (but probes') are
/// kept.
fn text_backend(
    delay: Duration,
    answer: fn(&str) -> (u16, String),
) -> (String, Arc<Mutex<Vec<String>>>) {
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&heads);
    let addr = scripted_backend(move |head| {
        let target = head.split(' ').nth(1).unwrap_or("/").to_string();
        // Health probes are not counted.
        if target != "/health" {
            seen.lock().unwrap().push(head.to_string());
        }
        std::thread::sleep(delay);
        let (status, body) = answer(&target);
        format!(
            "HTTP/1.1 {status} X\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    });
    (format!("http://{addr}"), heads)
}

/// `item N` for `/m/N`.
fn items(target: &str) -> (u16, String) {
    (
        200,
        format!("item {}", target.rsplit('/').next().unwrap_or("")),
    )
}

/// As [`items`], but every 15th item has changed.
fn items_some_changed(target: &str) -> (u16, String) {
    let n: u64 = target.rsplit('/').next().unwrap_or("").parse().unwrap_or(1);
    match n % 15 {
        0 => (200, format!("item {n}, changed")),
        _ => items(target),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_mirror_never_delays_the_client_and_sees_each_copy_marked() {
    let (app, app_heads) = text_backend(Duration::ZERO, items);
    let (shadow, shadow_heads) = text_backend(Duration::from_millis(300), items);
    let f = start("slow", &config(&app, &shadow, "percent = 100"), &[]);
    let c = client();
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let t = Instant::now();
        let r = send(
            &c,
            "GET",
            &f.url(&format!("/m/{i}")),
            &[("x-fulcrum-mirror", "forged")],
            "",
        )
        .await;
        slowest = slowest.max(t.elapsed());
        assert_eq!((r.status.as_u16(), r.text()), (200, format!("item {i}")));
    }
    assert!(
        slowest < Duration::from_millis(150),
        "a client waited {slowest:?}\n{}",
        f.log()
    );
    // Each copy arrives, marked; the client's own mark never reaches either pool.
    let all = eventually(Duration::from_secs(10), || async {
        shadow_heads.lock().unwrap().len() == 20
    })
    .await;
    assert!(all, "{} copies", shadow_heads.lock().unwrap().len());
    for h in shadow_heads.lock().unwrap().iter() {
        let marks: Vec<&str> = (h.lines())
            .filter(|l| l.to_ascii_lowercase().starts_with("x-fulcrum-mirror:"))
            .collect();
        assert_eq!(marks.len(), 1, "{h}");
        assert!(marks[0].ends_with(": 1"), "{h}");
    }
    for h in app_heads.lock().unwrap().iter() {
        assert!(!h.to_ascii_lowercase().contains("x-fulcrum-mirror"), "{h}");
    }
    // A route without a mirror drops the client's mark too.
    let r = send(
        &c,
        "GET",
        &f.url("/other"),
        &[("X-Fulcrum-Mirror", "1")],
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    let last = app_heads.lock().unwrap().last().cloned().unwrap();
    assert!(last.starts_with("GET /other"), "{last}");
    assert!(
        !last.to_ascii_lowercase().contains("x-fulcrum-mirror"),
        "{last}"
    );
    let m = figures(&c, &f).await;
    assert_eq!(
        (m["mirrored"].as_u64(), m["skipped"].as_u64()),
        (Some(20), Some(0)),
        "{m}"
    );
    assert_eq!(m["verdict"], "insufficient");
    let sent = "fulcrum_mirror_requests_total{route=\"0\",result=\"sent\"}";
    assert_eq!(metric(&f, sent).await, 20);
    // Without compare, the figures stay empty; a route without a mirror has none.
    assert_eq!(m["compared"], 0);
    let r = admin(&c, "GET", &f.admin_url("/admin/routes/1/mirror"), "").await;
    assert_eq!(r.status, 404, "{}", r.text());
    let r = admin(&c, "GET", &f.admin_url("/admin/routes/9/mirror"), "").await;
    assert_eq!(r.status, 404, "{}", r.text());
}

/// Waits for `mirror` to have got a body of `len` bytes.
async fn copied_body(mirror: &TestBackend, len: u64) {
    let got = || {
        mirror
            .stats
            .last_body_len
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    let copied = eventually(Duration::from_secs(5), || async { got() == len }).await;
    assert!(copied, "the mirror got {} bytes, not {len}", got());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_are_bounded_in_flight_and_by_body() {
    let app = TestBackend::start("app");
    let shadow = TestBackend::start("shadow");
    let mirror = "body_limit = \"4k\", max_in_flight = 2";
    // Route 1 mirrors `/sleep/…` the same way: the backends take their time there.
    let slow = format!(
        "[[routes]]\npath_prefix = \"/sleep\"\npool = \"app\"\nmirror = {{ pool = \"shadow\", {mirror} }}\n"
    );
    let text = config(&app.url(), &shadow.url(), mirror).replace(
        "[[routes]]\npool = \"app\"\n",
        &format!("{slow}[[routes]]\npool = \"app\"\n"),
    );
    let f = start("bounds", &text, &[]);
    let c = client();
    // A 3 kB body is copied whole.
    let body = "b".repeat(3000);
    let r = send(&c, "POST", &f.url("/m/post"), &[], body.clone()).await;
    assert_eq!((r.status.as_u16(), r.backend()), (200, "app".to_string()));
    copied_body(&shadow, 3000).await;
    // The same over HTTP/2 (h2c, curl), its body a stream of the h2 front end's.
    let out = std::process::Command::new("curl")
        .args(["-s", "--http2-prior-knowledge", "-w", " %{http_version}"])
        .args(["--data-binary", &"h".repeat(2500)])
        .arg(f.url("/m/post"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.ends_with(" 2"), "{text}");
    copied_body(&shadow, 2500).await;
    // A 10 kB body is not copied, stated or streamed; the client is served all the same.
    let before = shadow.requests();
    let big = "c".repeat(10_000);
    let r = send(&c, "POST", &f.url("/m/post"), &[], big.clone()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-body-len"), Some("10000"));
    let chunked = format!("{:x}\r\n{big}\r\n0\r\n\r\n", big.len());
    let head = format!(
        "POST /m/post HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{chunked}"
    );
    let answer = raw_exchange(f.proxy, head.as_bytes(), Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("x-body-len: 10000"), "{answer}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        shadow.requests(),
        before,
        "no copy of a body over the limit"
    );
    let m = figures(&c, &f).await;
    assert_eq!(m["skipped"], 2, "{m}");
    // At most 2 copies on their way: slow ones fill the places, the rest are skipped.
    let fire: Vec<_> = (0..8)
        .map(|_| {
            let (c, url) = (c.clone(), f.url("/sleep/400"));
            tokio::spawn(async move { get(&c, &url).await.status.as_u16() })
        })
        .collect();
    for h in fire {
        assert_eq!(h.await.unwrap(), 200);
    }
    let slow = admin(&c, "GET", &f.admin_url("/admin/routes/1/mirror"), "")
        .await
        .json();
    let skipped = slow["skipped"].as_u64().unwrap();
    assert!(
        skipped >= 4,
        "only {skipped} of 8 skipped with 2 places: {slow}"
    );
    let gone = eventually(Duration::from_secs(5), || async {
        let m = admin(&c, "GET", &f.admin_url("/admin/routes/1/mirror"), "")
            .await
            .json();
        m["in_flight"] == 0
    })
    .await;
    assert!(gone, "every place came free");
    // Every copy that had a place was sent (counted in its task).
    let slow = admin(&c, "GET", &f.admin_url("/admin/routes/1/mirror"), "")
        .await
        .json();
    assert_eq!(slow["mirrored"].as_u64().unwrap() + skipped, 8, "{slow}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_share_follows_the_request_id() {
    let (app, _) = text_backend(Duration::ZERO, items);
    let (shadow, shadow_heads) = text_backend(Duration::ZERO, items);
    // Request ids from 127.0.0.1 are believed.
    let f = start(
        "share",
        &config(&app, &shadow, "percent = 30"),
        &["--trusted-proxies", "127.0.0.1/32"],
    );
    let c = client();
    for i in 0..200 {
        let r = get(&c, &f.url(&format!("/m/{i}"))).await;
        assert_eq!(r.status, 200);
    }
    let done = eventually(Duration::from_secs(5), || async {
        let m = figures(&c, &f).await;
        m["mirrored"].as_u64() == Some(shadow_heads.lock().unwrap().len() as u64)
    })
    .await;
    assert!(done);
    let n = shadow_heads.lock().unwrap().len();
    assert!((30..=95).contains(&n), "30 % of 200 copied: {n}");
    // One id is always copied or never.
    for id in ["order-1", "order-2", "order-3", "order-4"] {
        let before = shadow_heads.lock().unwrap().len();
        for _ in 0..5 {
            let r = send(&c, "GET", &f.url("/m/1"), &[("x-request-id", id)], "").await;
            assert_eq!(r.status, 200);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let copied = shadow_heads.lock().unwrap().len() - before;
        assert!(copied == 0 || copied == 5, "{id}: {copied} of 5");
        // Explain says the same for the id, without sending anything.
        let q = serde_json::json!({"path": "/m/1", "headers": {"x-request-id": id}});
        let url = f.admin_url("/admin/explain");
        let e = admin(&c, "POST", &url, &q.to_string()).await.json();
        assert_eq!(e["mirror"]["mirrored"], copied == 5, "{id}: {e}");
        assert_eq!(e["mirror"]["pool"], "shadow");
    }
    // Without an id, only the id drawn for the request would decide.
    let e = admin(
        &c,
        "POST",
        &f.admin_url("/admin/explain"),
        r#"{"path": "/m/1"}"#,
    )
    .await;
    assert!(e.json()["mirror"]["mirrored"].is_null(), "{}", e.text());
    assert_eq!(e.json()["mirror"]["percent"], 30.0);
}

/// Sends `/m/1` … `/m/150` and waits for the figures to have compared them all.
async fn compare_150(c: &HttpClient, f: &Fulcrum) -> serde_json::Value {
    for i in 1..=150 {
        let r = get(c, &f.url(&format!("/m/{i}"))).await;
        assert_eq!((r.status.as_u16(), r.text()), (200, format!("item {i}")));
    }
    let all = eventually(Duration::from_secs(10), || async {
        figures(c, f).await["compared"] == 150
    })
    .await;
    let m = figures(c, f).await;
    assert!(all, "{m}");
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_finds_ten_differing_bodies_in_150() {
    let (app, _) = text_backend(Duration::from_millis(2), items);
    let (shadow, _) = text_backend(Duration::from_millis(2), items_some_changed);
    let f = start("differs", &config(&app, &shadow, "compare = true"), &[]);
    let mut events = EventStream::open(&f);
    let c = client();
    let m = compare_150(&c, &f).await;
    assert_eq!(m["body_mismatch"], 10, "{m}");
    assert_eq!(m["status_mismatch"], 0, "{m}");
    assert_eq!(m["verdict"], "differs", "{m}");
    let examples = m["examples"].as_array().unwrap();
    assert_eq!(examples.len(), 10);
    assert_eq!(examples[0]["path"], "/m/150", "the latest first: {m}");
    assert_eq!(examples[0]["primary_status"], 200);
    assert!(examples
        .iter()
        .all(|e| e["request_id"].as_str().is_some_and(|s| s.len() >= 16)));
    let changed = events.find(Duration::from_secs(5), |e| {
        e["type"] == "mirror_verdict" && e["verdict"] == "differs"
    });
    let changed = changed.expect("an event for the verdict");
    assert_eq!(
        (changed["route"].as_u64(), changed["pool"].as_str()),
        (Some(0), Some("shadow"))
    );
    // DELETE starts afresh.
    let r = admin(&c, "DELETE", &f.admin_url("/admin/routes/0/mirror"), "").await;
    assert_eq!(r.status, 200);
    let m = figures(&c, &f).await;
    assert_eq!(
        (m["compared"].as_u64(), m["verdict"].as_str()),
        (Some(0), Some("insufficient"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_pools_are_the_same_and_the_figures_survive_a_change_of_routes() {
    let (app, _) = text_backend(Duration::from_millis(20), items);
    let (shadow, _) = text_backend(Duration::from_millis(20), items);
    let f = start("same", &config(&app, &shadow, "compare = true"), &[]);
    let c = client();
    let m = compare_150(&c, &f).await;
    assert_eq!(
        (m["status_mismatch"].as_u64(), m["body_mismatch"].as_u64()),
        (Some(0), Some(0)),
        "{m}"
    );
    assert_eq!(m["verdict"], "same", "{m}");
    let p99 = m["latency_p99_ratio"].as_f64().unwrap();
    assert!((0.7..1.2).contains(&p99), "{m}");
    let latency = &m["latency"];
    let sum = |side: &str| {
        latency[side]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!((sum("primary"), sum("mirror")), (150, 150), "{m}");
    // The routes as given back, with the mirror at another share: the figures stay.
    let routes = admin(&c, "GET", &f.admin_url("/admin/routes"), "")
        .await
        .json();
    assert_eq!(routes[0]["mirror"]["pool"], "shadow", "{routes}");
    let mut changed = routes.clone();
    changed[0]["mirror"]["percent"] = 50.into();
    let put = |v: &serde_json::Value| {
        let (c, url, body) = (c.clone(), f.admin_url("/admin/routes"), v.to_string());
        async move { admin(&c, "PUT", &url, &body).await }
    };
    let r = put(&changed).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let m = figures(&c, &f).await;
    assert_eq!(
        (m["compared"].as_u64(), m["percent"].as_f64()),
        (Some(150), Some(50.0)),
        "{m}"
    );
    // A bad share is refused and nothing changes.
    changed[0]["mirror"]["percent"] = 101.into();
    let r = put(&changed).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("percent"), "{}", r.text());
    assert_eq!(figures(&c, &f).await["percent"], 50.0);
    // A mirror's pool cannot be removed while the mirror names it.
    let r = admin(&c, "DELETE", &f.admin_url("/admin/pools/shadow"), "").await;
    assert_eq!(r.status, 409, "{}", r.text());
}

#[test]
fn bad_mirrors_are_refused_naming_the_key() {
    for (tag, mirror, says) in [
        ("percent", "percent = 101", "percent"),
        ("negative", "percent = -5", "percent"),
        ("compare", "compare = \"yes\"", "compare"),
        ("flight", "max_in_flight = 0", "max_in_flight"),
        ("key", "speed = 2", "speed"),
    ] {
        let text = config("http://127.0.0.1:1", "http://127.0.0.1:2", mirror);
        let cfg = config_file("mirror", &format!("bad-{tag}"), &text);
        let (status, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
        assert_eq!(status.code(), Some(2), "{tag}: {err}");
        assert!(err.contains("mirror") && err.contains(says), "{tag}: {err}");
        assert!(err.contains("line"), "{tag}: {err}");
    }
    // An unknown pool.
    let text = config("http://127.0.0.1:1", "http://127.0.0.1:2", "percent = 5")
        .replace("pool = \"shadow\", percent", "pool = \"nowhere\", percent");
    let cfg = config_file("mirror", "bad-pool", &text);
    let (status, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("nowhere"), "{err}");
}

/// `{"item": N, "at": <a count of its own>}`: the same item, a different time stamp on
/// each side and each request.
fn stamped(target: &str) -> (u16, String) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let at = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let n = target.rsplit('/').next().unwrap_or("");
    (
        200,
        format!("{{\"at\": {at}, \"item\": \"{n}\", \"meta\": {{\"trace\": \"{at}\"}}}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_noise_is_ignored_and_a_broken_mirror_harms_no_client() {
    let (app, _) = text_backend(Duration::ZERO, stamped);
    let (shadow, _) = text_backend(Duration::ZERO, stamped);
    // Route 0 ignores the stamps; route 1 (`/raw`) compares the bodies whole; route 2
    // (`/gone`) mirrors to a pool whose one backend refuses every connection.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let text = format!(
        "{}[[pools]]\nname = \"gone\"\nbackends = [{{ url = \"http://{closed}\" }}]\n\
         [[routes]]\npath_prefix = \"/raw\"\npool = \"app\"\nmirror = {{ pool = \"shadow\", compare = true }}\n\
         [[routes]]\npath_prefix = \"/gone\"\npool = \"app\"\nmirror = {{ pool = \"gone\", compare = true }}\n",
        config(&app, &shadow, "compare = { ignore_json = [\"at\", \"meta.trace\"] }")
            .replace("[[routes]]\npool = \"app\"\n", "")
    ) + "[[routes]]\npool = \"app\"\n";
    let f = start("noise", &text, &[]);
    let c = client();
    for i in 0..20 {
        for prefix in ["/m", "/raw", "/gone"] {
            let r = get(&c, &f.url(&format!("{prefix}/{i}"))).await;
            assert_eq!(r.status, 200, "{prefix}: {}", r.text());
            assert!(
                r.text().contains(&format!("\"item\": \"{i}\"")),
                "{}",
                r.text()
            );
        }
    }
    let route = |i: usize| {
        let (c, url) = (c.clone(), f.admin_url(&format!("/admin/routes/{i}/mirror")));
        async move { admin(&c, "GET", &url, "").await.json() }
    };
    let done = eventually(Duration::from_secs(10), || async {
        route(0).await["compared"] == 20 && route(1).await["compared"] == 20
    })
    .await;
    assert!(done, "{} {}", route(0).await, route(1).await);
    let (ignoring, whole) = (route(0).await, route(1).await);
    assert_eq!(ignoring["body_mismatch"], 0, "{ignoring}");
    assert_eq!(ignoring["ignored"], serde_json::json!(["at", "meta.trace"]));
    assert_eq!(whole["body_mismatch"], 20, "{whole}");
    let gone = route(2).await;
    assert_eq!(
        (gone["mirror_errors"].as_u64(), gone["compared"].as_u64()),
        (Some(20), Some(0)),
        "{gone}"
    );
    let errors = "fulcrum_mirror_requests_total{route=\"2\",result=\"error\"}";
    assert_eq!(metric(&f, errors).await, 20);
}
