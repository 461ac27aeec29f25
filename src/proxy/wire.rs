//! HTTP/1.1 exchanges with a backend driven inline, for requests without a body.
//!
//! hyper's client runs each connection as a task of its own and passes every request and
//! response through channels between that task and the caller. Most proxied requests
//! have no body, and for those the caller's task can do the whole exchange itself: it
//! writes the request head with one `send`, parses the response head in place with
//! `httparse`, and the response body is read from the socket by whoever polls it (hyper's
//! server connection, writing to the client). No task, no channel, one buffer per
//! connection. Requests with a body, and upgrades, still go through hyper's client,
//! which sends the upload while it waits for the answer.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::HeaderMap;
use http::{Method, StatusCode, Version};
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::headers::{put_field, Spans};
use super::hop;
use super::message::{Fields, ResponseFields, ResponseHead};
use crate::backend::observe;
use crate::clock::Stamp;
use crate::deadline::Deadline;
use crate::stats::BadAnswer;

/// Largest response head accepted from a backend (hyper's client is held to it too).
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// Most header lines accepted in a response head.
pub(crate) const MAX_HEADERS: usize = 128;
/// Interim (1xx) answers skipped before the final one; more is a broken backend.
const MAX_INTERIM: usize = 8;
/// Bytes asked of the kernel per read.
const READ_CHUNK: usize = 8 * 1024;

thread_local! {
    /// Where a worker's upstream reads land first, to be copied into a buffer of exactly
    /// their size: a connection waiting for its answer holds no buffer at all (as
    /// HAProxy's buffers are taken from a pool only when data comes), and a small answer
    /// costs a small allocation rather than a fresh 8 KiB one.
    static SCRATCH: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0u8; READ_CHUNK].into_boxed_slice());
}

/// An open HTTP/1.1 connection to a backend, with the bytes read and not yet used.
#[derive(Debug)]
pub(crate) struct Wire {
    stream: TcpStream,
    buf: BytesMut,
    /// The backend this connection goes to.
    pub(crate) backend: u64,
    /// Whether it served a request before this one.
    pub(crate) reused: bool,
    /// The current exchange's deadline; one timer for the connection's lifetime.
    deadline: Deadline,
    /// The socket's descriptor, given back with it.
    _fd: crate::descriptors::Descriptor,
}

/// Why an inline exchange produced no response.
#[derive(Debug)]
pub(crate) enum WireError {
    /// The request could not be written: the backend has not seen it.
    Unsent,
    /// The connection was closed or failed before a single byte of the answer came back.
    Silent,
    /// The answer broke off.
    Broken,
    /// The answer's head was refused as unsafe to forward.
    Refused(BadAnswer),
    /// No complete response head by the deadline.
    Timeout,
}

/// How the response body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Exactly this many bytes remain.
    Length(u64),
    /// Chunked transfer coding.
    Chunked(Chunk),
    /// Until the backend closes the connection.
    Close,
}

/// Where a chunked body's decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    /// Inside chunk data, this many bytes left.
    Data(u64),
    /// Expecting the CRLF after chunk data.
    DataEnd,
    /// Reading trailer lines after the last chunk.
    Trailers,
}

impl Wire {
    /// A fresh connection.
    pub(crate) fn new(stream: TcpStream, backend: u64, fd: crate::descriptors::Descriptor) -> Wire {
        Wire {
            stream,
            buf: BytesMut::new(),
            backend,
            reused: false,
            // Moved to each exchange's own deadline before it waits on it.
            deadline: Deadline::new(Stamp::from_ns(0)),
            _fd: fd,
        }
    }

