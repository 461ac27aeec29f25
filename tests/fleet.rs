//! Fleet mode (`docs/fleet.md`): three fulcrum instances on one real etcd share pools,
//! backends and routes; a change through one is in force on the others within a
//! second; stale writes get 409; etcd lost, they serve on and refuse writes; back, they
//! resynchronise; the registry follows the instances' leases.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::etcd::{Etcd, Relay};
use common::*;
use serde_json::Value;

/// Starts `n` instances on `store`.
fn fleet(n: usize, store: &str) -> Vec<Fulcrum> {
    (0..n)
        .map(|_| Fulcrum::start(&["--store", store, "--health-interval", "200ms"]))
        .collect()
}

async fn backends(c: &HttpClient, f: &Fulcrum) -> Vec<Value> {
    let v = get(c, &f.admin_url("/admin/backends")).await.json();
    v.as_array().cloned().unwrap_or_default()
}

/// The backend named `name` on `f`, if it has one.
async fn backend_named(c: &HttpClient, f: &Fulcrum, name: &str) -> Option<Value> {
    backends(c, f).await.into_iter().find(|b| b["name"] == name)
}

/// How long until every instance of `others` shows what `cond` wants.
async fn lag<F>(c: &HttpClient, others: &[&Fulcrum], since: Instant, cond: F) -> Duration
where
    F: Fn(Option<Value>) -> bool,
{
    let cond = &cond;
    for f in others {
        let ok = eventually(Duration::from_secs(5), || async move {
            cond(backend_named(c, f, "A").await)
        })
        .await;
        assert!(
            ok,
            "instance {} never caught up; log:\n{}",
            f.admin,
            f.log()
        );
    }
    since.elapsed()
}

async fn store_status(c: &HttpClient, f: &Fulcrum) -> Value {
    status(c, f).await["store"].clone()
}

