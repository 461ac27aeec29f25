//! Traces (`docs/tracing.md`) over real sockets: a real OTLP/HTTP receiver (written here,
//! decoding what fulcrum posts with the opentelemetry-proto definitions), real backends
//! that note the `traceparent` they get, and fulcrum stopped with `SIGTERM` so that the
//! spans still queued go out at once.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, Span};
use prost::Message;

/// A resource's attributes, as text.
type Attributes = Vec<(String, String)>;

/// An OTLP/HTTP receiver: each POST's body decoded, its spans kept (with the resource's
/// attributes), answered `200` after `delay`.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    resources: Arc<Mutex<Vec<Attributes>>>,
    paths: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    fn start(delay: Duration) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let r = Receiver {
            addr: listener.local_addr().unwrap(),
            spans: Arc::default(),
            resources: Arc::default(),
            paths: Arc::default(),
        };
        let (spans, resources, paths) = (r.spans.clone(), r.resources.clone(), r.paths.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let Some((path, body)) = read_request(conn.try_clone().unwrap()) else {
                    continue;
                };
                let req = match ExportTraceServiceRequest::decode(body.as_slice()) {
                    Ok(req) => req,
                    Err(e) => {
                        paths.lock().unwrap().push(format!("undecodable: {e}"));
                        continue;
                    }
                };
                paths.lock().unwrap().push(path);
                for rs in req.resource_spans {
                    let attrs = rs.resource.map(|r| r.attributes).unwrap_or_default();
                    let attrs = attrs
                        .into_iter()
                        .map(|kv| (kv.key, text(&kv.value)))
                        .collect();
                    resources.lock().unwrap().push(attrs);
                    for ss in rs.scope_spans {
                        spans.lock().unwrap().extend(ss.spans);
                    }
                }
                std::thread::sleep(delay);
                let mut conn = conn;
                let _ = conn.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
            }
        });
        r
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

/// A request's path and body (by `Content-Length`).
fn read_request(mut s: TcpStream) -> Option<(String, Vec<u8>)> {
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    let end = loop {
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let path = head.split_whitespace().nth(1)?.to_string();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().ok())
        })
        .flatten()?;
    while buf.len() < end + len {
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some((path, buf[end..end + len].to_vec()))
}

fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => format!("int:{i}"),
        other => format!("{other:?}"),
    }
}

fn attr(s: &Span, key: &str) -> Option<String> {
    s.attributes
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| text(&kv.value))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A backend answering `status` to every request and noting each `traceparent` it gets.
fn noting_backend(status: u16) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    noting_backend_after(status, Duration::ZERO)
}

/// [`noting_backend`], each answer after `delay`.
fn noting_backend_after(status: u16, delay: Duration) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let noted = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let noted = noted.clone();
            std::thread::spawn(move || serve_noting(conn, (status, delay), &noted));
        }
    });
    (addr, seen)
}

fn serve_noting(mut conn: TcpStream, (status, delay): (u16, Duration), noted: &Mutex<Vec<String>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Ok(n) = conn.read(&mut chunk) else { return };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        while let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
            buf.drain(..i + 4);
            // Health probes are answered 200: only requests meet `status`.
            let probe = head.starts_with("get /health");
            // Every traceparent line: one added rather than replaced shows as two.
            for tp in head.lines().filter_map(|l| l.strip_prefix("traceparent:")) {
                noted.lock().unwrap().push(tp.trim().to_string());
            }
            let status = if probe { 200 } else { status };
            if !probe {
                std::thread::sleep(delay);
            }
            let answer = format!("HTTP/1.1 {status} X\r\ncontent-length: 2\r\n\r\nok");
            if conn.write_all(answer.as_bytes()).is_err() {
                return;
            }
        }
    }
}

/// The config of [`start`]: a pool of `backends`, a route that denies everyone under
/// `/private`, one for the rest, and `[tracing]` unless `tracing` is `None`.
fn config(tag: &str, backends: &[SocketAddr], settings: &str, tracing: Option<&str>) -> PathBuf {
    let list: Vec<String> = backends
        .iter()
        .map(|a| format!("{{ url = \"http://{a}\" }}"))
        .collect();
    let tracing = tracing
        .map(|t| format!("[tracing]\n{t}\n"))
        .unwrap_or_default();
    let text = format!(
        "[[pools]]\nname = \"web\"\n{settings}\nbackends = [{}]\n\
         [[routes]]\npool = \"web\"\npath_prefix = \"/private\"\ndeny = [\"127.0.0.0/8\"]\n\
         [[routes]]\npool = \"web\"\n{tracing}",
        list.join(", ")
    );
    config_file("traces", tag, &text)
}

