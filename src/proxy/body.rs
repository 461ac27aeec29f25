//! Body types of the request path: no boxing, no buffering.

use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::upstream::{Conn, Upstreams};
use super::wire::WireBody;
use crate::backend::RequestGuard;

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

/// What keeps a request accounted for until its response has been received whole.
#[derive(Debug)]
pub(crate) struct Hold {
    /// The backend's in-flight slot.
    pub(crate) guard: RequestGuard,
    /// The proxy-wide shedding slot, when shedding is on; held for its drop.
    pub(crate) _permit: Option<crate::proxy::ShedPermit>,
    /// The upstream connection, returned to its pool once the body has been read whole.
    pub(crate) conn: Option<(Conn, &'static Upstreams)>,
    /// How far the request body has gone (`None`: there was none).
    pub(crate) upload: Option<Arc<Upload>>,
    /// The request's record, written when the hold is released.
    pub(crate) finish: Option<(super::Finish, &'static super::Recorder)>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some((fin, rec)) = self.finish.take() {
            rec.finish(&fin, Some(self.guard.backend()));
        }
    }
}

impl Hold {
    /// The response was received whole. The connection can serve another request unless
    /// the backend answered before the upload ended; that connection is closed instead.
    fn complete(mut self) {
        let uploaded = self.upload.as_ref().is_none_or(|u| u.is_done());
        if let (Some((conn, pool)), true) = (self.conn.take(), uploaded) {
            pool.checkin(conn);
        }
    }
}

/// The body sent upstream: the client's stream, or nothing (a replayable request).
#[derive(Debug)]
pub(crate) enum ReqBody {
    /// The client's body, streamed through; `upload` follows its progress.
    Stream {
        /// The client's body.
        inner: Incoming,
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
    pub(crate) fn streaming(inner: Incoming, limit: Option<u64>) -> ReqBody {
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
                let r = Pin::new(&mut *inner).poll_frame(cx);
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
                r.map(|o| o.map(|f| f.map_err(Into::into)))
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

/// The body sent to the client: the backend's stream, or a short answer of our own.
#[derive(Debug)]
pub(crate) enum RespBody {
    /// The backend's body; `hold` is released the moment it has been read whole, fails,
    /// or the body is dropped (client gone).
    Upstream {
        /// The backend's body.
        inner: Incoming,
        /// Released at the end of the stream.
        /// Boxed: it is large, and a response body is moved around by value.
        hold: Option<Box<Hold>>,
    },
    /// The backend's body, read from its socket as it is polled (see `wire`).
    Wire {
        /// The body and its connection.
        inner: WireBody,
        /// Released at the end of the stream.
        hold: Option<Box<Hold>>,
        /// Where the connection goes back when the body has been read whole.
        pool: &'static Upstreams,
    },
    /// A short answer of fulcrum's own.
    Full(Option<Bytes>),
}

/// The error of a response body: the backend's stream broke off.
pub(crate) type BodyError = Box<dyn std::error::Error + Send + Sync>;

impl RespBody {
    /// Wraps a backend body; an already-finished one releases its hold at once.
    pub(crate) fn upstream(inner: Incoming, hold: Hold) -> RespBody {
        let hold = if inner.is_end_stream() {
            hold.complete();
            None
        } else {
            Some(Box::new(hold))
        };
        RespBody::Upstream { inner, hold }
    }

    /// Wraps a body read inline; an already-finished one releases its hold and its
    /// connection at once.
    pub(crate) fn wire(mut inner: WireBody, hold: Hold, pool: &'static Upstreams) -> RespBody {
        let hold = if inner.is_end_stream() {
            if let Some(w) = inner.take_reusable() {
                pool.checkin_wire(w);
            }
            hold.complete();
            None
        } else {
            Some(Box::new(hold))
        };
        RespBody::Wire { inner, hold, pool }
    }

    /// A fixed body.
    pub(crate) fn full(b: impl Into<Bytes>) -> RespBody {
        RespBody::Full(Some(b.into()))
    }

    /// No body.
    pub(crate) fn empty() -> RespBody {
        RespBody::Full(None)
    }
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = BodyError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            RespBody::Wire { inner, hold, pool } => {
                let r = inner.poll_frame(cx);
                match &r {
                    Poll::Ready(Some(Ok(_))) if !inner.is_end_stream() => {}
                    Poll::Ready(Some(Ok(_)) | None) => {
                        if let Some(w) = inner.take_reusable() {
                            pool.checkin_wire(w);
                        }
                        if let Some(h) = hold.take() {
                            h.complete();
                        }
                    }
                    Poll::Ready(Some(Err(_))) => {
                        if let Some(mut h) = hold.take() {
                            h.guard.fail();
                        }
                    }
                    Poll::Pending => {}
                }
                r.map_err(Into::into)
            }
            RespBody::Upstream { inner, hold } => {
                let r = Pin::new(&mut *inner).poll_frame(cx);
                match &r {
                    Poll::Ready(Some(Ok(_))) => {
                        if inner.is_end_stream() {
                            if let Some(h) = hold.take() {
                                h.complete();
                            }
                        }
                    }
                    Poll::Ready(Some(Err(_))) => {
                        // A broken body: the connection is dropped, not pooled.
                        if let Some(mut h) = hold.take() {
                            h.guard.fail();
                        }
                    }
                    Poll::Ready(None) => {
                        if let Some(h) = hold.take() {
                            h.complete();
                        }
                    }
                    Poll::Pending => {}
                }
                r.map_err(Into::into)
            }
            RespBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RespBody::Wire { inner, .. } => inner.is_end_stream(),
            RespBody::Upstream { inner, .. } => inner.is_end_stream(),
            RespBody::Full(b) => b.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Wire { inner, .. } => inner.size_hint(),
            RespBody::Upstream { inner, .. } => inner.size_hint(),
            RespBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            RespBody::Full(None) => SizeHint::with_exact(0),
        }
    }
}
