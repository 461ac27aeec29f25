//! Test support: real fulcrum processes and real backends on ephemeral 127.0.0.1 ports.
#![allow(dead_code)]

pub mod acme;
pub mod dns;
pub mod etcd;
pub mod h3;
pub mod tls;

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

pub const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");

// ------------------------------------------------------------------ fulcrum process

/// A running `fulcrum serve`, killed on drop.
pub struct Fulcrum {
    pub child: Child,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    pub log: Arc<Mutex<String>>,
}

impl Fulcrum {
    /// Starts `fulcrum serve` on ephemeral ports with `args` appended.
    pub fn start(args: &[&str]) -> Fulcrum {
        Self::start_cmd(
            &["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"],
            args,
        )
    }

    /// Starts `fulcrum serve` in front of `backends` (in order), with `extra` flags.
    pub fn over(backends: &[&TestBackend], extra: &[&str]) -> Fulcrum {
        let specs: Vec<String> = backends.iter().map(|b| b.spec()).collect();
        let mut args: Vec<&str> = Vec::new();
        for s in &specs {
            args.extend(["--backend", s.as_str()]);
        }
        args.extend_from_slice(extra);
        Self::start(&args)
    }

    pub fn start_cmd(base: &[&str], args: &[&str]) -> Fulcrum {
        Self::start_env(base, args, &[])
    }

    /// Starts fulcrum with `env` set. `FULCRUM_ADMIN_TOKEN` is cleared unless `env` sets
    /// it, so no test inherits a token by accident.
    pub fn start_env(base: &[&str], args: &[&str], env: &[(&str, &str)]) -> Fulcrum {
        let mut cmd = Command::new(BIN);
        cmd.env_remove("FULCRUM_ADMIN_TOKEN")
            .envs(env.iter().copied())
            .args(base)
            .args(args);
        Self::spawn(cmd)
    }

