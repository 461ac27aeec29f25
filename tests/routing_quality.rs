//! Routing quality: how each strategy copes when one backend turns slow.
//!
//! Three backends answer in 10 ms. Traffic arrives open-loop at a fixed rate (a request
//! is sent on schedule whether or not earlier ones have been answered, and its latency
//! is counted from its scheduled time, so a queue shows). Half-way through, backend C is
//! made 10× slower through the admin API (`degrade`, +90 ms). Each request carries a
//! random `x-user` header (the `--hash-key` of `consistent_hash` and `maglev`) and a
//! random `X-Forwarded-For` client from a trusted peer (the key of `ip_hash`).
//!
//! `cargo test --test routing_quality -- --nocapture` runs round robin, least
//! connections, power of two, least response time and peak EWMA for 6 s + 6 s each at
//! 250 requests per second, prints the table and checks that the latency-aware
//! strategies keep p99 far below round robin's once settled (leaving out the second after
//! C slowed, in which any latency-aware strategy still sends C a burst of 7–20 requests
//! before its samples show it slow) and send C a small share. `FULCRUM_QUALITY=full` runs every
//! strategy for 10 s + 10 s at 200 requests per second (the table in
//! docs/strategies.md, built with `--release`).

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// Latency of the healthy backends (the request path).
const PATH: &str = "/sleep/10";
/// Added to backend C half-way through: 10 ms → 100 ms.
const EXTRA_MS: u64 = 90;

struct Outcome {
    strategy: &'static str,
    requests: usize,
    errors: usize,
    p50: Duration,
    p99: Duration,
    /// p99 of the second half alone (after C turned slow).
    p99_after: Duration,
    /// p99 without the second after C turned slow (the detection): what the strategy
    /// settles at.
    p99_settled: Duration,
    /// Share of the second half's requests that C answered.
    slow_share: f64,
}

