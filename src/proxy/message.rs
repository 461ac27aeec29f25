//! The request and the answer as the request path carries them: a head beside the
//! body, in both directions.
//!
//! A head's header fields come in one of two forms. hyper's server and client hand over
//! a header map; the client-side fast path and the inline upstream exchange keep the
//! fields as spans of the bytes they read (no map built per request, see
//! `docs/performance.md`). Both forms are variants of one field type, so whatever reads
//! a header — a rule, a log line, a routing decision — reads it from the head and gets
//! the truth whichever path the message took; nothing hides fields in a body or leaves
//! a map empty.

use std::net::SocketAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Uri, Version};

use super::headers::{ClientFields, Spans};
use crate::backend::observe;

thread_local! {
    static DATE: std::cell::RefCell<(u64, HeaderValue)> =
        const { std::cell::RefCell::new((u64::MAX, HeaderValue::from_static(""))) };
}

/// The current `Date` value, formatted once per second per thread, for the answers a
/// front end writes without one.
pub(crate) fn date() -> HeaderValue {
    let now = std::time::SystemTime::now();
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs {
            let text = httpdate::fmt_http_date(now);
            if let Ok(v) = HeaderValue::from_str(&text) {
                *d = (secs, v);
            }
        }
        d.1.clone()
    })
}

/// A request's header fields.
#[derive(Debug)]
pub(crate) enum RequestFields {
    /// As a header map (hyper's server path, and every request with a body).
    Map(HeaderMap),
    /// As spans of the client's head (the fast path's bodiless requests).
    Spans(ClientFields),
}

impl RequestFields {
    /// About the bytes the fields and the request line `target` take on the wire: what
    /// a head written from them starts with room for, beside what this hop adds.
    pub(crate) fn wire_len(&self, target: &str) -> usize {
        match self {
            // About the length of a common field.
            RequestFields::Map(map) => target.len() + 48 * map.len(),
            RequestFields::Spans(f) => f.head_len(),
        }
    }
}

/// A request's head: what the request path reads and rewrites before it forwards.
#[derive(Debug)]
pub(crate) struct RequestHead {
    /// The method.
    pub(crate) method: Method,
    /// The target as received.
    pub(crate) uri: Uri,
    /// The client's protocol version.
    pub(crate) version: Version,
    /// The header fields.
    pub(crate) fields: RequestFields,
}

/// Whether any of `fields` (name as spelled, value) named `name` has a value `pred`
/// holds for: the span forms' side of both heads' `any_value`.
fn any_named<'f>(
    mut fields: impl Iterator<Item = (&'f [u8], &'f [u8])>,
    name: &HeaderName,
    mut pred: impl FnMut(&[u8]) -> bool,
) -> bool {
    let name = name.as_str().as_bytes();
    fields.any(|(n, v)| n.eq_ignore_ascii_case(name) && pred(v))
}

impl RequestHead {
    /// The head of a request hyper parsed.
    pub(crate) fn from_parts(parts: http::request::Parts) -> RequestHead {
        RequestHead {
            method: parts.method,
            uri: parts.uri,
            version: parts.version,
            fields: RequestFields::Map(parts.headers),
        }
    }

    /// What the head gives its combined access log line; the length comes with the
    /// answer.
    pub(crate) fn combined_fields(&self) -> super::record::Combined {
        super::record::Combined {
            referer: self.field(&header::REFERER),
            user_agent: self.field(&header::USER_AGENT),
            bytes: None,
        }
    }

