//! `jwt`: a bearer token verified against the route's key set before anything reaches
//! a backend (`docs/policies.md`, "Bearer tokens (JWT)"); a missing or bad token gets
//! `401` with `WWW-Authenticate: Bearer error="invalid_token"` and nothing more — the
//! reason goes to the log and to `fulcrum_jwt_refused_total{route,reason}`.
//!
//! A signature check costs tens of microseconds (RSA) and a busy client sends the same
//! token many times, so a token that verified is remembered by its bytes until its
//! `exp` (with the leeway), for as long as the route holds the same key set: later
//! requests with it pay a hash of the token and one lookup under the route's own lock.

use std::sync::{Arc, Mutex};

use http::header::{self, HeaderName, HeaderValue};
use http::{Method, StatusCode};

use super::{Before, Explain, Grant, Next, Step};
use crate::clock::Stamp;
use crate::config::auth::{Jwks, Jwt};
use crate::config::policy::Policies;
use crate::jwt::{claim_fields, verify, KeySet, LEEWAY_SECS};
use crate::proxy::answer::ProxyResponse;
use crate::proxy::message::RequestHead;
use crate::stats::JwtRefusal;

/// Tokens remembered per route: one slot each by its key, a newer token taking an older
/// one's slot (only tokens that verified enter).
const SLOTS: usize = 4096;

#[derive(Debug)]
struct JwtStep {
    spec: Jwt,
    /// A `jwks_file`'s keys (a `jwks_url`'s are the route's source's).
    file_keys: Option<Arc<KeySet>>,
    /// The fields `claims_to_headers` names: the client's own are removed.
    claim_names: Vec<HeaderName>,
    /// [`SLOTS`] slots, made with the first token that verified.
    cache: Mutex<Vec<Option<Remembered>>>,
}

/// A token that verified.
#[derive(Debug)]
struct Remembered {
    token: Box<[u8]>,
    /// The key set it verified with: another set (a fetch, a rotation) checks it again.
    keys: Arc<KeySet>,
    /// Its `exp` (leeway added) on the monotonic clock: the request's own stamp is all a
    /// lookup reads, no wall clock.
    until: Stamp,
    /// The fields its claims make (`None`: none).
    fields: Option<Arc<[(HeaderName, HeaderValue)]>>,
}

/// A token's slot in the cache: from its last 8 bytes, which are its signature's (as
/// good as random: 48 bits of base64url), mixed by one multiplication, so a lookup reads
/// 8 bytes, not the whole token; the token is then compared whole. Tokens that share a
/// slot only take each other's place.
#[inline]
fn slot_of(token: &[u8]) -> usize {
    // A token shorter than 8 bytes is no JWS: any slot does.
    let tail = token
        .len()
        .checked_sub(8)
        .and_then(|from| token.get(from..));
    let tail: [u8; 8] = tail.and_then(|t| t.try_into().ok()).unwrap_or_default();
    let mixed = u64::from_le_bytes(tail).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> 52) as usize % SLOTS
}

/// Fields a token's claims make.
type ClaimFields = Option<Arc<[(HeaderName, HeaderValue)]>>;

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
#[inline]
fn is_preflight(head: &RequestHead) -> bool {
    head.method == Method::OPTIONS
        && head.any_value(&header::ORIGIN, |_| true)
        && head.any_value(&header::ACCESS_CONTROL_REQUEST_METHOD, |_| true)
}

/// The token of an `Authorization: Bearer …` value.
#[inline]
fn bearer(v: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = v.split_at_checked(7)?;
    let (word, space) = scheme.split_at(6);
    // One comparison for the six letters: setting bit 0x20 lower-cases a letter, and
    // only `B` or `b` becomes `b` so (and so on for each letter of the word).
    let mut eight = [0u8; 8];
    eight[..6].copy_from_slice(word);
    let lower = u64::from_le_bytes(eight) | 0x0000_2020_2020_2020;
    let ok = lower == u64::from_le_bytes(*b"bearer\0\0") && space == b" ";
    ok.then(|| rest.trim_ascii())
}

/// The value of cookie `name` in a `Cookie` value.
fn cookie<'v>(v: &'v [u8], name: &'v [u8]) -> Option<&'v [u8]> {
    cookies(v, name).next()
}

