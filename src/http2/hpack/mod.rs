//! Header blocks (RFC 7541, RFC 9113 §8): a client's blocks decoded into a request head
//! (or trailers) with every rule of RFC 9113 §8.2 and §8.3 checked, and answers' heads
//! encoded.
//!
//! Decoding is [`decoder`]'s (why it is not a crate's is said there). Encoding is
//! fulcrum's own too, and small: every field
//! is a literal without indexing, its name taken from the static table when it is
//! there, `:status` indexed for the seven codes the table has. That is HAProxy's choice
//! too: nothing is kept per connection, so an answer's head is written without
//! allocating, and the client's `SETTINGS_HEADER_TABLE_SIZE` cannot matter (a dynamic
//! table this side never fills needs no size update). What it gives up is measured in
//! `docs/http2.md`, "Answers' heads".

mod decoder;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Uri};

use crate::proxy::headers::{ClientFields, Spans};
use crate::proxy::hop::is_hop_by_hop;
use crate::proxy::request_id::{is_request_id, X_REQUEST_ID};
use crate::proxy::{Added, RespBody, ResponseFields, ResponseHead};
use http::header;
use http_body::Body as _;

/// The dynamic table a client's encoder may use (RFC 7541 §4.2; the SETTINGS default).
pub(crate) const TABLE_SIZE: usize = 4096;

/// Why a header block could not be taken.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BlockError {
    /// Not valid HPACK: the connection's tables can no longer agree
    /// (`COMPRESSION_ERROR`, a connection error).
    Compression,
    /// Valid HPACK, but not a valid request or trailers (RFC 9113 §8.1.1: a stream
    /// error `PROTOCOL_ERROR`).
    Malformed(&'static str),
    /// A header list longer than this side takes (answered `431`).
    TooLarge,
}

/// A client's request head as its header block gave it.
#[derive(Debug)]
pub(crate) struct Request {
    /// `:method`.
    pub(crate) method: Method,
    /// The target built from `:scheme`, `:authority` and `:path`.
    pub(crate) uri: Uri,
    /// The regular fields, as spans of one buffer (as the HTTP/1.1 fast path's): the
    /// `cookie` fields joined into one (RFC 9113 §8.2.3), and `host` from `:authority`
    /// when the client sent none, as HTTP/1.1 backends need it.
    pub(crate) fields: ClientFields,
    /// `Content-Length`, when stated.
    pub(crate) length: Option<u64>,
    /// An extended CONNECT (RFC 8441's `:protocol`), answered `501`.
    pub(crate) extended_connect: bool,
}

/// Where a field's bytes are in the buffer being filled: offset and length.
type Span = (u32, u32);

/// A request's fields as they are decoded: one buffer, a span for each.
#[derive(Default)]
struct Collect {
    buf: Vec<u8>,
    spans: Vec<(u32, u32, u32, u32)>,
    method: Option<Span>,
    scheme: Option<Span>,
    authority: Option<Span>,
    path: Option<Span>,
    protocol: bool,
    host: Option<Span>,
    length: Option<u64>,
    cookie: Vec<u8>,
}

impl Collect {
    /// Copies `bytes` into the buffer.
    fn keep(&mut self, bytes: &[u8]) -> Span {
        let at = self.buf.len() as u32;
        self.buf.extend_from_slice(bytes);
        (at, bytes.len() as u32)
    }

    fn bytes(&self, span: Span) -> &[u8] {
        &self.buf[span.0 as usize..(span.0 + span.1) as usize]
    }