    /// Sends a request head (the request has no body) and reads the response head, both
    /// by `by` ([`WireError::Timeout`] after). `head` is the serialised request;
    /// `method` decides whether a body follows. The body is still to be read:
    /// [`Wire::into_body`]. By reference: the connection stays in the caller's future
    /// instead of being moved into this one and back.
    pub(crate) async fn exchange(
        &mut self,
        head: &[u8],
        method: &Method,
        by: Stamp,
    ) -> Result<Answered, WireError> {
        self.deadline.set(by);
        tokio::select! {
            biased;
            r = self.stream.write_all(head) => {
                if r.is_err() {
                    return Err(WireError::Unsent);
                }
            }
            () = self.deadline.expired() => return Err(WireError::Timeout),
        }
        let mut answered = false;
        let mut interim = 0;
        loop {
            let (head, framing, keep) = loop {
                if !self.buf.is_empty() {
                    match parse_head(&mut self.buf, method) {
                        Ok(Some(p)) => break p,
                        Ok(None) => {}
                        Err(why) => return Err(WireError::Refused(why)),
                    }
                    if self.buf.len() > MAX_HEAD {
                        return Err(WireError::Refused(BadAnswer::HeadTooLarge));
                    }
                }
                let silent = self.buf.is_empty() && !answered;
                let filled = std::future::poll_fn(|cx| {
                    if let Poll::Ready(r) = poll_fill(self, cx) {
                        return Poll::Ready(Some(r));
                    }
                    self.deadline.poll_expired(cx).map(|()| None)
                })
                .await;
                match filled {
                    None => return Err(WireError::Timeout),
                    Some(Ok(0) | Err(_)) if silent => return Err(WireError::Silent),
                    Some(Ok(0) | Err(_)) => return Err(WireError::Broken),
                    Some(Ok(_)) => {}
                }
            };
            // Interim answers (100 Continue, 103 Early Hints) are not forwarded; the
            // final answer follows on the same connection. A 101 was not asked for.
            if head.status.is_informational() {
                interim += 1;
                if head.status == StatusCode::SWITCHING_PROTOCOLS || interim > MAX_INTERIM {
                    return Err(WireError::Refused(BadAnswer::Malformed));
                }
                answered = true;
                continue;
            }
            return Ok(Answered {
                head,
                framing,
                keep,
            });
        }
    }

    /// The body of the answer `exchange` read the head of, read from this connection.
    pub(crate) fn into_body(self, a: Answered) -> (ResponseHead, WireBody) {
        let body = WireBody {
            wire: Some(self),
            framing: a.framing,
            keep: a.keep,
        };
        (a.head, body)
    }

