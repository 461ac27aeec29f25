//! **Traces** (`docs/tracing.md`): with `[tracing]`, a sampled request makes one server
//! span, and each try at a backend one client span, its child, whose id the backend gets
//! in `traceparent`. Spans are recorded here as plain facts into a bounded queue and
//! encoded as OTLP off the request path (`export`); without `[tracing]` no span is built
//! and the request path reads one flag.
//!
//! Why not the `opentelemetry` SDK's tracer: its spans carry their attributes as a
//! vector of owned key-values and go through a span processor's channel per span; the
//! measurement in `docs/performance.md` ("Traces") put that at about twice the cost of
//! these records, which keep each attribute in a field and leave the names to the encoder.

mod batch;
pub(crate) mod context;

pub(crate) use batch::{batch_this_thread, flush_this_thread};
pub(crate) use context::Traceparent;
pub(crate) mod export;

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use http::{HeaderValue, Method};

use crate::clock::Stamp;
use crate::config::trace_settings::TraceSettings;
use context::{ParentContext, SpanId, TraceId};

/// Whether a tracer is in force: the one read the request path makes without one.
static ON: AtomicBool = AtomicBool::new(false);

/// A request without a sampled caller starts a trace when a random `u64` is below this
/// (`sample` × 2⁶⁴; `u64::MAX`: every one; 0: none, and no number is drawn): decided
/// before the tracer is loaded.
static THRESHOLD: AtomicU64 = AtomicU64::new(0);

/// The tracer in force (`[tracing]`), replaced at a reload.
static TRACER: ArcSwapOption<Tracer> = ArcSwapOption::const_empty();

/// Spans dropped: the queue was full, or the collector did not take their batch
/// (`fulcrum_trace_spans_dropped_total`).
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Spans dropped since the start.
pub(crate) fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Puts `settings` in force (`None`: tracing off); spans already queued still go out
/// through the exporter that took them. Called at the start and at each reload.
pub(crate) fn install(settings: Option<&TraceSettings>) {
    let old = TRACER.load_full();
    if old.as_ref().map(|t| &t.settings) == settings {
        return;
    }
    let tracer = settings.map(|s| Arc::new(Tracer::start(s.clone())));
    THRESHOLD.store(
        settings.map_or(0, |s| threshold(s.sample)),
        Ordering::Release,
    );
    ON.store(tracer.is_some(), Ordering::Release);
    TRACER.store(tracer);
    // The old exporter is not closed: requests in flight still record into its queue,
    // and it ends once the last of them has (its queue's end is gone), after sending.
    drop(old);
}

/// Sends what waits and stops exporting, within `grace` (a stop, once requests are done).
pub(crate) fn flush(grace: std::time::Duration) {
    let Some(tracer) = TRACER.swap(None) else {
        return;
    };
    ON.store(false, Ordering::Release);
    tracer.queue.close();
    tracer.queue.flushed(grace);
}

/// `sample` as a threshold for a random `u64`.
fn threshold(sample: f64) -> u64 {
    match sample {
        s if s >= 1.0 => u64::MAX,
        s => (s * 18_446_744_073_709_551_616.0) as u64,
    }
}

/// Whether a request without a sampled caller starts a trace.
fn samples() -> bool {
    let t = THRESHOLD.load(Ordering::Relaxed);
    t == u64::MAX || (t > 0 && fastrand::u64(..) < t)
}

/// A `[tracing]` in force: how requests are sampled and where their spans go.
pub(crate) struct Tracer {
    settings: TraceSettings,
    /// Wall-clock nanoseconds minus monotonic ones: a span's times as OTLP wants them.
    wall_offset: u64,
    queue: export::Queue,
}

impl Tracer {
    fn start(settings: TraceSettings) -> Tracer {
        let wall_offset = crate::clock::unix_ns().wrapping_sub(Stamp::now().ns());
        let queue = export::Queue::start(&settings);
        Tracer {
            settings,
            wall_offset,
            queue,
        }
    }