    /// Takes one field (or pseudo-field) as decoded.
    fn field(&mut self, name: &[u8], value: &[u8]) -> Result<(), &'static str> {
        match name.strip_prefix(b":") {
            Some(p) if self.spans.is_empty() && self.cookie.is_empty() => self.pseudo(p, value),
            Some(_) => Err("a pseudo-field after a regular field"),
            None => self.regular(name, value),
        }
    }

    /// Takes one pseudo-field (`name` without its colon).
    fn pseudo(&mut self, name: &[u8], value: &[u8]) -> Result<(), &'static str> {
        if name == b"protocol" && !self.protocol {
            self.protocol = true;
            return Ok(());
        }
        let taken = match name {
            b"method" => self.method.is_some(),
            b"scheme" => self.scheme.is_some(),
            b"authority" => self.authority.is_some(),
            b"path" => self.path.is_some(),
            _ => return Err("an unknown or repeated pseudo-field"),
        };
        if taken {
            return Err("a repeated pseudo-field");
        }
        let span = Some(self.keep(value));
        match name {
            b"method" => self.method = span,
            b"scheme" => self.scheme = span,
            b"authority" => self.authority = span,
            _ => self.path = span,
        }
        Ok(())
    }

    /// Takes one regular field.
    fn regular(&mut self, name: &[u8], value: &[u8]) -> Result<(), &'static str> {
        check_regular(name, value)?;
        match name {
            b"cookie" => {
                if !self.cookie.is_empty() {
                    self.cookie.extend_from_slice(b"; ");
                }
                self.cookie.extend_from_slice(value);
                return Ok(());
            }
            b"content-length" => {
                // Digits only: `parse` would take a `+` the backend may read otherwise.
                let digits =
                    (1..=19).contains(&value.len()) && value.iter().all(u8::is_ascii_digit);
                let n = (std::str::from_utf8(value).ok())
                    .filter(|_| digits)
                    .and_then(|v| v.parse().ok());
                match (n, self.length) {
                    (None, _) => return Err("an invalid content-length"),
                    (Some(n), Some(m)) if n != m => return Err("content-lengths that differ"),
                    (n, _) => self.length = n,
                }
            }
            _ => {}
        }
        let (ns, nl) = self.keep(name);
        let (vs, vl) = self.keep(value);
        if name == b"host" && self.host.is_none() {
            self.host = Some((vs, vl));
        }
        self.spans.push((ns, nl, vs, vl));
        Ok(())
    }

    /// The request these fields make.
    fn finish(mut self) -> Result<Request, BlockError> {
        let malformed = BlockError::Malformed;
        let (method, target) = self.target()?;
        match (self.authority, self.host) {
            (Some(a), Some(h)) if !self.bytes(a).eq_ignore_ascii_case(self.bytes(h)) => {
                return Err(malformed("a Host other than :authority"))
            }
            (Some(a), None) => {
                let (ns, nl) = self.keep(b"host");
                let vs = self.buf.len() as u32;
                (self.buf).extend_from_within(a.0 as usize..(a.0 + a.1) as usize);
                self.spans.push((ns, nl, vs, a.1));
            }
            _ => {}
        }
        if !self.cookie.is_empty() {
            let cookie = std::mem::take(&mut self.cookie);
            let (ns, nl) = self.keep(b"cookie");
            let (vs, vl) = self.keep(&cookie);
            self.spans.push((ns, nl, vs, vl));
        }
        let buf = Bytes::from(self.buf);
        let uri = target.uri(&buf)?;
        let fields = ClientFields::new(Spans::new(buf, self.spans));
        Ok(Request {
            method,
            uri,
            fields,
            length: self.length,
            extended_connect: self.protocol,
        })
    }

    /// The method and target of the pseudo-fields (RFC 9113 §8.3.1): `:method`,
    /// `:scheme` and a non-empty `:path` for every method but CONNECT, which has only an
    /// `:authority` (or, extended, all four and `:protocol`).
    fn target(&self) -> Result<(Method, Target), BlockError> {
        let malformed = BlockError::Malformed;
        let method = self.method.ok_or(malformed("no :method"))?;
        let method =
            Method::from_bytes(self.bytes(method)).map_err(|_| malformed("an invalid :method"))?;
        if method == Method::CONNECT && !self.protocol {
            if self.scheme.is_some() || self.path.is_some() {
                return Err(malformed("CONNECT with :scheme or :path"));
            }
            let authority = self
                .authority
                .ok_or(malformed("CONNECT without :authority"))?;
            return Ok((method, Target::Authority(authority)));
        }
        if self.protocol && method != Method::CONNECT {
            return Err(malformed(":protocol on a method other than CONNECT"));
        }
        let scheme = self.scheme.ok_or(malformed("no :scheme"))?;
        let path = self.path.filter(|p| p.1 > 0).ok_or(malformed("no :path"))?;
        let (authority, scheme) = match self.authority {
            Some(a) => (Some(a), Some(scheme_of(self.bytes(scheme))?)),
            None => (None, None),
        };
        Ok((method, Target::Origin(scheme, authority, path)))
    }
}

