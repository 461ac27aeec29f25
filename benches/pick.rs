//! Cost of one `pick` per strategy and pool size.
//!
//! `cargo bench --bench pick`; under `cargo test --all-targets` each case runs once.

use std::sync::Arc;

use fulcrum::config::backend_spec;
use fulcrum::pool::{Backend, RequestGuard};
use fulcrum::strategy::{PickCtx, Picker, StrategyKind};

fn main() {
    divan::main();
}

/// Pool sizes: 3, 100 and 10,000 under `cargo bench`; under `cargo test` (each case
/// runs once, unoptimised) the 10,000-backend pools, whose hash rings take seconds to
/// build there, are left out.
fn sizes() -> Vec<usize> {
    if std::env::args().any(|a| a == "--bench") {
        vec![3, 100, 10_000]
    } else {
        vec![3, 100]
    }
}

fn pool(n: usize) -> Vec<Arc<Backend>> {
    (0..n)
        .map(|i| {
            let url = format!(
                "http://10.{}.{}.{}:80",
                (i >> 16) & 255,
                (i >> 8) & 255,
                i & 255
            );
            let spec = backend_spec(&url, Some(1 + (i as u32 * 7) % 10), None).expect("valid");
            Arc::new(Backend::new(i as u64, spec, 0.1))
        })
        .collect()
}

/// `pool(n)` with something for the load-aware strategies to compare: 1..=4 requests in
/// flight on every backend, so no idle backend ends a scan early (the worst case), and a
/// latency average on every one (no unsampled backend ends it either). The guards keep
/// the requests in flight.
fn busy_pool(n: usize) -> (Vec<Arc<Backend>>, Vec<RequestGuard>) {
    let backends = pool(n);
    let guards: Vec<_> = backends
        .iter()
        .enumerate()
        .flat_map(|(i, b)| (0..=(i % 4)).map(move |_| b.begin_request()))
        .collect();
    for (i, b) in backends.iter().enumerate() {
        fulcrum::strategy::record_latency(
            b,
            std::time::Duration::from_micros(500 + (i as u64 * 37) % 1000),
        );
    }
    (backends, guards)
}

fn bench_pick(bencher: divan::Bencher, kind: StrategyKind, n: usize) {
    let (backends, _guards) = busy_pool(n);
    let picker = Picker::build(kind, &backends);
    if kind.key_source().is_some() {
        // A different key on every pick, as traffic has: the lookups miss the cache as
        // they would.
        bencher
            .with_inputs(|| fastrand::u64(..))
            .bench_local_values(|key| {
                let ctx = PickCtx {
                    tried: &[],
                    key: Some(key),
                };
                picker.pick(divan::black_box(&backends), &ctx)
            });
    } else {
        let ctx = PickCtx::default();
        bencher.bench_local(|| picker.pick(divan::black_box(&backends), &ctx));
    }
}

#[divan::bench(args = sizes())]
fn round_robin(bencher: divan::Bencher, n: usize) {
    bench_pick(bencher, StrategyKind::RoundRobin, n);
}

#[divan::bench(args = sizes())]
fn weighted_round_robin(bencher: divan::Bencher, n: usize) {
    bench_pick(bencher, StrategyKind::WeightedRoundRobin, n);
}

#[divan::bench(args = sizes())]
fn least_connections(bencher: divan::Bencher, n: usize) {
    bench_pick(bencher, StrategyKind::LeastConnections, n);
}

#[divan::bench(args = sizes())]
fn weighted_least_connections(bencher: divan::Bencher, n: usize) {
    bench_pick(bencher, StrategyKind::WeightedLeastConnections, n);
}

/// A whole request's worth of a load-aware strategy's work: the pick, then the start and
/// end of the request on the picked backend, which keep a large pool's index current.
fn bench_pick_start_end(bencher: divan::Bencher, kind: StrategyKind, n: usize) {
    let (backends, _guards) = busy_pool(n);
    let picker = Picker::build(kind, &backends);
    picker.attach(&backends, &backends);
    let ctx = PickCtx::default();
    bencher.bench_local(|| {
        let i = picker.pick(divan::black_box(&backends), &ctx).unwrap_or(0);
        drop(divan::black_box(backends[i].begin_request()));
    });
}

#[divan::bench(args = sizes())]
fn least_connections_pick_start_end(bencher: divan::Bencher, n: usize) {
    bench_pick_start_end(bencher, StrategyKind::LeastConnections, n);
}

