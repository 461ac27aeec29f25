//! `jwt`: a bearer token verified against the route's key set before anything reaches
//! a backend (`docs/policies.md`, "Bearer tokens (JWT)"); a missing or bad token gets
//! `401` with `WWW-Authenticate: Bearer error="invalid_token"` and nothing more — the
//! reason goes to the log and to `fulcrum_jwt_refused_total{route,reason}`.
//!
//! A signature check costs tens of microseconds (RSA) and a busy client sends the same
//! token many times, so a token that verified is remembered by its bytes until its
//! `exp` (with the leeway), for as long as the route holds the same key set: later
//! requests with it pay a hash of the token and one lookup under the route's own lock.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};

use http::header::{self, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use xxhash_rust::xxh3::xxh3_64;

use super::{Before, Explain, Grant, Next, Step};
use crate::config::auth::{Jwks, Jwt};
use crate::config::policy::Policies;
use crate::jwt::{claim_fields, verify, KeySet, LEEWAY_SECS};
use crate::proxy::answer::ProxyResponse;
use crate::proxy::message::RequestHead;
use crate::stats::JwtRefusal;

/// Tokens remembered per route; past this the cache starts again (only tokens that
/// verified enter it).
const CACHE: usize = 4096;

#[derive(Debug)]
struct JwtStep {
    spec: Jwt,
    /// A `jwks_file`'s keys (a `jwks_url`'s are the route's source's).
    file_keys: Option<Arc<KeySet>>,
    /// The fields `claims_to_headers` names: the client's own are removed.
    claim_names: Vec<HeaderName>,
    cache: Mutex<Cache>,
}

type Cache = HashMap<u64, Remembered, BuildHasherDefault<Prehashed>>;

/// A token that verified.
#[derive(Debug)]
struct Remembered {
    token: Box<[u8]>,
    /// The key set it verified with: another set (a fetch, a rotation) checks it again.
    keys: Arc<KeySet>,
    exp: u64,
    fields: Arc<[(HeaderName, HeaderValue)]>,
}

/// The map's keys are xxh3 hashes already.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {}
    fn write_u64(&mut self, h: u64) {
        self.0 = h;
    }
}

pub(super) fn build(p: &Policies) -> Option<Box<dyn Step>> {
    let spec = p.jwt.clone()?;
    let file_keys = match &spec.keys {
        Jwks::File { set, .. } => Some(Arc::clone(set)),
        Jwks::Url { .. } => None,
    };
    Some(Box::new(JwtStep {
        claim_names: spec
            .claims_to_headers
            .iter()
            .map(|(_, n)| n.clone())
            .collect(),
        spec,
        file_keys,
        cache: Mutex::default(),
    }))
}

/// A CORS preflight: `OPTIONS` with `Origin` and `Access-Control-Request-Method`
/// (browsers send it without credentials).
fn is_preflight(head: &RequestHead) -> bool {
    head.method == Method::OPTIONS
        && head.any_value(&header::ORIGIN, |_| true)
        && head.any_value(&header::ACCESS_CONTROL_REQUEST_METHOD, |_| true)
}

/// The token of an `Authorization: Bearer …` value.
fn bearer(v: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = v.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
}

/// The value of cookie `name` in a `Cookie` value.
fn cookie<'v>(v: &'v [u8], name: &[u8]) -> Option<&'v [u8]> {
    v.split(|&b| b == b';').find_map(|pair| {
        let pair = pair.trim_ascii();
        let rest = pair.strip_prefix(name)?;
        rest.strip_prefix(b"=")
    })
}

/// What a request's token came to.
enum Seen {
    /// None found.
    Missing,
    /// Remembered and still good: these fields go on.
    Known(Arc<[(HeaderName, HeaderValue)]>),
    /// To verify.
    New(String),
}

impl JwtStep {
    /// The keys the route holds now.
    fn keys(&self, cx: &Before<'_>) -> Option<Arc<KeySet>> {
        match &self.file_keys {
            Some(k) => Some(Arc::clone(k)),
            None => cx.route.jwks.as_ref()?.keys(),
        }
    }

    /// The request's token, looked up among those remembered.
    fn seen(&self, head: &RequestHead, keys: &Arc<KeySet>) -> Seen {
        let mut seen = Seen::Missing;
        head.any_value(&header::AUTHORIZATION, |v| match bearer(v) {
            Some(t) => {
                seen = self.lookup(t, keys);
                true
            }
            None => false,
        });
        if let (Seen::Missing, Some(name)) = (&seen, &self.spec.token_cookie) {
            head.any_value(&header::COOKIE, |v| match cookie(v, name.as_bytes()) {
                Some(t) => {
                    seen = self.lookup(t, keys);
                    true
                }
                None => false,
            });
        }
        seen
    }

    fn lookup(&self, token: &[u8], keys: &Arc<KeySet>) -> Seen {
        if token.is_empty() {
            return Seen::Missing;
        }
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = cache.get(&xxh3_64(token)) {
            let good = r.exp.saturating_add(LEEWAY_SECS) >= crate::jwt::now_secs();
            if good && *r.token == *token && Arc::ptr_eq(&r.keys, keys) {
                return Seen::Known(Arc::clone(&r.fields));
            }
        }
        drop(cache);
        match std::str::from_utf8(token) {
            Ok(t) => Seen::New(t.to_string()),
            // Not even text: it cannot be a JWS.
            Err(_) => Seen::New(String::new()),
        }
    }