    /// Whether this pooled connection can take a request: the backend has neither closed
    /// it nor sent anything since its last answer was read whole. Nothing watches an idle
    /// connection, but the reactor records any readiness the kernel reports for it; only
    /// when it has recorded some does this look at the socket (one non-blocking read).
    pub(crate) fn is_idle(&self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match self.stream.poll_read_ready(&mut cx) {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            Poll::Ready(Ok(())) => {
                let mut probe = [0u8; 1];
                matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }
}

type Head = (ResponseHead, Framing, bool);

/// A response head an exchange read, with what its body's reading needs.
pub(crate) struct Answered {
    head: ResponseHead,
    framing: Framing,
    keep: bool,
}

/// Parses a response head at the start of `buf` and takes it out of `buf`; `Ok(None)`
/// (and `buf` untouched) when it is incomplete. Its fields stay slices of the head's own
/// bytes ([`Fields`]); hop-by-hop fields are dropped on the way.
fn parse_head(buf: &mut BytesMut, method: &Method) -> Result<Option<Head>, BadAnswer> {
    // Where each line's name and value lie in the head, as offsets.
    let mut spans = [(0u32, 0u32, 0u32, 0u32); MAX_HEADERS];
    let (len, code, http11, count, reason) = {
        let mut lines = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut resp, buf, &mut lines);
        let len = match parsed {
            // A head over the limit is refused however it arrived, whole or in pieces.
            Ok(httparse::Status::Complete(n)) if n > MAX_HEAD => {
                return Err(BadAnswer::HeadTooLarge)
            }
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(BadAnswer::HeadTooLarge),
            Err(_) => return Err(BadAnswer::Malformed),
        };
        let base = buf.as_ptr() as usize;
        // Where a slice of the head starts, checked to lie inside the head.
        let at = |s: &[u8]| {
            (s.as_ptr() as usize)
                .checked_sub(base)
                .filter(|&o| o + s.len() <= len)
                .map(|o| o as u32)
                .ok_or(BadAnswer::Malformed)
        };
        for (span, h) in spans.iter_mut().zip(resp.headers.iter()) {
            *span = (
                at(h.name.as_bytes())?,
                h.name.len() as u32,
                at(h.value)?,
                h.value.len() as u32,
            );
        }
        (
            len,
            resp.code,
            resp.version == Some(1),
            resp.headers.len(),
            // A reason phrase other than the usual one is passed on, as hyper's client did.
            match (
                resp.code.and_then(|c| StatusCode::from_u16(c).ok()),
                resp.reason,
            ) {
                (Some(st), Some(r)) if Some(r) != st.canonical_reason() => {
                    hyper::ext::ReasonPhrase::try_from(r.as_bytes()).ok()
                }
                _ => None,
            },
        )
    };
    let malformed = |()| BadAnswer::Malformed;
    let status = code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or(BadAnswer::Malformed)?;
    let head = buf.split_to(len).freeze();
    let facts = read_fields(&head, &spans[..count], http11).map_err(malformed)?;
    let (framing, length, close) = framing(method, status, &facts, http11).map_err(malformed)?;
    let mut fields = Fields::new(Spans::new(head, facts.kept), length, facts.has_date);
    fields.observed = facts.observed;
    let head = ResponseHead {
        request_id: None,
        rate_limit: None,
        alt_svc: false,
        status,
        version: if http11 {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        },
        reason,
        fields: ResponseFields::Wire(fields),
    };
    Ok(Some((head, framing, !close)))
}

/// What a response head's fields say, as [`read_fields`] finds it.
struct FieldFacts {
    /// The fields forwarded: neither hop-by-hop nor `Content-Length`.
    kept: Vec<(u32, u32, u32, u32)>,
    /// The stated length (one value, however many lines).
    length: Option<u64>,
    /// A `Transfer-Encoding` was sent; `chunked` when its last coding is chunked.
    coded: bool,
    chunked: bool,
    /// `Connection: close`, or HTTP/1.0 without `keep-alive`.
    close: bool,
    has_date: bool,
    /// Where the value of each field fulcrum keeps for itself is (offset, length;
    /// length 0: none; `backend::observe`): they go no further.
    observed: [(u32, u32); observe::COUNT],
}

/// Reads the fields at `spans` of `head` (name and value offsets and lengths): the
/// framing they state and the ones this hop forwards ([`hop`]'s rules). `Err` for
/// conflicting lengths or a malformed one.
#[inline]
fn read_fields(
    head: &[u8],
    spans: &[(u32, u32, u32, u32)],
    http11: bool,
) -> Result<FieldFacts, ()> {
    let mut f = FieldFacts {
        kept: Vec::with_capacity(spans.len()),
        length: None,
        coded: false,
        chunked: false,
        close: !http11,
        has_date: false,
        observed: [(0, 0); observe::COUNT],
    };
    // Fields that `Connection` names are hop-by-hop too (rare beyond keep-alive/close).
    let mut named = hop::Named::default();
    for &span in spans {
        let (ns, nl, vs, vl) = (
            span.0 as usize,
            span.1 as usize,
            span.2 as usize,
            span.3 as usize,
        );
        let name = &head[ns..ns + nl];
        let raw = &head[vs..vs + vl];
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_length(raw)?;
            if f.length.is_some_and(|l| l != n) {
                return Err(());
            }
            f.length = Some(n);
            continue;
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            f.coded = true;
            // Only a final `chunked` delimits the body; any other coding runs to the close.
            f.chunked = raw
                .rsplit(|&c| c == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if hop::is_connection(name) {
            named.add(raw);
            for token in hop::tokens(raw) {
                match token {
                    hop::Token::Close => f.close = true,
                    hop::Token::KeepAlive if !http11 => f.close = false,
                    hop::Token::KeepAlive | hop::Token::Names(_) => {}
                }
            }
        } else if name.eq_ignore_ascii_case(b"date") {
            f.has_date = true;
        } else if let Some(i) = observe::which(name) {
            f.observed[i] = (span.2, span.3);
            continue;
        } else if name.eq_ignore_ascii_case(b"alt-svc") {
            // A backend's `Alt-Svc` names its own services, never fulcrum's: it goes no
            // further, whatever the protocols (`docs/tls.md`, "HTTP/3").
            continue;
        }
        if !hop::is_hop_by_hop(name) {
            f.kept.push(span);
        }
    }
    if !named.is_empty() {
        let name = |&(ns, nl, _, _): &(u32, u32, u32, u32)| &head[ns as usize..(ns + nl) as usize];
        f.kept.retain(|s| !hop::is_dropped(name(s), &named, false));
        f.has_date = f.kept.iter().any(|s| name(s).eq_ignore_ascii_case(b"date"));
    }
    Ok(f)
}

/// How the body of an answer to `method` with `status` is delimited (RFC 9112 §6.3),
/// the length to state, and whether the connection closes after it. `Err` for framing
/// that cannot be trusted.
#[inline]
fn framing(
    method: &Method,
    status: StatusCode,
    f: &FieldFacts,
    http11: bool,
) -> Result<(Framing, Option<u64>, bool), ()> {
    let mut close = f.close;
    let mut length = f.length;
    let bodiless = *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let framing = if bodiless {
        Framing::Length(0)
    } else if f.coded && !http11 {
        // RFC 9112 §6.1: Transfer-Encoding in an HTTP/1.0 message is faulty framing.
        return Err(());
    } else if f.coded {
        // Transfer-Encoding overrides Content-Length; a message with both is not trusted
        // to leave the connection in a known state.
        if length.is_some() {
            close = true;
            length = None;
        }
        if f.chunked {
            Framing::Chunked(Chunk::Size)
        } else {
            Framing::Close
        }
    } else {
        match length {
            Some(n) => Framing::Length(n),
            None => Framing::Close,
        }
    };
    if framing == Framing::Close {
        close = true;
    }
    Ok((framing, length, close))
}

/// A Content-Length value; a list of one repeated value (`5, 5`) is that value
/// (RFC 9110 §8.6).
fn parse_length(v: &[u8]) -> Result<u64, ()> {
    let mut value = None;
    for part in v.split(|&c| c == b',') {
        let n = parse_digits(part)?;
        if value.is_some_and(|m| m != n) {
            return Err(());
        }
        value = Some(n);
    }
    value.ok_or(())
}

fn parse_digits(v: &[u8]) -> Result<u64, ()> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return Err(());
    }
    Ok(v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// Writes the head of a request without a body into `out`, with a `host` line first
/// when one is given. The client's headers go as they are: a request without
/// `Content-Length` or `Transfer-Encoding` has no body in HTTP/1.1.
pub(crate) fn write_head(
    out: &mut Vec<u8>,
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    host: Option<&str>,
) {
    write_head_with(out, method, target, |out| {
        if let Some(h) = host {
            put_field(out, b"host", h.as_bytes());
        }
        for (k, v) in headers {
            put_field(out, k.as_str().as_bytes(), v.as_bytes());
        }
    });
}

/// The request line of a request without a body, then the header lines `fields`
/// writes, then the blank line.
pub(crate) fn write_head_with(
    out: &mut Vec<u8>,
    method: &Method,
    target: &str,
    fields: impl FnOnce(&mut Vec<u8>),
) {
    out.clear();
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    fields(out);
    out.extend_from_slice(b"\r\n");
}

/// A response body read straight from the backend's socket.
#[derive(Debug)]
pub(crate) struct WireBody {
    wire: Option<Wire>,
    framing: Framing,
    keep: bool,
}

/// What ended a body early.
#[derive(Debug)]
pub(crate) struct BodyBroken;

impl std::fmt::Display for BodyBroken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the backend's response body broke off")
    }
}