#[divan::bench(args = sizes())]
fn weighted_least_connections_pick_start_end(bencher: divan::Bencher, n: usize) {
    bench_pick_start_end(bencher, StrategyKind::WeightedLeastConnections, n);
}

#[divan::bench(args = sizes())]
fn least_response_time_pick_start_end(bencher: divan::Bencher, n: usize) {
    bench_pick_start_end(bencher, StrategyKind::LeastResponseTime, n);
}

#[divan::bench(args = sizes())]
fn least_response_time(bencher: divan::Bencher, n: usize) {
    bench_pick(bencher, StrategyKind::LeastResponseTime, n);
}

#[divan::bench(args = sizes())]
fn peak_ewma(bencher: divan::Bencher, n: usize) {
    bench_pick(bencher, StrategyKind::PeakEwma, n);
}

#[divan::bench(args = sizes())]
fn power_of_two(bencher: divan::Bencher, n: usize) {
    bench_pick(bencher, StrategyKind::PowerOfTwo, n);
}

#[divan::bench(args = sizes())]
fn consistent_hash(bencher: divan::Bencher, n: usize) {
    bench_pick(bencher, StrategyKind::ConsistentHash, n);
}

#[divan::bench(args = sizes())]
fn ip_hash(bencher: divan::Bencher, n: usize) {
    bench_pick(bencher, StrategyKind::IpHash, n);
}

#[divan::bench(args = sizes())]
fn maglev(bencher: divan::Bencher, n: usize) {
    bench_pick(bencher, StrategyKind::Maglev, n);
}

/// The request key: a header value or a client IP through XXH3-64.
#[divan::bench]
fn request_key_header(bencher: divan::Bencher) {
    use fulcrum::config::HashKey;
    use fulcrum::strategy::{request_key, KeySource};
    let mut headers = http::HeaderMap::new();
    headers.insert("x-user", http::HeaderValue::from_static("user-4711"));
    let hk = HashKey::Header(http::HeaderName::from_static("x-user"));
    let peer: std::net::IpAddr = "10.1.2.3".parse().expect("valid");
    bencher.bench_local(|| {
        request_key(
            KeySource::Configured,
            &hk,
            divan::black_box(&headers),
            peer,
            &[],
        )
    });
}

/// Building a hash ring: what every pool change costs under `consistent_hash`.
#[divan::bench(args = sizes(), sample_count = 10)]
fn build_consistent_hash(bencher: divan::Bencher, n: usize) {
    let backends = pool(n);
    bencher
        .bench_local(|| Picker::build(StrategyKind::ConsistentHash, divan::black_box(&backends)));
}

/// Deriving the ring after one backend left (a health flip): the points of the others
/// are kept, nothing is hashed or sorted again.
#[divan::bench(args = sizes(), sample_count = 10)]
fn rebuild_consistent_hash_one_gone(bencher: divan::Bencher, n: usize) {
    let backends = pool(n);
    let before = Picker::build(StrategyKind::ConsistentHash, &backends);
    let after = backends[1..].to_vec();
    let opts = fulcrum::strategy::PickerOptions::default();
    bencher.bench_local(|| {
        Picker::build_with(
            StrategyKind::ConsistentHash,
            divan::black_box(&after),
            &opts,
            Some(&before),
        )
    });
}

/// Building a Maglev table: what every pool change costs under `maglev`.
#[divan::bench(args = sizes(), sample_count = 10)]
fn build_maglev(bencher: divan::Bencher, n: usize) {
    let backends = pool(n);
    bencher.bench_local(|| Picker::build(StrategyKind::Maglev, divan::black_box(&backends)));
}

/// Building the picker: what every pool change costs.
#[divan::bench(args = sizes())]
fn build_weighted_round_robin(bencher: divan::Bencher, n: usize) {
    let backends = pool(n);
    bencher.bench_local(|| {
        Picker::build(
            StrategyKind::WeightedRoundRobin,
            divan::black_box(&backends),
        )
    });
}

#[divan::bench(args = sizes())]
fn reported_load(bencher: divan::Bencher, n: usize) {
    bench_pick(bencher, StrategyKind::ReportedLoad, n);
}

/// Reading a backend's `endpoint-load-metrics` value (ORCA's TEXT form), as every
/// answer that carries one is read.
#[divan::bench]
fn load_report_parse(bencher: divan::Bencher) {
    let value = b"TEXT cpu_utilization=0.42, application_utilization=0.5, rps_fractional=120";
    bencher.bench(|| fulcrum::backend::report::parse_report(divan::black_box(value)));
}