/// A request's target as its pseudo-fields give it, before it is a [`Uri`].
enum Target {
    /// CONNECT's `:authority`.
    Authority(Span),
    /// `:scheme` (kept with an `:authority` only), `:authority` and `:path`.
    Origin(Option<http::uri::Scheme>, Option<Span>, Span),
}

impl Target {
    /// The target as a [`Uri`] whose authority and path are slices of `buf`, the
    /// block's own buffer, rather than copies: `http`'s builder copied each into an
    /// allocation of its own, and its steps moved the parts through one `Result` after
    /// another (about 500 instructions a request; `docs/performance.md`, "The target
    /// shared with its block").
    fn uri(self, buf: &Bytes) -> Result<Uri, BlockError> {
        let slice = |(at, len): Span| buf.slice(at as usize..(at + len) as usize);
        match self {
            Target::Authority(a) => Uri::from_maybe_shared(slice(a))
                .map_err(|_| BlockError::Malformed("an invalid :authority")),
            Target::Origin(scheme, authority, path) => {
                let mut parts = http::uri::Parts::default();
                parts.scheme = scheme;
                if let Some(a) = authority {
                    let a = http::uri::Authority::from_maybe_shared(slice(a)).map_err(invalid)?;
                    parts.authority = Some(a);
                }
                let path = http::uri::PathAndQuery::from_maybe_shared(slice(path));
                parts.path_and_query = Some(path.map_err(invalid)?);
                Uri::from_parts(parts).map_err(invalid)
            }
        }
    }
}

/// `:scheme`'s value: `http` and `https` without a parse.
fn scheme_of(s: &[u8]) -> Result<http::uri::Scheme, BlockError> {
    match s {
        b"http" => Ok(http::uri::Scheme::HTTP),
        b"https" => Ok(http::uri::Scheme::HTTPS),
        _ => http::uri::Scheme::try_from(s).map_err(invalid),
    }
}

/// A target that is not a URI's.
fn invalid<E>(_: E) -> BlockError {
    BlockError::Malformed("an invalid :scheme, :authority or :path")
}

/// The decoder of a connection's header blocks.
pub(crate) struct Decoder {
    inner: decoder::Decoder,
    /// The longest header list taken (names, values and 32 bytes a field, RFC 9113
    /// §6.5.2).
    max_list: usize,
}

impl Decoder {
    /// A decoder taking header lists up to `max_list` bytes.
    pub(crate) fn new(max_list: usize) -> Decoder {
        Decoder {
            inner: decoder::Decoder::new(TABLE_SIZE),
            max_list,
        }
    }

    /// Decodes `block` whole, whatever is wrong with the fields in it (the dynamic
    /// table must follow the client's), handing each field to `take` until one is
    /// refused or the list grows past `max_list`.
    fn decode(
        &mut self,
        block: &[u8],
        mut take: impl FnMut(&[u8], &[u8]) -> Result<(), BlockError>,
    ) -> Result<(), BlockError> {
        let mut wrong: Option<BlockError> = None;
        let mut size = 0usize;
        let max_list = self.max_list;
        let decoded = self.inner.decode(block, |name, value| {
            size += name.len() + value.len() + 32;
            if wrong.is_none() {
                wrong = match size > max_list {
                    true => Some(BlockError::TooLarge),
                    false => take(name, value).err(),
                };
            }
            // Far past the limit (one-byte references to large table entries): not
            // worth decoding on; the connection ends.
            size <= 4 * max_list
        });
        decoded.map_err(|_| BlockError::Compression)?;
        wrong.map_or(Ok(()), Err)
    }

    /// A request's header block.
    pub(crate) fn request(&mut self, block: &[u8]) -> Result<Request, BlockError> {
        let mut fields = Collect::default();
        // Room for what a typical block decodes to, without growing.
        fields.buf.reserve(256 + block.len() * 2);
        fields.spans.reserve(8);
        self.decode(block, |name, value| {
            fields.field(name, value).map_err(BlockError::Malformed)
        })?;
        fields.finish()
    }

