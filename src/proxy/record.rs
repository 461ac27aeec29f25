//! What happens once a request is over: metrics, the access log line, and (sampled) a
//! `request` event for the event stream. Every request is recorded exactly once — when
//! its response has been sent whole, when it failed, or when the client went away.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use http::uri::PathAndQuery;
use http::Method;

use crate::pool::{Backend, Event, Pool};

/// One request's facts, filled in along the way.
#[derive(Debug)]
pub struct Finish {
    /// When the request head had arrived.
    pub started: Instant,
    /// Request method.
    pub method: Method,
    /// Request target.
    pub path: PathAndQuery,
    /// The client (the connection's peer).
    pub client: IpAddr,
    /// Status sent to the client.
    pub status: u16,
    /// From sending the request upstream until the response headers arrived.
    pub upstream: Option<Duration>,
    /// Retries it took.
    pub retries: u32,
}

/// Records finished requests for one proxy (shared by its workers).
#[derive(Debug)]
pub struct Recorder {
    pool: std::sync::Arc<Pool>,
    access_log: bool,
}

/// Milliseconds with microsecond precision, for logs and events.
fn ms(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

impl Recorder {
    /// A recorder for `pool`'s backends; `access_log` writes one line per request.
    pub fn new(pool: std::sync::Arc<Pool>, access_log: bool) -> Recorder {
        Recorder { pool, access_log }
    }

    /// Records a finished request; `backend` is the one that served it (or failed it),
    /// `None` for fulcrum's own answers that reached no backend.
    pub fn finish(&self, f: &Finish, backend: Option<&Backend>) {
        let now = Instant::now();
        let total = now.saturating_duration_since(f.started);
        if let Some(b) = backend {
            b.stats.finished(f.status, total);
        }
        if self.access_log {
            tracing::info!(
                client = %f.client,
                method = %f.method,
                path = %f.path,
                status = f.status,
                backend = backend.map_or("-", |b| b.name.as_str()),
                upstream_ms = f.upstream.map(ms),
                total_ms = ms(total),
                retries = f.retries,
                "access"
            );
        }
        if let Some(b) = backend {
            if self.pool.sampler.sample(now) {
                self.pool.emit(Event::Request {
                    id: b.id,
                    backend: b.name.clone(),
                    status: f.status,
                    latency_ms: ms(total),
                    method: f.method.to_string(),
                    path: f.path.path().to_string(),
                    retries: f.retries,
                });
            }
        }
    }
}
