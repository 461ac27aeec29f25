//! `X-Request-Id` (`docs/operations.md`, "Request ids"): every request carries one to
//! its backend and back to its client, and the access log shows it. A trusted peer's
//! own id is kept (it names the request across the proxies in front), else fulcrum
//! makes one: 128 random bits as 32 lowercase hex digits, as nginx's `$request_id`.

use http::header::{HeaderName, HeaderValue};

/// The field's name.
pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// W3C Trace Context's field (`docs/operations.md`, "Request ids").
pub(crate) const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// W3C Trace Context's vendor field, forwarded as it came.
pub(crate) const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Longest id kept from a trusted peer; a longer one is replaced.
const MAX_LEN: usize = 64;

/// A request's id: fulcrum's own (128 bits, as hex), or a trusted peer's text. Cheap
/// to clone, since it travels with the request and its answer.
#[derive(Clone)]
pub(crate) enum RequestId {
    /// Made here: 32 lowercase hex digits.
    Ours([u8; 32]),
    /// A trusted peer's.
    Theirs(std::sync::Arc<[u8]>),
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

impl RequestId {
    /// A new id: 128 bits of the thread's random generator.
    #[inline]
    pub(crate) fn random() -> RequestId {
        let mut out = [0u8; 32];
        let (hi, lo) = out.split_at_mut(16);
        hex16(fastrand::u64(..), hi);
        hex16(fastrand::u64(..), lo);
        RequestId::Ours(out)
    }

    /// A peer's id, if it is one fulcrum passes on: 1 to 64 characters of letters,
    /// digits and `-_.:/+=` (UUIDs, hex, base64, W3C trace ids), so that it needs no
    /// quoting in a log line or a header.
    pub(crate) fn from_peer(v: &[u8]) -> Option<RequestId> {
        let ok = |c: &u8| c.is_ascii_alphanumeric() || b"-_.:/+=".contains(c);
        if v.is_empty() || v.len() > MAX_LEN || !v.iter().all(ok) {
            return None;
        }
        Some(RequestId::Theirs(v.into()))
    }

    /// A `traceparent` (version 00) for a request that came without one: its trace id
    /// is this id when it is one already (32 lowercase hex digits, not all zero, as
    /// fulcrum's own are), else a 128-bit hash of it; the parent id is random; sampled.
    pub(crate) fn traceparent(&self) -> HeaderValue {
        use crate::trace::context::{traceparent, SpanId, TraceId};
        let id = self.as_bytes();
        let trace = TraceId::from_hex(id)
            .unwrap_or_else(|| TraceId((xxhash_rust::xxh3::xxh3_128(id) | 1).to_be_bytes()));
        // Hex digits and dashes only.
        HeaderValue::from_bytes(&traceparent(&trace, &SpanId::random())).unwrap_or_else(|_| {
            HeaderValue::from_static("00-00000000000000000000000000000001-0000000000000001-01")
        })
    }

    /// The id as written.
    #[inline]
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            RequestId::Ours(h) => h,
            RequestId::Theirs(t) => t,
        }
    }

    /// The id as a field value (see [`field_value`]).
    pub(crate) fn header_value(&self) -> HeaderValue {
        field_value(self.as_bytes())
    }
}

/// An id as a field value, marked never to be indexed by HPACK (and QPACK): an id is
/// new on every request, so entering it in a connection's dynamic table only pushes out
/// fields that do repeat, and makes each later lookup of the name walk every id still
/// there (`docs/performance.md`, "HTTP/2 from clients"). nginx and HAProxy index no
/// field they send.
pub(crate) fn field_value(id: &[u8]) -> HeaderValue {
    // An id's characters are all valid in a field value (`from_peer`, `random`).
    let mut v = HeaderValue::from_bytes(id).unwrap_or(HeaderValue::from_static("-"));
    v.set_sensitive(true);
    v
}

/// `x` as 16 lowercase hex digits into `out` (16 bytes), most significant first: each
/// nibble spread to a byte, then made a digit without a table or a branch.
#[inline]
fn hex16(x: u64, out: &mut [u8]) {
    for (half, chunk) in [(x >> 32) as u32, x as u32]
        .into_iter()
        .zip(out.chunks_exact_mut(8))
    {
        // The 8 nibbles of `half`, one per byte, most significant in the lowest byte.
        let mut n = u64::from(half);
        n = (n | (n << 16)) & 0x0000_ffff_0000_ffff;
        n = (n | (n << 8)) & 0x00ff_00ff_00ff_00ff;
        n = (n | (n << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
        let n = n.swap_bytes();
        // '0' + n, and 39 more ('a' - '0' - 10) where n > 9.
        let over9 = ((n + 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101;
        let digits = n + 0x3030_3030_3030_3030 + over9 * 39;
        chunk.copy_from_slice(&digits.to_le_bytes());
    }
}

/// Whether a field name is `X-Request-Id`, in any case.
#[inline]
pub(crate) fn is_request_id(name: &[u8]) -> bool {
    name.len() == 12 && name.eq_ignore_ascii_case(b"x-request-id")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_id_is_32_lowercase_hex_digits_and_new_each_time() {
        let a = RequestId::random().as_bytes().to_vec();
        let b = RequestId::random().as_bytes().to_vec();
        assert_eq!(a.len(), 32);
        assert!(a
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c)));
        assert_ne!(a, b);
        let mut h = [0u8; 16];
        for (x, text) in [
            (1u64, "0000000000000001"),
            (u64::MAX, "ffffffffffffffff"),
            (0x0123_4567_89ab_cdef, "0123456789abcdef"),
            (0xfedc_ba98_7654_3210, "fedcba9876543210"),
        ] {
            hex16(x, &mut h);
            assert_eq!(std::str::from_utf8(&h).unwrap(), text);
        }
    }

    #[test]
    fn a_peer_id_is_kept_only_when_it_is_plain() {
        let uuid = b"3f2c1e9a-9c1d-4b8e-a1f0-0b7c2d9e4f61";
        let kept = RequestId::from_peer(uuid).unwrap();
        assert_eq!(kept.as_bytes(), uuid);
        assert!(RequestId::from_peer(b"").is_none());
        assert!(RequestId::from_peer(b"a b").is_none());
        assert!(RequestId::from_peer(b"x\"y").is_none());
        assert!(RequestId::from_peer(&[b'a'; 65]).is_none());
        assert!(is_request_id(b"X-Request-ID") && !is_request_id(b"x-request-i"));
    }

    #[test]
    fn an_id_is_never_indexed() {
        let v = RequestId::random().header_value();
        assert!(v.is_sensitive());
        assert_eq!(v.len(), 32);
        assert_eq!(field_value(b"a\nb"), "-");
    }
}
