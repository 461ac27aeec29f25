//! Memory an answer being compressed holds, per coding (`docs/performance.md`,
//! "Compression's memory"): 50 answers of 4 MiB of JSON each start streaming through
//! fulcrum's encoder and stop after 256 KiB of input, as when their clients stop
//! reading; the growth of the process's RSS ÷ 50 is each one's cost. Also each
//! coding's ratio and CPU time on the whole 4 MiB.
//!
//! `cargo run --release --example compress_memory` (each coding in a process of its own)

use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::Bytes;
use fulcrum::compress::{Coding, Compressed};
use http_body::Body;
use http_body_util::{BodyExt, StreamBody};

const ANSWERS: usize = 50;
const CHUNK: usize = 16 << 10;

/// JSON records, varied enough not to compress to nothing.
fn json(len: usize) -> Bytes {
    let mut out = String::with_capacity(len + 200);
    let mut i: u64 = 0;
    while out.len() < len {
        let x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        out.push_str(&format!(
            "{{\"id\":{i},\"user\":\"user-{x}\",\"score\":{}.{},\"tags\":[\"a{}\",\"b{}\"],\"active\":{}}},\n",
            x % 1000,
            x % 97,
            x % 13,
            x % 7,
            i % 3 == 0
        ));
        i += 1;
    }
    out.truncate(len);
    Bytes::from(out)
}

type Chunks = StreamBody<
    futures_util::stream::Iter<std::vec::IntoIter<Result<http_body::Frame<Bytes>, std::io::Error>>>,
>;

fn body(data: &Bytes) -> Chunks {
    let frames: Vec<_> = (0..data.len())
        .step_by(CHUNK)
        .map(|at| {
            Ok(http_body::Frame::data(
                data.slice(at..(at + CHUNK).min(data.len())),
            ))
        })
        .collect();
    StreamBody::new(futures_util::stream::iter(frames))
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (status.lines())
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Polls `b` until `input` bytes of its source went in (each poll takes one chunk).
fn stream_some(b: &mut Compressed<Chunks>, input: usize) {
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..input / CHUNK {
        match Pin::new(&mut *b).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(_))) | Poll::Pending => {}
            _ => break,
        }
    }
}

/// One coding's figures, in this process: its memory per answer held, its ratio and
/// its time per MiB.
fn measure(coding: Coding) {
    let data = json(4 << 20);
    let before = rss_kib();
    let mut held: Vec<_> = (0..ANSWERS)
        .map(|_| {
            Compressed::new(
                body(&data),
                coding,
                fulcrum::compress::Slot::take().unwrap(),
            )
        })
        .collect();
    for b in &mut held {
        stream_some(b, 256 << 10);
    }
    let per = (rss_kib().saturating_sub(before)) as f64 / ANSWERS as f64;
    drop(held);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let t = Instant::now();
    let out = rt.block_on(async {
        let slot = fulcrum::compress::Slot::take().unwrap();
        let c = Compressed::new(body(&data), coding, slot);
        c.collect().await.unwrap().to_bytes()
    });
    let ms = t.elapsed().as_secs_f64() * 1000.0 / 4.0;
    let ratio = data.len() as f64 / out.len() as f64;
    println!("{:6}  {per:10.0}  {ratio:5.2}  {ms:6.2}", coding.name());
}

fn main() {
    let coding = std::env::args().nth(1);
    if let Some(c) = Coding::ALL
        .iter()
        .find(|c| Some(c.name()) == coding.as_deref())
    {
        return measure(*c);
    }
    // Each coding in a process of its own: memory one freed would be reused by the next.
    println!("coding  KiB/answer  ratio  ms/MiB");
    for c in [Coding::Gzip, Coding::Br, Coding::Zstd] {
        let me = std::env::current_exe().unwrap();
        let st = std::process::Command::new(me)
            .arg(c.name())
            .status()
            .unwrap();
        assert!(st.success());
    }
}