impl std::error::Error for BodyBroken {}

impl WireBody {
    /// Whether the body is over (nothing more will come).
    pub(crate) fn is_end_stream(&self) -> bool {
        self.framing == Framing::Length(0)
    }

    /// How much is left, when known.
    pub(crate) fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }

    /// Takes the connection back once the body has been read whole, if it can serve
    /// another request.
    pub(crate) fn take_reusable(&mut self) -> Option<Wire> {
        let clean = self.is_end_stream()
            && self.keep
            && self.wire.as_ref().is_some_and(|w| w.buf.is_empty());
        let mut w = if clean {
            self.wire.take()?
        } else {
            return None;
        };
        w.reused = true;
        // An idle connection keeps no buffer.
        w.buf = BytesMut::new();
        Some(w)
    }

    /// The next piece of the body; `None` at its end.
    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyBroken>>> {
        loop {
            let Some(w) = self.wire.as_mut() else {
                return Poll::Ready(None);
            };
            match self.framing {
                Framing::Length(0) => return Poll::Ready(None),
                Framing::Length(n) => {
                    if !w.buf.is_empty() {
                        let take = w.buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
                        self.framing = Framing::Length(n - take as u64);
                        return Poll::Ready(Some(Ok(Frame::data(w.buf.split_to(take).freeze()))));
                    }
                }
                Framing::Close => {
                    if !w.buf.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(w.buf.split().freeze()))));
                    }
                }
                Framing::Chunked(state) => match step_chunked(&mut w.buf, state) {
                    Ok(Step::Data(b, next)) => {
                        self.framing = Framing::Chunked(next);
                        return Poll::Ready(Some(Ok(Frame::data(b))));
                    }
                    Ok(Step::Moved(next)) => {
                        self.framing = Framing::Chunked(next);
                        continue;
                    }
                    Ok(Step::Done) => {
                        self.framing = Framing::Length(0);
                        return Poll::Ready(None);
                    }
                    Ok(Step::More) => {}
                    Err(()) => return self.broken(),
                },
            }
            // Nothing usable buffered: read more.
            match ready!(poll_fill(w, cx)) {
                Ok(0) if self.framing == Framing::Close => {
                    self.framing = Framing::Length(0);
                    return Poll::Ready(None);
                }
                Ok(0) | Err(_) => return self.broken(),
                Ok(_) => {}
            }
        }
    }

    fn broken(&mut self) -> Poll<Option<Result<Frame<Bytes>, BodyBroken>>> {
        self.wire = None;
        self.framing = Framing::Length(0);
        Poll::Ready(Some(Err(BodyBroken)))
    }
}

