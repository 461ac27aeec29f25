//! Retries on status and per-try timeouts (`docs/traffic.md`, "Retries") over real
//! sockets: a pool with one backend answering 500 behind `retry_on`, idempotent requests
//! sent again (a 10 kB PUT whole), POSTs never; a pool failing as a whole stopped by the
//! retry budget; a slow backend left after `try_timeout`; bad values refused.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::*;

/// A pool `web` of `backends`, with `settings` (TOML lines), behind one route.
fn pool_of(backends: &[String], settings: &str) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|u| format!("{{ url = \"{u}\" }}"))
        .collect();
    format!(
        "[[pools]]\nname = \"web\"\n{settings}\nbackends = [{}]\n[[routes]]\npool = \"web\"\n",
        list.join(", ")
    )
}

fn start(tag: &str, text: &str) -> Fulcrum {
    let cfg = config_file("retries", tag, text);
    Fulcrum::start(&[
        "--config",
        cfg.to_str().unwrap(),
        "--health-interval",
        "60s",
    ])
}

async fn retried(f: &Fulcrum, reason: &str) -> u64 {
    metric(
        f,
        &format!("fulcrum_retries_total{{pool=\"web\",reason=\"{reason}\"}}"),
    )
    .await
}

/// Outlier ejection off, so that the failing backend keeps being picked.
const KEEP_PICKING: &str = "outlier = { consecutive_failures = 0 }";

