//! Every strategy over real sockets, and the client-IP rule.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;

fn three() -> (TestBackend, TestBackend, TestBackend) {
    (
        TestBackend::start("A"),
        TestBackend::start("B"),
        TestBackend::start("C"),
    )
}

async fn sequence(c: &HttpClient, f: &Fulcrum, n: usize) -> String {
    let mut s = String::new();
    for _ in 0..n {
        let r = get(c, &f.url("/")).await;
        assert_eq!(r.status, 200);
        s.push_str(&r.backend());
    }
    s
}

/// fulcrum over `specs` (as `--backend` values) with `strategy`.
fn start_with(specs: &[String], strategy: &str) -> Fulcrum {
    let mut args: Vec<&str> = Vec::new();
    for s in specs {
        args.extend(["--backend", s]);
    }
    args.extend(["--strategy", strategy]);
    Fulcrum::start(&args)
}

fn weighted(b: &TestBackend, w: u32) -> String {
    format!("{},weight={w}", b.spec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_sequential_and_concurrent() {
    let (a, b, cc) = three();
    let f = start_with(&[a.spec(), b.spec(), cc.spec()], "rr");
    let c = client();
    assert_eq!(sequence(&c, &f, 9).await, "ABCABCABC");
    let mut tasks = Vec::new();
    for _ in 0..300 {
        let c = c.clone();
        let url = f.url("/sleep/20");
        tasks.push(tokio::spawn(async move { get(&c, &url).await.backend() }));
    }
    let mut counts: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        *counts.entry(t.await.unwrap()).or_default() += 1;
    }
    assert_eq!(counts.get("A"), Some(&100), "{counts:?}");
    assert_eq!(counts.get("B"), Some(&100), "{counts:?}");
    assert_eq!(counts.get("C"), Some(&100), "{counts:?}");
    let s = status(&c, &f).await;
    assert_eq!(s["strategy"], "round_robin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smooth_weighted_round_robin_is_nginx_exact() {
    let (a, b, cc) = three();
    let c = client();
    let specs = [weighted(&a, 5), weighted(&b, 3), weighted(&cc, 2)];
    let f = start_with(&specs, "weighted_round_robin");
    assert_eq!(sequence(&c, &f, 20).await, "ABCAABACBAABCAABACBA");
    drop(f);
    let f = start_with(&[weighted(&a, 5), weighted(&b, 1), weighted(&cc, 1)], "wrr");
    assert_eq!(sequence(&c, &f, 7).await, "AABACAA");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patched_weight_rules_the_next_pick() {
    let (a, b, cc) = three();
    let c = client();
    let f = start_with(&[a.spec(), b.spec(), cc.spec()], "wrr");
    assert_eq!(sequence(&c, &f, 3).await, "ABC");
    let r = admin(
        &c,
        "PATCH",
        &f.admin_url("/admin/backends/2"),
        r#"{"weight": 10}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["weight"], 10);
    // Weights 1,1,10: C first, and C takes 10 of every 12.
    let s = sequence(&c, &f, 12).await;
    assert!(s.starts_with('C'), "{s}");
    assert_eq!(s.matches('C').count(), 10, "{s}");
    let r = admin(
        &c,
        "PATCH",
        &f.admin_url("/admin/backends/2"),
        r#"{"weight": 1}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(sequence(&c, &f, 3).await, "ABC");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_connections_breaks_ties_by_index_and_follows_requests_in_flight() {
    let (a, b, cc) = three();
    let c = client();
    let f = start_with(&[a.spec(), b.spec(), cc.spec()], "least_connections");
    assert_eq!(
        sequence(&c, &f, 4).await,
        "AAAA",
        "idle backends tie: lowest index wins"
    );
    // Hold one slow request on A: the next goes to B; hold one there too: the next to C.
    let slow = |c: &HttpClient| {
        let c = c.clone();
        let url = f.url("/sleep/6000");
        tokio::spawn(async move { get(&c, &url).await })
    };
    let s1 = slow(&c);
    assert!(
        eventually(Duration::from_secs(2), || async {
            active_conns(&c, &f).await["A"] == 1
        })
        .await
    );
    assert_eq!(sequence(&c, &f, 2).await, "BB");
    let s2 = slow(&c);
    assert!(
        eventually(Duration::from_secs(2), || async {
            active_conns(&c, &f).await["B"] == 1
        })
        .await
    );
    assert_eq!(sequence(&c, &f, 2).await, "CC");
    assert_eq!(s1.await.unwrap().backend(), "A");
    assert_eq!(s2.await.unwrap().backend(), "B");
    assert!(
        eventually(Duration::from_secs(2), || async {
            active_conns(&c, &f).await.values().all(|&n| n == 0)
        })
        .await
    );
    assert_eq!(sequence(&c, &f, 2).await, "AA");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strategy_switch_keeps_in_flight_counts_and_fails_no_request() {
    let (a, b, cc) = three();
    let c = client();
    let f = start_with(&[a.spec(), b.spec(), cc.spec()], "round_robin");
    let mut slow = Vec::new();
    for _ in 0..9 {
        let c = c.clone();
        let url = f.url("/sleep/6000");
        slow.push(tokio::spawn(async move { get(&c, &url).await }));
    }
    assert!(
        eventually(Duration::from_secs(3), || async {
            active_conns(&c, &f).await.values().sum::<u64>() == 9
        })
        .await
    );
    for (name, canonical) in [
        ("lc", "least_connections"),
        ("wrr", "weighted_round_robin"),
        ("least_connections", "least_connections"),
    ] {
        let r = set_strategy(&c, &f, name).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["strategy"], canonical);
    }
    let got = get(&c, &f.admin_url("/admin/strategy")).await.json();
    assert_eq!(got["strategy"], "least_connections");
    let counts = active_conns(&c, &f).await;
    assert_eq!(counts.values().sum::<u64>(), 9, "{counts:?}");
    assert_eq!(counts["A"], 3, "{counts:?}");
    // Least connections now sees the in-flight counts (3, 3, 3): one more goes to A (lowest
    // index), and the next to B.
    let extra = {
        let c = c.clone();
        let url = f.url("/sleep/3000");
        tokio::spawn(async move { get(&c, &url).await })
    };
    assert!(
        eventually(Duration::from_secs(2), || async {
            active_conns(&c, &f).await["A"] == 4
        })
        .await
    );
    assert_eq!(sequence(&c, &f, 1).await, "B");
    for s in slow {
        assert_eq!(s.await.unwrap().status, 200);
    }
    assert_eq!(extra.await.unwrap().status, 200);
    assert!(
        eventually(Duration::from_secs(2), || async {
            active_conns(&c, &f).await.values().all(|&n| n == 0)
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_strategy_is_refused_with_the_valid_names() {
    let a = TestBackend::start("A");
    let c = client();
    let f = start_with(&[a.spec()], "lc");
    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/strategy"),
        r#"{"strategy": "fastest"}"#,
    )
    .await;
    assert_eq!(r.status, 400);
    let e = r.json()["error"].as_str().unwrap().to_string();
    for name in ["round_robin", "weighted_round_robin", "least_connections"] {
        assert!(e.contains(name), "{e}");
    }
    assert_eq!(
        get(&c, &f.admin_url("/admin/strategy")).await.json()["strategy"],
        "least_connections"
    );
}

// ------------------------------------------------------------------ shared steps

/// Starts a request to `path` that stays in flight, and waits until `backend` shows one
/// more request in flight.
async fn hold(
    c: &HttpClient,
    f: &Fulcrum,
    path: &str,
    backend: &str,
) -> tokio::task::JoinHandle<Got> {
    let before = active_conns(c, f).await[backend];
    let task = {
        let c = c.clone();
        let url = f.url(path);
        tokio::spawn(async move { get(&c, &url).await })
    };
    assert!(
        eventually(Duration::from_secs(3), || async {
            active_conns(c, f).await[backend] > before
        })
        .await,
        "no request in flight on {backend}"
    );
    task
}

/// The backend each of `users` is sent to (header `x-user`).
async fn placement(c: &HttpClient, f: &Fulcrum, users: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for u in users {
        let r = send(c, "GET", &f.url("/"), &[("x-user", u)], "").await;
        assert_eq!(r.status, 200);
        out.push(r.backend());
    }
    out
}

fn users(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("user-{i}")).collect()
}

async fn set_strategy(c: &HttpClient, f: &Fulcrum, name: &str) -> Got {
    admin(
        c,
        "POST",
        &f.admin_url("/admin/strategy"),
        &format!(r#"{{"strategy": "{name}"}}"#),
    )
    .await
}

async fn degrade(c: &HttpClient, f: &Fulcrum, id: u64, latency_ms: u64) {
    let r = admin(
        c,
        "POST",
        &f.admin_url(&format!("/admin/backends/{id}/degrade")),
        &format!(r#"{{"latency_ms": {latency_ms}}}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// `n` tasks sending `GET path` back to back until `until`; returns requests per backend.
async fn load(
    c: &HttpClient,
    f: &Fulcrum,
    n: usize,
    path: &str,
    until: Instant,
) -> HashMap<String, usize> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let c = c.clone();
        let url = f.url(path);
        tasks.push(tokio::spawn(async move {
            let mut seen: HashMap<String, usize> = HashMap::new();
            while Instant::now() < until {
                let r = get(&c, &url).await;
                assert_eq!(r.status, 200);
                *seen.entry(r.backend()).or_default() += 1;
            }
            seen
        }));
    }
    let mut total: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        for (k, v) in t.await.unwrap() {
            *total.entry(k).or_default() += v;
        }
    }
    total
}

// ------------------------------------------------------------------ names

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_name_and_alias_is_accepted_and_reported_by_its_canonical_name() {
    let a = TestBackend::start("A");
    let c = client();
    let f = start_with(&[a.spec()], "rr");
    let names: &[(&str, &[&str])] = &[
        ("round_robin", &["roundrobin", "round-robin", "rr"]),
        ("weighted_round_robin", &["weighted-round-robin", "wrr"]),
        (
            "least_connections",
            &["leastconn", "least-connections", "lc"],
        ),
        ("weighted_least_connections", &["wlc"]),
        ("least_response_time", &["least-response-time", "lrt"]),
        ("peak_ewma", &["p2c_ewma"]),
        ("power_of_two", &["p2c", "least_request"]),
        ("consistent_hash", &["consistent-hash", "ch"]),
        ("ip_hash", &["ip-hash"]),
        ("maglev", &[]),
    ];
    for (canon, aliases) in names {
        for name in std::iter::once(canon).chain(aliases.iter()) {
            let r = set_strategy(&c, &f, name).await;
            assert_eq!(r.status, 200, "{name}: {}", r.text());
            assert_eq!(r.json()["strategy"], *canon, "{name}");
            assert_eq!(get(&c, &f.url("/")).await.status, 200, "{name}");
        }
    }
    let r = set_strategy(&c, &f, "fastest").await;
    assert_eq!(r.status, 400);
    let e = r.json()["error"].as_str().unwrap().to_string();
    for (canon, _) in names {
        assert!(e.contains(canon), "{e}");
    }
    let (st, _, err) = run_fulcrum(&["serve", "--strategy", "bogus"]);
    assert_eq!(st.code(), Some(2));
    assert_eq!(err.lines().count(), 1, "{err}");
    for (canon, _) in names {
        assert!(err.contains(canon), "{err}");
    }
    for (flag, value) in [
        ("--hash-key", "host"),
        ("--trusted-proxies", "10.0.0.0/33"),
        ("--hash-balance-factor", "0.9"),
    ] {
        let (st, _, err) = run_fulcrum(&["serve", flag, value]);
        assert_eq!(st.code(), Some(2), "{flag}");
        assert!(err.contains(flag) && err.contains(value), "{err}");
    }
}

// ------------------------------------------------------------------ load-aware

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_least_connections_divides_in_flight_by_weight() {
    let (a, b) = (TestBackend::start("A"), TestBackend::start("B"));
    let c = client();
    let f = start_with(&[weighted(&a, 2), weighted(&b, 1)], "wlc");
    assert_eq!(sequence(&c, &f, 3).await, "AAA", "idle: lowest index");
    let h1 = hold(&c, &f, "/sleep/5000", "A").await;
    // A 1/2, B 0/1
    assert_eq!(sequence(&c, &f, 2).await, "BB");
    let h2 = hold(&c, &f, "/sleep/5000", "B").await;
    // A 1/2, B 1/1
    assert_eq!(sequence(&c, &f, 1).await, "A");
    let h3 = hold(&c, &f, "/sleep/5000", "A").await;
    // A 2/2 = B 1/1: tie to the lowest index
    assert_eq!(sequence(&c, &f, 1).await, "A");
    let h4 = hold(&c, &f, "/sleep/5000", "A").await;
    // A 3/2 > B 1/1
    assert_eq!(sequence(&c, &f, 1).await, "B");
    for h in [h1, h2, h3, h4] {
        assert_eq!(h.await.unwrap().status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_response_time_measures_each_backend_first_then_prefers_the_fastest() {
    let (a, b, cc) = three();
    let c = client();
    let f = start_with(&[a.spec(), b.spec(), cc.spec()], "lrt");
    degrade(&c, &f, 0, 60).await;
    degrade(&c, &f, 1, 30).await;
    assert_eq!(
        sequence(&c, &f, 3).await,
        "ABC",
        "unsampled backends first, in pool order"
    );
    assert_eq!(sequence(&c, &f, 6).await, "CCCCCC");
    let s = status(&c, &f).await;
    let avg = |i: usize| s["backends"][i]["avg_latency_ms"].as_f64().unwrap();
    assert!(avg(0) >= 60.0 && avg(1) >= 30.0 && avg(2) < 30.0, "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_response_time_finds_a_recovered_backend_with_nobody_acting() {
    let (a, b, cc) = three();
    let c = client();
    let f = start_with(&[a.spec(), b.spec(), cc.spec()], "least_response_time");
    sequence(&c, &f, 3).await;
    degrade(&c, &f, 2, 100).await;
    // Under load C's average climbs and it loses its traffic.
    load(
        &c,
        &f,
        4,
        "/sleep/5",
        Instant::now() + Duration::from_millis(1500),
    )
    .await;
    let slow = load(
        &c,
        &f,
        4,
        "/sleep/5",
        Instant::now() + Duration::from_millis(1500),
    )
    .await;
    let total: usize = slow.values().sum();
    assert!(
        slow.get("C").copied().unwrap_or(0) * 20 < total,
        "a slow C still takes traffic: {slow:?}"
    );
    // C is fast again. Nobody recovers it or touches the pool.
    degrade(&c, &f, 2, 0).await;
    let before = cc.requests();
    let start = Instant::now();
    let mut found = None;
    let until = start + Duration::from_secs(8);
    let watch = async {
        while Instant::now() < until {
            if cc.requests() >= before + 20 {
                found = Some(start.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let (_, _) = tokio::join!(load(&c, &f, 4, "/sleep/5", until), watch);
    let took = found.unwrap_or_else(|| panic!("C got {} requests in 8 s", cc.requests() - before));
    assert!(
        took < Duration::from_secs(5),
        "C took {took:?} to get 20 requests again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peak_ewma_routes_around_a_slow_backend() {
    let (a, b, cc) = three();
    let c = client();
    let f = start_with(&[a.spec(), b.spec(), cc.spec()], "p2c_ewma");
    degrade(&c, &f, 2, 100).await;
    let seen = load(
        &c,
        &f,
        4,
        "/sleep/5",
        Instant::now() + Duration::from_secs(3),
    )
    .await;
    let total: usize = seen.values().sum();
    let share = |n: &str| seen.get(n).copied().unwrap_or(0) as f64 / total as f64;
    assert!(share("C") < 0.05, "{seen:?}");
    assert!(share("A") > 0.3 && share("B") > 0.3, "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_of_two_spreads_concurrent_requests_and_skips_a_draining_backend() {
    let (a, b, cc) = three();
    let c = client();
    let f = start_with(&[a.spec(), b.spec(), cc.spec()], "p2c");
    let mut tasks = Vec::new();
    for _ in 0..300 {
        let c = c.clone();
        let url = f.url("/sleep/100");
        tasks.push(tokio::spawn(async move { get(&c, &url).await.backend() }));
    }
    let mut counts: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        *counts.entry(t.await.unwrap()).or_default() += 1;
    }
    for n in ["A", "B", "C"] {
        let got = counts.get(n).copied().unwrap_or(0);
        assert!((60..=140).contains(&got), "{counts:?}");
    }
    let r = admin(
        &c,
        "PATCH",
        &f.admin_url("/admin/backends/1"),
        r#"{"state": "draining"}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    let s = sequence(&c, &f, 40).await;
    assert!(
        !s.contains('B') && s.contains('A') && s.contains('C'),
        "{s}"
    );
}

// ------------------------------------------------------------------ hashing

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_hash_keeps_keys_and_a_removed_backend_moves_only_its_own() {
    let (a, b, cc) = three();
    let c = client();
    let f = Fulcrum::over(
        &[&a, &b, &cc],
        &["--strategy", "ch", "--hash-key", "header:x-user"],
    );
    let us = users(60);
    let first = placement(&c, &f, &us).await;
    assert_eq!(
        placement(&c, &f, &us).await,
        first,
        "a key stays on its backend"
    );
    for n in ["A", "B", "C"] {
        assert!(first.iter().filter(|x| *x == n).count() >= 8, "{first:?}");
    }
    // Without the header: the client IP, one backend for all.
    let s = sequence(&c, &f, 5).await;
    assert!(s.chars().all(|x| s.starts_with(x)), "{s}");
    // Remove B: only B's keys move.
    let r = admin(&c, "DELETE", &f.admin_url("/admin/backends/1"), "").await;
    assert_eq!(r.status, 204);
    let without = placement(&c, &f, &us).await;
    for (before, after) in first.iter().zip(&without) {
        if before == "B" {
            assert_ne!(after, "B");
        } else {
            assert_eq!(before, after);
        }
    }
    // Put it back (a new id, at the end of the pool): the old mapping, exactly.
    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/backends"),
        &format!(r#"{{"url": "{}", "name": "B"}}"#, b.url()),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(placement(&c, &f, &us).await, first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maglev_follows_the_cookie_and_falls_back_to_the_client_ip() {
    let (a, b, cc) = three();
    let c = client();
    let f = Fulcrum::over(
        &[&a, &b, &cc],
        &["--strategy", "maglev", "--hash-key", "cookie:sid"],
    );
    let mut by_sid: HashMap<String, String> = HashMap::new();
    for i in 0..60 {
        let cookie = format!("theme=dark; sid=s{i}");
        let r = send(&c, "GET", &f.url("/"), &[("cookie", &cookie)], "").await;
        by_sid.insert(cookie, r.backend());
    }
    let mut spread: HashMap<&str, usize> = HashMap::new();
    for b in by_sid.values() {
        *spread.entry(b.as_str()).or_default() += 1;
    }
    assert_eq!(spread.len(), 3, "{spread:?}");
    for (cookie, backend) in &by_sid {
        let r = send(&c, "GET", &f.url("/"), &[("cookie", cookie)], "").await;
        assert_eq!(&r.backend(), backend);
    }
    let s = sequence(&c, &f, 5).await;
    assert!(s.chars().all(|x| s.starts_with(x)), "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ip_hash_believes_forwarded_for_only_from_trusted_proxies() {
    let (a, b, cc) = three();
    let c = client();
    let ips: Vec<String> = (0..60).map(|i| format!("203.0.113.{i}")).collect();
    let through = |f: &Fulcrum, ip: &str, user: &str| {
        let c = c.clone();
        let url = f.url("/");
        let (ip, user) = (ip.to_string(), user.to_string());
        async move {
            send(
                &c,
                "GET",
                &url,
                &[("x-forwarded-for", &ip), ("x-user", &user)],
                "",
            )
            .await
            .backend()
        }
    };
    // The peer (127.0.0.1) is a trusted proxy: the forwarded client decides, and
    // --hash-key is ignored by ip_hash.
    let f = Fulcrum::over(
        &[&a, &b, &cc],
        &[
            "--strategy",
            "ip_hash",
            "--trusted-proxies",
            "127.0.0.1",
            "--hash-key",
            "header:x-user",
        ],
    );
    let mut placed = Vec::new();
    for ip in &ips {
        placed.push(through(&f, ip, "u1").await);
    }
    for n in ["A", "B", "C"] {
        assert!(placed.iter().any(|x| x == n), "{placed:?}");
    }
    for (ip, backend) in ips.iter().zip(&placed).take(10) {
        assert_eq!(&through(&f, ip, "someone-else").await, backend);
        // A forged entry to the left of the real client changes nothing.
        let chain = format!("198.51.100.9, {ip}");
        assert_eq!(&through(&f, &chain, "u1").await, backend);
    }
    drop(f);
    // Untrusted peer: forging X-Forwarded-For cannot choose a backend.
    let f = Fulcrum::over(&[&a, &b, &cc], &["--strategy", "ip-hash"]);
    let mut seen = Vec::new();
    for ip in &ips {
        seen.push(through(&f, ip, "u1").await);
    }
    assert!(seen.iter().all(|x| *x == seen[0]), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_balance_factor_bounds_the_load_one_key_puts_on_a_backend() {
    let (a, b, cc) = three();
    let c = client();
    let burst = |f: &Fulcrum| {
        let mut tasks = Vec::new();
        for _ in 0..30 {
            let c = c.clone();
            let url = f.url("/sleep/400");
            tasks.push(tokio::spawn(async move {
                send(&c, "GET", &url, &[("x-user", "hot")], "")
                    .await
                    .backend()
            }));
        }
        async move {
            let mut counts: HashMap<String, usize> = HashMap::new();
            for t in tasks {
                *counts.entry(t.await.unwrap()).or_default() += 1;
            }
            counts
        }
    };
    let key = [
        "--strategy",
        "consistent_hash",
        "--hash-key",
        "header:x-user",
    ];
    let f = Fulcrum::over(&[&a, &b, &cc], &key);
    let one = burst(&f).await;
    assert_eq!(one.len(), 1, "one key, one backend: {one:?}");
    drop(f);
    let mut bounded = key.to_vec();
    bounded.extend(["--hash-balance-factor", "1.5"]);
    let f = Fulcrum::over(&[&a, &b, &cc], &bounded);
    let spread = burst(&f).await;
    // At most ceil(1.5 × 30 / 3) = 15 at once on any backend.
    assert!(spread.len() >= 2, "{spread:?}");
    assert!(spread.values().all(|&n| n <= 15), "{spread:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_into_consistent_hash_then_killing_a_backend_fails_no_request() {
    let (a, b, cc) = three();
    let c = client();
    let f = Fulcrum::over(
        &[&a, &b, &cc],
        &[
            "--hash-key",
            "header:x-user",
            "--health-interval",
            "200ms",
            "--health-timeout",
            "200ms",
        ],
    );
    assert_eq!(sequence(&c, &f, 3).await, "ABC");
    let r = set_strategy(&c, &f, "consistent-hash").await;
    assert_eq!(r.json()["strategy"], "consistent_hash");
    let us = users(60);
    let first = placement(&c, &f, &us).await;
    assert!(first.iter().any(|x| x == "B"), "{first:?}");
    drop(b);
    // Until the health checks notice, retries carry B's keys clockwise (within the budget).
    assert!(
        eventually(Duration::from_secs(5), || async {
            let s = status(&c, &f).await;
            s["backends"][1]["healthy"] == false
        })
        .await,
        "B never turned unhealthy"
    );
    for _ in 0..3 {
        let now = placement(&c, &f, &us).await;
        for (before, after) in first.iter().zip(&now) {
            if before == "B" {
                assert_ne!(after, "B");
            } else {
                assert_eq!(before, after, "a key of a live backend moved");
            }
        }
    }
    let s = status(&c, &f).await;
    assert!(
        s["backends"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["errors"] == 0 || b["name"] == "B"),
        "{s}"
    );
}

/// From 64 backends up, the least-loaded strategies pick from indexes that the backends
/// keep current as requests start and end (docs/strategies.md). Over 70 real backends,
/// with the strategy switched live between waves: requests held in flight one after
/// another each go to the next least-loaded backend in pool order, and once they end
/// the pick returns to where the rule says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_pools_pick_the_least_loaded_from_their_index() {
    let bs: Vec<TestBackend> = (0..70)
        .map(|i| TestBackend::start(&format!("b{i:02}")))
        .collect();
    let specs: Vec<String> = bs.iter().map(|b| b.spec()).collect();
    let f = start_with(&specs, "least_connections");
    let c = client();
    let names =
        |r: std::ops::Range<usize>| -> Vec<String> { r.map(|i| format!("b{i:02}")).collect() };
    // Least response time sends unsampled backends first: the waves before it sampled
    // b00–b19 (and b00 once more), so its wave takes b20–b39 and then b40.
    let waves = [
        ("least_connections", 0..20, "b00"),
        ("weighted_least_connections", 0..20, "b00"),
        ("least_response_time", 20..40, "b40"),
    ];
    for (strategy, held, next) in waves {
        let r = set_strategy(&c, &f, strategy).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let mut tasks = Vec::new();
        for k in held.clone() {
            let cc = c.clone();
            // Long enough that all of a wave is still in flight when its last is sent.
            let url = f.url("/sleep/4000");
            tasks.push(tokio::spawn(async move { get(&cc, &url).await.backend() }));
            // The next is sent only once this one is counted in flight.
            let n = (k - held.start + 1) as u64;
            assert!(
                eventually(Duration::from_secs(5), || async {
                    active_conns(&c, &f).await.values().sum::<u64>() == n
                })
                .await,
                "{strategy}: request {n} never counted"
            );
        }
        let mut got = Vec::new();
        for t in tasks {
            got.push(t.await.unwrap());
        }
        got.sort();
        assert_eq!(got, names(held), "{strategy}");
        assert_eq!(get(&c, &f.url("/")).await.backend(), next, "{strategy}");
    }
}
