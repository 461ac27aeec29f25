//! The three core strategies over real sockets (§3).

mod common;

use std::collections::HashMap;
use std::time::Duration;

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
        let r = admin(
            &c,
            "POST",
            &f.admin_url("/admin/strategy"),
            &format!(r#"{{"strategy": "{name}"}}"#),
        )
        .await;
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
