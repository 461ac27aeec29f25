//! Retries under a budget (§4.5) over real sockets.

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
    // Paced under the budget's floor (3 retries a second), every GET is rescued.
    for _ in 0..6 {
        let r = get(&c, &f.url("/")).await;
        assert_eq!((r.status.as_u16(), r.backend().as_str()), (200, "G"));
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert!(
        bad_attempts.load(Ordering::SeqCst) >= 3,
        "the broken backend was tried"
    );
    // A POST is not retried: it fails where it landed.
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            send(&c, "POST", &f.url("/"), &[], "x")
                .await
                .status
                .as_u16(),
        );
    }
    assert!(statuses.contains(&502), "{statuses:?}");
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
