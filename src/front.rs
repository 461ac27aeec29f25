//! The client side's HTTP/1.1 fast path.
//!
//! Nearly all traffic through a load balancer is plain HTTP/1.1 `GET` and `HEAD`
//! requests without a body on keep-alive connections. For those, this module reads the
//! request head itself (`httparse`), hands it to [`Proxy::serve`] and writes the
//! answer: no per-connection read and write buffers held between requests (hyper's
//! server keeps 8 KiB + 8 KiB per connection, and 16 KiB for reading while a request
//! is in flight), and the response head and a small body go out in one `send`.
//!
//! Everything else — a request with a body, an upgrade, `Expect`, HTTP/1.0, HTTP/2's
//! preface, any head this module does not accept exactly — is handed to hyper with the
//! bytes read so far ([`Outcome::HandOff`]), and hyper serves the connection from then
//! on. One kind of head with a body stays: `Content-Length` together with
//! `Transfer-Encoding`, which the request path refuses before its body is read (hyper
//! would drop the length and forward it chunked). So hyper still owns every edge case (its 400s, its chunked request bodies), and
//! this module only ever answers what it fully understands.
//!
//! Reads go through one 16 KiB scratch buffer per worker thread; a connection keeps
//! only the bytes it has not consumed yet (usually none between requests). Neither the
//! request's nor the answer's header fields go through a header map: they stay spans of
//! the heads as read (`ClientFields`, `proxy::Fields`) and are copied out with the hop's
//! rules applied.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::io::Write as _;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, StatusCode, Uri, Version};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::clock::Stamp;
use crate::deadline::Deadline;
use crate::liveness::Stopping;
use crate::proxy::headers::{put_field, put_field_lowercase, ClientFields, Spans};
use crate::proxy::hop;
use crate::proxy::MAX_HEADER_BYTES;
use crate::proxy::{Added, ResponseFields, ResponseHead};
use crate::proxy::{Peer, Proxy, ProxyResponse, RequestFields, RequestHead, RespBody};

/// Most header fields accepted on the fast path; more go to hyper.
const MAX_FIELDS: usize = 96;
/// A body frame up to this size is copied behind the head (one `send` for both).
const COALESCE: usize = 16 * 1024;
const SCRATCH: usize = 16 * 1024;

thread_local! {
    static SCRATCH_BUF: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; SCRATCH].into_boxed_slice());
}

/// How a connection left the fast path.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Closed (by either side, a timeout, or a stop).
    Closed,
    /// Refused before any request was read: the caller writes this answer (it closes
    /// the connection) and closes.
    Refused(&'static [u8]),
    /// hyper takes it from here, starting with these bytes.
    HandOff(Bytes),
}

/// The answer to a connection whose first request head is late (HAProxy's `timeout
/// http-request`).
const ANSWER_408: &[u8] = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 16\r\nconnection: close\r\n\r\nrequest timeout\n";

/// The answer to a head over [`MAX_HEADER_BYTES`] (hyper's answer before: it reads no
/// more than that either).
const ANSWER_431: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 32\r\nconnection: close\r\n\r\nrequest header fields too large\n";

/// What one read of the head found.
enum Head {
    /// Not all of it yet.
    Partial,
    /// Not for the fast path: hand the connection to hyper.
    Other,
    /// A request the fast path serves.
    Ready(Parsed),
}

struct Parsed {
    len: usize,
    method: Method,
    target: (usize, usize),
    /// Name offset, name length, value offset, value length (`ClientFields`' spans).
    fields: Vec<(u32, u32, u32, u32)>,
    close: bool,
}

/// A client connection's byte stream: a TCP socket, or TLS over one.
pub(crate) trait ClientIo: AsyncRead + AsyncWrite + Unpin {}

impl<S: AsyncRead + AsyncWrite + Unpin> ClientIo for S {}