/// Reads what the socket has into the connection's buffer (see [`SCRATCH`]).
fn poll_fill(w: &mut Wire, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
    if w.buf.capacity() - w.buf.len() < READ_CHUNK / 2 {
        let through_scratch = SCRATCH.with(|scratch| {
            let Ok(mut scratch) = scratch.try_borrow_mut() else {
                return None;
            };
            let mut rb = ReadBuf::new(&mut scratch[..]);
            Some(match Pin::new(&mut w.stream).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {
                    w.buf.extend_from_slice(rb.filled());
                    Poll::Ready(Ok(rb.filled().len()))
                }
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            })
        });
        if let Some(r) = through_scratch {
            return r;
        }
        w.buf.reserve(READ_CHUNK);
    }
    let spare = w.buf.spare_capacity_mut();
    let mut rb = ReadBuf::uninit(spare);
    ready!(Pin::new(&mut w.stream).poll_read(cx, &mut rb))?;
    let n = rb.filled().len();
    // SAFETY: `poll_read` initialised the first `n` bytes of the spare capacity.
    unsafe { w.buf.advance_mut(n) };
    Poll::Ready(Ok(n))
}

/// One step of the chunked decoder over the bytes buffered so far.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Body bytes, and the state after them.
    Data(Bytes, Chunk),
    /// Framing consumed; go on in this state.
    Moved(Chunk),
    /// The last chunk and its trailers are consumed.
    Done,
    /// More bytes are needed.
    More,
}

/// Longest chunk-size or trailer line accepted.
const MAX_LINE: usize = 8 * 1024;

/// The index just past the next CRLF (or bare LF) in `buf`, if a whole line is there.
fn line_end(buf: &[u8]) -> Result<Option<usize>, ()> {
    match buf.iter().position(|&c| c == b'\n') {
        Some(i) => Ok(Some(i + 1)),
        None if buf.len() > MAX_LINE => Err(()),
        None => Ok(None),
    }
}