    /// The value of the first field named `name`: the one place to read a request's
    /// field, whichever form its fields are in.
    #[allow(
        dead_code,
        reason = "the reading side of the head, for rules that read a field"
    )]
    pub(crate) fn field(&self, name: &HeaderName) -> Option<HeaderValue> {
        match &self.fields {
            RequestFields::Map(m) => m.get(name).cloned(),
            RequestFields::Spans(f) => f.value(name.as_str().as_bytes()),
        }
    }

    /// The first value of the field `name`, borrowed: no copy, whichever form the
    /// fields are in (a rule read on every request, such as a bearer token).
    #[inline]
    pub(crate) fn first_value(&self, name: &HeaderName) -> Option<&[u8]> {
        match &self.fields {
            RequestFields::Map(m) => m.get(name).map(HeaderValue::as_bytes),
            RequestFields::Spans(f) => f.value_bytes(name.as_str().as_bytes()),
        }
    }

    /// [`Self::first_value`], and whether another field of that name follows (a field
    /// that must come once, such as the credentials a step checks).
    #[inline]
    pub(crate) fn sole_value(&self, name: &HeaderName) -> Option<(&[u8], bool)> {
        match &self.fields {
            RequestFields::Map(m) => {
                let mut all = m.get_all(name).iter();
                let first = all.next()?.as_bytes();
                Some((first, all.next().is_some()))
            }
            RequestFields::Spans(f) => f.sole_value_bytes(name.as_str().as_bytes()),
        }
    }

    /// Whether any field named `name` has a value `pred` holds for (every line of a
    /// list-valued field).
    pub(crate) fn any_value(&self, name: &HeaderName, mut pred: impl FnMut(&[u8]) -> bool) -> bool {
        match &self.fields {
            RequestFields::Map(m) => m.get_all(name).iter().any(|v| pred(v.as_bytes())),
            RequestFields::Spans(f) => any_named(f.iter(), name, pred),
        }
    }

    /// Whether the first field named `name` has exactly `value` (a route's header
    /// condition).
    pub(crate) fn has_field(&self, name: &HeaderName, value: &[u8]) -> bool {
        match &self.fields {
            RequestFields::Map(m) => m.get(name).is_some_and(|v| v.as_bytes() == value),
            RequestFields::Spans(f) => f
                .value(name.as_str().as_bytes())
                .is_some_and(|v| v.as_bytes() == value),
        }
    }

    /// The authority the request is for: the target's own in absolute form
    /// (`GET http://a.example/ HTTP/1.1`, RFC 9112 §3.2.2: it replaces `Host`), else
    /// `Host` as the client sent it, else `:authority` (HTTP/2).
    pub(crate) fn host(&self) -> Option<HeaderValue> {
        let authority = || {
            self.uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        };
        match &self.fields {
            RequestFields::Spans(f) => f.host(),
            RequestFields::Map(_)
                if self.version != Version::HTTP_2
                    && self.version != Version::HTTP_3
                    && self.uri.authority().is_some() =>
            {
                authority()
            }
            RequestFields::Map(m) => m.get(header::HOST).cloned().or_else(authority),
        }
    }

    /// Bytes of the head as sent on the wire: the request line and a
    /// `name: value\r\n` line per field.
    pub(crate) fn size(&self) -> usize {
        let line = self.method.as_str().len()
            + self.uri.path_and_query().map_or(1, |p| p.as_str().len())
            + 12;
        line + match &self.fields {
            RequestFields::Map(m) => m
                .iter()
                .map(|(k, v)| k.as_str().len() + v.len() + 4)
                .sum::<usize>(),
            RequestFields::Spans(f) => f.size(),
        }
    }

    /// Turns span fields into a header map (a request that goes through hyper's
    /// client); a map stays as it is.
    pub(crate) fn make_map(&mut self) {
        if let RequestFields::Spans(f) = &self.fields {
            self.fields = RequestFields::Map(f.to_map());
        }
    }
}

/// An answer's header fields.
#[derive(Debug)]
pub(crate) enum ResponseFields {
    /// As a header map (hyper's client, and fulcrum's own answers).
    Map(HeaderMap),
    /// As spans of the backend's head (an inline exchange; see [`Fields`]).
    Wire(Fields),
}

