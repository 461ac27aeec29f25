//! The traffic generator behind `POST /admin/traffic`: real requests, sent at a fixed
//! (open-loop) rate through fulcrum's own proxy listener, so the dashboard shows the
//! balancer deciding on live traffic without any outside tool.
//!
//! Bounded: at most [`MAX_RPS`] requests per second for at most [`MAX_SECONDS`], one run
//! at a time, and at most [`MAX_IN_FLIGHT`] of its requests outstanding (a request that
//! would exceed it counts as an error instead of piling up).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;

/// Highest request rate.
pub(crate) const MAX_RPS: u64 = 5000;
/// Longest run.
pub(crate) const MAX_SECONDS: u64 = 600;
/// Outstanding generator requests allowed.
pub(crate) const MAX_IN_FLIGHT: u64 = 1000;
/// Latency samples kept for the percentiles (the most recent ones).
const SAMPLES: usize = 4096;
/// A generator request slower than this counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What a run was asked to do.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Requests per second.
    pub(crate) rps: u64,
    /// Run length.
    pub(crate) seconds: u64,
    /// Path (and query) requested.
    pub(crate) path: String,
    /// Further paths, requested in turn with `path` (the demo's pools each get some).
    pub(crate) more_paths: Vec<String>,
}

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    ok: AtomicU64,
    errors: AtomicU64,
    /// Set by `stop`: the run sends nothing more (checked before every 10 ms batch).
    stopped: std::sync::atomic::AtomicBool,
    /// Recent latencies in microseconds (ring buffer) and the next slot.
    recent: Mutex<(Vec<u32>, usize)>,
}

impl Counters {
    fn sample(&self, d: Duration) {
        let us = d.as_micros().min(u32::MAX as u128) as u32;
        let mut r = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let (buf, next) = &mut *r;
        if buf.len() < SAMPLES {
            buf.push(us);
        } else {
            buf[*next] = us;
        }
        *next = (*next + 1) % SAMPLES;
    }

    fn percentiles(&self) -> (Option<f64>, Option<f64>) {
        let mut v = self
            .recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone();
        if v.is_empty() {
            return (None, None);
        }
        v.sort_unstable();
        let at = |q: f64| {
            let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
            v[i] as f64 / 1000.0
        };
        (Some(at(0.50)), Some(at(0.99)))
    }
}

#[derive(Debug)]
struct Run {
    plan: Plan,
    started: Instant,
    ended: Option<Instant>,
    counters: Arc<Counters>,
}

/// Progress of the current (or last) run, as `GET /admin/traffic` shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Progress {
    /// Whether a run is going on.
    pub(crate) running: bool,
    /// Requested rate.
    pub(crate) rps: Option<u64>,
    /// Requested length.
    pub(crate) seconds: Option<u64>,
    /// Requested path.
    pub(crate) path: Option<String>,
    /// Seconds since the run started (until it ended).
    pub(crate) elapsed_s: f64,
    /// Requests sent.
    pub(crate) sent: u64,
    /// Requests answered below 500.
    pub(crate) ok: u64,
    /// Requests answered 5xx, failed, timed out or not sent for the in-flight bound.
    pub(crate) errors: u64,
    /// `sent / elapsed_s`.
    pub(crate) achieved_rps: f64,
    /// Median latency of recent requests, ms.
    pub(crate) p50_ms: Option<f64>,
    /// 99th percentile latency of recent requests, ms.
    pub(crate) p99_ms: Option<f64>,
}

/// Why a run cannot start.
#[derive(Debug, PartialEq)]
pub(crate) enum StartError {
    /// Another run is going on.
    Busy,
}

/// The generator: one run at a time against the proxy listener.
#[derive(Debug)]
pub(crate) struct Traffic {
    target: SocketAddr,
    run: Mutex<Option<Run>>,
    /// Outstanding requests of every run: a stopped run's requests still count until
    /// they end, so start/stop cycles cannot pile them up.
    in_flight: Arc<AtomicU64>,
}