    fn wall(&self, at: Stamp) -> u64 {
        at.ns().wrapping_add(self.wall_offset)
    }

    /// Queues `spans`; those there is no room for (`max_queue` wait already) are dropped
    /// and counted.
    fn hand(&self, spans: Vec<Span>) {
        let dropped = self.queue.push(spans);
        if dropped > 0 {
            DROPPED.fetch_add(dropped as u64, Ordering::Relaxed);
        }
    }
}

/// The trace a request belongs to, when it is sampled: begun when its head arrived,
/// written when its record is (`Recorder::finish`), one client span per try between.
pub(crate) struct Traced {
    /// What its tries' spans hang under (the server span).
    tries: TryParent,
    /// The caller's span, when the request came with a `traceparent`.
    parent: Option<SpanId>,
    /// The route's place in the routing table, once routed.
    pub(crate) route: Option<usize>,
    /// The pool and its strategy, once routed.
    pub(crate) pool: Option<(Arc<str>, &'static str)>,
    /// The step that answered the request itself (a rate limit, a deny list, JWT...).
    pub(crate) answered_by: Option<&'static str>,
    /// The try in progress (held here, not in the request's future across its wait).
    current: Option<TrySpan>,
}

/// A request's trace, if it has one: its caller's, when its `traceparent` says sampled;
/// none when it says not; else a new one for a `sample` share of requests.
/// `tracestate` is only looked up for a request that is traced.
#[inline]
pub(crate) fn begin<'h>(
    traceparent: impl FnOnce() -> Option<&'h [u8]>,
    tracestate: impl FnOnce() -> Option<&'h [u8]>,
) -> Option<Box<Traced>> {
    if !ON.load(Ordering::Relaxed) {
        return None;
    }
    let parent = traceparent().and_then(ParentContext::parse);
    if parent.is_none() && !samples() {
        return None;
    }
    begin_on(parent, tracestate)
}

#[inline(never)]
fn begin_on<'h>(
    parent: Option<ParentContext>,
    tracestate: impl FnOnce() -> Option<&'h [u8]>,
) -> Option<Box<Traced>> {
    let tracer = TRACER.load_full()?;
    let (trace, parent) = match parent {
        Some(p) if !p.sampled => return None,
        Some(p) => (p.trace, Some(p.span)),
        None => (TraceId::random(), None),
    };
    let state = match parent {
        Some(_) => tracestate().and_then(|v| HeaderValue::from_bytes(v).ok()),
        None => None,
    };
    Some(Box::new(Traced {
        tries: TryParent {
            tracer,
            trace,
            span: SpanId::random(),
            state,
        },
        parent,
        route: None,
        pool: None,
        answered_by: None,
        current: None,
    }))
}

impl std::fmt::Debug for Traced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traced")
            .field("trace", &self.tries.trace)
            .field("span", &self.tries.span)
            .finish_non_exhaustive()
    }
}

/// A try in progress: its span's id (the backend's `traceparent` names it) and start.
#[derive(Clone, Copy)]
pub(crate) struct TrySpan {
    id: SpanId,
    started: Stamp,
}

/// How a try ended, for its span: the backend's status, or why there was none.
pub(crate) enum TryOutcome {
    /// The backend answered with this status.
    Status(u16),
    /// No answer: the failure's name (`error.type`).
    Failed(&'static str),
}

/// What a request's tries hang under: its trace and its server span. Cloned into a
/// hedged race, whose tries end apart from the request's record.
#[derive(Clone)]
pub(crate) struct TryParent {
    tracer: Arc<Tracer>,
    trace: TraceId,
    /// The server span's id.
    span: SpanId,
    /// The caller's `tracestate`, kept on the spans (and forwarded as it came).
    state: Option<HeaderValue>,
}

impl TryParent {
    /// A new try: its span, and the `traceparent` its backend gets.
    pub(crate) fn begin_try(&self) -> (TrySpan, Traceparent) {
        let id = SpanId::random();
        let header = context::traceparent(&self.trace, &id);
        let started = Stamp::now();
        (TrySpan { id, started }, header)
    }

