//! Cost of finding a request's route at 1, 10 and 1 000 routes.
//!
//! `cargo bench --bench route`; under `cargo test --all-targets` each case runs once.
//! The routes are one per service, `svcN.example.com` with a path prefix, plus a
//! wildcard and a catch-all at the end: the shape of a site with many services.

use fulcrum::route::{HostPattern, PathPrefix, Request, Route, RouteTable};
use http::Method;

fn main() {
    divan::main();
}

fn table(n: usize) -> RouteTable {
    let mut routes: Vec<Route> = (0..n.saturating_sub(2))
        .map(|i| Route {
            host: Some(HostPattern::parse(&format!("svc{i}.example.com")).expect("valid")),
            path_prefix: Some(PathPrefix::parse(&format!("/api/v{}", i % 3)).expect("valid")),
            ..Route::catch_all(i)
        })
        .collect();
    if n >= 2 {
        routes.push(Route {
            host: Some(HostPattern::parse("*.example.com").expect("valid")),
            ..Route::catch_all(n - 2)
        });
    }
    routes.push(Route::catch_all(n.saturating_sub(1)));
    RouteTable::new(routes)
}

const SIZES: [usize; 3] = [1, 10, 1000];

/// A host named by a route in the middle of the list.
#[divan::bench(args = SIZES)]
fn exact_host(bencher: divan::Bencher, n: usize) {
    let t = table(n);
    let host = format!("SVC{}.example.com:8080", n / 2);
    let method = Method::GET;
    let no_fields = |_: &http::HeaderName, _: &[u8]| false;
    bencher.bench_local(|| {
        let r = Request {
            host: Some(divan::black_box(host.as_bytes())),
            path: divan::black_box(b"/api/v1/users/42"),
            method: &method,
            has_field: &no_fields,
        };
        t.find(&r).map(|(i, _)| i)
    });
}

/// A host only the wildcard takes, three labels deep.
#[divan::bench(args = SIZES)]
fn wildcard_host(bencher: divan::Bencher, n: usize) {
    let t = table(n);
    let method = Method::GET;
    let no_fields = |_: &http::HeaderName, _: &[u8]| false;
    bencher.bench_local(|| {
        let r = Request {
            host: Some(divan::black_box(b"a.b.example.com")),
            path: divan::black_box(b"/"),
            method: &method,
            has_field: &no_fields,
        };
        t.find(&r).map(|(i, _)| i)
    });
}
