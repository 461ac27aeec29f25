//! What one traced request's spans cost on the request path: a server span and a client
//! span with the attributes of `docs/tracing.md`, recorded by fulcrum (facts into its
//! queue; encoding happens on the exporter's thread) against the same two spans made
//! with the `opentelemetry` SDK's tracer and its batch span processor (a no-op exporter).
//!
//! `cargo bench --bench spans`; under `cargo test --all-targets` each case runs once.
//! Figures: `docs/performance.md`, "Traces".

use std::sync::Arc;

use fulcrum::config::backend_spec;
use fulcrum::pool::Backend;
use opentelemetry::trace::{Span, SpanKind, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::KeyValue;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};

fn main() {
    divan::main();
}

/// Queue room for every span a run makes, so that none is dropped for want of it.
const ROOM: usize = 1 << 20;

#[divan::bench]
fn fulcrum_records(b: divan::Bencher) {
    let spec = backend_spec("http://127.0.0.1:9001", None, None).expect("valid");
    let backend = Arc::new(Backend::new(1, spec, 0.1));
    let target = http::uri::PathAndQuery::from_static("/api/items?page=2");
    // Nothing listens there: the exporter's batches fail off the request path.
    fulcrum::trace::bench_install("http://127.0.0.1:9", ROOM);
    b.bench(|| fulcrum::trace::bench_one_request(&backend, &target));
}

#[derive(Debug)]
struct Nowhere;

impl SpanExporter for Nowhere {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        divan::black_box(batch);
        Ok(())
    }
}

#[divan::bench]
fn sdk_tracer(b: divan::Bencher) {
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(Nowhere)
        .build();
    let tracer = provider.tracer("fulcrum");
    b.bench(|| {
        let mut server = tracer
            .span_builder("GET")
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("http.request.method", "GET"),
                KeyValue::new("url.path", "/api/items"),
                KeyValue::new("client.address", "127.0.0.1"),
                KeyValue::new("network.protocol.name", "http"),
                KeyValue::new("network.protocol.version", "1.1"),
                KeyValue::new("fulcrum.route", 0),
                KeyValue::new("fulcrum.pool", "default"),
                KeyValue::new("fulcrum.strategy", "round_robin"),
                KeyValue::new("fulcrum.request_id", "4bf92f3577b34da6a3ce929d0e0e4736"),
            ])
            .start(&tracer);
        let cx = opentelemetry::Context::current()
            .with_remote_span_context(server.span_context().clone());
        let mut client = tracer
            .span_builder("GET")
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("http.request.method", "GET"),
                KeyValue::new("server.address", "127.0.0.1"),
                KeyValue::new("server.port", 9001),
                KeyValue::new("fulcrum.pool", "default"),
                KeyValue::new("fulcrum.backend", "127.0.0.1:9001"),
            ])
            .start_with_context(&tracer, &cx);
        client.set_attribute(KeyValue::new("http.response.status_code", 200));
        client.end();
        server.set_attribute(KeyValue::new("http.response.status_code", 200));
        server.end();
    });
    let _ = provider.shutdown();
}
