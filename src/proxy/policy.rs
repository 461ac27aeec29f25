//! A route's policies on the request path (`docs/policies.md`): built once per routing
//! table (`site::Routing`), run only for a route that has them.

use std::io::Write;
use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderValue};
use http::StatusCode;

use super::answer::{ProxyResponse, RespBody};
use super::message::{RateLimitFields, RequestHead};
use xxhash_rust::xxh3::xxh3_64;

use crate::basic_auth::{Check, Gate, Verified};
use crate::compress::Coding;
use crate::config::policy::{HeaderEdits, LimitKey, LocationPart, Part, Redirect, Template};
use crate::rate_limit::{RateLimiter, Verdict};

/// What a policy's `{…}` stand for, for one request.
pub(super) struct Vars<'a> {
    /// The client's IP (trusted proxies honoured).
    pub(super) client_ip: IpAddr,
    /// Its `X-Request-Id`.
    pub(super) request_id: &'a [u8],
    /// The authority it is for.
    pub(super) host: Option<&'a HeaderValue>,
}

/// Removes, then sets, the fields `edits` names.
pub(super) fn edit(map: &mut HeaderMap, edits: &HeaderEdits, vars: &Vars<'_>) {
    for name in &edits.remove {
        map.remove(name);
    }
    for (name, t) in &edits.set {
        if let Some(v) = render(t, vars) {
            map.insert(name.clone(), v);
        }
    }
}

/// The rate limit's fields of an answer: `RateLimit-Limit` (the configured rate),
/// `RateLimit-Remaining` (requests the key may still send at once) and
/// `RateLimit-Reset` (seconds until its allowance is whole again).
pub(super) fn rate_fields(limiter: &RateLimiter, v: Verdict) -> RateLimitFields {
    RateLimitFields {
        lead: limiter.lead,
        limit: limiter.limit,
        remaining: v.remaining,
        reset: v.reset_s.min(u64::from(u32::MAX)) as u32,
    }
}

/// The answer to a request over its route's rate limit: `429`, `Retry-After` in whole
/// seconds (at least 1) and the `RateLimit-*` fields.
pub(super) fn too_many(limiter: &RateLimiter, v: Verdict) -> ProxyResponse {
    let mut r = ProxyResponse::own(StatusCode::TOO_MANY_REQUESTS, "too many requests\n")
        .with_field(header::RETRY_AFTER, HeaderValue::from(v.retry_after_s));
    r.head.rate_limit = Some(rate_fields(limiter, v));
    r
}

/// The answer of a redirect route: its status, and `Location` from its template with
/// the request's scheme, host, path (as received) and query.
pub(super) fn redirect(r: &Redirect, head: &RequestHead, tls: bool) -> ProxyResponse {
    let mut to = Vec::with_capacity(128);
    for part in &r.parts {
        match part {
            LocationPart::Text(t) => to.extend_from_slice(t.as_bytes()),
            LocationPart::Scheme => to.extend_from_slice(if tls { b"https" } else { b"http" }),
            LocationPart::Host => match head.host() {
                Some(h) => to.extend_from_slice(h.as_bytes()),
                // An HTTP/1.0 request may name no host: `https:///path` would send the
                // client nowhere (docs/policies.md, "Redirects").
                None => return ProxyResponse::own(StatusCode::BAD_REQUEST, "bad request\n"),
            },
            LocationPart::Path => to.extend_from_slice(head.uri.path().as_bytes()),
            LocationPart::Query => {
                if let Some(q) = head.uri.query() {
                    to.push(b'?');
                    to.extend_from_slice(q.as_bytes());
                }
            }
        }
    }
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::PERMANENT_REDIRECT);
    match HeaderValue::from_bytes(&to) {
        Ok(location) => ProxyResponse::own(status, "").with_field(header::LOCATION, location),
        // Every part is a valid field value already; a host with a byte that is not
        // cannot pass the head's checks.
        Err(_) => ProxyResponse::own(StatusCode::BAD_REQUEST, "bad request\n"),
    }
}