    /// Starts `fulcrum serve` on ephemeral ports with its open-file limit (soft and
    /// hard) set to `files`.
    pub fn start_with_file_limit(files: u64, args: &[&str]) -> Fulcrum {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(BIN);
        cmd.env_remove("FULCRUM_ADMIN_TOKEN")
            .args(["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .args(args);
        // SAFETY: setrlimit is async-signal-safe and touches only the child.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: files,
                    rlim_max: files,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        Self::spawn(cmd)
    }

    /// Spawns `cmd` and waits for both listeners' log lines.
    fn spawn(mut cmd: Command) -> Fulcrum {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start fulcrum");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stderr).lines();
            let mut proxy = None;
            let mut admin = None;
            let mut sent = false;
            while let Some(Ok(line)) = lines.next() {
                log2.lock().unwrap().push_str(&line);
                log2.lock().unwrap().push('\n');
                if let Some(a) = addr_after(&line, "proxy listening on ") {
                    proxy = Some(a);
                }
                if let Some(a) = addr_after(&line, "admin listening on ") {
                    admin = Some(a);
                }
                if !sent {
                    if let (Some(p), Some(a)) = (proxy, admin) {
                        let _ = tx.send((p, a));
                        sent = true;
                    }
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok((proxy, admin)) => Fulcrum {
                child,
                proxy,
                admin,
                log,
            },
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("fulcrum did not start; log:\n{}", log.lock().unwrap());
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.proxy, path)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }

    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }

    /// Waits for the process to exit, up to `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The first log line containing every one of `parts`, waiting up to `limit`.
    pub fn log_line(&self, parts: &[&str], limit: Duration) -> Option<String> {
        let deadline = Instant::now() + limit;
        loop {
            let found = self
                .log()
                .lines()
                .find(|l| parts.iter().all(|p| l.contains(p)))
                .map(str::to_string);
            if found.is_some() || Instant::now() >= deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Fulcrum {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn addr_after(line: &str, marker: &str) -> Option<SocketAddr> {
    let i = line.find(marker)?;
    line[i + marker.len()..]
        .split(|c: char| c.is_whitespace() || c == '"')
        .next()?
        .parse()
        .ok()
}

/// A port free on 127.0.0.1 a moment ago.
/// Writes `text` as `fulcrum.toml` in a directory of its own for this test process,
/// named by the test file (`group`) and the case (`tag`); returns its path.
pub fn config_file(group: &str, tag: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("fulcrum-{group}-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("fulcrum.toml");
    std::fs::write(&f, text).unwrap();
    f
}

pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    // A port the kernel hands out for outgoing connections (pebble's, etcd's, a
    // backend's) can be taken between this check and the bind of the process that
    // uses it: pick below the ephemeral range, from a start that differs per test
    // process, and hand each port out once per process.
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (low, high) = unassigned_ports();
    let span = high - low;
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (low + (start + n) % span) as u16;
        let tcp = std::net::TcpListener::bind(("127.0.0.1", port));
        let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            return port;
        }
    }
    panic!("no free port in {low}..{high}");
}

/// Ports below the kernel's ephemeral range (which no outgoing connection takes),
/// 10 000 up to it.
fn unassigned_ports() -> (u32, u32) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    (10_000, ephemeral_low.max(20_000))
}

/// Runs fulcrum to completion with `args`; returns (status, stderr).
pub fn run_fulcrum(args: &[&str]) -> (ExitStatus, String, String) {
    let out = Command::new(BIN)
        .env_remove("FULCRUM_ADMIN_TOKEN")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run fulcrum");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// ------------------------------------------------------------------ events

/// Reads server-sent events from the admin API on a plain socket.
pub struct EventStream {
    lines: BufReader<TcpStream>,
}

impl EventStream {
    pub fn open(f: &Fulcrum) -> EventStream {
        let mut s = TcpStream::connect(f.admin).unwrap();
        s.write_all(b"GET /admin/events HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            .unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut lines = BufReader::new(s);
        let mut head = String::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !head.ends_with("\r\n\r\n") && Instant::now() < deadline {
            let mut l = String::new();
            let _ = lines.read_line(&mut l);
            head.push_str(&l);
        }
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            head.to_ascii_lowercase().contains("text/event-stream"),
            "{head}"
        );
        EventStream { lines }
    }

    /// The next event whose JSON satisfies `want`, within `limit`.
    pub fn find(
        &mut self,
        limit: Duration,
        want: impl Fn(&serde_json::Value) -> bool,
    ) -> Option<serde_json::Value> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let mut l = String::new();
            match self.lines.read_line(&mut l) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(_) => continue,
            }
            // Chunked framing lines and SSE comments are not events.
            if let Some(data) = l.trim_end().strip_prefix("data: ") {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(data) {
                    if want(&v) {
                        return Some(v);
                    }
                }
            }
        }
        None
    }
}

// ------------------------------------------------------------------ load

/// One request on a new connection; `Err` says what went wrong.
pub fn one_request(addr: SocketAddr, post: bool) -> Result<(), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let req: &[u8] = if post {
        b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    } else {
        b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    };
    s.write_all(req).map_err(|e| format!("write: {e}"))?;
    let mut got = Vec::new();
    s.read_to_end(&mut got).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&got);
    if text.starts_with("HTTP/1.1 200") {
        Ok(())
    } else {
        // The status line and the body (fulcrum's own answers say why).
        let body = text.split("\r\n\r\n").nth(1).unwrap_or("").trim();
        Err(format!(
            "answer: {:?} {body:?}",
            text.lines().next().unwrap_or("(nothing)")
        ))
    }
}

/// Clients that each open a new connection per request until stopped; every
/// `post_every`-th request of a client is a POST with a body (0: none).
pub struct Load {
    stop: Arc<std::sync::atomic::AtomicBool>,
    pub ok: Arc<AtomicU64>,
    /// Each failure: whether it was a POST, and what went wrong.
    pub failures: Arc<Mutex<Vec<(bool, String)>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    pub fn start(addr: SocketAddr, clients: usize, post_every: u64) -> Load {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..clients)
            .map(|i| {
                let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let post = post_every > 0 && (n + i as u64) % post_every == 0;
                        match one_request(addr, post) {
                            Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                            Err(e) => {
                                failures.lock().unwrap().push((post, e));
                                0
                            }
                        };
                        n += 1;
                    }
                })
            })
            .collect();
        Load {
            stop,
            ok,
            failures,
            threads,
        }
    }

    /// Stops the clients; the requests that succeeded and the failures.
    pub fn finish(self) -> (u64, Vec<(bool, String)>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        let failures = self.failures.lock().unwrap().clone();
        (self.ok.load(Ordering::Relaxed), failures)
    }
}

