//! Compression on a route (`docs/policies.md`, "Compression") over real sockets: a real
//! fulcrum, a backend answering each kind of body, curl as the client and the reference
//! command-line decoders (`zstd`, `brotli`, `gzip`) reading what it sent.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

/// A JSON document of about 100 KB.
fn big_json() -> Vec<u8> {
    let items: Vec<String> = (0..2_500)
        .map(|i| format!(r#"{{"id":{i},"name":"item {i}","tags":["a","b"]}}"#))
        .collect();
    format!("[{}]", items.join(",")).into_bytes()
}

/// 64 KiB of varied JSON records.
fn huge_block() -> Vec<u8> {
    let mut out = Vec::with_capacity(70_000);
    let mut i: u64 = 0;
    while out.len() < 65_536 {
        let x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        let rec = format!(
            r#"{{"id":{i},"user":"u{x}","score":{},"on":{}}},"#,
            x % 997,
            i % 3 == 0
        );
        out.extend_from_slice(rec.as_bytes());
        i += 1;
    }
    out.truncate(65_536);
    out
}

/// Text answered in pieces, without a length.
fn chunked_text() -> Vec<u8> {
    (0..400)
        .flat_map(|i| format!("line {i} of the log\n").into_bytes())
        .collect()
}

/// A backend whose answers each stand for a case of the compression rules. The
/// streams (`/events`, `/slow.txt`) send their first piece, then wait for `go`.
struct Backend {
    addr: SocketAddr,
    go: Arc<AtomicBool>,
}

impl Backend {
    fn start() -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let go = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&go);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let flag = Arc::clone(&flag);
                std::thread::spawn(move || serve(conn, &flag));
            }
        });
        Backend { addr, go }
    }
}

fn serve(conn: TcpStream, go: &AtomicBool) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut out = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let mut length = 0;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                break;
            }
            if let Some((n, v)) = h.split_once(':') {
                if n.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let path = path.rsplit('/').next().unwrap_or("").to_string();
        let head_only = method == "HEAD";
        let fixed = |ty: &str, extra: &str, body: &[u8]| {
            let mut r = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: {ty}\r\ncontent-length: {}\r\n{extra}\r\n",
                body.len()
            )
            .into_bytes();
            if !head_only {
                r.extend_from_slice(body);
            }
            r
        };
        let answer = match path.as_str() {
            "big.json" => fixed(
                "application/json",
                "etag: \"v1\"\r\naccept-ranges: bytes\r\n",
                &big_json(),
            ),
            "small.json" => fixed("application/json", "", br#"{"ok":true}"#),
            "health" => fixed("text/plain", "", b"ok"),
            "photo.png" => fixed("image/png", "", &[7u8; 4096]),
            "module.wasm" => fixed("application/wasm", "", &[0u8; 4096]),
            "encoded.txt" => fixed("text/plain", "content-encoding: gzip\r\n", &[b'x'; 4096]),
            "kept2.txt" => fixed(
                "text/plain",
                "cache-control: public\r\ncache-control: no-transform\r\n",
                &[b'k'; 4096],
            ),
            "described.txt" => fixed(
                "text/plain",
                "vary: Origin\r\netag: W/\"w1\"\r\ncontent-digest: sha-256=:AAAA:\r\n",
                &[b'd'; 4096],
            ),
            "broken.txt" => {
                // Promises 8 000 bytes, sends 3 000, and hangs up.
                let mut r =
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 8000\r\n\r\n"
                        .to_vec();
                r.extend_from_slice(&[b'b'; 3000]);
                let _ = out.write_all(&r);
                return;
            }
            "kept.txt" => fixed(
                "text/plain",
                "cache-control: public, no-transform\r\n",
                &[b'k'; 4096],
            ),
            "partial.txt" => {
                let mut r = b"HTTP/1.1 206 Partial Content\r\ncontent-type: text/plain\r\ncontent-range: bytes 0-2047/9999\r\ncontent-length: 2048\r\n\r\n".to_vec();
                r.extend_from_slice(&[b'p'; 2048]);
                r
            }
            "log.txt" => {
                let mut r = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
                for piece in chunked_text().chunks(1000) {
                    r.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    r.extend_from_slice(piece);
                    r.extend_from_slice(b"\r\n");
                }
                r.extend_from_slice(b"0\r\n\r\n");
                r
            }
            "huge.json" => {
                // 16 MiB of JSON, in 64 KiB chunks, for clients that stop reading.
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
                if out.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let block = huge_block();
                for _ in 0..256 {
                    let chunk = format!("{:x}\r\n", block.len());
                    if out.write_all(chunk.as_bytes()).is_err()
                        || out.write_all(&block).is_err()
                        || out.write_all(b"\r\n").is_err()
                    {
                        return;
                    }
                }
                b"0\r\n\r\n".to_vec()
            }
            "events" | "slow.txt" => {
                let ty = if path == "events" {
                    "text/event-stream"
                } else {
                    "text/plain"
                };
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: {ty}\r\ntransfer-encoding: chunked\r\n\r\n"
                );
                let first = "data: first\n\n";
                let _ = out.write_all(format!("{head}{:x}\r\n{first}\r\n", first.len()).as_bytes());
                let start = Instant::now();
                while !go.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                let second = "data: second\n\n";
                let _ = out
                    .write_all(format!("{:x}\r\n{second}\r\n0\r\n\r\n", second.len()).as_bytes());
                continue;
            }
            _ => b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec(),
        };
        if out.write_all(&answer).is_err() {
            return;
        }
    }
}