    /// Verifies `token`; remembers it when it is good.
    fn check(
        &self,
        token: &str,
        keys: &Arc<KeySet>,
    ) -> Result<Arc<[(HeaderName, HeaderValue)]>, JwtRefusal> {
        let v = verify(token, keys, &self.spec.claims)?;
        let fields: Arc<[_]> = claim_fields(&v.claims, &self.spec.claims_to_headers).into();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE {
            cache.clear();
        }
        cache.insert(
            xxh3_64(token.as_bytes()),
            Remembered {
                token: token.as_bytes().into(),
                keys: Arc::clone(keys),
                exp: v.exp,
                fields: Arc::clone(&fields),
            },
        );
        Ok(fields)
    }

    /// The refusal, counted and logged.
    fn refuse(&self, cx: &Before<'_>, why: JwtRefusal) -> ProxyResponse {
        cx.route.access.jwt_refused(why);
        tracing::info!(reason = why.label(), "jwt: bearer token refused");
        unauthorized()
    }

    /// After an unknown `kid` started a fetch: waits for it (at most the fetch's
    /// timeout), then checks the token against what it brought.
    fn after_fetch<'s>(
        &'s self,
        cx: &Before<'_>,
        mut ended: tokio::sync::watch::Receiver<u64>,
        token: String,
    ) -> Next<'s> {
        let source = cx.route.jwks.clone();
        let counts = Arc::clone(&cx.route.access);
        Next::Wait(Box::pin(async move {
            let _ = tokio::time::timeout(crate::jwks::FETCH_TIMEOUT, ended.changed()).await;
            let keys = source.as_ref().and_then(|s| s.keys());
            let outcome = match keys {
                Some(k) => self.check(&token, &k),
                None => Err(JwtRefusal::NoKeys),
            };
            match outcome {
                Ok(fields) => Ok(Grant {
                    request: fields.to_vec(),
                    answer: Vec::new(),
                }),
                Err(why) => {
                    counts.jwt_refused(why);
                    tracing::info!(reason = why.label(), "jwt: bearer token refused");
                    Err(unauthorized())
                }
            }
        }))
    }
}

fn unauthorized() -> ProxyResponse {
    ProxyResponse::own(StatusCode::UNAUTHORIZED, "unauthorized\n").with_field(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer error=\"invalid_token\""),
    )
}

impl Step for JwtStep {
    fn before<'s>(&'s self, cx: &mut Before<'_>) -> Next<'s> {
        if is_preflight(cx.head) {
            cx.set_fields(&self.claim_names, &[]);
            return Next::Go;
        }
        let Some(keys) = self.keys(cx) else {
            return Next::Answer(Box::new(self.refuse(cx, JwtRefusal::NoKeys)));
        };
        let fields = match self.seen(cx.head, &keys) {
            Seen::Missing => return Next::Answer(Box::new(self.refuse(cx, JwtRefusal::Missing))),
            Seen::Known(fields) => fields,
            Seen::New(token) => match self.check(&token, &keys) {
                Ok(fields) => fields,
                Err(JwtRefusal::UnknownKey) => {
                    let fetch = cx.route.jwks.as_ref().and_then(|s| s.fetch_for_kid());
                    match fetch {
                        Some(ended) => return self.after_fetch(cx, ended, token),
                        None => {
                            let r = self.refuse(cx, JwtRefusal::UnknownKey);
                            return Next::Answer(Box::new(r));
                        }
                    }
                }
                Err(why) => return Next::Answer(Box::new(self.refuse(cx, why))),
            },
        };
        cx.set_fields(&self.claim_names, &fields);
        Next::Go
    }

    fn explain(&self, cx: &Explain<'_>) -> Option<String> {
        let index = cx.index;
        if is_preflight(cx.head) {
            return None;
        }
        let keys = match &self.file_keys {
            Some(k) => Some(Arc::clone(k)),
            None => cx.route.jwks.as_ref().and_then(|s| s.keys()),
        };
        let Some(keys) = keys else {
            return Some(format!(
                "route {index} holds no key set yet (jwks_url): 401"
            ));
        };
        let token = match self.seen(cx.head, &keys) {
            Seen::Missing => {
                return Some(format!(
                    "route {index} asks for a bearer token (jwt) and none is given: 401"
                ))
            }
            Seen::Known(_) => return None,
            Seen::New(t) => t,
        };
        match verify(&token, &keys, &self.spec.claims) {
            Ok(_) => None,
            Err(why) => Some(format!(
                "route {index} refuses this bearer token (jwt: {}): 401",
                why.label()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_found_in_their_fields() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer"), None);
        assert_eq!(cookie(b"a=1; tok=xyz; b=2", b"tok"), Some(&b"xyz"[..]));
        assert_eq!(cookie(b"atok=1", b"tok"), None);
        assert_eq!(cookie(b"tokx=1", b"tok"), None);
    }
}