/// Serves `stream` (plain, or TLS once its handshake is done) until it closes or must go
/// to hyper. The first head must be whole by `first_by` (the connection's opening, a TLS
/// handshake included, shares one head timeout); each later one within `header_timeout`
/// of the answer before it.
pub(crate) async fn serve<S: ClientIo>(
    stream: &mut S,
    proxy: &'static Proxy,
    peer: &Peer,
    (first_by, header_timeout): (Stamp, Duration),
    stop: &Stopping,
) -> Outcome {
    let mut conn = ConnState {
        buf: BytesMut::new(),
        eof: false,
        served: false,
        stop_seen: false,
        deadline: Deadline::new(first_by),
        header_timeout,
    };
    // One wait for the stop signal per connection, not one per request (each wait
    // registers with the channel under its lock). `stop` itself still answers whether
    // to keep the connection alive.
    let mut stop_rx = stop.receiver();
    let stopped = stop_rx.changed();
    tokio::pin!(stopped);
    loop {
        // 1. A whole request head.
        let parsed = match conn.read_head(stream, stopped.as_mut(), stop).await {
            Ok(p) => p,
            Err(outcome) => return outcome,
        };
        let close = parsed.close;
        let request = match take_request(&mut conn.buf, parsed) {
            Ok(r) => r,
            Err(handoff) => return handoff,
        };
        conn.served = true;
        let head_only = request.method == Method::HEAD;

        // 2. The answer, while watching the client: if it goes away the request is
        // dropped, as hyper's server does. Bytes it sends meanwhile (a pipelined
        // request) are kept, up to one head's worth.
        let who = proxy.identify(&request, peer);
        let id = who.1.clone();
        let fut = proxy.serve(request, None, None, peer, who);
        let mut fut = crate::recycle::Recycled::new(fut);
        let (buf, eof) = (&mut conn.buf, &mut conn.eof);
        let mut resp = loop {
            tokio::select! {
                biased;
                r = &mut fut => break r,
                r = read_some(stream, buf), if !*eof && buf.len() <= MAX_HEADER_BYTES => {
                    match r {
                        ReadResult::Eof if !buf.is_empty() => *eof = true,
                        ReadResult::Eof | ReadResult::Error => return Outcome::Closed,
                        ReadResult::Data => {}
                    }
                }
            }
        };
        drop(fut);
        resp.head.stamp(id, peer, Version::HTTP_11);

        // 3. Write it.
        let keep = !close && !stop.is_stopping() && !resp.closes();
        let mut client = conn.client(stream, proxy.settings().send_timeout, peer.socket);
        let written = client.write_response(&mut resp, head_only, keep).await;
        drop(resp);
        match written {
            Ok(true) => {}
            Ok(false) | Err(_) => return Outcome::Closed,
        }
        if !keep {
            // Half-close first, as hyper does, so the answer is not cut by a reset. Over
            // TLS that writes a close_notify, which a client that stopped reading could
            // hold up for ever: bounded like any write.
            let _ = tokio::time::timeout(proxy.settings().send_timeout, stream.shutdown()).await;
            return Outcome::Closed;
        }
    }
}

/// What a fast-path connection keeps between its requests: the bytes read and not yet
/// taken (usually none), whether the client half-closed, whether a request was read on
/// it, whether a stop was seen, and its one timer (see `Deadline`) for the head timeout
/// and the send timeout.
struct ConnState {
    buf: BytesMut,
    /// The client half-closed after sending requests: the ones already read are
    /// answered, then the connection closes (as hyper's server does), but nothing more
    /// is read.
    eof: bool,
    served: bool,
    stop_seen: bool,
    deadline: Deadline,
    header_timeout: Duration,
}

