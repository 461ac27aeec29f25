//! Cost of one `pick` per strategy and pool size.
//!
//! `cargo bench --bench pick`; under `cargo test --all-targets` each case runs once.

use std::sync::Arc;

use fulcrum::config::backend_spec;
use fulcrum::pool::Backend;
use fulcrum::strategy::{PickCtx, Picker, StrategyKind};

fn main() {
    divan::main();
}

const SIZES: [usize; 3] = [3, 100, 10_000];

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

fn bench_pick(bencher: divan::Bencher, kind: StrategyKind, n: usize) {
    let backends = pool(n);
    // Give least connections something to compare: 1..=4 requests in flight on every
    // backend, so no idle backend ends the scan early (the worst case).
    let _guards: Vec<_> = backends
        .iter()
        .enumerate()
        .flat_map(|(i, b)| (0..=(i % 4)).map(move |_| b.begin_request()))
        .collect();
    let picker = Picker::build(kind, &backends);
    let ctx = PickCtx::default();
    bencher.bench_local(|| picker.pick(divan::black_box(&backends), &ctx));
}

#[divan::bench(args = SIZES)]
fn round_robin(bencher: divan::Bencher, n: usize) {
    bench_pick(bencher, StrategyKind::RoundRobin, n);
}

#[divan::bench(args = SIZES)]
fn weighted_round_robin(bencher: divan::Bencher, n: usize) {
    bench_pick(bencher, StrategyKind::WeightedRoundRobin, n);
}

#[divan::bench(args = SIZES)]
fn least_connections(bencher: divan::Bencher, n: usize) {
    bench_pick(bencher, StrategyKind::LeastConnections, n);
}

/// Building the picker: what every pool change costs.
#[divan::bench(args = SIZES)]
fn build_weighted_round_robin(bencher: divan::Bencher, n: usize) {
    let backends = pool(n);
    bencher.bench_local(|| {
        Picker::build(
            StrategyKind::WeightedRoundRobin,
            divan::black_box(&backends),
        )
    });
}
