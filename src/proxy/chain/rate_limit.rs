//! `rate_limit`: requests per key and time over which a request is answered `429`, and
//! the `RateLimit-*` fields of every answer on the route (`docs/policies.md`, "Rate
//! limits").

use std::net::IpAddr;
use std::sync::atomic::Ordering;

use http::header::{self, HeaderValue};
use http::StatusCode;
use xxhash_rust::xxh3::xxh3_64;

use super::{After, Before, Explain, Next, Step};
use crate::clock::Stamp;
use crate::config::policy::{LimitKey, Policies, RateLimit};
use crate::proxy::answer::ProxyResponse;
use crate::proxy::message::{RateLimitFields, RequestHead};
use crate::rate_limit::{RateLimiter, Verdict};

#[derive(Debug)]
struct RateLimitStep {
    spec: RateLimit,
    /// The buckets, kept while the routing table lives.
    limiter: RateLimiter,
}

pub(super) fn build(p: &Policies) -> Option<Box<dyn Step>> {
    let spec = p.rate_limit.clone()?;
    Some(Box::new(RateLimitStep {
        limiter: RateLimiter::new(&spec),
        spec,
    }))
}

impl Step for RateLimitStep {
    fn name(&self) -> &'static str {
        "rate_limit"
    }

    #[inline]
    fn before<'s>(&'s self, cx: &mut Before<'_>) -> Next<'s> {
        let key = match limit_key(&self.spec.key, cx.head) {
            Some(key) => key,
            None => ip_key(cx.client_ip()),
        };
        let v = self.limiter.check(key, cx.now);
        if !v.allowed {
            cx.route.limited.fetch_add(1, Ordering::Relaxed);
            return Next::Answer(Box::new(too_many(&self.limiter, v)));
        }
        cx.found.limit = Some(rate_fields(&self.limiter, v));
        Next::Go
    }

    fn edits_answer(&self) -> bool {
        true
    }

    fn after(&self, cx: &After<'_>, r: &mut ProxyResponse) {
        r.head.rate_limit = cx.found.limit;
    }

    fn explain(&self, cx: &Explain<'_>) -> Option<String> {
        let key = limit_key(&self.spec.key, cx.head).unwrap_or_else(|| ip_key(cx.client_ip));
        if self.limiter.would_allow(key, Stamp::now()) {
            return None;
        }
        Some(format!(
            "route {}'s rate limit answers 429: its key is over {} requests per {:?}",
            cx.index, self.spec.rate, self.spec.per
        ))
    }
}

/// The rate limit's fields of an answer: `RateLimit-Limit` (the configured rate),
/// `RateLimit-Remaining` (requests the key may still send at once) and
/// `RateLimit-Reset` (seconds until its allowance is whole again).
#[inline]
fn rate_fields(limiter: &RateLimiter, v: Verdict) -> RateLimitFields {
    RateLimitFields {
        lead: limiter.lead,
        limit: limiter.limit,
        remaining: v.remaining,
        reset: v.reset_s.min(u64::from(u32::MAX)) as u32,
    }
}

/// The answer to a request over its route's rate limit: `429`, `Retry-After` in whole
/// seconds (at least 1) and the `RateLimit-*` fields.
fn too_many(limiter: &RateLimiter, v: Verdict) -> ProxyResponse {
    let mut r = ProxyResponse::own(StatusCode::TOO_MANY_REQUESTS, "too many requests\n")
        .with_field(header::RETRY_AFTER, HeaderValue::from(v.retry_after_s));
    r.head.rate_limit = Some(rate_fields(limiter, v));
    r
}

/// A rate limit's bucket key for this request when it does not depend on the client's
/// address: one for the whole route, or a header's value. `None`: the key is the
/// client's address (`ip_key`), asked for only then.
#[inline]
fn limit_key(key: &LimitKey, head: &RequestHead) -> Option<u64> {
    match key {
        LimitKey::Route => Some(0),
        LimitKey::Header(name) => head.field(name).map(|v| value_key(v.as_bytes())),
        LimitKey::ClientIp => None,
    }
}

/// The top bit of a key says which space it is in: clear for addresses, set for values.
const VALUE_SPACE: u64 = 1 << 63;

/// A rate limit's key for a client IP, in the addresses' half of the key space.
#[inline]
fn ip_key(ip: IpAddr) -> u64 {
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
fn value_key(value: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    static KEYED: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    KEYED.get_or_init(Default::default).hash_one(value) | VALUE_SPACE
}