/// An answer as curl got it: the head's fields (names lowercase) and the body as sent.
struct Fetched {
    status: u16,
    fields: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Fetched {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `name`, its lines joined as a list.
    fn list(&self, name: &str) -> String {
        let values: Vec<&str> = (self.fields.iter())
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect();
        values.join(", ")
    }
}

/// curl, with the fields given and without decoding anything.
fn curl(url: &str, extra: &[&str]) -> Fetched {
    curl_status(url, extra).1
}

/// curl's exit status (0: a whole answer) and what it got.
fn curl_status(url: &str, extra: &[&str]) -> (Option<i32>, Fetched) {
    let out = Command::new("curl")
        .args(["-s", "-i", "--max-time", "10"])
        .args(extra)
        .arg(url)
        .output()
        .expect("curl runs (apt-get install curl)");
    let raw = out.stdout;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let fields = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let got = Fetched {
        status,
        fields,
        body: raw[split + 4..].to_vec(),
    };
    (out.status.code(), got)
}

/// `body` through the reference decoder of `coding`.
fn decode(coding: &str, body: &[u8]) -> Vec<u8> {
    let tool = match coding {
        "br" => "brotli",
        other => other,
    };
    let mut child = Command::new(tool)
        .args(["-d", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{tool} runs (apt-get install {tool}): {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let input = body.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "{tool} -d refused the body");
    out.stdout
}

fn start_fulcrum(backend: &Backend) -> Fulcrum {
    let cfg = config_file(
        "compression",
        "routes",
        &format!(
            "[[pools]]\nname = \"app\"\n[[pools.backends]]\nurl = \"http://{}\"\n\n\
             [[routes]]\npool = \"app\"\npath_prefix = \"/c/\"\ncompress = true\ncompress_types = [\"application/wasm\"]\n\n\
             [[routes]]\npool = \"app\"\npath_prefix = \"/g/\"\ncompress = [\"gzip\"]\n\n\
             [[routes]]\npool = \"app\"\n",
            backend.addr
        ),
    );
    Fulcrum::start(&["--config", cfg.to_str().unwrap()])
}

#[test]
fn each_coding_is_chosen_by_accept_encoding_and_decodes_with_its_reference_tool() {
    let backend = Backend::start();
    let f = start_fulcrum(&backend);
    let original = big_json();
    for coding in ["zstd", "br", "gzip"] {
        let ae = format!("Accept-Encoding: {coding}");
        let r = curl(&f.url("/c/big.json"), &["-H", &ae]);
        assert_eq!(r.status, 200);
        assert_eq!(r.field("content-encoding"), Some(coding), "{coding}");
        assert_eq!(
            r.field("content-length"),
            None,
            "{coding}: the length is the backend's no more"
        );
        assert_eq!(r.field("accept-ranges"), None, "{coding}");
        assert_eq!(r.field("vary"), Some("Accept-Encoding"), "{coding}");
        assert_eq!(
            r.field("etag"),
            Some("W/\"v1\""),
            "{coding}: the strong ETag turns weak"
        );
        assert!(
            r.body.len() < original.len() / 5,
            "{coding}: {} bytes",
            r.body.len()
        );
        assert_eq!(decode(coding, &r.body), original, "{coding}");
    }
    // The highest q-value wins; a tie goes to the configured order (zstd, br, gzip).
    for (accept, want) in [
        ("gzip, br, zstd", Some("zstd")),
        ("gzip;q=1, zstd;q=0.5", Some("gzip")),
        ("br;q=0.8, gzip;q=0.8", Some("br")),
        ("*;q=0.1, zstd;q=0", Some("br")),
        ("identity", None),
        ("gzip;q=0", None),
    ] {
        let r = curl(
            &f.url("/c/big.json"),
            &["-H", &format!("Accept-Encoding: {accept}")],
        );
        assert_eq!(r.field("content-encoding"), want, "{accept}");
        assert_eq!(
            r.field("vary"),
            Some("Accept-Encoding"),
            "{accept}: a cache must tell the two apart"
        );
        if let Some(c) = want {
            assert_eq!(decode(c, &r.body), original, "{accept}");
        } else {
            assert_eq!(r.body, original, "{accept}");
            assert_eq!(r.field("etag"), Some("\"v1\""), "{accept}");
        }
    }
    // A route offering gzip alone.
    let r = curl(&f.url("/g/big.json"), &["-H", "Accept-Encoding: zstd, br"]);
    assert_eq!(
        (r.field("content-encoding"), r.body.len()),
        (None, original.len())
    );
    let r = curl(
        &f.url("/g/big.json"),
        &["-H", "Accept-Encoding: zstd, gzip;q=0.5"],
    );
    assert_eq!(r.field("content-encoding"), Some("gzip"));
    assert_eq!(decode("gzip", &r.body), original);
    // A route without compress leaves the answer alone.
    let r = curl(&f.url("/big.json"), &["-H", "Accept-Encoding: gzip"]);
    assert_eq!((r.field("content-encoding"), r.field("vary")), (None, None));
    assert_eq!(r.body, original);
    // Over HTTP/2 (h2c) as well.
    let r = curl(
        &f.url("/c/big.json"),
        &["--http2-prior-knowledge", "-H", "Accept-Encoding: br"],
    );
    assert_eq!(r.field("content-encoding"), Some("br"));
    assert_eq!(decode("br", &r.body), original);
}

#[test]
fn answers_not_worth_compressing_are_left_as_they_are() {
    let backend = Backend::start();
    let f = start_fulcrum(&backend);
    let all = ["-H", "Accept-Encoding: zstd, br, gzip"];
    // Unknown length: compressed as it streams.
    let r = curl(&f.url("/c/log.txt"), &all);
    assert_eq!(r.field("content-encoding"), Some("zstd"));
    assert_eq!(decode("zstd", &r.body), chunked_text());
    // compress_types adds a type.
    let r = curl(&f.url("/c/module.wasm"), &all);
    assert_eq!(r.field("content-encoding"), Some("zstd"));
    assert_eq!(decode("zstd", &r.body), vec![0u8; 4096]);
    for (path, why) in [
        ("small.json", "under 1 024 bytes"),
        ("photo.png", "not a compressible type"),
        ("kept.txt", "Cache-Control: no-transform"),
        ("partial.txt", "a 206"),
    ] {
        let r = curl(&f.url(&format!("/c/{path}")), &all);
        assert_eq!(r.field("content-encoding"), None, "{path}: {why}");
        assert!(r.field("content-length").is_some(), "{path}: {why}");
    }
    // Already encoded by the backend: passed on as it is.
    let r = curl(&f.url("/c/encoded.txt"), &all);
    assert_eq!(r.field("content-encoding"), Some("gzip"));
    assert_eq!(r.body, vec![b'x'; 4096]);
    // A second Cache-Control line counts as much as the first.
    let r = curl(&f.url("/c/kept2.txt"), &all);
    assert_eq!(
        r.field("content-encoding"),
        None,
        "no-transform on the second line"
    );
    // Vary is added to, a weak ETag stays as it is, a digest of the backend's bytes goes.
    let r = curl(&f.url("/c/described.txt"), &all);
    assert_eq!(r.field("content-encoding"), Some("zstd"));
    assert_eq!(
        r.list("vary").to_ascii_lowercase(),
        "origin, accept-encoding"
    );
    assert_eq!(r.field("etag"), Some("W/\"w1\""));
    assert_eq!(r.field("content-digest"), None);
    assert_eq!(decode("zstd", &r.body), vec![b'd'; 4096]);
    // Several Accept-Encoding lines are one list.
    let r = curl(
        &f.url("/c/big.json"),
        &[
            "-H",
            "Accept-Encoding: gzip;q=0.5",
            "-H",
            "Accept-Encoding: br",
        ],
    );
    assert_eq!(r.field("content-encoding"), Some("br"));
    // A POST goes through hyper's server rather than the fast path: compressed the same.
    let r = curl(
        &f.url("/c/big.json"),
        &["-H", "Accept-Encoding: gzip", "--data-binary", "x"],
    );
    assert_eq!(r.field("content-encoding"), Some("gzip"));
    assert_eq!(decode("gzip", &r.body), big_json());
    // A backend that breaks off mid-body: the client sees the cut, never a whole stream.
    let (code, r) = curl_status(&f.url("/c/broken.txt"), &all);
    assert_eq!(r.field("content-encoding"), Some("zstd"));
    assert_ne!(code, Some(0), "curl must see the answer cut");
    // A HEAD answer keeps the GET's length and says it varies.
    let r = curl(
        &f.url("/c/big.json"),
        &["-I", "-H", "Accept-Encoding: gzip"],
    );
    assert_eq!(r.field("content-encoding"), None);
    assert_eq!(
        r.field("content-length"),
        Some(big_json().len().to_string().as_str())
    );
    assert_eq!(r.field("vary"), Some("Accept-Encoding"));
}

/// Reads from `s` until `want` has been seen or `limit` passes; what was read.
fn read_until(s: &mut TcpStream, want: &[u8], limit: Duration) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit && !got.windows(want.len()).any(|w| w == want) {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    got
}

#[test]
fn event_streams_pass_uncompressed_and_slow_streams_are_flushed_as_they_come() {
    let backend = Backend::start();
    let f = start_fulcrum(&backend);
    let addr: SocketAddr = f
        .url("/")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    // An event stream: its first event reaches the client while the backend holds the
    // second, as it was sent.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /c/events HTTP/1.1\r\nhost: x\r\naccept-encoding: gzip, br, zstd\r\n\r\n")
        .unwrap();
    let got = read_until(&mut s, b"data: first\n\n", Duration::from_secs(5));
    let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(
        text.contains("data: first\n\n"),
        "the first event at once: {text}"
    );
    assert!(!text.contains("content-encoding"), "{text}");
    // A slow text stream is compressed, and what came so far is flushed at once: the
    // first piece decodes before the backend sends the rest.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /c/slow.txt HTTP/1.1\r\nhost: x\r\naccept-encoding: gzip\r\n\r\n")
        .unwrap();
    let start = Instant::now();
    let mut got = Vec::new();
    let mut decoded = Vec::new();
    while start.elapsed() < Duration::from_secs(5) && !decoded.windows(5).any(|w| w == b"first") {
        got.extend(read_until(&mut s, b"\r\n", Duration::from_millis(200)));
        decoded = partial_gzip(&got);
    }
    assert!(
        decoded.starts_with(b"data: first"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    backend.go.store(true, Ordering::SeqCst);
}

/// The text a gzip stream, still open, decodes to so far (its HTTP/1.1 head and chunk
/// framing taken off first).
fn partial_gzip(answer: &[u8]) -> Vec<u8> {
    let Some(at) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Vec::new();
    };
    let head = String::from_utf8_lossy(&answer[..at]).to_ascii_lowercase();
    assert!(head.contains("content-encoding: gzip"), "{head}");
    let mut rest = &answer[at + 4..];
    let mut body = Vec::new();
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let Ok(n) = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap_or("x"), 16)
        else {
            break;
        };
        if rest.len() < eol + 2 + n {
            break;
        }
        body.extend_from_slice(&rest[eol + 2..eol + 2 + n]);
        rest = &rest[(eol + 4 + n).min(rest.len())..];
    }
    let mut child = Command::new("gzip")
        .args(["-d", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&body).unwrap();
    // gzip decodes what it has and complains of the missing end.
    child.wait_with_output().unwrap().stdout
}

#[test]
fn bad_compression_settings_are_refused_with_their_line() {
    for (extra, why) in [
        ("compress = [\"lz4\"]", "unknown coding 'lz4'"),
        ("compress = 3", "compress: expected"),
        (
            "compress_types = [\"application/wasm\"]",
            "compress_types needs compress",
        ),
        (
            "compress = true\ncompress_types = [\"wasm\"]",
            "'wasm' is not a media type",
        ),
    ] {
        let cfg = config_file(
            "compression",
            "bad",
            &format!("[[pools]]\nname = \"app\"\n\n[[routes]]\npool = \"app\"\n{extra}\n"),
        );
        let (status, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
        assert_eq!(status.code(), Some(2), "{extra}: {err}");
        assert!(err.contains(why), "{extra}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_shows_compression_as_configured_and_takes_it_checked() {
    let backend = Backend::start();
    let f = start_fulcrum(&backend);
    let c = client();
    let routes = get(&c, &f.admin_url("/admin/routes")).await.json();
    assert_eq!(routes[0]["compress"], serde_json::json!(true), "{routes}");
    assert_eq!(
        routes[0]["compress_types"],
        serde_json::json!(["application/wasm"]),
        "{routes}"
    );
    assert_eq!(
        routes[1]["compress"],
        serde_json::json!(["gzip"]),
        "{routes}"
    );
    assert!(routes[2].get("compress").is_none(), "{routes}");
    // The catch-all route starts compressing with zstd alone.
    let mut changed = routes.clone();
    changed[2]["compress"] = serde_json::json!(["zstd"]);
    let put = admin(
        &c,
        "PUT",
        &f.admin_url("/admin/routes"),
        &changed.to_string(),
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.text());
    let r = send(
        &c,
        "GET",
        &f.url("/big.json"),
        &[("accept-encoding", "gzip, zstd")],
        "",
    )
    .await;
    assert_eq!(r.header("content-encoding"), Some("zstd"));
    // A bad one is refused whole, and nothing changes.
    for bad in [
        serde_json::json!(["lz4"]),
        serde_json::json!([]),
        serde_json::json!("gzip"),
    ] {
        let mut wrong = changed.clone();
        wrong[1]["compress"] = bad.clone();
        let put = admin(&c, "PUT", &f.admin_url("/admin/routes"), &wrong.to_string()).await;
        assert_eq!(put.status, 400, "{bad}: {}", put.text());
        assert!(
            put.json()["error"].as_str().unwrap().contains("compress"),
            "{}",
            put.text()
        );
    }
    let mut wrong = changed.clone();
    wrong[1].as_object_mut().unwrap().remove("compress");
    let put = admin(&c, "PUT", &f.admin_url("/admin/routes"), &wrong.to_string()).await;
    assert_eq!(put.status, 200, "{}", put.text());
    wrong[2]["compress_types"] = serde_json::json!(["font/*"]);
    wrong[2].as_object_mut().unwrap().remove("compress");
    let put = admin(&c, "PUT", &f.admin_url("/admin/routes"), &wrong.to_string()).await;
    assert_eq!(put.status, 400, "{}", put.text());
    assert!(
        put.text().contains("compress_types needs compress"),
        "{}",
        put.text()
    );
    let after = get(&c, &f.admin_url("/admin/routes")).await.json();
    assert_eq!(after[2]["compress"], serde_json::json!(["zstd"]), "{after}");
    assert!(after[1].get("compress").is_none(), "{after}");
}

/// 50 clients that ask for a large compressible answer with `coding` (none: identity),
/// read its first bytes and stop: fulcrum's RSS growth, in KiB per client.
fn stalled_clients_kib(f: &Fulcrum, coding: Option<&str>) -> (u64, Vec<TcpStream>) {
    let pid = f.child.id();
    let before = rss_kib(pid);
    let mut held = Vec::new();
    for _ in 0..50 {
        // A small receive buffer, so that each answer stalls after a few hundred KiB.
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.set_recv_buffer_size(16 << 10).unwrap();
        sock.connect(&f.proxy.into()).unwrap();
        let mut s: TcpStream = sock.into();
        let accept = coding.map_or(String::new(), |c| format!("accept-encoding: {c}\r\n"));
        let req = format!("GET /c/huge.json HTTP/1.1\r\nhost: a\r\n{accept}\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let head = read_until(&mut s, b"\r\n\r\n", Duration::from_secs(5));
        let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
        assert!(text.starts_with("http/1.1 200"), "{text}");
        if let Some(c) = coding {
            assert!(text.contains(&format!("content-encoding: {c}")), "{text}");
        }
        held.push(s);
    }
    // Let every answer run until its client's socket is full.
    std::thread::sleep(Duration::from_millis(1500));
    let grown = rss_kib(pid).saturating_sub(before);
    (grown / 50, held)
}

/// An answer being compressed holds at most 512 KiB, whatever the coding, and the
/// memory comes back when its clients leave.
#[test]
fn clients_that_stop_reading_hold_at_most_512_kib_each_whatever_the_coding() {
    let backend = Backend::start();
    let mut figures = Vec::new();
    // A fresh process for each coding: memory one freed would be reused by the next.
    for coding in [None, Some("gzip"), Some("br"), Some("zstd")] {
        let f = start_fulcrum(&backend);
        let idle = rss_kib(f.child.id());
        let (per, held) = stalled_clients_kib(&f, coding);
        figures.push((coding.unwrap_or("identity"), per));
        drop(held);
        let pid = f.child.id();
        let back = (0..30).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            rss_kib(pid) <= 2 * idle + 10 * 1024
        });
        assert!(
            back,
            "{coding:?}: RSS {} KiB after the clients left, {idle} KiB idle",
            rss_kib(pid)
        );
    }
    eprintln!("KiB per stalled client: {figures:?}");
    for (coding, per) in &figures {
        assert!(*per <= 512, "{coding}: {per} KiB per client ({figures:?})");
    }
}

/// Past `compress_max_in_flight` answers being compressed, the next goes out as it came.
#[test]
fn answers_past_compress_max_in_flight_go_out_uncompressed() {
    let backend = Backend::start();
    let cfg = config_file(
        "compression",
        "max-in-flight",
        &format!(
            "compress_max_in_flight = 2\n[[pools]]\nname = \"app\"\n\
             [[pools.backends]]\nurl = \"http://{}\"\n\n\
             [[routes]]\npool = \"app\"\ncompress = true\n",
            backend.addr
        ),
    );
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let mut held = Vec::new();
    let mut codings = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(f.proxy).unwrap();
        s.write_all(b"GET /c/huge.json HTTP/1.1\r\nhost: a\r\naccept-encoding: gzip\r\n\r\n")
            .unwrap();
        let head = read_until(&mut s, b"\r\n\r\n", Duration::from_secs(5));
        let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
        codings.push(text.contains("content-encoding: gzip"));
        held.push(s);
    }
    assert_eq!(codings, [true, true, false]);
    drop(held);
    // The slots come back with their answers.
    let ok = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        curl(&f.url("/c/big.json"), &["-H", "accept-encoding: gzip"]).field("content-encoding")
            == Some("gzip")
    });
    assert!(ok, "the slots never came back");
}
