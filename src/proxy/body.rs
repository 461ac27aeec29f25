//! The request body on its way upstream: the client's stream, whichever front end
//! read it, counted and cut at `max_request_body`. No boxing, no buffering.

use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// How far a client's upload has gone, as the upstream exchange saw it at its last
/// read of the client's body. A timeout with the upload unfinished is the client's
/// doing only when that read was waiting on the client; when the backend stopped
/// taking the body (the exchange stopped reading it), it is the backend's.
#[derive(Debug, Default)]
pub(crate) struct Upload(AtomicU8);

impl Upload {
    /// The last read gave data (or none was made yet): the exchange moves it on.
    const MOVING: u8 = 0;
    /// The last read found nothing yet: waiting on the client.
    const WAITING_ON_CLIENT: u8 = 1;
    /// The body was read whole.
    const DONE: u8 = 2;
    /// The body grew over `max_request_body` and was cut.
    const TOO_LARGE: u8 = 3;

    fn set(&self, state: u8) {
        self.0.store(state, Ordering::Relaxed);
    }

    /// The body has been read whole.
    pub(crate) fn is_done(&self) -> bool {
        self.0.load(Ordering::Relaxed) == Self::DONE
    }

    /// Unfinished, and the last read was waiting on the client.
    pub(crate) fn stalled_on_client(&self) -> bool {
        self.0.load(Ordering::Relaxed) == Self::WAITING_ON_CLIENT
    }

    /// Cut for growing over `max_request_body`.
    pub(crate) fn too_large(&self) -> bool {
        self.0.load(Ordering::Relaxed) == Self::TOO_LARGE
    }
}

/// A request body grew over `max_request_body`: the error that cuts it.
#[derive(Debug)]
pub(crate) struct BodyTooLarge;

impl std::fmt::Display for BodyTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body is over max_request_body")
    }
}

impl std::error::Error for BodyTooLarge {}

/// A client's request body, whichever front end read it: the request path streams it
/// upstream without knowing the protocol it came in. hyper's server reads HTTP/1
/// requests with a body; the HTTP/2 front end ([`crate::h2_front`]) hands over its
/// stream; another front end adds its own stream here, and nothing above it changes.
#[derive(Debug)]
pub(crate) struct ClientBody(Inner);

#[derive(Debug)]
enum Inner {
    Hyper(Incoming),
    H2(H2Body),
    /// Boxed: an HTTP/3 stream's state is several times the others'.
    H3(Box<H3Body>),
}

impl ClientBody {
    /// The body of a request hyper's server read.
    pub(crate) fn hyper(inner: Incoming) -> ClientBody {
        ClientBody(Inner::Hyper(inner))
    }

    /// An HTTP/2 request's body: its DATA frames, then its trailers; `length` is the
    /// request's `Content-Length`, when it states one (h2 holds the stream to it).
    pub(crate) fn h2(recv: h2::RecvStream, length: Option<u64>) -> ClientBody {
        ClientBody(Inner::H2(H2Body {
            recv,
            left: length,
            data_done: false,
        }))
    }

    /// An HTTP/3 request's body: its DATA frames, then its trailers; `length` is the
    /// request's `Content-Length`, when it states one.
    pub(crate) fn h3(recv: H3Recv, length: Option<u64>) -> ClientBody {
        ClientBody(Inner::H3(Box::new(H3Body {
            recv,
            left: length,
            state: H3State::Data,
        })))
    }

    /// The next frame of the client's body (`http_body::Body::poll_frame` of the stream
    /// inside; only [`ReqBody`] polls it, so it is not a `Body` itself).
    #[inline]
    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match &mut self.0 {
            Inner::Hyper(b) => {
                let r = Pin::new(b).poll_frame(cx);
                r.map(|o| o.map(|f| f.map_err(Into::into)))
            }
            Inner::H2(b) => b.poll_frame(cx),
            Inner::H3(b) => b.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Inner::Hyper(b) => b.is_end_stream(),
            Inner::H2(b) => b.recv.is_end_stream(),
            // A stated length read whole is the end: hyper's client stops polling there.
            Inner::H3(b) => b.state == H3State::Done || b.left == Some(0),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Inner::Hyper(b) => b.size_hint(),
            Inner::H2(b) => b.left.map_or_else(SizeHint::default, SizeHint::with_exact),
            Inner::H3(b) => b.left.map_or_else(SizeHint::default, SizeHint::with_exact),
        }
    }
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