/// Lets a request through its route's basic auth, or answers `401` with the realm. A
/// credential not verified before is checked off the worker (`basic_auth::verify`), then
/// remembered; with every core busy and a queue full of checks, `503` for a second.
pub(super) async fn authorize(gate: &Gate, head: &RequestHead) -> Result<(), ProxyResponse> {
    let field = head.field(&header::AUTHORIZATION);
    let ok = match gate.check(field.as_ref().map(HeaderValue::as_bytes)) {
        Check::Known => true,
        Check::Missing => false,
        Check::Verify(attempt) => match crate::basic_auth::verify(attempt).await {
            Verified::Yes(field) => {
                gate.remember(field);
                true
            }
            Verified::No => false,
            Verified::Busy => {
                return Err(
                    ProxyResponse::own(StatusCode::SERVICE_UNAVAILABLE, "busy\n")
                        .with_field(header::RETRY_AFTER, HeaderValue::from_static("1")),
                )
            }
        },
    };
    if ok {
        return Ok(());
    }
    Err(
        ProxyResponse::own(StatusCode::UNAUTHORIZED, "unauthorized\n")
            .with_field(header::WWW_AUTHENTICATE, gate.challenge.clone()),
    )
}

/// A rate limit's bucket key for this request when it does not depend on the client's
/// address: one for the whole route, or a header's value. `None`: the key is the
/// client's address (`ip_key`), asked for only then.
pub(super) fn limit_key(key: &LimitKey, head: &RequestHead) -> Option<u64> {
    match key {
        LimitKey::Route => Some(0),
        LimitKey::Header(name) => head.field(name).map(|v| value_key(v.as_bytes())),
        LimitKey::ClientIp => None,
    }
}

/// The top bit of a key says which space it is in: clear for addresses, set for values.
const VALUE_SPACE: u64 = 1 << 63;