/// Each value of cookie `name` in a `Cookie` value.
fn cookies<'v>(v: &'v [u8], name: &'v [u8]) -> impl Iterator<Item = &'v [u8]> + 'v {
    v.split(|&b| b == b';').filter_map(move |pair| {
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
    Known(ClaimFields),
    /// To verify.
    New(String),
}

impl JwtStep {
    /// The keys a `jwks_url` route holds now (a `jwks_file` route's are `file_keys`).
    fn url_keys(&self, cx: &Before<'_>) -> Option<Arc<KeySet>> {
        cx.route.jwks.as_ref()?.keys()
    }

    /// The request's token, looked up among those remembered at `now`. Inlined, with
    /// [`Self::lookup`], into the step: a remembered token's path is then one function's
    /// straight line (`docs/performance.md`, "Who may come in").
    #[inline(always)]
    fn seen(&self, head: &RequestHead, keys: &Arc<KeySet>, now: Stamp) -> Seen {
        let mut seen = match head.sole_value(&header::AUTHORIZATION) {
            // Two sets of credentials: which would the backend read? Neither is taken.
            Some((_, true)) => return Seen::New(String::new()),
            Some((v, false)) => match bearer(v) {
                Some(t) => self.lookup(t, keys, now),
                None => Seen::Missing,
            },
            None => Seen::Missing,
        };
        if let (Seen::Missing, Some(name)) = (&seen, &self.spec.token_cookie) {
            let mut found = 0;
            head.any_value(&header::COOKIE, |v| {
                for t in cookies(v, name.as_bytes()) {
                    found += 1;
                    seen = self.lookup(t, keys, now);
                }
                found > 1
            });
            if found > 1 {
                return Seen::New(String::new());
            }
        }
        seen
    }

    /// The request's token as text, without a lookup.
    fn token_text(&self, head: &RequestHead) -> Option<String> {
        let text = |t: &[u8]| String::from_utf8_lossy(t).into_owned();
        let mut found = match head.sole_value(&header::AUTHORIZATION) {
            // Two sets of credentials: a token that cannot verify (`malformed`).
            Some((_, true)) => return Some("two Authorization fields".into()),
            Some((v, false)) => bearer(v).map(text),
            None => None,
        };
        if let (None, Some(name)) = (&found, &self.spec.token_cookie) {
            let mut take = |t: &[u8]| {
                found = Some(String::from_utf8_lossy(t).into_owned());
                true
            };
            head.any_value(&header::COOKIE, |v| {
                cookie(v, name.as_bytes()).is_some_and(&mut take)
            });
        }
        found.filter(|t| !t.is_empty())
    }

    /// `token` among those remembered at `now` with `keys`; one not found is to verify.
    #[inline(always)]
    fn lookup(&self, token: &[u8], keys: &Arc<KeySet>, now: Stamp) -> Seen {
        if token.is_empty() {
            return Seen::Missing;
        }
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Some(r)) = cache.get(slot_of(token)) {
            if now < r.until && *r.token == *token && Arc::ptr_eq(&r.keys, keys) {
                return Seen::Known(r.fields.clone());
            }
        }
        drop(cache);
        unknown(token)
    }

    /// Verifies `token`; remembers it when it is good.
    fn check(&self, token: &str, keys: &Arc<KeySet>) -> Result<ClaimFields, JwtRefusal> {
        let v = verify(token, keys, &self.spec.claims)?;
        let made = claim_fields(&v.claims, &self.spec.claims_to_headers);
        let fields: ClaimFields = (!made.is_empty()).then(|| made.into());
        // `exp` on the monotonic clock: the wall clock read once, here.
        let left = v
            .exp
            .saturating_add(LEEWAY_SECS)
            .saturating_sub(crate::jwt::now_secs());
        let until = Stamp::now().after(std::time::Duration::from_secs(left));
        let remembered = Remembered {
            token: token.as_bytes().into(),
            keys: Arc::clone(keys),
            until,
            fields: fields.clone(),
        };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.is_empty() {
            cache.resize_with(SLOTS, || None);
        }
        if let Some(slot) = cache.get_mut(slot_of(token.as_bytes())) {
            // The one it replaces is dropped after the lock.
            let _old = slot.replace(remembered);
            drop(cache);
        }
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
        cx: &mut Before<'_>,
        (mut ended, until): (tokio::sync::watch::Receiver<u64>, u64),
        token: String,
    ) -> Next<'s> {
        // The client cannot name itself while the keys come: its own fields of the
        // claims' names go now, as on the direct path (the grant only sets those the
        // token has).
        cx.set_fields(&self.claim_names, &[]);
        let source = cx.route.jwks.clone();
        let counts = Arc::clone(&cx.route.access);
        Next::wait(async move {
            // Until the fetch asked for has ended (it may follow one under way).
            let waited = async {
                while *ended.borrow_and_update() < until {
                    if ended.changed().await.is_err() {
                        return;
                    }
                }
            };
            let _ = tokio::time::timeout(2 * crate::jwks::FETCH_TIMEOUT, waited).await;
            let keys = source.as_ref().and_then(|s| s.keys());
            let outcome = match keys {
                Some(k) => self.check(&token, &k),
                None => Err(JwtRefusal::NoKeys),
            };
            match outcome {
                Ok(fields) => Ok(Grant {
                    request: fields.map(|f| f.to_vec()).unwrap_or_default(),
                    answer: Vec::new(),
                }),
                Err(why) => {
                    counts.jwt_refused(why);
                    tracing::info!(reason = why.label(), "jwt: bearer token refused");
                    Err(unauthorized())
                }
            }
        })
    }
}

