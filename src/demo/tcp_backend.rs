//! `fulcrum backend --tcp`: the demo backend as a TCP service, for the lab's
//! `long-lived` scenario (`docs/lab.md`) and TCP pools' demos. It reads lines; each
//! line is one query, answered with the backend's name and a newline after its latency.
//! Every open connection costs it: a query's latency is its base (with the script's
//! slowdown and the jitter) times `1 + open / CONTENTION`, as a database with a process
//! or a memory budget per session slows with each one held. A line that starts with
//! `GET /health` gets an HTTP status line, so that the spawner's health wait works.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// What a TCP demo backend answers with, and how slowly.
#[derive(Debug)]
pub(crate) struct Answers {
    /// Its name, sent back for each query.
    pub(crate) name: String,
    /// A query's base latency.
    pub(crate) latency_ms: u64,
    /// Uniform jitter around it, ±.
    pub(crate) jitter_ms: u64,
}

/// How many open connections double a query's latency.
const CONTENTION: f64 = 4.0;

/// The longest line read; longer ones end the connection.
const MAX_LINE: usize = 4096;

/// Serves `listener` until the process is stopped; `slowdown` tells the script's factor
/// now.
pub(crate) async fn run(
    listener: tokio::net::TcpListener,
    opts: &'static Answers,
    slowdown: &'static (dyn Fn() -> f64 + Sync),
) -> std::io::Result<()> {
    let open: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            open.fetch_add(1, Ordering::Relaxed);
            let _ = session(stream, opts, open, slowdown).await;
            open.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// One connection: a line in, the name out after the latency, until the client ends.
async fn session(
    stream: tokio::net::TcpStream,
    opts: &Answers,
    open: &AtomicUsize,
    slowdown: &(dyn Fn() -> f64 + Sync),
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    let mut line = String::new();
    loop {
        line.clear();
        let n = (&mut lines)
            .take(MAX_LINE as u64)
            .read_line(&mut line)
            .await?;
        if n == 0 || !line.ends_with('\n') {
            return Ok(());
        }
        if line.starts_with("GET /health") {
            write
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .await?;
            return Ok(());
        }
        let held = open.load(Ordering::Relaxed) as f64;
        let jitter = (fastrand::f64() * 2.0 - 1.0) * opts.jitter_ms as f64;
        let ms =
            ((opts.latency_ms as f64 + jitter) * slowdown()).max(0.0) * (1.0 + held / CONTENTION);
        tokio::time::sleep(Duration::from_secs_f64(ms / 1000.0)).await;
        write
            .write_all(format!("{}\n", opts.name).as_bytes())
            .await?;
    }
}
