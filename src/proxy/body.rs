//! The request body on its way upstream: the client's stream, whichever front end
//! read it, counted and cut at `max_request_body`. No buffering.

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
/// requests with a body; a front end with streams of its own (HTTP/2, HTTP/3) hands over
/// its stream's body ([`ClientBody::stream`]), defined beside it: nothing here names a
/// front end's types.
pub(crate) struct ClientBody(Inner);

enum Inner {
    Hyper(Incoming),
    /// Boxed: one allocation per request with a body, the price of the front end's
    /// type staying in its module.
    Stream(FrontStream),
}

/// A front end's own body stream.
type FrontStream = Pin<Box<dyn Body<Data = Bytes, Error = BodyError> + Send + Sync>>;

impl std::fmt::Debug for ClientBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.0 {
            Inner::Hyper(_) => "hyper",
            Inner::Stream(_) => "stream",
        };
        f.debug_tuple("ClientBody").field(&kind).finish()
    }
}

impl ClientBody {
    /// The body of a request hyper's server read.
    pub(crate) fn hyper(inner: Incoming) -> ClientBody {
        ClientBody(Inner::Hyper(inner))
    }

    /// The body of a request a front end read from a stream of its own: its DATA
    /// frames, then its trailers; `size_hint` exact when a `Content-Length` says it.
    pub(crate) fn stream<B>(body: B) -> ClientBody
    where
        B: Body<Data = Bytes, Error = BodyError> + Send + Sync + 'static,
    {
        ClientBody(Inner::Stream(Box::pin(body)))
    }

    /// The next frame of the client's body (`http_body::Body::poll_frame` of the stream
    /// inside; only [`ReqBody`] polls it, so it is not a `Body` itself).
    #[inline]
    pub(super) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match &mut self.0 {
            Inner::Hyper(b) => {
                let r = Pin::new(b).poll_frame(cx);
                r.map(|o| o.map(|f| f.map_err(Into::into)))
            }
            Inner::Stream(b) => b.as_mut().poll_frame(cx),
        }
    }

    pub(super) fn is_end_stream(&self) -> bool {
        match &self.0 {
            Inner::Hyper(b) => b.is_end_stream(),
            Inner::Stream(b) => b.is_end_stream(),
        }
    }

    /// The body's length when its request stated it.
    pub(crate) fn stated_length(&self) -> Option<u64> {
        self.size_hint().exact()
    }

    pub(super) fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Inner::Hyper(b) => b.size_hint(),
            Inner::Stream(b) => b.size_hint(),
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