    /// A trailers block (RFC 9113 §8.1): regular fields only. Trailers too large are a
    /// broken request: the stream is reset.
    pub(crate) fn trailers(&mut self, block: &[u8]) -> Result<HeaderMap, BlockError> {
        let mut fields = HeaderMap::new();
        let decoded = self.decode(block, |name, value| match name.starts_with(b":") {
            true => Err(BlockError::Malformed("a pseudo-field in trailers")),
            false => regular_field(&mut fields, name, value).map_err(BlockError::Malformed),
        });
        match decoded {
            Err(BlockError::TooLarge) => Err(BlockError::Malformed("trailers too large")),
            Err(e) => Err(e),
            Ok(()) => Ok(fields),
        }
    }
}

/// The fields HTTP/2 forbids (RFC 9113 §8.2.2): they belong to one HTTP/1.1
/// connection.
fn connection_specific(name: &[u8]) -> bool {
    matches!(
        name,
        b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding" | b"upgrade"
    )
}

/// Checks one regular field: its name lower case and a token, its value without the
/// characters RFC 9113 §8.2.1 forbids, nor any other control character (as `http`'s
/// `HeaderValue`).
fn check_regular(name: &[u8], value: &[u8]) -> Result<(), &'static str> {
    if name.is_empty() || !name.iter().all(|&c| LOWER_TOKEN[c as usize]) {
        return Err("a field name that is not a lower-case token");
    }
    if connection_specific(name) {
        return Err("a connection-specific field");
    }
    if name == b"te" && value != b"trailers" {
        return Err("TE other than trailers");
    }
    let edge = |c: Option<&u8>| matches!(c, Some(b' ' | b'\t'));
    if edge(value.first()) || edge(value.last()) {
        return Err("a field value with white space at an end");
    }
    if has_control(value) {
        return Err("a control character in a field value");
    }
    Ok(())
}

/// Whether `value` holds a control character other than tab, or DEL: eight bytes at a
/// time, a word's bytes below 0x20 and equal to 0x7f found by the borrow of a
/// subtraction (a word with a tab is looked at byte by byte). A byte at a time, this was
/// the largest part of a request's field checks (`docs/performance.md`, "Huffman by the
/// byte").
fn has_control(value: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let control = |c: &u8| (*c < b' ' && *c != b'\t') || *c == 0x7f;
    let mut words = value.chunks_exact(8);
    for word in &mut words {
        let x = word.try_into().map_or(0, u64::from_ne_bytes);
        // A byte below 0x20 borrows from its high bit (`x - 0x20…` where the byte's own
        // high bit is clear); a byte of 0x7f is zero after `^ 0x7f…`.
        let below = x.wrapping_sub(ONES * 0x20) & !x & HIGH;
        let del = (x ^ (ONES * 0x7f)).wrapping_sub(ONES) & !(x ^ (ONES * 0x7f)) & HIGH;
        if below | del != 0 && word.iter().any(control) {
            return true;
        }
    }
    words.remainder().iter().any(control)
}

/// Takes one regular field into a header map (trailers).
fn regular_field(fields: &mut HeaderMap, name: &[u8], value: &[u8]) -> Result<(), &'static str> {
    check_regular(name, value)?;
    let name = HeaderName::from_bytes(name).map_err(|_| "an invalid field name")?;
    let value = HeaderValue::from_bytes(value).map_err(|_| "an invalid field value")?;
    fields.append(name, value);
    Ok(())
}

