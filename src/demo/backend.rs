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

async fn answer(opts: &BackendOptions, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if path == "/health" {
        let mut r = Response::new(Full::new(Bytes::from_static(b"ok\n")));
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        return r;
    }
    let query = req.uri().query();
    let latency = match query_param(query, "sleep_ms").and_then(|v| v.parse::<u64>().ok()) {
        Some(ms) => ms,
        None if opts.jitter_ms > 0 => {
            let lo = opts.latency_ms.saturating_sub(opts.jitter_ms);
            fastrand::u64(lo..=opts.latency_ms + opts.jitter_ms)
        }
        None => opts.latency_ms,
    };
    let status = match query_param(query, "status").and_then(|v| v.parse::<u16>().ok()) {
        Some(s) => StatusCode::from_u16(s).unwrap_or(StatusCode::OK),
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
    r
}

/// Serves until the process is stopped.
pub(crate) async fn run(
    listener: std::net::TcpListener,
    opts: BackendOptions,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let opts: &'static BackendOptions = Box::leak(Box::new(opts));
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
            service_fn(move |req| async move { Ok::<_, Infallible>(answer(opts, req).await) });
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
