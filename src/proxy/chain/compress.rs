//! `compress` and `compress_types`: answers compressed with the best coding the client
//! takes (`docs/policies.md`, "Compression").

use http::header::{self, HeaderMap, HeaderValue};

use super::{After, Before, Next, Step};
use crate::compress::Coding;
use crate::config::policy::Policies;
use crate::proxy::answer::{ProxyResponse, RespBody};
use crate::proxy::message::RequestHead;

#[derive(Debug)]
struct CompressStep {
    /// The codings, most preferred first.
    offered: Vec<Coding>,
    /// Media types compressed beside the usual ones.
    types: Vec<String>,
}

pub(super) fn build(p: &Policies) -> Option<Box<dyn Step>> {
    Some(Box::new(CompressStep {
        offered: p.compress.clone()?,
        types: p.compress_types.clone(),
    }))
}

impl Step for CompressStep {
    fn name(&self) -> &'static str {
        "compress"
    }

    fn before<'s>(&'s self, cx: &mut Before<'_>) -> Next<'s> {
        cx.found.coding = coding(cx.head, &self.offered);
        Next::Go
    }

    fn edits_answer(&self) -> bool {
        true
    }

    fn after(&self, cx: &After<'_>, r: &mut ProxyResponse) {
        compress(r, cx.found.coding, &self.types);
    }
}

/// The coding a request's answer may be compressed with: the best of `offered` its
/// `Accept-Encoding` takes; none for a `HEAD` (its answer has no body to compress).
fn coding(head: &RequestHead, offered: &[Coding]) -> Option<Coding> {
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
fn compress(r: &mut ProxyResponse, coding: Option<Coding>, extra: &[String]) {
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
