//! Active health checks over real sockets.

mod common;

use std::time::{Duration, Instant};

use common::*;

async fn healthy(c: &HttpClient, f: &Fulcrum, i: usize) -> bool {
    status(c, f).await["backends"][i]["healthy"]
        .as_bool()
        .unwrap()
}

/// Waits until `b` has received `n` probes in all.
async fn probes_reach(b: &TestBackend, n: u64) {
    assert!(
        eventually(Duration::from_secs(10), || async { b.probes() >= n }).await,
        "only {} probes",
        b.probes()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhealthy_only_at_the_third_consecutive_failure_and_back_after_two_successes() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let c = client();
    let f = Fulcrum::over(
        &[&a, &b],
        &["--health-interval", "300ms", "--health-timeout", "1500ms"],
    );
    probes_reach(&a, 1).await;
    a.set_health(500);
    let base = a.probes();
    probes_reach(&a, base + 2).await;
    // Two failures answered; the third probe now hangs until its timeout (1.5 s): for
    // that long the backend has failed exactly twice and must still be healthy.
    a.set_health(0);
    probes_reach(&a, base + 3).await;
    assert!(
        healthy(&c, &f, 0).await,
        "unhealthy before the third failure"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        healthy(&c, &f, 0).await,
        "unhealthy before the third failure (probes {} from {base}); log:\n{}",
        a.probes(),
        f.log()
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            !healthy(&c, &f, 0).await
        })
        .await
    );
    // Traffic avoids it at once.
    let before = a.requests();
    for _ in 0..6 {
        assert_eq!(get(&c, &f.url("/")).await.backend(), "B");
    }
    assert_eq!(a.requests(), before);
    // Recovery: two successes in a row.
    a.set_health(200);
    let base = a.probes();
    assert!(
        eventually(Duration::from_secs(5), || async {
            healthy(&c, &f, 0).await
        })
        .await
    );
    assert!(
        a.probes() >= base + 2,
        "healthy again after {} successes",
        a.probes() - base
    );
    let mut seen = String::new();
    for _ in 0..4 {
        seen.push_str(&get(&c, &f.url("/")).await.backend());
    }
    assert!(seen.contains('A'), "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_fail_succeed_never_ejects() {
    let a = TestBackend::start("A");
    let c = client();
    let f = Fulcrum::over(
        &[&a],
        &["--health-interval", "100ms", "--health-timeout", "80ms"],
    );
    probes_reach(&a, 1).await;
    let t = Instant::now();
    let mut n = a.probes();
    let mut k = 0u64;
    while t.elapsed() < Duration::from_secs(3) {
        // Steer each next probe: fail, fail, succeed, …
        a.set_health(if k % 3 == 2 { 200 } else { 503 });
        probes_reach(&a, n + 1).await;
        n = a.probes();
        k += 1;
        assert!(healthy(&c, &f, 0).await, "flapped after {k} probes");
    }
    assert!(k >= 9, "only {k} probes in 3 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_is_unhealthy_within_a_second_of_start_up() {
    let port = free_port();
    let c = client();
    let t = Instant::now();
    let f = Fulcrum::start(&["--backend", &format!("http://127.0.0.1:{port}")]);
    assert!(
        eventually(Duration::from_secs(3), || async {
            !healthy(&c, &f, 0).await
        })
        .await
    );
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "took {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_probe_times_out_and_does_not_delay_the_others() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    b.set_health(0); // B's health never answers
    let c = client();
    let f = Fulcrum::over(
        &[&a, &b],
        &["--health-interval", "200ms", "--health-timeout", "1s"],
    );
    // A is probed on its own schedule while B's probes hang.
    probes_reach(&a, 1).await;
    let t = Instant::now();
    let base = a.probes();
    probes_reach(&a, base + 4).await;
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "A's probes waited: {:?}",
        t.elapsed()
    );
    // B's hung probes time out and count as failures.
    assert!(
        eventually(Duration::from_secs(8), || async {
            !healthy(&c, &f, 1).await
        })
        .await
    );
    assert!(healthy(&c, &f, 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_backend_down_every_strategy_answers_503_at_once() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    a.set_health(500);
    b.set_health(500);
    let c = client();
    let f = Fulcrum::over(&[&a, &b], &["--health-interval", "200ms"]);
    assert!(
        eventually(Duration::from_secs(5), || async {
            let s = status(&c, &f).await;
            s["backends"]
                .as_array()
                .unwrap()
                .iter()
                .all(|b| b["healthy"] == false)
        })
        .await
    );
    for strategy in ["round_robin", "weighted_round_robin", "least_connections"] {
        let r = set_strategy(&c, &f, strategy).await;
        assert_eq!(r.status, 200);
        for _ in 0..5 {
            let t = Instant::now();
            let r = get(&c, &f.url("/")).await;
            assert_eq!(
                (r.status.as_u16(), r.text().trim()),
                (503, "no healthy backend"),
                "{strategy}"
            );
            assert!(
                t.elapsed() < Duration::from_millis(100),
                "{strategy}: {:?}",
                t.elapsed()
            );
        }
    }
    assert_eq!(a.requests() + b.requests(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_comes_back_is_probed_into_rotation_with_a_fresh_latency_average() {
    let a = TestBackend::start("A");
    let c = client();
    let f = Fulcrum::over(&[&a], &["--health-interval", "200ms"]);
    get(&c, &f.url("/")).await;
    assert!(status(&c, &f).await["backends"][0]["avg_latency_ms"].is_number());
    a.set_health(503);
    assert!(
        eventually(Duration::from_secs(5), || async {
            !healthy(&c, &f, 0).await
        })
        .await
    );
    a.set_health(200);
    assert!(
        eventually(Duration::from_secs(5), || async {
            healthy(&c, &f, 0).await
        })
        .await
    );
    assert!(status(&c, &f).await["backends"][0]["avg_latency_ms"].is_null());
    assert_eq!(get(&c, &f.url("/")).await.status, 200);
}