fn start(tag: &str, backends: &[SocketAddr], settings: &str, tracing: &str) -> Fulcrum {
    let cfg = config(tag, backends, settings, Some(tracing));
    Fulcrum::start(&[
        "--config",
        cfg.to_str().unwrap(),
        "--health-interval",
        "60s",
    ])
}

/// Stops `f` (its queued spans are sent at the stop).
fn stop(mut f: Fulcrum) {
    f.signal("TERM");
    assert!(
        f.wait_exit(Duration::from_secs(15)).is_some(),
        "fulcrum did not stop"
    );
}

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampled_callers_trace_is_continued_through_the_backend() {
    let collector = Receiver::start(Duration::ZERO);
    let (backend, seen) = noting_backend(200);
    let tracing = format!(
        "otlp = \"{}\"\nsample = 0\nservice_name = \"edge\"",
        collector.url()
    );
    let f = start("continued", &[backend], "", &tracing);
    let c = client();
    let parent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let headers = [("traceparent", parent.as_str()), ("tracestate", "vendor=1")];
    let r = send(&c, "GET", &f.url("/a"), &headers, "").await;
    assert_eq!(r.status.as_u16(), 200);
    let request_id = r.header("x-request-id").unwrap().to_string();
    // Denied by the route's list: the span says which step answered.
    let r = send(&c, "GET", &f.url("/private/x"), &headers, "").await;
    assert_eq!(r.status.as_u16(), 403);
    stop(f);

    let spans = collector.spans();
    assert_eq!(collector.paths.lock().unwrap()[0], "/v1/traces");
    let server: Vec<&Span> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Server as i32)
        .collect();
    let client_spans: Vec<&Span> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Client as i32)
        .collect();
    assert_eq!((server.len(), client_spans.len()), (2, 1), "{spans:#?}");
    let served = server
        .iter()
        .find(|s| attr(s, "url.path").as_deref() == Some("/a"))
        .unwrap();
    let try_span = client_spans[0];
    assert_eq!(hex(&served.trace_id), CALLER_TRACE);
    assert_eq!(hex(&served.parent_span_id), CALLER_SPAN);
    assert_eq!(served.trace_state, "vendor=1");
    assert_eq!(hex(&try_span.trace_id), CALLER_TRACE);
    assert_eq!(try_span.parent_span_id, served.span_id);
    // The backend got the client span's id.
    let expected = format!("00-{CALLER_TRACE}-{}-01", hex(&try_span.span_id));
    assert_eq!(*seen.lock().unwrap(), vec![expected]);
    assert_eq!(
        attr(served, "http.response.status_code").as_deref(),
        Some("int:200")
    );
    assert_eq!(attr(served, "http.request.method").as_deref(), Some("GET"));
    assert_eq!(
        attr(served, "network.protocol.version").as_deref(),
        Some("1.1")
    );
    assert_eq!(attr(served, "client.address").as_deref(), Some("127.0.0.1"));
    assert_eq!(attr(served, "fulcrum.pool").as_deref(), Some("web"));
    assert_eq!(
        attr(served, "fulcrum.strategy").as_deref(),
        Some("round_robin")
    );
    assert_eq!(attr(served, "fulcrum.route").as_deref(), Some("int:1"));
    assert_eq!(attr(served, "fulcrum.request_id"), Some(request_id));
    assert_eq!(
        attr(try_span, "server.address").as_deref(),
        Some("127.0.0.1")
    );
    assert_eq!(
        attr(try_span, "server.port"),
        Some(format!("int:{}", backend.port()))
    );
    assert_eq!(
        attr(try_span, "http.response.status_code").as_deref(),
        Some("int:200")
    );
    assert!(served.start_time_unix_nano <= try_span.start_time_unix_nano);
    assert!(try_span.end_time_unix_nano <= served.end_time_unix_nano);
    let denied = server
        .iter()
        .find(|s| attr(s, "url.path").as_deref() == Some("/private/x"))
        .unwrap();
    assert_eq!(
        attr(denied, "http.response.status_code").as_deref(),
        Some("int:403")
    );
    assert_eq!(
        attr(denied, "fulcrum.answered_by").as_deref(),
        Some("allow")
    );
    let resource = &collector.resources.lock().unwrap()[0];
    let get = |k: &str| {
        resource
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("service.name").as_deref(), Some("edge"));
    assert!(get("service.instance.id").is_some_and(|id| !id.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsampled_callers_and_sample_zero_make_no_span_and_a_retry_makes_two_tries() {
    let collector = Receiver::start(Duration::ZERO);
    let (good, _) = noting_backend(200);
    let (bad, _) = noting_backend(500);
    let tracing = format!("otlp = \"{}\"\nsample = 0", collector.url());
    let settings = "retry_on = [\"5xx\"]\noutlier = { consecutive_failures = 0 }";
    let f = start("sampling", &[bad, good], settings, &tracing);
    let c = client();
    let unsampled = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-00");
    for headers in [vec![], vec![("traceparent", unsampled.as_str())]] {
        for _ in 0..2 {
            // The retry budget's floor is 3 a second (`docs/operations.md`).
            tokio::time::sleep(Duration::from_millis(400)).await;
            let r = send(&c, "GET", &f.url("/quiet"), &headers, "").await;
            assert_eq!(r.status.as_u16(), 200);
        }
    }
    // Sampled callers: round robin sends one of two requests to the failing backend first.
    let sampled = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    for _ in 0..2 {
        let r = send(
            &c,
            "GET",
            &f.url("/traced"),
            &[("traceparent", sampled.as_str())],
            "",
        )
        .await;
        assert_eq!(r.status.as_u16(), 200);
    }
    stop(f);
    let spans = collector.spans();
    assert!(spans
        .iter()
        .all(|s| attr(s, "url.path").as_deref() != Some("/quiet")));
    let servers: Vec<&Span> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Server as i32)
        .collect();
    assert_eq!(servers.len(), 2, "{spans:#?}");
    let tries_of = |server: &Span| -> Vec<Option<String>> {
        let mut t: Vec<_> = spans
            .iter()
            .filter(|s| s.parent_span_id == server.span_id)
            .map(|s| attr(s, "http.response.status_code"))
            .collect();
        t.sort();
        t
    };
    let retried = servers
        .iter()
        .find(|s| tries_of(s).len() == 2)
        .unwrap_or_else(|| panic!("no retried request: {spans:#?}"));
    assert_eq!(
        tries_of(retried),
        vec![Some("int:200".to_string()), Some("int:500".to_string())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_a_changed_tracing_section() {
    let (first, second) = (
        Receiver::start(Duration::ZERO),
        Receiver::start(Duration::ZERO),
    );
    let (backend, _) = noting_backend(200);
    let tracing = |to: &Receiver, sample: u8| format!("otlp = \"{}\"\nsample = {sample}", to.url());
    let f = start("reload", &[backend], "", &tracing(&first, 1));
    let c = client();
    let paths = ["/before", "/after", "/off"];
    let changes = [Some(tracing(&second, 1)), None];
    let get_path = |path: &'static str| {
        let (c, url) = (&c, f.url(path));
        async move { assert_eq!(get(c, &url).await.status.as_u16(), 200) }
    };
    get_path(paths[0]).await;
    for (change, path) in changes.iter().zip(&paths[1..]) {
        config("reload", &[backend], "", change.as_deref());
        let r = admin(&c, "POST", &f.admin_url("/admin/reload"), "").await;
        assert_eq!(r.status, 200, "{}", r.text());
        get_path(path).await;
    }
    // The span of the request made under the second tracer goes out although tracing
    // is off by the time it is handed on.
    let sent = eventually(Duration::from_secs(3), || async {
        !second.spans().is_empty()
    });
    assert!(sent.await, "no span reached the second collector");
    stop(f);
    let at = |r: &Receiver| -> Vec<String> {
        let mut p: Vec<String> = r
            .spans()
            .iter()
            .filter_map(|s| attr(s, "url.path"))
            .collect();
        p.sort();
        p.dedup();
        p
    };
    // Each request's span went to the collector in force when it ended: none after
    // `[tracing]` went.
    assert_eq!(at(&first), vec!["/before".to_string()]);
    assert_eq!(at(&second), vec!["/after".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_request_shows_each_try_the_loser_cancelled() {
    let collector = Receiver::start(Duration::ZERO);
    let (slow, slow_seen) = noting_backend_after(200, Duration::from_millis(700));
    let (fast, fast_seen) = noting_backend(200);
    let tracing = format!("otlp = \"{}\"", collector.url());
    let settings = "hedge = { after = \"50ms\", max = 1 }\noutlier = { consecutive_failures = 0 }";
    let f = start("hedged", &[slow, fast], settings, &tracing);
    let c = client();
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(get(&c, &f.url("/h")).await.status.as_u16(), 200);
    }
    stop(f);
    let spans = collector.spans();
    let servers: Vec<&Span> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Server as i32)
        .collect();
    let tries_of = |server: &Span| -> Vec<&Span> {
        spans
            .iter()
            .filter(|s| s.parent_span_id == server.span_id)
            .collect()
    };
    // Round robin met the slow backend first once: that request raced two tries.
    let raced = servers
        .iter()
        .find(|s| tries_of(s).len() == 2)
        .unwrap_or_else(|| panic!("no hedged request: {spans:#?}"));
    let mut ends: Vec<_> = tries_of(raced)
        .iter()
        .map(|s| (attr(s, "http.response.status_code"), attr(s, "error.type")))
        .collect();
    ends.sort();
    assert_eq!(
        ends,
        vec![
            (None, Some("cancelled".into())),
            (Some("int:200".into()), None)
        ]
    );
    // Each backend got its own try's span id.
    let ids: Vec<String> = tries_of(raced).iter().map(|s| hex(&s.span_id)).collect();
    let got = |seen: &Mutex<Vec<String>>| {
        seen.lock()
            .unwrap()
            .iter()
            .any(|tp| ids.iter().any(|id| tp.contains(id.as_str())))
    };
    assert!(got(&slow_seen) && got(&fast_seen));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_dead_collector_never_delays_a_request_and_drops_are_counted() {
    let (backend, _) = noting_backend(200);
    let slow = Receiver::start(Duration::from_secs(3));
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for (tag, url) in [("slow", slow.url()), ("dead", format!("http://{dead}"))] {
        // A full batch (512 spans) goes out at once, and while it is in flight (3 s at
        // the slow collector) it holds the queue: the spans after it find no room.
        let tracing = format!("otlp = \"{url}\"\nmax_queue = 600");
        let f = start(tag, &[backend], "", &tracing);
        let c = client();
        let mut slowest = Duration::ZERO;
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(1500) {
            let t = Instant::now();
            let r = get(&c, &f.url("/x")).await;
            assert_eq!(r.status.as_u16(), 200);
            slowest = slowest.max(t.elapsed());
        }
        assert!(
            slowest < Duration::from_millis(500),
            "{tag}: a request took {slowest:?}"
        );
        let dropped = metric(&f, "fulcrum_trace_spans_dropped_total").await;
        assert!(dropped >= 100, "{tag}: {dropped} dropped");
        if tag == "slow" {
            // The export was under way: the collector had the batch while requests went on.
            let got = eventually(Duration::from_secs(5), || async {
                !slow.spans().is_empty()
            });
            assert!(got.await);
        }
        drop(f);
    }
}

#[test]
fn bad_tracing_settings_exit_2_naming_the_key() {
    for (text, names) in [
        ("otlp = \"grpc://127.0.0.1:4317\"", "tracing.otlp"),
        (
            "otlp = \"http://127.0.0.1:4318\"\nsample = 1.5",
            "tracing.sample",
        ),
        (
            "otlp = \"http://127.0.0.1:4318\"\nexporter = \"zipkin\"",
            "tracing.exporter",
        ),
        ("sample = 0.5", "otlp"),
    ] {
        let cfg = config_file("traces", "bad", &format!("[tracing]\n{text}\n"));
        let args = [
            "serve",
            "--config",
            cfg.to_str().unwrap(),
            "--backend",
            "http://127.0.0.1:9",
        ];
        let (status, _, err) = run_fulcrum(&args);
        assert_eq!(status.code(), Some(2), "{text}: {err}");
        assert!(err.contains(names) && err.contains("line"), "{text}: {err}");
    }
}