/// A rate limit's key for a client IP, in the addresses' half of the key space.
pub(super) fn ip_key(ip: IpAddr) -> u64 {
    let mixed = match ip {
        // One wide multiply spreads an IPv4 address's bits as well as a hash would.
        IpAddr::V4(a) => {
            let m = u128::from(u32::from(a)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (m as u64) ^ ((m >> 64) as u64)
        }
        IpAddr::V6(a) => xxh3_64(&a.octets()),
    };
    mixed & !VALUE_SPACE
}

/// A rate limit's key for a header's value: SipHash under a key drawn at start (a
/// client cannot work out a value that lands on a chosen bucket, as it could invert
/// an unkeyed hash), in the values' half of the key space, so no value ever shares a
/// bucket with an address (docs/policies.md, "Rate limits").
pub(super) fn value_key(value: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    static KEYED: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    KEYED.get_or_init(Default::default).hash_one(value) | VALUE_SPACE
}

/// The value of `t` for this request; `None` when what it names makes no field value
/// (it cannot: each part is one already).
fn render(t: &Template, vars: &Vars<'_>) -> Option<HeaderValue> {
    if let Some(v) = t.fixed() {
        return Some(v.clone());
    }
    let mut out = Vec::with_capacity(64);
    for p in &t.parts {
        match p {
            Part::Text(v) => out.extend_from_slice(v.as_bytes()),
            Part::ClientIp => {
                let _ = write!(out, "{}", vars.client_ip);
            }
            Part::RequestId => out.extend_from_slice(vars.request_id),
            Part::Host => out.extend_from_slice(vars.host.map_or(&b""[..], |h| h.as_bytes())),
        }
    }
    HeaderValue::from_bytes(&out).ok()
}

/// The coding a request's answer may be compressed with: the best of `offered` its
/// `Accept-Encoding` takes; none for a `HEAD` (its answer has no body to compress).
pub(super) fn coding(head: &RequestHead, offered: &[Coding]) -> Option<Coding> {
    if head.method == http::Method::HEAD {
        return None;
    }
    // Every line of the list, as one (RFC 9110 §5.3).
    let mut accept = Vec::new();
    head.any_value(&header::ACCEPT_ENCODING, |v| {
        if !accept.is_empty() {
            accept.push(b',');
        }
        accept.extend_from_slice(v);
        false
    });
    crate::compress::negotiate(&accept, offered)
}

/// Answers shorter than this are not worth compressing (nginx's `gzip_min_length`).
const MIN_COMPRESSED: u64 = 1024;

/// Compresses a backend's answer with `coding` when it is worth it (`docs/policies.md`,
/// "Compression"): a status with a whole body, no `Content-Encoding` yet, a compressible
/// type, 1 024 bytes or more (or of unknown length), no `Cache-Control: no-transform`.
/// Such an answer says `Vary: Accept-Encoding` even when the client took no coding,
/// as nginx's `gzip_vary` does, so that a cache keeps the two apart.
pub(super) fn compress(r: &mut ProxyResponse, coding: Option<Coding>, extra: &[String]) {
    let status = r.head.status.as_u16();
    if !(200..600).contains(&status) || matches!(status, 204 | 206 | 304) {
        return;
    }
    let head = &r.head;
    let compressible = head.field(&header::CONTENT_ENCODING).is_none()
        && (head.field(&header::CONTENT_TYPE))
            .is_some_and(|t| crate::compress::compressible(t.as_bytes(), extra))
        && (head.field(&header::CONTENT_LENGTH))
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
            .is_none_or(|n| n >= MIN_COMPRESSED)
        && !head.any_value(&header::CACHE_CONTROL, no_transform);
    if !compressible {
        return;
    }
    // Past `compress_max_in_flight` answers at once, this one goes out as it came.
    let coding = coding.and_then(|c| Some((c, crate::compress::Slot::take()?)));
    r.head.edit_fields(|map| {
        add_vary(map);
        if let Some((c, _)) = &coding {
            // What described the backend's bytes does not describe these.
            for name in DESCRIBE_BYTES {
                map.remove(name);
            }
            map.insert(header::CONTENT_ENCODING, HeaderValue::from_static(c.name()));
            weaken_etag(map);
        }
    });
    if let Some((c, slot)) = coding {
        let body = std::mem::replace(&mut r.body, RespBody::empty());
        r.body = body.compressed(c, slot);
    }
}

/// The fields a compressed answer loses: its length, ranges, digests of the backend's
/// bytes, and the trailers it announced (a compressed body drops them).
const DESCRIBE_BYTES: [&str; 7] = [
    "content-length",
    "accept-ranges",
    "content-md5",
    "digest",
    "content-digest",
    "repr-digest",
    "trailer",
];

/// Whether a `Cache-Control` value holds `no-transform` (RFC 9111 §5.2.2.6).
fn no_transform(v: &[u8]) -> bool {
    (v.split(|&b| b == b',')).any(|d| d.trim_ascii().eq_ignore_ascii_case(b"no-transform"))
}

/// Adds `Accept-Encoding` to `Vary` unless it is there already (or `Vary` is `*`).
fn add_vary(map: &mut HeaderMap) {
    let listed = map.get_all(header::VARY).iter().any(|v| {
        (v.as_bytes().split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .any(|t| t == b"*" || t.eq_ignore_ascii_case(b"accept-encoding"))
    });
    if !listed {
        map.append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    }
}

/// A strong `ETag` made weak: the compressed bytes are not the backend's (RFC 9110
/// §8.8.1), though they mean the same.
fn weaken_etag(map: &mut HeaderMap) {
    let Some(tag) = map.get(header::ETAG) else {
        return;
    };
    if tag.as_bytes().starts_with(b"\"") {
        let mut weak = Vec::with_capacity(tag.len() + 2);
        weak.extend_from_slice(b"W/");
        weak.extend_from_slice(tag.as_bytes());
        if let Ok(v) = HeaderValue::from_bytes(&weak) {
            map.insert(header::ETAG, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::policy::Policies;

    #[test]
    fn fields_are_removed_then_set_with_the_request_in_them() {
        let mut p = Policies::default();
        let v = serde_json::json!({"set": {"x-env": "prod", "x-who": "{client_ip}/{request_id}/{host}"}, "remove": ["x-debug", "x-env"]});
        p.set("request_headers", &v).unwrap();
        let mut map = HeaderMap::new();
        map.insert("x-debug", HeaderValue::from_static("1"));
        map.insert("x-env", HeaderValue::from_static("dev"));
        let host = HeaderValue::from_static("api.example.com");
        let vars = Vars {
            client_ip: "192.0.2.7".parse().unwrap(),
            request_id: b"abc",
            host: Some(&host),
        };
        edit(&mut map, p.request_headers.as_ref().unwrap(), &vars);
        assert!(map.get("x-debug").is_none());
        assert_eq!(map["x-env"], "prod");
        assert_eq!(map["x-who"], "192.0.2.7/abc/api.example.com");
    }
}
