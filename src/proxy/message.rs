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

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Uri, Version};

use super::headers::{ClientFields, Spans};

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
                if self.version != Version::HTTP_2 && self.uri.authority().is_some() =>
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
}

/// `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` of an answer on a
/// rate-limited route (`docs/policies.md`, "Rate limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateLimitFields {
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

    /// Writes the three fields as an HTTP/1.1 head holds them, after one reservation
    /// (every answer on a limited route carries them).
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut b = itoa::Buffer::new();
        out.reserve(80);
        out.extend_from_slice(b"ratelimit-limit: ");
        out.extend_from_slice(b.format(self.limit).as_bytes());
        out.extend_from_slice(b"\r\nratelimit-remaining: ");
        out.extend_from_slice(b.format(self.remaining).as_bytes());
        out.extend_from_slice(b"\r\nratelimit-reset: ");
        out.extend_from_slice(b.format(self.reset).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

impl ResponseHead {
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
}

impl Fields {
    /// The fields `spans` of a head, with the length it stated and whether it had a
    /// `Date`.
    pub(crate) fn new(spans: Spans, length: Option<u64>, has_date: bool) -> Fields {
        Fields {
            spans,
            length,
            has_date,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_fields_are_written_whole() {
        let mut out = Vec::new();
        let f = RateLimitFields {
            limit: 4_000_000_000,
            remaining: 0,
            reset: 17,
        };
        f.write(&mut out);
        assert_eq!(
            out,
            b"ratelimit-limit: 4000000000\r\nratelimit-remaining: 0\r\nratelimit-reset: 17\r\n"
        );
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