/// An answer's head.
#[derive(Debug)]
pub(crate) struct ResponseHead {
    /// The status.
    pub(crate) status: StatusCode,
    /// The backend's protocol version (hyper's server frames an HTTP/1.0 backend's
    /// answer as such); HTTP/1.1 for fulcrum's own answers.
    pub(crate) version: Version,
    /// The backend's reason phrase when it is not the status's usual one.
    pub(crate) reason: Option<hyper::ext::ReasonPhrase>,
    /// The request's `X-Request-Id`, written in place of any the backend sent; `None`
    /// until the proxy sets it.
    pub(crate) request_id: Option<super::request_id::RequestId>,
    /// The header fields, hop-by-hop fields already removed.
    pub(crate) fields: ResponseFields,
    /// The route's rate limit's fields, written beside the others by each front end
    /// (so that span fields need not become a map for them).
    pub(crate) rate_limit: Option<RateLimitFields>,
    /// Whether the answer says `Alt-Svc` ([`super::alt_svc`]): an answer over TLS (h1,
    /// h2) while HTTP/3 is on.
    pub(crate) alt_svc: bool,
}

/// `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` of an answer on a
/// rate-limited route (`docs/policies.md`, "Rate limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateLimitFields {
    /// `ratelimit-limit: N\r\nratelimit-remaining: `, made once per route
    /// ([`crate::rate_limit::RateLimiter::lead`]).
    pub(crate) lead: crate::rate_limit::FieldsLead,
    /// The configured rate.
    pub(crate) limit: u32,
    /// Requests the key may still send at once.
    pub(crate) remaining: u32,
    /// Seconds until its allowance is whole again.
    pub(crate) reset: u32,
}

impl RateLimitFields {
    /// Each field's name and value.
    pub(crate) fn fields(&self) -> [(&'static str, u32); 3] {
        [
            ("ratelimit-limit", self.limit),
            ("ratelimit-remaining", self.remaining),
            ("ratelimit-reset", self.reset),
        ]
    }

    /// Writes the three fields as an HTTP/1.1 head holds them. Every answer on a limited
    /// route carries them, so the route's constant part is copied as made, and the rest
    /// is put together on the stack (numbers written in place). Each part is appended
    /// whole, at its fixed size, then cut to its length: no copy of unknown length.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&self.lead.bytes);
        out.truncate(start + usize::from(self.lead.len));
        let mut buf = [0u8; TAIL_MAX];
        let mut at = put_u32(&mut buf, 0, self.remaining);
        at = put(&mut buf, at, b"\r\nratelimit-reset: ");
        at = put_u32(&mut buf, at, self.reset);
        at = put(&mut buf, at, b"\r\n");
        let start = out.len();
        out.extend_from_slice(&buf);
        out.truncate(start + at);
    }
}

/// The longest the fields' end can be: `RateLimit-Reset`'s name, two line ends and two
/// numbers of up to 10 digits.
const TAIL_MAX: usize = 19 + 2 + 2 * 10;

/// Copies `s` into `buf` at `at`; where it ends.
#[inline(always)]
fn put<const N: usize>(buf: &mut [u8; TAIL_MAX], at: usize, s: &[u8; N]) -> usize {
    buf[at..at + N].copy_from_slice(s);
    at + N
}

/// Two decimal digits of each number under 100, in order.
const DIGIT_PAIRS: &[u8; 200] = b"\
    0001020304050607080910111213141516171819\
    2021222324252627282930313233343536373839\
    4041424344454647484950515253545556575859\
    6061626364656667686970717273747576777879\
    8081828384858687888990919293949596979899";

