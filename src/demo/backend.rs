//! `fulcrum backend`: a small HTTP server to balance over (`docs/architecture.md`, "The demo").

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

/// How the demo backend behaves.
#[derive(Debug, Clone)]
pub(crate) struct BackendOptions {
    /// Name reported in every answer.
    pub(crate) name: String,
    /// Base latency of every answer.
    pub(crate) latency_ms: u64,
    /// Uniform jitter around the latency, ±.
    pub(crate) jitter_ms: u64,
    /// Share of requests answered with 500.
    pub(crate) error_rate: f64,
    /// How its behaviour changes over its life (the strategy lab's scenarios).
    pub(crate) script: Script,
    /// Whether its answers carry its load report.
    pub(crate) report_load: bool,
    /// A TCP service of lines instead of HTTP (`demo/tcp_backend.rs`).
    pub(crate) tcp: bool,
}

/// The share of answers a brownout refuses.
const BROWNOUT_SHARE: f64 = 1.0 / 3.0;

/// The concurrency a backend without `--max-concurrency` reports its utilization
/// against.
const DEFAULT_CONCURRENCY: usize = 100;

/// A behaviour scripted over the backend's life, timed from its start, for the strategy
/// lab (`docs/lab.md`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Script {
    /// At most this many requests served at once; the others wait inside the backend,
    /// as in a server with a fixed pool of workers.
    pub(crate) max_concurrency: Option<usize>,
    /// From this long after start on, every latency is `slow_factor` times longer.
    pub(crate) slow_after: Option<Duration>,
    /// How much slower after `slow_after`.
    pub(crate) slow_factor: f64,
    /// Failure bursts: in each period this long, the requests of its first half are
    /// answered 500 (half of them in all).
    pub(crate) fail_bursts: Option<Duration>,
    /// A cold start: latency ten times longer at start, back to normal linearly over
    /// this long.
    pub(crate) cold_for: Option<Duration>,
    /// A brownout: from this long after start on, [`BROWNOUT_SHARE`] of the answers are
    /// 503, sent at once.
    pub(crate) brownout_after: Option<Duration>,
    /// The script's clock starts when a line arrives on stdin, not at start: the lab
    /// starts every backend's clock at the same instant as its schedule.
    pub(crate) clock_on_stdin: bool,
}

impl Script {
    /// How many times longer than its base a latency is at `age`.
    fn slowdown(&self, age: Duration) -> f64 {
        let mut f = 1.0;
        if let Some(cold) = self.cold_for {
            if age < cold {
                f *= 1.0 + 9.0 * (1.0 - age.as_secs_f64() / cold.as_secs_f64());
            }
        }
        if self.slow_after.is_some_and(|t| age >= t) {
            f *= self.slow_factor;
        }
        f
    }

    /// Whether a request arriving at `age` is one the brownout refuses.
    fn browned_out(&self, age: Duration) -> bool {
        self.brownout_after.is_some_and(|t| age >= t) && fastrand::f64() < BROWNOUT_SHARE
    }

    /// Whether a request arriving at `age` falls in a failure burst.
    fn failing(&self, age: Duration) -> bool {
        self.fail_bursts.is_some_and(|period| {
            let p = period.as_secs_f64();
            p > 0.0 && age.as_secs_f64() % p < p / 2.0
        })
    }
}

/// The backend while it runs: its options, when its script's clock started, its
/// worker slots.
struct Live {
    opts: BackendOptions,
    started: std::sync::OnceLock<std::time::Instant>,
    slots: Option<tokio::sync::Semaphore>,
    /// What its load reports are made of.
    load: std::sync::Mutex<LoadWindow>,
}

/// The requests of the current second and of the last whole one: how many, and how long
/// they held a worker in all.
#[derive(Debug)]
struct LoadWindow {
    start: std::time::Instant,
    requests: u64,
    busy: Duration,
    /// The last whole second's (requests per second, utilization), once there is one.
    last: Option<(f64, f64)>,
}

impl LoadWindow {
    /// Counts a request that was in the backend for `busy`, rolling the window on at
    /// whole seconds.
    fn count(&mut self, busy: Duration, concurrency: usize, now: std::time::Instant) {
        let span = now.saturating_duration_since(self.start);
        if span >= Duration::from_secs(1) {
            let secs = span.as_secs_f64();
            let utilization = self.busy.as_secs_f64() / secs / concurrency as f64;
            self.last = Some((self.requests as f64 / secs, utilization));
            self.start = now;
            self.requests = 0;
            self.busy = Duration::ZERO;
        }
        self.requests += 1;
        self.busy += busy;
    }

    /// The `endpoint-load-metrics` value of the last whole second.
    fn report(&self) -> Option<HeaderValue> {
        let (rps, utilization) = self.last?;
        let text = format!("TEXT cpu_utilization={utilization:.4}, rps_fractional={rps:.2}");
        HeaderValue::from_str(&text).ok()
    }
}

impl Live {
    /// How far into its script the backend is: zero until the clock starts.
    fn age(&self) -> Duration {
        self.started.get().map_or(Duration::ZERO, |t| t.elapsed())
    }
}