// ------------------------------------------------------------------ test backend

/// What a test backend saw and how it is doing.
#[derive(Default)]
pub struct BackendStats {
    pub requests: AtomicU64,
    pub in_flight: AtomicUsize,
    pub connections: AtomicU64,
    pub last_headers: Mutex<Option<HeaderMap>>,
    pub last_body_len: AtomicU64,
    /// When set, every request but the health probes is answered with 500.
    pub failing: std::sync::atomic::AtomicBool,
    /// Connections that carried at least one request other than a health probe.
    pub traffic_connections: AtomicU64,
    /// Health probes received (`GET /health`); they count nowhere else.
    pub health_probes: AtomicU64,
    /// Status `/health` answers with; 0 = never answer (hang). Starts at 200.
    pub health_status: std::sync::atomic::AtomicU16,
}

/// An HTTP backend on its own thread and runtime. Behaviour by path:
/// - `/status/N` answers N; `/sleep/MS` sleeps first; `/big/N` streams N bytes;
/// - `/echo` streams the request body back; `/stall` sends headers and never ends;
/// - `/ws` upgrades (101) and echoes bytes over the raw connection;
/// - anything else: 200 with body `NAME` and headers `x-backend`, `x-method`, `x-uri`;
///   every answer tells the `X-Forwarded-Client-Cert` it got as `x-seen-xfcc`.
pub struct TestBackend {
    pub name: String,
    pub addr: SocketAddr,
    pub stats: Arc<BackendStats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for TestBackend {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl TestBackend {
    pub fn start(name: &str) -> TestBackend {
        Self::start_on(name, "127.0.0.1:0".parse().unwrap())
    }

    pub fn start_on(name: &str, addr: SocketAddr) -> TestBackend {
        let listener = std::net::TcpListener::bind(addr).expect("bind backend");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(BackendStats::default());
        stats.health_status.store(200, Ordering::SeqCst);
        let (stop, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let name2 = name.to_string();
        let stats2 = Arc::clone(&stats);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let name: &'static str = Box::leak(name2.into_boxed_str());
                loop {
                    let (stream, _) = tokio::select! {
                        a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                        _ = &mut stop_rx => return,
                    };
                    stats2.connections.fetch_add(1, Ordering::SeqCst);
                    let stats = Arc::clone(&stats2);
                    tokio::spawn(async move {
                        let carried_traffic = Arc::new(std::sync::atomic::AtomicBool::new(false));
                        let svc = service_fn(move |req: Request<Incoming>| {
                            let stats = Arc::clone(&stats);
                            if req.uri().path() != "/health" && !carried_traffic.swap(true, Ordering::SeqCst) {
                                stats.traffic_connections.fetch_add(1, Ordering::SeqCst);
                            }
                            async move { Ok::<_, Infallible>(backend_answer(name, stats, req).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .with_upgrades()
                            .await;
                    });
                }
            });
        });
        TestBackend {
            name: name.to_string(),
            addr,
            stats,
            stop: Some(stop),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `--backend` spec with this backend's name.
    pub fn spec(&self) -> String {
        format!("http://{},name={}", self.addr, self.name)
    }

    pub fn requests(&self) -> u64 {
        self.stats.requests.load(Ordering::SeqCst)
    }

    pub fn probes(&self) -> u64 {
        self.stats.health_probes.load(Ordering::SeqCst)
    }

    /// Answer every request (but health probes) with 500, or stop doing so.
    pub fn set_failing(&self, failing: bool) {
        self.stats.failing.store(failing, Ordering::SeqCst);
    }

    /// What `/health` answers from now on (0 = hang).
    pub fn set_health(&self, code: u16) {
        self.stats.health_status.store(code, Ordering::SeqCst);
    }
}

type TestBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

fn full(b: impl Into<Bytes>) -> TestBody {
    Full::new(b.into())
        .map_err(|e: Infallible| match e {})
        .boxed()
}

struct InFlight(Arc<BackendStats>);
impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn backend_answer(
    name: &'static str,
    stats: Arc<BackendStats>,
    mut req: Request<Incoming>,
) -> Response<TestBody> {
    if req.uri().path() == "/health" {
        stats.health_probes.fetch_add(1, Ordering::SeqCst);
        let code = stats.health_status.load(Ordering::SeqCst);
        if code == 0 {
            std::future::pending::<()>().await;
        }
        let mut r = Response::new(full("health"));
        *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
        return r;
    }
    stats.requests.fetch_add(1, Ordering::SeqCst);
    if stats.failing.load(Ordering::SeqCst) {
        let mut r = Response::new(full(name));
        *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        r.headers_mut().insert("x-backend", name.parse().unwrap());
        return r;
    }
    stats.in_flight.fetch_add(1, Ordering::SeqCst);
    let _g = InFlight(Arc::clone(&stats));
    *stats.last_headers.lock().unwrap() = Some(req.headers().clone());
    let path = req.uri().path().to_string();
    let uri = req.uri().to_string();
    let method = req.method().to_string();
    let proto = req.headers().get("x-forwarded-proto").cloned();
    let xfcc = req.headers().get("x-forwarded-client-cert").cloned();
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let head = parts.next().unwrap_or("");
    let arg = parts.next().unwrap_or("");
    let mut resp = match head {
        "status" => {
            let mut r = Response::new(full(name));
            *r.status_mut() = StatusCode::from_u16(arg.parse().unwrap_or(200)).unwrap();
            r
        }
        "sleep" => {
            tokio::time::sleep(Duration::from_millis(arg.parse().unwrap_or(0))).await;
            Response::new(full(name))
        }
        // The backend advertises an alternative service of its own.
        "alt-svc" => {
            let mut r = Response::new(full(name));
            r.headers_mut()
                .insert("alt-svc", "h3=\":9999\"; ma=60".parse().unwrap());
            r
        }
        "big" => {
            let n: usize = arg.parse().unwrap_or(0);
            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
            let frames = (0..n.div_ceil(chunk.len())).map(move |i| {
                let len = (n - i * 64 * 1024).min(64 * 1024);
                Ok::<_, hyper::Error>(Frame::data(chunk.slice(..len)))
            });
            let body = StreamBody::new(futures_util::stream::iter(frames));
            let mut r = Response::new(BodyExt::boxed(body));
            r.headers_mut()
                .insert("content-length", n.to_string().parse().unwrap());
            r
        }
        "echo" => {
            let body = req.into_body();
            let counted = CountBody {
                inner: body,
                stats: Arc::clone(&stats),
                n: 0,
            };
            Response::new(BodyExt::boxed(counted))
        }
        "stall" => {
            let body = StreamBody::new(futures_util::stream::pending::<
                Result<Frame<Bytes>, hyper::Error>,
            >());
            let mut r = Response::new(BodyExt::boxed(body));
            r.headers_mut()
                .insert("content-length", "100".parse().unwrap());
            r
        }
        "ws" => {
            let on = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                if let Ok(up) = on.await {
                    let mut io = TokioIo::new(up);
                    let mut buf = [0u8; 1024];
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    while let Ok(n) = io.read(&mut buf).await {
                        if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                }
            });
            let mut r = Response::new(full(""));
            *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            r.headers_mut()
                .insert("connection", "upgrade".parse().unwrap());
            r.headers_mut()
                .insert("upgrade", "websocket".parse().unwrap());
            r
        }
        _ => {
            let mut n = 0u64;
            while let Some(Ok(f)) = req.body_mut().frame().await {
                if let Some(d) = f.data_ref() {
                    n += d.len() as u64;
                }
            }
            stats.last_body_len.store(n, Ordering::SeqCst);
            let mut r = Response::new(full(name));
            r.headers_mut()
                .insert("x-body-len", n.to_string().parse().unwrap());
            r
        }
    };
    let h = resp.headers_mut();
    h.insert("x-backend", name.parse().unwrap());
    h.insert("x-method", method.parse().unwrap());
    h.insert("x-uri", uri.parse().unwrap());
    if let Some(p) = proto {
        h.insert("x-seen-proto", p);
    }
    if let Some(x) = xfcc {
        h.insert("x-seen-xfcc", x);
    }
    resp
}

/// A body that counts what passes through (for `/echo`).
struct CountBody {
    inner: Incoming,
    stats: Arc<BackendStats>,
    n: u64,
}

impl hyper::body::Body for CountBody {
    type Data = Bytes;
    type Error = hyper::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Ok(f))) = &r {
            if let Some(d) = f.data_ref() {
                let n = self.n + d.len() as u64;
                self.n = n;
                self.stats.last_body_len.store(n, Ordering::SeqCst);
            }
        }
        r
    }
}

// ------------------------------------------------------------------ clients

pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(512)
        .build_http()
}