impl ConnState {
    /// The connection as an answer's writer sees it.
    #[inline]
    fn client<'a, S>(
        &'a mut self,
        stream: &'a mut S,
        send_timeout: Duration,
        socket: i32,
    ) -> Client<'a, S> {
        Client {
            stream,
            buf: &mut self.buf,
            eof: &mut self.eof,
            deadline: &mut self.deadline,
            send_timeout,
            socket,
        }
    }

    /// Reads until a whole request head the fast path serves is in `buf`; otherwise how
    /// the connection leaves the fast path (a hand-off, a refusal, a close).
    async fn read_head<S: ClientIo, F: Future>(
        &mut self,
        stream: &mut S,
        mut stopped: Pin<&mut F>,
        stop: &Stopping,
    ) -> Result<Parsed, Outcome> {
        // The first head keeps the connection's own deadline.
        if self.served {
            self.deadline.set(Stamp::now().after(self.header_timeout));
        }
        loop {
            if !self.buf.is_empty() {
                match parse(&self.buf) {
                    Head::Ready(p) => return Ok(p),
                    Head::Other => return Err(Outcome::HandOff(self.buf.split().freeze())),
                    Head::Partial if self.buf.len() > MAX_HEADER_BYTES => {
                        return Err(Outcome::Refused(ANSWER_431))
                    }
                    Head::Partial => {}
                }
            }
            if self.eof {
                return Err(Outcome::Closed);
            }
            let empty = self.buf.is_empty();
            tokio::select! {
                biased;
                r = read_some(stream, &mut self.buf) => match r {
                    ReadResult::Eof | ReadResult::Error => return Err(Outcome::Closed),
                    ReadResult::Data => {}
                },
                // Late head: 408 if it was the first, else a silent close (an idle
                // keep-alive connection), as nginx and HAProxy do.
                () = self.deadline.expired() => {
                    return Err(match self.served {
                        true => Outcome::Closed,
                        false => Outcome::Refused(ANSWER_408),
                    });
                }
                // Idle keep-alive closes at a stop, unless the sockets were handed over
                // (then the head timeout closes it, and a request on its way is still
                // answered); a new connection's first request is answered either way
                // (docs/architecture.md, "Shutdown"). Which stop it is can only be read
                // once it has come.
                _ = stopped.as_mut(), if empty && self.served && !self.stop_seen => {
                    self.stop_seen = true;
                    if !stop.is_handed_over() {
                        return Err(Outcome::Closed);
                    }
                }
            }
        }
    }
}

/// Takes the parsed head out of `buf` as a request; one with a target `http` refuses
/// goes to hyper with every byte read, and hyper answers it as it would.
#[inline]
fn take_request(buf: &mut BytesMut, parsed: Parsed) -> Result<RequestHead, Outcome> {
    let head = buf.split_to(parsed.len).freeze();
    match request_head(head.clone(), parsed) {
        Some(request) => Ok(request),
        None => {
            let mut all = BytesMut::with_capacity(head.len() + buf.len());
            all.extend_from_slice(&head);
            all.extend_from_slice(buf);
            Err(Outcome::HandOff(all.freeze()))
        }
    }
}

enum ReadResult {
    Data,
    Eof,
    Error,
}

/// Waits for the client's next bytes and reads them through the worker's scratch
/// buffer; only what arrived is kept in `buf`.
///
/// A read through `AsyncRead` (unlike `try_read`) lets tokio drop the socket's
/// readiness after a short read, so the next wait costs no `recv` that can only fail
/// with `EAGAIN`. The scratch buffer is borrowed within one poll, never across a wait.
async fn read_some<S: ClientIo>(stream: &mut S, buf: &mut BytesMut) -> ReadResult {
    poll_fn(|cx| {
        SCRATCH_BUF.with(|s| {
            let mut s = s.borrow_mut();
            let mut rb = ReadBuf::new(&mut s[..]);
            match Pin::new(&mut *stream).poll_read(cx, &mut rb) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(())) if rb.filled().is_empty() => Poll::Ready(ReadResult::Eof),
                Poll::Ready(Ok(())) => {
                    buf.extend_from_slice(rb.filled());
                    Poll::Ready(ReadResult::Data)
                }
                Poll::Ready(Err(_)) => Poll::Ready(ReadResult::Error),
            }
        })
    })
    .await
}