/// Between requests that each need a retry: the retry budget's floor is 3 a second
/// (`docs/operations.md`), and a retry's pick moves the rotation on, so that with two
/// backends every request meets the failing one first.
const PACE: Duration = Duration::from_millis(400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listed_answers_go_to_another_backend_and_posts_never_do() {
    let (good, bad) = (TestBackend::start("good"), TestBackend::start("bad"));
    bad.set_failing(true);
    let settings = format!("retry_on = [\"5xx\"]\n{KEEP_PICKING}");
    let f = start("status", &pool_of(&[good.url(), bad.url()], &settings));
    let c = client();
    for _ in 0..6 {
        tokio::time::sleep(PACE).await;
        let r = get(&c, &f.url("/x")).await;
        assert_eq!(
            (r.status.as_u16(), r.backend()),
            (200, "good".to_string()),
            "{}",
            f.log()
        );
    }
    // Each GET that met the failing backend went on to the other.
    let sent_again = retried(&f, "5xx").await;
    assert_eq!(sent_again, bad.requests());
    assert!(
        sent_again >= 5,
        "round robin met the failing backend: {sent_again}"
    );
    assert!(f
        .log_line(&["access", "tries=2"], Duration::from_secs(5))
        .is_some());
    // A POST is never sent twice: each is answered by the backend it met.
    let (good_before, bad_before) = (good.requests(), bad.requests());
    let mut refused = 0;
    for _ in 0..10 {
        let r = send(&c, "POST", &f.url("/x"), &[], "order").await;
        refused += u64::from(r.status.as_u16() == 500);
    }
    assert_eq!(bad.requests() - bad_before, refused);
    assert_eq!(good.requests() - good_before, 10 - refused);
    assert!(refused >= 1, "round robin met the failing backend");
    assert_eq!(retried(&f, "5xx").await, sent_again);
    let bad_before = bad.requests();
    // A 10 kB PUT is read whole first and sent again whole.
    let body: String = (0..10_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    for _ in 0..3 {
        tokio::time::sleep(PACE).await;
        let r = send(&c, "PUT", &f.url("/echo"), &[], body.clone()).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.text(), body, "the body sent again whole");
    }
    let met = bad.requests() - bad_before;
    assert!(met >= 1, "round robin met the failing backend");
    assert_eq!(retried(&f, "5xx").await, sent_again + met);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_stop_at_the_budget_when_the_whole_pool_fails() {
    let bs: Vec<TestBackend> = (0..3)
        .map(|i| TestBackend::start(&format!("b{i}")))
        .collect();
    for b in &bs {
        b.set_failing(true);
    }
    let urls: Vec<String> = bs.iter().map(TestBackend::url).collect();
    let settings = format!("retry_on = [\"500\"]\nretries = 2\n{KEEP_PICKING}");
    let f = start("budget", &pool_of(&urls, &settings));
    let c = client();
    for _ in 0..100 {
        let r = get(&c, &f.url("/x")).await;
        assert_eq!(r.status, 500, "the last answer goes to the client");
    }
    let sent_again = retried(&f, "500").await;
    let reached: u64 = bs.iter().map(TestBackend::requests).sum();
    println!("100 requests to a failing pool: {sent_again} retries, {reached} tries");
    // Without a budget: 200 retries. The budget: a fifth of the requests plus 3 a
    // second over 10 s.
    assert!(sent_again <= 20 + 30 + 1, "{sent_again} retries");
    assert!(sent_again >= 20, "{sent_again} retries");
    assert_eq!(reached, 100 + sent_again);
}

/// A backend that answers each request after `delay`.
fn slow_backend(delay: Duration) -> String {
    let addr = raw_backend(delay, "x-backend: slow\r\n".to_string(), "slow");
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_try_is_left_after_try_timeout_and_the_last_answers_504() {
    let fast = TestBackend::start("fast");
    let slow = slow_backend(Duration::from_millis(1500));
    let settings = format!("try_timeout = \"200ms\"\n{KEEP_PICKING}");
    let f = start("try", &pool_of(&[slow.clone(), fast.url()], &settings));
    let c = client();
    for _ in 0..4 {
        tokio::time::sleep(PACE).await;
        let t = Instant::now();
        let r = get(&c, &f.url("/x")).await;
        assert_eq!((r.status.as_u16(), r.backend()), (200, "fast".to_string()));
        assert!(
            t.elapsed() < Duration::from_millis(1000),
            "{:?}",
            t.elapsed()
        );
    }
    assert!(
        retried(&f, "timeout").await >= 1,
        "round robin met the slow backend"
    );
    // Only slow ones: each try times out; upstream_timeout bounds them all.
    let settings = "try_timeout = \"200ms\"\nupstream_timeout = \"500ms\"\nretries = 5";
    let slow_too = slow_backend(Duration::from_millis(1500));
    let g = start("try-alone", &pool_of(&[slow, slow_too], settings));
    let t = Instant::now();
    let r = get(&c, &g.url("/x")).await;
    assert_eq!(r.status, 504, "{}", r.text());
    let took = t.elapsed();
    assert!(took < Duration::from_millis(1200), "{took:?}");
}

/// A pool `web` of a backend answering after 700 ms and a fast one, both named, that
/// hedges with `hedge` (a TOML table).
fn hedging_pool(slow: &str, fast: &str, hedge: &str) -> String {
    format!(
        "[[pools]]\nname = \"web\"\nhedge = {hedge}\n{KEEP_PICKING}\nbackends = [\
         {{ url = \"{slow}\", name = \"slow\" }}, {{ url = \"{fast}\", name = \"fast\" }}]\n\
         [[routes]]\npool = \"web\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_answers_well_before_a_slow_backend_and_its_loser_is_released() {
    let fast = TestBackend::start("fast");
    let slow = slow_backend(Duration::from_millis(700));
    let pool = hedging_pool(&slow, &fast.url(), "{ after = \"50ms\", max = 1 }");
    let f = start("hedge", &pool);
    let c = client();
    for _ in 0..4 {
        tokio::time::sleep(PACE).await;
        let t = Instant::now();
        let r = get(&c, &f.url("/x")).await;
        let took = t.elapsed();
        assert_eq!((r.status.as_u16(), r.backend()), (200, "fast".to_string()));
        assert!(took < Duration::from_millis(400), "{took:?}");
        // The slow backend's try was dropped with the race: no slot held for it.
        assert_eq!(active_conns(&c, &f).await["slow"], 0);
    }
    let won = metric(&f, "fulcrum_hedges_total{pool=\"web\",result=\"won\"}").await;
    assert!(
        won >= 1,
        "round robin met the slow backend first at least once"
    );
    // Hedges are not retries.
    assert_eq!(retried(&f, "timeout").await + retried(&f, "reset").await, 0);
    let log = f.log();
    assert!(
        log.contains("tries=2"),
        "a hedged request made two tries: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_that_fails_leaves_the_race_to_the_slow_try_and_h2_clients_are_hedged_too() {
    // Nothing listens on the second backend: a hedge sent there fails at once, and the
    // slow try still answers; a request that meets it first is retried as usual.
    let slow = slow_backend(Duration::from_millis(700));
    let gone = format!("http://127.0.0.1:{}", free_port());
    let f = start(
        "hedge-fail",
        &hedging_pool(&slow, &gone, "{ after = \"50ms\" }"),
    );
    let c = client();
    for _ in 0..2 {
        tokio::time::sleep(PACE).await;
        let r = get(&c, &f.url("/x")).await;
        assert_eq!((r.status.as_u16(), r.text()), (200, "slow".to_string()));
    }
    assert_eq!(active_conns(&c, &f).await["slow"], 0);
    // HTTP/2 from the client (prior knowledge): the race goes through hyper's client.
    let fast = TestBackend::start("fast");
    let slow = slow_backend(Duration::from_millis(700));
    let g = start(
        "hedge-h2",
        &hedging_pool(&slow, &fast.url(), "{ after = \"50ms\" }"),
    );
    for _ in 0..2 {
        tokio::time::sleep(PACE).await;
        let out = std::process::Command::new("curl")
            .args([
                "-s",
                "--http2-prior-knowledge",
                "-w",
                " %{http_version} %{time_total}",
            ])
            .arg(g.url("/x"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let parts: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(parts[parts.len() - 2], "2", "{text}");
        let took: f64 = parts[parts.len() - 1].parse().unwrap();
        assert!(took < 0.4, "{text}");
        assert!(!text.starts_with("slow"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_answering_a_listed_status_is_dropped_only_while_a_try_may_follow() {
    let bad = TestBackend::start("bad");
    bad.set_failing(true);
    // retries = 2: the hedge's 500 is dropped and the slow try's answer wins.
    let slow = slow_backend(Duration::from_millis(700));
    let rules = "{ after = \"50ms\" }\nretry_on = [\"5xx\"]\nretries = 2";
    let f = start("hedge-500", &hedging_pool(&slow, &bad.url(), rules));
    let c = client();
    for _ in 0..2 {
        tokio::time::sleep(PACE).await;
        let r = get(&c, &f.url("/x")).await;
        assert_eq!((r.status.as_u16(), r.text()), (200, "slow".to_string()));
    }
    // retries = 1: the hedge is the last try, and its own answer is the client's.
    let slow = slow_backend(Duration::from_millis(700));
    let rules = "{ after = \"50ms\" }\nretry_on = [\"5xx\"]\nretries = 1";
    let g = start("hedge-500-last", &hedging_pool(&slow, &bad.url(), rules));
    // Round robin meets the slow backend first each time (the hedge's pick moves the
    // rotation on): the hedge's 500, the backend's own body, long before the slow one.
    for _ in 0..2 {
        tokio::time::sleep(PACE).await;
        let t = Instant::now();
        let r = get(&c, &g.url("/x")).await;
        assert_eq!((r.status.as_u16(), r.text()), (500, "bad".to_string()));
        assert!(
            t.elapsed() < Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_race_releases_every_try_and_its_hedge_is_lost() {
    let (one, two) = (
        slow_backend(Duration::from_millis(700)),
        slow_backend(Duration::from_millis(700)),
    );
    let f = start(
        "hedge-gone",
        &hedging_pool(&one, &two, "{ after = \"50ms\" }"),
    );
    let mut s = std::net::TcpStream::connect(f.proxy).unwrap();
    s.write_all(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n").unwrap();
    // Both tries are out by now; the client goes away before either answers.
    std::thread::sleep(Duration::from_millis(250));
    drop(s);
    let c = client();
    let lost = "fulcrum_hedges_total{pool=\"web\",result=\"lost\"}";
    let released = eventually(Duration::from_secs(2), || async {
        let conns = active_conns(&c, &f).await;
        conns.values().all(|&n| n == 0) && metric(&f, lost).await == 1
    })
    .await;
    assert!(released, "{:?}", active_conns(&c, &f).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percentile_hedges_nothing_before_100_answers() {
    let fast = TestBackend::start("fast");
    let slow = slow_backend(Duration::from_millis(700));
    let f = start(
        "hedge-p",
        &hedging_pool(&slow, &fast.url(), "{ after = \"p50\" }"),
    );
    let c = client();
    let mut slowest = Duration::ZERO;
    for _ in 0..2 {
        let t = Instant::now();
        assert_eq!(get(&c, &f.url("/x")).await.status, 200);
        slowest = slowest.max(t.elapsed());
    }
    assert!(slowest >= Duration::from_millis(700), "{slowest:?}");
    assert_eq!(
        metric(&f, "fulcrum_hedges_total{pool=\"web\",result=\"won\"}").await,
        0
    );
}

#[test]
fn bad_retry_settings_exit_2_naming_them() {
    for (line, expected) in [
        ("retry_on = [\"600\"]", "'600' is not a status"),
        ("retry_on = [\"5xx\", \"sometimes\"]", "'sometimes'"),
        ("try_timeout = \"soon\"", "try_timeout"),
        ("retry_body_limit = \"lots\"", "retry_body_limit"),
        ("retry_non_idempotent = \"maybe\"", "retry_non_idempotent"),
        (
            "hedge = { after = \"soon\" }",
            "'soon' is neither a duration",
        ),
        ("hedge = { after = \"p100\" }", "'p100' is neither"),
        ("hedge = { after = \"50ms\", max = 9 }", "hedge_max"),
    ] {
        let text = pool_of(&["http://127.0.0.1:9".to_string()], line);
        let cfg = config_file("retries", "bad", &text);
        let (status, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
        assert_eq!(status.code(), Some(2), "{line}: {err}");
        assert!(err.contains(expected), "{line}: {err}");
        assert!(err.contains("line 3"), "{line}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{line}: {err}");
    }
}
