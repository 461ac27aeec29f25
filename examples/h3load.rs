//! An HTTP/3 load client for `scripts/bench/h3.sh` (Debian's h2load is built without
//! HTTP/3): quinn and h3, as the tests' client.
//!
//!   cargo run --release --example h3load -- URL --ca CERT.pem [--connections 10]
//!       [--streams 10] [--seconds 10] [--idle]
//!
//! Load: `--connections` QUIC connections, each with `--streams` requests in flight at
//! once (a new one as soon as one is answered), for `--seconds`; prints one JSON line:
//! requests answered, errors, seconds and requests per second.
//! `--idle`: opens the connections, prints how many are open, and holds them without a
//! request for `--seconds` (for the proxy's memory per idle connection).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf as _, Bytes};

type Sender = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

struct Args {
    url: http::Uri,
    ca: String,
    connections: usize,
    streams: usize,
    seconds: u64,
    idle: bool,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        url: http::Uri::from_static("https://localhost/"),
        ca: String::new(),
        connections: 10,
        streams: 10,
        seconds: 10,
        idle: false,
    };
    let num = |v: Option<String>, name: &str| {
        v.and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| format!("{name} takes a number"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--ca" => a.ca = it.next().ok_or("--ca takes a file")?,
            "--connections" => a.connections = num(it.next(), "--connections")? as usize,
            "--streams" => a.streams = num(it.next(), "--streams")? as usize,
            "--seconds" => a.seconds = num(it.next(), "--seconds")?,
            "--idle" => a.idle = true,
            url => a.url = url.parse().map_err(|e| format!("{url}: {e}"))?,
        }
    }
    if a.ca.is_empty() {
        return Err("--ca CERT.pem is needed".into());
    }
    Ok(a)
}

fn client_config(ca: &str) -> Result<quinn::ClientConfig, String> {
    let pem = std::fs::read(ca).map_err(|e| format!("{ca}: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    use rustls_pki_types::pem::PemObject as _;
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("{ca}: {e}"))?;
        roots.add(cert).map_err(|e| format!("{ca}: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto =
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| e.to_string())?;
    Ok(quinn::ClientConfig::new(Arc::new(crypto)))
}

async fn connect(
    endpoint: &quinn::Endpoint,
    addr: std::net::SocketAddr,
    host: &str,
) -> Result<Sender, String> {
    let conn = endpoint
        .connect(addr, host)
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    Ok(send)
}

/// One GET, its body read whole.
async fn get(send: &mut Sender, url: &http::Uri) -> bool {
    let req = http::Request::get(url.clone()).body(()).unwrap_or_default();
    let Ok(mut stream) = send.send_request(req).await else {
        return false;
    };
    if stream.finish().await.is_err() {
        return false;
    }
    let Ok(rsp) = stream.recv_response().await else {
        return false;
    };
    while let Ok(Some(mut chunk)) = stream.recv_data().await {
        chunk.advance(chunk.remaining());
    }
    rsp.status().is_success()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("h3load: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(a).await {
        eprintln!("h3load: {e}");
        std::process::exit(1);
    }
}

async fn run(a: Args) -> Result<(), String> {
    let host = a.url.host().ok_or("the URL has no host")?.to_string();
    let port = a.url.port_u16().unwrap_or(443);
    let addr = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().map_err(|_| "bind")?)
        .map_err(|e| e.to_string())?;
    endpoint.set_default_client_config(client_config(&a.ca)?);
    let mut senders = Vec::new();
    for _ in 0..a.connections {
        senders.push(connect(&endpoint, addr, &host).await?);
    }
    let span = Duration::from_secs(a.seconds);
    if a.idle {
        // Said once all are open, so a script can measure while they are held.
        println!("{{\"idle_connections\":{}}}", senders.len());
        tokio::time::sleep(span).await;
        return Ok(());
    }
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let start = Instant::now();
    let end = start + span;
    let mut tasks = Vec::new();
    for send in senders {
        for _ in 0..a.streams {
            let (mut send, url) = (send.clone(), a.url.clone());
            let (ok, failed) = (Arc::clone(&ok), Arc::clone(&failed));
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let counter = if get(&mut send, &url).await {
                        &ok
                    } else {
                        &failed
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    let secs = start.elapsed().as_secs_f64();
    let n = ok.load(Ordering::Relaxed);
    println!(
        "{{\"requests\":{n},\"errors\":{},\"seconds\":{secs:.3},\"rps\":{:.0}}}",
        failed.load(Ordering::Relaxed),
        n as f64 / secs
    );
    Ok(())
}
