//! Body types of the request path: no boxing, no buffering.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::upstream::{Conn, Upstreams};
use crate::pool::RequestGuard;

/// What keeps a request accounted for until its response has been received whole.
#[derive(Debug)]
pub struct Hold {
    /// The backend's in-flight slot.
    pub guard: RequestGuard,
    /// The proxy-wide shedding slot, when shedding is on.
    pub permit: Option<crate::proxy::ShedPermit>,
    /// The upstream connection, returned to its pool once the body has been read whole.
    pub conn: Option<(Conn, &'static Upstreams)>,
}

impl Hold {
    /// The response was received whole: the connection can serve another request.
    fn complete(mut self) {
        if let Some((conn, pool)) = self.conn.take() {
            pool.checkin(conn);
        }
    }
}

/// The body sent upstream: the client's stream, or nothing (a replayable request).
#[derive(Debug)]
pub enum ReqBody {
    /// The client's body, streamed through.
    Stream(Incoming),
    /// No body.
    Empty,
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = hyper::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ReqBody::Stream(b) => Pin::new(b).poll_frame(cx),
            ReqBody::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Stream(b) => b.is_end_stream(),
            ReqBody::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Stream(b) => b.size_hint(),
            ReqBody::Empty => SizeHint::with_exact(0),
        }
    }
}

/// The body sent to the client: the backend's stream, or a short answer of our own.
#[derive(Debug)]
pub enum RespBody {
    /// The backend's body; `hold` is released the moment it has been read whole, fails,
    /// or the body is dropped (client gone).
    Upstream {
        /// The backend's body.
        inner: Incoming,
        /// Released at the end of the stream.
        hold: Option<Hold>,
    },
    /// A short answer of fulcrum's own.
    Full(Option<Bytes>),
}

impl RespBody {
    /// Wraps a backend body; an already-finished one releases its hold at once.
    pub fn upstream(inner: Incoming, hold: Hold) -> RespBody {
        let hold = if inner.is_end_stream() {
            hold.complete();
            None
        } else {
            Some(hold)
        };
        RespBody::Upstream { inner, hold }
    }

    /// A fixed body.
    pub fn full(b: impl Into<Bytes>) -> RespBody {
        RespBody::Full(Some(b.into()))
    }

    /// No body.
    pub fn empty() -> RespBody {
        RespBody::Full(None)
    }
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = hyper::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
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
                r
            }
            RespBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RespBody::Upstream { inner, .. } => inner.is_end_stream(),
            RespBody::Full(b) => b.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Upstream { inner, .. } => inner.size_hint(),
            RespBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            RespBody::Full(None) => SizeHint::with_exact(0),
        }
    }
}
