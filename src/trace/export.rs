//! The exporter (`docs/tracing.md`, "Export"): spans wait in a bounded queue; a thread of
//! its own gathers them into batches of at most 512, at least every 5 s, encodes them as
//! OTLP protobuf (`opentelemetry-proto`) and posts them to the collector, one export at a
//! time within 10 s. A collector that is slow or down only fills the queue: past
//! `max_queue` spans are dropped and counted, and no request waits. A `429` or `503` is
//! retried after its `Retry-After` (seconds or an HTTP date; else after 1 s), three tries
//! in all; other failures drop the batch. Failures are logged at most once a minute.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span, status, ResourceSpans, ScopeSpans, Status};
use prost::Message;
use tokio::sync::{mpsc, watch};

use super::{Span, SpanKind, TryOutcome};
use crate::config::trace_settings::TraceSettings;

/// The most spans one export carries.
const BATCH: usize = 512;
/// The longest a span waits for its batch.
const EVERY: Duration = Duration::from_secs(5);
/// One export's time limit.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Tries of a batch the collector asked to send later.
const TRIES: u32 = 3;
/// How often the queue is looked at.
const LOOK_EVERY: Duration = Duration::from_millis(100);
/// Failures are logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The queue's end on the request path.
pub(crate) struct Queue {
    tx: mpsc::UnboundedSender<Vec<Span>>,
    /// Spans queued or in the export in flight.
    waiting: Arc<AtomicUsize>,
    max: usize,
    close: watch::Sender<bool>,
    /// The exporting thread, until it is waited for.
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Queue {
    /// A queue, and the thread that exports what it holds.
    pub(super) fn start(settings: &TraceSettings) -> Queue {
        let (tx, rx) = mpsc::unbounded_channel();
        let (close, closed) = watch::channel(false);
        let waiting = Arc::new(AtomicUsize::new(0));
        let exporter = Exporter {
            rx,
            taken: Vec::new(),
            closed,
            waiting: Arc::clone(&waiting),
            endpoint: settings.endpoint.clone(),
            headers: settings.headers.clone(),
            service: settings.service_name.clone(),
            resource: None,
            last_logged: None,
        };
        let spawned = std::thread::Builder::new()
            .name("fulcrum-traces".into())
            .spawn(move || exporter.run())
            .inspect_err(|e| tracing::error!(error = %e, "traces: cannot start the exporter"));
        Queue {
            tx,
            waiting,
            max: settings.max_queue,
            close,
            thread: std::sync::Mutex::new(spawned.ok()),
        }
    }

    /// Queues `spans`, as many as there is room for (`max_queue` in all): how many
    /// found none and were dropped.
    pub(super) fn push(&self, mut spans: Vec<Span>) -> usize {
        let n = spans.len();
        // Room reserved at once, never more than there is: two workers handing batches
        // on together cannot crowd each other out.
        let mut room = 0;
        let reserved = self
            .waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |waiting| {
                room = self.max.saturating_sub(waiting).min(n);
                (room > 0).then_some(waiting + room)
            });
        if reserved.is_err() {
            return n;
        }
        spans.truncate(room);
        if self.tx.send(spans).is_err() {
            self.waiting.fetch_sub(room, Ordering::Relaxed);
            return n;
        }
        n - room
    }

    /// Spans queued or in the export in flight.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Has the exporter send what waits, then stop.
    pub(super) fn close(&self) {
        let _ = self.close.send(true);
    }

    /// Waits, at most `grace`, for the exporter to have sent what waited and stopped,
    /// and for those a reload replaced to have sent theirs.
    pub(super) fn flushed(&self, grace: Duration) {
        let mut threads = RETIRED
            .lock()
            .map(|mut r| r.split_off(0))
            .unwrap_or_default();
        threads.extend(self.thread.lock().ok().and_then(|mut t| t.take()));
        let until = Instant::now() + grace;
        while threads.iter().any(|t| !t.is_finished()) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        for t in threads.into_iter().filter(|t| t.is_finished()) {
            let _ = t.join();
        }
    }
}

