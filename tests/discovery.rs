//! Discovery over real sockets: pools that follow a real DNS server (dnsmasq) and a
//! watched file, with real fulcrum processes and real backends.

mod common;

use std::time::{Duration, Instant};

use common::dns::{Dnsmasq, Srv};
use common::*;
use serde_json::Value;

/// `GET /admin/pools/{name}`.
async fn pool(c: &HttpClient, f: &Fulcrum, name: &str) -> Value {
    get(c, &f.admin_url(&format!("/admin/pools/{name}")))
        .await
        .json()
}

/// The URLs of the pool's backends, sorted (none while the pool does not exist).
async fn urls(c: &HttpClient, f: &Fulcrum, name: &str) -> Vec<String> {
    let p = pool(c, f, name).await;
    let none = Vec::new();
    let mut v: Vec<String> = (p["backends"].as_array().unwrap_or(&none).iter())
        .map(|b| b["url"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

/// Waits until the pool's backends are `want` (sorted); how long it took.
async fn until_urls(
    c: &HttpClient,
    f: &Fulcrum,
    name: &str,
    want: &[String],
    limit: Duration,
) -> Duration {
    let t = Instant::now();
    let ok = eventually(limit, || async { urls(c, f, name).await == want }).await;
    assert!(
        ok,
        "pool {name}: {:?}, not {want:?}; pool:\n{}\nlog:\n{}",
        urls(c, f, name).await,
        pool(c, f, name).await,
        f.log()
    );
    t.elapsed()
}

/// Test backends on 127.0.0.2, 127.0.0.3, … with one port: an A pool's addresses.
fn on_addresses(n: u8) -> (u16, Vec<TestBackend>) {
    loop {
        let port = free_port();
        let bound: Result<Vec<_>, _> = (2..2 + n)
            .map(|i| {
                let addr = std::net::SocketAddr::from(([127, 0, 0, i], port));
                std::net::TcpListener::bind(addr).map(drop).map(|_| addr)
            })
            .collect();
        if let Ok(addrs) = bound {
            let bs = (addrs.iter().enumerate())
                .map(|(i, a)| TestBackend::start_on(&format!("b{}", i + 2), *a))
                .collect();
            return (port, bs);
        }
    }
}

fn metric(text: &str, line_start: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a_pool_follows_a_rolling_replacement_with_no_failed_request() {
    let (port, bs) = on_addresses(2);
    let dns = Dnsmasq::start("roll", "127.0.0.2 api.test\n", &[]);
    let c = client();
    let discover = format!("dns=api.test:{port},interval=2s");
    let f = Fulcrum::start(&["--discover", &discover, "--resolvers", &dns.addr()]);
    let u = |i: u8| format!("http://127.0.0.{i}:{port}");
    // Resolved before the first connection is taken.
    assert_eq!(urls(&c, &f, "default").await, [u(2)]);
    let p = pool(&c, &f, "default").await;
    let d = &p["discovery"];
    assert_eq!(
        (d["kind"].as_str(), d["backends"].as_u64()),
        (Some("dns"), Some(1)),
        "{p}"
    );
    assert_eq!(d["target"], format!("api.test:{port}"));
    assert!(
        d["error"].is_null() && d["updated_at"].is_string() && d["next_at"].is_string(),
        "{p}"
    );
    assert_eq!(p["backends"][0]["source"], "dns");
    let load = Load::start(f.proxy, 4, 0);
    // The new address joins while the old one stays, then the old one goes.
    dns.set_hosts("127.0.0.2 api.test\n127.0.0.3 api.test\n");
    let took = until_urls(&c, &f, "default", &[u(2), u(3)], Duration::from_secs(5)).await;
    // TTL 1 s: within a second of the TTL running out, and well within the interval.
    assert!(
        took < Duration::from_millis(2500),
        "followed after {took:?}"
    );
    let served = bs[1].requests();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(bs[1].requests() > served, "the new address takes traffic");
    dns.set_hosts("127.0.0.3 api.test\n");
    until_urls(&c, &f, "default", &[u(3)], Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (ok, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "{} failed of {ok}: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(ok > 100, "only {ok} requests");
    let m = get(&c, &f.admin_url("/metrics")).await.text();
    let changed = metric(
        &m,
        "fulcrum_discovery_updates_total{pool=\"default\",result=\"changed\"}",
    );
    assert!(changed >= 2, "changed = {changed}\n{m}");
    assert!(f
        .log_line(&["discovery changed the backends"], Duration::ZERO)
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_srv_pool_serves_its_primaries_and_fails_over_to_the_backups() {
    let p1 = TestBackend::start("p1");
    let p2 = TestBackend::start("p2");
    let backup = TestBackend::start("backup");
    let rec = |target: &str, b: &TestBackend, priority, weight| Srv {
        name: "_http._tcp.api.test".into(),
        target: target.into(),
        port: b.addr.port(),
        priority,
        weight,
    };
    let dns = Dnsmasq::start(
        "srv",
        "127.0.0.1 p1.api.test\n127.0.0.1 p2.api.test\n127.0.0.1 backup.api.test\n",
        &[
            rec("p1.api.test", &p1, 10, 3),
            rec("p2.api.test", &p2, 10, 0),
            rec("backup.api.test", &backup, 20, 1),
        ],
    );
    let c = client();
    let cfg = config_file(
        "discovery",
        "srv",
        &format!(
            "resolvers = [\"{}\"]\nstrategy = \"weighted_round_robin\"\nhealth_interval = \"200ms\"\nunhealthy_threshold = 1\n\n[[pools]]\nname = \"api\"\ndiscover = {{ srv = \"_http._tcp.api.test\", interval = \"2s\" }}\n\n[[routes]]\npool = \"api\"\n",
            dns.addr()
        ),
    );
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let p = pool(&c, &f, "api").await;
    let bs = p["backends"].as_array().unwrap();
    assert_eq!(bs.len(), 3, "{p}");
    let find = |port: u16| {
        bs.iter()
            .find(|b| b["url"].as_str().unwrap().ends_with(&format!(":{port}")))
            .unwrap_or_else(|| panic!("no backend on port {port}: {p}"))
    };
    let (b1, b2, b3) = (
        find(p1.addr.port()),
        find(p2.addr.port()),
        find(backup.addr.port()),
    );
    assert_eq!(b1["url"], format!("http://p1.api.test:{}", p1.addr.port()));
    assert_eq!(
        (b1["weight"].as_u64(), b2["weight"].as_u64()),
        (Some(3), Some(1)),
        "weight 0 counts as 1"
    );
    assert_eq!(
        (b1["backup"].as_bool(), b3["backup"].as_bool()),
        (Some(false), Some(true))
    );
    assert_eq!(b3["source"], "srv");
    for _ in 0..40 {
        assert_eq!(get(&c, &f.url("/")).await.status, 200);
    }
    assert_eq!(
        backup.requests(),
        0,
        "a backup serves while a primary is up"
    );
    assert!(
        p1.requests() > p2.requests(),
        "weights: {} vs {}",
        p1.requests(),
        p2.requests()
    );
    drop(p1);
    drop(p2);
    let served = eventually(Duration::from_secs(5), || async {
        get(&c, &f.url("/")).await.backend() == "backup"
    })
    .await;
    assert!(
        served,
        "the backup never took over; pool:\n{}",
        pool(&c, &f, "api").await
    );
    assert_eq!(pool(&c, &f, "api").await["picking"], "backups");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_server_down_changes_nothing_and_its_return_is_followed() {
    let (port, bs) = on_addresses(2);
    let mut dns = Dnsmasq::start("down", "127.0.0.2 api.test\n", &[]);
    let c = client();
    let discover = format!("dns=api.test:{port},interval=2s");
    let f = Fulcrum::start(&["--discover", &discover, "--resolvers", &dns.addr()]);
    let u = |i: u8| format!("http://127.0.0.{i}:{port}");
    assert_eq!(urls(&c, &f, "default").await, [u(2)]);
    let id = pool(&c, &f, "default").await["backends"][0]["id"].clone();
    let load = Load::start(f.proxy, 2, 0);
    dns.stop();
    // Each query is tried twice, 2 s each, before a lookup fails.
    let seen = eventually(Duration::from_secs(10), || async {
        pool(&c, &f, "default").await["discovery"]["error"].is_string()
    })
    .await;
    assert!(seen, "no error shown: {}", pool(&c, &f, "default").await);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let p = pool(&c, &f, "default").await;
    assert_eq!(
        urls(&c, &f, "default").await,
        [u(2)],
        "the pool changed: {p}"
    );
    assert_eq!(p["backends"][0]["id"], id);
    assert!(p["discovery"]["error"].is_string(), "{p}");
    let m = get(&c, &f.admin_url("/metrics")).await.text();
    assert!(
        metric(
            &m,
            "fulcrum_discovery_updates_total{pool=\"default\",result=\"error\"}"
        ) >= 3,
        "{m}"
    );
    // Back, with a change: followed within the retry's bound (the interval).
    dns.set_hosts("127.0.0.3 api.test\n");
    dns.restart();
    until_urls(&c, &f, "default", &[u(3)], Duration::from_secs(6)).await;
    assert!(pool(&c, &f, "default").await["discovery"]["error"].is_null());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (ok, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "{} failed of {ok}: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(bs[1].requests() > 0 && bs[0].requests() > 0);
}

/// Writes `text` as the file in place (truncate and write, as an editor without a
/// temporary file does).
fn write_in_place(path: &std::path::Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

/// Writes `text` beside the file and renames it over (as `mv`, Kubernetes' config
/// maps and most deploy tools do).
fn rename_over(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn entries(list: &[(&TestBackend, u32)]) -> String {
    let items: Vec<String> = (list.iter())
        .map(|(b, w)| {
            format!(
                r#"{{"url": "{}", "weight": {w}, "name": "{}"}}"#,
                b.url(),
                b.name
            )
        })
        .collect();
    format!("[{}]", items.join(", "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_source_follows_edits_and_a_broken_file_changes_nothing() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let c = client();
    let dir = config_file("discovery", "file", "");
    let list = dir.with_file_name("backends.json");
    std::fs::write(&list, entries(&[(&a, 1)])).unwrap();
    let cfg = config_file(
        "discovery",
        "file",
        &format!(
            "[[pools]]\nname = \"api\"\ndiscover = {{ file = \"{}\" }}\n\n[[routes]]\npool = \"api\"\n",
            list.display()
        ),
    );
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(urls(&c, &f, "api").await, [a.url()]);
    let a_id = pool(&c, &f, "api").await["backends"][0]["id"].clone();
    // In place, then renamed over: each within a second.
    write_in_place(&list, &entries(&[(&a, 1), (&b, 2)]));
    let mut both = vec![a.url(), b.url()];
    both.sort();
    let took = until_urls(&c, &f, "api", &both, Duration::from_secs(3)).await;
    assert!(
        took < Duration::from_secs(1),
        "an edit in place seen after {took:?}"
    );
    // The admin API: no adding or removing here, but a PATCH sticks.
    let post = admin(
        &c,
        "POST",
        &f.admin_url("/admin/pools/api/backends"),
        &format!(r#"{{"url": "http://127.0.0.1:{}"}}"#, free_port()),
    )
    .await;
    assert_eq!(post.status, 409, "{}", post.text());
    assert!(post.text().contains("file"), "{}", post.text());
    let del = admin(
        &c,
        "DELETE",
        &f.admin_url(&format!("/admin/backends/{a_id}")),
        "",
    )
    .await;
    assert_eq!(del.status, 409, "{}", del.text());
    let patch = admin(
        &c,
        "PATCH",
        &f.admin_url(&format!("/admin/backends/{a_id}")),
        r#"{"state": "draining", "max_conns": 7}"#,
    )
    .await;
    assert_eq!(patch.status, 200, "{}", patch.text());
    rename_over(&list, &entries(&[(&a, 5), (&b, 2)]));
    let reweighted = eventually(Duration::from_secs(2), || async {
        pool(&c, &f, "api").await["backends"][0]["weight"] == 5
    })
    .await;
    assert!(reweighted, "{}", pool(&c, &f, "api").await);
    let pa = &pool(&c, &f, "api").await["backends"][0];
    assert_eq!(
        (
            pa["id"].clone(),
            pa["state"].as_str(),
            pa["max_conns"].as_u64()
        ),
        (a_id.clone(), Some("draining"), Some(7)),
        "{pa}"
    );
    // Broken, half-written, gone: the last good set stays and the error says why.
    for (bad, why) in [
        ("[{\"url\": \"http://127.0.0.1:1\"", "not a JSON list"),
        ("[{\"url\": \"ftp://x\"}]", "entry 0"),
    ] {
        rename_over(&list, bad);
        let shown = eventually(Duration::from_secs(2), || async {
            pool(&c, &f, "api").await["discovery"]["error"]
                .as_str()
                .is_some_and(|e| e.contains(why))
        })
        .await;
        assert!(shown, "{}", pool(&c, &f, "api").await);
        assert_eq!(urls(&c, &f, "api").await, both);
    }
    // A reload that keeps `discover` keeps what it found, ids and all.
    let r = admin(&c, "POST", &f.admin_url("/admin/reload"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    rename_over(&list, &entries(&[(&a, 5)]));
    until_urls(&c, &f, "api", &[a.url()], Duration::from_secs(3)).await;
    assert_eq!(pool(&c, &f, "api").await["backends"][0]["id"], a_id);
}

#[test]
fn bad_discovery_settings_are_refused_with_their_line() {
    let cases = [
        ("[[pools]]\nname = \"api\"\ndiscover = { dns = \"api.test:80\" }\n[[pools.backends]]\nurl = \"http://127.0.0.1:1\"\n", "line 3", "discover and backends"),
        ("discover = { dns = \"api.test\" }\n", "line 1", "NAME:PORT"),
        ("discover = { srv = \"a\", file = \"/x\" }\n", "line 1", "exactly one"),
        ("discover = { srv = \"a\", interval = \"10ms\" }\n", "line 1", "at least 1s"),
        ("discover = { srv = \"a\", scheme = \"gopher\" }\n", "line 1", "scheme"),
        ("discover = { srv = \"a\", color = \"red\" }\n", "line 1", "discover.color"),
        ("[[pools]]\nname = \"pg\"\nmode = \"tcp\"\ndiscover = { dns = \"db.test:5432\", scheme = \"http\" }\n", "line 4", "in a TCP pool"),
        ("[[pools]]\nname = \"web\"\n\ndiscover = { srv = \"a\", scheme = \"tcp\" }\n", "line 4", "mode = \"tcp\""),
        ("discover = { srv = \"a\", scheme = \"tcp\" }\n", "discover", "mode = \"tcp\""),
        ("\n\nresolvers = [\"127.0.0.1:5353\", \"nameserver\"]\n", "line 3", "invalid resolver 'nameserver'"),
    ];
    for (i, (text, line, why)) in cases.iter().enumerate() {
        let cfg = config_file("discovery", &format!("bad{i}"), text);
        let (st, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
        assert_eq!(st.code(), Some(2), "{text}: {err}");
        assert!(err.contains(line) && err.contains(why), "{text}: {err}");
    }
    let (st, _, err) = run_fulcrum(&[
        "serve",
        "--discover",
        "dns=api.test:80",
        "--backend",
        "http://127.0.0.1:1",
    ]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("--discover") && err.contains("both"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // The flags' pool is an HTTP pool.
    let (st, _, err) = run_fulcrum(&["serve", "--discover", "srv=a,scheme=tcp"]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(
        err.contains("--discover") && err.contains("mode = \"tcp\""),
        "{err}"
    );
    let (st, _, err) = run_fulcrum(&["serve", "--discover", "consul=api"]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("discover.consul"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_fleet_mode_discover_is_stored_with_the_pool_and_each_instance_resolves_it() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let etcd = common::etcd::Etcd::start("discover");
    let store = etcd.store("discover");
    let fs: Vec<Fulcrum> = (0..2)
        .map(|_| Fulcrum::start(&["--store", &store]))
        .collect();
    let c = client();
    let list = config_file("discovery", "fleet", "").with_file_name("backends.json");
    std::fs::write(&list, entries(&[(&a, 1)])).unwrap();
    let body = format!(
        r#"{{"name": "api", "discover": {{"file": "{}", "interval": "5s"}}}}"#,
        list.display()
    );
    let made = admin(&c, "POST", &fs[0].admin_url("/admin/pools"), &body).await;
    assert_eq!(made.status, 201, "{}", made.text());
    for f in &fs {
        until_urls(&c, f, "api", &[a.url()], Duration::from_secs(5)).await;
        let p = pool(&c, f, "api").await;
        assert_eq!(p["discovery"]["kind"], "file", "{p}");
        assert_eq!(p["backends"][0]["source"], "file", "{p}");
    }
    let mut events = EventStream::open(&fs[1]);
    std::fs::write(&list, entries(&[(&a, 1), (&b, 1)])).unwrap();
    let ev = events.find(Duration::from_secs(3), |e| e["type"] == "discovery");
    let ev = ev.unwrap_or_else(|| panic!("no discovery event; log:\n{}", fs[1].log()));
    assert_eq!(
        (
            ev["pool"].as_str(),
            ev["added"].clone(),
            ev["removed"].clone()
        ),
        (
            Some("api"),
            serde_json::json!([b.url()]),
            serde_json::json!([])
        ),
        "{ev}"
    );
    let mut both = vec![a.url(), b.url()];
    both.sort();
    for f in &fs {
        until_urls(&c, f, "api", &both, Duration::from_secs(3)).await;
    }
    // A discovered backend is the instance's own: PATCH applies here, not in the store.
    let id = pool(&c, &fs[0], "api").await["backends"][0]["id"].clone();
    let patch = admin(
        &c,
        "PATCH",
        &fs[0].admin_url(&format!("/admin/backends/{id}")),
        r#"{"state": "draining"}"#,
    )
    .await;
    assert_eq!(patch.status, 200, "{}", patch.text());
    let post = admin(
        &c,
        "POST",
        &fs[1].admin_url("/admin/pools/api/backends"),
        &format!(r#"{{"url": "{}"}}"#, b.url()),
    )
    .await;
    assert_eq!(post.status, 409, "{}", post.text());
}

/// A Kubernetes ConfigMap volume: the file is a link through `..data`, a link to a
/// directory of this version, and an update swaps `..data` (no event names the file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_behind_a_swapped_link_is_followed_as_a_config_map_is() {
    use std::os::unix::fs::symlink;
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let c = client();
    let dir = config_file("discovery", "configmap", "").with_file_name("volume");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("..v1")).unwrap();
    std::fs::write(dir.join("..v1/backends.json"), entries(&[(&a, 1)])).unwrap();
    symlink("..v1", dir.join("..data")).unwrap();
    symlink("..data/backends.json", dir.join("backends.json")).unwrap();
    let discover = format!("file={}", dir.join("backends.json").display());
    let f = Fulcrum::start(&["--discover", &discover]);
    assert_eq!(urls(&c, &f, "default").await, [a.url()]);
    std::fs::create_dir_all(dir.join("..v2")).unwrap();
    std::fs::write(dir.join("..v2/backends.json"), entries(&[(&b, 1)])).unwrap();
    symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    let took = until_urls(&c, &f, "default", &[b.url()], Duration::from_secs(3)).await;
    assert!(
        took < Duration::from_secs(1),
        "the swap seen after {took:?}"
    );
}

/// A reload that puts `discover` where a list was, and back: the pool is never empty
/// in between, and the URLs both name keep their backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_between_a_list_and_discover_never_empties_the_pool() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let c = client();
    let list = config_file("discovery", "switch", "").with_file_name("backends.json");
    std::fs::write(&list, entries(&[(&a, 1), (&b, 1)])).unwrap();
    let with_list = format!(
        "[[pools]]\nname = \"api\"\n[[pools.backends]]\nurl = \"{}\"\nname = \"A\"\n\n[[routes]]\npool = \"api\"\n",
        a.url()
    );
    let with_discover = format!(
        "[[pools]]\nname = \"api\"\ndiscover = {{ file = \"{}\" }}\n\n[[routes]]\npool = \"api\"\n",
        list.display()
    );
    let cfg = config_file("discovery", "switch", &with_list);
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let a_id = pool(&c, &f, "api").await["backends"][0]["id"].clone();
    let load = Load::start(f.proxy, 2, 0);
    std::fs::write(&cfg, &with_discover).unwrap();
    let r = admin(&c, "POST", &f.admin_url("/admin/reload"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let mut both = vec![a.url(), b.url()];
    both.sort();
    until_urls(&c, &f, "api", &both, Duration::from_secs(3)).await;
    let p = pool(&c, &f, "api").await;
    assert_eq!(
        (
            p["backends"][0]["id"].clone(),
            p["backends"][0]["source"].as_str()
        ),
        (a_id.clone(), Some("file")),
        "{p}"
    );
    // And back to a list that names A only: A stays (the file's again), B drains.
    std::fs::write(&cfg, &with_list).unwrap();
    let r = admin(&c, "POST", &f.admin_url("/admin/reload"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    until_urls(&c, &f, "api", &[a.url()], Duration::from_secs(3)).await;
    let p = pool(&c, &f, "api").await;
    assert_eq!(
        (
            p["backends"][0]["id"].clone(),
            p["backends"][0]["source"].as_str()
        ),
        (a_id, Some("config")),
        "{p}"
    );
    assert!(p["discovery"].is_null(), "{p}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (ok, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "{} failed of {ok}: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}

/// The pool's discovery error, once it contains `part`.
async fn until_error(c: &HttpClient, f: &Fulcrum, name: &str, part: &str) -> String {
    let ok = eventually(Duration::from_secs(4), || async {
        let p = pool(c, f, name).await;
        p["discovery"]["error"]
            .as_str()
            .is_some_and(|e| e.contains(part))
    })
    .await;
    let p = pool(c, f, name).await;
    assert!(ok, "no error with {part:?}: {p}\nlog:\n{}", f.log());
    p["discovery"]["error"].as_str().unwrap_or("").to_string()
}

/// A link swapped to a FIFO (a reader would wait in `open()` for a writer that never
/// comes): refused as not a regular file, the last good set kept, the next good file
/// applied, and a stop still takes its usual time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_behind_the_link_is_refused_and_never_holds_the_reader_or_a_stop() {
    use std::os::unix::fs::symlink;
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let c = client();
    let dir = config_file("discovery", "fifo", "").with_file_name("fifo-volume");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("v1.json"), entries(&[(&a, 1)])).unwrap();
    let fifo = dir.join("fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.unwrap().success());
    let link = dir.join("backends.json");
    symlink("v1.json", &link).unwrap();
    let discover = format!("file={},interval=1s", link.display());
    let mut f = Fulcrum::start(&["--discover", &discover]);
    assert_eq!(urls(&c, &f, "default").await, [a.url()]);
    let swap = |to: &str| {
        let tmp = dir.join("link.tmp");
        let _ = std::fs::remove_file(&tmp);
        symlink(to, &tmp).unwrap();
        std::fs::rename(&tmp, &link).unwrap();
    };
    swap("fifo");
    let e = until_error(&c, &f, "default", "not a regular file").await;
    assert!(e.contains("backends.json"), "{e}");
    assert_eq!(
        urls(&c, &f, "default").await,
        [a.url()],
        "the last good set"
    );
    std::fs::write(dir.join("v2.json"), entries(&[(&b, 1)])).unwrap();
    swap("v2.json");
    until_urls(&c, &f, "default", &[b.url()], Duration::from_secs(3)).await;
    swap("fifo");
    until_error(&c, &f, "default", "not a regular file").await;
    let t = Instant::now();
    f.signal("TERM");
    let exited = f.wait_exit(Duration::from_secs(10));
    assert!(exited.is_some(), "still running 10 s after SIGTERM");
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
}

/// `max_backends`: a discovered list over it is refused whole (a first one leaves the
/// pool empty, with the error), an added backend over it gets 409, a config over it
/// exits 2 at its line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_takes_at_most_max_backends_from_any_source() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let d = TestBackend::start("D");
    let c = client();
    let path = config_file(
        "discovery",
        "max-list",
        &entries(&[(&a, 1), (&b, 1), (&d, 1)]),
    );
    let cfg = config_file(
        "discovery",
        "max",
        &format!(
            "[[pools]]\nname = \"api\"\nmax_backends = 2\ndiscover = {{ file = \"{}\" }}\n\n\
             [[pools]]\nname = \"web\"\nmax_backends = 1\nbackends = [{{ url = \"{}\" }}]\n\n\
             [[routes]]\npool = \"api\"\npath_prefix = \"/api\"\n[[routes]]\npool = \"web\"\n",
            path.display(),
            a.url()
        ),
    );
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let e = until_error(&c, &f, "api", "max_backends (2)").await;
    assert!(e.contains("3 backends"), "{e}");
    assert!(urls(&c, &f, "api").await.is_empty(), "a first list over it");
    rename_over(&path, &entries(&[(&a, 1), (&b, 1)]));
    until_urls(
        &c,
        &f,
        "api",
        &{
            let mut v = vec![a.url(), b.url()];
            v.sort();
            v
        },
        Duration::from_secs(3),
    )
    .await;
    rename_over(&path, &entries(&[(&a, 1), (&b, 1), (&d, 1)]));
    until_error(&c, &f, "api", "max_backends (2)").await;
    assert_eq!(urls(&c, &f, "api").await.len(), 2, "the last good set");
    let body = format!(r#"{{"url": "{}"}}"#, b.url());
    let r = admin(&c, "POST", &f.admin_url("/admin/pools/web/backends"), &body).await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.json()["error"].as_str().unwrap().contains("max_backends"));
    // A config over it.
    let over = config_file(
        "discovery",
        "max-over",
        &format!(
            "[[pools]]\nname = \"web\"\nmax_backends = 1\n\
             backends = [{{ url = \"{}\" }}, {{ url = \"{}\" }}]\n",
            a.url(),
            b.url()
        ),
    );
    let (st, _, err) = run_fulcrum(&["check", "--config", over.to_str().unwrap()]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("max_backends (1)"), "{err}");
}

/// 300 SRV targets (too many for one UDP answer): their lookups go out a few at a time
/// and all resolve; a record with port 0 is no backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_srv_targets_resolve_and_port_zero_is_no_record() {
    let name = "_http._tcp.many.test";
    let mut hosts = String::new();
    let mut records = Vec::new();
    for i in 0..300u16 {
        hosts.push_str(&format!(
            "127.0.{}.{} t{i}.many.test\n",
            1 + i / 200,
            1 + i % 200
        ));
        records.push(Srv {
            name: name.into(),
            target: format!("t{i}.many.test"),
            port: 20000 + i,
            priority: 10,
            weight: 1,
        });
    }
    records.push(Srv {
        name: name.into(),
        target: "t0.many.test".into(),
        port: 0,
        priority: 0,
        weight: 1,
    });
    let dns = Dnsmasq::start("many", &hosts, &records);
    let c = client();
    let cfg = config_file(
        "discovery",
        "many",
        &format!(
            "resolvers = [\"{}\"]\nhealth_interval = \"60s\"\n\n[[pools]]\nname = \"api\"\n\
             discover = {{ srv = \"{name}\", interval = \"30s\" }}\n\n[[routes]]\npool = \"api\"\n",
            dns.addr()
        ),
    );
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let ok = eventually(Duration::from_secs(10), || async {
        pool(&c, &f, "api").await["backends"]
            .as_array()
            .is_some_and(|b| b.len() == 300)
    })
    .await;
    let p = pool(&c, &f, "api").await;
    assert!(ok, "{}\nlog:\n{}", p["discovery"], f.log());
    let bs = p["backends"].as_array().unwrap();
    assert!(
        bs.iter()
            .all(|b| !b["url"].as_str().unwrap().ends_with(":0")),
        "port 0 is no record"
    );
    assert!(
        bs.iter().all(|b| b["backup"] == false),
        "the port-0 record's priority counts for nothing"
    );
}

/// A TCP backend on `addr` that writes `name` and a newline, then echoes; `false` when
/// the address is taken.
fn tcp_echo_on(addr: std::net::SocketAddr, name: &'static str) -> bool {
    let Ok(listener) = std::net::TcpListener::bind(addr) else {
        return false;
    };
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                use std::io::Write;
                let mut r = conn;
                let Ok(mut w) = r.try_clone() else { return };
                if w.write_all(format!("{name}\n").as_bytes()).is_ok() {
                    let _ = std::io::copy(&mut r, &mut w);
                }
            });
        }
    });
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_pool_follows_dns_with_tcp_backends_and_refuses_http_ones_from_a_file() {
    use std::io::{BufRead, BufReader};
    // A port free on 127.0.0.2 too (checked on 127.0.0.1 only).
    let port = loop {
        let port = free_port();
        if tcp_echo_on(([127, 0, 0, 2], port).into(), "db2") {
            break port;
        }
    };
    let dns = Dnsmasq::start("tcp", "127.0.0.2 db.test\n", &[]);
    let list = std::env::temp_dir().join(format!("fulcrum-disc-tcp-{}.json", std::process::id()));
    std::fs::write(&list, format!(r#"[{{"url": "tcp://127.0.0.2:{port}"}}]"#)).unwrap();
    let (listen, other) = (free_port(), free_port());
    let text = format!(
        "resolvers = [\"{}\"]\n\
         [[pools]]\nname = \"db\"\nmode = \"tcp\"\ndiscover = {{ dns = \"db.test:{port}\" }}\n\
         [[pools]]\nname = \"listed\"\nmode = \"tcp\"\ndiscover = {{ file = \"{}\" }}\n\
         [[tcp_listeners]]\nlisten = \"127.0.0.1:{listen}\"\npool = \"db\"\n\
         [[tcp_listeners]]\nlisten = \"127.0.0.1:{other}\"\npool = \"listed\"\n",
        dns.addr(),
        list.display()
    );
    let cfg = config_file("discovery", "tcp", &text);
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let c = client();
    // The DNS pool's backends are tcp:// (the pool's scheme), as the file's are, and a
    // connection reaches one.
    let want = [format!("tcp://127.0.0.2:{port}")];
    for pool in ["db", "listed"] {
        until_urls(&c, &f, pool, &want, Duration::from_secs(5)).await;
    }
    let s = std::net::TcpStream::connect(("127.0.0.1", listen)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut first = String::new();
    BufReader::new(&s).read_line(&mut first).unwrap();
    assert_eq!(first, "db2\n");
    // A file that names an HTTP backend for the TCP pool changes nothing, and says why.
    rename_over(&list, r#"[{"url": "http://127.0.0.2:80"}]"#);
    let why = until_error(&c, &f, "listed", "in a TCP pool").await;
    assert!(why.contains("http://127.0.0.2:80"), "{why}");
    assert_eq!(urls(&c, &f, "listed").await, want);
    let _ = std::fs::remove_file(&list);
}
