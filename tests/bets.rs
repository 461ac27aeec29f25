//! The smarter bets over real processes: success-rate ejection, load reported by the
//! backends, adaptive concurrency and `POST /admin/explain`.

mod common;

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");

/// A `fulcrum backend` process on a free port, killed when dropped.
struct DemoBackend {
    child: Child,
    port: u16,
    name: String,
}

impl DemoBackend {
    fn start(name: &str, extra: &[&str]) -> DemoBackend {
        let port = free_port();
        let child = Command::new(BIN)
            .args(["backend", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--name", name])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a demo backend");
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "backend {name} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        DemoBackend {
            child,
            port,
            name: name.into(),
        }
    }

    /// The `--backend` value naming it.
    fn spec(&self) -> String {
        format!("http://127.0.0.1:{},name={}", self.port, self.name)
    }
}

impl Drop for DemoBackend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// fulcrum over `backends`, with `extra` flags.
fn over(backends: &[DemoBackend], extra: &[&str]) -> Fulcrum {
    let mut args: Vec<String> = Vec::new();
    for b in backends {
        args.push("--backend".into());
        args.push(b.spec());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Fulcrum::start(&args)
}

/// Sends `n` GETs, `clients` at a time; returns how many answered 5xx.
async fn load(c: &HttpClient, f: &Fulcrum, n: usize, clients: usize) -> usize {
    let url = f.url("/");
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (c, url) = (c.clone(), url.clone());
        let share = n / clients + usize::from(i < n % clients);
        tasks.push(tokio::spawn(async move {
            let mut failed = 0;
            for _ in 0..share {
                if get(&c, &url).await.status.is_server_error() {
                    failed += 1;
                }
            }
            failed
        }));
    }
    let mut failed = 0;
    for t in tasks {
        failed += t.await.unwrap();
    }
    failed
}

/// Each backend's `ejected` flag, by name.
async fn ejected(c: &HttpClient, f: &Fulcrum) -> Vec<(String, bool)> {
    status(c, f).await["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let name = b["name"].as_str().unwrap().to_string();
            (name, b["ejected"].as_bool().unwrap())
        })
        .collect()
}

/// Success-rate flags: a one-second window, passive consecutive-failure checks off so
/// that only the success rate can eject.
const SUCCESS_RATE: [&str; 4] = [
    "--outlier-consecutive-failures",
    "0",
    "--outlier-success-rate",
    "interval=1s,min_hosts=3,min_requests=20,stdev_factor=1.5",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_failing_fast_is_ejected_by_its_success_rate_within_two_intervals() {
    let backends = vec![
        DemoBackend::start("a", &[]),
        DemoBackend::start("b", &[]),
        DemoBackend::start("c", &[]),
        DemoBackend::start("d", &[]),
        DemoBackend::start("sick", &["--error-rate", "0.35"]),
    ];
    let f = over(&backends, &SUCCESS_RATE);
    let c = client();
    let mut events = EventStream::open(&f);
    let t = Instant::now();
    let mut out = false;
    while t.elapsed() < Duration::from_millis(2200) && !out {
        load(&c, &f, 100, 4).await;
        out = ejected(&c, &f).await.contains(&("sick".into(), true));
    }
    assert!(out, "not ejected after {:?}", t.elapsed());
    let e = events.find(Duration::from_secs(2), |e| {
        e["type"] == "ejection" && e["backend"] == "sick" && e["ejected"] == true
    });
    let e = e.expect("an ejection event");
    assert_eq!(e["reason"], "success_rate", "{e}");
    let others = ejected(&c, &f).await;
    assert_eq!(others.iter().filter(|(_, e)| *e).count(), 1, "{others:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_failing_as_a_whole_ejects_nobody() {
    let backends: Vec<_> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|n| DemoBackend::start(n, &["--error-rate", "0.3"]))
        .collect();
    let f = over(&backends, &SUCCESS_RATE);
    let c = client();
    let t = Instant::now();
    let mut failed = 0;
    let mut sent = 0;
    while t.elapsed() < Duration::from_millis(3500) {
        failed += load(&c, &f, 100, 4).await;
        sent += 100;
        let now = ejected(&c, &f).await;
        assert!(now.iter().all(|(_, e)| !e), "{now:?}");
    }
    let share = failed as f64 / sent as f64;
    assert!(
        (0.2..0.4).contains(&share),
        "the pool fails as a whole: {share}"
    );
}
