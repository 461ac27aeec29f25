//! Bearer tokens (`docs/policies.md`, "Bearer tokens (JWT)") over real sockets: tokens
//! signed at test time with RSA, EC and Ed25519 keys made at test time, checked by a
//! real fulcrum in front of a real backend; a key set served by a real HTTP server,
//! rotated and then stopped; bad configurations.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use common::*;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// A signing key and its public JWK.
struct Signer {
    alg: Algorithm,
    key: EncodingKey,
    jwk: Value,
}

impl Signer {
    fn ec(kid: &str, p384: bool) -> Signer {
        let (alg, sig, crv, n) = match p384 {
            false => (
                Algorithm::ES256,
                &rcgen::PKCS_ECDSA_P256_SHA256,
                "P-256",
                32,
            ),
            true => (
                Algorithm::ES384,
                &rcgen::PKCS_ECDSA_P384_SHA384,
                "P-384",
                48,
            ),
        };
        let kp = rcgen::KeyPair::generate_for(sig).unwrap();
        let raw = kp.public_key_raw();
        let jwk = json!({"kty": "EC", "crv": crv, "kid": kid, "use": "sig",
                         "x": b64(&raw[1..1 + n]), "y": b64(&raw[1 + n..])});
        Signer {
            alg,
            key: EncodingKey::from_ec_der(&kp.serialize_der()),
            jwk,
        }
    }

    fn ed(kid: &str) -> Signer {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let jwk =
            json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": b64(kp.public_key_raw())});
        Signer {
            alg: Algorithm::EdDSA,
            key: EncodingKey::from_ed_der(&kp.serialize_der()),
            jwk,
        }
    }

    /// An RSA key made by openssl (ring makes none), PKCS#1 DER.
    fn rsa(kid: &str, dir: &std::path::Path) -> Signer {
        let pem = dir.join(format!("{kid}.rsa.pem"));
        let der = dir.join(format!("{kid}.rsa.der"));
        let run = |args: &[&str]| {
            let st = std::process::Command::new("openssl")
                .args(args)
                .output()
                .unwrap();
            assert!(
                st.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&st.stderr)
            );
        };
        run(&[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            pem.to_str().unwrap(),
        ]);
        run(&[
            "rsa",
            "-in",
            pem.to_str().unwrap(),
            "-traditional",
            "-outform",
            "DER",
            "-out",
            der.to_str().unwrap(),
        ]);
        let der = std::fs::read(der).unwrap();
        let kp = ring::rsa::KeyPair::from_der(&der).unwrap();
        let public = ring::rsa::PublicKeyComponents::<Vec<u8>>::from(kp.public());
        let jwk = json!({"kty": "RSA", "kid": kid, "n": b64(&public.n), "e": b64(&public.e)});
        Signer {
            alg: Algorithm::RS256,
            key: EncodingKey::from_rsa_der(&der),
            jwk,
        }
    }

    fn sign(&self, claims: &Value) -> String {
        self.sign_as(self.alg, claims)
    }

    fn sign_as(&self, alg: Algorithm, claims: &Value) -> String {
        let mut h = Header::new(alg);
        h.kid = self.jwk["kid"].as_str().map(str::to_string);
        jsonwebtoken::encode(&h, claims, &self.key).unwrap()
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Good claims for the routes below, with `extra` merged in.
fn claims(extra: Value) -> Value {
    let mut c = json!({"iss": "https://id.test", "aud": ["api"], "sub": "alice",
                       "groups": ["ops", "dev"], "exp": now() + 600});
    if let (Some(c), Some(e)) = (c.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            match v {
                Value::Null => c.remove(k),
                v => c.insert(k.clone(), v.clone()),
            };
        }
    }
    c
}

fn jwks(keys: &[&Signer]) -> String {
    json!({"keys": keys.iter().map(|s| s.jwk.clone()).collect::<Vec<_>>()}).to_string()
}

fn route_with(api: &TestBackend, jwt: &str) -> String {
    format!(
        "[[pools]]\nname = \"api\"\nbackends = [{{ url = \"{}\" }}]\n\n[[routes]]\npool = \"api\"\njwt = {jwt}\n",
        api.url()
    )
}

/// `fulcrum_jwt_refused_total{route="0",reason=…}`.
async fn refused(f: &Fulcrum, reason: &str) -> u64 {
    metric(
        f,
        &format!("fulcrum_jwt_refused_total{{route=\"0\",reason=\"{reason}\"}}"),
    )
    .await
}