/// Exporters whose queue is gone (a reload replaced their tracer) and that may still be
/// sending their last spans: a stop waits for them too ([`Queue::flushed`]).
static RETIRED: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>> =
    std::sync::Mutex::new(Vec::new());

impl Drop for Queue {
    fn drop(&mut self) {
        let thread = self.thread.get_mut().ok().and_then(Option::take);
        if let (Some(t), Ok(mut retired)) = (thread, RETIRED.lock()) {
            retired.retain(|t| !t.is_finished());
            if !t.is_finished() {
                retired.push(t);
            }
        }
    }
}

/// The exporting thread's state.
struct Exporter {
    rx: mpsc::UnboundedReceiver<Vec<Span>>,
    /// Spans taken from the queue, not yet in a batch.
    taken: Vec<Span>,
    closed: watch::Receiver<bool>,
    waiting: Arc<AtomicUsize>,
    endpoint: http::Uri,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    service: String,
    /// The spans' resource, made at the first export (the instance id is known by then).
    resource: Option<Resource>,
    last_logged: Option<Instant>,
}

impl Exporter {
    fn run(mut self) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        match rt {
            Ok(rt) => rt.block_on(self.export_until_closed()),
            Err(e) => tracing::error!(error = %e, "traces: cannot start the exporter"),
        }
    }

    async fn export_until_closed(&mut self) {
        loop {
            let (batch, closing) = self.gather().await;
            if !batch.is_empty() {
                let n = batch.len();
                self.export(batch).await;
                self.waiting.fetch_sub(n, Ordering::Relaxed);
            }
            if closing {
                return;
            }
        }
    }

    /// The next batch: up to [`BATCH`] spans, gathered for at most [`EVERY`] after the
    /// first; `true` once the queue is closed (the batch has what was left).
    ///
    /// The queue is looked at every [`LOOK_EVERY`] rather than waited on: a wait would
    /// have every span recorded wake this thread, a system call on the request path.
    async fn gather(&mut self) -> (Vec<Span>, bool) {
        let mut since = None;
        loop {
            let disconnected = self.take();
            if disconnected || *self.closed.borrow() {
                // At most a batch at a time, until the queue is empty.
                let last = self.taken.len() <= BATCH && self.rx.is_empty();
                return (self.batch(), last);
            }
            if since.is_none() && !self.taken.is_empty() {
                since = Some(Instant::now());
            }
            if self.taken.len() >= BATCH || since.is_some_and(|t| t.elapsed() >= EVERY) {
                return (self.batch(), false);
            }
            match tokio::time::timeout(LOOK_EVERY, self.closed.changed()).await {
                Ok(Ok(())) | Err(_) => {}
                // The queue's end is gone: the next look finds the channel closed.
                Ok(Err(_)) => tokio::time::sleep(LOOK_EVERY).await,
            }
        }
    }

    /// Takes what the queue holds, up to a batch; `true` once the queue's end is gone
    /// and it is empty.
    fn take(&mut self) -> bool {
        while self.taken.len() < BATCH {
            match self.rx.try_recv() {
                Ok(spans) => self.taken.extend(spans),
                Err(mpsc::error::TryRecvError::Empty) => return false,
                Err(mpsc::error::TryRecvError::Disconnected) => return true,
            }
        }
        false
    }

    /// The next batch: at most [`BATCH`] of the spans taken.
    fn batch(&mut self) -> Vec<Span> {
        let n = self.taken.len().min(BATCH);
        self.taken.drain(..n).collect()
    }

    /// Sends `batch`, again after a pause when the collector asks for one.
    async fn export(&mut self, batch: Vec<Span>) {
        let n = batch.len();
        let body = Bytes::from(self.encode(batch).encode_to_vec());
        for attempt in 1..=TRIES {
            match self.post(body.clone()).await {
                Ok(()) => return,
                // At a stop there is no time to wait for the collector.
                Err(Failure::Later(pause)) if attempt < TRIES && !*self.closed.borrow() => {
                    tokio::time::sleep(pause).await
                }
                Err(Failure::Later(_)) => self.failed(n, "the collector kept asking to wait"),
                Err(Failure::Other(why)) => return self.failed(n, &why),
            }
        }
    }

    fn failed(&mut self, n: usize, why: &str) {
        super::DROPPED.fetch_add(n as u64, Ordering::Relaxed);
        let now = Instant::now();
        if self
            .last_logged
            .is_none_or(|t| now.duration_since(t) >= LOG_EVERY)
        {
            self.last_logged = Some(now);
            let to = &self.endpoint;
            tracing::warn!(%to, error = why, spans = n, "traces: export failed, spans dropped");
        }
    }

    async fn post(&self, body: Bytes) -> Result<(), Failure> {
        let mut req = http::Request::post(self.endpoint.clone())
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .header(http::header::USER_AGENT, "fulcrum");
        for (name, value) in &self.headers {
            req = req.header(name, value);
        }
        let req = req
            .body(http_body_util::Full::new(body))
            .map_err(|e| Failure::Other(e.to_string()))?;
        let tls = crate::transport::client_config(&crate::config::BackendTransport::default());
        let sent = crate::fetch::send(tls, req, 64 * 1024);
        let answer = match tokio::time::timeout(EXPORT_TIMEOUT, sent).await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => return Err(Failure::Other(e)),
            Err(_) => {
                return Err(Failure::Other(format!(
                    "no answer within {EXPORT_TIMEOUT:?}"
                )))
            }
        };
        match answer.status().as_u16() {
            200..=299 => Ok(()),
            429 | 503 => Err(Failure::Later(retry_after(answer.headers()))),
            s => Err(Failure::Other(format!("the collector answered {s}"))),
        }
    }

    /// The batch as OTLP: one resource (this instance), one scope (fulcrum).
    fn encode(&mut self, batch: Vec<Span>) -> ExportTraceServiceRequest {
        let service = &self.service;
        let resource = (self.resource)
            .get_or_insert_with(|| resource(service, &crate::loops::instance()))
            .clone();
        let scope = InstrumentationScope {
            name: "fulcrum".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        };
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(resource),
                scope_spans: vec![ScopeSpans {
                    scope: Some(scope),
                    spans: batch.into_iter().map(otlp_span).collect(),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        }
    }
}