/// Whether `buf` starts with a request head the fast path serves: `GET` or `HEAD`,
/// origin-form target, HTTP/1.1, no body, no upgrade, no `Expect`; or an origin-form
/// HTTP/1.1 head of any method with both `Content-Length` and `Transfer-Encoding`, to be
/// refused.
fn parse(buf: &[u8]) -> Head {
    let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut fields);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Head::Partial,
        Err(_) => return Head::Other,
    };
    // Other methods go to hyper, unless the head's framing is to be refused (below).
    let plain = match req.method {
        Some("GET") => Some(Method::GET),
        Some("HEAD") => Some(Method::HEAD),
        _ => None,
    };
    if req.version != Some(1) {
        return Head::Other;
    }
    let Some(path) = req.path.filter(|p| p.starts_with('/')) else {
        return Head::Other;
    };
    let base = buf.as_ptr() as usize;
    // Offsets fit in u32: a head this path serves is at most MAX_HEADER_BYTES plus one read.
    let at = |s: &[u8]| (s.as_ptr() as usize - base) as u32;
    let span = |s: &[u8]| {
        let at = s.as_ptr() as usize - base;
        (at, at + s.len())
    };
    let mut close = false;
    let (mut length, mut coding, mut upgrade) = (false, false, false);
    let mut out = Vec::with_capacity(req.headers.len());
    for f in req.headers.iter() {
        let name = f.name.as_bytes();
        let is = |n: &HeaderName| name.eq_ignore_ascii_case(n.as_str().as_bytes());
        length |= is(&header::CONTENT_LENGTH);
        coding |= is(&header::TRANSFER_ENCODING);
        // Decided after the loop: a head with ambiguous framing is refused here
        // whatever else it asks for.
        upgrade |= is(&header::EXPECT) || is(&header::UPGRADE);
        if hop::is_connection(name) {
            for token in hop::tokens(f.value) {
                if token == hop::Token::Close {
                    close = true;
                } else if token.is_upgrade() {
                    upgrade = true;
                }
            }
        }
        out.push((
            at(name),
            name.len() as u32,
            at(f.value),
            f.value.len() as u32,
        ));
    }
    // A body goes to hyper; but a head with both `Content-Length` and
    // `Transfer-Encoding` is served here, where the request path refuses it before
    // anything is read of its body (hyper would drop the length and forward it).
    let method = match (length, coding, plain) {
        (false, false, Some(m)) if !upgrade => m,
        (true, true, _) => match req.method.map(|m| Method::from_bytes(m.as_bytes())) {
            Some(Ok(m)) => {
                close = true;
                m
            }
            _ => return Head::Other,
        },
        _ => return Head::Other,
    };
    Head::Ready(Parsed {
        len,
        method,
        target: span(path.as_bytes()),
        fields: out,
        close,
    })
}

/// The request's head, its target and fields slices of `head` (no copies).
fn request_head(head: Bytes, p: Parsed) -> Option<RequestHead> {
    let uri = Uri::from_maybe_shared(head.slice(p.target.0..p.target.1)).ok()?;
    Some(RequestHead {
        method: p.method,
        uri,
        version: Version::HTTP_11,
        fields: RequestFields::Spans(ClientFields::new(Spans::new(head, p.fields))),
    })
}

/// The client head parser's fuzz entry: parses `data` as the fast path does and, for a
/// head it would serve, runs what the request path does with it before a backend is
/// picked (validation, the authority, the size), then checks that the fast path's
/// writer and the map path forward the same fields.
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz_client_head(data: &[u8], check_rewrite: bool) {
    let Head::Ready(p) = parse(data) else {
        return;
    };
    assert!(p.len <= data.len(), "a head longer than its input");
    let head = Bytes::copy_from_slice(&data[..p.len]);
    let Some(rh) = request_head(head, p) else {
        return;
    };
    let refused = crate::proxy::validate_head(&rh).is_err();
    let _ = (rh.host(), rh.size());
    if check_rewrite && !refused {
        if let RequestFields::Spans(f) = &rh.fields {
            for (trusted, https) in [(false, false), (true, false), (false, true)] {
                let (written, mapped) = crate::proxy::headers::both_rewrites(f, trusted, https);
                assert_eq!(
                    written, mapped,
                    "the fast path and the map path forward alike"
                );
            }
        }
    }
}

/// A `Content-Length` to state: a number, or a backend's value as it came.
enum Length {
    Number(u64),
    Text(HeaderValue),
}

/// How the body goes on the wire.
#[derive(Clone, Copy, PartialEq)]
enum Framing {
    None,
    Length,
    Chunked,
}

/// The client of a fast-path connection while an answer goes out to it: its socket,
/// the bytes it sends meanwhile (kept for the next request) and whether it half-closed,
/// and the connection's timer, which bounds each write by the send timeout.
struct Client<'a, S> {
    stream: &'a mut S,
    buf: &'a mut BytesMut,
    eof: &'a mut bool,
    deadline: &'a mut Deadline,
    send_timeout: Duration,
    /// The client's TCP socket (`liveness::unsent`).
    socket: i32,
}