impl Traffic {
    /// A generator sending to the proxy listening on `listen` (an unspecified address
    /// is reached over loopback).
    pub(crate) fn new(listen: SocketAddr) -> Traffic {
        let mut target = listen;
        if target.ip().is_unspecified() {
            target.set_ip(if listen.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        Traffic {
            target,
            run: Mutex::new(None),
            in_flight: Arc::new(AtomicU64::new(0)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Run>> {
        self.run.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a run (in the current tokio runtime).
    pub(crate) fn start(self: &Arc<Self>, plan: Plan) -> Result<Progress, StartError> {
        let mut slot = self.lock();
        if slot.as_ref().is_some_and(|r| r.ended.is_none()) {
            return Err(StartError::Busy);
        }
        let counters = Arc::new(Counters::default());
        *slot = Some(Run {
            plan: plan.clone(),
            started: Instant::now(),
            ended: None,
            counters: Arc::clone(&counters),
        });
        drop(slot);
        let me = Arc::clone(self);
        tokio::spawn(async move {
            me.drive(&plan, &counters).await;
            if let Some(r) = me.lock().as_mut() {
                if Arc::ptr_eq(&r.counters, &counters) && r.ended.is_none() {
                    r.ended = Some(Instant::now());
                }
            }
        });
        Ok(self.progress())
    }

    /// The URIs the plan asks for in turn.
    /// The address it sends to.
    pub(crate) fn target(&self) -> SocketAddr {
        self.target
    }

    fn targets(&self, plan: &Plan) -> Vec<http::Uri> {
        std::iter::once(&plan.path)
            .chain(&plan.more_paths)
            .filter_map(|p| format!("http://{}{p}", self.target).parse().ok())
            .collect()
    }

    /// Sends the plan's requests: every 10 ms the share of the rate that is due.
    async fn drive(&self, plan: &Plan, c: &Arc<Counters>) {
        let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let uris = self.targets(plan);
        if uris.is_empty() {
            return;
        }
        let start = Instant::now();
        let end = start + Duration::from_secs(plan.seconds);
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut due_total: u64 = 0;
        loop {
            tick.tick().await;
            let now = Instant::now();
            if now >= end || c.stopped.load(Ordering::Relaxed) {
                return;
            }
            // Open loop: what the rate asks for by now, whatever came back.
            let due =
                (now.duration_since(start).as_secs_f64() * plan.rps as f64).floor() as u64 + 1;
            while due_total < due {
                due_total += 1;
                c.sent.fetch_add(1, Ordering::Relaxed);
                if self.in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
                    c.errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                self.in_flight.fetch_add(1, Ordering::Relaxed);
                let in_flight = Arc::clone(&self.in_flight);
                let c = Arc::clone(c);
                let client = client.clone();
                let uri = uris[(due_total % uris.len() as u64) as usize].clone();
                tokio::spawn(async move {
                    let t0 = Instant::now();
                    let req = http::Request::get(uri)
                        .header(http::header::USER_AGENT, "fulcrum-traffic")
                        .body(Empty::<Bytes>::new());
                    let ok = match req {
                        Ok(req) => {
                            let exchange = async {
                                let resp = client.request(req).await.ok()?;
                                let status = resp.status();
                                resp.into_body().collect().await.ok()?;
                                Some(status)
                            };
                            matches!(
                                tokio::time::timeout(REQUEST_TIMEOUT, exchange).await,
                                Ok(Some(s)) if !s.is_server_error()
                            )
                        }
                        Err(_) => false,
                    };
                    c.sample(t0.elapsed());
                    let counter = if ok { &c.ok } else { &c.errors };
                    counter.fetch_add(1, Ordering::Relaxed);
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                });
            }
        }
    }

    /// Stops the running run, if any.
    pub(crate) fn stop(&self) -> Progress {
        if let Some(r) = self.lock().as_mut() {
            if r.ended.is_none() {
                r.ended = Some(Instant::now());
                r.counters.stopped.store(true, Ordering::Relaxed);
            }
        }
        self.progress()
    }

    /// The current or last run's progress.
    pub(crate) fn progress(&self) -> Progress {
        let slot = self.lock();
        let Some(r) = slot.as_ref() else {
            return Progress {
                running: false,
                rps: None,
                seconds: None,
                path: None,
                elapsed_s: 0.0,
                sent: 0,
                ok: 0,
                errors: 0,
                achieved_rps: 0.0,
                p50_ms: None,
                p99_ms: None,
            };
        };
        let until = r.ended.unwrap_or_else(Instant::now);
        let elapsed = until.saturating_duration_since(r.started).as_secs_f64();
        let sent = r.counters.sent.load(Ordering::Relaxed);
        let (p50, p99) = r.counters.percentiles();
        Progress {
            running: r.ended.is_none(),
            rps: Some(r.plan.rps),
            seconds: Some(r.plan.seconds),
            path: Some(r.plan.path.clone()),
            elapsed_s: (elapsed * 1000.0).round() / 1000.0,
            sent,
            ok: r.counters.ok.load(Ordering::Relaxed),
            errors: r.counters.errors.load(Ordering::Relaxed),
            achieved_rps: if elapsed > 0.0 {
                ((sent as f64 / elapsed) * 10.0).round() / 10.0
            } else {
                0.0
            },
            p50_ms: p50,
            p99_ms: p99,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_recent_samples() {
        let c = Counters::default();
        assert_eq!(c.percentiles(), (None, None));
        for ms in 1..=100 {
            c.sample(Duration::from_millis(ms));
        }
        assert_eq!(c.percentiles(), (Some(50.0), Some(99.0)));
        // The ring keeps only the most recent samples.
        for _ in 0..SAMPLES {
            c.sample(Duration::from_millis(7));
        }
        assert_eq!(c.percentiles(), (Some(7.0), Some(7.0)));
    }
}
