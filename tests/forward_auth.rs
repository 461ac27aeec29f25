//! Forward auth (`docs/policies.md`, "Forward auth") over real sockets: a real auth
//! service (an HTTP server that decides by what the subrequest says) in front of a real
//! backend — allowing, refusing with its own status, fields and body, timing out, and
//! down.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

/// What the auth service saw of a subrequest.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    target: String,
    headers: HeaderMap,
    body: Bytes,
}

/// The auth service: by the subrequest's `X-Forwarded-Uri`, `/ok…` is allowed (with
/// `x-user: alice` and a session cookie), `/slow…` answers after 2 s, anything else
/// is refused `403` with fields and a body of its own.
struct AuthService {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<AtomicU64>,
}

async fn decide(req: Request<Incoming>, seen: Arc<Mutex<Vec<Seen>>>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let uri = parts
        .headers
        .get("x-forwarded-uri")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        target: parts.uri.to_string(),
        headers: parts.headers,
        body,
    });
    if uri.starts_with("/slow") {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    if uri.starts_with("/big") {
        return Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .body(Full::new(Bytes::from(vec![b'x'; 100 * 1024])))
            .unwrap();
    }
    if uri.starts_with("/ok-two") {
        return Response::builder()
            .header("x-user", "alice")
            .header("x-user", "ops")
            .body(Full::new(Bytes::new()))
            .unwrap();
    }
    if uri.starts_with("/ok") {
        return Response::builder()
            .header("x-user", "alice")
            .header("x-other", "not copied")
            .header("set-cookie", "session=fresh; Path=/")
            .body(Full::new(Bytes::new()))
            .unwrap();
    }
    Response::builder()
        .status(StatusCode::FORBIDDEN)
        .header("x-why", "not on the list")
        .header("www-authenticate", "Bearer realm=\"sso\"")
        .header("connection", "x-hop")
        .header("x-hop", "the service's hop only")
        .header("keep-alive", "timeout=5")
        .body(Full::new(Bytes::from_static(b"go away\n")))
        .unwrap()
}

