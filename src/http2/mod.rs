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
