//! Cost of the route policies that do work per request: basic auth with a credential
//! already verified (the cache; bcrypt itself runs once per credential), and compressing
//! a 100 KB JSON answer with each coding at fulcrum's levels.
//!
//! `cargo bench --bench policies`; under `cargo test --all-targets` each case runs once.
//! Figures and the machine they came from: `docs/performance.md`, "Route policies".

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use divan::counter::BytesCount;
use fulcrum::basic_auth::{Check, Gate};
use fulcrum::compress::{Coding, Compressed};
use http_body::Body;
use http_body_util::{BodyExt, Full};

fn main() {
    divan::main();
}

/// `alice:secret` at bcrypt cost 4 (only the first request pays it).
const HASH: &str = "$2b$04$8z2o7Z8vQe1tUoyQ5m6r8.6H0f3uXWm0bqXK0k7lY0q1m8cC6mJ0e";

#[divan::bench]
fn basic_auth_cached(b: divan::Bencher) {
    let users = BTreeMap::from([("alice".to_string(), HASH.to_string())]);
    let gate = Gate::for_users("ops", users);
    // What a browser sends after the first 401: `alice:secret`.
    let field = b"Basic YWxpY2U6c2VjcmV0".to_vec();
    gate.remember(field.clone());
    b.bench(|| {
        let known = matches!(gate.check(Some(divan::black_box(&field))), Check::Known);
        assert!(known);
    });
}

/// A JSON document of about 100 KB, as an API answers.
fn json_100k() -> Bytes {
    let items: Vec<String> = (0..1_650)
        .map(|i| {
            format!(
                r#"{{"id":{i},"name":"item {i}","price":{}.{:02},"tags":["a","b"]}}"#,
                i * 7 % 500,
                i % 100
            )
        })
        .collect();
    Bytes::from(format!("[{}]", items.join(",")))
}

/// Compresses `data` whole; the compressed size.
fn compress(data: &Bytes, coding: Coding) -> usize {
    let body = Full::new(data.clone()).map_err(|e: Infallible| -> std::io::Error { match e {} });
    let mut c = Compressed::new(body, coding, fulcrum::compress::Slot::take().unwrap());
    let mut cx = Context::from_waker(Waker::noop());
    let mut size = 0;
    // A whole body is always ready: nothing waits.
    while let Poll::Ready(Some(frame)) = Pin::new(&mut c).poll_frame(&mut cx) {
        size += frame
            .ok()
            .and_then(|f| f.into_data().ok())
            .map_or(0, |d| d.len());
    }
    size
}

#[divan::bench(args = [Coding::Gzip, Coding::Br, Coding::Zstd])]
fn compress_100k_json(b: divan::Bencher, coding: Coding) {
    let data = json_100k();
    b.counter(BytesCount::new(data.len()))
        .bench(|| compress(divan::black_box(&data), coding));
}