/// Why an export did not go through.
enum Failure {
    /// `429` / `503`: again after this pause.
    Later(Duration),
    Other(String),
}

/// `Retry-After` as seconds or as an HTTP date (RFC 9110 allows both), from 1 s to a
/// minute; one second without one, or with one that reads as neither.
fn retry_after(fields: &http::HeaderMap) -> Duration {
    let value = fields
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let secs = match value {
        Some(v) => v.parse::<u64>().ok().or_else(|| {
            let at = httpdate::parse_http_date(v).ok()?;
            let left = at
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default();
            Some(left.as_secs())
        }),
        None => None,
    };
    Duration::from_secs(secs.unwrap_or(1).clamp(1, 60))
}

fn resource(service: &str, instance: &str) -> Resource {
    Resource {
        attributes: vec![
            text("service.name", service),
            text("service.instance.id", instance),
        ],
        ..Default::default()
    }
}

fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

fn int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(value)),
        }),
        ..Default::default()
    }
}

/// A recorded span as OTLP, its attributes under the semantic conventions' names.
fn otlp_span(s: Span) -> opentelemetry_proto::tonic::trace::v1::Span {
    let mut attributes = vec![text("http.request.method", s.method.as_str())];
    let (kind, error) = match s.kind {
        SpanKind::Server(f) => {
            server_attributes(&mut attributes, &f);
            (span::SpanKind::Server, f.status >= 500)
        }
        SpanKind::Client { backend, outcome } => {
            let (host, port) = split_authority(backend.authority.as_str());
            attributes.push(text("server.address", host));
            if let Some(port) = port {
                attributes.push(int("server.port", i64::from(port)));
            }
            attributes.push(text("fulcrum.pool", &backend.pool));
            attributes.push(text("fulcrum.backend", &backend.name));
            let error = match outcome {
                TryOutcome::Status(code) => {
                    attributes.push(int("http.response.status_code", i64::from(code)));
                    code >= 400
                }
                TryOutcome::Failed(why) => {
                    attributes.push(text("error.type", why));
                    true
                }
            };
            (span::SpanKind::Client, error)
        }
    };
    opentelemetry_proto::tonic::trace::v1::Span {
        trace_id: s.trace.0.to_vec(),
        span_id: s.id.0.to_vec(),
        trace_state: s
            .state
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .into(),
        parent_span_id: s.parent.map(|p| p.0.to_vec()).unwrap_or_default(),
        flags: 1,
        name: s.method.as_str().into(),
        kind: kind as i32,
        start_time_unix_nano: s.start,
        end_time_unix_nano: s.end.max(s.start),
        attributes,
        status: error.then(|| Status {
            code: status::StatusCode::Error as i32,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn server_attributes(a: &mut Vec<KeyValue>, f: &super::ServerFacts) {
    a.push(text("url.path", &f.path.as_str()));
    a.push(int("http.response.status_code", i64::from(f.status)));
    a.push(text("client.address", &f.client.to_string()));
    a.push(text("network.protocol.name", "http"));
    let version = match f.version {
        http::Version::HTTP_2 => "2",
        http::Version::HTTP_3 => "3",
        http::Version::HTTP_10 => "1.0",
        _ => "1.1",
    };
    a.push(text("network.protocol.version", version));
    if let Some(route) = f.route {
        a.push(int("fulcrum.route", route as i64));
    }
    if let Some((pool, strategy)) = &f.pool {
        a.push(text("fulcrum.pool", pool));
        a.push(text("fulcrum.strategy", strategy));
    }
    a.push(text("fulcrum.request_id", &f.request_id.as_str()));
    if let Some(step) = f.answered_by {
        a.push(text("fulcrum.answered_by", step));
    }
}

/// `host:port` (or `[v6]:port`) as its host and port.
fn split_authority(a: &str) -> (&str, Option<u16>) {
    match a.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(':') => match port.parse() {
            Ok(p) => (host.trim_start_matches('[').trim_end_matches(']'), Some(p)),
            Err(_) => (a, None),
        },
        _ => (a, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(v: &str) -> Duration {
        let mut f = http::HeaderMap::new();
        f.insert(http::header::RETRY_AFTER, v.parse().unwrap());
        retry_after(&f)
    }

    #[test]
    fn retry_after_reads_seconds_or_a_date_within_a_minute() {
        assert_eq!(retry_after(&http::HeaderMap::new()), Duration::from_secs(1));
        assert_eq!(after("7"), Duration::from_secs(7));
        assert_eq!(after("0"), Duration::from_secs(1));
        assert_eq!(after("86400"), Duration::from_secs(60));
        assert_eq!(after("soon"), Duration::from_secs(1));
        let in_20s = std::time::SystemTime::now() + Duration::from_secs(21);
        let d = after(&httpdate::fmt_http_date(in_20s));
        assert!((19..=21).contains(&d.as_secs()), "{d:?}");
        // A date gone by: at once, as soon as allowed.
        assert_eq!(
            after("Sun, 06 Nov 1994 08:49:37 GMT"),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn authorities_split_into_host_and_port() {
        assert_eq!(split_authority("b.example:8080"), ("b.example", Some(8080)));
        assert_eq!(split_authority("[::1]:9000"), ("::1", Some(9000)));
        assert_eq!(split_authority("b.example"), ("b.example", None));
    }
}