/// Starts `live`'s clock when stdin gives a line (or closes). A thread of its own: a
/// blocking read, once.
fn start_clock_on_stdin(live: &'static Live) {
    let spawned = std::thread::Builder::new()
        .name("backend-clock".into())
        .spawn(move || {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
            let _ = live.started.set(std::time::Instant::now());
        });
    if spawned.is_err() {
        let _ = live.started.set(std::time::Instant::now());
    }
}

fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn json_escape(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

async fn answer(live: &Live, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let opts = &live.opts;
    let path = req.uri().path();
    if path == "/health" {
        let mut r = Response::new(Full::new(Bytes::from_static(b"ok\n")));
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        return r;
    }
    // A request waits for a worker slot first: that wait is the backend's queue.
    let _slot = match &live.slots {
        Some(s) => s.acquire().await.ok(),
        None => None,
    };
    // Its service starts now: the utilization it reports is the workers' busy share,
    // never over 1, whatever waits for them.
    let arrived = std::time::Instant::now();
    let age = live.age();
    let query = req.uri().query();
    let base = match query_param(query, "sleep_ms").and_then(|v| v.parse::<u64>().ok()) {
        Some(ms) => ms,
        None if opts.jitter_ms > 0 => {
            let lo = opts.latency_ms.saturating_sub(opts.jitter_ms);
            fastrand::u64(lo..=opts.latency_ms + opts.jitter_ms)
        }
        None => opts.latency_ms,
    };
    let latency = (base as f64 * opts.script.slowdown(age)).round() as u64;
    if opts.script.browned_out(age) {
        let mut r = Response::new(Full::new(Bytes::from_static(b"brownout\n")));
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        return r;
    }
    let status = match query_param(query, "status").and_then(|v| v.parse::<u16>().ok()) {
        Some(s) => StatusCode::from_u16(s).unwrap_or(StatusCode::OK),
        None if opts.script.failing(age) => StatusCode::INTERNAL_SERVER_ERROR,
        None if opts.error_rate > 0.0 && fastrand::f64() < opts.error_rate => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        None => StatusCode::OK,
    };
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    let body = format!(
        "{{\"backend\":{},\"method\":{},\"path\":{},\"latency_ms\":{}}}\n",
        json_escape(&opts.name),
        json_escape(req.method().as_str()),
        json_escape(path),
        latency
    );
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if opts.report_load {
        let now = std::time::Instant::now();
        let concurrency = opts.script.max_concurrency.unwrap_or(DEFAULT_CONCURRENCY);
        let mut w = live.load.lock().unwrap_or_else(|e| e.into_inner());
        w.count(now.saturating_duration_since(arrived), concurrency, now);
        if let Some(v) = w.report() {
            r.headers_mut().insert("endpoint-load-metrics", v);
        }
    }
    r
}

/// Serves until the process is stopped.
pub(crate) async fn run(
    listener: std::net::TcpListener,
    opts: BackendOptions,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let slots = opts
        .script
        .max_concurrency
        .map(|n| tokio::sync::Semaphore::new(n.max(1)));
    let on_stdin = opts.script.clock_on_stdin;
    let live: &'static Live = Box::leak(Box::new(Live {
        opts,
        started: std::sync::OnceLock::new(),
        slots,
        load: std::sync::Mutex::new(LoadWindow {
            start: std::time::Instant::now(),
            requests: 0,
            busy: Duration::ZERO,
            last: None,
        }),
    }));
    if on_stdin {
        start_clock_on_stdin(live);
    } else {
        let _ = live.started.set(std::time::Instant::now());
    }
    if live.opts.tcp {
        let answers: &'static _ = Box::leak(Box::new(super::tcp_backend::Answers {
            name: live.opts.name.clone(),
            latency_ms: live.opts.latency_ms,
            jitter_ms: live.opts.jitter_ms,
        }));
        let slowdown: &'static (dyn Fn() -> f64 + Sync) =
            Box::leak(Box::new(move || live.opts.script.slowdown(live.age())));
        return super::tcp_backend::run(listener, answers, slowdown).await;
    }
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(a) => a,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let svc =
            service_fn(move |req| async move { Ok::<_, Infallible>(answer(live, req).await) });
        let conn = builder
            .serve_connection(TokioIo::new(stream), svc)
            .into_owned();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

/// Serves on `listener` on a small runtime; returns only on error.
pub(crate) fn serve_blocking(
    listener: std::net::TcpListener,
    opts: BackendOptions,
) -> Result<(), String> {
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    tracing::info!("backend {} listening on {}", opts.name, addr);
    rt.block_on(run(listener, opts)).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_slows_fails_and_warms_up_on_time() {
        let s = Script {
            slow_after: Some(Duration::from_secs(5)),
            slow_factor: 10.0,
            fail_bursts: Some(Duration::from_secs(2)),
            cold_for: Some(Duration::from_secs(2)),
            ..Default::default()
        };
        let at = Duration::from_millis;
        assert!((s.slowdown(at(0)) - 10.0).abs() < 1e-9);
        assert!((s.slowdown(at(1000)) - 5.5).abs() < 1e-9);
        assert!((s.slowdown(at(3000)) - 1.0).abs() < 1e-9);
        assert!((s.slowdown(at(6000)) - 10.0).abs() < 1e-9);
        assert!(s.failing(at(500)) && !s.failing(at(1500)) && s.failing(at(2100)));
        assert!(!Script::default().failing(at(500)));
    }
}