impl<S: ClientIo> Client<'_, S> {
    /// Writes `resp`; returns whether the connection may carry another request. By
    /// reference: the answer stays where the caller has it rather than being copied
    /// into this future.
    async fn write_response(
        &mut self,
        resp: &mut ProxyResponse,
        head_only: bool,
        keep: bool,
    ) -> std::io::Result<bool> {
        let mut out: Vec<u8> = Vec::with_capacity(512);
        let framing = write_head(&mut out, &resp.head, &resp.body, head_only, keep);
        // Written out: the head's fields (and the backend's head they point into) go
        // now, dropped in place rather than moved out.
        resp.head.fields = ResponseFields::Map(http::HeaderMap::new());
        if framing == Framing::None {
            // No body to wait for: the request's hold is released before the write.
            resp.body = RespBody::empty();
            self.send(&out).await?;
            return Ok(true);
        }
        self.write_body(&mut resp.body, out, framing).await
    }

    /// Writes all of `bytes`; fails when the client has taken no byte for the send
    /// timeout (nginx's `send_timeout` bounds each write; here a wait also goes on while
    /// the socket's send queue shrinks, `liveness::unsent`: the kernel wakes a writer only
    /// when a third of a possibly multi-megabyte buffer is free, so a client reading
    /// 64 KiB a second could otherwise be cut). A write the socket takes at once touches
    /// no timer: the deadline moves only when a write has to wait.
    async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        // Flushed: TLS keeps records its socket could not take yet (a no-op on TCP).
        let stream = &mut *self.stream;
        let write = async move {
            stream.write_all(bytes).await?;
            stream.flush().await
        };
        tokio::pin!(write);
        if let Poll::Ready(r) = poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx))).await {
            return r;
        }
        // Looked at every quarter of the timeout: a write woken in between refills the
        // queue, which a single look a whole timeout later could take for no progress.
        let quarter = self.send_timeout / 4;
        let mut unsent = crate::liveness::unsent(self.socket);
        let mut still = Duration::ZERO;
        loop {
            self.deadline.set(Stamp::now().after(quarter));
            tokio::select! {
                biased;
                r = &mut write => return r,
                () = self.deadline.expired() => {}
            }
            let now = crate::liveness::unsent(self.socket);
            still = match (now, unsent) {
                (Some(n), Some(was)) if n < was => Duration::ZERO,
                _ => still + quarter,
            };
            unsent = now;
            if still >= self.send_timeout {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
        }
    }

    /// Streams the body behind the head already in `out`: frames up to [`COALESCE`] go
    /// out with what precedes them, a flush comes before every wait, and a client that
    /// goes away while the backend is slow ends it. Returns whether the connection may
    /// carry another request.
    async fn write_body(
        &mut self,
        body: &mut RespBody,
        mut out: Vec<u8>,
        framing: Framing,
    ) -> std::io::Result<bool> {
        let mut body = std::pin::Pin::new(body);
        loop {
            // Take what the body has ready without waiting; flush before waiting.
            let ready = poll_fn(|cx| Poll::Ready(body.as_mut().poll_frame(cx))).await;
            let frame = match ready {
                Poll::Ready(f) => f,
                Poll::Pending => {
                    if !out.is_empty() {
                        self.send(&out).await?;
                        out.clear();
                    }
                    match self.next_frame(body.as_mut()).await {
                        Some(f) => f,
                        None => return Ok(false),
                    }
                }
            };
            let data = match frame {
                None => break,
                Some(Err(_)) => {
                    // The answer broke off mid-body: the client must see the cut.
                    if !out.is_empty() {
                        self.send(&out).await?;
                    }
                    return Ok(false);
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if !data.is_empty() => data,
                    _ => continue, // trailers: not forwarded
                },
            };
            if framing == Framing::Chunked {
                // Writing into a Vec cannot fail.
                let _ = write!(out, "{:x}\r\n", data.len());
            }
            if data.len() <= COALESCE {
                out.extend_from_slice(&data);
            } else {
                self.send(&out).await?;
                out.clear();
                self.send(&data).await?;
            }
            if framing == Framing::Chunked {
                out.extend_from_slice(b"\r\n");
            }
            if out.len() >= COALESCE {
                self.send(&out).await?;
                out.clear();
            }
        }
        if framing == Framing::Chunked {
            out.extend_from_slice(b"0\r\n\r\n");
        }
        if !out.is_empty() {
            self.send(&out).await?;
        }
        Ok(true)
    }

    /// Waits for the body's next frame while watching the client: `None` when it goes
    /// away meanwhile (the request ends); bytes it sends are kept for the next request.
    async fn next_frame(
        &mut self,
        mut body: Pin<&mut RespBody>,
    ) -> Option<Option<Result<http_body::Frame<Bytes>, crate::proxy::BodyError>>> {
        loop {
            tokio::select! {
                biased;
                f = poll_fn(|cx| body.as_mut().poll_frame(cx)) => return Some(f),
                r = read_some(self.stream, self.buf), if !*self.eof && self.buf.len() <= MAX_HEADER_BYTES => {
                    match r {
                        ReadResult::Eof if !self.buf.is_empty() => *self.eof = true,
                        ReadResult::Eof | ReadResult::Error => return None,
                        ReadResult::Data => {}
                    }
                }
            }
        }
    }
}