impl AuthService {
    async fn start() -> AuthService {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicU64::new(0));
        let (s2, c2) = (Arc::clone(&seen), Arc::clone(&connections));
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                c2.fetch_add(1, Ordering::SeqCst);
                let seen = Arc::clone(&s2);
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let seen = Arc::clone(&seen);
                        async move { Ok::<_, Infallible>(decide(req, seen).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        AuthService {
            addr,
            seen,
            connections,
        }
    }

    fn last(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("a subrequest")
    }
}

fn route_with(api: &TestBackend, url: &str) -> String {
    format!(
        "[[pools]]\nname = \"api\"\nbackends = [{{ url = \"{}\" }}]\n\n[[routes]]\npool = \"api\"\n\
         forward_auth = {{ url = \"{url}\", copy_headers = [\"x-user\"], timeout = \"500ms\" }}\n",
        api.url()
    )
}

async fn outcomes(f: &Fulcrum, result: &str) -> u64 {
    metric(
        f,
        &format!("fulcrum_forward_auth_total{{route=\"0\",result=\"{result}\"}}"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auth_service_allows_refuses_and_times_out() {
    let api = TestBackend::start("api");
    let auth = AuthService::start().await;
    let url = format!("http://{}/check?app=shop", auth.addr);
    let cfg = config_file("forward_auth", "decide", &route_with(&api, &url));
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let c = client();
    // Allowed: the request goes on with the service's x-user (not the client's own),
    // and the client's answer carries the service's session cookie.
    let h = [
        ("x-user", "mallory"),
        ("cookie", "sso=abc"),
        ("x-trace", "t1"),
    ];
    let r = send(
        &c,
        "POST",
        &f.url("/ok/items?q=1"),
        &h,
        "a body the service never sees",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("set-cookie"), Some("session=fresh; Path=/"));
    let seen_by_api = api.stats.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(
        seen_by_api.get_all("x-user").iter().collect::<Vec<_>>(),
        ["alice"]
    );
    assert!(
        seen_by_api.get("x-other").is_none(),
        "only copy_headers are taken"
    );
    let sub = auth.last();
    assert_eq!(sub.method, "POST");
    assert_eq!(sub.target, "/check?app=shop");
    assert!(sub.body.is_empty(), "no body");
    assert_eq!(sub.headers["content-length"], "0");
    assert_eq!(sub.headers["host"], auth.addr.to_string().as_str());
    assert_eq!(sub.headers["x-forwarded-method"], "POST");
    assert_eq!(sub.headers["x-forwarded-uri"], "/ok/items?q=1");
    assert_eq!(
        sub.headers["x-forwarded-host"],
        f.proxy.to_string().as_str()
    );
    assert_eq!(sub.headers["x-forwarded-proto"], "http");
    assert_eq!(sub.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(
        sub.headers["cookie"], "sso=abc",
        "the client's fields go to the service"
    );
    assert_eq!(sub.headers["x-trace"], "t1");
    let via = sub.headers["via"].to_str().unwrap();
    assert!(via.starts_with("1.1 fulcrum-"), "this hop in Via: {via}");
    // Several values of a copied field: all of them go on, in order.
    let r = get(&c, &f.url("/ok-two")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen_by_api = api.stats.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(
        seen_by_api.get_all("x-user").iter().collect::<Vec<_>>(),
        ["alice", "ops"]
    );
    // Refused: the service's answer is the client's, whole; the backend sees nothing. A
    // client's own X-Forwarded-* cannot change what the service is told.
    let forwarded = api.requests();
    let forged = [
        ("x-forwarded-uri", "/ok/forged"),
        ("x-forwarded-method", "GET"),
        ("x-forwarded-port", "443"),
        ("x-forwarded-prefix", "/ok"),
        ("x-real-ip", "10.9.9.9"),
        ("forwarded", "for=10.9.9.9;proto=https"),
        ("x-original-url", "/ok/forged"),
        ("x-original-method", "GET"),
    ];
    let r = send(&c, "GET", &f.url("/admin-area"), &forged, "").await;
    assert_eq!(r.status, 403);
    assert_eq!(r.header("x-why"), Some("not on the list"));
    assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"sso\""));
    assert_eq!(r.text(), "go away\n");
    assert!(r.header("set-cookie").is_none());
    for hop in ["x-hop", "keep-alive"] {
        assert!(
            r.header(hop).is_none(),
            "the service's {hop} went to the client"
        );
    }
    let sub = auth.last();
    assert_eq!(sub.headers["x-forwarded-uri"], "/admin-area");
    assert_eq!(sub.headers["x-forwarded-for"], "127.0.0.1");
    for (name, _) in &forged[2..] {
        assert!(
            sub.headers.get(*name).is_none(),
            "the client's {name} reached the service"
        );
    }
    // A refusal with a body over 64 KiB: its status and fields, without the body.
    let r = send(&c, "GET", &f.url("/big"), &[], "").await;
    assert_eq!(r.status, 401);
    assert!(r.body.is_empty(), "{} bytes", r.body.len());
    // Slower than the timeout: 503.
    let r = send(&c, "GET", &f.url("/slow"), &[], "").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.text(), "auth unavailable\n");
    assert_eq!(
        api.requests(),
        forwarded,
        "nothing refused reached the backend"
    );
    // Keep-alive: a burst of allowed requests reuses the service's connections.
    let before = auth.connections.load(Ordering::SeqCst);
    for _ in 0..20 {
        assert_eq!(get(&c, &f.url("/ok/again")).await.status, 200);
    }
    let opened = auth.connections.load(Ordering::SeqCst) - before;
    assert!(
        opened <= 2,
        "{opened} connections for 20 sequential subrequests"
    );
    // Explain names the step that would ask, and asks nothing.
    let asked = auth.seen.lock().unwrap().len();
    let e = admin(
        &c,
        "POST",
        &f.admin_url("/admin/explain"),
        r#"{"path": "/ok/x"}"#,
    )
    .await;
    assert_eq!(e.json()["step"], "forward_auth", "{}", e.text());
    assert_eq!(
        auth.seen.lock().unwrap().len(),
        asked,
        "explain called the service"
    );
    assert_eq!(outcomes(&f, "allowed").await, 22);
    assert_eq!(outcomes(&f, "refused").await, 2);
    assert_eq!(outcomes(&f, "unavailable").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auth_service_that_is_down_gives_503_and_others_are_unaffected() {
    let api = TestBackend::start("api");
    let url = format!("http://127.0.0.1:{}/check", free_port());
    let text = format!(
        "{}\n[[routes]]\npool = \"api\"\npath_prefix = \"/open\"\n",
        route_with(&api, &url).replace(
            "[[routes]]\npool = \"api\"\n",
            "[[routes]]\npool = \"api\"\npath_prefix = \"/closed\"\n"
        )
    );
    let cfg = config_file("forward_auth", "down", &text);
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let c = client();
    let r = get(&c, &f.url("/closed/x")).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.text(), "auth unavailable\n");
    assert_eq!(get(&c, &f.url("/open/x")).await.status, 200);
    assert_eq!(api.requests(), 1);
    assert_eq!(outcomes(&f, "unavailable").await, 1);
}

/// An auth service at this fulcrum's own listener would ask itself again for every
/// subrequest: refused when the configuration is read (exit 2) and by the admin API
/// (400); and a subrequest that comes back all the same (through another fulcrum, or a
/// name resolving here) names this hop in `Via`, so it is answered 508, not asked
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auth_service_that_is_fulcrum_itself_is_refused() {
    let api = TestBackend::start("api");
    let port = free_port();
    let own = format!("http://127.0.0.1:{port}/check");
    let cfg = config_file("forward_auth", "own", &route_with(&api, &own));
    let listen = format!("127.0.0.1:{port}");
    let (status, _, err) = run_fulcrum(&[
        "serve",
        "--config",
        cfg.to_str().unwrap(),
        "--listen",
        &listen,
    ]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("route 0") && err.contains("forward_auth.url"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let f = Fulcrum::over(&[&api], &[]);
    let c = client();
    let own = f.url("/check");
    let routes = format!(r#"[{{"pool": "default", "forward_auth": {{"url": "{own}"}}}}]"#);
    let r = admin(&c, "PUT", &f.admin_url("/admin/routes"), &routes).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("forward_auth.url"), "{}", r.text());
    // Two fulcrums, each the other's auth service: a subrequest goes round once, comes
    // back naming the first one's hop in Via, and is answered 508 — no recursion.
    let g = Fulcrum::over(&[&api], &[]);
    for (from, to) in [(&f, &g), (&g, &f)] {
        let url = to.url("/check");
        let routes = format!(r#"[{{"pool": "default", "forward_auth": {{"url": "{url}"}}}}]"#);
        let r = admin(&c, "PUT", &from.admin_url("/admin/routes"), &routes).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = get(&c, &f.url("/x")).await;
    assert_eq!(r.status, 508, "{}", r.text());
    assert_eq!(api.requests(), 0);
    assert_eq!(outcomes(&f, "refused").await, 1);
    assert_eq!(outcomes(&g, "refused").await, 1);
}