/// A token not remembered, to verify (out of line: the remembered path stays short).
#[cold]
#[inline(never)]
fn unknown(token: &[u8]) -> Seen {
    match std::str::from_utf8(token) {
        Ok(t) => Seen::New(t.to_string()),
        // Not even text: it cannot be a JWS.
        Err(_) => Seen::New(String::new()),
    }
}

fn unauthorized() -> ProxyResponse {
    ProxyResponse::own(StatusCode::UNAUTHORIZED, "unauthorized\n").with_field(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer error=\"invalid_token\""),
    )
}

impl Step for JwtStep {
    fn name(&self) -> &'static str {
        "jwt"
    }

    fn before<'s>(&'s self, cx: &mut Before<'_>) -> Next<'s> {
        if cx.head.method == Method::OPTIONS && is_preflight(cx.head) {
            cx.set_fields(&self.claim_names, &[]);
            return Next::Go;
        }
        let fetched;
        let keys = match &self.file_keys {
            Some(k) => Some(k),
            None => {
                fetched = self.url_keys(cx);
                fetched.as_ref()
            }
        };
        let Some(keys) = keys else {
            // A URL new at a reload: the request waits for its first fetch.
            let first = cx.route.jwks.as_ref().and_then(|s| s.first_fetch());
            let why = match (first, self.token_text(cx.head)) {
                (Some(ended), Some(token)) => return self.after_fetch(cx, (ended, 1), token),
                (_, None) => JwtRefusal::Missing,
                (None, Some(_)) => JwtRefusal::NoKeys,
            };
            return Next::Answer(Box::new(self.refuse(cx, why)));
        };
        let fields = match self.seen(cx.head, keys, cx.now) {
            Seen::Missing => return Next::Answer(Box::new(self.refuse(cx, JwtRefusal::Missing))),
            Seen::Known(fields) => fields,
            Seen::New(token) => match self.check(&token, keys) {
                Ok(fields) => fields,
                Err(JwtRefusal::UnknownKey) => {
                    let fetch = cx.route.jwks.as_ref().map(|s| s.fetch_for_kid());
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
        if fields.is_some() || !self.claim_names.is_empty() {
            cx.set_fields(&self.claim_names, fields.as_deref().unwrap_or_default());
        }
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
        let token = match self.seen(cx.head, &keys, Stamp::now()) {
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
        assert_eq!(bearer(b"BEARER x"), Some(&b"x"[..]));
        assert_eq!(bearer(b"Bearer\tx"), None);
        assert_eq!(bearer(b"Dearer x"), None);
        assert_eq!(bearer(b"bearez x"), None);
        assert_eq!(cookie(b"a=1; tok=xyz; b=2", b"tok"), Some(&b"xyz"[..]));
        assert_eq!(cookie(b"atok=1", b"tok"), None);
        assert_eq!(cookie(b"tokx=1", b"tok"), None);
    }
}
