//! HTTP/2 from clients (h2c by prior knowledge, and ALPN `h2` over TLS), served with the
//! `h2` crate directly. Each stream is a future polled inside its connection's own task
//! ([`serve`]), not a task spawned per stream; its
//! request goes into the request path as `h2` parsed it, and its answer goes out as a
//! HEADERS frame and the body's DATA frames. hyper's server did the same through a
//! spawned task per stream, a body type and a response future of its own; without them
//! an HTTP/2 request costs about a tenth fewer instructions with ten streams open
//! (`docs/performance.md`, "HTTP/2 from clients").
//!
//! The protocol itself (framing, HPACK, flow control, stream states, the limits on
//! resets and header lists) is `h2`'s, the crate hyper's server is built on.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt as _};
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{Request, Response};
use http_body::{Body as _, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::liveness::{Activity, Opened, Watched};
use crate::proxy::BodyError;
use crate::proxy::{
    fit_head, stated_length, ClientBody, Peer, Proxy, RequestHead, RespBody, MAX_HEADER_BYTES,
};

/// Streams a client may have open at once (hyper's server default; nginx allows 128,
/// HAProxy 100).
const MAX_STREAMS: u32 = 200;
/// Each stream's receive window, and the connection's: 1 MiB, as hyper's server.
const WINDOW: u32 = 1 << 20;
/// Answer bytes a stream may have queued for the client beyond its window (hyper's
/// server default).
const SEND_BUFFER: usize = 400 * 1024;
/// Streams this side may reset for a client's errors before the connection is closed
/// with `ENHANCE_YOUR_CALM` (hyper's server default).
const MAX_ERROR_RESETS: usize = 1024;

/// A client's HTTP/2 connection, after the handshake.
pub(crate) type Connection<T> = h2::server::Connection<T, Bytes>;

/// The server's side of the handshake: the client's preface, and this side's SETTINGS.
/// Its limits are the ones hyper's server had (`docs/operations.md`, "Limits"): the header list at
/// [`MAX_HEADER_BYTES`], 200 streams, and `h2`'s own bounds on streams a client resets
/// before they are taken (rapid reset) and on CONTINUATION frames.
pub(crate) async fn handshake<T>(io: T) -> Result<Connection<T>, h2::Error>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    h2::server::Builder::new()
        .initial_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .max_send_buffer_size(SEND_BUFFER)
        .max_local_error_reset_streams(Some(MAX_ERROR_RESETS))
        .handshake(io)
        .await
}

/// Serves a connection's streams until the connection ends: `Ok` when it closed
/// cleanly (after a `GOAWAY` from either side, its last stream done, or when the client
/// closed its end; streams still open then are dropped). Resolves only then, so that
/// what waits beside it (the watchdog, the stop) is not set up again per request.
/// `close` asks for a graceful close (`GOAWAY`; the streams open finish); it is read at
/// each poll, and the caller polls this again after setting it.
///
/// One poll runs the streams that can go on, then the connection: it writes what they
/// queued, reads, and hands over new streams, each run at once until it waits, then the
/// connection again until it has nothing more. A request with one stream open costs
/// four polls of the connection this way (two when its request comes, two for its
/// answer), and about one and a third with ten open.
pub(crate) async fn serve<T>(
    mut conn: Connection<T>,
    proxy: &Proxy,
    peer: &Peer,
    activity: &Arc<Activity>,
    close: &AtomicBool,
) -> Result<(), h2::Error>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut streams = FuturesUnordered::new();
    let mut closing = false;
    poll_fn(|cx| {
        if !closing && close.load(Ordering::Relaxed) {
            closing = true;
            conn.graceful_shutdown();
        }
        loop {
            let mut finished = false;
            while let Poll::Ready(Some(())) = streams.poll_next_unpin(cx) {
                finished = true;
            }
            if finished {
                // The answers just finished woke this task already (`h2` wakes the
                // connection for each frame queued): the next poll writes them all,
                // one poll of the connection rather than one now and one then.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            match std::task::ready!(conn.poll_accept(cx)) {
                Some(Ok((req, respond))) => {
                    streams.push(stream(proxy, req, respond, peer, activity.open()));
                }
                Some(Err(e)) => return Poll::Ready(Err(e)),
                None => return Poll::Ready(Ok(())),
            }
        }
    })
    .await
}

/// Serves one stream: its request through the request path, its answer back. A
/// `RST_STREAM` from the client drops the request wherever it is (the backend's
/// exchange with it), and a stream reset before it was taken never starts one;
/// `opened` is the request's place in its connection's [`crate::liveness::Activity`],
/// held until the answer's body is done. An answer to `HEAD` goes without its body.
async fn stream(
    proxy: &Proxy,
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    peer: &Peer,
    opened: Opened,
) {
    let (parts, recv) = req.into_parts();
    let head_only = parts.method == http::Method::HEAD;
    // An empty body is not forwarded as a stream: such a request can be replayed. Its
    // h2 stream is kept until the answer is sent, since dropping it wakes the
    // connection (one more poll of it per request).
    let (body, _bodiless) = match recv.is_end_stream() {
        true => (None, Some(recv)),
        false => (
            Some(ClientBody::stream(H2Body::new(
                recv,
                stated_length(&parts.headers),
            ))),
            None,
        ),
    };
    let answer = {
        // Boxed: the request path's future is kilobytes, and this stream's future is
        // moved on its way into the connection's set of streams.
        let head = RequestHead::from_parts(parts);
        let served = Box::pin(proxy.answer(head, body, None, peer));
        let reset = poll_fn(|cx| respond.poll_reset(cx));
        tokio::select! {
            biased;
            _ = reset => return,
            r = served => r,
        }
    };
    let (mut parts, body) = answer.into_parts();
    fit_head(&mut parts.headers, &body);
    let body = Watched::new(body, opened);
    let end = head_only || body.is_end_stream();
    let sent = match respond.send_response(Response::from_parts(parts, ()), end) {
        Ok(send) if !end => pipe(send, body).await,
        Ok(_) => Ok(()),
        Err(e) => Err(e),
    };
    if let Err(e) = sent {
        tracing::debug!(error = %e, peer = %peer.addr, "HTTP/2 answer not sent whole");
    }
}