/// Writes `v` in decimal into `buf` at `at`, in place (two digits at a time, from the
/// end); where it ends.
#[inline(always)]
fn put_u32(buf: &mut [u8; TAIL_MAX], at: usize, mut v: u32) -> usize {
    // Remaining requests and seconds are mostly small: counted without a logarithm.
    let len = match v {
        0..=9 => 1,
        10..=99 => 2,
        100..=999 => 3,
        1000..=9999 => 4,
        _ => v.ilog10() as usize + 1,
    };
    let end = at + len;
    let mut i = end;
    while v >= 10 {
        let pair = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
    if i > at {
        buf[at] = b'0' + v as u8;
    }
    end
}

/// A field this hop adds to every answer, whatever writes the head
/// ([`ResponseHead::finish`]).
pub(crate) enum Added<'a> {
    /// `Date`, when the backend sent none.
    Date(HeaderValue),
    /// `Alt-Svc`, over TLS while HTTP/3 is on (a backend's own was dropped when its
    /// answer was read: `headers::strip_answer`).
    AltSvc(&'static HeaderValue),
    /// `X-Request-Id`.
    RequestId(&'a super::request_id::RequestId),
    /// `RateLimit-Limit`, `-Remaining` and `-Reset`, on a rate-limited route.
    RateLimit(&'a RateLimitFields),
}

impl ResponseHead {
    /// Marks the answer to `peer`'s request of `version`: its `X-Request-Id`, and
    /// `Alt-Svc` when it goes over TLS by TCP (an HTTP/3 client is where it points).
    #[inline]
    pub(crate) fn stamp(
        &mut self,
        id: super::request_id::RequestId,
        peer: &Peer,
        version: Version,
    ) {
        self.request_id = Some(id);
        self.alt_svc = peer.tls && version != Version::HTTP_3;
    }

    /// Every field this hop adds to the head, in the order they are written: `Date`
    /// unless the head `has_date`, `Alt-Svc`, `X-Request-Id`, the rate limit's. The span
    /// writer (`front.rs`) and the map writer ([`super::ProxyResponse::into_http`], for
    /// hyper, HTTP/2 and HTTP/3) both write this list, so no front end adds one of its
    /// own or misses one.
    #[inline(always)]
    pub(crate) fn finish(&self, has_date: bool, mut add: impl FnMut(Added<'_>)) {
        if !has_date {
            add(Added::Date(date()));
        }
        if let (true, Some(v)) = (self.alt_svc, alt_svc()) {
            add(Added::AltSvc(v));
        }
        if let Some(id) = &self.request_id {
            add(Added::RequestId(id));
        }
        if let Some(rl) = &self.rate_limit {
            add(Added::RateLimit(rl));
        }
    }

    /// Adds a field (a sticky cookie); span fields are made into a map for it.
    pub(crate) fn append_field(&mut self, name: HeaderName, value: HeaderValue) {
        self.edit_fields(|map| {
            map.append(name, value);
        });
    }

    /// Changes the fields as a map (span fields are made into one).
    pub(crate) fn edit_fields(&mut self, edit: impl FnOnce(&mut HeaderMap)) {
        let fields = std::mem::replace(&mut self.fields, ResponseFields::Map(HeaderMap::new()));
        let mut map = match fields {
            ResponseFields::Map(m) => m,
            ResponseFields::Wire(f) => f.into_map(),
        };
        edit(&mut map);
        self.fields = ResponseFields::Map(map);
    }

    /// Whether any field named `name` has a value `pred` holds for (every line of a
    /// list-valued field).
    pub(crate) fn any_value(&self, name: &HeaderName, mut pred: impl FnMut(&[u8]) -> bool) -> bool {
        match &self.fields {
            ResponseFields::Map(m) => m.get_all(name).iter().any(|v| pred(v.as_bytes())),
            ResponseFields::Wire(f) => any_named(f.iter(), name, pred),
        }
    }

    /// The value of the first field named `name` (`Content-Length` included): the one
    /// place to read an answer's field, whichever form its fields are in.
    pub(crate) fn field(&self, name: &HeaderName) -> Option<HeaderValue> {
        match &self.fields {
            ResponseFields::Map(m) => m.get(name).cloned(),
            ResponseFields::Wire(f) if *name == header::CONTENT_LENGTH => {
                f.length.map(HeaderValue::from)
            }
            ResponseFields::Wire(f) => f.value(name.as_str().as_bytes()),
        }
    }
}

/// The header fields of a response head read inline, as spans of the head's own bytes,
/// without its hop-by-hop fields and without `Content-Length` (kept parsed in
/// [`Fields::length`]). The client-side fast path writes them straight out; hyper's
/// server gets a header map made from them ([`Fields::into_map`]). Building that map for
/// every answer (a `HeaderName` lookup, a shared `Bytes` slice and a hashed insert per
/// field, then tearing it down) was a sixth of a proxied request's instructions.
#[derive(Debug, Default)]
pub(crate) struct Fields {
    /// The fields as spans of the head.
    spans: Spans,
    /// The length the backend stated (one value however many lines carried it), unless
    /// `Transfer-Encoding` overrides it.
    pub(crate) length: Option<u64>,
    /// Whether the backend sent a `Date`.
    pub(crate) has_date: bool,
    /// Where the value of each field fulcrum keeps for itself is in the head (offset,
    /// length; length 0: none; `backend::observe`), left out of the fields.
    pub(crate) observed: [(u32, u32); observe::COUNT],
}

impl Fields {
    /// The fields `spans` of a head, with the length it stated and whether it had a
    /// `Date`.
    pub(crate) fn new(spans: Spans, length: Option<u64>, has_date: bool) -> Fields {
        Fields {
            spans,
            length,
            has_date,
            observed: [(0, 0); observe::COUNT],
        }
    }

    /// Whether the backend sent any field fulcrum keeps for itself.
    #[inline]
    pub(crate) fn has_observed(&self) -> bool {
        self.observed.iter().any(|&(_, len)| len != 0)
    }

    /// Each field fulcrum keeps for itself that the backend sent: which
    /// (`backend::observe::which`), and its value.
    pub(crate) fn observed(&self) -> impl Iterator<Item = (usize, &[u8])> {
        let at = |&(at, len): &(u32, u32)| self.spans.bytes(at as usize, len as usize);
        (self.observed.iter().enumerate())
            .filter(|(_, &(_, len))| len != 0)
            .map(move |(i, span)| (i, at(span)))
    }

    /// Name (as the backend spelled it) and value of each field, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.spans.iter()
    }

    /// The value of the first field named `name` (lower case); `Content-Length` is
    /// [`Self::length`].
    pub(crate) fn value(&self, name: &[u8]) -> Option<HeaderValue> {
        self.spans.value(name)
    }

    /// The fields as a header map (values still slices of the head), with one
    /// `Content-Length` line when there is a length, and room for the two fields a
    /// front end may add (`X-Request-Id`, `Date`) without the map growing.
    pub(crate) fn into_map(self) -> HeaderMap {
        let mut map = self.spans.to_map(3);
        if let Some(n) = self.length {
            map.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        map
    }
}

/// `Alt-Svc: h3=":PORT"; ma=86400`, set once at start when HTTP/3 is on.
static ALT_SVC: std::sync::OnceLock<HeaderValue> = std::sync::OnceLock::new();

/// Says HTTP/3 is served on `port` in every answer over TLS from now on.
pub(crate) fn advertise_h3(port: u16) {
    let value = format!("h3=\":{port}\"; ma=86400");
    if let Ok(v) = HeaderValue::from_str(&value) {
        let _ = ALT_SVC.set(v);
    }
}

/// The `Alt-Svc` value of answers over TLS, when HTTP/3 is on.
pub(crate) fn alt_svc() -> Option<&'static HeaderValue> {
    ALT_SVC.get()
}

/// The client a request came from.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    /// The connection's remote address.
    pub(crate) addr: SocketAddr,
    /// Its `headers::forwarded_value`, computed once per connection.
    pub(crate) forwarded: HeaderValue,
    /// It came over the HTTPS listener.
    pub(crate) tls: bool,
    /// The address it reached (the listener's), for a PROXY header to a backend.
    pub(crate) local: SocketAddr,
    /// Its TCP socket, whose send queue tells a client's progress (`liveness::unsent`);
    /// `-1` for none (QUIC).
    pub(crate) socket: i32,
    /// The client certificate its handshake verified (`[tls.client_auth]`), if any.
    pub(crate) client_cert: Option<std::sync::Arc<crate::identity::ClientCert>>,
}

impl Peer {
    /// The client at `addr` of a connection that reached `local`; `socket` is its TCP
    /// socket (`-1` for QUIC).
    pub(crate) fn new(addr: SocketAddr, local: SocketAddr, tls: bool, socket: i32) -> Peer {
        Peer {
            addr,
            forwarded: super::headers::forwarded_value(addr.ip()),
            tls,
            local,
            socket,
            client_cert: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_fields_are_written_whole() {
        let mut out = Vec::new();
        let f = RateLimitFields {
            lead: crate::rate_limit::fields_lead(4_000_000_000),
            limit: 4_000_000_000,
            remaining: 0,
            reset: 17,
        };
        f.write(&mut out);
        assert_eq!(
            out,
            b"ratelimit-limit: 4000000000\r\nratelimit-remaining: 0\r\nratelimit-reset: 17\r\n"
        );
        for n in [
            1,
            9,
            10,
            99,
            100,
            101,
            999,
            1000,
            65_535,
            123_456_789,
            u32::MAX,
        ] {
            let mut out = Vec::new();
            let f = RateLimitFields {
                lead: crate::rate_limit::fields_lead(n),
                limit: n,
                remaining: n / 3,
                reset: n % 97,
            };
            f.write(&mut out);
            let want = format!(
                "ratelimit-limit: {n}\r\nratelimit-remaining: {}\r\nratelimit-reset: {}\r\n",
                n / 3,
                n % 97
            );
            assert_eq!(String::from_utf8(out).unwrap(), want);
        }
    }
    use bytes::Bytes;

    fn spans_head(text: &'static str) -> RequestHead {
        let head = Bytes::from_static(text.as_bytes());
        let mut spans = Vec::new();
        let mut at = 0u32;
        for line in text.split_inclusive("\r\n") {
            if let Some((n, v)) = line.trim_end().split_once(": ") {
                let vs = at + n.len() as u32 + 2;
                spans.push((at, n.len() as u32, vs, v.len() as u32));
            }
            at += line.len() as u32;
        }
        RequestHead {
            method: Method::GET,
            uri: Uri::from_static("/a?b"),
            version: Version::HTTP_11,
            fields: RequestFields::Spans(ClientFields::new(Spans::new(head, spans))),
        }
    }

    #[test]
    fn both_forms_read_the_same_fields_and_size() {
        let mut head = spans_head("Host: h.example\r\nX-A: 1\r\nx-a: 2\r\n");
        let host = head.host();
        let xa = head.field(&HeaderName::from_static("x-a"));
        let size = head.size();
        assert_eq!(host.as_ref().map(|h| h.as_bytes()), Some(&b"h.example"[..]));
        assert_eq!(xa.as_ref().map(|v| v.as_bytes()), Some(&b"1"[..]));
        assert_eq!(size, "GET /a?b HTTP/1.1\r\n".len() + 17 + 8 + 8);
        head.make_map();
        assert!(matches!(head.fields, RequestFields::Map(_)));
        assert_eq!(head.host(), host);
        assert_eq!(head.field(&HeaderName::from_static("x-a")), xa);
        assert_eq!(head.size(), size);
    }

    #[test]
    fn an_http2_request_has_its_host_in_the_authority() {
        let head = RequestHead {
            method: Method::GET,
            uri: Uri::from_static("http://a.example:8080/x"),
            version: Version::HTTP_2,
            fields: RequestFields::Map(HeaderMap::new()),
        };
        assert_eq!(head.host().unwrap(), "a.example:8080");
    }
}