    /// The try `t` at `backend` ended with `outcome`: its client span queued.
    pub(crate) fn end_try(
        &self,
        t: TrySpan,
        backend: &Arc<crate::pool::Backend>,
        method: &Method,
        outcome: TryOutcome,
    ) {
        let tracer = &self.tracer;
        let span = Span {
            trace: self.trace,
            id: t.id,
            parent: Some(self.span),
            state: self.state.clone(),
            start: tracer.wall(t.started),
            end: tracer.wall(Stamp::now()),
            method: method.clone(),
            kind: SpanKind::Client {
                backend: Arc::clone(backend),
                outcome,
            },
        };
        batch::record(tracer, span);
    }
}

impl Traced {
    /// What its tries' spans hang under.
    pub(crate) fn tries(&self) -> &TryParent {
        &self.tries
    }

    /// A try begins: its span is held until [`Self::end_current`]; the `traceparent` its
    /// backend gets.
    pub(crate) fn begin_current(&mut self) -> Traceparent {
        let (span, header) = self.tries.begin_try();
        self.current = Some(span);
        header
    }

    /// The try begun last ended at `backend` with `outcome`.
    pub(crate) fn end_current(
        &mut self,
        backend: &Arc<crate::pool::Backend>,
        method: &Method,
        outcome: TryOutcome,
    ) {
        if let Some(span) = self.current.take() {
            self.tries.end_try(span, backend, method, outcome);
        }
    }

    /// The request ended: its server span queued.
    pub(crate) fn end(&self, r: &Ended<'_>) {
        let t = &self.tries;
        let tracer = &t.tracer;
        let span = Span {
            trace: t.trace,
            id: t.span,
            parent: self.parent,
            state: t.state.clone(),
            start: tracer.wall(r.started),
            end: tracer.wall(r.ended),
            method: r.method.clone(),
            kind: SpanKind::Server(ServerFacts {
                path: Text::of(r.path.path().as_bytes()),
                status: r.status,
                client: r.client,
                version: r.version,
                route: self.route,
                pool: self.pool.clone(),
                request_id: Text::of(r.request_id),
                answered_by: self.answered_by,
            }),
        };
        batch::record(tracer, span);
    }
}

/// A request's facts at its end, for its server span.
pub(crate) struct Ended<'a> {
    /// When its head had arrived, and when it ended.
    pub(crate) started: Stamp,
    pub(crate) ended: Stamp,
    pub(crate) method: &'a Method,
    /// The target (the span has its path, without the query).
    pub(crate) path: &'a http::uri::PathAndQuery,
    /// The status sent to the client.
    pub(crate) status: u16,
    pub(crate) client: IpAddr,
    /// The client's protocol.
    pub(crate) version: http::Version,
    /// Its `X-Request-Id`.
    pub(crate) request_id: &'a [u8],
}

/// A finished span, as recorded on the request path: facts, not yet OTLP.
pub(crate) struct Span {
    trace: TraceId,
    id: SpanId,
    parent: Option<SpanId>,
    state: Option<HeaderValue>,
    /// Wall-clock nanoseconds since the Unix epoch.
    start: u64,
    end: u64,
    method: Method,
    kind: SpanKind,
}

/// What only a server span or only a client span has. Not boxed: a box would be an
/// allocation per server span on the request path, freed on the exporter's thread.
#[allow(clippy::large_enum_variant)]
enum SpanKind {
    Server(ServerFacts),
    Client {
        /// The backend tried (its pool, name and address are read by the encoder).
        backend: Arc<crate::pool::Backend>,
        outcome: TryOutcome,
    },
}

