//! Active health checks (`docs/operations.md`): `GET <backend><health-path>`, 2xx is success, consecutive
//! results against the thresholds decide, a change publishes a new routing table.
//!
//! Schedule. Every backend is probed at start-up (and as soon as it joins), then every
//! `--health-interval` with ±10 % jitter so probes of many backends do not align. Like
//! HAProxy's `fastinter`/`downinter`, a backend whose state is in question is probed
//! faster: while a streak towards a change is running, every 200 ms (at most the
//! interval); while it is down, every second (at most the interval). The thresholds
//! still decide, so faster probing confirms a change sooner without making one easier.
//! Each probe runs in its own task bounded by `--health-timeout`: a hung backend delays
//! nobody else's probes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Request};
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use crate::config::tcp::HealthKind;
use crate::config::HealthSettings;
use crate::pool::{Backend, Pool};

/// Probe period while a streak towards a change is running.
const FAST_INTERVAL: Duration = Duration::from_millis(200);
/// Probe period while a backend is down.
const DOWN_INTERVAL: Duration = Duration::from_secs(1);
/// How often the checker looks for probes that are due.
const TICK: Duration = Duration::from_millis(25);
/// Probes in flight at once. A pool of thousands is probed in waves of this size rather
/// than all at once, which would hold a connection and its buffers per backend (and
/// leave the allocator holding that peak) just after start.
const MAX_PROBES_IN_FLIGHT: usize = 1024;

/// The consecutive results of one backend and when to probe it next.
#[derive(Debug, Clone, Default)]
struct Streak {
    successes: u32,
    failures: u32,
}

/// What a probe result does to a backend currently `healthy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Unchanged,
    BecameHealthy,
    BecameUnhealthy,
}

impl Streak {
    /// Counts one result; a flip needs `healthy_threshold` successes in a row (when down)
    /// or `unhealthy_threshold` failures in a row (when up).
    fn record(&mut self, ok: bool, healthy: bool, s: &HealthSettings) -> Verdict {
        if ok {
            self.successes += 1;
            self.failures = 0;
        } else {
            self.failures += 1;
            self.successes = 0;
        }
        match (healthy, ok) {
            (true, false) if self.failures >= s.unhealthy_threshold => Verdict::BecameUnhealthy,
            (false, true) if self.successes >= s.healthy_threshold => Verdict::BecameHealthy,
            _ => Verdict::Unchanged,
        }
    }

    /// Time until the next probe (before jitter).
    fn next_in(&self, healthy: bool, s: &HealthSettings) -> Duration {
        let changing = if healthy {
            self.failures > 0
        } else {
            self.successes > 0
        };
        if changing {
            FAST_INTERVAL.min(s.interval)
        } else if !healthy {
            DOWN_INTERVAL.min(s.interval)
        } else {
            s.interval
        }
    }
}

fn jittered(d: Duration) -> Duration {
    d.mul_f64(0.9 + fastrand::f64() * 0.2)
}

/// One probe: connect, `GET path`, wait for the status line, all within `timeout`.
pub(crate) async fn probe(b: &Backend, path: &str, timeout: Duration) -> bool {
    let attempt = async {
        let stream = match b.socket_addr {
            Some(addr) => TcpStream::connect(addr).await,
            None => TcpStream::connect(b.authority.as_str()).await,
        }
        .ok()?;
        let _ = stream.set_nodelay(true);
        let mut stream = stream;
        if let Some(v) = b.transport.send_proxy {
            // The backend expects a PROXY header on every connection; a probe's names
            // no client.
            let header = crate::proxy_protocol::local_header(v);
            tokio::io::AsyncWriteExt::write_all(&mut stream, &header)
                .await
                .ok()?;
        }
        // Over TLS for an `https://` backend, verified as its traffic is, and in the
        // pool's HTTP version (a gRPC server may speak nothing but HTTP/2).
        let stream = TokioIo::new(b.transport.open(stream).await.ok()?);
        // `Via` as forwarded requests carry it: a backend that is this fulcrum answers
        // the probe 508 instead of probing its own backends in turn.
        let req = Request::get(path)
            .header(header::USER_AGENT, "fulcrum-health-check")
            .header(header::VIA, crate::loops::probe_element());
        let resp = if b.transport.h2 {
            let scheme = if b.transport.is_tls() {
                "https"
            } else {
                "http"
            };
            let uri = format!("{scheme}://{}{path}", b.authority);
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), stream)
                    .await
                    .ok()?;
            tokio::spawn(conn);
            let req = req.uri(uri).body(Empty::<Bytes>::new()).ok()?;
            sender.send_request(req).await.ok()?
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(stream).await.ok()?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let req = req
                .header(header::HOST, b.authority.as_str())
                .header(header::CONNECTION, "close")
                .body(Empty::<Bytes>::new())
                .ok()?;
            sender.send_request(req).await.ok()?
        };
        Some(resp.status().is_success())
    };
    matches!(tokio::time::timeout(timeout, attempt).await, Ok(Some(true)))
}

/// A connect check (`health.kind = "tcp"`, a TCP pool's default): the backend accepts
/// a connection within `timeout`. With `send_proxy_protocol` the connection opens
/// with a LOCAL header (HAProxy's `check-send-proxy`), then closes.
pub(crate) async fn connects(b: &Backend, timeout: Duration) -> bool {
    let attempt = async {
        let mut stream = match b.socket_addr {
            Some(addr) => TcpStream::connect(addr).await,
            None => TcpStream::connect(b.authority.as_str()).await,
        }
        .ok()?;
        if let Some(v) = b.transport.send_proxy {
            let header = crate::proxy_protocol::local_header(v);
            tokio::io::AsyncWriteExt::write_all(&mut stream, &header)
                .await
                .ok()?;
        }
        Some(())
    };
    matches!(tokio::time::timeout(timeout, attempt).await, Ok(Some(())))
}