/// A character of a field name as HTTP/2 carries it: a token character (RFC 9110
/// §5.6.2) that is not upper case.
const fn is_lower_token(c: u8) -> bool {
    matches!(c,
        b'a'..=b'z' | b'0'..=b'9' | b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*'
        | b'+' | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~')
}

/// [`is_lower_token`] by byte: one load a character.
static LOWER_TOKEN: [bool; 256] = {
    let mut table = [false; 256];
    let mut c = 0;
    while c < 256 {
        table[c] = is_lower_token(c as u8);
        c += 1;
    }
    table
};

/// What a new connection's decoder makes of `block`: every field, or `None` when it is
/// not valid HPACK.
#[cfg(any(fuzzing, test))]
pub(crate) fn decoded(block: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut list = Vec::new();
    let mut d = decoder::Decoder::new(TABLE_SIZE);
    d.decode(block, |n, v| {
        list.push((n.to_vec(), v.to_vec()));
        true
    })
    .ok()?;
    Some(list)
}

/// The static table's index of `name`'s first entry (RFC 7541 Appendix A), for the
/// fields an answer may carry.
fn static_name(name: &str) -> Option<u8> {
    Some(match name {
        "accept-charset" => 15,
        "accept-encoding" => 16,
        "accept-language" => 17,
        "accept-ranges" => 18,
        "accept" => 19,
        "access-control-allow-origin" => 20,
        "age" => 21,
        "allow" => 22,
        "authorization" => 23,
        "cache-control" => 24,
        "content-disposition" => 25,
        "content-encoding" => 26,
        "content-language" => 27,
        "content-length" => 28,
        "content-location" => 29,
        "content-range" => 30,
        "content-type" => 31,
        "cookie" => 32,
        "date" => 33,
        "etag" => 34,
        "expect" => 35,
        "expires" => 36,
        "from" => 37,
        "host" => 38,
        "if-match" => 39,
        "if-modified-since" => 40,
        "if-none-match" => 41,
        "if-range" => 42,
        "if-unmodified-since" => 43,
        "last-modified" => 44,
        "link" => 45,
        "location" => 46,
        "max-forwards" => 47,
        "proxy-authenticate" => 48,
        "proxy-authorization" => 49,
        "range" => 50,
        "referer" => 51,
        "refresh" => 52,
        "retry-after" => 53,
        "server" => 54,
        "set-cookie" => 55,
        "strict-transport-security" => 56,
        "transfer-encoding" => 57,
        "user-agent" => 58,
        "vary" => 59,
        "via" => 60,
        "www-authenticate" => 61,
        _ => return None,
    })
}

/// Writes `value` as an HPACK integer with a `prefix`-bit prefix, the bits above it
/// from `first` (RFC 7541 §5.1).
fn integer(out: &mut Vec<u8>, first: u8, prefix: u8, mut value: usize) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// Writes a string literal, without Huffman coding (RFC 7541 §5.2).
fn string(out: &mut Vec<u8>, s: &[u8]) {
    integer(out, 0, 7, s.len());
    out.extend_from_slice(s);
}

/// Writes one field as a literal without indexing (RFC 7541 §6.2.2).
fn field(out: &mut Vec<u8>, name: &HeaderName, value: &[u8]) {
    match static_name(name.as_str()) {
        Some(i) => integer(out, 0, 4, i as usize),
        None => {
            out.push(0);
            string(out, name.as_str().as_bytes());
        }
    }
    string(out, value);
}

/// Writes one field whose name may not be lower case (a backend's head as it spelled
/// it): lower-cased on the way, as HTTP/2 requires.
fn field_spelled(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    let mut lower = [0u8; 32];
    let index = match lower.get_mut(..name.len()) {
        Some(l) => {
            for (to, from) in l.iter_mut().zip(name) {
                *to = from.to_ascii_lowercase();
            }
            std::str::from_utf8(l).ok().and_then(static_name)
        }
        None => None,
    };
    match index {
        Some(i) => integer(out, 0, 4, i as usize),
        None => {
            out.push(0);
            integer(out, 0, 7, name.len());
            out.extend(name.iter().map(u8::to_ascii_lowercase));
        }
    }
    string(out, value);
}

/// Encodes the head of an answer the request path gave: `:status`, the backend's fields
/// (names lower-cased; no hop-by-hop field, no `X-Request-Id` of the backend's), the
/// fields this hop adds (`ResponseHead::finish`), and a `Content-Length` when the body's
/// length is known and none is stated — what `ProxyResponse::into_http` and
/// `fit_head` make of it, without a header map.
pub(crate) fn encode_head(out: &mut Vec<u8>, head: &ResponseHead, body: &RespBody) {
    status(out, head.status);
    let (has_date, stated) = match &head.fields {
        ResponseFields::Wire(f) => {
            for (name, value) in f.iter() {
                if !is_request_id(name) {
                    field_spelled(out, name, value);
                }
            }
            // No length on 1xx and 204 (RFC 9110 §8.6), as the HTTP/1.1 writer.
            let bodiless = head.status.is_informational() || head.status == StatusCode::NO_CONTENT;
            if let (Some(n), false) = (f.length, bodiless) {
                integer(out, 0, 4, 28);
                string(out, itoa::Buffer::new().format(n).as_bytes());
            }
            (f.has_date, f.length.is_some())
        }
        ResponseFields::Map(m) => {
            for (name, value) in m {
                if !is_hop_by_hop(name.as_str().as_bytes()) && name != X_REQUEST_ID {
                    field(out, name, value.as_bytes());
                }
            }
            (
                m.contains_key(header::DATE),
                m.contains_key(header::CONTENT_LENGTH),
            )
        }
    };
    head.finish(has_date, |added| match added {
        Added::Date(v) => field(out, &header::DATE, v.as_bytes()),
        Added::AltSvc(v) => field(out, &header::ALT_SVC, v.as_bytes()),
        Added::RequestId(id) => field(out, &X_REQUEST_ID, id.as_bytes()),
        Added::RateLimit(rl) => {
            for (name, v) in rl.fields() {
                out.push(0);
                string(out, name.as_bytes());
                string(out, itoa::Buffer::new().format(v).as_bytes());
            }
        }
    });
    if let (false, Some(n), false) = (stated, body.size_hint().exact(), body.is_end_stream()) {
        integer(out, 0, 4, 28);
        string(out, itoa::Buffer::new().format(n).as_bytes());
    }
}

/// Writes `:status`, indexed for the seven codes the static table has.
fn status(out: &mut Vec<u8>, status: StatusCode) {
    let indexed = match status.as_u16() {
        200 => 8,
        204 => 9,
        206 => 10,
        304 => 11,
        400 => 12,
        404 => 13,
        500 => 14,
        _ => 0,
    };
    if indexed != 0 {
        out.push(0x80 | indexed);
    } else {
        integer(out, 0, 4, 8);
        string(out, status.as_str().as_bytes());
    }
}

/// Encodes an answer's head: `:status`, then `fields` (which carry no hop-by-hop field).
pub(crate) fn encode_answer(out: &mut Vec<u8>, status: StatusCode, fields: &HeaderMap) {
    self::status(out, status);
    encode_fields(out, fields);
}

/// Encodes trailers, or any list of regular fields.
pub(crate) fn encode_fields(out: &mut Vec<u8>, fields: &HeaderMap) {
    for (name, value) in fields {
        field(out, name, value.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn control_characters_are_found_eight_at_a_time(
            value in proptest::collection::vec(proptest::prop_oneof![
                proptest::sample::select(vec![0u8, 9, 10, 31, 32, 65, 126, 127, 128, 200, 255]),
                proptest::num::u8::ANY,
            ], 0..40),
        ) {
            let byte_by_byte = value.iter().any(|&c| (c < b' ' && c != b'\t') || c == 0x7f);
            proptest::prop_assert_eq!(has_control(&value), byte_by_byte);
        }

        #[test]
        fn lower_tokens_by_table(c in proptest::num::u8::ANY) {
            proptest::prop_assert_eq!(LOWER_TOKEN[c as usize], is_lower_token(c));
        }
    }

    /// What `loona-hpack` (the decoder clients in tests use too) reads back.
    fn decoded(block: &[u8]) -> Vec<(String, String)> {
        let mut d = loona_hpack::Decoder::new();
        let list = d.decode(block).unwrap();
        list.into_iter()
            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
            .collect()
    }

    fn block(fields: &[(&str, &str)]) -> Vec<u8> {
        let mut e = loona_hpack::Encoder::new();
        let list: Vec<(&[u8], &[u8])> = fields
            .iter()
            .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
            .collect();
        e.encode(list)
    }

    #[test]
    fn an_answer_reads_back_as_encoded() {
        let mut fields = HeaderMap::new();
        fields.insert("content-type", HeaderValue::from_static("text/plain"));
        fields.insert("x-long-name-of-a-field", HeaderValue::from_static("v"));
        fields.append("set-cookie", HeaderValue::from_static("a=1"));
        fields.append("set-cookie", HeaderValue::from_static("b=2"));
        let long = "x".repeat(300);
        fields.insert("etag", HeaderValue::from_str(&long).unwrap());
        for (status, first) in [(200, Some(0x88)), (503, None), (404, Some(0x8d))] {
            let mut out = Vec::new();
            encode_answer(&mut out, StatusCode::from_u16(status).unwrap(), &fields);
            if let Some(b) = first {
                assert_eq!(out[0], b);
            }
            let list = decoded(&out);
            assert_eq!(list[0], (":status".into(), status.to_string()));
            let names: Vec<&str> = list.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(
                names,
                [
                    ":status",
                    "content-type",
                    "x-long-name-of-a-field",
                    "set-cookie",
                    "set-cookie",
                    "etag"
                ]
            );
            assert_eq!(list[5].1, long);
        }
    }

    #[test]
    fn a_request_block_becomes_a_head() {
        let mut d = Decoder::new(64 * 1024);
        let b = block(&[
            (":method", "POST"),
            (":scheme", "https"),
            (":authority", "a.test:8443"),
            (":path", "/up?x=1"),
            ("cookie", "a=1"),
            ("cookie", "b=2"),
            ("te", "trailers"),
        ]);
        let r = d.request(&b).unwrap();
        assert_eq!(r.method, Method::POST);
        assert_eq!(r.uri, "https://a.test:8443/up?x=1");
        // One cookie field, joined; a host from :authority.
        let fields: Vec<(&[u8], &[u8])> = r.fields.iter().collect();
        assert_eq!(
            fields,
            [
                (&b"te"[..], &b"trailers"[..]),
                (b"host", b"a.test:8443"),
                (b"cookie", b"a=1; b=2"),
            ]
        );
        assert!(!r.extended_connect);
        let cl = block(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/"),
            ("content-length", "12"),
        ]);
        assert_eq!(d.request(&cl).unwrap().length, Some(12));
        let bad = block(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/"),
            ("content-length", "x"),
        ]);
        assert!(matches!(d.request(&bad), Err(BlockError::Malformed(_))));
    }

    #[test]
    fn malformed_requests_are_told_apart_from_broken_blocks() {
        let mut d = Decoder::new(64 * 1024);
        let base = [(":method", "GET"), (":scheme", "http"), (":path", "/")];
        for extra in [
            ("Upper", "x"),
            ("connection", "close"),
            ("te", "gzip"),
            ("x", " padded"),
            (":status", "200"),
            (":path", "/again"),
            ("bad:name", "x"),
        ] {
            let mut list = base.to_vec();
            list.push(extra);
            assert!(
                matches!(d.request(&block(&list)), Err(BlockError::Malformed(_))),
                "{extra:?}"
            );
        }
        let late = block(&[
            ("x", "1"),
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
        ]);
        assert!(matches!(d.request(&late), Err(BlockError::Malformed(_))));
        let empty = block(&[(":method", "GET"), (":scheme", "http"), (":path", "")]);
        assert!(matches!(d.request(&empty), Err(BlockError::Malformed(_))));
        // An index beyond both tables.
        assert_eq!(
            d.request(&[0xff, 0x7f]).unwrap_err(),
            BlockError::Compression
        );
        // Still usable: the broken field was never added.
        assert!(d.request(&block(&base)).is_ok());
    }

    #[test]
    fn connect_and_extended_connect_are_read() {
        let mut d = Decoder::new(64 * 1024);
        let c = block(&[(":method", "CONNECT"), (":authority", "db.test:5432")]);
        let r = d.request(&c).unwrap();
        assert_eq!(r.uri.authority().map(|a| a.as_str()), Some("db.test:5432"));
        let ws = block(&[
            (":method", "CONNECT"),
            (":protocol", "websocket"),
            (":scheme", "https"),
            (":authority", "a"),
            (":path", "/chat"),
        ]);
        assert!(d.request(&ws).unwrap().extended_connect);
        let bad = block(&[(":method", "CONNECT"), (":authority", "a"), (":path", "/")]);
        assert!(matches!(d.request(&bad), Err(BlockError::Malformed(_))));
    }

    #[test]
    fn a_header_list_over_the_limit_is_too_large_and_trailers_take_no_pseudo_field() {
        let mut d = Decoder::new(200);
        let long = "v".repeat(300);
        let b = block(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            ("x", &long),
        ]);
        assert_eq!(d.request(&b).unwrap_err(), BlockError::TooLarge);
        // Four times over: not decoded on, the connection's end.
        let mut d = Decoder::new(200);
        let huge = "v".repeat(1000);
        let b = block(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            ("x", &huge),
        ]);
        assert_eq!(d.request(&b).unwrap_err(), BlockError::Compression);
        let t = block(&[("grpc-status", "0")]);
        assert_eq!(d.trailers(&t).unwrap()["grpc-status"], "0");
        let p = block(&[(":path", "/")]);
        assert!(matches!(d.trailers(&p), Err(BlockError::Malformed(_))));
    }
}
