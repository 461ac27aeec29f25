//! HTTP/2 from clients (h2c by prior knowledge, and ALPN `h2` over TLS) on a codec of
//! fulcrum's own, server role only: frames ([`frame`]), header blocks ([`hpack`]), the
//! connection's state machine ([`conn`]) and its service ([`serve`]), where each stream
//! is a future polled inside its connection's own task, with no lock and no task per
//! stream. Why it is not the `h2` crate (which stays for backends): the crate's
//! connection took a third of an h2 request's instructions, through header maps, a
//! stream store behind a lock and a queue per frame; see `docs/http2.md`.

mod body;
mod conn;
mod frame;
mod hpack;
mod serve;

pub(crate) use serve::{handshake, serve};

/// An HTTP/2 error code (RFC 9113 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reason(pub(crate) u32);

impl Reason {
    pub(crate) const NO_ERROR: Reason = Reason(0x0);
    pub(crate) const PROTOCOL_ERROR: Reason = Reason(0x1);
    pub(crate) const INTERNAL_ERROR: Reason = Reason(0x2);
    pub(crate) const FLOW_CONTROL_ERROR: Reason = Reason(0x3);
    pub(crate) const STREAM_CLOSED: Reason = Reason(0x5);
    pub(crate) const FRAME_SIZE_ERROR: Reason = Reason(0x6);
    pub(crate) const REFUSED_STREAM: Reason = Reason(0x7);
    pub(crate) const COMPRESSION_ERROR: Reason = Reason(0x9);
    pub(crate) const ENHANCE_YOUR_CALM: Reason = Reason(0xb);
}

/// A protocol error: the connection's (a GOAWAY, then the close) or one stream's (an
/// RST_STREAM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Error {
    /// A connection error.
    Connection(Reason),
    /// A stream error on the stream.
    Stream(u32, Reason),
}

/// The frame parser's fuzz entry: any frame head and payload parse or are refused, and
/// a frame written by this side reads back.
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz_frames(data: &[u8]) {
    let mut rest = data;
    while rest.len() >= frame::HEAD_LEN {
        let mut head = frame::Head::read(rest);
        let body = &rest[frame::HEAD_LEN..];
        head.len = head.len.min(body.len());
        let _ = frame::parse(head, &body[..head.len]);
        rest = &body[head.len..];
    }
    let mut out = Vec::new();
    frame::write_headers(&mut out, 1, data, true, 16);
    let mut at = 0;
    let mut block = Vec::new();
    while at < out.len() {
        let head = frame::Head::read(&out[at..]);
        block.extend_from_slice(&out[at + frame::HEAD_LEN..at + frame::HEAD_LEN + head.len]);
        at += frame::HEAD_LEN + head.len;
    }
    assert_eq!(block, data);
}

/// The header block decoder's fuzz entry: any block decodes or is refused (never a
/// panic), and an answer's fields encoded by this side decode back to themselves.
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz_hpack(data: &[u8]) {
    let mut d = hpack::Decoder::new(crate::proxy::MAX_HEADER_BYTES);
    let (first, second) = data.split_at(data.len() / 2);
    let _ = d.request(first);
    let _ = d.trailers(second);
    let mut fields = http::HeaderMap::new();
    for pair in data.chunks(8) {
        let (n, v) = pair.split_at(pair.len() / 2);
        let name = http::header::HeaderName::from_bytes(n);
        let value = http::HeaderValue::from_bytes(v);
        if let (Ok(n), Ok(v)) = (name, value) {
            fields.append(n, v);
        }
    }
    let mut block = Vec::new();
    hpack::encode_fields(&mut block, &fields);
    let back = hpack_decoded(&block).expect("an encoded block decodes");
    assert_eq!(back.len(), fields.len());
    for ((n, v), (name, value)) in back.iter().zip(fields.iter()) {
        assert_eq!(n.as_slice(), name.as_str().as_bytes());
        assert_eq!(v.as_slice(), value.as_bytes());
    }
}

/// What the HPACK decoder makes of one block on a new connection (`None`: refused), for
/// the fuzz target that checks it against another decoder.
#[cfg(any(fuzzing, test))]
pub(crate) fn hpack_decoded(block: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    hpack::decoded(block)
}

/// A whole connection's fuzz entry: arbitrary bytes after the preface, cut into frames
/// as a client's would be, fed to the state machine (whose answers are given at once);
/// whatever comes, what it writes is whole frames, and it ends with a GOAWAY when it
/// ends with an error.
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz_connection(data: &[u8]) {
    let mut c: conn::Conn<()> = conn::Conn::new(crate::proxy::MAX_HEADER_BYTES);
    let mut rest = data;
    let mut failed = false;
    while rest.len() >= frame::HEAD_LEN && !failed {
        let mut head = frame::Head::read(rest);
        let body = &rest[frame::HEAD_LEN..];
        head.len = head.len.min(body.len());
        match c.receive(head, &body[..head.len]) {
            Ok(Some(incoming)) => {
                c.send_head(incoming.stream, &[0x88], false);
                let n = c.capacity(incoming.stream).min(3);
                c.send_data(incoming.stream, &b"abc"[..n], true);
            }
            Ok(None) => {}
            Err(_) => failed = true,
        }
        c.give_back();
        rest = &body[head.len..];
    }
    let mut at = 0;
    let mut last = 0;
    while at < c.out.len() {
        assert!(c.out.len() - at >= frame::HEAD_LEN, "a frame cut short");
        let head = frame::Head::read(&c.out[at..]);
        last = head.kind;
        at += frame::HEAD_LEN + head.len;
    }
    assert_eq!(at, c.out.len(), "a frame cut short");
    if failed {
        assert_eq!(last, frame::kind::GOAWAY);
    }
}