/// Waits until `f` says it is connected to etcd (or not).
async fn connected(c: &HttpClient, f: &Fulcrum, want: bool) {
    let ok = eventually(Duration::from_secs(10), || async {
        store_status(c, f).await["connected"] == want
    })
    .await;
    assert!(ok, "connected never became {want}; log:\n{}", f.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_one_configuration() {
    let etcd = Etcd::start("share");
    let fs = fleet(3, &etcd.store("shared"));
    let (a, b) = (TestBackend::start("A"), TestBackend::start("B"));
    let c = client();
    for f in &fs {
        connected(&c, f, true).await;
    }
    let [f0, f1, f2] = [&fs[0], &fs[1], &fs[2]];

    // Each lag runs from the moment the write is sent (its answer comes once it is in
    // force on the instance that took it).
    let body = format!(r#"{{"url": "{}", "name": "A"}}"#, a.url());
    let t = Instant::now();
    let r = admin(&c, "POST", &f0.admin_url("/admin/backends"), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.json()["id"].as_u64().unwrap();
    let added = lag(&c, &[f1, f2], t, |b| b.is_some()).await;
    let body = format!(r#"{{"url": "{}", "name": "B"}}"#, b.url());
    let r = admin(&c, "POST", &f2.admin_url("/admin/backends"), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    // The same id everywhere: the store gives it.
    for f in [f1, f2] {
        assert_eq!(backend_named(&c, f, "A").await.unwrap()["id"], id);
    }

    let patch = |body: &'static str, f: &Fulcrum| {
        let url = f.admin_url(&format!("/admin/backends/{id}"));
        let c = c.clone();
        async move { admin(&c, "PATCH", &url, body).await }
    };
    let t = Instant::now();
    let r = patch(r#"{"state": "draining"}"#, f1).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["state"], "draining", "answered once applied here");
    let drained = lag(&c, &[f0, f2], t, |b| {
        b.is_some_and(|b| b["state"] == "draining")
    })
    .await;
    let t = Instant::now();
    let r = patch(r#"{"weight": 7, "state": "active"}"#, f2).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let weighted = lag(&c, &[f0, f1], t, |b| b.is_some_and(|b| b["weight"] == 7)).await;
    println!("in force on the other two instances after: added {added:?}, drained {drained:?}, re-weighted {weighted:?}");
    for d in [added, drained, weighted] {
        assert!(d < Duration::from_secs(1), "{d:?}");
    }

    concurrent_patches_one_wins(&c, &fs, id).await;
    hashing_and_sticky_agree_everywhere(&c, &fs, &a, &b).await;
    a_split_route_reaches_every_instance(&c, &fs).await;
    malformed_values_are_skipped(&c, &etcd, f2).await;
    the_registry_follows_the_leases(&c, fs).await;
}

/// Two PATCHes of one backend through two instances at once: one is written, the
/// other was based on the revision the first replaced, and gets 409 with the value
/// now. (Should the second arrive after the first was applied there, both are
/// sequential writes and succeed: a few tries find the race.)
async fn concurrent_patches_one_wins(c: &HttpClient, fs: &[Fulcrum], id: u64) {
    let mut raced = false;
    for round in 0..10u32 {
        // Both instances at the same revision first.
        let same = eventually(Duration::from_secs(3), || async {
            store_status(c, &fs[0]).await["revision"] == store_status(c, &fs[1]).await["revision"]
        })
        .await;
        assert!(same);
        let u0 = fs[0].admin_url(&format!("/admin/backends/{id}"));
        let u1 = fs[1].admin_url(&format!("/admin/backends/{id}"));
        let (w0, w1) = (
            format!(r#"{{"weight": {}}}"#, 10 + round),
            format!(r#"{{"weight": {}}}"#, 50 + round),
        );
        let (r0, r1) = tokio::join!(admin(c, "PATCH", &u0, &w0), admin(c, "PATCH", &u1, &w1));
        let mut codes = [r0.status.as_u16(), r1.status.as_u16()];
        codes.sort_unstable();
        assert!(codes[0] == 200, "one of them is written: {codes:?}");
        if codes == [200, 409] {
            let lost = if r0.status == 409 { &r0 } else { &r1 };
            let v = lost.json();
            assert!(
                v["error"].as_str().unwrap().contains("changed meanwhile"),
                "{v}"
            );
            let winner = if r0.status == 200 {
                10 + round
            } else {
                50 + round
            };
            assert_eq!(v["current"]["weight"], winner, "{v}");
            raced = true;
            break;
        }
    }
    assert!(raced, "no two concurrent PATCHes ever met");
}

/// A route split between the pools `api` and `web` (made by the previous step) and
/// mirrored to `web`, put through one instance: each instance holds it, sends half of its
/// requests to each pool and copies each; a split naming a pool etcd does not have is
/// refused.
async fn a_split_route_reaches_every_instance(c: &HttpClient, fs: &[Fulcrum]) {
    let bad = r#"[{"split": [{"pool": "api", "weight": 1}, {"pool": "nowhere", "weight": 1}]}]"#;
    let r = admin(c, "PUT", &fs[0].admin_url("/admin/routes"), bad).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("nowhere"), "{}", r.text());
    let routes = r#"[{"path_prefix": "/split", "split": [{"pool": "api", "weight": 1}, {"pool": "web", "weight": 1}], "mirror": {"pool": "web", "compare": true}}, {"pool": "default"}]"#;
    let r = admin(c, "PUT", &fs[1].admin_url("/admin/routes"), routes).await;
    assert_eq!(r.status, 200, "{}", r.text());
    for f in fs {
        let ok = eventually(Duration::from_secs(2), || async {
            let v = get(c, &f.admin_url("/admin/routes")).await.json();
            v[0]["split"][1]["pool"] == "web" && v[0]["mirror"]["pool"] == "web"
        })
        .await;
        assert!(ok, "{}", f.log());
        for _ in 0..10 {
            assert_eq!(get(c, &f.url("/split/x")).await.status, 200);
        }
        let v = get(c, &f.admin_url("/admin/routes")).await.json();
        let taken = &v[0]["split_taken"];
        assert_eq!(
            (taken["api"].as_u64(), taken["web"].as_u64()),
            (Some(5), Some(5)),
            "{v}"
        );
        // Its mirror too: each instance copies its own requests.
        let copied = eventually(Duration::from_secs(5), || async {
            let m = get(c, &f.admin_url("/admin/routes/0/mirror")).await.json();
            m["mirrored"] == 10 && m["compared"] == 10
        })
        .await;
        assert!(
            copied,
            "{}",
            get(c, &f.admin_url("/admin/routes/0/mirror")).await.text()
        );
    }
}

/// A pool hashing on a header and one with sticky cookies, routed by path: the same
/// key and the same cookie reach the same backend through every instance.
async fn hashing_and_sticky_agree_everywhere(
    c: &HttpClient,
    fs: &[Fulcrum],
    a: &TestBackend,
    b: &TestBackend,
) {
    let list = format!(
        r#"[{{"url": "{}", "name": "A"}}, {{"url": "{}", "name": "B"}}]"#,
        a.url(),
        b.url()
    );
    let pools = [
        format!(
            r#"{{"name": "api", "strategy": "maglev", "hash_key": "header:x-user", "backends": {list}}}"#
        ),
        format!(r#"{{"name": "web", "sticky": {{"cookie": "srv"}}, "backends": {list}}}"#),
    ];
    for (i, p) in pools.iter().enumerate() {
        let r = admin(c, "POST", &fs[i].admin_url("/admin/pools"), p).await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let routes = r#"[{"pool": "api", "path_prefix": "/api"}, {"pool": "web", "path_prefix": "/web"}, {"pool": "default"}]"#;
    let r = admin(c, "PUT", &fs[2].admin_url("/admin/routes"), routes).await;
    assert_eq!(r.status, 200, "{}", r.text());
    for f in fs {
        let ok = eventually(Duration::from_secs(2), || async {
            let v = get(c, &f.admin_url("/admin/routes")).await.json();
            v.as_array().is_some_and(|r| r.len() == 3)
        })
        .await;
        assert!(ok, "{}", f.log());
    }
    let mut spread = std::collections::HashSet::new();
    for user in 0..24 {
        let key = format!("user-{user}");
        let mut seen = Vec::new();
        for f in fs {
            let r = send(
                c,
                "GET",
                &f.url("/api/x"),
                &[("x-user", &key)],
                Bytes::new(),
            )
            .await;
            assert_eq!(r.status, 200);
            seen.push(r.backend());
        }
        assert!(seen.iter().all(|s| *s == seen[0]), "{key}: {seen:?}");
        spread.insert(seen[0].clone());
    }
    let api = get(c, &fs[0].admin_url("/admin/pools/api")).await.text();
    assert_eq!(spread.len(), 2, "the keys use both backends: {api}");
    for _ in 0..4 {
        let first = get(c, &fs[0].url("/web/x")).await;
        let cookie = first
            .header("set-cookie")
            .expect("a sticky cookie")
            .to_string();
        let pair = cookie.split(';').next().unwrap().to_string();
        for f in &fs[1..] {
            for _ in 0..3 {
                let r = send(
                    c,
                    "GET",
                    &f.url("/web/x"),
                    &[("cookie", &pair)],
                    Bytes::new(),
                )
                .await;
                assert_eq!(r.backend(), first.backend(), "{pair} through {}", f.proxy);
            }
        }
    }
}

/// A value written into etcd by hand that does not parse: skipped with an event that
/// names its key; the backend keeps its last good version.
async fn malformed_values_are_skipped(c: &HttpClient, etcd: &Etcd, f: &Fulcrum) {
    let before = backend_named(c, f, "B").await.unwrap();
    let mut events = EventStream::open(f);
    etcd.put("shared/backends/default/B", r#"{"url": 7"#);
    let e = events
        .find(Duration::from_secs(3), |e| e["type"] == "store_skipped")
        .expect("an event for the bad value");
    assert_eq!(e["key"], "shared/backends/default/B", "{e}");
    assert!(e["error"].as_str().unwrap().contains("JSON"), "{e}");
    etcd.put(
        "shared/backends/default/B",
        r#"{"url": "http://127.0.0.1:1", "name": "other"}"#,
    );
    let e = events
        .find(Duration::from_secs(3), |e| e["type"] == "store_skipped")
        .expect("an event for the mismatched name");
    assert!(e["error"].as_str().unwrap().contains("other"), "{e}");
    let after = backend_named(c, f, "B").await.unwrap();
    assert_eq!(
        (&after["url"], &after["weight"]),
        (&before["url"], &before["weight"])
    );
    assert_eq!(get(c, &f.url("/")).await.status, 200);
}

/// Every instance is listed once, itself marked; one killed leaves with its lease, one
/// stopped leaves at once.
async fn the_registry_follows_the_leases(c: &HttpClient, mut fs: Vec<Fulcrum>) {
    let fleet_of = |f: &Fulcrum| {
        let url = f.admin_url("/admin/fleet");
        let c = c.clone();
        async move {
            get(&c, &url)
                .await
                .json()
                .as_array()
                .cloned()
                .unwrap_or_default()
        }
    };
    let all = fleet_of(&fs[0]).await;
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(all.iter().filter(|m| m["self"] == true).count(), 1);
    let listens: Vec<String> = fs.iter().map(|f| f.proxy.to_string()).collect();
    for m in &all {
        assert!(
            listens.contains(&m["listen"].as_str().unwrap().to_string()),
            "{m}"
        );
    }
    let same_revision = eventually(Duration::from_secs(3), || async {
        let v = fleet_of(&fs[1]).await;
        v.iter()
            .all(|m| m["revision"] == v[0]["revision"] && m["revision"].as_i64() > Some(0))
    })
    .await;
    assert!(same_revision, "{:?}", fleet_of(&fs[1]).await);
    let mut killed = fs.pop().unwrap();
    let _ = killed.child.kill();
    let t = Instant::now();
    let gone = eventually(Duration::from_secs(10), || async {
        fleet_of(&fs[0]).await.len() == 2
    })
    .await;
    assert!(gone, "{:?}", fleet_of(&fs[0]).await);
    println!(
        "a killed instance left the registry after {:?}",
        t.elapsed()
    );
    let mut stopped = fs.pop().unwrap();
    stopped.signal("TERM");
    assert!(stopped.wait_exit(Duration::from_secs(10)).is_some());
    let left = eventually(Duration::from_secs(2), || async {
        fleet_of(&fs[0]).await.len() == 1
    })
    .await;
    assert!(left, "a stopped instance takes its entry out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_etcd_keeps_the_last_configuration_and_resynchronises() {
    let mut etcd = Etcd::start("loss");
    let relay = Relay::start(&etcd.client);
    let mut fs = fleet(2, &etcd.store("loss"));
    // The third reaches etcd through a relay that the test can cut.
    fs.push(Fulcrum::start(&[
        "--store",
        &relay.store("loss"),
        "--health-interval",
        "200ms",
    ]));
    let a = TestBackend::start("A");
    let c = client();
    for f in &fs {
        connected(&c, f, true).await;
    }
    let body = format!(r#"{{"url": "{}", "name": "A"}}"#, a.url());
    let r = admin(&c, "POST", &fs[0].admin_url("/admin/backends"), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.json()["id"].as_u64().unwrap();
    lag(&c, &[&fs[1], &fs[2]], Instant::now(), |b| b.is_some()).await;
    one_cut_off_catches_up(&c, &fs, &relay, id).await;
    etcd_killed_and_restarted(&c, &fs, &mut etcd, id).await;
}

/// One instance cut off: it says so, serves, refuses writes; a change made meanwhile
/// through another reaches it once it is back.
async fn one_cut_off_catches_up(c: &HttpClient, fs: &[Fulcrum], relay: &Relay, id: u64) {
    let backend = |f: &Fulcrum| f.admin_url(&format!("/admin/backends/{id}"));
    relay.close();
    connected(c, &fs[2], false).await;
    let r = admin(c, "PATCH", &backend(&fs[2]), r#"{"weight": 4}"#).await;
    assert_eq!(r.status, 503, "{}", r.text());
    let r = admin(c, "PATCH", &backend(&fs[0]), r#"{"weight": 9}"#).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(backend_named(c, &fs[2], "A").await.unwrap()["weight"], 1);
    assert_eq!(get(c, &fs[2].url("/")).await.backend(), "A");
    relay.open();
    let t = Instant::now();
    lag(c, &[&fs[2]], t, |b| b.is_some_and(|b| b["weight"] == 9)).await;
    connected(c, &fs[2], true).await;
}

/// etcd itself killed: every instance serves the last configuration and refuses
/// writes; restarted, they all take writes again.
async fn etcd_killed_and_restarted(c: &HttpClient, fs: &[Fulcrum], etcd: &mut Etcd, id: u64) {
    etcd.kill();
    for f in fs {
        connected(c, f, false).await;
        let r = get(c, &f.url("/")).await;
        assert_eq!((r.status.as_u16(), r.backend()), (200, "A".to_string()));
        let body = r#"{"strategy": "least_connections"}"#;
        let r = admin(c, "POST", &f.admin_url("/admin/strategy"), body).await;
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(r.json()["error"].as_str().unwrap().contains("unreachable"));
    }
    etcd.restart();
    for f in fs {
        connected(c, f, true).await;
    }
    let url = fs[2].admin_url(&format!("/admin/backends/{id}"));
    let r = admin(c, "PATCH", &url, r#"{"state": "maintenance"}"#).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let t = Instant::now();
    lag(c, &[&fs[0], &fs[1]], t, |b| {
        b.is_some_and(|b| b["state"] == "maintenance")
    })
    .await;
}

#[test]
fn a_store_refuses_pools_of_its_own_and_bad_urls() {
    let b = TestBackend::start("X");
    let cases: [(&[&str], &str); 3] = [
        (&["--backend", &b.url()], "--backend cannot be used with it"),
        (&[], "invalid store"),
        (&[], "not HOST:PORT"),
    ];
    let stores = [
        "etcd://127.0.0.1:2379/p",
        "http://127.0.0.1:2379/p",
        "etcd://127.0.0.1/p",
    ];
    for ((extra, want), store) in cases.iter().zip(stores) {
        let mut args = vec!["serve", "--store", store];
        args.extend_from_slice(extra);
        let (status, _, err) = run_fulcrum(&args);
        assert_eq!(status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let cfg = config_file(
        "fleet",
        "pools",
        "store = \"etcd://127.0.0.1:2379/p\"\n[[pools]]\nname = \"api\"\n",
    );
    let (status, _, err) = run_fulcrum(&["serve", "--config", cfg.to_str().unwrap()]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("[[pools]] cannot be used with it"), "{err}");
}

/// Connects to `addr` as soon as something listens there (up to 5 s), sends `request`
/// and reads the answer to its end (up to `limit`).
fn when_bound(addr: std::net::SocketAddr, request: &str, limit: Duration) -> String {
    use std::io::{Read, Write};
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut s = loop {
        match std::net::TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(e) => {
                assert!(Instant::now() < deadline, "{addr}: {e}");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    };
    s.set_read_timeout(Some(limit)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_instance_answers_nothing_before_it_has_read_the_store() {
    use std::io::BufRead;
    let etcd = Etcd::start("ready");
    let a = TestBackend::start("A");
    let c = client();
    let seed = Fulcrum::start(&["--store", &etcd.store("ready")]);
    let body = format!(r#"{{"url": "{}", "name": "A"}}"#, a.url());
    let r = admin(&c, "POST", &seed.admin_url("/admin/backends"), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    // The new instance reaches etcd through a relay that opens a second after its start.
    let relay = Relay::start(&etcd.client);
    relay.close();
    let (listen, admin_addr): (std::net::SocketAddr, std::net::SocketAddr) = (
        format!("127.0.0.1:{}", free_port()).parse().unwrap(),
        format!("127.0.0.1:{}", free_port()).parse().unwrap(),
    );
    let mut child = std::process::Command::new(BIN)
        .env_remove("FULCRUM_ADMIN_TOKEN")
        .args(["serve", "--store", &relay.store("ready")])
        .args([
            "--listen",
            &listen.to_string(),
            "--admin",
            &admin_addr.to_string(),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let log2 = std::sync::Arc::clone(&log);
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            log2.lock().unwrap().push_str(&(line + "\n"));
        }
    });
    let status = tokio::task::spawn_blocking(move || {
        when_bound(
            admin_addr,
            "GET /admin/status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            Duration::from_secs(10),
        )
    });
    let proxied = tokio::task::spawn_blocking(move || {
        when_bound(
            listen,
            "GET /first HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            Duration::from_secs(10),
        )
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    relay.open();
    let status = status.await.unwrap();
    let proxied = proxied.await.unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let log = log.lock().unwrap().clone();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}\n{log}");
    assert!(status.contains("\"connected\":true"), "{status}\n{log}");
    assert!(status.contains(&a.url()), "{status}\n{log}");
    assert!(
        proxied.starts_with("HTTP/1.1 200") && proxied.contains("x-backend: A"),
        "{proxied}\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_never_reports_its_own_bookkeeping_as_skipped() {
    let etcd = Etcd::start("own-keys");
    let fs = fleet(2, &etcd.store("own"));
    let c = client();
    for f in &fs {
        connected(&c, f, true).await;
    }
    let mut events = EventStream::open(&fs[1]);
    for i in 0..5 {
        let body = format!(
            r#"{{"url": "http://127.0.0.1:{}", "name": "n{i}"}}"#,
            20000 + i
        );
        let r = admin(&c, "POST", &fs[0].admin_url("/admin/backends"), &body).await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    assert!(
        eventually(Duration::from_secs(3), || async {
            backends(&c, &fs[1]).await.len() == 5
        })
        .await
    );
    let skipped = events.find(Duration::from_millis(500), |e| e["type"] == "store_skipped");
    assert!(skipped.is_none(), "{skipped:?}");
    for f in &fs {
        assert!(!f.log().contains("value skipped"), "{}", f.log());
    }
}