/// A server span's attributes.
struct ServerFacts {
    path: Text<PATH_IN_PLACE>,
    status: u16,
    client: IpAddr,
    version: http::Version,
    route: Option<usize>,
    pool: Option<(Arc<str>, &'static str)>,
    request_id: Text<64>,
    answered_by: Option<&'static str>,
}

/// Paths up to this long are kept in the span itself.
const PATH_IN_PLACE: usize = 96;

/// Text a span keeps: in place when at most `N` bytes long (request ids, most paths),
/// else in a box. A copy, not a share of the request's buffers: a share would keep the
/// client connection's read buffer from being used again while the span waits for its
/// export, and that buffer would be made anew for the next request.
enum Text<const N: usize> {
    InPlace { bytes: [u8; N], len: u8 },
    Boxed(Box<[u8]>),
}

impl<const N: usize> Text<N> {
    fn of(text: &[u8]) -> Text<N> {
        match text.len() {
            len if len <= N && len <= usize::from(u8::MAX) => {
                let mut bytes = [0; N];
                bytes[..len].copy_from_slice(text);
                Text::InPlace {
                    bytes,
                    len: len as u8,
                }
            }
            _ => Text::Boxed(text.into()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Text::InPlace { bytes, len } => &bytes[..usize::from(*len)],
            Text::Boxed(b) => b,
        }
    }

    /// The text (paths and ids are ASCII; anything else is shown replaced).
    fn as_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(self.as_bytes())
    }
}

/// For the benchmark (`benches/spans.rs`, `docs/performance.md`, "Traces"): a tracer
/// in force that posts to `otlp`, with room for `max_queue` spans.
#[doc(hidden)]
pub fn bench_install(otlp: &str, max_queue: usize) {
    let settings = TraceSettings {
        endpoint: otlp
            .parse()
            .unwrap_or(http::Uri::from_static("http://127.0.0.1:9/v1/traces")),
        sample: 1.0,
        service_name: "fulcrum".into(),
        max_queue,
        headers: Vec::new(),
    };
    install(Some(&settings));
}

/// For the benchmark: what the request path records for one traced request with one
/// try at `backend` — the trace begun from a sampled caller's `traceparent`, the try's
/// span and `traceparent`, both spans ended and queued.
#[doc(hidden)]
pub fn bench_one_request(backend: &Arc<crate::pool::Backend>, target: &http::uri::PathAndQuery) {
    let caller = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let Some(mut t) = begin(|| Some(&caller[..]), || None) else {
        return;
    };
    t.route = Some(0);
    t.pool = Some((Arc::clone(&backend.pool), "round_robin"));
    let (span, header) = t.tries().begin_try();
    std::hint::black_box(&header);
    t.tries()
        .end_try(span, backend, &Method::GET, TryOutcome::Status(200));
    t.end(&Ended {
        started: Stamp::now(),
        ended: Stamp::now(),
        method: &Method::GET,
        path: target,
        status: 200,
        client: IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        version: http::Version::HTTP_11,
        request_id: b"4bf92f3577b34da6a3ce929d0e0e4736",
    });
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A server span, as a request without a route ends.
    pub(crate) fn span() -> Span {
        Span {
            trace: TraceId::random(),
            id: SpanId::random(),
            parent: None,
            state: None,
            start: 1,
            end: 2,
            method: Method::GET,
            kind: SpanKind::Server(ServerFacts {
                path: Text::of(b"/"),
                status: 404,
                client: IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
                version: http::Version::HTTP_11,
                route: None,
                pool: None,
                request_id: Text::of(b"id"),
                answered_by: None,
            }),
        }
    }

    #[test]
    fn text_is_kept_in_place_when_short() {
        let short = Text::<8>::of(b"/short");
        assert!(matches!(short, Text::InPlace { .. }));
        assert_eq!(short.as_str(), "/short");
        let long = Text::<8>::of(b"/longer than eight");
        assert!(matches!(long, Text::Boxed(_)));
        assert_eq!(long.as_str(), "/longer than eight");
        assert_eq!(Text::<8>::of(b"").as_str(), "");
    }
}