/// One request: sent in the second half, answered by, latency, succeeded.
struct Sample {
    second_half: bool,
    /// Sent in the first half, or more than a second after C turned slow.
    settled: bool,
    backend: String,
    latency: Duration,
    ok: bool,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

async fn run(strategy: &'static str, phase: Duration, rate: u64) -> Outcome {
    let (a, b, cc) = (
        TestBackend::start("A"),
        TestBackend::start("B"),
        TestBackend::start("C"),
    );
    let f = Fulcrum::over(
        &[&a, &b, &cc],
        &[
            "--strategy",
            strategy,
            "--hash-key",
            "header:x-user",
            "--trusted-proxies",
            "127.0.0.1",
        ],
    );
    let c = client();
    let results: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let start = Instant::now();
    let total = rate * 2 * phase.as_secs();
    let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::with_capacity(total as usize);
    let mut degraded = None;
    for n in 0..total {
        let scheduled = tick.tick().await;
        let second_half = n >= total / 2;
        if second_half && degraded.is_none() {
            degraded = Some(scheduled);
            let r = admin(
                &c,
                "POST",
                &f.admin_url("/admin/backends/2/degrade"),
                &format!(r#"{{"latency_ms": {EXTRA_MS}}}"#),
            )
            .await;
            assert_eq!(r.status, 200);
        }
        let settled = degraded.is_none_or(|d| scheduled >= d + Duration::from_secs(1));
        let c = c.clone();
        let url = f.url(PATH);
        let results = Arc::clone(&results);
        tasks.push(tokio::spawn(async move {
            let user = format!("u{}", fastrand::u32(..));
            let ip = format!(
                "10.{}.{}.{}",
                fastrand::u8(..),
                fastrand::u8(..),
                fastrand::u8(1..)
            );
            let req = http::Request::get(&url)
                .header("x-user", user)
                .header("x-forwarded-for", ip)
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .expect("request");
            let outcome = match c.request(req).await {
                Ok(resp) => {
                    let backend = resp
                        .headers()
                        .get("x-backend")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("?")
                        .to_string();
                    let ok = resp.status() == 200;
                    let body = http_body_util::BodyExt::collect(resp.into_body()).await;
                    (backend, ok && body.is_ok())
                }
                Err(_) => ("?".to_string(), false),
            };
            let latency = scheduled.elapsed();
            results.lock().expect("results").push(Sample {
                second_half,
                settled,
                backend: outcome.0,
                latency,
                ok: outcome.1,
            });
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let took = start.elapsed();
    let results = results.lock().expect("results");
    let sorted = |keep: fn(&Sample) -> bool| -> Vec<Duration> {
        let mut v: Vec<Duration> = results
            .iter()
            .filter(|r| keep(r))
            .map(|r| r.latency)
            .collect();
        v.sort();
        v
    };
    let all = sorted(|_| true);
    let after = sorted(|r| r.second_half);
    let settled = sorted(|r| r.settled);
    let second = results.iter().filter(|r| r.second_half).count().max(1);
    let on_c = results
        .iter()
        .filter(|r| r.second_half && r.backend == "C")
        .count();
    assert!(
        took < phase * 2 + Duration::from_secs(5),
        "{strategy}: the load generator fell behind ({took:?})"
    );
    Outcome {
        strategy,
        requests: results.len(),
        errors: results.iter().filter(|r| !r.ok).count(),
        p50: percentile(&all, 0.50),
        p99: percentile(&all, 0.99),
        p99_after: percentile(&after, 0.99),
        p99_settled: percentile(&settled, 0.99),
        slow_share: on_c as f64 / second as f64,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_aware_strategies_keep_p99_low_when_a_backend_turns_slow() {
    let full = std::env::var("FULCRUM_QUALITY").is_ok_and(|v| v == "full");
    // The short run sends more requests per second, so that its p99 rests on more of them.
    let (phase, rate, strategies): (Duration, u64, &[&'static str]) = if full {
        (
            Duration::from_secs(10),
            200,
            &[
                "round_robin",
                "weighted_round_robin",
                "least_connections",
                "weighted_least_connections",
                "least_response_time",
                "peak_ewma",
                "power_of_two",
                "consistent_hash",
                "ip_hash",
                "maglev",
            ],
        )
    } else {
        (
            Duration::from_secs(6),
            250,
            &[
                "round_robin",
                "least_connections",
                "power_of_two",
                "least_response_time",
                "peak_ewma",
            ],
        )
    };
    let mut out = Vec::new();
    for s in strategies {
        out.push(run(s, phase, rate).await);
    }
    println!(
        "\n{} req/s open-loop, {} s + {} s, backends 10 ms, C +{EXTRA_MS} ms from half-way\n",
        rate,
        phase.as_secs(),
        phase.as_secs()
    );
    println!("| strategy | requests | errors | p50 ms | p99 ms | p99 after C slowed, ms | C's share after |");
    println!("|---|---|---|---|---|---|---|");
    for o in &out {
        println!(
            "| `{}` | {} | {:.2} % | {} | {} | {} | {:.1} % |",
            o.strategy,
            o.requests,
            100.0 * o.errors as f64 / o.requests.max(1) as f64,
            ms(o.p50),
            ms(o.p99),
            ms(o.p99_after),
            100.0 * o.slow_share
        );
    }
    let by = |name: &str| out.iter().find(|o| o.strategy == name).expect("ran");
    for o in &out {
        assert_eq!(o.errors, 0, "{}: {} errors", o.strategy, o.errors);
    }
    let rr = by("round_robin");
    // Round robin sends a third of the second half to C: its p99 is C's 100 ms. The
    // latency-aware strategies must beat it by a wide margin: a p99 at most three
    // quarters of round robin's (typically a fifth), and at most a third of its share of
    // the slow backend. The margins leave room for a busy machine, where each of their
    // probes of C (a request every few seconds) weighs more in a short run. The p99 is
    // the settled one, without the second after C slowed: until its first slow answers
    // return, C looks as fast as ever and gets its 7–20 requests, and on a busy machine
    // that burst alone can fill the 1 % a p99 ignores. The share counts them.
    assert!(
        rr.p99_settled >= Duration::from_millis(90),
        "round robin p99 {:?}",
        rr.p99_settled
    );
    for name in ["least_response_time", "peak_ewma"] {
        let o = by(name);
        assert!(
            o.p99_settled * 4 < rr.p99_settled * 3,
            "{name}: settled p99 {:?} vs round robin {:?} (overall {:?})",
            o.p99_settled,
            rr.p99_settled,
            o.p99
        );
        assert!(
            o.slow_share * 3.0 < rr.slow_share,
            "{name}: {:.1} % of the second half on the slow backend vs round robin {:.1} %",
            100.0 * o.slow_share,
            100.0 * rr.slow_share
        );
    }
}