/// Sends an answer's body on its stream: each DATA frame once the client's window has
/// room, then the trailers or an empty end-of-stream frame. As hyper's server, a frame
/// waits on a one-byte claim on the window rather than its whole length (`h2` raises
/// the claim to what is queued), and a body that breaks off resets the stream with
/// `INTERNAL_ERROR`.
async fn pipe(mut send: SendStream<Bytes>, mut body: Watched<RespBody>) -> Result<(), h2::Error> {
    loop {
        let frame = poll_fn(|cx| {
            // The client's RST_STREAM ends the answer while it waits on the backend.
            if let Poll::Ready(r) = send.poll_reset(cx) {
                return Poll::Ready(Err(r.map_or_else(|e| e, h2::Error::from)));
            }
            Pin::new(&mut body).poll_frame(cx).map(Ok)
        })
        .await?;
        let frame = match frame {
            None => return send.send_data(Bytes::new(), true),
            Some(Err(e)) => {
                tracing::debug!(error = %e, "an answer's body broke off");
                send.send_reset(Reason::INTERNAL_ERROR);
                return Ok(());
            }
            Some(Ok(frame)) => frame,
        };
        match frame.into_data() {
            Ok(data) => {
                let end = body.is_end_stream();
                if !data.is_empty() && !window(&mut send).await? {
                    return Ok(());
                }
                send.send_data(data, end)?;
                if end {
                    return Ok(());
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    send.reserve_capacity(0);
                    return send.send_trailers(trailers);
                }
            }
        }
    }
}

/// Waits until the stream may send at least a byte; `false` when it can no longer send
/// (the client reset it).
async fn window(send: &mut SendStream<Bytes>) -> Result<bool, h2::Error> {
    send.reserve_capacity(1);
    while send.capacity() == 0 {
        match poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e),
            None => return Ok(false),
        }
    }
    Ok(true)
}

/// An HTTP/2 request body: each DATA frame's bytes are given back to the client's
/// window as they are taken (as hyper's `Incoming` does), so the client sends on as
/// fast as the backend reads.
#[derive(Debug)]
struct H2Body {
    recv: h2::RecvStream,
    /// What `Content-Length` says is left to come.
    left: Option<u64>,
    /// The DATA frames are over; the trailers (if any) are next.
    data_done: bool,
}

impl http_body::Body for H2Body {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if !this.data_done {
            match std::task::ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    if let Some(left) = &mut this.left {
                        *left = left.saturating_sub(data.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                // A RST_STREAM with NO_ERROR is a client's early end (RFC 9113 §8.1),
                // not a failure: the body ends there, as hyper's `Incoming` ends it.
                Some(Err(e)) if e.reason() == Some(h2::Reason::NO_ERROR) => {
                    return Poll::Ready(None)
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => this.data_done = true,
            }
        }
        match std::task::ready!(this.recv.poll_trailers(cx)) {
            Ok(Some(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e.into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.left
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

impl H2Body {
    /// The body of the stream `recv`; `length` is the request's `Content-Length`, when it
    /// states one (h2 holds the stream to it).
    fn new(recv: h2::RecvStream, length: Option<u64>) -> H2Body {
        H2Body {
            recv,
            left: length,
            data_done: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::ProxyResponse;
    use http::header::{self, HeaderMap, HeaderValue};

    #[test]
    fn a_head_gets_date_and_length_and_loses_hop_by_hop_fields() {
        let mut fields = HeaderMap::new();
        fields.insert(header::CONNECTION, HeaderValue::from_static("close"));
        fields.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        fields.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        let body = RespBody::full(Bytes::from_static(b"hello"));
        // As an answer goes out: made an `http::Response` (which adds what this hop adds,
        // `Date` among them), then fitted for HTTP/2.
        let r = ProxyResponse::new(http::StatusCode::OK, fields, body).into_http();
        let (parts, body) = r.into_parts();
        let mut fields = parts.headers;
        fit_head(&mut fields, &body);
        assert!(fields.contains_key(header::DATE));
        assert_eq!(fields[header::CONTENT_LENGTH], "5");
        assert!(!fields.contains_key(header::CONNECTION) && !fields.contains_key("keep-alive"));
        assert_eq!(fields[header::CONTENT_TYPE], "text/plain");
        // No body (an answer to HEAD, a 204): nothing said about a length not known.
        let mut none = HeaderMap::new();
        fit_head(&mut none, &RespBody::empty());
        assert!(!none.contains_key(header::CONTENT_LENGTH));
    }
}