/// Sends a probe's result when dropped; a failure unless the probe set one.
struct Report {
    tx: mpsc::UnboundedSender<(u64, bool)>,
    id: u64,
    ok: Option<bool>,
}

impl Drop for Report {
    fn drop(&mut self) {
        let _ = self.tx.send((self.id, self.ok.unwrap_or(false)));
    }
}

#[derive(Debug)]
struct Track {
    streak: Streak,
    next_at: Instant,
    probing: bool,
}

/// Runs the health checks of `pool`, with its own settings, until `stop` flips or the
/// pool is removed.
pub(crate) async fn run(pool: Arc<Pool>, mut stop: watch::Receiver<bool>) {
    let settings = Arc::new(pool.settings.health.clone());
    let mut retired = pool.retired();
    let (tx, mut results) = mpsc::unbounded_channel::<(u64, bool)>();
    let mut tracks: HashMap<u64, Track> = HashMap::new();
    let mut in_flight = 0usize;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = Instant::now();
                let backends = pool.backends();
                // Linear in the pool, not quadratic: pools of thousands are checked too.
                if tracks.len() > backends.len()
                    || backends.iter().any(|b| !tracks.contains_key(&b.id))
                {
                    let live: std::collections::HashSet<u64> =
                        backends.iter().map(|b| b.id).collect();
                    tracks.retain(|id, _| live.contains(id));
                }
                for b in backends {
                    let t = tracks.entry(b.id).or_insert_with(|| Track {
                        streak: Streak::default(),
                        next_at: now,
                        probing: false,
                    });
                    if t.probing || t.next_at > now {
                        continue;
                    }
                    if in_flight >= MAX_PROBES_IN_FLIGHT {
                        break;
                    }
                    in_flight += 1;
                    t.probing = true;
                    let tx = tx.clone();
                    let s = Arc::clone(&settings);
                    tokio::spawn(async move {
                        // Reports a failure if the probe never finishes (a panic), so the
                        // probe's slot is given back either way.
                        let mut report = Report { tx, id: b.id, ok: None };
                        let ok = match s.kind {
                            HealthKind::Http => probe(&b, &s.path, s.timeout).await,
                            HealthKind::Tcp => connects(&b, s.timeout).await,
                        };
                        b.live.stats.probe(ok);
                        report.ok = Some(ok);
                    });
                }
            }
            Some((id, ok)) = results.recv() => {
                in_flight = in_flight.saturating_sub(1);
                let Some(t) = tracks.get_mut(&id) else { continue };
                t.probing = false;
                let Ok(b) = pool.get(id) else { continue };
                let healthy = b.control.healthy();
                match t.streak.record(ok, healthy, &settings) {
                    Verdict::Unchanged => {}
                    Verdict::BecameUnhealthy => {
                        if pool.mark_health(id, false) {
                            tracing::warn!(backend = %b.name, failures = t.streak.failures, "backend is unhealthy");
                        }
                    }
                    Verdict::BecameHealthy => {
                        if pool.mark_health(id, true) {
                            tracing::info!(backend = %b.name, successes = t.streak.successes, "backend is healthy again");
                        }
                    }
                }
                let healthy = b.control.healthy();
                t.next_at = Instant::now() + jittered(t.streak.next_in(healthy, &settings));
            }
            _ = stop.changed() => return,
            _ = retired.wait_for(|r| *r) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> HealthSettings {
        HealthSettings {
            path: "/health".into(),
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            healthy_threshold: 2,
            unhealthy_threshold: 3,
            kind: Default::default(),
        }
    }

    #[test]
    fn only_consecutive_failures_make_a_backend_unhealthy() {
        let s = settings();
        let mut st = Streak::default();
        // fail, fail, succeed, over and over: never a change
        for _ in 0..10 {
            assert_eq!(st.record(false, true, &s), Verdict::Unchanged);
            assert_eq!(st.record(false, true, &s), Verdict::Unchanged);
            assert_eq!(st.record(true, true, &s), Verdict::Unchanged);
        }
        assert_eq!(st.record(false, true, &s), Verdict::Unchanged);
        assert_eq!(st.record(false, true, &s), Verdict::Unchanged);
        assert_eq!(st.record(false, true, &s), Verdict::BecameUnhealthy);
    }

    #[test]
    fn recovery_needs_the_healthy_threshold() {
        let s = settings();
        let mut st = Streak {
            successes: 0,
            failures: 3,
        };
        assert_eq!(st.record(true, false, &s), Verdict::Unchanged);
        assert_eq!(st.record(false, false, &s), Verdict::Unchanged);
        assert_eq!(st.record(true, false, &s), Verdict::Unchanged);
        assert_eq!(st.record(true, false, &s), Verdict::BecameHealthy);
    }

    #[test]
    fn probing_is_faster_while_in_question() {
        let s = settings();
        let steady = Streak::default();
        assert_eq!(steady.next_in(true, &s), s.interval);
        assert_eq!(steady.next_in(false, &s), DOWN_INTERVAL);
        let failing = Streak {
            successes: 0,
            failures: 1,
        };
        assert_eq!(failing.next_in(true, &s), FAST_INTERVAL);
        let short = HealthSettings {
            interval: Duration::from_millis(100),
            ..settings()
        };
        assert_eq!(failing.next_in(true, &short), short.interval);
        for _ in 0..100 {
            let j = jittered(Duration::from_secs(1));
            assert!(j >= Duration::from_millis(900) && j <= Duration::from_millis(1100));
        }
    }
}