fn step_chunked(buf: &mut BytesMut, state: Chunk) -> Result<Step, ()> {
    match state {
        Chunk::Size => {
            let Some(end) = line_end(buf)? else {
                return Ok(Step::More);
            };
            let line = &buf[..end];
            let digits = line.iter().take_while(|c| c.is_ascii_hexdigit()).count();
            if digits == 0 || digits > 15 {
                return Err(());
            }
            // After the size: the line end, or (optional whitespace and) extensions.
            let rest = &line[digits..];
            let ext = rest.trim_ascii_start();
            let ok = matches!(rest, b"\r\n" | b"\n")
                || (ext.first() == Some(&b';') && ext.ends_with(b"\n"));
            if !ok {
                return Err(());
            }
            let size = line[..digits].iter().fold(0u64, |n, &c| {
                n * 16 + u64::from((c as char).to_digit(16).unwrap_or(0))
            });
            buf.advance(end);
            Ok(Step::Moved(if size == 0 {
                Chunk::Trailers
            } else {
                Chunk::Data(size)
            }))
        }
        Chunk::Data(n) => {
            if buf.is_empty() {
                return Ok(Step::More);
            }
            let take = buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
            let data = buf.split_to(take).freeze();
            let left = n - take as u64;
            Ok(Step::Data(
                data,
                if left == 0 {
                    Chunk::DataEnd
                } else {
                    Chunk::Data(left)
                },
            ))
        }
        Chunk::DataEnd => match buf.first() {
            None => Ok(Step::More),
            Some(b'\n') => {
                buf.advance(1);
                Ok(Step::Moved(Chunk::Size))
            }
            Some(b'\r') if buf.len() < 2 => Ok(Step::More),
            Some(b'\r') if buf[1] == b'\n' => {
                buf.advance(2);
                Ok(Step::Moved(Chunk::Size))
            }
            Some(_) => Err(()),
        },
        Chunk::Trailers => {
            let Some(end) = line_end(buf)? else {
                return Ok(Step::More);
            };
            let blank = end <= 2 && buf[..end].iter().all(|&c| c == b'\r' || c == b'\n');
            buf.advance(end);
            Ok(if blank {
                Step::Done
            } else {
                // Trailer fields are dropped, as they would be by most proxies.
                Step::Moved(Chunk::Trailers)
            })
        }
    }
}

/// The upstream response parser's fuzz entry: `data` as a backend's answer to a GET
/// and to a HEAD, read whole and in two pieces; both readings must agree.
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz_response(data: &[u8]) {
    // What a parse says: the status, the bytes taken and whether the connection is kept.
    let summary = |buf: &mut BytesMut, method: &Method| {
        let before = buf.len();
        parse_head(buf, method)
            .map(|h| h.map(|(head, _, keep)| (head.status, before - buf.len(), keep)))
    };
    for method in [Method::GET, Method::HEAD] {
        let whole = summary(&mut BytesMut::from(data), &method);
        let Ok(Some((_, len, _))) = whole else {
            continue;
        };
        assert!(len <= data.len(), "a head longer than its input");
        // The first piece is incomplete when it holds no blank line.
        let cut = len / 2;
        let first = &data[..cut];
        if first.windows(2).any(|w| w == b"\n\n") || first.windows(3).any(|w| w == b"\n\r\n") {
            continue;
        }
        let mut buf = BytesMut::from(first);
        if let Ok(None) = summary(&mut buf, &method) {
            buf.extend_from_slice(&data[cut..]);
            assert_eq!(
                summary(&mut buf, &method),
                whole,
                "a head read in two pieces"
            );
        }
    }
}

/// The chunked decoder's fuzz entry: the first byte chooses where the rest is cut into
/// reads; the decoded body (or the refusal) must not depend on the cuts.
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz_chunked(data: &[u8]) {
    let Some((&seed, input)) = data.split_first() else {
        return;
    };
    let whole = decode_chunked(input, &[]);
    let step = usize::from(seed % 7) + 1;
    let cuts: Vec<usize> = (step..input.len()).step_by(step).collect();
    assert_eq!(
        decode_chunked(input, &cuts),
        whole,
        "cuts every {step} bytes"
    );
}