/// A response read whole.
pub struct Got {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Got {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn backend(&self) -> String {
        self.header("x-backend").unwrap_or("?").to_string()
    }
}

pub async fn send(
    c: &HttpClient,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Got {
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = c
        .request(b.body(Full::new(body.into())).unwrap())
        .await
        .expect("request");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Got {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub async fn get(c: &HttpClient, url: &str) -> Got {
    send(c, "GET", url, &[], Bytes::new()).await
}

/// The value of the series `series` (name and labels, as `/metrics` writes them) of
/// `f`'s metrics; panics, with the page, when it has none.
pub async fn metric(f: &Fulcrum, series: &str) -> u64 {
    let text = get(&client(), &f.admin_url("/metrics")).await.text();
    let key = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{key} in:\n{text}"))
}

pub async fn admin(c: &HttpClient, method: &str, url: &str, json: &str) -> Got {
    send(
        c,
        method,
        url,
        &[("content-type", "application/json")],
        json.to_string(),
    )
    .await
}

/// Sends raw bytes on a fresh connection and reads until the peer closes or `limit`.
pub fn raw_exchange(addr: SocketAddr, request: &[u8], limit: Duration) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(limit)).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `POST /admin/strategy` with `name`; the answer.
pub async fn set_strategy(c: &HttpClient, f: &Fulcrum, name: &str) -> Got {
    admin(
        c,
        "POST",
        &f.admin_url("/admin/strategy"),
        &format!(r#"{{"strategy": "{name}"}}"#),
    )
    .await
}

/// Status of the pool as the admin API shows it.
pub async fn status(c: &HttpClient, f: &Fulcrum) -> serde_json::Value {
    get(c, &f.admin_url("/admin/status")).await.json()
}

/// `active_conns` per backend name.
pub async fn active_conns(c: &HttpClient, f: &Fulcrum) -> HashMap<String, u64> {
    let s = status(c, f).await;
    s["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap().to_string(),
                b["active_conns"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Polls `cond` until true or `limit`.
pub async fn eventually<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The resident set of process `pid` now, in KiB (0 once it is gone).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Raises this process's open-file limit to its hard limit, for tests that hold
/// thousands of connections; the limit now.
pub fn raise_own_file_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed to them.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    lim.rlim_cur
}

/// A bare HTTP/1.1 backend on a thread per connection, for what `TestBackend` cannot
/// do: each request (its head read whole; keep-alive) answered after `delay` with `200`,
/// the header lines `fields` (each ending in CRLF) and `body`.
pub fn raw_backend(delay: Duration, fields: String, body: &'static str) -> std::net::SocketAddr {
    let answer = format!(
        "HTTP/1.1 200 OK\r\n{fields}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    scripted_backend(move |_| {
        std::thread::sleep(delay);
        answer.clone()
    })
}

/// A bare HTTP/1.1 backend on a thread per connection for bodiless requests: each
/// request's head (read whole; keep-alive) answered with what `answer` makes of it — the
/// whole answer, head and body.
pub fn scripted_backend(
    answer: impl Fn(&str) -> String + Send + Sync + 'static,
) -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let answer = Arc::clone(&answer);
            std::thread::spawn(move || {
                let (mut buf, mut chunk) = (Vec::new(), [0u8; 4096]);
                loop {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end);
                    if s.write_all(answer(&head).as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A raw HTTP/2 frame: length, type, flags, stream, payload.
pub fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Reads one HTTP/2 frame from `s`: (type, flags, stream, payload); `None` once the
/// connection ends.
pub fn read_h2_frame(s: &mut std::net::TcpStream) -> Option<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    s.read_exact(&mut head).ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).ok()?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Some((head[3], head[4], stream, payload))
}