impl H2Body {
    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if !self.data_done {
            match std::task::ready!(self.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    if let Some(left) = &mut self.left {
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
                None => self.data_done = true,
            }
        }
        match std::task::ready!(self.recv.poll_trailers(cx)) {
            Ok(Some(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e.into()))),
        }
    }
}

/// The receiving half of an HTTP/3 request's stream.
pub(crate) type H3Recv = h3::server::RequestStream<crate::h3_quic::RecvSide, Bytes>;

/// Where an HTTP/3 request body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum H3State {
    Data,
    Trailers,
    Done,
}

/// An HTTP/3 request body: quinn gives the client's window back as the bytes are read.
struct H3Body {
    recv: H3Recv,
    /// What `Content-Length` says is left to come.
    left: Option<u64>,
    state: H3State,
}

impl std::fmt::Debug for H3Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H3Body")
            .field("left", &self.left)
            .finish_non_exhaustive()
    }
}

impl H3Body {
    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        use bytes::Buf as _;
        if self.state == H3State::Data {
            match std::task::ready!(self.recv.poll_recv_data(cx)) {
                Ok(Some(mut buf)) => {
                    let data = buf.copy_to_bytes(buf.remaining());
                    if let Some(left) = &mut self.left {
                        // RFC 9114 §4.1.2: more than the stated length is malformed.
                        let Some(rest) = left.checked_sub(data.len() as u64) else {
                            return Poll::Ready(Some(Err(
                                "the body is longer than its Content-Length".into(),
                            )));
                        };
                        *left = rest;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(None) if self.left.is_some_and(|l| l > 0) => {
                    return Poll::Ready(Some(Err(
                        "the body is shorter than its Content-Length".into()
                    )));
                }
                Ok(None) => self.state = H3State::Trailers,
                Err(e) => return Poll::Ready(Some(Err(Box::new(e)))),
            }
        }
        if self.state == H3State::Done {
            return Poll::Ready(None);
        }
        let trailers = std::task::ready!(self.recv.poll_recv_trailers(cx));
        self.state = H3State::Done;
        match trailers {
            Ok(Some(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(Box::new(e)))),
        }
    }
}

/// The error of a body on the request path: a stream broke off, or grew too large.
pub(crate) type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// The body sent upstream: the client's stream, or nothing (a replayable request).
#[derive(Debug)]
pub(crate) enum ReqBody {
    /// The client's body, streamed through; `upload` follows its progress.
    Stream {
        /// The client's body.
        inner: ClientBody,
        /// How far it has gone.
        upload: Arc<Upload>,
        /// Bytes it may still carry (`max_request_body`); `u64::MAX` without a limit.
        allowed: u64,
    },
    /// No body.
    Empty,
}

impl ReqBody {
    /// Streams `inner` through, noting when it ends, and cutting it when it carries
    /// more than `limit` bytes.
    pub(crate) fn streaming(inner: ClientBody, limit: Option<u64>) -> ReqBody {
        ReqBody::Stream {
            inner,
            upload: Arc::default(),
            allowed: limit.unwrap_or(u64::MAX),
        }
    }

    /// The upload's progress (`None` without a body).
    pub(crate) fn upload(&self) -> Option<Arc<Upload>> {
        match self {
            ReqBody::Stream { upload, .. } => Some(Arc::clone(upload)),
            ReqBody::Empty => None,
        }
    }
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = BodyError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            ReqBody::Stream {
                inner,
                upload,
                allowed,
            } => {
                let r = inner.poll_frame(cx);
                if let Poll::Ready(Some(Ok(f))) = &r {
                    let n = f.data_ref().map_or(0, |d| d.len() as u64);
                    match allowed.checked_sub(n) {
                        Some(left) => *allowed = left,
                        None => {
                            upload.set(Upload::TOO_LARGE);
                            return Poll::Ready(Some(Err(Box::new(BodyTooLarge))));
                        }
                    }
                }
                match &r {
                    Poll::Ready(None) => upload.set(Upload::DONE),
                    Poll::Ready(Some(Ok(_))) if inner.is_end_stream() => upload.set(Upload::DONE),
                    Poll::Ready(_) => upload.set(Upload::MOVING),
                    Poll::Pending => upload.set(Upload::WAITING_ON_CLIENT),
                }
                r
            }
            ReqBody::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Stream { inner, .. } => inner.is_end_stream(),
            ReqBody::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Stream { inner, .. } => inner.size_hint(),
            ReqBody::Empty => SizeHint::with_exact(0),
        }
    }
}