/// Decodes a chunked body fed in reads ending at `cuts`; `Err` for a refused one or one
/// that ends early.
#[cfg(any(fuzzing, test))]
fn decode_chunked(input: &[u8], cuts: &[usize]) -> Result<Vec<u8>, ()> {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut state = Chunk::Size;
    let mut fed = 0;
    let mut cuts = cuts.iter().copied().chain(std::iter::once(input.len()));
    loop {
        match step_chunked(&mut buf, state)? {
            Step::Data(b, next) => {
                out.extend_from_slice(&b);
                state = next;
            }
            Step::Moved(next) => state = next,
            Step::Done => return Ok(out),
            Step::More => {
                let Some(cut) = cuts.next() else {
                    return Err(());
                };
                let cut = cut.clamp(fed, input.len());
                buf.extend_from_slice(&input[fed..cut]);
                fed = cut;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{self, HeaderValue};
    use proptest::prelude::*;

    fn encode(pieces: &[Vec<u8>]) -> Vec<u8> {
        let mut v = Vec::new();
        for p in pieces.iter().filter(|p| !p.is_empty()) {
            v.extend_from_slice(format!("{:x};ext=1\r\n", p.len()).as_bytes());
            v.extend_from_slice(p);
            v.extend_from_slice(b"\r\n");
        }
        v.extend_from_slice(b"0\r\nx-trailer: 1\r\n\r\n");
        v
    }

    proptest! {
        #[test]
        fn chunked_decodes_whatever_the_reads(
            pieces in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
            mut cuts in proptest::collection::vec(0usize..3000, 0..12),
        ) {
            cuts.sort_unstable();
            let wire = encode(&pieces);
            let body = decode_chunked(&wire, &cuts).expect("valid framing");
            prop_assert_eq!(body, pieces.concat());
        }
    }

    #[test]
    fn chunked_refuses_bad_framing() {
        assert!(decode_chunked(b"zz\r\nab\r\n0\r\n\r\n", &[]).is_err());
        assert!(decode_chunked(b"2\r\nabX0\r\n\r\n", &[]).is_err());
        assert!(decode_chunked(b"ffffffffffffffff\r\n", &[]).is_err());
        assert!(decode_chunked(b"2 junk\r\nab\r\n0\r\n\r\n", &[]).is_err());
        assert!(decode_chunked(b"2\rX\nab\r\n0\r\n\r\n", &[]).is_err());
        assert_eq!(decode_chunked(b"2\nab\n0\n\n", &[]).unwrap(), b"ab");
        assert_eq!(
            decode_chunked(b"2 ;a=b\r\nab\r\n0\r\n\r\n", &[]).unwrap(),
            b"ab"
        );
    }

    /// What a test reads of a parsed head: its status, and its fields as the header map
    /// hyper's server gets.
    struct Parsed {
        status: StatusCode,
        headers: HeaderMap,
    }

    /// Parses `text`; also returns how many bytes the head took.
    fn head(text: &str, method: Method) -> Result<Option<(Parsed, usize, Framing, bool)>, ()> {
        let mut buf = BytesMut::from(text.as_bytes());
        Ok(parse_head(&mut buf, &method)
            .map_err(|_| ())?
            .map(|(h, f, k)| {
                let p = Parsed {
                    status: h.status,
                    headers: wire_fields(h).into_map(),
                };
                (p, text.len() - buf.len(), f, k)
            }))
    }

    fn wire_fields(h: ResponseHead) -> Fields {
        match h.fields {
            ResponseFields::Wire(f) => f,
            ResponseFields::Map(_) => panic!("an inline head has span fields"),
        }
    }

    fn fields(text: &str) -> Fields {
        let mut buf = BytesMut::from(text.as_bytes());
        wire_fields(parse_head(&mut buf, &Method::GET).unwrap().unwrap().0)
    }

    proptest! {
        /// The upstream response parser keeps exactly the fields the header-map path
        /// forwards (`hop`'s rules), and closes the connection exactly when the answer
        /// says `close`.
        #[test]
        fn parsed_fields_follow_the_hop_rules(lines in crate::proxy::hop::props::lines()) {
            use crate::proxy::hop::props;
            let mut text = String::from("HTTP/1.1 200 OK\r\n");
            for (n, v) in &lines {
                text.push_str(&format!("{n}: {v}\r\n"));
            }
            text.push_str("content-length: 0\r\n\r\n");
            let mut buf = BytesMut::from(text.as_bytes());
            let (h, _, keep) = parse_head(&mut buf, &Method::GET).unwrap().unwrap();
            let f = wire_fields(h);
            prop_assert_eq!(props::sorted(f.iter()), props::kept_by_map(&lines));
            prop_assert_eq!(keep, !props::says_close(&lines));
            let dated = props::kept_by_map(&lines).iter().any(|(n, _)| n == "date");
            prop_assert_eq!(f.has_date, dated);
        }
    }

    #[test]
    fn a_parsed_head_is_read_like_any_other() {
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nX-A: 1\r\nConnection: x-b\r\nX-B: 2\r\ncontent-length: 7\r\n\r\n"
                [..],
        );
        let (h, _, _) = parse_head(&mut buf, &Method::GET).unwrap().unwrap();
        let field = |n: &'static str| h.field(&http::HeaderName::from_static(n));
        assert_eq!(field("x-a").unwrap(), "1");
        assert_eq!(field("content-length").unwrap(), "7");
        assert_eq!(field("x-b"), None, "hop-by-hop: not forwarded, not there");
        assert_eq!(field("connection"), None);
    }

    #[test]
    fn fields_are_the_backends_less_hop_by_hop_and_length() {
        let f = fields(
            "HTTP/1.1 200 OK\r\nServer: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\
             Connection: keep-alive\r\nDATE: Mon, 30 Nov 2026 06:00:00 GMT\r\nX-A: 1\r\n\r\n",
        );
        let got: Vec<(&[u8], &[u8])> = f.iter().collect();
        assert_eq!(
            got,
            [
                (&b"Server"[..], &b"x"[..]),
                (b"DATE", b"Mon, 30 Nov 2026 06:00:00 GMT"),
                (b"X-A", b"1")
            ]
        );
        assert_eq!((f.length, f.has_date), (Some(5), true));
        let map = f.into_map();
        assert_eq!(map.get_all(header::CONTENT_LENGTH).iter().count(), 1);
        assert_eq!(map[header::CONTENT_LENGTH], "5");
        assert_eq!(map["x-a"], "1");
        // A Date that `Connection` names is hop-by-hop like any other field it names.
        let f =
            fields("HTTP/1.1 200 OK\r\nConnection: date\r\nDate: x\r\ncontent-length: 0\r\n\r\n");
        assert_eq!((f.iter().count(), f.has_date), (0, false));
        // Transfer-Encoding overrides the length, which is then not stated.
        let f =
            fields("HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n");
        assert_eq!((f.iter().count(), f.length), (0, None));
    }

    #[test]
    fn response_framing_follows_rfc_9112() {
        let (p, len, f, keep) = head(
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (p.status, len, f, keep),
            (StatusCode::OK, 38, Framing::Length(5), true)
        );
        let (_, _, f, keep) = head(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!((f, keep), (Framing::Chunked(Chunk::Size), true));
        let (_, _, f, keep) = head("HTTP/1.1 200 OK\r\n\r\n", Method::GET)
            .unwrap()
            .unwrap();
        assert_eq!((f, keep), (Framing::Close, false));
        let (_, _, f, _) = head("HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n", Method::HEAD)
            .unwrap()
            .unwrap();
        assert_eq!(f, Framing::Length(0));
        let (_, _, f, _) = head(
            "HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(f, Framing::Length(0));
        let (_, _, _, keep) = head(
            "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert!(!keep);
        let (_, _, _, keep) = head("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", Method::GET)
            .unwrap()
            .unwrap();
        assert!(!keep);
        assert!(head(
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            Method::GET
        )
        .is_err());
        assert!(head("HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\n", Method::GET).is_err());
        assert!(head("HTTP/1.1 200 OK\r\ncontent-le", Method::GET)
            .unwrap()
            .is_none());
        assert!(head("garbage\r\n\r\n", Method::GET).is_err());
        // Hop-by-hop fields stay behind, with those `Connection` names.
        let (p, _, _, keep) = head(
            "HTTP/1.1 200 OK\r\nconnection: keep-alive, x-private\r\nkeep-alive: timeout=5\r\n\
             x-private: 1\r\nx-kept: 2\r\nupgrade: h2c\r\ncontent-length: 0\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert!(keep);
        let mut names: Vec<&str> = p.headers.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-length", "x-kept"]);
    }

    #[test]
    fn request_heads_say_when_there_is_no_body() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("a"));
        let mut out = Vec::new();
        write_head(&mut out, &Method::GET, "/x?y", &h, None);
        assert_eq!(out, b"GET /x?y HTTP/1.1\r\nhost: a\r\n\r\n");
        write_head(
            &mut out,
            &Method::DELETE,
            "/x",
            &HeaderMap::new(),
            Some("b:1"),
        );
        assert_eq!(out, b"DELETE /x HTTP/1.1\r\nhost: b:1\r\n\r\n");
    }
}