/// Writes the answer's head into `out`: the status line (the backend's reason phrase
/// kept), its fields, `Date` when the backend sent none, and the framing this hop
/// chooses (see `docs/architecture.md`, "Server protocol"), which it returns.
#[inline]
fn write_head(
    out: &mut Vec<u8>,
    head: &ResponseHead,
    body: &RespBody,
    head_only: bool,
    keep: bool,
) -> Framing {
    let status = head.status;
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    match &head.reason {
        Some(r) => out.extend_from_slice(r.as_bytes()),
        // What hyper writes for a code without a standard phrase.
        None => out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes()),
    }
    out.extend_from_slice(b"\r\n");
    let bodiless_status = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    // The backend's length (one line, however many it sent: the upstream parser has
    // checked that they agree), else the body's own when it knows it exactly.
    let stated = match &head.fields {
        ResponseFields::Wire(f) => f.length.map(Length::Number),
        ResponseFields::Map(m) => m
            .get(header::CONTENT_LENGTH)
            .map(|v| Length::Text(v.clone())),
    };
    let exact = body.size_hint().exact();
    let framing = if head_only || bodiless_status {
        Framing::None
    } else if stated.is_some() || exact.is_some() {
        Framing::Length
    } else {
        Framing::Chunked
    };
    let has_date = put_fields(out, &head.fields);
    head.finish(has_date, |added| match added {
        Added::Date(v) => put_field(out, b"date", v.as_bytes()),
        Added::AltSvc(v) => put_field(out, b"alt-svc", v.as_bytes()),
        Added::RequestId(id) => put_field(out, b"x-request-id", id.as_bytes()),
        Added::RateLimit(rl) => rl.write(out),
    });
    let own = matches!(body, RespBody::Full(_));
    let length = match framing {
        Framing::Length => stated.or_else(|| exact.map(Length::Number)),
        // 1xx and 204 have none (RFC 9110 §8.6); a 304 or a HEAD answer keeps the
        // backend's, which describes the GET's; a HEAD answer of fulcrum's own states its
        // length, as hyper did.
        Framing::None if status.is_informational() || status == StatusCode::NO_CONTENT => None,
        Framing::None if own && head_only && !bodiless_status => exact.map(Length::Number),
        Framing::None => stated,
        Framing::Chunked => None,
    };
    match length {
        Some(Length::Number(n)) => put_field(
            out,
            b"content-length",
            itoa::Buffer::new().format(n).as_bytes(),
        ),
        Some(Length::Text(v)) => put_field(out, b"content-length", v.as_bytes()),
        None => {}
    }
    if framing == Framing::Chunked {
        put_field(out, b"transfer-encoding", b"chunked");
    }
    if !keep {
        put_field(out, b"connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
    framing
}

/// Writes the answer's fields but its framing ones and `X-Request-Id` (this hop sets
/// those); returns whether there was a `Date`.
#[inline]
fn put_fields(out: &mut Vec<u8>, fields: &ResponseFields) -> bool {
    match fields {
        ResponseFields::Wire(f) => {
            for (k, v) in f.iter() {
                if !crate::proxy::request_id::is_request_id(k) {
                    put_field_lowercase(out, k, v);
                }
            }
            f.has_date
        }
        ResponseFields::Map(m) => {
            for (k, v) in m {
                if k == header::TRANSFER_ENCODING
                    || k == header::CONNECTION
                    || k == header::CONTENT_LENGTH
                    || k == crate::proxy::request_id::X_REQUEST_ID
                {
                    continue;
                }
                put_field(out, k.as_str().as_bytes(), v.as_bytes());
            }
            m.contains_key(header::DATE)
        }
    }
}

/// A stream with bytes already read in front of it, for hyper after a hand-off.
#[derive(Debug)]
pub(crate) struct Rewind<S = TcpStream> {
    pre: Bytes,
    inner: S,
}

impl<S> Rewind<S> {
    /// `inner`, whose next bytes are `pre`.
    pub(crate) fn new(pre: Bytes, inner: S) -> Rewind<S> {
        Rewind { pre, inner }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.pre.is_empty() && buf.remaining() > 0 {
            let n = self.pre.len().min(buf.remaining());
            let chunk = self.pre.split_to(n);
            buf.put_slice(&chunk);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The fast path's close and upgrade check reads `Connection` as the hop rules
        /// do: it closes after the answer exactly when the request says `close`, and it
        /// never serves a request the header-map path would treat as an upgrade.
        #[test]
        fn close_and_upgrade_follow_the_hop_rules(
            lines in crate::proxy::hop::props::lines(),
            upgrade_field in proptest::bool::ANY,
        ) {
            use crate::proxy::hop::props;
            let mut text = String::from("GET / HTTP/1.1\r\n");
            for (n, v) in &lines {
                text.push_str(&format!("{n}: {v}\r\n"));
            }
            if upgrade_field {
                text.push_str("Upgrade: websocket\r\n");
            }
            text.push_str("\r\n");
            let mut map = props::map_of(&lines);
            if upgrade_field {
                map.append(header::UPGRADE, HeaderValue::from_static("websocket"));
            }
            let upgrade = crate::proxy::headers::is_upgrade_request(&map);
            let names_upgrade = lines.iter().any(|(n, v)| {
                n.eq_ignore_ascii_case("connection")
                    && v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            });
            match parse(text.as_bytes()) {
                Head::Ready(p) => {
                    proptest::prop_assert!(!upgrade && !upgrade_field && !names_upgrade);
                    proptest::prop_assert_eq!(p.close, props::says_close(&lines));
                }
                Head::Other => proptest::prop_assert!(upgrade_field || names_upgrade),
                Head::Partial => proptest::prop_assert!(false, "a whole head"),
            }
        }
    }

    fn ready(buf: &[u8]) -> Option<Parsed> {
        match parse(buf) {
            Head::Ready(p) => Some(p),
            _ => None,
        }
    }

    #[test]
    fn plain_gets_and_heads_are_served_and_everything_else_handed_off() {
        let p = ready(b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\r\nGET").unwrap();
        assert_eq!(p.len, 40);
        assert_eq!(p.method, Method::GET);
        assert!(!p.close);
        let head = Bytes::from_static(b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\r\n");
        let mut request = request_head(head, p).unwrap();
        assert_eq!(request.uri, "/a?b=1");
        assert!(matches!(request.fields, RequestFields::Spans(_)));
        assert_eq!(request.host().unwrap(), "x");
        request.make_map();
        let RequestFields::Map(map) = &request.fields else {
            panic!("made a map");
        };
        assert_eq!(map["host"], "x");
        assert_eq!(map["x-a"], "1");
        assert!(
            ready(b"HEAD / HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\n")
                .unwrap()
                .close
        );
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\nHost: x\r\n"),
            Head::Partial
        ));
        for other in [
            &b"POST / HTTP/1.1\r\nContent-Length: 1\r\n\r\nx"[..],
            b"GET / HTTP/1.0\r\n\r\n",
            b"GET http://x/ HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            b"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
            b"\x16\x03\x01",
        ] {
            assert!(
                matches!(parse(other), Head::Other | Head::Partial),
                "{}",
                String::from_utf8_lossy(other)
            );
            assert!(ready(other).is_none());
        }
    }
}