async fn with_token(f: &Fulcrum, token: &str) -> Got {
    let bearer = format!("Bearer {token}");
    send(
        &client(),
        "GET",
        &f.url("/x"),
        &[("authorization", &bearer)],
        "",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_rsa_ec_and_ed25519_keys_pass_and_every_bad_one_gets_401() {
    let api = TestBackend::start("api");
    let dir = config_file("jwt", "kinds", "")
        .parent()
        .unwrap()
        .to_path_buf();
    let (rsa, ec, ec384, ed) = (
        Signer::rsa("r", &dir),
        Signer::ec("e", false),
        Signer::ec("e384", true),
        Signer::ed("d"),
    );
    let file = dir.join("jwks.json");
    std::fs::write(&file, jwks(&[&rsa, &ec, &ec384, &ed])).unwrap();
    let jwt = format!(
        "{{ jwks_file = \"{}\", issuer = \"https://id.test\", audiences = [\"api\"], claims_to_headers = {{ sub = \"x-user-id\", groups = \"x-groups\" }}, token_cookie = \"tok\" }}",
        file.display()
    );
    let cfg = config_file("jwt", "kinds", &route_with(&api, &jwt));
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let c = client();
    // Good tokens of each kind pass, twice (the second from the cache); the claims
    // reach the backend, the client's own fields of those names do not.
    for s in [&rsa, &ec, &ec384, &ed] {
        let token = s.sign(&claims(json!({})));
        for _ in 0..2 {
            let bearer = format!("Bearer {token}");
            let h = [("authorization", bearer.as_str()), ("x-user-id", "mallory")];
            let r = send(&c, "GET", &f.url("/x"), &h, "").await;
            assert_eq!(r.status, 200, "{:?}: {}", s.alg, r.text());
            let seen = api.stats.last_headers.lock().unwrap().clone().unwrap();
            assert_eq!(seen.get_all("x-user-id").iter().count(), 1);
            assert_eq!(seen["x-user-id"], "alice");
            assert_eq!(seen["x-groups"], "ops, dev");
            assert_eq!(
                seen["authorization"],
                bearer.as_str(),
                "the token goes on unchanged"
            );
        }
    }
    let forwarded = api.requests();
    // PS256 with the RSA key (it names no `alg`), and from the cookie.
    let ps = rsa.sign_as(Algorithm::PS256, &claims(json!({})));
    let cookie = format!("a=1; tok={ps}");
    let r = send(&c, "GET", &f.url("/x"), &[("cookie", cookie.as_str())], "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Two sets of credentials (which would the backend read?): neither is taken, even
    // when one is good — two Authorization fields, or the token cookie twice.
    let good = format!("Bearer {}", ec.sign(&claims(json!({}))));
    let before = refused(&f, "malformed").await;
    let twice = [
        ("authorization", good.as_str()),
        ("authorization", "Bearer forged"),
    ];
    let r = send(&c, "GET", &f.url("/x"), &twice, "").await;
    assert_eq!(r.status, 401, "{}", r.text());
    let twice = [
        ("authorization", good.as_str()),
        ("authorization", good.as_str()),
    ];
    assert_eq!(send(&c, "GET", &f.url("/x"), &twice, "").await.status, 401);
    let two = format!("tok={ps}; tok=forged");
    let r = send(&c, "GET", &f.url("/x"), &[("cookie", two.as_str())], "").await;
    assert_eq!(r.status, 401, "{}", r.text());
    let two = [("cookie", cookie.as_str()), ("cookie", "tok=forged")];
    assert_eq!(send(&c, "GET", &f.url("/x"), &two, "").await.status, 401);
    assert_eq!(refused(&f, "malformed").await, before + 4);
    // Each bad token: 401 with the challenge, nothing forwarded, counted by reason.
    let other_ec = Signer::ec("e", false);
    let hmac = {
        let secret = rsa.jwk["n"].as_str().unwrap().as_bytes().to_vec();
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some("r".into());
        jsonwebtoken::encode(&h, &claims(json!({})), &EncodingKey::from_secret(&secret)).unwrap()
    };
    let none = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","kid":"e"}"#),
        b64(claims(json!({})).to_string().as_bytes())
    );
    let cases = [
        ("expired", ec.sign(&claims(json!({"exp": now() - 120})))),
        ("expired", ec.sign(&claims(json!({"exp": null})))),
        (
            "not_yet_valid",
            ec.sign(&claims(json!({"nbf": now() + 300}))),
        ),
        ("audience", ed.sign(&claims(json!({"aud": "other"})))),
        (
            "issuer",
            rsa.sign(&claims(json!({"iss": "https://evil.test"}))),
        ),
        ("algorithm", none),
        ("algorithm", hmac),
        ("signature", other_ec.sign(&claims(json!({})))),
        ("malformed", "garbage".to_string()),
        ("malformed", "a.b.c".to_string()),
        ("unknown_key", Signer::ed("zz").sign(&claims(json!({})))),
    ];
    for (reason, token) in &cases {
        let before = refused(&f, reason).await;
        let r = with_token(&f, token).await;
        assert_eq!(r.status, 401, "{reason}: {token}");
        assert_eq!(
            r.header("www-authenticate"),
            Some("Bearer error=\"invalid_token\"")
        );
        assert_eq!(r.text(), "unauthorized\n", "no detail to the client");
        assert_eq!(refused(&f, reason).await, before + 1, "{reason}");
    }
    // The token 30 s past `exp` is within the leeway.
    let r = with_token(&f, &ec.sign(&claims(json!({"exp": now() - 30})))).await;
    assert_eq!(r.status, 200);
    let r = send(&c, "GET", &f.url("/x"), &[], "").await;
    assert_eq!(r.status, 401);
    assert_eq!(refused(&f, "missing").await, 1);
    assert_eq!(
        api.requests(),
        forwarded + 2,
        "no refused request was forwarded"
    );
    // A CORS preflight passes without a token.
    let pre = [
        ("origin", "https://app.test"),
        ("access-control-request-method", "POST"),
    ];
    let r = send(&c, "OPTIONS", &f.url("/x"), &pre, "").await;
    assert_eq!(r.status, 200);
    // The route shows its keys; explain names the step.
    let routes = get(&c, &f.admin_url("/admin/routes")).await.json();
    assert_eq!(routes[0]["jwt"]["issuer"], "https://id.test", "{routes}");
    let body = json!({"method": "GET", "path": "/x"}).to_string();
    let e = admin(&c, "POST", &f.admin_url("/admin/explain"), &body).await;
    assert!(e.text().contains("bearer token"), "{}", e.text());
    assert_eq!(e.json()["step"], "jwt", "{}", e.text());
}

/// The rules at their edges: a route without `issuer` or `audiences` takes tokens
/// without them; a token naming no `kid` is tried with each key of its kind; a key
/// naming an `alg` takes no other; `nbf` within the leeway passes; a CORS preflight
/// passes without a token but never with the client's own claim fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rules_hold_at_their_edges() {
    let api = TestBackend::start("api");
    let dir = config_file("jwt", "edges", "")
        .parent()
        .unwrap()
        .to_path_buf();
    let (first, second) = (Signer::ec("one", false), Signer::ec("two", false));
    let mut pinned = Signer::rsa("pinned", &dir);
    pinned.jwk["alg"] = "RS256".into();
    let file = dir.join("edges.jwks.json");
    std::fs::write(&file, jwks(&[&first, &second, &pinned])).unwrap();
    let jwt = format!(
        "{{ jwks_file = \"{}\", claims_to_headers = {{ sub = \"x-user-id\" }} }}",
        file.display()
    );
    let cfg = config_file("jwt", "edges", &route_with(&api, &jwt));
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let bare = claims(json!({"iss": null, "aud": null}));
    assert_eq!(with_token(&f, &first.sign(&bare)).await.status, 200);
    // No kid: the second EC key verifies it after the first fails.
    let no_kid =
        |s: &Signer, c: &Value| jsonwebtoken::encode(&Header::new(s.alg), c, &s.key).unwrap();
    let r = with_token(&f, &no_kid(&second, &bare)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let before = refused(&f, "signature").await;
    let stranger = Signer::ec("x", false);
    assert_eq!(with_token(&f, &no_kid(&stranger, &bare)).await.status, 401);
    assert_eq!(refused(&f, "signature").await, before + 1);
    // The key names RS256: a PS256 token of that key is refused.
    assert_eq!(with_token(&f, &pinned.sign(&bare)).await.status, 200);
    let before = refused(&f, "algorithm").await;
    let ps = pinned.sign_as(Algorithm::PS256, &bare);
    assert_eq!(with_token(&f, &ps).await.status, 401);
    assert_eq!(refused(&f, "algorithm").await, before + 1);
    // nbf 30 s ahead: within the 60 s leeway.
    let soon = claims(json!({"iss": null, "aud": null, "nbf": now() + 30}));
    assert_eq!(with_token(&f, &first.sign(&soon)).await.status, 200);
    // A preflight with the client's own claim field: on, without that field.
    let pre = [
        ("origin", "https://app.test"),
        ("access-control-request-method", "POST"),
        ("x-user-id", "mallory"),
    ];
    let r = send(&client(), "OPTIONS", &f.url("/x"), &pre, "").await;
    assert_eq!(r.status, 200);
    let seen = api.stats.last_headers.lock().unwrap().clone().unwrap();
    assert!(seen.get("x-user-id").is_none(), "{seen:?}");
}

/// A key set served over HTTP: what it serves can change, it counts fetches, and it
/// can stop.
struct KeyServer {
    addr: SocketAddr,
    body: Arc<Mutex<String>>,
    fetches: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl KeyServer {
    async fn start(body: String) -> KeyServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let body = Arc::new(Mutex::new(body));
        let fetches = Arc::new(AtomicU64::new(0));
        let (stop, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (b, n) = (Arc::clone(&body), Arc::clone(&fetches));
        tokio::spawn(async move {
            loop {
                let (s, _) = tokio::select! {
                    a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                    _ = &mut stop_rx => return,
                };
                let (b, n) = (Arc::clone(&b), Arc::clone(&n));
                tokio::spawn(async move {
                    let svc = service_fn(move |_req| {
                        n.fetch_add(1, Ordering::SeqCst);
                        let text = b.lock().unwrap().clone();
                        async move {
                            Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(text))))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(false)
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        KeyServer {
            addr,
            body,
            fetches,
            stop: Some(stop),
        }
    }

    fn fetches(&self) -> u64 {
        self.fetches.load(Ordering::SeqCst)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_url_is_fetched_rotated_on_an_unknown_kid_and_kept_when_its_server_stops() {
    let api = TestBackend::start("api");
    let (a, b) = (Signer::ec("a", false), Signer::ed("b"));
    let mut keys = KeyServer::start(jwks(&[&a])).await;
    let jwt = format!(
        "{{ jwks_url = \"http://{}/jwks.json\", jwks_refresh = \"1s\", claims_to_headers = {{ sub = \"x-user-id\" }} }}",
        keys.addr
    );
    let cfg = config_file("jwt", "url", &route_with(&api, &jwt));
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    // The first fetch ended before the first request was taken.
    assert!(keys.fetches() >= 1);
    assert_eq!(
        with_token(&f, &a.sign(&claims(json!({})))).await.status,
        200
    );
    // Rotation: the server now has b only; a token of b names an unknown kid, which
    // fetches the set again at once.
    // Eight requests at once with the new key, each with a forged claim field: all
    // wait for the one fetch, all pass, and the backend sees the token's claim only.
    *keys.body.lock().unwrap() = jwks(&[&b]);
    let bearer = format!("Bearer {}", b.sign(&claims(json!({}))));
    let c = client();
    let h = [("authorization", bearer.as_str()), ("x-user-id", "mallory")];
    let url = f.url("/x");
    let sent = (0..8).map(|_| send(&c, "GET", &url, &h, ""));
    for r in futures_util::future::join_all(sent).await {
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let seen = api.stats.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(
        seen.get_all("x-user-id").iter().collect::<Vec<_>>(),
        ["alice"]
    );
    // Another unknown kid right after: refused without a fetch (at most one per 10 s).
    let fetched = keys.fetches();
    let r = with_token(&f, &Signer::ed("c").sign(&claims(json!({})))).await;
    assert_eq!(r.status, 401);
    assert_eq!(refused(&f, "unknown_key").await, 1);
    assert!(
        keys.fetches() <= fetched + 1,
        "an unknown kid refetched at most once per 10 s"
    );
    // The server stops: fetches fail and are counted; the last good set still verifies
    // new tokens.
    let _ = keys.stop.take().map(|s| s.send(()));
    let failures = "fulcrum_jwks_fetch_failures_total{route=\"0\"}";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while metric(&f, failures).await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no fetch failure counted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = with_token(&f, &b.sign(&claims(json!({"sub": "bob"})))).await;
    assert_eq!(r.status, 200, "the last good set is kept");
    assert!(f.log().contains("jwks: fetch failed"), "{}", f.log());
    // A URL new with `PUT /admin/routes`: the first request waits for its first fetch.
    let x = Signer::rsa("x", config_file("jwt", "url", "").parent().unwrap());
    let other = KeyServer::start(jwks(&[&x])).await;
    let url = format!("http://{}/keys", other.addr);
    let body = json!([{"pool": "api", "jwt": {"jwks_url": url}}]).to_string();
    let r = admin(&client(), "PUT", &f.admin_url("/admin/routes"), &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = with_token(&f, &x.sign(&claims(json!({})))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(other.fetches(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_whose_jwks_url_never_answered_refuses_until_it_does() {
    let api = TestBackend::start("api");
    let port = free_port();
    let jwt =
        format!("{{ jwks_url = \"http://127.0.0.1:{port}/jwks.json\", jwks_refresh = \"1s\" }}");
    let cfg = config_file("jwt", "down", &route_with(&api, &jwt));
    let f = Fulcrum::start(&["--config", cfg.to_str().unwrap()]);
    let a = Signer::ec("a", false);
    let token = a.sign(&claims(json!({})));
    assert_eq!(with_token(&f, &token).await.status, 401);
    assert_eq!(refused(&f, "no_keys").await, 1);
    // The server comes up on that port: the retries (backoff from 1 s) find it.
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    drop(listener);
    let _keys = KeyServer::start_on(port, jwks(&[&a])).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = with_token(&f, &token).await;
        if r.status == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the set was never fetched"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(api.requests(), 1);
}

impl KeyServer {
    async fn start_on(port: u16, body: String) -> KeyServer {
        // Bound by `start` on an ephemeral port, then moved: simplest to proxy through a
        // listener on the asked port.
        let inner = KeyServer::start(body).await;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let to = inner.addr;
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
                    }
                });
            }
        });
        inner
    }
}

#[test]
fn bad_jwt_and_forward_auth_settings_exit_2_naming_them() {
    let dir = config_file("jwt", "bad", "")
        .parent()
        .unwrap()
        .to_path_buf();
    let not_a_set = dir.join("not-a-set.json");
    std::fs::write(&not_a_set, "{\"kty\": \"RSA\"}").unwrap();
    let htpasswd = dir.join("htpasswd");
    std::fs::write(&htpasswd, "").unwrap();
    let file = not_a_set.display();
    let cases = [
        (format!("jwt = {{ jwks_file = \"{file}\" }}"), "not a JWK set"),
        ("jwt = { jwks_url = \"https://id.test/k\", algorithms = [\"HS256\"] }".into(), "'HS256' is not an algorithm"),
        ("jwt = { jwks_url = \"http://id.test/k\" }".into(), "must be https"),
        ("jwt = { jwks_url = \"https://id.test/k\", claims_to_headers = { sub = \"content-length\" } }".into(), "content-length"),
        ("forward_auth = { url = \"ftp://127.0.0.1/check\" }".into(), "not an http:// or https:// URL"),
        ("forward_auth = { url = \"http://127.0.0.1/check\", timeout = \"soon\" }".into(), "forward_auth.timeout"),
        (format!("jwt = {{ jwks_url = \"https://id.test/k\" }}\nbasic_auth = {{ realm = \"r\", users_file = \"{}\" }}", htpasswd.display()), "basic_auth and jwt"),
        ("allow = [\"10.0.0.0/33\"]".into(), "allow"),
        ("jwt = { jwks_url = \"https://id.test/k\", jwks_refresh = \"100ms\" }".into(), "jwt.jwks_refresh: '100ms' is under 1s"),
        ("jwt = { jwks_url = \"https://id.test/k\", claims_to_headers = { sub = \"Authorization\" } }".into(), "carries the token"),
        // This fulcrum's own listener (127.0.0.1:8080 by default) as the key server.
        ("jwt = { jwks_url = \"http://127.0.0.1:8080/k\" }".into(), "jwt.jwks_url: 127.0.0.1:8080 is this fulcrum's own listener"),
        ("forward_auth = { url = \"http://localhost:8080/check\" }".into(), "forward_auth.url"),
    ];
    for (i, (policy, expected)) in cases.iter().enumerate() {
        let text = format!("[[pools]]\nname = \"api\"\n\n[[routes]]\npool = \"api\"\n{policy}\n");
        let cfg = config_file("jwt", &format!("bad{i}"), &text);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fulcrum"))
            .args(["check", "--config", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{policy}: {err}");
        assert!(err.contains(expected), "{policy}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_admin_routes_refuses_a_bad_jwt_with_400_and_keeps_the_routes() {
    let api = TestBackend::start("api");
    let f = Fulcrum::over(&[&api], &[]);
    let c = client();
    let before = get(&c, &f.admin_url("/admin/routes")).await.text();
    for body in [
        json!([{"pool": "default", "jwt": {"jwks_file": "/nonexistent/jwks.json"}}]),
        json!([{"pool": "default", "jwt": {"jwks_url": "https://id.test/k", "algorithms": ["none"]}}]),
        json!([{"pool": "default", "forward_auth": {"url": "gopher://x"}}]),
    ] {
        let r = admin(&c, "PUT", &f.admin_url("/admin/routes"), &body.to_string()).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert!(r.json()["error"].is_string(), "{}", r.text());
    }
    assert_eq!(get(&c, &f.admin_url("/admin/routes")).await.text(), before);
}
