//! Retries under a budget over real sockets.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

/// A backend whose health check passes but which drops every other request without an
/// answer (the exchange breaks after the request was sent). Counts those requests.
fn breaking_backend() -> (SocketAddr, Arc<AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let attempts = Arc::new(AtomicU64::new(0));
    let n = Arc::clone(&attempts);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let n = Arc::clone(&n);
            std::thread::spawn(move || {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = [0u8; 4096];
                let Ok(k) = s.read(&mut buf) else { return };
                if buf[..k].starts_with(b"GET /health ") {
                    let _ = s.write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    );
                } else if k > 0 {
                    n.fetch_add(1, Ordering::SeqCst); // and close without answering
                }
            });
        }
    });
    (addr, attempts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_exchange_is_retried_on_another_backend() {
    let (bad, bad_attempts) = breaking_backend();
    let good = TestBackend::start("G");
    let c = client();
    let f = Fulcrum::start(&[
        "--backend",
        &format!("http://{bad},name=bad"),
        "--backend",
        &good.spec(),
    ]);
    // A POST is not retried: it fails where it landed (two of four go to the bad one).
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            send(&c, "POST", &f.url("/"), &[], "x")
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 502).count(),
        2,
        "{statuses:?}"
    );
    // Paced under the budget's floor (3 retries a second), every GET is rescued; the bad
    // backend's fifth failure in a row ejects it.
    for _ in 0..6 {
        let r = get(&c, &f.url("/")).await;
        assert_eq!((r.status.as_u16(), r.backend().as_str()), (200, "G"));
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(bad_attempts.load(Ordering::SeqCst), 5);
    let s = status(&c, &f).await;
    assert_eq!(s["backends"][0]["ejected"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_backend_failing_retries_cannot_become_a_storm() {
    let backends: Vec<_> = (0..3).map(|_| breaking_backend()).collect();
    let mut args = Vec::new();
    for (addr, _) in &backends {
        args.push("--backend".to_string());
        args.push(format!("http://{addr}"));
    }
    args.extend(["--retries".to_string(), "2".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let f = Fulcrum::start(&args);
    let c = client();
    let t = Instant::now();
    let mut sent = 0u64;
    // About 100 requests a second for 3 seconds, every one failing everywhere.
    while t.elapsed() < Duration::from_secs(3) {
        let r = get(&c, &f.url("/")).await;
        assert_eq!(r.status, 502);
        sent += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let secs = t.elapsed().as_secs_f64().ceil();
    let attempts: u64 = backends.iter().map(|(_, n)| n.load(Ordering::SeqCst)).sum();
    let bound = 1.2 * sent as f64 + 3.0 * secs;
    assert!(
        (attempts as f64) <= bound,
        "{attempts} upstream attempts for {sent} requests in {secs} s (bound {bound})"
    );
    assert!(attempts > sent, "no retry at all: {attempts} for {sent}");
}

async fn ejected(c: &HttpClient, f: &Fulcrum) -> Vec<bool> {
    status(c, f).await["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["ejected"].as_bool().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_answering_5xx_is_ejected_and_clients_barely_notice() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let cc = TestBackend::start("C");
    b.set_failing(true);
    let c = client();
    let f = Fulcrum::over(&[&a, &b, &cc], &[]);
    let mut ok = 0;
    for _ in 0..300 {
        if get(&c, &f.url("/")).await.status == 200 {
            ok += 1;
        }
    }
    assert_eq!(
        b.requests(),
        5,
        "B is ejected after its 5th failure in a row"
    );
    assert!(ok >= 285, "{ok}/300 succeeded");
    assert_eq!(ejected(&c, &f).await, vec![false, true, false]);
    let s = status(&c, &f).await;
    assert_eq!(
        s["backends"][1]["healthy"], true,
        "its health endpoint is fine"
    );
    assert_eq!(s["backends"][1]["errors"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_half_the_pool_is_ejected() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let cc = TestBackend::start("C");
    let d = TestBackend::start("D");
    for x in [&a, &b, &cc] {
        x.set_failing(true);
    }
    let c = client();
    let f = Fulcrum::over(&[&a, &b, &cc, &d], &[]);
    for _ in 0..120 {
        get(&c, &f.url("/")).await;
    }
    let e = ejected(&c, &f).await;
    assert_eq!(e.iter().filter(|x| **x).count(), 2, "{e:?}");
    assert!(!e[3], "the good backend stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ejection_ends_half_open_and_a_success_restores_full_traffic() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    b.set_failing(true);
    let c = client();
    let f = Fulcrum::over(&[&a, &b], &[]);
    let mut n = 0;
    while b.requests() < 5 && n < 50 {
        get(&c, &f.url("/")).await;
        n += 1;
    }
    assert_eq!(ejected(&c, &f).await, vec![false, true]);
    b.set_failing(false);
    // 30 s for a first ejection; then B is half-open and earns its traffic back.
    let back = eventually(Duration::from_secs(40), || async {
        !ejected(&c, &f).await[1]
    })
    .await;
    assert!(back, "ejection never ended");
    let before = b.requests();
    let mut seen = String::new();
    for _ in 0..10 {
        seen.push_str(&get(&c, &f.url("/")).await.backend());
    }
    assert!(b.requests() - before >= 4, "{seen}");
    assert_eq!(ejected(&c, &f).await, vec![false, false]);
}

struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn demo_backend(name: &str, port: u16) -> Proc {
    let child = std::process::Command::new(BIN)
        .args([
            "backend",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--name",
            name,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    Proc(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_killing_and_restarting_a_backend_fails_no_client_request() {
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let names = ["a", "b", "c"];
    let mut procs: Vec<Option<Proc>> = ports
        .iter()
        .zip(names)
        .map(|(p, n)| Some(demo_backend(n, *p)))
        .collect();
    let mut args = Vec::new();
    for (p, n) in ports.iter().zip(names) {
        args.push("--backend".to_string());
        args.push(format!("http://127.0.0.1:{p},name={n}"));
    }
    args.extend(["--health-interval", "1s", "--health-timeout", "500ms"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let f = Fulcrum::start(&args);
    let c = client();
    assert!(
        eventually(Duration::from_secs(5), || async {
            get(&c, &f.url("/")).await.status == 200
        })
        .await
    );

    // 250 requests a second for 10 s; kill b at 3 s, start it again at 6 s.
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(4));
    let mut tasks = Vec::new();
    let mut killed = false;
    let mut restarted = false;
    while start.elapsed() < Duration::from_secs(10) {
        tick.tick().await;
        if !killed && start.elapsed() >= Duration::from_secs(3) {
            procs[1] = None; // SIGKILL and reap
            killed = true;
        }
        if !restarted && start.elapsed() >= Duration::from_secs(6) {
            procs[1] = Some(demo_backend("b", ports[1]));
            restarted = true;
        }
        let c = c.clone();
        let url = f.url("/chaos");
        tasks.push(tokio::spawn(async move {
            let r = c.get(url.parse().unwrap()).await;
            match r {
                Ok(r) => {
                    let st = r.status().as_u16();
                    let backend = r.headers().get("x-backend").is_some();
                    let _ = http_body_util::BodyExt::collect(r.into_body()).await;
                    (st, backend)
                }
                Err(_) => (0, false),
            }
        }));
    }
    let sent = tasks.len();
    let mut failed = Vec::new();
    for t in tasks {
        let (st, _) = t.await.unwrap();
        if st != 200 {
            failed.push(st);
        }
    }
    assert!(sent >= 2000, "only {sent} requests sent");
    assert!(
        failed.is_empty(),
        "{} of {sent} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(20)]
    );

    // b comes back into rotation.
    let back = eventually(Duration::from_secs(10), || async {
        let r = get(&c, &f.url("/x")).await;
        r.json()["backend"] == "b"
    })
    .await;
    assert!(back, "b never returned: {}", status(&c, &f).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degrade_injects_latency_and_errors_and_recover_clears_them() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let c = client();
    let f = Fulcrum::over(&[&a, &b], &["--strategy", "lc"]);
    // bad input changes nothing
    for (path, body, code) in [
        ("/admin/backends/x/degrade", r#"{"latency_ms": 10}"#, 400),
        ("/admin/backends/9/degrade", r#"{"latency_ms": 10}"#, 404),
        ("/admin/backends/0/degrade", r#"{"latency_ms": -1}"#, 400),
        ("/admin/backends/0/degrade", r#"{"error_rate": 1.5}"#, 400),
        (
            "/admin/backends/0/degrade",
            r#"{"error_rate": "lots"}"#,
            400,
        ),
        ("/admin/backends/0/degrade", r#"{"colour": 1}"#, 400),
        ("/admin/backends/x/recover", "", 400),
        ("/admin/backends/9/recover", "", 404),
    ] {
        let r = admin(&c, "POST", &f.admin_url(path), body).await;
        assert_eq!(r.status.as_u16(), code, "{path} {body}");
        assert!(r.json()["error"].is_string());
    }
    // latency: counted in the request and in the latency average
    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/backends/0/degrade"),
        r#"{"latency_ms": 300}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["id"], 0);
    let t = Instant::now();
    let r = get(&c, &f.url("/")).await; // least connections: A first
    assert_eq!(r.backend(), "A");
    assert!(t.elapsed() >= Duration::from_millis(300));
    let lat = status(&c, &f).await["backends"][0]["avg_latency_ms"]
        .as_f64()
        .unwrap();
    assert!(lat >= 300.0, "{lat}");
    // errors: the proxy answers 503 itself; the backend sees nothing; they count
    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/backends/0/degrade"),
        r#"{"latency_ms": 0, "error_rate": 1.0}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    let before = a.requests();
    let r = get(&c, &f.url("/")).await;
    assert_eq!(
        (r.status.as_u16(), r.text().trim()),
        (503, "injected failure")
    );
    assert_eq!(a.requests(), before);
    assert_eq!(status(&c, &f).await["backends"][0]["errors"], 1);
    // recover: faults and latency average gone
    let r = admin(&c, "POST", &f.admin_url("/admin/backends/0/recover"), "").await;
    assert_eq!(r.status, 200);
    assert!(r.json()["avg_latency_ms"].is_null());
    let r = get(&c, &f.url("/")).await;
    assert_eq!((r.status.as_u16(), r.backend().as_str()), (200, "A"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_errors_eject_like_real_ones() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let c = client();
    let f = Fulcrum::over(&[&a, &b], &[]);
    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/backends/1/degrade"),
        r#"{"error_rate": 1}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    let mut failures = 0;
    for _ in 0..40 {
        if get(&c, &f.url("/")).await.status != 200 {
            failures += 1;
        }
    }
    assert_eq!(failures, 5, "ejected at the fifth injected failure");
    assert_eq!(status(&c, &f).await["backends"][1]["ejected"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_start_ramps_a_joining_backend_from_a_tenth_of_its_weight() {
    let a = TestBackend::start("A");
    let b = TestBackend::start("B");
    let c = client();
    let f = Fulcrum::start(&[
        "--backend",
        &format!("{},weight=10", a.spec()),
        "--strategy",
        "wrr",
        "--slow-start",
        "3s",
    ]);
    // Present at start-up: full weight at once.
    assert_eq!(
        status(&c, &f).await["backends"][0]["effective_weight"],
        10.0
    );
    let r = admin(
        &c,
        "POST",
        &f.admin_url("/admin/backends"),
        &format!(r#"{{"url": "{}", "weight": 10, "name": "B"}}"#, b.url()),
    )
    .await;
    assert_eq!(r.status, 201);
    let ew = r.json()["effective_weight"].as_f64().unwrap();
    assert!((1.0..2.0).contains(&ew), "joins at a tenth: {ew}");
    // Early on B gets about 1 request in 11.
    let mut seq = String::new();
    for _ in 0..22 {
        seq.push_str(&get(&c, &f.url("/")).await.backend());
    }
    let early = seq.matches('B').count();
    assert!((1..=5).contains(&early), "{seq}");
    // After the ramp: equal shares.
    assert!(
        eventually(Duration::from_secs(6), || async {
            status(&c, &f).await["backends"][1]["effective_weight"] == 10.0
        })
        .await
    );
    // The status computes the weight live; the picker gets it at the next ramp step.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut seq = String::new();
    for _ in 0..20 {
        seq.push_str(&get(&c, &f.url("/")).await.backend());
    }
    assert_eq!(seq.matches('B').count(), 10, "{seq}");
}
